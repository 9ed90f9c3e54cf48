//! The worker cache's tests: chunk placement from partial and held files,
//! the chunk index, the index rebuilt on restart, and the store suite.

use super::*;

/// (chunk bytes in the recipe's order, which are already in the
/// partial file, which a held file has) → the chunks still lacking.
#[test]
fn a_fetch_takes_chunks_from_its_partial_file_and_held_files_first() {
    let dir = std::env::temp_dir().join(format!("tessera-partial-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let chunk = |n: u8, len: usize| vec![n; len];
    let (a, b, c, e) = (chunk(1, 100), chunk(2, 50), chunk(3, 70), chunk(4, 30));
    // The file to fetch: a b c a e.
    let order = [&a, &b, &c, &a, &e];
    let mut places: HashMap<Digest, (u32, Vec<u64>)> = HashMap::new();
    let mut offset = 0;
    for bytes in order {
        (places.entry(Digest::of(bytes)))
            .or_insert((bytes.len() as u32, Vec::new()))
            .1
            .push(offset);
        offset += bytes.len() as u64;
    }
    let size = offset;
    // A cut fetch left `b` in place; a held file has `c` at 10 and
    // claims `e` at 0, where it has other bytes.
    let partial = dir.join("partial");
    {
        use std::os::unix::fs::FileExt;
        let f = std::fs::File::create(&partial).unwrap();
        f.set_len(size).unwrap();
        f.write_all_at(&b, 100).unwrap();
    }
    let held = dir.join("held");
    let mut held_bytes = vec![9u8; 10];
    held_bytes.extend_from_slice(&c);
    std::fs::write(&held, &held_bytes).unwrap();
    let sources = vec![
        (Digest::of(&a), None),
        (Digest::of(&b), None),
        (Digest::of(&c), Some((held.clone(), 10))),
        (Digest::of(&e), Some((held.clone(), 0))),
    ];
    let (file, lacking) = place_local_chunks(&partial, size, &places, sources).unwrap();
    assert_eq!(lacking, vec![Digest::of(&a), Digest::of(&e)]);
    drop(file);
    let got = std::fs::read(&partial).unwrap();
    assert_eq!(got.len() as u64, size);
    assert_eq!(&got[100..150], &b[..], "kept from the cut fetch");
    assert_eq!(&got[150..220], &c[..], "copied from the held file");
    assert!(
        got[..100].iter().all(|x| *x == 0),
        "still a hole: {:?}",
        &got[..4]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_chunk_index_says_where_each_chunk_of_a_held_file_lies() {
    let chunk = |n: u8, len: u32| tessera_protocol::chunk::ChunkRef {
        digest: Digest::of(&[n]),
        len,
    };
    let file = Digest::of(b"file");
    let recipe = Recipe {
        digest: file,
        size: 60,
        chunks: vec![chunk(1, 10), chunk(2, 20), chunk(1, 10), chunk(3, 20)],
    };
    let mut index = HashMap::new();
    index_chunks(&mut index, &recipe);
    let at = |n: u8| {
        index
            .get(&Digest::of(&[n]))
            .map(|a: &ChunkAt| (a.offset, a.len))
    };
    assert_eq!(index.len(), 3);
    assert_eq!(at(1), Some((0, 10)), "the first place of a repeated chunk");
    assert_eq!(at(2), Some((10, 20)));
    assert_eq!(at(3), Some((40, 20)));
    assert!(index.values().all(|a| a.file == file));
}

#[test]
fn restart_rebuilds_the_index_and_drops_corrupt_blobs() {
    let dir = std::env::temp_dir().join(format!("tessera-cache-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let blobs = BlobDir::open(dir.join("blobs")).unwrap();
    let good = blobs.put_bytes(b"texture").unwrap();
    let bad = blobs.put_bytes(b"scene").unwrap();
    std::fs::write(blobs.path(&bad), b"sceNe").unwrap();
    std::fs::write(blobs.root().join("tmp").join("half"), b"x").unwrap();
    let cache = Cache::open(&dir, Some(1000)).unwrap();
    assert!(cache.state().lru.contains(&good));
    assert!(!cache.state().lru.contains(&bad));
    assert!(!blobs.path(&bad).exists(), "a corrupt blob is removed");
    assert_eq!(cache.held_bytes(), 7);
    drop(cache);
    // Reopened with a cap below what it holds: shrinks at once.
    let cache = Cache::open(&dir, Some(3)).unwrap();
    assert_eq!(cache.held_bytes(), 0);
    assert!(!blobs.path(&good).exists());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The cache passes the store crate's suite for every [`BlobStore`], with a
/// cap and without.
#[test]
fn the_cache_is_a_blob_store() {
    for cap in [None, Some(1 << 20)] {
        let dir = std::env::temp_dir().join(format!(
            "tessera-cache-store-{}-{}",
            std::process::id(),
            cap.is_some()
        ));
        let _ = std::fs::remove_dir_all(&dir);
        let cache = Cache::open(&dir, cap).unwrap();
        tessera_store::store::suite(&cache);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A put beyond the cap evicts the least recently used blob; a pinned one
/// is never evicted nor removed.
#[test]
fn a_put_evicts_under_the_cap_and_never_a_pinned_blob() {
    use tessera_store::BlobStore;
    let dir = std::env::temp_dir().join(format!("tessera-cache-evict-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let cache = Cache::open(&dir, Some(250)).unwrap();
    let blob = |n: u8| vec![n; 100];
    let (a, b, c) = (blob(1), blob(2), blob(3));
    let (da, db, dc) = (Digest::of(&a), Digest::of(&b), Digest::of(&c));
    cache.put(&da, &a).unwrap();
    cache.put(&db, &b).unwrap();
    cache.state().lru.pin(da);
    cache.put(&dc, &c).unwrap();
    assert_eq!(cache.has(&da), Some(100), "pinned: kept");
    assert_eq!(
        cache.has(&db),
        None,
        "least recently used unpinned: evicted"
    );
    assert_eq!(cache.has(&dc), Some(100));
    assert!(cache.remove(&da).is_err(), "pinned: not removed");
    let _ = std::fs::remove_dir_all(&dir);
}

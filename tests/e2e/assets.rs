//! Assets at scale: large files travel as content-defined chunks, so a
//! resubmit uploads what changed and an interrupted upload resumes. Test
//! files are generated here, in the farm's temp folder, from a fixed seed.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::harness::{noise, tessera, Farm, State};

const MIB: usize = 1 << 20;

/// A builtin scene whose materials use `textures` (paths relative to `dir`).
pub(crate) fn write_scene(dir: &Path, textures: &[&str]) -> PathBuf {
    let materials: Vec<String> = textures
        .iter()
        .enumerate()
        .map(|(i, t)| format!(r#""m{i}": {{ "kind": "diffuse", "texture": "{t}" }}"#))
        .collect();
    let objects: Vec<String> = (0..textures.len())
        .map(|i| {
            format!(
                r#"{{ "shape": {{ "sphere": {{ "center": [{}.0, 0.5, 0.0], "radius": 0.5 }} }}, "material": "m{i}" }}"#,
                i as i32 - 1
            )
        })
        .collect();
    let scene = format!(
        r#"{{
  "resolution": [48, 32], "samples": 2, "max_bounces": 2, "seed": 1,
  "frames": {{ "start": 1, "end": 1 }},
  "background": {{ "sky": {{ "horizon": [0.9, 0.9, 0.9], "zenith": [0.4, 0.6, 1.0] }} }},
  "camera": [{{ "frame": 1, "position": [0.0, 1.0, 6.0], "look_at": [0.0, 0.5, 0.0], "fov_deg": 40 }}],
  "materials": {{ {} }},
  "objects": [{}]
}}"#,
        materials.join(", "),
        objects.join(", ")
    );
    let path = dir.join("scene.scene.json");
    std::fs::write(&path, scene).unwrap();
    path
}

/// A noise PNG (incompressible, so its size is about w × h × 3).
pub(crate) fn write_noise_png(path: &Path, side: u32, seed: u64) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut enc = png::Encoder::new(file, side, side);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    let mut w = enc.write_header().unwrap();
    w.write_image_data(&noise((side * side * 3) as usize, seed))
        .unwrap();
}

fn size(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

fn u(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// Bytes of every stored blob (whole files and chunks) in the coordinator's
/// store, temporary files left out.
fn stored_bytes(farm: &Farm) -> u64 {
    blob_bytes(&farm.data.join("blobs"))
}

/// [`stored_bytes`] once it has not changed for a second.
fn settled_stored_bytes(farm: &Farm) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut last = (stored_bytes(farm), Instant::now());
    loop {
        std::thread::sleep(Duration::from_millis(100));
        let now = stored_bytes(farm);
        if now != last.0 {
            last = (now, Instant::now());
        } else if last.1.elapsed() >= Duration::from_secs(1) || Instant::now() > deadline {
            return now;
        }
    }
}

/// Bytes of the blobs in a blob folder (two-letter subfolders).
pub(crate) fn blob_bytes(root: &Path) -> u64 {
    let mut total = 0;
    let Ok(dirs) = std::fs::read_dir(root) else {
        return 0;
    };
    for d in dirs.flatten() {
        if d.file_name().len() != 2 {
            continue;
        }
        for f in std::fs::read_dir(d.path()).into_iter().flatten().flatten() {
            total += f.metadata().map_or(0, |m| m.len());
        }
    }
    total
}

#[test]
fn chunk_resubmit_of_a_large_file_with_one_percent_changed_uploads_about_the_changes() {
    let mut farm = Farm::start("chunks", &[]);
    let dir = farm.dir.join("scene");
    std::fs::create_dir_all(&dir).unwrap();
    let big = dir.join("big.bin");
    let mut data = noise(256 * MIB, 1);
    std::fs::write(&big, &data).unwrap();
    let scene = write_scene(&dir, &["big.bin"]);
    let scene_arg = scene.to_str().unwrap();
    let submit = |farm: &Farm| farm.json(&["submit", scene_arg, "--engine", "noop", "--json"]);

    let first = submit(&farm);
    let total = size(&big) + size(&scene);
    assert_eq!(u(&first["bytes_uploaded"]), total);
    assert_eq!(u(&first["bytes_deduplicated"]), 0);

    // Change 1% of the bytes, in 40 regions of 16-112 KiB spread over the
    // file.
    let target = data.len() / 100;
    let lens: Vec<usize> = noise(40 * 8, 2)
        .chunks(8)
        .map(|c| 16 * 1024 + (u64::from_le_bytes(c.try_into().unwrap()) % (96 * 1024)) as usize)
        .collect();
    let scale = target as f64 / lens.iter().sum::<usize>() as f64;
    let stride = data.len() / lens.len();
    let mut changed = 0;
    for (i, len) in lens.iter().enumerate() {
        let len = (*len as f64 * scale) as usize;
        let start = i * stride + (stride - len) / 2;
        for b in &mut data[start..start + len] {
            *b ^= 0xa5;
        }
        changed += len as u64;
    }
    assert!((changed as usize).abs_diff(target) < 1024, "{changed}");
    std::fs::write(&big, &data).unwrap();
    drop(data);

    let second = submit(&farm);
    let uploaded = u(&second["bytes_uploaded"]);
    eprintln!(
        "changed {changed} bytes of {}; resubmit uploaded {uploaded} ({:.2}x the changes)",
        size(&big),
        uploaded as f64 / changed as f64
    );
    assert!(uploaded >= changed, "{uploaded} < {changed}: edits lost?");
    assert!(
        uploaded <= 3 * changed,
        "resubmit uploaded {uploaded} bytes for {changed} changed bytes"
    );
    assert_eq!(u(&second["bytes_deduplicated"]), total - uploaded);

    // The coordinator joined the chunks into the edited file: a worker
    // fetches it whole, re-hashes it, and runs both jobs.
    farm.add_worker_with("w1", &["--engine", "noop"]);
    let mut to_workers = 0;
    for job in [&first, &second] {
        let id = u(&job["id"]);
        let done = farm.wait_for(id, "job done", |s| s["state"] == "done");
        to_workers += u(&done["bytes_to_workers"]);
    }
    // The worker, too, fetched the edited file as the chunks it lacked.
    eprintln!("the worker fetched {to_workers} bytes for both versions");
    assert!(to_workers <= total + 3 * changed, "{to_workers}");
    let cached = farm.dir.join("cache-w1").join("blobs");
    let edited = tessera_protocol::Digest::of_reader(std::fs::File::open(&big).unwrap())
        .unwrap()
        .0;
    let hex = edited.to_hex();
    assert_eq!(
        std::fs::read(cached.join(&hex[..2]).join(&hex)).unwrap(),
        std::fs::read(&big).unwrap()
    );
}

#[test]
fn chunk_resubmit_after_changing_one_texture_uploads_only_that_texture() {
    let mut farm = Farm::start("texture", &[]);
    farm.add_worker("w1");
    let dir = farm.dir.join("scene");
    let textures = [
        "textures/a.png",
        "textures/b.png",
        "textures/c.png",
        "textures/d.png",
        "textures/small.png",
    ];
    for (i, t) in textures.iter().enumerate() {
        // Four of 1.5-2.5 MiB (chunked), one small (sent whole).
        let side = if i == 4 { 64 } else { 720 + 100 * i as u32 };
        write_noise_png(&dir.join(t), side, 10 + i as u64);
    }
    let scene = write_scene(&dir, &textures);
    let scene_arg = scene.to_str().unwrap();
    let submit = |farm: &Farm| farm.json(&["submit", scene_arg, "--wait", "--json"]);
    let total: u64 = size(&scene) + textures.iter().map(|t| size(&dir.join(t))).sum::<u64>();

    let first = submit(&farm);
    assert_eq!(first["state"], "done");
    assert_eq!(u(&first["bytes_uploaded"]), total);
    // The worker had nothing: every file went to it once.
    let first = farm.status(u(&first["id"]));
    assert_eq!(u(&first["bytes_to_workers"]), total);

    // Repaint texture c: a new image, so a new PNG throughout.
    let c = dir.join("textures/c.png");
    let old_c = size(&c);
    write_noise_png(&c, 920, 99);
    let new_c = size(&c);
    let total = total - old_c + new_c;
    let second = submit(&farm);
    assert_eq!(second["state"], "done");
    let uploaded = u(&second["bytes_uploaded"]);
    eprintln!("texture of {new_c} bytes changed; resubmit uploaded {uploaded}");
    assert!(
        uploaded.abs_diff(new_c) <= new_c / 10,
        "uploaded {uploaded} bytes for a {new_c}-byte texture"
    );
    // Nothing else: everything but the texture was deduplicated.
    assert_eq!(u(&second["bytes_deduplicated"]), total - uploaded);
    assert!(u(&second["bytes_deduplicated"]) >= total - new_c);
    // The worker's cache held the rest: only the new texture went to it.
    let second = farm.status(u(&second["id"]));
    assert_eq!(u(&second["bytes_to_workers"]), new_c);
}

#[test]
fn chunk_upload_killed_half_way_resumes_without_resending_stored_chunks() {
    chunk_upload_killed_half_way_resumes_without_resending_stored_chunks_on(State::Sqlite);
}

/// The same with the coordinator's state in PostgreSQL and its assets in
/// an S3-compatible object store (Garage).
#[test]
#[ignore = "needs PostgreSQL (initdb, postgres) and Garage"]
fn chunk_upload_killed_half_way_resumes_without_resending_stored_chunks_on_postgresql_and_s3() {
    chunk_upload_killed_half_way_resumes_without_resending_stored_chunks_on(State::PostgresS3);
}

fn chunk_upload_killed_half_way_resumes_without_resending_stored_chunks_on(state: State) {
    let mut farm = Farm::start_with_state("resume", &[], state);
    let dir = farm.dir.join("scene");
    std::fs::create_dir_all(&dir).unwrap();
    let big = dir.join("big.bin");
    std::fs::write(&big, noise(384 * MIB, 5)).unwrap();
    let scene = write_scene(&dir, &["big.bin"]);
    let scene_arg = scene.to_str().unwrap();
    let file_size = size(&big);

    let mut child = tessera()
        .args(["submit", scene_arg, "--engine", "noop", "--json"])
        .env("TESSERA_TICKET", farm.client_ticket())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while stored_bytes(&farm) < file_size / 2 {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the upload finished before it could be cut"
        );
        assert!(Instant::now() < deadline, "upload never got half way");
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    // Chunks whose bytes had all arrived when the client died are still
    // being stored: count what is stored once that has settled.
    let before = settled_stored_bytes(&farm);
    let fraction = before as f64 / file_size as f64;
    assert!(
        (0.4..0.9).contains(&fraction),
        "cut at {fraction:.2} of the upload"
    );
    let remaining = file_size + size(&scene) - before;

    let job = farm.json(&["submit", scene_arg, "--engine", "noop", "--json"]);
    let uploaded = u(&job["bytes_uploaded"]);
    eprintln!(
        "cut at {:.0}%: {before} of {file_size} bytes stored; the re-run uploaded {uploaded} for {remaining} remaining ({:.3}x)",
        fraction * 100.0,
        uploaded as f64 / remaining as f64
    );
    assert!(
        uploaded >= remaining - size(&scene),
        "{uploaded} < {remaining}"
    );
    assert!(
        uploaded as f64 <= 1.1 * remaining as f64,
        "re-run uploaded {uploaded} bytes for {remaining} remaining"
    );
    // The file is whole on the coordinator: stored chunks plus the joined file.
    let digest = tessera_protocol::Digest::of_reader(std::fs::File::open(&big).unwrap())
        .unwrap()
        .0;
    let hex = digest.to_hex();
    assert_eq!(
        size(&farm.data.join("blobs").join(&hex[..2]).join(&hex)),
        file_size
    );

    // The worker's download, cut half way, resumes too: its chunks are
    // written into the file's partial copy, which the next fetch re-reads.
    farm.add_worker_with("w1", &["--engine", "noop"]);
    let partial = farm.dir.join("cache-w1").join("partial");
    let deadline = Instant::now() + Duration::from_secs(120);
    while written_bytes(&partial) < file_size / 2 {
        assert!(Instant::now() < deadline, "download never got half way");
        std::thread::sleep(Duration::from_millis(10));
    }
    farm.kill_worker(0);
    let got = written_bytes(&partial);
    assert!(got < file_size * 9 / 10, "cut at {got} of {file_size}");
    farm.add_worker_with("w1", &["--engine", "noop"]);
    let id = u(&job["id"]);
    let done = farm.wait_for(id, "job done", |s| s["state"] == "done");
    let sent = u(&done["bytes_to_workers"]);
    if state == State::PostgresS3 {
        // The worker fetched from the bucket: the coordinator sent no
        // asset bytes, and the second fetch took only what the first left.
        let log = farm.log_of(1);
        let ready = log.lines().find(|l| l.contains("job files ready")).unwrap();
        let fetched = crate::harness::field(ready, "fetched_bytes").unwrap();
        eprintln!(
            "worker download from the bucket cut at {:.0}%: the second fetch took {fetched} bytes of a {file_size}-byte file",
            got as f64 * 100.0 / file_size as f64
        );
        assert_eq!(sent, 0, "asset bytes went through the coordinator");
        assert!(
            fetched as f64 <= 1.1 * (file_size - got + size(&scene)) as f64,
            "{fetched} bytes fetched again after {got} of {file_size}"
        );
    } else {
        eprintln!(
            "worker download cut at {:.0}%: {sent} bytes sent to workers in all for a {file_size}-byte file",
            got as f64 * 100.0 / file_size as f64
        );
        assert!(
            sent as f64 <= 1.1 * (file_size + size(&scene)) as f64,
            "{sent} bytes sent for a {file_size}-byte file"
        );
    }
    assert!(farm.log_of(1).contains("job files ready"));
}

/// Bytes written into the (sparse) files of a folder: the disk blocks they
/// take.
pub(crate) fn written_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    (std::fs::read_dir(dir).into_iter().flatten().flatten())
        .map(|f| f.metadata().map_or(0, |m| m.blocks() * 512))
        .sum()
}

/// Bytes of the blobs in a worker's cache.
fn cache_bytes(farm: &Farm, worker: &str) -> u64 {
    let root = farm.dir.join(format!("cache-{worker}")).join("blobs");
    let mut total = 0;
    for d in std::fs::read_dir(root).unwrap().flatten() {
        if d.file_name() != "tmp" {
            for f in std::fs::read_dir(d.path()).unwrap().flatten() {
                total += f.metadata().unwrap().len();
            }
        }
    }
    total
}

/// Whether a worker's cache holds the file at `path`.
fn cached(farm: &Farm, worker: &str, path: &Path) -> bool {
    let digest = tessera_protocol::Digest::of_reader(std::fs::File::open(path).unwrap())
        .unwrap()
        .0;
    let hex = digest.to_hex();
    farm.dir
        .join(format!("cache-{worker}"))
        .join("blobs")
        .join(&hex[..2])
        .join(&hex)
        .exists()
}

#[test]
fn cache_capped_below_the_farms_assets_still_renders_each_job_and_evicts_lru() {
    let mut farm = Farm::start("cachecap", &[]);
    let cap = 3 * MIB as u64;
    farm.add_worker_with("w1", &["--cache-max", "3M"]);
    // Two scenes of about 1.9 MB each (files below the chunking threshold,
    // so each travels and is cached whole): each fits the cap, both do not.
    let mut scenes = Vec::new();
    for (s, seed) in [("a", 20u64), ("b", 30)] {
        let dir = farm.dir.join(s);
        let textures = ["t/one.png", "t/two.png"];
        for (i, t) in textures.iter().enumerate() {
            write_noise_png(&dir.join(t), 560, seed + i as u64);
        }
        scenes.push(write_scene(&dir, &textures));
    }
    let sizes: Vec<u64> = scenes
        .iter()
        .map(|scene| {
            let dir = scene.parent().unwrap();
            size(scene) + size(&dir.join("t/one.png")) + size(&dir.join("t/two.png"))
        })
        .collect();
    assert!(sizes.iter().all(|&s| s < cap) && sizes.iter().sum::<u64>() > cap);
    for scene in &scenes {
        let job = farm.json(&["submit", scene.to_str().unwrap(), "--wait", "--json"]);
        assert_eq!(job["state"], "done", "{job}");
        assert!(cache_bytes(&farm, "w1") <= cap);
    }
    // The second job pushed the first one's files out.
    assert!(farm.log_of(0).contains("evicted from the cache"));
    // Back to the first scene: what was evicted is fetched again (and
    // only that), and it still renders.
    let a_dir = scenes[0].parent().unwrap();
    let evicted: u64 = [
        scenes[0].clone(),
        a_dir.join("t/one.png"),
        a_dir.join("t/two.png"),
    ]
    .iter()
    .filter(|p| !cached(&farm, "w1", p))
    .map(|p| size(p))
    .sum();
    assert!(evicted > 0);
    let again = farm.json(&["submit", scenes[0].to_str().unwrap(), "--wait", "--json"]);
    assert_eq!(again["state"], "done");
    let again = farm.status(u(&again["id"]));
    assert_eq!(u(&again["bytes_to_workers"]), evicted);
    assert!(cache_bytes(&farm, "w1") <= cap);

    // A restart rebuilds the index from the files, dropping a corrupt one.
    farm.kill_worker(0);
    let blobs = farm.dir.join("cache-w1").join("blobs");
    // Flip a byte of a cached texture of the first scene.
    let texture = [a_dir.join("t/one.png"), a_dir.join("t/two.png")]
        .into_iter()
        .find(|p| cached(&farm, "w1", p))
        .unwrap();
    let hex = tessera_protocol::Digest::of_reader(std::fs::File::open(&texture).unwrap())
        .unwrap()
        .0
        .to_hex();
    let victim = blobs.join(&hex[..2]).join(&hex);
    let mut bytes = std::fs::read(&victim).unwrap();
    bytes[100] ^= 1;
    std::fs::write(&victim, bytes).unwrap();
    farm.add_worker_with("w1", &["--cache-max", "3M"]);
    let again = farm.json(&["submit", scenes[0].to_str().unwrap(), "--wait", "--json"]);
    assert_eq!(again["state"], "done");
    let log = farm.log_of(1);
    assert!(log.contains("does not match its digest; removed"), "{log}");
    // Only the corrupt file went over the wire again.
    let again = farm.status(u(&again["id"]));
    assert_eq!(u(&again["bytes_to_workers"]), size(&texture));
    assert_eq!(
        std::fs::read(&victim).unwrap(),
        std::fs::read(&texture).unwrap()
    );
}

/// Two one-task jobs sharing three large textures on two workers; returns
/// the bytes the coordinator sent to workers for both.
fn two_jobs_sharing_assets(name: &str, coordinator_args: &[&str]) -> (u64, u64) {
    let mut farm = Farm::start(name, coordinator_args);
    farm.add_worker("w1");
    farm.add_worker("w2");
    farm.wait_workers(2);
    let shared = ["t/shared1.png", "t/shared2.png", "t/shared3.png"];
    for (i, t) in shared.iter().enumerate() {
        write_noise_png(&farm.dir.join("a").join(t), 500, 40 + i as u64);
    }
    let mut sent = Vec::new();
    for (job, seed) in [("a", 50u64), ("b", 60)] {
        let dir = farm.dir.join(job);
        if job == "b" {
            for t in shared {
                std::fs::create_dir_all(dir.join("t")).unwrap();
                std::fs::copy(farm.dir.join("a").join(t), dir.join(t)).unwrap();
            }
        }
        write_noise_png(&dir.join("t/own.png"), 100, seed);
        let mut textures = shared.to_vec();
        textures.push("t/own.png");
        let scene = write_scene(&dir, &textures);
        let done = farm.json(&["submit", scene.to_str().unwrap(), "--wait", "--json"]);
        assert_eq!(done["state"], "done");
        sent.push(u(&farm.status(u(&done["id"]))["bytes_to_workers"]));
    }
    (sent[0], sent[1])
}

#[test]
fn cache_affinity_sends_fewer_bytes_to_workers() {
    let (a_on, b_on) = two_jobs_sharing_assets("affinity-on", &[]);
    let (a_off, b_off) = two_jobs_sharing_assets("affinity-off", &["--no-cache-affinity"]);
    eprintln!(
        "bytes sent to workers for two jobs sharing most assets: with affinity {} ({a_on} + {b_on}), without {} ({a_off} + {b_off})",
        a_on + b_on,
        a_off + b_off
    );
    // The first job goes out whole either way.
    assert_eq!(a_on, a_off);
    // The second goes to the worker already holding the shared textures
    // with affinity, and to the other worker (its turn) without.
    assert!(b_on * 10 < b_off, "{b_on} vs {b_off}");
    assert!(b_on > 0);
}

/// Whether the coordinator's store holds the blob `digest`.
fn in_store(farm: &Farm, digest: &tessera_protocol::Digest) -> bool {
    let hex = digest.to_hex();
    farm.data.join("blobs").join(&hex[..2]).join(&hex).exists()
}

fn digest_of(path: &Path) -> tessera_protocol::Digest {
    tessera_protocol::Digest::of_reader(std::fs::File::open(path).unwrap())
        .unwrap()
        .0
}

#[test]
fn gc_removes_what_no_retained_job_uses_and_keeps_what_a_queued_job_needs() {
    let mut farm = Farm::start("gc", &["--retention", "0s"]);
    farm.add_worker("w1");
    // Job a: a shared texture and a chunked one of its own; rendered.
    let (a, b) = (farm.dir.join("a"), farm.dir.join("b"));
    write_noise_png(&a.join("t/shared.png"), 64, 70);
    write_noise_png(&a.join("t/own.png"), 700, 71);
    let textures = ["t/shared.png", "t/own.png"];
    let scene_a = write_scene(&a, &textures);
    let job_a = farm.json(&["submit", scene_a.to_str().unwrap(), "--wait", "--json"]);
    assert_eq!(job_a["state"], "done");
    // Job b: the same shared texture, another chunked one; stays queued.
    farm.kill_worker(0);
    std::fs::create_dir_all(b.join("t")).unwrap();
    std::fs::copy(a.join("t/shared.png"), b.join("t/shared.png")).unwrap();
    write_noise_png(&b.join("t/own.png"), 700, 72);
    let scene_b = write_scene(&b, &textures);
    let job_b = farm.json(&["submit", scene_b.to_str().unwrap(), "--json"]);
    // Not finished: nobody can render it. (It may show `running`: the
    // killed worker's connection lingers until its timeout, and it may be
    // handed a lease meanwhile, which expires.)
    assert!(
        ["queued", "running"].contains(&job_b["state"].as_str().unwrap()),
        "{job_b}"
    );

    let chunks = |p: &Path| -> Vec<tessera_protocol::Digest> {
        let r = tessera_store::chunk::chunk_file(p).unwrap();
        r.chunks.iter().map(|c| c.digest).collect()
    };
    let (own_a, own_b) = (a.join("t/own.png"), b.join("t/own.png"));
    assert!(in_store(&farm, &digest_of(&own_a)));
    assert!(chunks(&own_a).iter().all(|c| in_store(&farm, c)));

    // A fresh blob is safe (its submit may not have arrived yet).
    let fresh = farm.json(&["gc", "--json"]);
    assert_eq!(u(&fresh["removed_blobs"]), 0);

    // An hour and more later, job a's retention (0 s) is over.
    let past = std::time::SystemTime::now() - Duration::from_secs(2 * 3600);
    for d in std::fs::read_dir(farm.data.join("blobs"))
        .unwrap()
        .flatten()
    {
        if d.file_name().len() == 2 {
            for f in std::fs::read_dir(d.path()).unwrap().flatten() {
                let file = std::fs::File::options().write(true).open(f.path()).unwrap();
                file.set_modified(past).unwrap();
            }
        }
    }
    let collected = farm.json(&["gc", "--json"]);
    assert!(u(&collected["removed_blobs"]) > 0, "{collected}");
    // Job a's own texture and its chunks are gone...
    assert!(!in_store(&farm, &digest_of(&own_a)));
    assert!(chunks(&own_a).iter().all(|c| !in_store(&farm, c)));
    // ...what the queued job b uses stays: files, chunks, the shared texture.
    assert!(in_store(&farm, &digest_of(&own_b)));
    assert!(chunks(&own_b).iter().all(|c| in_store(&farm, c)));
    assert!(in_store(&farm, &digest_of(&b.join("t/shared.png"))));
    // Job b still renders.
    farm.add_worker("w2");
    farm.wait_for(u(&job_b["id"]), "job b done", |s| s["state"] == "done");
    // Nothing left to collect that a retained job uses; job a's removed
    // texture goes up again on a resubmit.
    let again = farm.json(&["submit", scene_a.to_str().unwrap(), "--json"]);
    assert_eq!(u(&again["bytes_uploaded"]), size(&own_a));
}

#[test]
fn cache_cap_too_small_for_a_jobs_files_fails_with_a_message_to_raise_it() {
    let mut farm = Farm::start("cachesmall", &[]);
    farm.add_worker_with("w1", &["--cache-max", "1M"]);
    farm.wait_workers(1);
    let dir = farm.dir.join("scene");
    write_noise_png(&dir.join("t/big.png"), 800, 80);
    let scene = write_scene(&dir, &["t/big.png"]);
    let job = farm.json(&["submit", scene.to_str().unwrap(), "--json"]);
    let s = farm.wait_for(u(&job["id"]), "the job to fail or block", |s| {
        s["state"] == "failed" || s["blocked"].as_str().is_some_and(|b| b.contains("cache"))
    });
    let text = format!("{} {}", s["error"], s["blocked"]);
    eprintln!("{text}");
    assert!(text.contains("raise --cache-max"), "{s}");
    // Nothing was cached beyond the cap.
    assert!(cache_bytes(&farm, "w1") <= MIB as u64);
}

#[test]
fn chunk_note_for_a_compressed_large_file_suggests_saving_it_uncompressed() {
    let farm = Farm::start("compressed", &[]);
    let dir = farm.dir.join("scene");
    std::fs::create_dir_all(&dir).unwrap();
    // A zstd frame magic, then 2 MiB (what a compressed .blend looks like
    // to the chunker: bytes that change throughout on every save).
    let mut packed = vec![0x28, 0xb5, 0x2f, 0xfd];
    packed.extend(noise(2 * MIB, 90));
    std::fs::write(dir.join("packed.bin"), &packed).unwrap();
    let scene = write_scene(&dir, &["packed.bin"]);
    let out = farm.run(&[
        "submit",
        scene.to_str().unwrap(),
        "--engine",
        "noop",
        "--json",
    ]);
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let note: Vec<&str> = stderr.lines().filter(|l| l.starts_with("note:")).collect();
    assert_eq!(note.len(), 1, "{stderr}");
    assert!(
        note[0].contains("`packed.bin` is zstd-compressed")
            && note[0].contains("chunk-level dedupe cannot")
            && note[0].contains("save it uncompressed"),
        "{stderr}"
    );
    // stdout is still one JSON object.
    let job: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        u(&job["bytes_uploaded"]),
        packed.len() as u64 + size(&scene)
    );
}

/// `submit --frame-files`: each of 4 workers renders one frame of 4, and
/// fetches the files every task needs plus its own frame's file, not the
/// other frames' (nor, once its task is over, keeps that file linked in
/// the job folder); files of frames the job does not render are not
/// uploaded, and a pattern that matches nothing is refused before any
/// upload.
#[test]
fn frame_files_go_only_to_the_workers_rendering_their_frames() {
    // No pipelining: with 4 one-slot workers and 4 one-task frames, each
    // worker holds exactly one lease.
    let mut farm = Farm::start("frame-files", &["--no-pipelining"]);
    let dir = farm.dir.join("scene");
    let frame_file = |f: u32| format!("cache/f_{f:04}.png");
    let mut textures = vec!["tex/shared.png".to_string()];
    textures.extend((1..=6).map(frame_file));
    let refs: Vec<&str> = textures.iter().map(String::as_str).collect();
    std::fs::create_dir_all(&dir).unwrap();
    let scene = write_scene(&dir, &refs);
    let text = std::fs::read_to_string(&scene).unwrap();
    std::fs::write(&scene, text.replace(r#""end": 1"#, r#""end": 6"#)).unwrap();
    write_noise_png(&dir.join("tex/shared.png"), 64, 1);
    for f in 1..=6 {
        write_noise_png(&dir.join(frame_file(f)), 96, 10 + u64::from(f));
    }
    let scene_arg = scene.to_str().unwrap();

    let bad = farm.run(&[
        "submit",
        scene_arg,
        "--engine",
        "noop",
        "--frame-files",
        "cache/g_####.png",
    ]);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert_eq!(bad.status.code(), Some(1), "{err}");
    assert!(
        err.contains("`cache/g_####.png` matches none of the job's 8 files"),
        "{err}"
    );
    assert_eq!(stored_bytes(&farm), 0, "nothing was uploaded");

    for i in 0..4 {
        farm.add_worker_with(&format!("w{i}"), &["--engine", "noop", "--noop-ms", "300"]);
    }
    farm.wait_workers(4);
    let job = farm.json(&[
        "submit",
        scene_arg,
        "--engine",
        "noop",
        "--frames",
        "1-4",
        "--frame-files",
        "cache/f_####.png",
        "--json",
    ]);
    let id = u(&job["id"]);
    let shared = size(&scene) + size(&dir.join("tex/shared.png"));
    let frame_bytes = |f: u32| size(&dir.join(frame_file(f)));
    assert_eq!(
        u(&job["bytes_uploaded"]),
        shared + (1..=4).map(frame_bytes).sum::<u64>(),
        "frames 5 and 6 are not rendered, so their files are not uploaded"
    );
    let done = farm.wait_done(id, &farm.dir.join("out"));
    assert!(!in_store(&farm, &digest_of(&dir.join(frame_file(5)))));
    assert_eq!(
        u(&done["bytes_to_workers"]),
        4 * shared + (1..=4).map(frame_bytes).sum::<u64>(),
        "each worker fetched the shared files and one frame's: {done}"
    );
    let mut frames_seen = Vec::new();
    for i in 0..4 {
        let w = format!("w{i}");
        assert!(cached(&farm, &w, &dir.join("tex/shared.png")), "{w}");
        let own: Vec<u32> = (1..=6)
            .filter(|&f| cached(&farm, &w, &dir.join(frame_file(f))))
            .collect();
        assert_eq!(own.len(), 1, "{w} holds the files of frames {own:?}");
        frames_seen.extend(own);
        // The task is over: its frame's file is no longer in the job folder.
        let jobs = farm.dir.join(format!("cache-{w}")).join("jobs");
        for d in std::fs::read_dir(&jobs).unwrap().flatten() {
            assert!(d.path().join("tex/shared.png").exists());
            let left: Vec<_> = std::fs::read_dir(d.path().join("cache"))
                .map(|r| r.flatten().map(|e| e.file_name()).collect())
                .unwrap_or_default();
            assert!(left.is_empty(), "{w} still links {left:?}");
        }
    }
    frames_seen.sort_unstable();
    assert_eq!(frames_seen, vec![1, 2, 3, 4]);
}

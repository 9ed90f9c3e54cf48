//! Submitting: hashing a scene's files (large ones as chunk lists), asking
//! the coordinator which it lacks, uploading only those over parallel
//! streams, and submitting the job's manifest.

use super::*;

/// A submitted job and the warnings that apply to it.
pub struct Submitted {
    pub status: JobStatus,
    pub warnings: Vec<String>,
    /// Every file of the job and where on this machine it was read.
    pub files: Vec<JobFile>,
}

/// A file of a submitted job: its path in the job folder, where it was
/// read on this machine (symbolic links resolved), its size and digest.
pub struct JobFile {
    pub path: String,
    pub from: PathBuf,
    pub size: u64,
    pub digest: Digest,
}

/// Scans, hashes, uploads what is missing, and submits. Returns the job's
/// status; warnings are printed once on stderr and returned.
pub async fn submit(client: &mut Client, opts: &SubmitOptions) -> anyhow::Result<Submitted> {
    let (spec, warnings, from) = upload_scene(client, opts).await?;
    let files = (spec.manifest.iter().zip(from))
        .map(|(e, from)| JobFile {
            path: e.path.clone(),
            from,
            size: e.size,
            digest: e.digest,
        })
        .collect();
    match client.call(&ClientRequest::Submit(spec)).await? {
        ClientResponse::Submitted(status) => Ok(Submitted {
            status,
            warnings,
            files,
        }),
        other => bail!("unexpected reply {other:?}"),
    }
}

fn deadline_unix_ms(opts: &SubmitOptions) -> Option<u64> {
    opts.deadline.map(|d| {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |t| t.as_millis() as u64);
        now.saturating_add(d.as_millis().min(u128::from(u64::MAX / 2)) as u64)
    })
}

fn task_timeout_ms(opts: &SubmitOptions) -> Option<u64> {
    (opts.task_timeout).map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX))
}

/// Submits an OpenJD template's ffmpeg step: an encode job of the frames
/// of job `input` (already submitted), which it runs after. Nothing is
/// uploaded: its inputs are that job's frames.
pub async fn submit_encode(
    client: &mut Client,
    opts: &SubmitOptions,
    encode: &crate::openjd::Encode,
    input: u64,
) -> anyhow::Result<JobStatus> {
    let mut after = opts.after.clone();
    after.push(input);
    let spec = JobSpec {
        request_id: opts.request_id.clone(),
        name: opts
            .name
            .clone()
            .unwrap_or_else(|| encode.movie.name.clone()),
        engine: Engine::Ffmpeg,
        scene: String::new(),
        manifest: Vec::new(),
        frames: vec![1],
        tiles: TileGrid::WHOLE,
        sample_ranges: 1,
        samples: 1,
        // The coordinator gives it the frame size of the job it encodes.
        resolution: (1, 1),
        priority: opts.priority,
        output: OutputFormat::Image,
        blender: None,
        output_name: Some(encode.movie.name.clone()),
        unreal: None,
        finish: false,
        verify_percent: 0,
        after,
        after_failure: opts.after_failure,
        paused: opts.paused,
        deadline_unix_ms: deadline_unix_ms(opts),
        budget: opts.budget,
        task_timeout_ms: task_timeout_ms(opts),
        render_format: None,
        encode: Some(Box::new(tessera_protocol::encode::EncodeSpec {
            input,
            input_options: encode.input_options.clone(),
            output_options: encode.output_options.clone(),
        })),
        host: opts.host.clone().map(Box::new),
        warnings: Vec::new(),
    };
    match client.call(&ClientRequest::Submit(spec)).await? {
        ClientResponse::Submitted(status) => Ok(status),
        other => bail!("unexpected reply {other:?}"),
    }
}

/// Scans, hashes and uploads what is missing: the job spec to submit (by
/// [`submit`], or by `submit --upload-only` for the HTTP API), its
/// warnings (printed once on stderr), and where each manifest entry's file
/// was read.
pub async fn upload_scene(
    client: &mut Client,
    opts: &SubmitOptions,
) -> anyhow::Result<(JobSpec, Vec<String>, Vec<PathBuf>)> {
    let scan = scan(client, opts).await?;
    for w in &scan.warnings {
        eprintln!("warning: {w}");
    }
    let name = opts.name.clone().unwrap_or_else(|| {
        opts.scene
            .file_name()
            .map_or("job".into(), |n| n.to_string_lossy().into_owned())
    });
    let mut spec = JobSpec {
        request_id: opts.request_id.clone(),
        name,
        engine: scan.engine,
        scene: scan.files[0].job_path.clone(),
        manifest: Vec::new(),
        frames: scan.frames,
        tiles: opts.tiles,
        sample_ranges: scan.sample_ranges,
        samples: scan.samples,
        resolution: scan.resolution,
        priority: opts.priority,
        output: scan.output,
        blender: scan.blender,
        output_name: match &opts.output_pattern {
            Some((name, true)) => Some(format!("{name}{}", scan.extension)),
            Some((name, false)) => Some(name.clone()),
            None => scan.output_name.filter(|_| !opts.builtin_frame_names),
        },
        unreal: scan.unreal.map(Box::new),
        finish: scan.finish,
        verify_percent: opts.verify,
        after: opts.after.clone(),
        after_failure: opts.after_failure,
        paused: opts.paused,
        deadline_unix_ms: deadline_unix_ms(opts),
        budget: opts.budget,
        task_timeout_ms: task_timeout_ms(opts),
        render_format: opts
            .render_format
            .filter(|_| scan.engine == Engine::Blender),
        encode: None,
        host: opts.host.clone().map(Box::new),
        warnings: Vec::new(),
    };
    // The coordinator checks the same; checking here first uploads nothing
    // for a job it would refuse.
    if let Err(e) = spec.check_limits() {
        bail!("{e}; nothing was uploaded");
    }
    // Checked before anything is hashed or uploaded.
    if scan.engine == Engine::Unreal && !opts.frame_files.is_empty() {
        bail!("--frame-files is for Blender and builtin scenes (an Unreal chunk renders warm-up frames before its own); nothing was uploaded");
    }
    let paths: Vec<&str> = scan.files.iter().map(|f| f.job_path.as_str()).collect();
    let file_frames = crate::frame_files::assign(&opts.frame_files, &paths)?;
    // A frame's files are uploaded only when the job renders that frame.
    let rendered: std::collections::HashSet<u32> = spec.frames.iter().copied().collect();
    let before = scan.files.len();
    let (files, file_frames): (Vec<SceneFile>, Vec<Option<u32>>) = (scan.files.into_iter())
        .zip(file_frames)
        .filter(|(_, f)| f.is_none_or(|f| rendered.contains(&f)))
        .unzip();
    if files.len() < before {
        eprintln!(
            "note: --frame-files: {} files of frames this job does not render are left out",
            before - files.len()
        );
    }
    let from: Vec<PathBuf> = files.iter().map(|f| f.on_disk.clone()).collect();
    let hashed = hash_files(&files).await?;
    for h in &hashed {
        if let Some(note) = &h.note {
            eprintln!("note: {note}");
        }
    }
    let mut hashed = hashed;
    send_missing(client, &mut hashed, opts.progress).await?;
    spec.manifest = hashed.into_iter().map(|h| h.entry).collect();
    for (entry, frame) in spec.manifest.iter_mut().zip(file_frames) {
        entry.frame = frame;
    }
    // Kept with the job too, for its page: as many as fit the bounds.
    spec.warnings = (scan
        .warnings
        .iter()
        .take(tessera_protocol::job::MAX_WARNINGS))
    .map(|w| {
        let mut end = w.len().min(tessera_protocol::job::MAX_WARNING_BYTES);
        while !w.is_char_boundary(end) {
            end -= 1;
        }
        w[..end].to_string()
    })
    .collect();
    Ok((spec, scan.warnings, from))
}

/// A scene file, hashed.
pub(crate) struct Hashed {
    /// For a large file, `digest` is only known once the coordinator has
    /// joined its chunks (`send_missing` fills it in).
    pub entry: ManifestEntry,
    pub(super) on_disk: PathBuf,
    /// Its chunks, for a file of at least `CHUNK_THRESHOLD` bytes.
    pub(super) list: Option<ChunkList>,
    /// Something the user should know (a compressed file defeats chunking).
    pub note: Option<String>,
}

/// Hashes every file; large ones are chunked (on every core).
pub(crate) async fn hash_files(files: &[SceneFile]) -> anyhow::Result<Vec<Hashed>> {
    let files: Vec<(String, PathBuf, Option<String>)> = files
        .iter()
        .map(|f| (f.job_path.clone(), f.on_disk.clone(), f.origin.clone()))
        .collect();
    tokio::task::spawn_blocking(move || {
        files
            .into_iter()
            .map(|(path, on_disk, origin)| hash_file(path, on_disk, origin))
            .collect()
    })
    .await?
}

/// The scene file the user named, every link resolved (the file they
/// named is meant, whatever links lead to it).
pub(crate) fn real_path(path: &Path) -> anyhow::Result<PathBuf> {
    std::fs::canonicalize(path).with_context(|| format!("cannot read {}", path.display()))
}

/// The path the kernel opened `file` by, every link resolved.
pub(super) fn opened_path(file: &std::fs::File) -> Option<PathBuf> {
    use std::os::fd::AsRawFd;
    std::fs::read_link(format!("/proc/self/fd/{}", file.as_raw_fd())).ok()
}

pub(super) fn chunk_threads() -> usize {
    std::thread::available_parallelism().map_or(2, |n| n.get())
}

pub(super) fn hash_file(
    path: String,
    on_disk: PathBuf,
    origin: Option<String>,
) -> anyhow::Result<Hashed> {
    use std::io::Read;
    let cannot = || format!("cannot read {}", on_disk.display());
    let mut file = std::fs::File::open(&on_disk).with_context(cannot)?;
    // `on_disk` is the real path its sharing was checked for: the file
    // opened must be that one, not what a link swapped in since leads to
    // (its content is hashed here, and an upload that differs from the
    // hash is refused by the coordinator).
    let opened = opened_path(&file);
    if opened.as_deref() != Some(on_disk.as_path()) {
        bail!(
            "{} changed while it was read (it now leads to {}); nothing was uploaded",
            on_disk.display(),
            opened.map_or("an unknown file".into(), |p| p.display().to_string())
        );
    }
    let len = file.metadata().with_context(cannot)?.len();
    let (digest, size, list, note) = if len >= CHUNK_THRESHOLD {
        let mut head = [0u8; 8];
        file.read_exact(&mut head).with_context(cannot)?;
        let list = chunk::list_at(&file, chunk_threads()).with_context(cannot)?;
        let note = chunk::compression(&head).map(|kind| {
            format!(
                "`{path}` is {kind}-compressed ({}): chunk-level dedupe cannot find its unchanged parts, so every edit uploads all of it; save it uncompressed (Blender: File > Save As, untick Compress) to upload only what changed",
                human_bytes(list.size)
            )
        });
        (list.id(), list.size, Some(list), note)
    } else {
        let (digest, size) =
            Digest::of_reader(std::io::BufReader::new(file)).with_context(cannot)?;
        (digest, size, None, None)
    };
    Ok(Hashed {
        entry: ManifestEntry {
            path,
            digest,
            size,
            origin,
            frame: None,
        },
        on_disk,
        list,
        note,
    })
}

/// One blob to upload: a whole small file, or a chunk of a large one.
#[derive(Clone)]
pub(super) struct Upload {
    pub(super) digest: Digest,
    pub(super) len: u64,
    pub(super) file: Arc<std::fs::File>,
    pub(super) offset: u64,
    pub(super) path: PathBuf,
}

impl Upload {
    pub(super) fn read(&self) -> std::io::Result<Vec<u8>> {
        use std::os::unix::fs::FileExt;
        let mut buf = vec![0u8; self.len as usize];
        self.file.read_exact_at(&mut buf, self.offset)?;
        Ok(buf)
    }
}

/// Asks which of `digests` the coordinator lacks, in batches that fit a frame.
pub(super) async fn missing(
    client: &mut Client,
    digests: Vec<Digest>,
) -> anyhow::Result<HashSet<Digest>> {
    let mut out = HashSet::new();
    for batch in digests.chunks(100_000) {
        match client
            .call(&ClientRequest::MissingBlobs(batch.to_vec()))
            .await?
        {
            ClientResponse::Missing(m) => out.extend(m),
            other => bail!("unexpected reply {other:?}"),
        }
    }
    Ok(out)
}

/// Asks which files the coordinator joined from these chunk lists before.
pub(super) async fn known_lists(
    client: &mut Client,
    ids: &[Digest],
) -> anyhow::Result<Vec<Option<Digest>>> {
    let mut out = Vec::with_capacity(ids.len());
    for batch in ids.chunks(100_000) {
        match client
            .call(&ClientRequest::KnownLists(batch.to_vec()))
            .await?
        {
            ClientResponse::Known(files) if files.len() == batch.len() => out.extend(files),
            other => bail!("unexpected reply {other:?}"),
        }
    }
    Ok(out)
}

/// Uploads what the coordinator lacks: small files whole, large files as
/// the chunks it does not hold yet (so an interrupted upload resumes where
/// it stopped), then has it join each large file from its chunks. A large
/// file goes by its chunk list, and the coordinator names it: with the
/// digest of a file it joined from the same list before, or with the digest
/// it computes as it joins the chunks; this fills in `entry.digest`.
/// Returns the bytes it uploaded.
pub(crate) async fn send_missing(
    client: &mut Client,
    files: &mut [Hashed],
    progress: bool,
) -> anyhow::Result<u64> {
    let large: Vec<(usize, Digest)> = files
        .iter()
        .enumerate()
        .filter_map(|(i, h)| h.list.as_ref().map(|l| (i, l.id())))
        .collect();
    let ids: Vec<Digest> = large.iter().map(|&(_, id)| id).collect();
    let known = known_lists(client, &ids).await?;
    // Large files to join, one per distinct chunk list.
    let mut to_join: Vec<usize> = Vec::new();
    let mut listed = HashSet::new();
    for (&(i, id), file) in large.iter().zip(known) {
        match file {
            Some(digest) => files[i].entry.digest = digest,
            None if listed.insert(id) => to_join.push(i),
            None => {}
        }
    }
    let mut seen = HashSet::new();
    let small: Vec<usize> = (0..files.len())
        .filter(|&i| files[i].list.is_none() && seen.insert(files[i].entry.digest))
        .collect();
    let lacking = missing(
        client,
        small.iter().map(|&i| files[i].entry.digest).collect(),
    )
    .await?;
    let chunk_digests: Vec<Digest> = to_join
        .iter()
        .filter_map(|&i| files[i].list.as_ref())
        .flat_map(|l| l.chunks.iter().map(|c| c.digest))
        .collect::<HashSet<_>>()
        .into_iter()
        .collect();
    let mut lacking_chunks = missing(client, chunk_digests).await?;
    let mut uploads = Vec::new();
    let sending = small
        .into_iter()
        .filter(|i| lacking.contains(&files[*i].entry.digest))
        .chain(to_join.iter().copied());
    for i in sending {
        let h = &files[i];
        let file = Arc::new(
            std::fs::File::open(&h.on_disk)
                .with_context(|| format!("cannot read {}", h.on_disk.display()))?,
        );
        let upload = |digest, len, offset| Upload {
            digest,
            len,
            file: file.clone(),
            offset,
            path: h.on_disk.clone(),
        };
        match &h.list {
            None => uploads.push(upload(h.entry.digest, h.entry.size, 0)),
            Some(list) => {
                for (offset, c) in list.offsets() {
                    // A chunk that repeats inside the files goes up once.
                    if lacking_chunks.remove(&c.digest) {
                        uploads.push(upload(c.digest, u64::from(c.len), offset));
                    }
                }
            }
        }
    }
    let sent = upload(&client.session.connection, uploads, progress).await?;
    for i in to_join {
        let list = files[i]
            .list
            .clone()
            .expect("a large file has a chunk list");
        let id = list.id();
        let digest = match client
            .call(&ClientRequest::Assemble(list))
            .await
            .with_context(|| format!("storing `{}`", files[i].entry.path))?
        {
            ClientResponse::Assembled(digest) => digest,
            other => bail!("unexpected reply {other:?}"),
        };
        for &(j, _) in large.iter().filter(|(_, l)| *l == id) {
            files[j].entry.digest = digest;
        }
    }
    Ok(sent)
}

/// Streams that upload at once.
pub(super) const UPLOAD_STREAMS: usize = 8;

/// Uploads blobs on several streams at once, with a progress bar (bytes,
/// rate, ETA) on a terminal. A blob the coordinator refuses as corrupt is
/// read and sent again. Returns the bytes of the blobs it sent.
pub(super) async fn upload(
    conn: &quinn::Connection,
    uploads: Vec<Upload>,
    progress: bool,
) -> anyhow::Result<u64> {
    if uploads.is_empty() {
        return Ok(0);
    }
    let total: u64 = uploads.iter().map(|u| u.len).sum();
    let sent = Arc::new(AtomicU64::new(0));
    let started = Instant::now();
    let bar_task = progress.then(|| {
        let sent = sent.clone();
        tokio::spawn(async move {
            let mut bar = Progress::new("uploading", "bytes");
            loop {
                let s = sent.load(Ordering::Relaxed);
                bar.update(s, total);
                if s >= total {
                    bar.finish();
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        })
    });
    let mut queue = uploads;
    queue.reverse();
    let queue = Arc::new(std::sync::Mutex::new(queue));
    let mut workers = Vec::new();
    for _ in 0..UPLOAD_STREAMS {
        let (conn, queue, sent) = (conn.clone(), queue.clone(), sent.clone());
        workers.push(tokio::spawn(async move {
            loop {
                let next = queue.lock().expect("upload queue").pop();
                let Some(u) = next else {
                    return anyhow::Ok(());
                };
                blob::put_retrying(&conn, u.digest, 3, || u.read())
                    .await
                    .with_context(|| {
                        format!(
                            "uploading {} (if it was saved during the upload, run submit again)",
                            u.path.display()
                        )
                    })?;
                sent.fetch_add(u.len, Ordering::Relaxed);
            }
        }));
    }
    for w in workers {
        w.await??;
    }
    if let Some(t) = bar_task {
        let _ = t.await;
    }
    tracing::info!(
        bytes = total,
        ms = started.elapsed().as_millis() as u64,
        "uploaded"
    );
    Ok(total)
}

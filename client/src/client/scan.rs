//! Scanning a scene: every file it needs (a built-in scene, a `.blend` and
//! what it links, read here or, with `--scan-on-farm`, by a worker's
//! Blender), the frame range, the Blender it needs and the warnings a
//! person should see before the farm renders it.

use super::*;

/// A scene file and everything it references, ready to hash.
pub(super) struct Scan {
    pub(super) engine: Engine,
    pub(super) frames: Vec<u32>,
    pub(super) samples: u32,
    pub(super) resolution: (u32, u32),
    pub(super) output: OutputFormat,
    /// As asked, or 1 where `auto` cannot split this scene.
    pub(super) sample_ranges: u32,
    /// The scene file first, then everything it references.
    pub(super) files: Vec<SceneFile>,
    pub(super) blender: Option<BlenderNeeds>,
    /// What the user should know about this job, each said once.
    pub(super) warnings: Vec<String>,
    /// The scene's frame-name template, if it names its frames.
    pub(super) output_name: Option<String>,
    pub(super) unreal: Option<tessera_protocol::unreal::UnrealJob>,
    /// Frames end with a finishing task (see [`JobSpec::finish`]).
    pub(super) finish: bool,
    /// The extension Blender gives the output format (`.png`), for names
    /// a template's `--render-output` sets.
    pub(super) extension: &'static str,
}

/// The extension Blender appends for an image format (`file_format`).
pub(super) fn blender_extension(file_format: &str) -> &'static str {
    match file_format {
        "PNG" => ".png",
        "JPEG" => ".jpg",
        "OPEN_EXR" | "OPEN_EXR_MULTILAYER" => ".exr",
        "BMP" => ".bmp",
        "TARGA" | "TARGA_RAW" => ".tga",
        "TIFF" => ".tif",
        "JPEG2000" => ".jp2",
        "WEBP" => ".webp",
        "HDR" => ".hdr",
        "CINEON" => ".cin",
        "DPX" => ".dpx",
        "IRIS" => ".rgb",
        _ => "",
    }
}

pub struct SceneFile {
    /// Where it goes in the job folder.
    pub job_path: String,
    pub on_disk: PathBuf,
    /// Its absolute path here, for engines that remap references.
    pub origin: Option<String>,
}

/// Checks the requested frames against the scene's range.
pub(super) fn frames_in_range(
    requested: Option<&str>,
    first: u32,
    last: u32,
) -> anyhow::Result<Vec<u32>> {
    let frames = match requested {
        Some(f) => parse_frames(f).map_err(anyhow::Error::msg)?,
        // Counted before anything is allocated: a scene may declare
        // 0..4294967295.
        None if u64::from(last.saturating_sub(first)) >= limits::MAX_FRAMES as u64 => bail!(
            "the scene's frame range {first}-{last} has {} frames; a job has at most {} (pick some with --frames); nothing was uploaded",
            u64::from(last.saturating_sub(first)) + 1,
            limits::MAX_FRAMES
        ),
        None => (first..=last).collect(),
    };
    if let Some(bad) = frames.iter().find(|&&f| f < first || f > last) {
        bail!(
            "frame {bad} is outside the scene's frame range {first}-{last}; nothing was uploaded"
        );
    }
    Ok(frames)
}

pub(super) async fn scan(client: &mut Client, opts: &SubmitOptions) -> anyhow::Result<Scan> {
    let path = &opts.scene;
    let file_name = path
        .file_name()
        .and_then(|n| n.to_str())
        .with_context(|| format!("`{}` is not a file name", path.display()))?
        .to_string();
    let engine = match opts.engine {
        Some(e) => e,
        None if file_name.ends_with(".blend") => Engine::Blender,
        None if file_name.ends_with(".json") => Engine::Builtin,
        None if file_name.ends_with(".uproject") => Engine::Unreal,
        None => bail!(
            "`{}`: unknown scene type (expected a .blend, an Unreal .uproject or a builtin *.scene.json file)",
            path.display()
        ),
    };
    if !path.is_file() {
        bail!("scene `{}` does not exist", path.display());
    }
    let sharing = Sharing::new(path, &opts.share)?;
    match engine {
        Engine::Builtin | Engine::Noop => {
            let scene = builtin::Scene::load(path)?;
            let (first, last) = scene.frame_range();
            let frames = frames_in_range(opts.frames.as_deref(), first, last)?;
            let dir = path.parent().unwrap_or(Path::new("."));
            let mut files = vec![SceneFile {
                job_path: file_name,
                on_disk: real_path(path)?,
                origin: None,
            }];
            let mut refused = Vec::new();
            for tex in scene.texture_paths() {
                let on_disk = dir.join(&tex);
                if !on_disk.is_file() {
                    bail!("texture `{tex}` named by the scene is missing (looked for {}); nothing was uploaded", on_disk.display());
                }
                match sharing.check(&on_disk) {
                    Ok(real) => files.push(SceneFile {
                        job_path: tex,
                        on_disk: real,
                        origin: None,
                    }),
                    Err(why) => refused.push(share::Refused {
                        path: on_disk.to_string_lossy().into_owned(),
                        used_by: format!("texture `{tex}`"),
                        why,
                    }),
                }
            }
            if !refused.is_empty() {
                return Err(sharing.refusal(&refused, "nothing was uploaded"));
            }
            Ok(Scan {
                engine,
                frames,
                samples: opts.samples.unwrap_or_else(|| scene.samples()),
                resolution: scene.resolution(),
                output: OutputFormat::Png,
                sample_ranges: opts.sample_ranges,
                files,
                blender: None,
                warnings: Vec::new(),
                output_name: None,
                unreal: None,
                finish: false,
                extension: ".png",
            })
        }
        Engine::Blender => scan_blend(client, opts, path, file_name, &sharing).await,
        Engine::Ffmpeg => {
            bail!("the ffmpeg engine encodes the frames of another job: submit an OpenJD template with an ffmpeg step")
        }
        Engine::Unreal => {
            let p = crate::uproject::scan(path, opts.frames.as_deref(), &opts.unreal, &sharing)?;
            Ok(Scan {
                engine,
                frames: p.frames,
                samples: 1,
                resolution: p.resolution,
                output: p.output,
                sample_ranges: 1,
                files: p.files,
                blender: None,
                warnings: Vec::new(),
                output_name: None,
                unreal: Some(p.unreal),
                finish: false,
                extension: "", // templates render Blender only
            })
        }
    }
}

pub(super) async fn scan_blend(
    client: &mut Client,
    opts: &SubmitOptions,
    path: &Path,
    file_name: String,
    sharing: &Sharing,
) -> anyhow::Result<Scan> {
    let blend = blend::absolute(path)?;
    let project = blend.parent().context("a .blend file lies in a folder")?;
    let saved = blender_runtime::file_version(&blend).map_err(|e| {
        anyhow::anyhow!(
            "`{}` is not a readable .blend file: {}",
            blend.display(),
            e.root_cause()
        )
    })?;
    let version = opts
        .blender
        .unwrap_or(VersionReq::Series(saved.major, saved.minor));
    if let VersionReq::Series(ma, mi) = version {
        if (ma, mi) < saved.series() {
            bail!(
                "`{}` was saved by Blender {}; Blender {version} cannot read it (ask for --blender {} or newer)",
                blend.display(),
                saved.short(),
                saved.short()
            );
        }
    }
    let (mut s, nothing) = match blend::scanner(&blend, saved, opts.blender_python.as_deref())? {
        Some(runtime) => (blend::scan(&blend, &runtime)?, "nothing was uploaded"),
        // The .blend and its shared libraries went up for their scans.
        None => (
            farm_scan(client, &blend, saved, sharing).await?,
            "nothing was submitted",
        ),
    };
    // Files Blender ships: the worker's own Blender has them.
    s.files.retain(|f| !share::blender_own(Path::new(&f.path)));
    if let Some(format) = opts.render_format {
        // Blender writes the frames in it, as `--render-format` would.
        s.file_format = format.blender_name().to_string();
        s.is_movie = false;
    }
    let mut real_paths = shared_paths(&s, opts, sharing, nothing)?;
    let frames = frames_in_range(opts.frames.as_deref(), s.frame_start, s.frame_end)?;
    let cycles = s.render_engine == "CYCLES";
    let Split {
        output,
        sample_ranges,
        finish,
    } = split(&s, opts, version, saved)?;
    let mut warnings = blend_warnings(&s, opts.tiles.count() > 1, sample_ranges > 1, finish);
    if finish && s.use_denoising && s.denoiser.as_deref() == Some("OPTIX") {
        warnings.push("the scene denoises with OptiX; the finishing step of a split frame denoises with OpenImageDenoise, so frames differ from a full render: submit without --tiles and --sample-ranges for OptiX's result".into());
    }
    let small = std::fs::metadata(&blend).map_or(true, |m| m.len() < CHUNK_THRESHOLD);
    if let (Some(kind), true) = (&s.compressed, small) {
        // Large files get the note about chunking when they are hashed.
        eprintln!("note: `{file_name}` is {kind}-compressed; Blender reads it as is");
    }
    let mut files = vec![SceneFile {
        job_path: file_name,
        on_disk: real_path(&blend)?,
        origin: Some(blend.to_string_lossy().into_owned()),
    }];
    for dep in s.files.iter().filter(|f| f.exists) {
        let Some(real) = real_paths.remove(&dep.path) else {
            continue; // listed twice
        };
        files.push(SceneFile {
            job_path: blend::job_path(project, Path::new(&dep.path))?,
            on_disk: real,
            origin: Some(dep.path.clone()),
        });
    }
    tracing::info!(blender = %s.blender_version, files = files.len(), "scanned {}", blend.display());
    let needs = BlenderNeeds {
        saved_by: Some(saved),
        version,
        // The finishing step denoises with the compositor's OpenImageDenoise.
        denoise: cycles && s.use_denoising && (s.denoiser.as_deref() != Some("OPTIX") || finish),
        osl: cycles && s.use_osl,
        eevee: matches!(
            s.render_engine.as_str(),
            "BLENDER_EEVEE" | "BLENDER_EEVEE_NEXT" | "BLENDER_WORKBENCH"
        ),
    };
    Ok(Scan {
        engine: Engine::Blender,
        frames,
        samples: opts.samples.unwrap_or(s.samples),
        resolution: s.resolution,
        output,
        sample_ranges,
        files,
        blender: Some(needs),
        warnings,
        output_name: s.output_name.clone(),
        unreal: None,
        finish,
        extension: blender_extension(&s.file_format),
    })
}

/// The real paths of the files `s` lists that exist, keyed by the path the
/// scene names them by. What the artist did not mean to share is refused
/// before anything else is said or uploaded; missing files are refused
/// unless `--allow-missing`. `nothing` says what was not done.
fn shared_paths(
    s: &blend::Scan,
    opts: &SubmitOptions,
    sharing: &Sharing,
    nothing: &str,
) -> anyhow::Result<std::collections::HashMap<String, PathBuf>> {
    // What the artist did not mean to share is refused before anything
    // else is said or uploaded; what is shared is read from its real path.
    let mut refused = Vec::new();
    let mut real_paths = std::collections::HashMap::new();
    for f in s.files.iter().filter(|f| f.exists) {
        match sharing.check(Path::new(&f.path)) {
            Ok(real) => {
                real_paths.insert(f.path.clone(), real);
            }
            Err(why) => refused.push(share::Refused {
                path: f.path.clone(),
                used_by: format!("{} used by {}", f.kind, f.user),
                why,
            }),
        }
    }
    if !refused.is_empty() {
        return Err(sharing.refusal(&refused, nothing));
    }
    let missing: Vec<String> = s
        .files
        .iter()
        .filter(|f| !f.exists)
        .map(|f| format!("{} ({} used by {})", f.path, f.kind, f.user))
        .collect();
    if !missing.is_empty() && !opts.allow_missing {
        bail!(
            "{} file(s) the scene uses are missing; {nothing}: {} (pass --allow-missing to render without them)",
            missing.len(),
            missing.join(", ")
        );
    }
    Ok(real_paths)
}

/// How a scanned Blender scene's frames are split and written.
struct Split {
    output: OutputFormat,
    sample_ranges: u32,
    /// One finishing task per frame composites and denoises the whole frame.
    finish: bool,
}

/// How `s`'s frames may be split (tiles, sample ranges, a finishing task)
/// and in which format, or why the split asked for cannot render exactly.
fn split(
    s: &blend::Scan,
    opts: &SubmitOptions,
    version: VersionReq,
    saved: tessera_protocol::blender::BlenderVersion,
) -> anyhow::Result<Split> {
    let cycles = s.render_engine == "CYCLES";
    let whole = opts.tiles.count() == 1 && opts.sample_ranges <= 1;
    // Whole-frame effects on a split frame: the tiles render their passes,
    // and one finishing task per frame composites and denoises the whole
    // frame and writes the scene's output (a multilayer OpenEXR: what it
    // made, completed with the stitched passes by the coordinator).
    let finish = cycles && !whole && (s.compositing || s.use_denoising) && !s.is_movie;
    let output = match s.file_format.as_str() {
        "PNG" => OutputFormat::Png,
        "OPEN_EXR" | "OPEN_EXR_MULTILAYER" => OutputFormat::Exr,
        _ if s.is_movie => OutputFormat::Image, // refused below, with the reason
        _ if whole || finish => OutputFormat::Image,
        other => match opts.render_format {
            Some(_) => bail!("--render-format {other} is written only where Blender renders the whole frame, and this split renders tiles without a finishing step: submit without --tiles and --sample-ranges, or ask for --render-format PNG or OPEN_EXR, whose tiles are stitched"),
            None => bail!("the scene's output format {other} can only be rendered as whole frames: submit without --tiles and --sample-ranges, or set it to PNG or OpenEXR"),
        },
    };
    // `auto` splits only what merges exactly: Cycles to EXR, not denoised,
    // and not composited unless a finishing task composites the whole
    // frame (an unsplit frame has none).
    let sample_ranges = match opts.sample_ranges {
        SAMPLE_RANGES_AUTO
            if !cycles
                || output != OutputFormat::Exr
                || s.use_denoising
                || (s.compositing && !finish) =>
        {
            1
        }
        k => k,
    };
    if !cycles && (opts.tiles.count() > 1 || sample_ranges > 1) {
        bail!(
            "the scene renders with {}, which renders whole frames only: submit it without --tiles and --sample-ranges",
            s.render_engine
        );
    }
    if sample_ranges > 1 {
        if output != OutputFormat::Exr && !finish {
            match opts.render_format {
                Some(f) => bail!("--sample-ranges merges float images, which --render-format {f} cannot hold: ask for --render-format OPEN_EXR, or submit without --sample-ranges"),
                None => bail!("--sample-ranges merges float images: set the scene's output format to OpenEXR"),
            }
        }
        if s.use_denoising && !finish {
            bail!("--sample-ranges cannot merge denoised renders exactly: turn denoising off in the scene");
        }
        // Blender 4.5 renders a range as a subset of the full render's own
        // sampling pattern; 4.2 to 4.4 only offset it, which adds up to the
        // full render with the Tabulated Sobol pattern only.
        let renderer_may_lack_subsets = match version {
            VersionReq::Series(ma, mi) | VersionReq::AtLeast(ma, mi) => (ma, mi) < (4, 5),
        };
        let pattern = s.sampling_pattern.as_deref().unwrap_or("");
        if saved.series() >= (4, 2)
            && renderer_may_lack_subsets
            && !pattern.is_empty()
            && pattern != "TABULATED_SOBOL"
        {
            bail!(
                "--sample-ranges on Blender {} merges exactly only with the Tabulated Sobol pattern (this scene uses {pattern}): set Render > Sampling > Advanced > Pattern to Tabulated Sobol, or render with Blender 4.5 or newer (--blender '>=4.5')",
                version
            );
        }
    }
    if s.is_movie {
        bail!(
            "the scene's output format {} is a movie, which the farm does not encode: set the output to an image format (PNG, or OpenEXR) and encode the frames afterwards, e.g. with ffmpeg",
            s.file_format
        );
    }
    Ok(Split {
        output,
        sample_ranges,
        finish,
    })
}

/// Scans `blend` on a worker whose Blender reads it (this machine has
/// none): uploads it, has the farm list what it references, checks those
/// files here as the local scan does, and does the same for each linked
/// library it finds (at most [`blend::MAX_FARM_LIBRARIES`], nested at
/// most [`blend::MAX_LIBRARY_DEPTH`] deep).
pub(super) async fn farm_scan(
    client: &mut Client,
    blend: &Path,
    saved: tessera_protocol::blender::BlenderVersion,
    sharing: &Sharing,
) -> anyhow::Result<blend::Scan> {
    let (mut main, worker) = match scan_on_farm(client, blend, saved).await {
        Ok(scanned) => scanned,
        Err(e) => {
            let why = crate::shown::text(&format!("{e:#}"));
            return Err(blend::farm_scan_failed(blend, saved, &why));
        }
    };
    eprintln!(
        "note: this machine's Blender cannot read `{}` (saved by Blender {}): worker {} scanned it",
        blend.display(),
        saved.short(),
        crate::shown::text(&worker)
    );
    let mut scanned: HashSet<PathBuf> = HashSet::from([blend.to_path_buf()]);
    let mut level: Vec<PathBuf> = libraries_of(&main, &scanned, sharing);
    for _depth in 0..blend::MAX_LIBRARY_DEPTH {
        if level.is_empty() {
            break;
        }
        let mut next = Vec::new();
        for lib in level {
            if !scanned.insert(lib.clone()) {
                continue;
            }
            if scanned.len() > blend::MAX_FARM_LIBRARIES + 1 {
                bail!(
                    "`{}` links more than {} libraries; nothing was submitted",
                    blend.display(),
                    blend::MAX_FARM_LIBRARIES
                );
            }
            let version = blender_runtime::file_version(&lib).unwrap_or(saved);
            let (s, _) = scan_on_farm(client, &lib, version)
                .await
                .with_context(|| format!("scanning the library `{}` on the farm", lib.display()))?;
            next.extend(libraries_of(&s, &scanned, sharing));
            blend::merge(&mut main, s);
        }
        level = next;
    }
    Ok(main)
}

/// The libraries a scan lists that exist here, are not scanned yet and may
/// be shared (one that may not is never uploaded for a scan: the submit
/// refuses it, naming it, once the scans are done).
pub(super) fn libraries_of(
    s: &blend::Scan,
    scanned: &HashSet<PathBuf>,
    sharing: &Sharing,
) -> Vec<PathBuf> {
    (s.files.iter())
        .filter(|f| f.kind == "library" && f.exists)
        .map(|f| PathBuf::from(&f.path))
        .filter(|p| !scanned.contains(p))
        .filter(|p| !share::blender_own(p) && sharing.check(p).is_ok())
        .collect()
}

/// Uploads one `.blend` and has a worker scan it; the checked scan and the
/// worker's name.
pub(super) async fn scan_on_farm(
    client: &mut Client,
    blend: &Path,
    version: tessera_protocol::blender::BlenderVersion,
) -> anyhow::Result<(blend::Scan, String)> {
    let path = blend.to_str().context("the .blend's path is not UTF-8")?;
    let mut hashed = hash_files(&[SceneFile {
        job_path: "scan.blend".into(),
        on_disk: real_path(blend)?,
        origin: None,
    }])
    .await?;
    send_missing(client, &mut hashed, false).await?;
    let request = ClientRequest::Scan {
        blend: hashed[0].entry.digest,
        path: path.to_string(),
        version,
    };
    match client.call(&request).await? {
        ClientResponse::Scanned { worker, json } => Ok((blend::from_farm(&json, blend)?, worker)),
        other => bail!("unexpected reply {other:?}"),
    }
}

/// The warnings that apply to a `.blend` job split into tiles (`tiled`)
/// and/or sample ranges (`ranged`), its frames finished whole or not
/// (`finish`): general ones from the scan, then those of settings that only
/// matter for the split the job uses.
pub(super) fn blend_warnings(
    s: &blend::Scan,
    tiled: bool,
    ranged: bool,
    finish: bool,
) -> Vec<String> {
    let mut w = s.warnings.clone();
    let split = tiled || ranged;
    if ranged && s.use_adaptive_sampling {
        w.push("adaptive sampling is on: merged sample ranges differ slightly from a single render (float precision no longer holds)".into());
    }
    // A finishing step denoises, composites and stamps the whole frame.
    let tiled = tiled && !finish;
    if tiled && s.use_denoising {
        w.push("denoising is on: each tile is denoised on its own and does not match a full render (measured on a test scene, 2x2 tiles, OpenImageDenoise: up to 42/255 on 63 % of pixels); submit without --tiles for exact frames".into());
    }
    if tiled && s.compositing {
        w.push("compositing nodes are in use: the compositor runs on each tile, so filters that read neighbouring pixels (blur, glare, lens distortion) differ from a full render (measured on a test scene with glare and lens distortion, 2x2 tiles: up to 29/255 on 78 % of pixels); submit without --tiles for exact frames".into());
    }
    if tiled && s.stamp_burn_in {
        w.push("metadata burn-in (render.use_stamp) is on: every tile gets its own stamp".into());
    }
    if split && s.time_limit {
        w.push("a render time limit is set: split renders are not deterministic".into());
    }
    if ranged && !s.layer_sample_overrides.is_empty() {
        w.push(format!(
            "view layers override the sample count ({}): sample ranges and --samples do not apply to them",
            s.layer_sample_overrides.join(", ")
        ));
    }
    let mut seen = std::collections::HashSet::new();
    w.retain(|x| seen.insert(x.clone()));
    w
}

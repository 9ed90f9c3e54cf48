//! `tessera submit`.

use super::*;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// A .blend file or a builtin *.scene.json file.
    pub scene: PathBuf,
    /// Frames to render: 1-250, 1,5,9 or a mix (default: the scene's range).
    #[arg(long)]
    pub frames: Option<String>,
    /// Split each frame into COLSxROWS tiles.
    #[arg(long, default_value = "1x1")]
    pub tiles: TileGrid,
    /// Split each tile's samples into K ranges rendered as separate tasks
    /// and merged exactly; `auto`: split into 4 when the farm has
    /// interruptible workers, so a preemption loses at most one range.
    #[arg(long, default_value = "1", value_parser = parse_sample_ranges)]
    pub sample_ranges: u32,
    /// Override the scene's sample count.
    #[arg(long)]
    pub samples: Option<u32>,
    /// Check results from untrusted hosts: render P % of the tasks (and
    /// each worker's first result) again on a worker of another identity
    /// and compare them bit-exactly; a worker caught returning wrong
    /// pixels is quarantined and its results are rendered again.
    #[arg(long, default_value = "0")]
    pub verify: u32,
    /// When the job should be done, from now (e.g. 2h, 90m): `tessera
    /// fleet` rents enough nodes to meet it.
    #[arg(long, value_parser = parse_duration)]
    pub deadline: Option<std::time::Duration>,
    /// The most the job may cost, USD; what happens then is --on-budget.
    #[arg(long)]
    pub budget_usd: Option<f64>,
    /// When the budget is reached: `stop-dispatch` (hand out no more
    /// tasks, let running ones finish) or `cancel` (cancel the job and
    /// its running tasks).
    #[arg(long, default_value = "stop-dispatch", value_parser = tessera_protocol::job::OnBudget::parse)]
    pub on_budget: tessera_protocol::job::OnBudget,
    /// End any task that runs longer than this (e.g. 2h, 90m) and fail
    /// that attempt with the reason; it is retried like any failure
    /// (default: the coordinator's --task-timeout, else no limit).
    #[arg(long, value_parser = parse_duration)]
    pub task_timeout: Option<std::time::Duration>,
    /// With --wait: download the frames here, each as soon as it is
    /// stitched.
    #[arg(long)]
    pub output: Option<PathBuf>,
    /// With --output: replace files there that hold other frames.
    #[arg(long)]
    pub overwrite: bool,
    /// With --output: also fetch the finished frames if the job fails
    /// or is canceled.
    #[arg(long, requires = "output")]
    pub partial: bool,
    /// With --wait: give up waiting after this long (exit code 5).
    #[arg(long, value_parser = parse_duration)]
    pub timeout: Option<std::time::Duration>,
    /// Job name (default: the scene's file name).
    #[arg(long)]
    pub name: Option<String>,
    /// Higher runs first.
    #[arg(long, default_value_t = 0)]
    pub priority: i32,
    /// Wait for the job to finish.
    #[arg(long)]
    pub wait: bool,
    /// Print one JSON object on stdout.
    #[arg(long)]
    pub json: bool,
    /// Scan, hash and upload, then print the job spec as JSON and
    /// submit nothing: the body to POST to the HTTP API's /v1/jobs.
    #[arg(long, conflicts_with_all = ["wait", "output"])]
    pub upload_only: bool,
    /// Makes a retried submit idempotent: the same id gets the same job.
    #[arg(long)]
    pub request_id: Option<String>,
    /// Start only once these jobs are done: JOB[,JOB...] (ids of jobs
    /// already submitted; an unknown id is refused).
    #[arg(long, value_parser = parse_after)]
    pub after: Option<AfterArg>,
    /// When a job named by --after fails or is canceled: `fail` this
    /// job too, or `hold` it until `tessera resume` (runs it anyway) or
    /// `tessera cancel`.
    #[arg(long, default_value = "fail", value_parser = parse_after_failure)]
    pub after_failure: tessera_protocol::job::AfterFailure,
    /// Hold the job until `tessera resume JOB`.
    #[arg(long)]
    pub paused: bool,
    /// Files of a per-frame sequence, such as a simulation cache:
    /// PATTERN is a path in the job folder (relative to the scene's
    /// folder) with a run of `#` for the frame number and `*` for any
    /// characters but `/`, e.g. `cache/fluid_data_####.vdb`. A worker
    /// fetches a frame's files only for that frame's tasks, instead of
    /// every file before its first task (repeat for several).
    #[arg(long = "frame-files", value_name = "PATTERN")]
    pub frame_files: Vec<String>,
    /// For an Open Job Description template: a job parameter's value,
    /// NAME=VALUE (repeat for several; others take their defaults).
    #[arg(long = "job-param")]
    pub job_params: Vec<String>,
    /// Submit even when files the scene uses are missing.
    #[arg(long)]
    pub allow_missing: bool,
    #[command(flatten)]
    pub share: Box<ShareArgs>,
    /// Force an engine instead of choosing by file type.
    #[arg(long, hide = true)]
    pub engine: Option<Engine>,
    /// Blender versions that may render it: `4.5`, or `'>=4.2'`
    /// (default: the major.minor of the Blender that saved the file).
    /// A Blender older than the file never gets it.
    #[arg(long)]
    pub blender: Option<tessera_protocol::blender::VersionReq>,
    /// A Python where `import bpy` works, for listing the file's
    /// dependencies when this machine's Blender cannot read it.
    #[arg(long, env = "TESSERA_BLENDER_PYTHON")]
    pub blender_python: Option<PathBuf>,
    /// How downloaded frames are named: `scene` (as the scene's output
    /// path names them, e.g. sh010_0001.exr) or `frame` (frame_0001.EXT).
    #[arg(long, default_value = "scene", value_parser = ["scene", "frame"])]
    pub frame_names: String,
    #[command(flatten)]
    pub unreal: UnrealArgs,
    #[command(flatten)]
    pub ticket: TicketArg,
}

pub(crate) async fn run(args: Args) -> anyhow::Result<i32> {
    let Args {
        scene,
        frames,
        tiles,
        sample_ranges,
        samples,
        verify,
        deadline,
        budget_usd,
        on_budget,
        task_timeout,
        output,
        overwrite,
        partial,
        timeout,
        name,
        priority,
        wait,
        json,
        upload_only,
        request_id,
        after,
        after_failure,
        paused,
        frame_files,
        job_params,
        allow_missing,
        share,
        engine,
        blender,
        blender_python,
        frame_names,
        unreal,
        ticket,
    } = args;
    if !wait && (output.is_some() || timeout.is_some()) {
        let what = ["--timeout", "--output"][usize::from(output.is_some())];
        return Err(exit::usage(format!(
            "{what} needs --wait (submit returns at once without it; use `tessera wait JOB {what} …` later)"
        )));
    }
    let ticket = ticket.resolve()?;
    let opts = SubmitOptions {
        scene,
        frames,
        tiles,
        sample_ranges,
        samples,
        verify,
        deadline,
        budget: budget_usd.map(|usd| tessera_protocol::job::Budget {
            usd,
            on_reached: on_budget,
        }),
        task_timeout,
        name,
        priority,
        request_id,
        engine,
        allow_missing,
        builtin_frame_names: frame_names == "frame",
        output_pattern: None,
        render_format: None,
        host: None,
        progress: !json,
        blender,
        blender_python,
        unreal: unreal.options(),
        after: after.map(|a| a.0).unwrap_or_default(),
        after_failure,
        paused,
        frame_files,
        share: share.options()?,
    };
    if openjd::is_template(&opts.scene) {
        anyhow::ensure!(!upload_only, "--upload-only prints one job's spec; a template is a job per step: submit it (with --paused to hold its jobs), or --upload-only each step's scene");
        let template = openjd::load(&opts.scene, &job_params)?;
        let mut client = Client::connect(&ticket).await?;
        let wait_opts = follow::WaitOptions {
            output: output.map(|dir| (dir, overwrite)),
            partial,
            timeout,
            progress: !json,
        };
        return submit_template(&ticket, &mut client, template, opts, wait, wait_opts, json).await;
    }
    if !job_params.is_empty() {
        anyhow::bail!("--job-param is for Open Job Description templates (.yaml); this is a scene");
    }
    let mut client = Client::connect(&ticket).await?;
    if upload_only {
        let (spec, _warnings, _from) = client::upload_scene(&mut client, &opts).await?;
        println!("{}", serde_json::to_string(&spec)?);
        return Ok(0);
    }
    let client::Submitted {
        status,
        warnings,
        files,
    } = client::submit(&mut client, &opts).await?;
    if !wait {
        report::print_submitted(&status, &warnings, &files, json);
        return Ok(0);
    }
    if !json {
        eprintln!(
            "job {} submitted: {}",
            status.id,
            report::summary_line(&status)
        );
    }
    let opts = follow::WaitOptions {
        output: output.map(|dir| (dir, overwrite)),
        partial,
        timeout,
        progress: !json,
    };
    finish_wait(&ticket, client, &[status.id], &opts, json, Some(&warnings)).await
}

/// What a submit may upload besides the scene (see `share.rs`).
#[derive(clap::Args)]
pub(crate) struct ShareArgs {
    /// The project's folder: files the scene uses under it are
    /// uploaded (default: the scene's own folder).
    #[arg(long, value_name = "DIR")]
    pub(crate) project_root: Option<PathBuf>,
    /// A folder of shared assets whose files the scene may use and
    /// upload (repeat for several; also `TESSERA_ASSET_ROOTS`, a
    /// `:`-separated list, and `asset_roots` in the client config
    /// file). A file the scene uses outside the project and the asset
    /// roots is refused, naming it.
    #[arg(long = "asset-root", value_name = "DIR")]
    pub(crate) asset_roots: Vec<PathBuf>,
    /// Upload this one file the scene uses though it lies outside the
    /// project and the asset roots, or in a hidden folder of a home
    /// directory or another user's home (repeat for several).
    #[arg(long = "allow-file", value_name = "PATH")]
    pub(crate) allow_files: Vec<PathBuf>,
}

/// `submit X.uproject`: what Movie Render Queue renders, and how it splits.
#[derive(clap::Args)]
pub(crate) struct UnrealArgs {
    /// Unreal: the level sequence to render (/Game/...).
    #[arg(long)]
    pub(crate) level_sequence: Option<String>,
    /// Unreal: the map to load (/Game/...).
    #[arg(long)]
    pub(crate) map: Option<String>,
    /// Unreal: the Movie Render Queue preset (a MoviePipelinePrimaryConfig, /Game/...).
    #[arg(long)]
    pub(crate) mrq_config: Option<String>,
    /// Unreal: the sequence's shots (camera cuts), e.g. sh010=1-40,sh020=41-90;
    /// each is a task, or several with --chunk.
    #[arg(long)]
    pub(crate) shots: Option<String>,
    /// Unreal: frames per task (0: one task per shot).
    #[arg(long, default_value_t = 0)]
    pub(crate) chunk: u32,
    /// Unreal: frames rendered and thrown away before a chunk that starts
    /// inside a shot, so its first frame has a continuous render's history.
    #[arg(long, default_value_t = 8)]
    pub(crate) warm_up: u32,
    /// Unreal: the image format the preset writes (png or exr).
    #[arg(long, value_parser = parse_mrq_format)]
    pub(crate) mrq_format: Option<tessera_protocol::job::OutputFormat>,
    /// Unreal: the preset's File Name Format (default MRQ's own,
    /// {sequence_name}.{frame_number}).
    #[arg(long)]
    pub(crate) mrq_file_name_format: Option<String>,
    /// Unreal: the preset's Zero Pad Frame Numbers (default 4).
    #[arg(long)]
    pub(crate) mrq_zero_pad: Option<u32>,
    /// Unreal: the output resolution, WxH (default 1920x1080).
    #[arg(long, value_parser = parse_resolution)]
    pub(crate) resolution: Option<(u32, u32)>,
}

/// `--after JOB[,JOB...]`.
#[derive(Clone)]
pub(crate) struct AfterArg(pub(crate) Vec<u64>);

pub(crate) fn parse_after(s: &str) -> Result<AfterArg, String> {
    tessera_protocol::job::parse_after(s).map(AfterArg)
}

pub(crate) fn parse_after_failure(s: &str) -> Result<tessera_protocol::job::AfterFailure, String> {
    s.parse()
}

pub(crate) fn parse_mrq_format(s: &str) -> Result<tessera_protocol::job::OutputFormat, String> {
    match s.to_ascii_lowercase().as_str() {
        "png" => Ok(tessera_protocol::job::OutputFormat::Png),
        "exr" => Ok(tessera_protocol::job::OutputFormat::Exr),
        _ => Err(format!("`{s}`: Tessera collects png or exr frames")),
    }
}

pub(crate) fn parse_resolution(s: &str) -> Result<(u32, u32), String> {
    let bad = || format!("`{s}` is not a resolution: expected WxH, e.g. 1920x1080");
    let (w, h) = s.split_once(['x', 'X']).ok_or_else(bad)?;
    Ok((w.parse().map_err(|_| bad())?, h.parse().map_err(|_| bad())?))
}

/// `submit TEMPLATE.yaml`: one job per step of an Open Job Description
/// template, each `--after` the steps it depends on (and the command
/// line's `--after`, for the steps that depend on none); with `--wait`,
/// waits for each and downloads its frames (into `--output`, or the
/// template's output-directory parameter when none is given: in the folder
/// and with the names the step's `--render-output` gives, or else a folder
/// per step when there are several).
pub(crate) async fn submit_template(
    ticket: &tessera_protocol::ticket::Ticket,
    client: &mut Client,
    template: openjd::Imported,
    opts: SubmitOptions,
    wait: bool,
    wait_opts: follow::WaitOptions,
    json: bool,
) -> anyhow::Result<i32> {
    let output = wait_opts.output.clone();
    for note in &template.notes {
        eprintln!("note: {note}");
    }
    let several = template.steps.len() > 1;
    let base_name = opts.name.clone().unwrap_or_else(|| template.name.clone());
    let mut jobs: Vec<(String, u64)> = Vec::new();
    let mut printed = Vec::new();
    let mut submitted_steps = Vec::new();
    // Every step's job is submitted paused and released once all are in:
    // a step refused halfway (a frame outside the scene, a missing file)
    // then cancels the jobs before it, none of which has rendered.
    for step in &template.steps {
        let name = if several {
            format!("{base_name} / {}", step.name)
        } else {
            base_name.clone()
        };
        let submitted = submit_step(client, step, &opts, &jobs, name).await;
        match submitted {
            Ok((status, warnings)) => submitted_steps.push((step, status, warnings)),
            Err(e) => return Err(roll_back(client, &jobs, e).await),
        }
        jobs.push((
            step.name.clone(),
            submitted_steps.last().expect("pushed").1.id,
        ));
    }
    for (_, status, _) in &mut submitted_steps {
        if !opts.paused {
            client.pause(status.id, false).await.with_context(|| {
                format!(
                    "cannot release job {}, submitted paused with the template's others",
                    status.id
                )
            })?;
        }
        status.paused = opts.paused;
    }
    for (step, status, warnings) in submitted_steps {
        if json {
            let mut v = report::job_json(&status);
            v["step"] = serde_json::json!(step.name);
            v["warnings"] = serde_json::json!(warnings);
            printed.push(v);
        } else {
            println!(
                "job {} submitted for step {}: {}",
                status.id,
                step.name,
                report::summary_line(&status)
            );
        }
    }
    if json && !wait {
        println!(
            "{}",
            serde_json::json!({ "template": template.name, "jobs": printed })
        );
    }
    if !wait {
        return Ok(0);
    }
    let mut code = 0;
    let overwrite = output.as_ref().is_some_and(|(_, o)| *o);
    for ((name, id), step) in jobs.iter().zip(&template.steps) {
        // An encode step's movie is fetched as the steps' frames are.
        let named = step
            .encode
            .as_ref()
            .map(|e| &e.movie)
            .or(step.output.as_ref());
        let out = match (&output, named) {
            (Some((dir, _)), Some(pattern)) => Some(dir.join(&pattern.subdir)),
            (Some((dir, _)), None) if several => Some(dir.join(name)),
            (Some((dir, _)), None) => Some(dir.clone()),
            // No --output: the folder the template names.
            (None, Some(pattern)) => (pattern.root.as_ref())
                .or(template.output_dir.as_ref())
                .map(|root| root.join(&pattern.subdir)),
            (None, None) => None,
        }
        .map(|dir| (dir, overwrite));
        let opts = follow::WaitOptions {
            output: out,
            ..wait_opts.clone()
        };
        let waited = follow::wait(ticket, None, &[*id], &opts).await?;
        report::print_waited(&waited, None, json, opts.timeout);
        let c = waited.exit_code();
        if code == 0 {
            code = c;
        }
    }
    Ok(code)
}

/// Submits one step of a template, paused, `--after` the jobs of the steps
/// it depends on (`jobs`, those submitted before it).
async fn submit_step(
    client: &mut Client,
    step: &openjd::Step,
    opts: &SubmitOptions,
    jobs: &[(String, u64)],
    name: String,
) -> anyhow::Result<(tessera_protocol::messages::JobStatus, Vec<String>)> {
    let mut step_opts = opts.clone();
    step_opts.after = step.after.iter().map(|&i| jobs[i].1).collect();
    if step.after.is_empty() {
        step_opts.after.extend(&opts.after);
    }
    step_opts.paused = true;
    step_opts.scene = step.scene.clone();
    step_opts.frames = step.frames.clone().or_else(|| opts.frames.clone());
    step_opts.name = Some(name);
    step_opts.request_id = (opts.request_id.as_ref()).map(|r| format!("{r}/{}", step.name));
    step_opts.output_pattern = (step.output.as_ref()).map(|o| (o.name.clone(), o.extension));
    step_opts.render_format = step.format;
    step_opts.host = step.host.clone();
    let submitted = match &step.encode {
        Some(encode) => {
            let input = jobs[step.after[0]].1;
            // `submit_encode` adds the frames' job to its `after`.
            step_opts.after.retain(|&j| j != input);
            let status = client::submit_encode(client, &step_opts, encode, input).await;
            status.map(|s| (s, Vec::new()))
        }
        None => client::submit(client, &step_opts)
            .await
            .map(|s| (s.status, s.warnings)),
    };
    submitted.with_context(|| format!("step {} of the template", step.name))
}

/// A step was refused: cancels the jobs of the steps submitted before it
/// (paused, so none has rendered) and says so with the step's error.
async fn roll_back(client: &mut Client, jobs: &[(String, u64)], e: anyhow::Error) -> anyhow::Error {
    if jobs.is_empty() {
        return e;
    }
    let mut canceled = Vec::new();
    let mut kept = Vec::new();
    for (_, id) in jobs {
        match client.cancel(*id).await {
            Ok(_) => canceled.push(id.to_string()),
            Err(_) => kept.push(id.to_string()),
        }
    }
    let mut said = format!(
        "{e:#}; the jobs of the steps before it were canceled before any task ran: {}",
        canceled.join(", ")
    );
    if !kept.is_empty() {
        said.push_str(&format!(
            "; these could not be canceled and are held paused: {} (tessera cancel them)",
            kept.join(", ")
        ));
    }
    anyhow::anyhow!(said)
}

/// `auto` or a count of at least 1.
pub(crate) fn parse_sample_ranges(s: &str) -> Result<u32, String> {
    match s {
        "auto" => Ok(tessera_protocol::job::SAMPLE_RANGES_AUTO),
        n => match n.parse::<u32>() {
            Ok(k) if k >= 1 => Ok(k),
            _ => Err(format!("`{n}` is not `auto` or a count of at least 1")),
        },
    }
}

impl ShareArgs {
    /// What may be shared: these options, then the studio's roots
    /// (`TESSERA_ASSET_ROOTS`, the client config file).
    fn options(self) -> anyhow::Result<share::ShareOptions> {
        share::ShareOptions {
            project_root: self.project_root,
            asset_roots: (self.asset_roots.into_iter())
                .map(|r| (r, "--asset-root".to_string()))
                .collect(),
            allow_files: self.allow_files,
        }
        .with_studio_roots()
    }
}

impl UnrealArgs {
    fn options(self) -> uproject::UnrealOptions {
        uproject::UnrealOptions {
            level_sequence: self.level_sequence,
            map: self.map,
            mrq_config: self.mrq_config,
            shots: self.shots,
            chunk: self.chunk,
            warm_up: self.warm_up,
            format: self.mrq_format,
            file_name_format: self.mrq_file_name_format,
            zero_pad: self.mrq_zero_pad,
            resolution: self.resolution,
        }
    }
}

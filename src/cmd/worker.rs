//! `tessera worker`.

use super::*;
use tessera_worker::engine::blender;

#[derive(clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    pub admin: Option<WorkerAdmin>,
    /// Worker ticket (the line in DATA_DIR/worker.ticket), or @FILE holding it.
    #[arg(
        long,
        env = "TESSERA_WORKER_TICKET",
        hide_env_values = true,
        required = true
    )]
    pub ticket: Option<String>,
    /// Name shown in status and the monitor (default: host name and pid).
    #[arg(long)]
    pub name: Option<String>,
    /// Where fetched assets are kept.
    #[arg(long, env = "TESSERA_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// Cap on the asset cache (e.g. 50G, 800M, or bytes): least recently
    /// used assets are evicted, never those of a running task.
    #[arg(long, value_parser = parse_size)]
    pub cache_max: Option<u64>,
    /// Engine to offer: auto (every engine available here), builtin,
    /// blender, unreal, ffmpeg. With auto and blender, ffmpeg is offered
    /// too where it is installed (encode steps of OpenJD templates).
    #[arg(long, default_value = "auto")]
    pub engine: String,
    /// Concurrent tasks: a count, or `auto` (one per GPU that NVML
    /// finds, else one per CPU core).
    #[arg(long, default_value = "1", value_parser = parse_slots)]
    pub slots: Slots,
    /// Render threads per slot for CPU engines (default: cores ÷ slots).
    #[arg(long)]
    pub threads: Option<usize>,
    /// What this node costs, for cost accounting (a finite amount ≥ 0).
    #[arg(long, default_value_t = 0.0, value_parser = parse_price)]
    pub price_per_hour: f64,
    /// Cycles device: CPU, CUDA, OPTIX, HIP, ONEAPI (one slot per GPU),
    /// or `auto`: the first of OPTIX, CUDA, HIP, ONEAPI that Cycles
    /// finds here, else CPU. A GPU that fails its probe render at start
    /// is an error, never a silent fall-back to the CPU.
    #[arg(long, default_value = "CPU", value_parser = parse_device)]
    pub blender_device: DeviceArg,
    /// A Blender executable to offer (or an unpacked official build's
    /// folder); repeat for several. Default: $TESSERA_BLENDER, else
    /// `blender` on the PATH. `auto`: also offer every build stored with
    /// `tessera blender add`, fetched into the cache the first time a
    /// job needs it (then no Blender need be installed here).
    #[arg(long = "blender")]
    pub blenders: Vec<PathBuf>,
    /// The Python 3.11 that stored `bpy` builds run in with `--blender
    /// auto` (it needs numpy, zstandard and requests installed; an
    /// official Linux tarball needs nothing).
    #[arg(long, default_value = "python3.11")]
    pub build_python: PathBuf,
    /// A Python interpreter in which `import bpy` works (PyPI's `bpy`,
    /// the official Blender as a module) to offer; repeat for several.
    #[arg(long)]
    pub blender_python: Vec<PathBuf>,
    /// Seconds running tasks may take to finish before their leases are
    /// handed back once the worker drains. On SIGTERM the default is 0
    /// (hand them back at once); asked by `tessera drain`, running tasks
    /// finish however long they take unless this is given.
    #[arg(long, value_parser = parse_seconds)]
    pub drain_grace: Option<std::time::Duration>,
    /// A Blender renderer that prints nothing and uses (almost) no CPU
    /// for this long, as a hung one does, is ended and its task fails as
    /// stalled. A render that works keeps its process busy and is left
    /// alone however long it is silent (Cycles prints its progress
    /// rarely in the background); one that spins without output is
    /// ended by the job's --task-timeout.
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    pub stall_window: std::time::Duration,
    /// A renderer session with no task for this long is ended (it holds
    /// memory, and an idle `bpy` session keeps a core busy); the next
    /// task starts a fresh one. 0: keep sessions until the worker stops.
    #[arg(long, default_value = "2m", value_parser = parse_duration)]
    pub session_idle: std::time::Duration,
    /// Start Blender afresh for every task instead of keeping a session.
    #[arg(long, hide = true)]
    pub blender_cold: bool,
    /// This is a spot or interruptible instance that may be preempted at
    /// any moment: jobs submitted with `--sample-ranges auto` then split
    /// tiles into sample ranges, so a preemption loses at most one.
    #[arg(long)]
    pub interruptible: bool,
    /// For benchmarks: milliseconds each task of the noop engine takes.
    #[arg(long, hide = true, default_value_t = 0)]
    pub noop_ms: u64,
    /// Unreal's `UnrealEditor-Cmd` (for `--engine unreal`, or offered
    /// beside the others with `auto`): renders Movie Render Queue jobs.
    #[arg(long)]
    pub unreal_editor: Option<PathBuf>,
    /// The congestion controller for what this process sends:
    /// `cubic-veno` (the default: CUBIC that cuts its window less for a
    /// loss seen with no queue behind it), quinn's `cubic` or `newreno`,
    /// or `bbr` (fast on paths that drop packets at random, but it
    /// resends much more where a slow link's queue overflows; see
    /// BENCHMARKS.md).
    #[arg(long, default_value = "cubic-veno", value_parser = tessera_worker::Congestion::parse)]
    pub congestion: tessera_worker::Congestion,
    /// Leave after this long (e.g. 10m) holding no task and assigned
    /// none, whether connected to a coordinator with no work or unable
    /// to reach one: a node whose fleet is gone stops by itself. `tessera
    /// fleet` sets it on every node it launches.
    #[arg(long, value_parser = parse_duration)]
    pub exit_after_idle: Option<std::time::Duration>,
}

pub(crate) async fn run(mut args: Args) -> anyhow::Result<i32> {
    match args.admin.take() {
        Some(WorkerAdmin::Revoke { name, ticket }) => revoke(name, ticket).await,
        None => serve(args).await,
    }
}

async fn revoke(name: String, ticket: TicketArg) -> anyhow::Result<i32> {
    let ticket = ticket.resolve()?;
    let mut client = Client::connect(&ticket).await?;
    let (identities, disconnected) = client.revoke_worker(&name).await?;
    println!(
    "revoked worker {name} ({identities} identities, {disconnected} connections closed): it may not join again"
);
    Ok(0)
}

/// Runs until SIGINT or SIGTERM.
async fn serve(args: Args) -> anyhow::Result<i32> {
    let Args {
        admin: _,
        ticket,
        name,
        cache_dir,
        cache_max,
        engine,
        slots,
        threads,
        price_per_hour,
        blender_device,
        blenders,
        blender_python,
        build_python,
        blender_cold,
        drain_grace,
        stall_window,
        session_idle,
        noop_ms,
        interruptible,
        unreal_editor,
        congestion,
        exit_after_idle,
    } = args;
    tessera_worker::use_congestion(congestion);
    // Required by clap unless a subcommand is given.
    let ticket = ticket.context("pass --ticket")?;
    let ticket_file = ticket.strip_prefix('@').map(PathBuf::from);
    let ticket = client::resolve_ticket(Some(&ticket))?;
    if ticket.role != tessera_protocol::messages::Role::Worker {
        anyhow::bail!(
            "this is a {} ticket; a worker joins with DATA_DIR/worker.ticket",
            if ticket.role == tessera_protocol::messages::Role::Viewer {
                "viewer"
            } else {
                "client"
            }
        );
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let slots = slot_count(slots, cores);
    let threads = threads.unwrap_or((cores / slots as usize).max(1));
    let auto = blenders.iter().any(|b| b.as_os_str() == "auto");
    let blenders: Vec<PathBuf> = (blenders.into_iter())
        .filter(|b| b.as_os_str() != "auto")
        .collect();
    // Held for the life of the process: the default cache folder
    // (and the identity in it) belongs to one worker at a time.
    let (name, cache_dir, _cache_lock) = name_and_cache_dir(name, cache_dir)?;
    // Absolute from here on: renderers are marked with it (a
    // sweep compares it) and their HOME is under it.
    std::fs::create_dir_all(&cache_dir)
        .with_context(|| format!("cannot create the cache folder {}", cache_dir.display()))?;
    let cache_dir = std::fs::canonicalize(&cache_dir)
        .with_context(|| format!("cannot use the cache folder {}", cache_dir.display()))?;
    // Before any Blender starts (the probes below): end what an
    // earlier run on this cache folder left running, and keep pid
    // files of what this one starts.
    tessera_worker::child::set_cache_dir(&cache_dir)
        .with_context(|| format!("cannot use the cache folder {}", cache_dir.display()))?;
    let swept = tessera_worker::child::sweep(&cache_dir);
    if swept > 0 {
        tracing::warn!(
            swept,
            "ended renderers an earlier run of this worker left running"
        );
    }
    let unreal = unreal_editor.map(|editor| {
        Arc::new(engine::unreal::Unreal::new(
            editor, &cache_dir, cache_max, slots,
        )) as Arc<dyn engine::Engine>
    });
    let (engines, blender_engine) = worker_engines(EngineChoice {
        unreal,
        choice: &engine,
        threads,
        slots,
        blender_device: blender_device.0,
        blenders: &blenders,
        blender_python: &blender_python,
        blender_cold,
        noop_ms,
        auto,
    })?;
    let builds = match (auto, blender_engine) {
        (true, Some(b)) => Some(Arc::new(tessera_worker::builds::AutoBuilds::new(
            build_python,
            b,
        ))),
        (true, None) => {
            anyhow::bail!("--blender auto needs the blender engine (--engine auto or blender)")
        }
        (false, _) => None,
    };
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown_signal().await;
        let _ = stop_tx.send(true);
    });
    let config = tessera_worker::run::Config {
        ticket,
        ticket_file,
        name,
        cache_dir,
        cache_max,
        engines,
        slots,
        price_per_hour,
        drain_grace,
        interruptible,
        builds,
        stall_window,
        session_idle: (!session_idle.is_zero()).then_some(session_idle),
        exit_after_idle: exit_after_idle.filter(|d| !d.is_zero()),
    };
    tessera_worker::run::run(config, stop_rx).await?;
    Ok(0)
}

/// What a client does to workers besides rendering with them.
#[derive(Subcommand)]
pub(crate) enum WorkerAdmin {
    /// Cut off every worker enrolled as NAME: disconnected now, refused from
    /// then on (also after a restart). Rotate the tickets too if the
    /// machine itself is no longer trusted.
    Revoke {
        name: String,
        #[command(flatten)]
        ticket: TicketArg,
    },
}

/// What a worker offers for `--engine`.
pub(crate) struct EngineChoice<'a> {
    pub(crate) choice: &'a str,
    pub(crate) threads: usize,
    pub(crate) slots: u32,
    /// `None`: auto.
    pub(crate) blender_device: Option<blender::Device>,
    pub(crate) blenders: &'a [PathBuf],
    pub(crate) blender_python: &'a [PathBuf],
    pub(crate) blender_cold: bool,
    pub(crate) noop_ms: u64,
    /// `--blender auto`: offer the stored builds, even with no Blender here.
    pub(crate) auto: bool,
    /// `--unreal-editor`: Movie Render Queue through this Unreal.
    pub(crate) unreal: Option<Arc<dyn engine::Engine>>,
}

/// `--price-per-hour`: finite and at least 0 (NaN, inf and negative
/// prices are refused here and by the coordinator).
pub(crate) fn parse_price(s: &str) -> Result<f64, String> {
    let price: f64 = s.parse().map_err(|_| format!("`{s}` is not a number"))?;
    tessera_protocol::messages::check_price(price)?;
    Ok(price)
}

#[derive(Debug, Clone, Copy)]
pub(crate) enum Slots {
    Count(u32),
    Auto,
}

pub(crate) fn parse_slots(s: &str) -> Result<Slots, String> {
    match s {
        "auto" => Ok(Slots::Auto),
        n => match n.parse::<u32>() {
            Ok(k) if (1..=MAX_SLOTS).contains(&k) => Ok(Slots::Count(k)),
            _ => Err(format!(
                "`{n}` is not `auto` or a slot count from 1 to {MAX_SLOTS}"
            )),
        },
    }
}

/// `--blender-device`: `auto` or a device.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DeviceArg(pub(crate) Option<blender::Device>);

pub(crate) fn parse_device(s: &str) -> Result<DeviceArg, String> {
    if s.eq_ignore_ascii_case("auto") {
        return Ok(DeviceArg(None));
    }
    s.parse().map(|d| DeviceArg(Some(d)))
}

/// Probes every Blender the worker was told about (or finds one), in
/// parallel. Blenders named on the command line must work; one found on the
/// PATH is skipped with a note when it does not.
pub(crate) fn blender_installs(
    c: &EngineChoice<'_>,
) -> anyhow::Result<Vec<blender_runtime::Installed>> {
    use blender_runtime::Runtime;
    let mut named: Vec<Runtime> = c.blenders.iter().map(|p| Runtime::executable(p)).collect();
    named.extend(c.blender_python.iter().cloned().map(Runtime::Module));
    let found = named.is_empty();
    if found && c.auto {
        // Only what `--blender auto` fetches, unless others are named.
        return Ok(Vec::new());
    }
    if found {
        match blender::detect() {
            Some((exe, _)) => named.push(Runtime::Executable(exe)),
            None => return Ok(Vec::new()),
        }
    }
    // Each GPU slot's probe runs as that slot's sessions will, seeing only
    // its own GPU; the first slot's answer is what the worker offers.
    let probe_all = |device: Option<blender::Device>| {
        let envs = device.map_or(vec![Vec::new()], |d| d.probe_envs(c.slots));
        std::thread::scope(|s| {
            let handles: Vec<Vec<_>> = named
                .iter()
                .map(|r| {
                    envs.iter()
                        .map(|env| {
                            s.spawn(move || {
                                let dev = device.map_or("CPU", blender::Device::name);
                                blender_runtime::probe_pinned(r, dev, env)
                            })
                        })
                        .collect()
                })
                .collect();
            handles
                .into_iter()
                .map(|slots| {
                    let mut results = slots
                        .into_iter()
                        .map(|h| h.join().expect("probe thread"))
                        .enumerate();
                    let (_, first) = results.next().expect("one probe at least");
                    let failed = results.find_map(|(slot, r)| {
                        r.err().map(|e| {
                            e.context(format!("slot {slot}'s GPU {slot} failed its probe"))
                        })
                    });
                    match failed {
                        Some(e) => Err(e),
                        None => first,
                    }
                })
                .collect::<Vec<_>>()
        })
    };
    // `auto` asks Cycles what it finds first, then probes that device.
    let device = match c.blender_device {
        Some(d) => Some(d),
        None => {
            let first = probe_all(None);
            let devices: Vec<String> = first
                .iter()
                .flatten()
                .flat_map(|i| i.offer.devices.clone())
                .collect();
            let pick = blender_runtime::auto_device(&devices);
            tracing::info!(device = pick, "--blender-device auto");
            Some(pick.parse().expect("a known device"))
        }
    };
    let mut installs = Vec::new();
    for (runtime, result) in named.iter().zip(probe_all(device)) {
        match result {
            Ok(i) => {
                tracing::info!(
                    blender = %i.offer.name,
                    path = %runtime.path().display(),
                    device = %i.offer.render_device,
                    oidn = i.offer.oidn,
                    osl = i.offer.osl,
                    eevee = i.offer.eevee,
                    "blender found"
                );
                installs.push(i);
            }
            Err(e) if found => {
                tracing::info!("{e:#}; not offering the blender engine");
            }
            Err(e) => return Err(e.context("a Blender named on the command line does not work")),
        }
    }
    Ok(installs)
}

type Engines = (Vec<Arc<dyn engine::Engine>>, Option<Arc<blender::Blender>>);

pub(crate) fn worker_engines(c: EngineChoice<'_>) -> anyhow::Result<Engines> {
    let builtin = || Arc::new(engine::Builtin::new(c.threads)) as Arc<dyn engine::Engine>;
    let needs_blender = matches!(c.choice, "auto" | "blender");
    let installs = if needs_blender {
        blender_installs(&c)?
    } else {
        Vec::new()
    };
    let device = match (c.blender_device, installs.first()) {
        (Some(d), _) => d,
        (None, Some(i)) => blender_runtime::auto_device(&i.offer.devices)
            .parse()
            .expect("a known device"),
        (None, None) => blender::Device::Cpu,
    };
    let blender_engine = (needs_blender && (!installs.is_empty() || c.auto)).then(|| {
        Arc::new(blender::Blender::new(
            installs.clone(),
            device,
            c.slots,
            !c.blender_cold,
            c.threads,
        ))
    });
    let blender = || blender_engine.clone().map(|b| b as Arc<dyn engine::Engine>);
    // ffmpeg, where it is installed, encodes beside a renderer.
    let ffmpeg = || {
        let found = engine::ffmpeg::Ffmpeg::find();
        match &found {
            Some(f) => tracing::info!(path = %f.program().display(), "ffmpeg found"),
            None => tracing::info!("ffmpeg not found (install it, or set TESSERA_FFMPEG); not offering the ffmpeg engine"),
        }
        found.map(|f| Arc::new(f) as Arc<dyn engine::Engine>)
    };
    let mut engines = match c.choice {
        "auto" => {
            let mut engines = vec![builtin()];
            match blender() {
                Some(b) => engines.insert(0, b),
                None => tracing::info!("blender not found (set TESSERA_BLENDER or install it); not offering the blender engine"),
            }
            engines.extend(c.unreal.clone());
            engines
        }
        "builtin" => vec![builtin()],
        "blender" => vec![blender().context(
            "--engine blender: Blender is not installed here (or TESSERA_BLENDER does not name a working blender)",
        )?],
        "noop" => vec![Arc::new(engine::Noop {
            per_task: std::time::Duration::from_millis(c.noop_ms),
        }) as Arc<dyn engine::Engine>],
        "unreal" => vec![c.unreal.clone().context(
            "--engine unreal needs --unreal-editor PATH (Unreal's UnrealEditor-Cmd)",
        )?],
        "ffmpeg" => vec![ffmpeg().context(
            "--engine ffmpeg: ffmpeg is not installed here (apt-get install ffmpeg, or set TESSERA_FFMPEG)",
        )?],
        other => anyhow::bail!("unknown engine `{other}` (expected auto, builtin, blender, unreal or ffmpeg)"),
    };
    if matches!(c.choice, "auto" | "blender") {
        engines.extend(ffmpeg());
    }
    Ok((engines, blender_engine))
}

/// This machine's host name (`worker` when it has none).
pub(crate) fn host_name() -> String {
    let host = std::fs::read_to_string("/etc/hostname").unwrap_or_default();
    let host = host.trim();
    if host.is_empty() {
        "worker".into()
    } else {
        host.to_string()
    }
}

/// A worker started without `--name` or `--cache-dir`: named after the
/// host, the same name on every start (and so the same identity, cache and
/// drain target), `HOST-2`, `HOST-3` … for further workers running on the
/// machine at once; each holds a lock on its cache folder while it runs.
pub(crate) fn default_worker_name() -> anyhow::Result<(String, PathBuf, std::fs::File)> {
    use std::os::fd::AsRawFd;
    let host = host_name();
    for n in 1..=64u32 {
        let name = if n == 1 {
            host.clone()
        } else {
            format!("{host}-{n}")
        };
        let dir = default_cache_dir(&name);
        std::fs::create_dir_all(&dir)
            .with_context(|| format!("cannot create the cache folder {}", dir.display()))?;
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("worker.lock"))
            .with_context(|| format!("cannot lock the cache folder {}", dir.display()))?;
        // SAFETY: flock on a descriptor this function owns; released when
        // the file is closed (the process ends).
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
            return Ok((name, dir, lock));
        }
    }
    anyhow::bail!(
        "64 workers without --name already run on this machine; pass --name and --cache-dir"
    )
}

pub(crate) fn default_cache_dir(name: &str) -> PathBuf {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(std::env::temp_dir);
    base.join("tessera").join(name)
}

/// `--slots`: the count given, or with `auto` one per GPU NVML finds, else
/// one per CPU core.
fn slot_count(slots: Slots, cores: usize) -> u32 {
    match slots {
        Slots::Count(n) => n.max(1),
        Slots::Auto => match tessera_worker::telemetry::gpu_count() {
            Ok(n) if n > 0 => n.min(MAX_SLOTS),
            found => {
                let why = found.err().unwrap_or_else(|| "NVML finds no GPU".into());
                tracing::info!("--slots auto: {why}; one slot per CPU core");
                (cores as u32).clamp(1, MAX_SLOTS)
            }
        },
    }
}

/// The worker's name and cache folder from `--name` and `--cache-dir`,
/// each defaulting from the other (or the host name); the default folder's
/// lock when neither was given.
fn name_and_cache_dir(
    name: Option<String>,
    cache_dir: Option<PathBuf>,
) -> anyhow::Result<(String, PathBuf, Option<std::fs::File>)> {
    Ok(match (name, cache_dir) {
        (Some(name), Some(dir)) => (name, dir, None),
        (Some(name), None) => {
            let dir = default_cache_dir(&name);
            (name, dir, None)
        }
        (None, Some(dir)) => (host_name(), dir, None),
        (None, None) => {
            let (name, dir, lock) = default_worker_name()?;
            (name, dir, Some(lock))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_and_devices_take_auto_or_a_bounded_value() {
        assert!(matches!(parse_slots("auto"), Ok(Slots::Auto)));
        assert!(matches!(parse_slots("4"), Ok(Slots::Count(4))));
        for bad in ["0", "257", "-1", "many"] {
            assert!(
                parse_slots(bad)
                    .unwrap_err()
                    .contains("slot count from 1 to 256"),
                "{bad}"
            );
        }
        assert!(parse_device("auto").unwrap().0.is_none());
        assert_eq!(
            parse_device("optix").unwrap().0,
            Some(blender::Device::Optix)
        );
        assert_eq!(
            parse_device("ONEAPI").unwrap().0,
            Some(blender::Device::Oneapi)
        );
        assert!(parse_device("metal")
            .unwrap_err()
            .contains("expected auto, CPU"));
    }
}

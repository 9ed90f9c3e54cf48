//! Every process the worker starts is owned: Blender sessions, scans and
//! probes, Unreal. [`spawn`] starts a child
//! - as the leader of a process group of its own, so [`kill_group`] ends it
//!   and everything it started (Blender's GPU probe, a `bpy` helper);
//! - with `PR_SET_PDEATHSIG` = `SIGKILL`, so it dies with the worker, however
//!   the worker dies (`kill -9`, a crash, the OOM killer). The kernel sends
//!   that signal when the *thread* that forked the child ends, not the
//!   process, so every child is forked by one thread that lives as long as
//!   the process ([`spawner`]);
//! - with an environment built from an allow-list ([`ALLOWED_ENV`]): never
//!   the worker's ticket, a provider's key or anything else of its own;
//!   `HOME` is a scratch folder;
//! - named in a pid file under the worker's cache folder while it runs, so a
//!   worker started again on that folder ends whatever an earlier run left
//!   ([`sweep`]) before it joins.

use std::ffi::OsString;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

/// Variables a renderer inherits from the worker, by exact name or (ending
/// in `*`) by prefix: the search path, locale and time zone, temporary
/// folder, the display an OpenGL context needs (Eevee), the GPU runtimes'
/// device selection, the loader path GPU drivers may need, and the test
/// hooks the session script reads. Everything else is dropped.
pub const ALLOWED_ENV: &[&str] = &[
    "PATH",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    "TMPDIR",
    "LD_LIBRARY_PATH",
    "DISPLAY",
    "WAYLAND_DISPLAY",
    "XDG_RUNTIME_DIR",
    "EGL_PLATFORM",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "GPU_DEVICE_ORDINAL",
    "ONEAPI_DEVICE_SELECTOR",
    "OCIO",
    "TESSERA_TEST_*",
];

/// Whether the worker passes variable `name` on to a renderer.
pub fn allowed(name: &str) -> bool {
    ALLOWED_ENV.iter().any(|a| match a.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => name == *a,
    })
}

/// Set in every owned child's environment: the cache folder of the worker
/// that started it. A sweep ends only processes that carry it.
pub const OWNER_ENV: &str = "TESSERA_RENDERER_OF";

/// Set next to [`OWNER_ENV`]: the pid and start time of the worker process
/// that started the child ("PID START"), so a sweep tells a live worker's
/// renderers (two workers given one cache folder) from a dead one's.
pub const WORKER_ENV: &str = "TESSERA_RENDERER_WORKER";

/// Test hook: with this failpoint a crashed worker leaves its renderers
/// running (no parent-death signal), as a renderer that left its process
/// group would; the next worker on the cache folder must end them.
pub const FAILPOINT_ORPHANS: &str = "orphan-renderers";

struct Spawn {
    cmd: Command,
    reply: mpsc::SyncSender<io::Result<Child>>,
}

/// The one thread that forks children, for the whole life of the process.
fn spawner() -> &'static Mutex<mpsc::Sender<Spawn>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<Spawn>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Spawn>();
        std::thread::Builder::new()
            .name("tessera-spawner".into())
            .spawn(move || {
                for mut job in rx {
                    let _ = job.reply.send(job.cmd.spawn());
                }
            })
            .expect("starting the spawner thread");
        Mutex::new(tx)
    })
}

/// Where pid files of running children are kept (the cache folder's
/// `pids/`), once the worker has said so; and the scratch `HOME`.
static PLACES: OnceLock<(PathBuf, PathBuf)> = OnceLock::new();

/// Sets the folders of this process's children: their pid files under
/// `cache_dir/pids`, their `HOME` at `cache_dir/home`. Call once, at start.
pub fn set_cache_dir(cache_dir: &Path) -> io::Result<()> {
    let pids = cache_dir.join("pids");
    let home = cache_dir.join("home");
    std::fs::create_dir_all(&pids)?;
    std::fs::create_dir_all(&home)?;
    let _ = PLACES.set((pids, home));
    Ok(())
}

/// A running child the worker owns: its process group is killed when it is
/// dropped still running, and its pid file removed once it is reaped.
pub struct Owned {
    pub child: Child,
    pidfile: Option<PathBuf>,
}

impl Owned {
    /// The process group (the child's pid).
    pub fn group(&self) -> i32 {
        self.child.id() as i32
    }

    /// Kills the whole process group at once.
    pub fn kill(&mut self) {
        kill_group(self.group());
    }

    pub fn try_wait(&mut self) -> io::Result<Option<std::process::ExitStatus>> {
        let status = self.child.try_wait()?;
        if status.is_some() {
            self.forget();
        }
        Ok(status)
    }

    pub fn wait(&mut self) -> io::Result<std::process::ExitStatus> {
        let status = self.child.wait()?;
        self.forget();
        Ok(status)
    }

    fn forget(&mut self) {
        if let Some(p) = self.pidfile.take() {
            let _ = std::fs::remove_file(p);
        }
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            kill_group(self.group());
            let _ = self.child.wait();
        }
        self.forget();
    }
}

/// Sends `SIGKILL` to process group `group` (nothing for 0 or below).
pub fn kill_group(group: i32) {
    if group > 0 {
        // SAFETY: kill(2) with a negative pid signals a process group.
        unsafe {
            libc::kill(-group, libc::SIGKILL);
        }
    }
}

/// Starts `cmd` as an owned child (see the module's text).
pub fn spawn(mut cmd: Command) -> io::Result<Owned> {
    own(&mut cmd);
    let (reply, rx) = mpsc::sync_channel(1);
    spawner()
        .lock()
        .expect("spawner lock")
        .send(Spawn { cmd, reply })
        .map_err(|_| io::Error::other("the spawner thread is gone"))?;
    let child = rx
        .recv()
        .map_err(|_| io::Error::other("the spawner thread is gone"))??;
    let pidfile = PLACES
        .get()
        .map(|(pids, _)| pids.join(child.id().to_string()));
    if let Some(p) = &pidfile {
        // The child's start time, and its worker's pid and start time: a
        // sweep ends the child only once its worker is gone.
        let me = std::process::id() as i32;
        let record = format!(
            "{} {me} {}",
            start_time(child.id() as i32).unwrap_or_default(),
            start_time(me).unwrap_or_default()
        );
        if let Err(e) = std::fs::write(p, record) {
            tracing::warn!("cannot write the pid file {}: {e}", p.display());
        }
    }
    Ok(Owned { child, pidfile })
}

/// Runs `cmd` as an owned child to its end, with its output collected (as
/// `Command::output`).
pub fn output(mut cmd: Command) -> io::Result<std::process::Output> {
    use std::io::Read;
    use std::process::Stdio;
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut owned = spawn(cmd)?;
    let mut out = owned.child.stdout.take().expect("piped");
    let mut err = owned.child.stderr.take().expect("piped");
    let err_reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = err.read_to_end(&mut buf);
        buf
    });
    let mut stdout = Vec::new();
    let _ = out.read_to_end(&mut stdout);
    let stderr = err_reader.join().unwrap_or_default();
    let status = owned.wait()?;
    Ok(std::process::Output {
        status,
        stdout,
        stderr,
    })
}

/// Makes `cmd` start as an owned child: its own process group, killed when
/// the worker dies, an allow-listed environment.
fn own(cmd: &mut Command) {
    let explicit: Vec<(OsString, Option<OsString>)> = cmd
        .get_envs()
        .map(|(k, v)| (k.to_owned(), v.map(|v| v.to_owned())))
        .collect();
    cmd.env_clear();
    for (k, v) in std::env::vars_os() {
        if k.to_str().is_some_and(allowed) {
            cmd.env(k, v);
        }
    }
    if let Some((pids, home)) = PLACES.get() {
        cmd.env("HOME", home);
        // The mark a sweep looks for before it ends a process a pid file
        // names: the cache folder of the worker that started it.
        if let Some(cache_dir) = pids.parent() {
            cmd.env(OWNER_ENV, cache_dir);
            let me = std::process::id() as i32;
            cmd.env(
                WORKER_ENV,
                format!("{me} {}", start_time(me).unwrap_or_default()),
            );
        }
    }
    for (k, v) in explicit {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    cmd.process_group(0);
    let orphans = std::env::var(crate::engine::FAILPOINT).is_ok_and(|v| v == FAILPOINT_ORPHANS);
    let parent = std::process::id() as libc::pid_t;
    // SAFETY: the closure runs between fork and exec and calls only
    // async-signal-safe functions (prctl, getppid, _exit).
    unsafe {
        cmd.pre_exec(move || {
            if !orphans {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The worker died before the signal was armed.
                if libc::getppid() != parent {
                    libc::_exit(1);
                }
            }
            Ok(())
        });
    }
}

/// This process and its ancestors: a pid file is a file anyone with the
/// folder can write, and a sweep must never end the worker's own shell.
fn lineage() -> Vec<i32> {
    let mut line = Vec::new();
    let mut ancestor = std::process::id() as i32;
    while ancestor > 1 && !line.contains(&ancestor) {
        line.push(ancestor);
        ancestor = parent_of(ancestor).unwrap_or(0);
    }
    line
}

/// The worker named in process `pid`'s [`WORKER_ENV`] ("PID START"; `None`
/// inside when absent or unreadable), if `pid` carries the mark of a worker
/// on `cache_dir` ([`OWNER_ENV`]) and is not in `lineage`.
fn mark_of(pid: i32, cache_dir: &Path, lineage: &[i32]) -> Option<Option<(i32, u64)>> {
    if lineage.contains(&pid) {
        return None;
    }
    let environ = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    let mut mark = format!("{OWNER_ENV}=").into_bytes();
    mark.extend_from_slice(cache_dir.as_os_str().as_encoded_bytes());
    let worker_prefix = format!("{WORKER_ENV}=").into_bytes();
    let mut marked = false;
    let mut worker = None;
    for var in environ.split(|b| *b == 0) {
        if var == mark.as_slice() {
            marked = true;
        } else if let Some(value) = var.strip_prefix(worker_prefix.as_slice()) {
            let value = String::from_utf8_lossy(value);
            let mut fields = value.split_whitespace().map(str::parse::<u64>);
            if let (Some(Ok(p)), Some(Ok(t))) = (fields.next(), fields.next()) {
                worker = i32::try_from(p).ok().map(|p| (p, t));
            }
        }
    }
    marked.then_some(worker)
}

/// Whether the worker process `pid`, started at `started`, still runs (a
/// zombie, killed and not yet reaped, does not).
fn worker_alive(pid: i32, started: u64) -> bool {
    if pid <= 0 || start_time(pid) != Some(started) {
        return false;
    }
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    let state = stat
        .rfind(')')
        .and_then(|at| stat[at + 1..].trim_start().chars().next());
    !matches!(state, Some('Z' | 'X') | None)
}

/// A process's parent, from `/proc/PID/stat`.
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat[stat.rfind(')')? + 1..]
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// CPU time a process has used, all its threads, user and system
/// (`/proc/PID/stat` fields 14 and 15), in milliseconds.
pub fn cpu_ms(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    // SAFETY: sysconf reads a constant of the system; no memory is shared.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let hz = u64::try_from(hz).ok().filter(|h| *h > 0)?;
    Some((user + system).saturating_mul(1000) / hz)
}

/// A process's start time (clock ticks since boot, `/proc/PID/stat` field
/// 22), which tells a pid's process from a later one given the same pid.
fn start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields follow the
    // last `)`.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Ends what an earlier run of a worker on `cache_dir` left running:
/// - every process group named in `cache_dir/pids` whose leader is still the
///   same process (same start time), carries the mark of a worker on that
///   folder, and whose worker is gone;
/// - then every process carrying that mark (see [`OWNER_ENV`]) whose worker
///   is gone: one the pid files miss, because its worker died between
///   starting it and writing its file, or because it left its group.
///
/// Renderers of a worker still running (two workers given one
/// `--cache-dir`) are left alone, and so are their pid files. Returns how
/// many processes it ended.
pub fn sweep(cache_dir: &Path) -> usize {
    let lineage = lineage();
    let mut ended = std::collections::BTreeSet::new();
    if let Ok(entries) = std::fs::read_dir(cache_dir.join("pids")) {
        for e in entries.filter_map(Result::ok) {
            let path = e.path();
            let pid: Option<i32> = e.file_name().to_str().and_then(|n| n.parse().ok());
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            let fields: Vec<u64> = text
                .split_whitespace()
                .map_while(|f| f.parse().ok())
                .collect();
            let (Some(pid), [started, worker, worker_started, ..]) = (pid, fields.as_slice())
            else {
                let _ = std::fs::remove_file(&path);
                continue;
            };
            if worker_alive(i32::try_from(*worker).unwrap_or(0), *worker_started) {
                continue;
            }
            if pid > 1
                && start_time(pid) == Some(*started)
                && mark_of(pid, cache_dir, &lineage).is_some()
            {
                tracing::warn!(
                    pid,
                    "ending a renderer an earlier run of this worker left running"
                );
                kill_group(pid);
                // Not its group's leader any more (it left the group it
                // was started in): the process itself.
                // SAFETY: kill(2) of one process; it carries the mark.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                }
                ended.insert(pid);
            }
            let _ = std::fs::remove_file(&path);
        }
    }
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return ended.len();
    };
    for e in procs.filter_map(Result::ok) {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else {
            continue;
        };
        if pid <= 1 || ended.contains(&pid) {
            continue;
        }
        let Some(worker) = mark_of(pid, cache_dir, &lineage) else {
            continue;
        };
        if worker.is_some_and(|(p, t)| worker_alive(p, t)) {
            continue;
        }
        tracing::warn!(
            pid,
            "ending a process an earlier run of this worker started and left running"
        );
        // SAFETY: kill(2) of one process; it carries this folder's mark.
        unsafe {
            libc::kill(pid, libc::SIGKILL);
        }
        ended.insert(pid);
    }
    ended.len()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    fn gone(pid: i32) -> bool {
        // A zombie still has a /proc entry: look at its state.
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => true,
            Ok(s) => s[s.rfind(')').unwrap() + 1..].trim_start().starts_with('Z'),
        }
    }

    fn wait_gone(pid: i32) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if gone(pid) {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    #[test]
    fn the_environment_is_the_allow_list() {
        assert!(allowed("PATH"));
        assert!(allowed("LC_ALL"));
        assert!(allowed("CUDA_VISIBLE_DEVICES"));
        assert!(allowed("TESSERA_TEST_FAIL_FIRST_RENDER"));
        assert!(!allowed("TESSERA_WORKER_TICKET"));
        assert!(!allowed("TESSERA_TICKET"));
        assert!(!allowed("VAST_API_KEY"));
        assert!(!allowed("AWS_SECRET_ACCESS_KEY"));
        assert!(!allowed("HOME"));
        assert!(!allowed("PATHX"));
    }

    #[test]
    fn a_child_gets_only_allowed_variables_and_what_was_set_for_it() {
        let mut cmd = Command::new("env");
        cmd.env("CUDA_VISIBLE_DEVICES", "3")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stdout(std::process::Stdio::piped());
        let mut owned = spawn(cmd).unwrap();
        let mut text = String::new();
        std::io::Read::read_to_string(&mut owned.child.stdout.take().unwrap(), &mut text).unwrap();
        owned.wait().unwrap();
        let names: Vec<&str> = text.lines().filter_map(|l| l.split('=').next()).collect();
        assert!(names.contains(&"CUDA_VISIBLE_DEVICES"), "{text}");
        assert!(names.contains(&"PYTHONDONTWRITEBYTECODE"), "{text}");
        for n in &names {
            assert!(
                allowed(n) || *n == "PYTHONDONTWRITEBYTECODE" || *n == "HOME",
                "{n} leaked into a child: {text}"
            );
        }
    }

    #[test]
    fn killing_the_group_ends_the_child_and_its_children() {
        let mut cmd = Command::new("sh");
        // A grandchild in the same group, as Blender's GPU probe would be.
        cmd.args(["-c", "sleep 300 & echo $!; wait"])
            .stdout(std::process::Stdio::piped());
        let mut owned = spawn(cmd).unwrap();
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(owned.child.stdout.take().unwrap()),
            &mut line,
        )
        .unwrap();
        let grandchild: i32 = line.trim().parse().unwrap();
        let pid = owned.group();
        owned.kill();
        owned.wait().unwrap();
        assert!(wait_gone(pid));
        assert!(wait_gone(grandchild), "the grandchild outlived its group");
    }

    #[test]
    fn a_child_outlives_the_short_lived_thread_that_asked_for_it() {
        // Spawned from a thread that ends at once: the child must live on
        // (PDEATHSIG follows the forking thread, which is the spawner's).
        let owned = std::thread::spawn(|| {
            let mut sleep = Command::new("sleep");
            sleep.arg("300");
            spawn(sleep).unwrap()
        })
        .join()
        .unwrap();
        std::thread::sleep(Duration::from_millis(200));
        assert!(
            !gone(owned.group()),
            "the child died with the thread that asked for it"
        );
        let pid = owned.group();
        drop(owned);
        assert!(wait_gone(pid), "dropping an owned child ends it");
    }

    #[test]
    fn a_sweep_ends_what_a_dead_worker_left_and_nothing_else() {
        let dir = std::env::temp_dir().join(format!("tessera-sweep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("pids")).unwrap();
        // A left-over renderer: its own group, recorded with its start time.
        let mut left = Command::new("sleep");
        left.arg("300").process_group(0).env(OWNER_ENV, &dir);
        let mut left = left.spawn().unwrap();
        let pid = left.id() as i32;
        // Its worker is gone: pid 1 never started at that time.
        std::fs::write(
            dir.join("pids").join(pid.to_string()),
            format!("{} 1 0", start_time(pid).unwrap()),
        )
        .unwrap();
        // A pid file whose pid now belongs to another process (another
        // start time): left alone.
        let mut other = Command::new("sleep");
        other.arg("300").process_group(0);
        let mut other = other.spawn().unwrap();
        let other_pid = other.id() as i32;
        std::fs::write(dir.join("pids").join(other_pid.to_string()), "1 1 0").unwrap();
        // A child of a worker still running (this test): left alone.
        let mut live = Command::new("sleep");
        live.arg("300").process_group(0);
        let mut live = live.spawn().unwrap();
        let live_pid = live.id() as i32;
        let me = std::process::id() as i32;
        std::fs::write(
            dir.join("pids").join(live_pid.to_string()),
            format!(
                "{} {me} {}",
                start_time(live_pid).unwrap(),
                start_time(me).unwrap()
            ),
        )
        .unwrap();
        // A forged file naming a process no worker started (no mark), with
        // its right start time and a worker that is gone: left alone.
        let mut stranger = Command::new("sleep");
        stranger.arg("300").process_group(0);
        let mut stranger = stranger.spawn().unwrap();
        let stranger_pid = stranger.id() as i32;
        std::fs::write(
            dir.join("pids").join(stranger_pid.to_string()),
            format!("{} 1 0", start_time(stranger_pid).unwrap()),
        )
        .unwrap();
        // A forged file naming this very process (the sweeping worker's own
        // line of ancestors): left alone.
        std::fs::write(
            dir.join("pids").join(me.to_string()),
            format!("{} 1 0", start_time(me).unwrap()),
        )
        .unwrap();
        // A renderer of a dead worker with no pid file (its worker died
        // between starting it and writing the file): found by its mark.
        let mut unfiled = Command::new("sleep");
        unfiled
            .arg("300")
            .process_group(0)
            .env(OWNER_ENV, &dir)
            .env(WORKER_ENV, "1 0");
        let mut unfiled = unfiled.spawn().unwrap();
        let unfiled_pid = unfiled.id() as i32;
        // A marked renderer of a worker still running (this test), with no
        // pid file: left alone.
        let mut marked_live = Command::new("sleep");
        marked_live
            .arg("300")
            .process_group(0)
            .env(OWNER_ENV, &dir)
            .env(WORKER_ENV, format!("{me} {}", start_time(me).unwrap()));
        let mut marked_live = marked_live.spawn().unwrap();
        let marked_live_pid = marked_live.id() as i32;
        // A pid file naming a marked process that leads no group of its
        // own (it left the one it was started in): ended all the same.
        let mut stray = Command::new("sleep");
        stray.arg("300").env(OWNER_ENV, &dir).env(WORKER_ENV, "1 0");
        let mut stray = stray.spawn().unwrap();
        let stray_pid = stray.id() as i32;
        std::fs::write(
            dir.join("pids").join(stray_pid.to_string()),
            format!("{} 1 0", start_time(stray_pid).unwrap()),
        )
        .unwrap();
        // Each child has exec'd `sleep` and its environment is readable
        // (its marks are there only from then on: right after spawn it
        // may still be a copy of this process, and during exec its name
        // changes before its environment is set up).
        for p in [
            pid,
            other_pid,
            live_pid,
            stranger_pid,
            unfiled_pid,
            marked_live_pid,
            stray_pid,
        ] {
            let execd = || {
                std::fs::read_to_string(format!("/proc/{p}/comm"))
                    .is_ok_and(|c| c.trim() == "sleep")
                    && std::fs::read(format!("/proc/{p}/environ")).is_ok_and(|e| !e.is_empty())
            };
            let since = std::time::Instant::now();
            while !execd() && since.elapsed() < std::time::Duration::from_secs(10) {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        let swept = sweep(&dir);
        let comm = |p: i32| std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
        assert_eq!(
            swept,
            3,
            "ended: left {} unfiled {} stray {}; spared: other {} live {} stranger {} marked_live {} (comm {:?} {:?} {:?})",
            wait_gone(pid),
            wait_gone(unfiled_pid),
            wait_gone(stray_pid),
            gone(other_pid),
            gone(live_pid),
            gone(stranger_pid),
            gone(marked_live_pid),
            comm(pid),
            comm(unfiled_pid),
            comm(stray_pid)
        );
        let _ = stray.wait();
        assert!(wait_gone(stray_pid), "a renderer out of its group was left");
        let _ = unfiled.wait();
        assert!(wait_gone(unfiled_pid), "an unfiled renderer was left");
        assert!(
            !gone(marked_live_pid),
            "a live worker's marked renderer was ended"
        );
        let _ = marked_live.kill();
        let _ = marked_live.wait();
        assert!(!gone(live_pid), "a live worker's child was ended");
        assert!(!gone(stranger_pid), "a process no worker started was ended");
        let _ = stranger.kill();
        let _ = stranger.wait();
        let _ = live.kill();
        let _ = live.wait();
        let _ = left.wait();
        assert!(wait_gone(pid));
        assert!(
            !gone(other_pid),
            "a process the pid file did not name was ended"
        );
        let _ = other.kill();
        let _ = other.wait();
        // The live worker's pid file stays; the others are gone.
        assert_eq!(std::fs::read_dir(dir.join("pids")).unwrap().count(), 1);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

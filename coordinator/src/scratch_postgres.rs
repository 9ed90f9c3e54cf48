//! A private PostgreSQL server for tests and benchmarks: a new cluster
//! made by Debian's `initdb` in a folder of its own, served by `postgres`
//! on a Unix socket in that folder only (no TCP port to collide on), owned
//! by whoever made it: it dies with its owner (`PR_SET_PDEATHSIG`), and is
//! stopped and removed on drop. A test whose coordinators must lose the
//! database to a network cut (a Unix socket crosses network namespaces)
//! has it listen on a TCP address of its own as well
//! ([`ScratchPostgres::start_on_tcp`]).
//!
//! PostgreSQL refuses to run as root: as root, the cluster belongs to the
//! `postgres` user (which Debian's package makes).

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// A running scratch server.
pub struct ScratchPostgres {
    dir: PathBuf,
    bin: PathBuf,
    owner: Option<(u32, u32)>,
    /// The TCP address it listens on too, if any.
    tcp: Option<std::net::SocketAddr>,
    server: Child,
}

/// Where PostgreSQL's programs are: `$TESSERA_TEST_PG_BIN`, else the
/// newest `/usr/lib/postgresql/N/bin` (Debian's layout), else the `PATH`.
pub fn bin_dir() -> Option<PathBuf> {
    if let Some(dir) = std::env::var_os("TESSERA_TEST_PG_BIN") {
        return Some(PathBuf::from(dir));
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_str()?.parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").exists().then_some((n, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Some(bin);
    }
    let on_path = Command::new("initdb").arg("--version").output();
    on_path
        .ok()
        .filter(|o| o.status.success())
        .map(|_| PathBuf::new())
}

/// What a test that needs PostgreSQL says when there is none.
pub const NEEDED: &str =
    "PostgreSQL's initdb and postgres (apt-get install postgresql, or set TESSERA_TEST_PG_BIN)";

impl ScratchPostgres {
    /// Makes and starts a cluster named after `name` (a folder under the
    /// temporary dir); waits until it takes connections.
    pub fn start(name: &str) -> anyhow::Result<ScratchPostgres> {
        ScratchPostgres::start_listening(name, None)
    }

    /// [`ScratchPostgres::start`], listening on `tcp` too (an address of
    /// this machine's; trusted from the subnets it is on, so give it one
    /// only the test reaches).
    pub fn start_on_tcp(name: &str, tcp: std::net::SocketAddr) -> anyhow::Result<ScratchPostgres> {
        ScratchPostgres::start_listening(name, Some(tcp))
    }

    fn start_listening(
        name: &str,
        tcp: Option<std::net::SocketAddr>,
    ) -> anyhow::Result<ScratchPostgres> {
        let bin = bin_dir().with_context(|| format!("no PostgreSQL here: {NEEDED}"))?;
        let dir = std::env::temp_dir().join(format!(
            "tessera-pg-{name}-{}-{}",
            std::process::id(),
            rand::random::<u32>()
        ));
        std::fs::create_dir_all(&dir)?;
        // The server's user must reach its folder: only it may.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        let owner = owner()?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))?;
        }
        let data = dir.join("data");
        let initdb = as_owner(Command::new(bin.join("initdb")), owner, &dir)
            .args([
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "-D",
            ])
            .arg(&data)
            .stdout(Stdio::null())
            .output()
            .context("cannot run initdb")?;
        if !initdb.status.success() {
            bail!(
                "initdb failed: {}",
                String::from_utf8_lossy(&initdb.stderr).trim()
            );
        }
        if tcp.is_some() {
            // `initdb --auth=trust` trusts 127.0.0.1 only over TCP.
            let mut hba = std::fs::OpenOptions::new()
                .append(true)
                .open(data.join("pg_hba.conf"))?;
            std::io::Write::write_all(&mut hba, b"host all all samenet trust\n")?;
        }
        let server = spawn(&bin, owner, &dir, tcp)?;
        let mut scratch = ScratchPostgres {
            dir,
            bin,
            owner,
            tcp,
            server,
        };
        scratch.wait_ready()?;
        Ok(scratch)
    }

    /// Stops the server as an operator's restart does (`pg_ctl restart -m
    /// fast`: open connections are closed, what was committed stays) and
    /// starts it again on the same data; waits until it takes connections.
    pub fn restart(&mut self) -> anyhow::Result<()> {
        self.stop(libc::SIGINT);
        self.server = spawn(&self.bin, self.owner, &self.dir, self.tcp)?;
        self.wait_ready()
    }

    /// Stops the server (a fast shutdown) until [`ScratchPostgres::start_again`]:
    /// a database out of reach for as long as a test needs.
    pub fn stop_for_now(&mut self) {
        self.stop(libc::SIGINT);
    }

    /// Starts the server stopped by [`ScratchPostgres::stop_for_now`] again,
    /// on the same data; waits until it takes connections.
    pub fn start_again(&mut self) -> anyhow::Result<()> {
        self.server = spawn(&self.bin, self.owner, &self.dir, self.tcp)?;
        self.wait_ready()
    }

    /// Sends `signal` (SIGINT: fast shutdown; SIGQUIT: immediate) and waits
    /// up to 10 s for the server to end, then kills it.
    fn stop(&mut self, signal: i32) {
        // SAFETY: a signal to our own child.
        unsafe { libc::kill(self.server.id() as i32, signal) };
        let began = Instant::now();
        while began.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.server.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.server.kill();
        let _ = self.server.wait();
    }

    /// The connection string of its `postgres` database (what `--state`
    /// takes).
    pub fn url(&self) -> String {
        // The port names the socket's file too.
        let port = self.tcp.map_or(5432, |a| a.port());
        format!(
            "host={} port={port} user=postgres dbname=postgres",
            self.dir.display()
        )
    }

    /// The connection string of its `postgres` database over TCP, when it
    /// listens on TCP ([`ScratchPostgres::start_on_tcp`]).
    pub fn tcp_url(&self) -> Option<String> {
        (self.tcp).map(|a| {
            format!(
                "host={} port={} user=postgres dbname=postgres",
                a.ip(),
                a.port()
            )
        })
    }

    /// Its folder (the data dir and the socket are in it).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn wait_ready(&mut self) -> anyhow::Result<()> {
        let began = Instant::now();
        loop {
            if let Some(status) = self.server.try_wait()? {
                let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
                bail!("postgres exited ({status}): {}", log.trim());
            }
            if postgres::Client::connect(&self.url(), postgres::NoTls).is_ok() {
                return Ok(());
            }
            if began.elapsed() > Duration::from_secs(30) {
                bail!("postgres did not take connections within 30 s");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for ScratchPostgres {
    fn drop(&mut self) {
        // SIGQUIT: the immediate shutdown; its backends go with it.
        self.stop(libc::SIGQUIT);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts `postgres` on the cluster in `dir` (its socket there too, and
/// on `tcp` if given), owned: it dies with this process.
fn spawn(
    bin: &Path,
    owner: Option<(u32, u32)>,
    dir: &Path,
    tcp: Option<std::net::SocketAddr>,
) -> anyhow::Result<Child> {
    let mut server = as_owner(Command::new(bin.join("postgres")), owner, dir);
    let listen = tcp.map_or(String::new(), |a| a.ip().to_string());
    let port = tcp.map_or(5432, |a| a.port());
    server
        .arg("-D")
        .arg(dir.join("data"))
        .arg("-k")
        .arg(dir)
        .arg("-c")
        .arg(format!("listen_addresses={listen}"))
        .arg("-c")
        .arg(format!("port={port}"))
        .args(["-c", "max_connections=40"])
        .args([
            "-c",
            "shared_buffers=16MB",
            "-c",
            "log_min_messages=warning",
        ])
        .stdout(Stdio::null())
        .stderr(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(dir.join("server.log"))?,
        );
    // SAFETY: prctl is async-signal-safe; nothing else runs between fork
    // and exec.
    unsafe {
        server.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    server.spawn().context("cannot start postgres")
}

/// The `postgres` user's ids when this runs as root (PostgreSQL refuses
/// root), else `None`.
fn owner() -> anyhow::Result<Option<(u32, u32)>> {
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let name = c"postgres";
    // SAFETY: a NUL-terminated name; the record is read at once, before
    // another call could reuse it.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        bail!("running as root, and there is no `postgres` user to run PostgreSQL as");
    }
    // SAFETY: non-null, just returned.
    let (uid, gid) = unsafe { ((*pw).pw_uid, (*pw).pw_gid) };
    Ok(Some((uid, gid)))
}

fn as_owner(mut cmd: Command, owner: Option<(u32, u32)>, dir: &Path) -> Command {
    if let Some((uid, gid)) = owner {
        cmd.uid(uid).gid(gid);
    }
    cmd.current_dir(dir).env_remove("PGDATA");
    cmd
}

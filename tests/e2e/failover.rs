//! A standby coordinator (`--standby`) on a farm whose state is in
//! PostgreSQL and whose assets are in one folder both coordinators mount
//! (`--blobs`): it takes over when the active one is killed, and the one
//! that lost its lease accepts nothing more.

use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tessera_protocol::ticket::Ticket;

use crate::harness::{Farm, State};
use crate::partition::ip;
use crate::requires::{require, Need};

/// The second coordinator: a data dir of its own, the farm's state and
/// blob folder, `--standby`. Killed when dropped.
pub struct Standby {
    pub log: PathBuf,
    child: Child,
    /// Its first stdout line, once it took over ("… listening on ADDR").
    pub banner: Arc<Mutex<Option<String>>>,
}

impl Standby {
    /// Started in a PID namespace of its own (`unshare`, root): to it the
    /// active coordinator is a process it cannot see, as on another
    /// machine, so it takes over only when the active one's lease ends.
    pub fn start(farm: &Farm, args: &[&str]) -> Standby {
        require(Need::RootNetns);
        let data = farm.dir.join("data-standby");
        let log = farm.dir.join("standby.log");
        let mut child = std::process::Command::new("unshare")
            .args(["--pid", "--fork", "--kill-child"])
            .arg(crate::harness::binary())
            .args([
                "coordinator",
                "--listen",
                "127.0.0.1:0",
                "--standby",
                "--data-dir",
            ])
            .arg(&data)
            .args(args)
            .env("RUST_LOG", "info")
            .envs(farm.coordinator_env.iter().map(|(k, v)| (k, v)))
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start the standby");
        let banner = Arc::new(Mutex::new(None));
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let seen = banner.clone();
        std::thread::spawn(move || {
            let mut line = String::new();
            if stdout.read_line(&mut line).is_ok() {
                *seen.lock().unwrap() = Some(line);
            }
            let _ = std::io::copy(&mut stdout, &mut std::io::sink());
        });
        Standby { log, child, banner }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Standby {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Waits until `ready` holds, at most `limit`, checking every 50 ms;
/// returns when it first held.
pub fn wait_until(what: &str, limit: Duration, mut ready: impl FnMut() -> bool) -> Instant {
    let deadline = Instant::now() + limit;
    loop {
        if ready() {
            return Instant::now();
        }
        assert!(Instant::now() < deadline, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits up to 60 s for `child` to exit (killed and failing the test
/// after that, naming `what`); its exit status.
fn exit_within(child: &mut Child, what: &str) -> std::process::ExitStatus {
    let began = Instant::now();
    loop {
        if let Some(exit) = child.try_wait().unwrap() {
            return exit;
        }
        if began.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("{what}: not within 60 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The ticket in `file` of data dir `data`.
fn ticket_in(data: &Path, file: &str) -> Option<Ticket> {
    std::fs::read_to_string(data.join(file))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// A farm on PostgreSQL with its blobs in a folder of the farm's, and a
/// standby beside its coordinator; returns once the active coordinator's
/// tickets name both (as a worker or client started from then on sees).
pub fn farm_with_standby(name: &str, args: &[&str]) -> (Farm, Standby) {
    farm_with_standby_after(name, args, |_| {})
}

/// [`farm_with_standby`], doing `before` to the farm before its standby
/// starts.
pub fn farm_with_standby_after(
    name: &str,
    args: &[&str],
    before: impl FnOnce(&mut Farm),
) -> (Farm, Standby) {
    farm_with_standby_started(
        name,
        args,
        |all| Farm::start_with_state(name, all, State::Postgres),
        before,
    )
}

/// [`farm_with_standby_after`], its farm started by `start` with the
/// arguments given to both coordinators.
fn farm_with_standby_started(
    name: &str,
    args: &[&str],
    start: impl FnOnce(&[&str]) -> Farm,
    before: impl FnOnce(&mut Farm),
) -> (Farm, Standby) {
    // Inside the farm's folder: removed with it.
    let blobs = std::env::temp_dir()
        .join(format!("tessera-e2e-{name}-{}", std::process::id()))
        .join("blobs-shared");
    let blobs = blobs.to_str().unwrap().to_string();
    let mut all = vec!["--blobs", blobs.as_str()];
    all.extend_from_slice(args);
    let mut farm = start(&all);
    before(&mut farm);
    let standby = Standby::start(&farm, &all);
    wait_until(
        "the tickets naming both coordinators",
        Duration::from_secs(30),
        || {
            ["worker.ticket", "client.ticket"]
                .iter()
                .all(|f| ticket_in(&farm.data, f).is_some_and(|t| t.also.len() == 1))
        },
    );
    (farm, standby)
}

/// The number after ` NAME=` on the first line of `log` containing `event`.
fn logged(log: &str, event: &str, name: &str) -> Option<u64> {
    let line = log.lines().find(|l| l.contains(event))?;
    crate::harness::field(line, name)
}

/// Blender renders a tiled job on 3 workers; the active coordinator is
/// killed (SIGKILL) mid-job; the standby takes the farm over, the workers
/// and the client follow the tickets to it, and the job completes with
/// frames equal to Blender's own render. Printed: how long after the kill
/// the standby handed out its first task, and the tasks rendered twice
/// (at most those in flight at the kill).
#[test]
#[ignore = "needs blender and PostgreSQL (initdb, postgres)"]
fn the_standby_takes_over_a_blender_job_when_the_active_coordinator_is_killed() {
    use crate::blender::{assert_same_pixels, blender_worker, enabled, Project};
    if !enabled() {
        return;
    }
    let (mut farm, standby) =
        farm_with_standby("failover", &["--heartbeat-ms", "500", "--lease-ms", "2000"]);
    let project = Project::make(&farm.dir, &[]);
    let refs = farm.dir.join("refs");
    let frames = [1, 2, 3, 4, 5, 6];
    project.reference("shot.blend", &refs, &frames);
    let job = farm.json(&[
        "submit",
        &project.blend("shot.blend"),
        "--frames",
        "1-6",
        "--tiles",
        "3x3",
        "--json",
    ]);
    let (id, total) = (
        job["id"].as_u64().unwrap(),
        job["tasks_total"].as_u64().unwrap(),
    );
    assert_eq!(total, 54);
    let worker = blender_worker();
    let worker: Vec<&str> = worker.iter().map(String::as_str).collect();
    for name in ["b1", "b2", "b3"] {
        farm.add_worker_with(name, &worker);
    }
    farm.wait_for(id, "the first frame's tiles", |s| {
        s["tasks_done"].as_u64().unwrap() >= total / 6
    });
    farm.kill_coordinator();
    let killed = Instant::now();
    let took_over = wait_until("the standby's first task", Duration::from_secs(60), || {
        standby.log_text().contains("first task handed out")
    });
    // The standby restores the farm (and says which jobs it resumed)
    // before it hands anything out; checked once that is done, not
    // between the lease's log line and the restore's.
    assert!(
        standby.log_text().contains("resumed job"),
        "the job ended before the kill: nothing to take over"
    );
    let out = farm.dir.join("out");
    let done = farm.wait_done(id, &out);
    assert_eq!(done["state"], "done", "{done}");
    for f in frames {
        assert_same_pixels(
            &out.join(format!("frame_{f:04}.png")),
            &refs.join(format!("ref_{f:04}.png")),
        );
    }
    let mut renders: std::collections::HashMap<(u64, u32), u32> = Default::default();
    for task in farm.renders() {
        *renders.entry(task).or_default() += 1;
    }
    let twice = renders.values().filter(|&&n| n > 1).count();
    assert_eq!(renders.len() as u64, total, "every tile rendered");
    // In flight at the kill: per worker, its one slot's tile and the one
    // leased ahead of it (pipelining), which it may render before it hears
    // from the standby: under load, one that rejoins after the standby's
    // rejoin window finds both given to others.
    assert!(twice <= 6, "{twice} tiles rendered twice: {renders:?}");
    let log = standby.log_text();
    let handed_after_ms = logged(&log, "first task handed out", "since_ms");
    eprintln!(
        "failover (SIGKILL): the standby handed out its first task {:.2} s after the kill \
         ({} ms after it took the lease); tiles rendered twice: {twice} of {total}",
        (took_over - killed).as_secs_f64(),
        handed_after_ms.unwrap_or(0),
    );
    assert!(
        standby
            .banner
            .lock()
            .unwrap()
            .as_deref()
            .is_some_and(|b| b.contains("listening on")),
        "the standby said it serves"
    );
}

/// The active coordinator is frozen (SIGSTOP: a machine that stalled, or
/// was cut off) past its lease; the standby takes over. Woken, the old
/// coordinator refuses the result a worker holding one of its leases
/// sends (an acknowledgement refused, or the connection ended), stores
/// nothing of it, and stops with status 3, saying why.
#[test]
#[ignore = "needs PostgreSQL (initdb, postgres)"]
fn a_coordinator_that_lost_its_lease_accepts_no_result_and_stops() {
    use tessera_protocol::messages::{CoordMsg, WorkerMsg};
    use tessera_protocol::Digest;

    use crate::hostile::runtime;
    use crate::hostile_worker::rogue;
    // A long task lease: the old coordinator's scheduler still deems the
    // rogue's lease live when it wakes, so only the farm's lease stops it.
    let (mut farm, standby) = farm_with_standby("fenced", &["--lease-ms", "120000"]);
    let scene = crate::harness::scenes().join("demo.scene.json");
    let rt = runtime();
    let ticket = ticket_in(&farm.data, "worker.ticket").unwrap();
    let mut session = rt.block_on(rogue::join(&ticket, "rogue", rogue::info(1, 0.0)));
    farm.wait_workers(1);
    let job = farm.json(&[
        "submit",
        scene.to_str().unwrap(),
        "--frames",
        "1",
        "--samples",
        "1",
        "--json",
    ])["id"]
        .as_u64()
        .unwrap();
    let spec = rt.block_on(rogue::assignment(&mut session));
    let old = farm.coordinator_pid();
    signal(old, libc::SIGSTOP);
    wait_until("the standby taking over", Duration::from_secs(30), || {
        standby.log_text().contains("holds the farm's lease")
    });
    signal(old, libc::SIGCONT);
    let png = {
        let mut out = Vec::new();
        let mut enc = png::Encoder::new(&mut out, spec.tile.width, spec.tile.height);
        enc.set_color(png::ColorType::Rgb);
        let pixels = vec![7u8; (spec.tile.width * spec.tile.height * 3) as usize];
        enc.write_header()
            .unwrap()
            .write_image_data(&pixels)
            .unwrap();
        out
    };
    let done = WorkerMsg::Done {
        task: spec.task,
        output: Digest::of(&png),
        render_ms: 1,
        inline: Some(png),
    };
    let answer = rt.block_on(async {
        if session.control.send(&done).await.is_err() {
            return "the connection ended".to_string();
        }
        let wait = tokio::time::timeout(Duration::from_secs(20), async {
            loop {
                match rogue::next(&mut session).await {
                    None => return "the connection ended".to_string(),
                    Some(CoordMsg::Ack {
                        task,
                        accepted,
                        reason,
                    }) if task == spec.task => {
                        assert!(
                            !accepted,
                            "a coordinator that lost its lease accepted a result"
                        );
                        return format!("refused: {}", reason.unwrap_or_default());
                    }
                    Some(_) => {}
                }
            }
        });
        wait.await.expect("an answer or the end of the connection")
    });
    let status = farm.wait_coordinator_exit(Duration::from_secs(20));
    assert_eq!(
        status.code(),
        Some(3),
        "the old coordinator stops, saying why"
    );
    let said = std::fs::read_to_string(farm.dir.join("coordinator-1.log")).unwrap();
    assert!(said.contains("another coordinator"), "{said}");
    let db = farm.db();
    let stored = db.results(job).unwrap();
    assert!(
        stored
            .iter()
            .all(|r| r.index != spec.task.index || r.render_ms != 1),
        "the old coordinator's result was stored: {stored:?}"
    );
    eprintln!("fenced: the old coordinator's answer to a result after the takeover: {answer}");
    drop(standby);
}

/// A worker started before the standby existed holds a ticket naming the
/// active coordinator only; the active one rewrites its ticket file when
/// the standby starts, and the worker reads the file again when it
/// reconnects: killed, the active coordinator's work goes on on the
/// standby with that worker.
#[test]
#[ignore = "needs PostgreSQL (initdb, postgres) and root"]
fn a_worker_started_before_the_standby_follows_its_rewritten_ticket() {
    let (mut farm, _standby) = farm_with_standby_after(
        "rewritten",
        &["--heartbeat-ms", "300", "--lease-ms", "1500"],
        |farm| {
            farm.add_worker("early");
            farm.wait_workers(1);
        },
    );
    let scene = crate::harness::scenes().join("demo.scene.json");
    let job = farm.json(&[
        "submit",
        scene.to_str().unwrap(),
        "--frames",
        "1-2",
        "--tiles",
        "4x4",
        "--json",
    ]);
    let id = job["id"].as_u64().unwrap();
    let total = job["tasks_total"].as_u64().unwrap();
    // A script following the job's events follows it across the takeover.
    let events = farm
        .command(&["events", "--json", "--job", &id.to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    farm.wait_for(id, "a quarter of the tasks", |s| {
        s["tasks_done"].as_u64().unwrap() >= total / 4
    });
    farm.kill_coordinator();
    let out = farm.dir.join("out");
    let done = farm.wait_done(id, &out);
    assert_eq!(done["state"], "done", "{done}");
    let mut events = events;
    let status = exit_within(&mut events, "`events --job` ending with its job");
    let read = |pipe: Option<&mut dyn std::io::Read>| {
        let mut text = String::new();
        pipe.unwrap().read_to_string(&mut text).unwrap();
        text
    };
    let stdout = read(events.stdout.as_mut().map(|p| p as &mut dyn std::io::Read));
    let stderr = read(events.stderr.as_mut().map(|p| p as &mut dyn std::io::Read));
    assert!(status.success(), "{status:?}: {stderr}");
    let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(
        (last["type"].as_str(), last["job"].as_u64()),
        (Some("job.done"), Some(id)),
        "{stdout}"
    );
    crate::harness::assert_frames_match_reference(&out, &scene, &[1, 2]);
    assert!(
        farm.log_of(0)
            .contains("the ticket file names other coordinators now"),
        "the worker read its ticket again"
    );
}

/// Network namespace `ns`, where the active coordinator runs, joined to
/// this process's namespace (PostgreSQL, the standby, the other workers,
/// the client) by a veth pair with a /30 of 10/8 unique to this process;
/// removed on drop, panic or not. Taking the namespace's end of the link
/// down cuts it off like a pulled cable, while what runs inside it still
/// reaches what runs inside it. (This side's route to it stays, marked
/// `linkdown`: packets for it are dropped, never sent to the default
/// route.)
struct Island {
    ns: String,
    outer_link: String,
    inner_link: String,
    outer_ip: Ipv4Addr,
    inner_ip: Ipv4Addr,
}

impl Island {
    fn create() -> Island {
        let id = std::process::id();
        // Process ids are below 2^22: one /30 each.
        let base = 0x0a00_0000 | ((id << 2) & 0x00ff_fffc);
        let island = Island {
            ns: format!("tessera-active-{id}"),
            outer_link: format!("tso{id}"),
            inner_link: format!("tsi{id}"),
            outer_ip: Ipv4Addr::from(base + 1),
            inner_ip: Ipv4Addr::from(base + 2),
        };
        let inner_link = &island.inner_link;
        ip(&["netns", "add", &island.ns]);
        ip(&[
            "link",
            "add",
            &island.outer_link,
            "type",
            "veth",
            "peer",
            "name",
            inner_link,
        ]);
        ip(&["link", "set", inner_link, "netns", &island.ns]);
        ip(&["-n", &island.ns, "link", "set", "lo", "up"]);
        let inner = format!("{}/30", island.inner_ip);
        ip(&["-n", &island.ns, "addr", "add", &inner, "dev", inner_link]);
        ip(&["-n", &island.ns, "link", "set", inner_link, "up"]);
        let outer = format!("{}/30", island.outer_ip);
        ip(&["addr", "add", &outer, "dev", &island.outer_link]);
        ip(&["link", "set", &island.outer_link, "up"]);
        island
    }

    /// Cuts the namespace off: its end of the link goes down.
    fn cut(&self) {
        ip(&["-n", &self.ns, "link", "set", &self.inner_link, "down"]);
    }
}

impl Drop for Island {
    fn drop(&mut self) {
        // The pair first: a thread of this process may still be in the
        // namespace, which keeps it (and a link in it) alive until then.
        let _ = std::process::Command::new("ip")
            .args(["link", "del", &self.outer_link])
            .stderr(Stdio::null())
            .status();
        let _ = std::process::Command::new("ip")
            .args(["netns", "del", &self.ns])
            .status();
    }
}

/// Runs `f` on a thread of its own that entered network namespace `ns`:
/// the sockets it opens are the namespace's.
fn on_thread_in<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    use std::os::fd::AsRawFd;
    let path = format!("/run/netns/{ns}");
    std::thread::spawn(move || {
        let handle = std::fs::File::open(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        // SAFETY: a namespace file this test made; setns on this thread
        // only (network namespaces are per thread).
        let entered = unsafe { libc::setns(handle.as_raw_fd(), libc::CLONE_NEWNET) };
        assert_eq!(entered, 0, "setns: {}", std::io::Error::last_os_error());
        f()
    })
}

/// What a worker heard after sending a result.
#[derive(Debug)]
enum Answer {
    Refused(String),
    Accepted,
    /// The connection ended with no answer.
    Ended,
    /// No answer within the test's patience.
    Silent,
}

/// The same failover with the active coordinator cut off by a network
/// namespace instead of killed. PostgreSQL listens on TCP on this side of
/// a veth pair; the active coordinator runs inside the namespace, with a
/// worker inside it too (this test, speaking the worker protocol from a
/// thread that entered the namespace, so it holds its task and sends its
/// result exactly when told); two real workers, the standby and the
/// client run outside. Mid-job the link goes down: the active coordinator
/// loses the database and the outside workers, the worker inside still
/// reaches it. The standby takes the lease and the job over; then the
/// worker inside delivers its result to the old coordinator, whose lease
/// has ended, and is refused; the result counts nowhere, the task is done
/// once (by an outside worker), and the frames equal a whole-frame render.
///
/// The builtin engine renders (demo.scene.json), not Blender: this is
/// about which coordinator may accept a result, not about the renderer;
/// the SIGKILL failover above compares Blender's frames.
#[test]
#[ignore = "needs PostgreSQL (initdb, postgres) and root with iproute2"]
fn a_coordinator_cut_off_by_a_network_namespace_refuses_a_result_once_its_lease_ended() {
    use tessera_coordinator::scratch_postgres::ScratchPostgres;
    use tessera_protocol::messages::{CoordMsg, WorkerMsg};
    use tessera_protocol::Digest;

    use crate::harness::{assert_frames_match_reference_samples, scenes};
    use crate::hostile_worker::rogue;

    require(Need::RootNetns);
    require(Need::Postgres);
    let name = "netns-failover";
    let island = Island::create();
    let server = ScratchPostgres::start_on_tcp(name, SocketAddr::new(island.outer_ip.into(), 5432))
        .expect("a scratch PostgreSQL on TCP");
    let url = server.tcp_url().unwrap();
    let inner_ip = island.inner_ip.to_string();
    let (mut farm, standby) = farm_with_standby_started(
        name,
        &["--heartbeat-ms", "500", "--lease-ms", "2000"],
        |all| Farm::start_in_on_postgres(name, all, Some(&island.ns), &inner_ip, server, url),
        // The client outside, where the standby is.
        |farm| farm.run_clients_in(None),
    );

    let ticket = ticket_in(&farm.data, "worker.ticket").unwrap();
    let (spec_tx, spec_rx) = std::sync::mpsc::channel();
    let (go, go_rx) = tokio::sync::oneshot::channel::<()>();
    let inside = on_thread_in(&island.ns, move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let mut session = rogue::join(&ticket, "inside", rogue::info(1, 0.0)).await;
            let spec = rogue::assignment(&mut session).await;
            spec_tx.send(spec.clone()).unwrap();
            // Heartbeats keep its lease live in the old coordinator's
            // scheduler: only the farm's lease can refuse its result.
            let mut beat = tokio::time::interval(Duration::from_millis(250));
            let mut go_rx = go_rx;
            loop {
                tokio::select! {
                    _ = &mut go_rx => break,
                    _ = beat.tick() => {
                        let beat = WorkerMsg::Heartbeat { telemetry: None };
                        if session.control.send(&beat).await.is_err() {
                            return (spec, Digest::of(b""), Answer::Ended);
                        }
                    }
                }
            }
            // A tile of the right size in one flat colour: never the
            // scene's pixels, so a frame it got into would show it.
            let png = {
                let mut out = Vec::new();
                let mut enc = png::Encoder::new(&mut out, spec.tile.width, spec.tile.height);
                enc.set_color(png::ColorType::Rgb);
                let pixels = vec![7u8; (spec.tile.width * spec.tile.height * 3) as usize];
                (enc.write_header().unwrap())
                    .write_image_data(&pixels)
                    .unwrap();
                out
            };
            let digest = Digest::of(&png);
            let done = WorkerMsg::Done {
                task: spec.task,
                output: digest,
                render_ms: 1,
                inline: Some(png),
            };
            if session.control.send(&done).await.is_err() {
                return (spec, digest, Answer::Ended);
            }
            let answer = tokio::time::timeout(Duration::from_secs(90), async {
                loop {
                    match rogue::next(&mut session).await {
                        None => return Answer::Ended,
                        Some(CoordMsg::Ack {
                            task,
                            accepted,
                            reason,
                        }) if task == spec.task => {
                            return match accepted {
                                true => Answer::Accepted,
                                false => Answer::Refused(reason.unwrap_or_default()),
                            }
                        }
                        Some(_) => {}
                    }
                }
            });
            let answer = answer.await.unwrap_or(Answer::Silent);
            (spec, digest, answer)
        })
    });
    // The job is submitted while the worker inside is the only one: it
    // is handed a task for sure (with the outside workers already there,
    // they took all 18 in a run).
    farm.wait_workers(1);

    let scene = scenes().join("demo.scene.json");
    let job = farm.json(&[
        "submit",
        scene.to_str().unwrap(),
        "--frames",
        "1-2",
        "--tiles",
        "3x3",
        "--samples",
        "64",
        "--json",
    ]);
    let (id, total) = (
        job["id"].as_u64().unwrap(),
        job["tasks_total"].as_u64().unwrap(),
    );
    let held = spec_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the worker inside is handed a task");
    assert_eq!(held.task.job, id);
    for outside in ["out1", "out2"] {
        farm.add_worker_in(None, outside, &[], &[]);
    }
    // The outside workers render over the link before it is cut; the job
    // cannot end before: the worker inside holds one of its tasks.
    farm.wait_for(id, "tasks done over the link", |s| {
        s["tasks_done"].as_u64().unwrap() >= 2
    });

    island.cut();
    let cut = Instant::now();
    let took_lease = wait_until(
        "the standby taking the lease",
        Duration::from_secs(30),
        || standby.log_text().contains("holds the farm's lease"),
    );
    let dispatched = wait_until("the standby's first task", Duration::from_secs(60), || {
        standby.log_text().contains("first task handed out")
    });

    // The standby holds the lease: the old one's ended, by the database's
    // clock and (a margin earlier) by the old coordinator's own.
    go.send(()).unwrap();
    let sent = Instant::now();
    let (spec, digest, answer) = inside.join().expect("the worker inside");
    let answered = sent.elapsed();
    let Answer::Refused(reason) = &answer else {
        panic!(
            "the cut-off coordinator, its lease ended, answered a result with {answer:?} \
             (within {answered:?}): {}",
            farm.coordinator_log()
        );
    };

    let out = farm.dir.join("out");
    let done = farm.wait_done(id, &out);
    assert_eq!(done["tasks_done"].as_u64(), Some(total), "{done}");
    assert_frames_match_reference_samples(&out, &scene, &[1, 2], 64);
    // Done once each, and the result from inside counts nowhere.
    let stored = farm.db().results(id).unwrap();
    let indexes: std::collections::BTreeSet<u32> = stored.iter().map(|r| r.index).collect();
    assert_eq!(stored.len() as u64, total, "{stored:?}");
    assert_eq!(indexes.len() as u64, total, "{stored:?}");
    let kept = stored.iter().find(|r| r.index == spec.task.index).unwrap();
    assert_ne!(kept.output, digest, "the refused result was stored");
    let mut accepted = farm.accepted();
    let n = accepted.len();
    accepted.sort();
    accepted.dedup();
    assert_eq!(accepted.len(), n, "a task was accepted twice: {accepted:?}");
    assert!(
        accepted.contains(&(id, spec.task.index)),
        "an outside worker did the refused task"
    );

    eprintln!(
        "failover (network cut): the standby took the lease {:.2} s after the cut and handed \
         out its first task {:.2} s after it; the cut-off coordinator refused a result sent \
         {:.2} s after the cut, in {:.2} s: {reason}",
        (took_lease - cut).as_secs_f64(),
        (dispatched - cut).as_secs_f64(),
        (sent - cut).as_secs_f64(),
        answered.as_secs_f64(),
    );
}

fn signal(pid: u32, sig: i32) {
    // SAFETY: a signal to a process this test started.
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0);
}

/// A standby whose bucket refuses its key, or that cannot reach its
/// bucket, stops at its start, with the reason, before it stands by: it never waits to fail only when
/// the farm needs it (it took the lease and exited, before), and never
/// writes a ticket nor gets named in the farm's.
#[test]
#[ignore = "needs PostgreSQL (initdb, postgres) and Garage"]
fn a_standby_its_bucket_refuses_stops_at_its_start_not_when_it_takes_over() {
    let name = "standby-refused";
    let farm = Farm::start_with_state(name, &[], State::PostgresS3);
    let blobs = format!("s3://{}/{name}", tessera_store::scratch_garage::BUCKET);
    let wrong_key = "0".repeat(64);
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_url = format!("http://{}", dead.local_addr().unwrap());
    drop(dead);
    // A wrong key, then an endpoint nobody answers on.
    for (n, (var, value)) in [
        ("AWS_SECRET_ACCESS_KEY", wrong_key.as_str()),
        ("AWS_ENDPOINT_URL", dead_url.as_str()),
    ]
    .into_iter()
    .enumerate()
    {
        let env = (farm.coordinator_env.iter()).map(|(k, v)| match k == var {
            true => (k.as_str(), value),
            false => (k.as_str(), v.as_str()),
        });
        let data = farm.dir.join(format!("data-standby-{n}"));
        let mut child = std::process::Command::new(crate::harness::binary())
            .args(["coordinator", "--listen", "127.0.0.1:0", "--standby"])
            .args(["--blobs", &blobs, "--data-dir"])
            .arg(&data)
            .envs(env)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the standby");
        let exit = exit_within(
            &mut child,
            &format!("a standby with a wrong {var} stopping"),
        );
        assert!(!exit.success(), "{var}: {exit}");
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        assert!(err.contains(&blobs), "the error names the bucket: {err}");
        assert!(!err.contains(&wrong_key), "the key is never shown: {err}");
        assert!(
            ticket_in(&data, "worker.ticket").is_none(),
            "it wrote a ticket"
        );
    }
    // The active coordinator's tickets, rewritten each look, name it alone.
    std::thread::sleep(Duration::from_secs(4));
    let ticket = ticket_in(&farm.data, "worker.ticket").unwrap();
    assert!(
        ticket.also.is_empty(),
        "named in tickets: {:?}",
        ticket.also
    );
}

/// A standby's HTTP port answers while it stands by (it accepted and kept
/// silent, before): `/metrics`, to the client ticket's bearer, with
/// `tessera_farm_lease_held 0`, to a wrong one 401; the API 503
/// `unavailable`. Once it takes over, the same port serves the API.
#[test]
#[ignore = "needs PostgreSQL (initdb, postgres) and root"]
fn a_standby_answers_on_its_http_port_and_serves_the_api_there_once_it_takes_over() {
    use crate::harness::http_call;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let http = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let args = ["--heartbeat-ms", "300", "--lease-ms", "1500"];
    let mut farm = Farm::start_with_state("standby-http", &args, State::Postgres);
    let mut standby_args = args.to_vec();
    let http_arg = http.to_string();
    standby_args.extend(["--http", http_arg.as_str()]);
    let standby = Standby::start(&farm, &standby_args);
    wait_until("the standby's HTTP port", Duration::from_secs(30), || {
        std::net::TcpStream::connect(http).is_ok()
    });
    let ticket = crate::hostile::ticket(&farm, "client.ticket");
    let lease_held = |body: &str| -> Option<f64> {
        (body.lines())
            .find_map(|l| l.strip_prefix("tessera_farm_lease_held "))
            .and_then(|v| v.trim().parse().ok())
    };
    let (code, body) = http_call(&ticket, http, "GET", "/metrics", "");
    assert_eq!((code, lease_held(&body)), (200, Some(0.0)), "{body}");
    let mut wrong = ticket.clone();
    wrong.secret = "0".repeat(ticket.secret.len());
    assert_eq!(http_call(&wrong, http, "GET", "/metrics", "").0, 401);
    let (code, body) = http_call(&ticket, http, "GET", "/v1/status", "");
    assert_eq!(code, 503, "{body}");
    let error: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(error["kind"], "unavailable", "{body}");
    // Idle sockets, more than it serves at once, never keep a scrape out.
    let idle: Vec<_> = (0..100)
        .map(|_| std::net::TcpStream::connect(http).unwrap())
        .collect();
    let (code, body) = http_call(&ticket, http, "GET", "/metrics", "");
    assert_eq!((code, lease_held(&body)), (200, Some(0.0)), "{body}");
    drop(idle);

    farm.kill_coordinator();
    wait_until(
        "the standby serving the API",
        Duration::from_secs(30),
        || http_call(&ticket, http, "GET", "/v1/status", "").0 == 200,
    );
    let (code, body) = http_call(&ticket, http, "GET", "/metrics", "");
    assert_eq!((code, lease_held(&body)), (200, Some(1.0)), "{body}");
    drop(standby);
}

/// A worker fetching a task's files when the active coordinator is killed
/// loses the fetch with its connection; the standby re-adopts the task
/// when the worker rejoins, and the worker fetches again over the new
/// connection and finishes it. (It dropped the task, before: the job stayed
/// running with the task held by nobody, until the worker left.)
#[test]
#[ignore = "needs PostgreSQL (initdb, postgres) and root"]
fn a_task_whose_files_were_being_fetched_at_the_kill_is_finished_after_the_takeover() {
    const MIB: u64 = 1 << 20;
    let (mut farm, _standby) =
        farm_with_standby("refetch", &["--heartbeat-ms", "300", "--lease-ms", "1500"]);
    let dir = farm.dir.join("scene");
    std::fs::create_dir_all(&dir).unwrap();
    let size = 256 * MIB;
    std::fs::write(
        dir.join("big.bin"),
        crate::harness::noise(size as usize, 11),
    )
    .unwrap();
    let scene = crate::assets::write_scene(&dir, &["big.bin"]);
    let job = farm.json(&[
        "submit",
        scene.to_str().unwrap(),
        "--engine",
        "noop",
        "--json",
    ]);
    let id = job["id"].as_u64().unwrap();
    farm.add_worker_with("w1", &["--engine", "noop"]);
    let partial = farm.dir.join("cache-w1").join("partial");
    let deadline = Instant::now() + Duration::from_secs(120);
    while crate::assets::written_bytes(&partial) < size / 20 {
        assert!(Instant::now() < deadline, "the fetch never started");
        std::thread::sleep(Duration::from_millis(5));
    }
    farm.kill_coordinator();
    let got = crate::assets::written_bytes(&partial);
    assert!(
        got < size * 9 / 10,
        "the fetch was over at the kill: {got} of {size}"
    );
    let done = farm.wait_for(id, "the job done on the standby", |s| s["state"] == "done");
    assert_eq!(done["tasks_done"], done["tasks_total"], "{done}");
}

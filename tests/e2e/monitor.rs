//! `tessera monitor` as a person runs it: the real binary in a real
//! terminal (tmux), watching a real farm, read back with `capture-pane` and
//! driven with `send-keys`. The monitor's model is checked through what it
//! draws: workers, the job's progress, the tiles, the connection.
//!
//! Needs `tmux` on the PATH (`apt-get install tmux`): each test is
//! `#[ignore = "needs tmux"]` and fails if run without it.

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::harness::{scenes, tessera, Farm};
use crate::requires::{require, Need};

/// A tmux server of its own (`-L`), with no user configuration, holding
/// one session; killed on drop.
struct Tmux {
    socket: String,
    session: &'static str,
}

impl Tmux {
    /// Starts `command` in a detached `width`×`height` session.
    fn start(name: &str, width: u16, height: u16, command: &str) -> Tmux {
        let tmux = Tmux {
            socket: format!("tessera-e2e-{name}-{}", std::process::id()),
            session: "monitor",
        };
        let out = tmux.run(&[
            "new-session",
            "-d",
            "-s",
            tmux.session,
            "-x",
            &width.to_string(),
            "-y",
            &height.to_string(),
            command,
        ]);
        assert!(
            out.status.success(),
            "tmux new-session failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        // Keep the pane when the command exits, to read its exit status.
        tmux.run(&["set-option", "-t", tmux.session, "remain-on-exit", "on"]);
        tmux
    }

    fn run(&self, args: &[&str]) -> Output {
        Command::new("tmux")
            .args(["-L", &self.socket, "-f", "/dev/null"])
            .args(args)
            .output()
            .expect("tmux runs (apt-get install tmux)")
    }

    /// The visible screen, one line per row.
    fn screen(&self) -> String {
        let out = self.run(&["capture-pane", "-p", "-t", self.session]);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A tmux format, e.g. `#{pane_dead}`.
    fn display(&self, format: &str) -> String {
        let out = self.run(&["display-message", "-p", "-t", self.session, format]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", self.session];
        args.extend_from_slice(keys);
        assert!(self.run(&args).status.success());
    }

    /// Polls the screen until `pred` holds; returns that screen.
    fn wait_for(&self, what: &str, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let screen = self.screen();
            if pred(&screen) {
                return screen;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for the monitor to show {what}; the screen:\n{screen}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("last screen:\n{}", self.screen());
        }
        let _ = self.run(&["kill-server"]);
    }
}

/// A line the shell writes to a file, once it is all there.
fn wait_file(p: &Path) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match std::fs::read_to_string(p) {
            Ok(text) if text.ends_with('\n') => return text,
            Ok(_) | Err(_) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50))
            }
            Ok(text) => panic!("{}: incomplete after 10 s: {text:?}", p.display()),
            Err(e) => panic!("{}: {e}", p.display()),
        }
    }
}

fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn monitor_command(farm: &Farm) -> String {
    format!(
        "{} monitor --ticket {}",
        shell_quote(env!("CARGO_BIN_EXE_tessera")),
        shell_quote(&farm.client_ticket())
    )
}

/// The tasks done of the jobs-table row that names `job`: `NN/TOTAL`.
fn tasks_done(screen: &str, job: &str, total: u32) -> Option<u32> {
    let suffix = format!("/{total} ");
    let line = screen
        .lines()
        .find(|l| l.contains(job) && l.contains(&suffix))?;
    let end = line.find(&suffix)?;
    let digits: String = line[..end]
        .chars()
        .rev()
        .take_while(|c| c.is_ascii_digit())
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    digits.parse().ok()
}

/// What the test saw of a job over many screens.
#[derive(Default)]
struct Seen {
    /// Tasks done, each change once.
    progress: Vec<u32>,
    /// A worker's current task of the job.
    a_task: bool,
    /// Tiles rendering in the mosaic's legend.
    rendering_tiles: bool,
}

impl Seen {
    fn screen(&mut self, screen: &str, job: u64) {
        if let Some(done) = tasks_done(screen, "mon-textured", 64) {
            if self.progress.last() != Some(&done) {
                self.progress.push(done);
            }
        }
        self.a_task |= screen.contains(&format!("j{job} f"));
        self.rendering_tiles |= screen
            .split("rendering ")
            .skip(1)
            .any(|rest| rest.starts_with(|c: char| c.is_ascii_digit() && c != '0'));
    }
}

/// Whether the workers table has a row for each of `names`.
fn shows_workers(screen: &str, names: &[&str]) -> bool {
    names
        .iter()
        .all(|n| screen.lines().any(|l| l.contains(&format!("│{n} "))))
}

#[test]
#[ignore = "needs tmux"]
fn monitor_follows_a_real_farm_from_first_task_to_last_tile() {
    require(Need::Tmux);
    let mut farm = Farm::start("monitor-farm", &[]);
    farm.add_worker_with("mon-w1", &["--price-per-hour", "0.90"]);
    farm.add_worker_with("mon-w2", &["--price-per-hour", "0.45"]);
    // The shell around the monitor writes its exit status to a file: tmux
    // may mark the pane dead before it has reaped the process, so its
    // `pane_dead_status` is not a reliable witness.
    let exit_file = farm.dir.join("monitor-exit");
    let tmux = Tmux::start(
        "farm",
        120,
        40,
        &format!(
            "{}; echo $? > {}",
            monitor_command(&farm),
            shell_quote(exit_file.to_str().unwrap())
        ),
    );

    // Both workers, with CPU telemetry: there is no NVIDIA driver here.
    let screen = tmux.wait_for("both workers and their telemetry", |s| {
        shows_workers(s, &["mon-w1", "mon-w2"]) && s.matches("no NVIDIA driver").count() == 2
    });
    assert!(screen.contains("● connected"), "{screen}");
    assert!(screen.contains("burn $1.35/h │ idle $1.35/h"), "{screen}");
    assert!(
        screen.contains("$0.90") && screen.contains("$0.45"),
        "{screen}"
    );
    assert_eq!(screen.matches("CPU: ").count(), 2, "{screen}");
    assert!(screen.contains("no jobs yet"), "{screen}");

    let scene = scenes().join("textured.scene.json");
    let job = farm.json(&[
        "submit",
        scene.to_str().unwrap(),
        "--tiles",
        "4x4",
        "--samples",
        "512",
        "--name",
        "mon-textured",
        "--json",
    ]);
    assert_eq!(job["tasks_total"], 64);
    let id = job["id"].as_u64().unwrap();

    // Follow the job on screen: some tasks done, then pause it with `p`.
    let mut seen = Seen::default();
    tmux.wait_for("some tasks done", |s| {
        tasks_done(s, "mon-textured", 64).is_some_and(|d| d > 0)
    });
    tmux.keys(&["p"]);
    // The action's own message and the jobs table's row: the events pane's
    // `job N (mon-textured) is paused` can come before either.
    let paused = tmux.wait_for("the job paused", |s| {
        s.contains(&format!("job {id} paused"))
            && s.lines().any(|l| {
                l.contains("mon-textured") && l.contains("paused") && !l.contains("(mon-textured)")
            })
    });
    assert!(paused.contains(&format!("job {id} paused")), "{paused}");
    seen.screen(&paused, id);
    // Running tasks finish (one slot per worker), no new ones start.
    std::thread::sleep(Duration::from_secs(2));
    let held = tmux.screen();
    seen.screen(&held, id);
    let at_pause = tasks_done(&paused, "mon-textured", 64).unwrap();
    let later = tasks_done(&held, "mon-textured", 64).unwrap();
    assert!(
        later < 64 && later <= at_pause + 2,
        "paused at {at_pause}, then {later}:\n{held}"
    );
    eprintln!("paused mid-way:\n{held}");

    // `p` again resumes; follow it until its last tile is done.
    tmux.keys(&["p"]);
    let resumed = tmux.wait_for("the job resumed", |s| {
        s.contains(&format!("job {id} resumed"))
    });
    seen.screen(&resumed, id);
    let deadline = Instant::now() + Duration::from_secs(180);
    let last = loop {
        let screen = tmux.screen();
        seen.screen(&screen, id);
        // Every task done is not yet the job done: its last frame is
        // stitched after its last task is committed. The event comes on
        // the live feed, the jobs table with the next snapshot: both.
        let job_done = screen.contains(&format!("job {id} (mon-textured) is done"));
        if seen.progress.last() == Some(&64)
            && screen.contains("16/16 done")
            && job_done
            && screen.contains("4/4")
        {
            break screen;
        }
        assert!(
            Instant::now() < deadline,
            "the job did not finish on screen; progress seen {:?}; the screen:\n{screen}",
            seen.progress
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let progress = seen.progress;
    eprintln!("tasks done as the monitor showed them: {progress:?}");
    assert!(
        progress.windows(2).all(|w| w[0] <= w[1]),
        "progress only goes up: {progress:?}"
    );
    assert!(
        progress.iter().filter(|&&p| p > 0 && p < 64).count() >= 2,
        "the progress advanced through the middle: {progress:?}"
    );
    assert!(seen.a_task, "a worker's current task was shown");
    assert!(seen.rendering_tiles, "the mosaic showed tiles rendering");
    eprintln!("{last}");
    // The finished job's mosaic is its last frame, every tile done.
    assert!(last.contains("frame 4 · 16/16 done"), "{last}");
    assert!(
        last.contains("done 16") && last.contains("failed 0"),
        "{last}"
    );
    assert!(last.contains("4/4"), "frames done: {last}");
    assert!(
        last.contains(&format!("job {id} (mon-textured) is done")),
        "{last}"
    );
    let s = farm.status(id);
    assert_eq!(s["state"], "done");
    // What the job cost, as the coordinator counted it: not nothing, and
    // the monitor shows it to a tenth of a cent.
    assert!(s["cost_usd"].as_f64().unwrap() > 0.0, "{s}");
    let row = last
        .lines()
        .find(|l| l.contains("mon-textured") && l.contains("64/64"))
        .unwrap();
    assert!(row.contains("$0.0") && !row.contains("$0.00 "), "{row}");

    // The coordinator restarts: the monitor says it lost it, then finds it
    // again, with the workers back and the job still done.
    farm.kill_coordinator();
    tmux.wait_for("that it is reconnecting", |s| s.contains("reconnecting…"));
    farm.start_coordinator();
    // Both workers back on the new coordinator (each rejoins after its own
    // backoff): the monitor's table, drawn from the old coordinator's last
    // snapshot until the new one's first, could show one that is not.
    farm.wait_workers(2);
    let screen = tmux.wait_for("the farm again after the restart", |s| {
        s.contains("● connected")
            && shows_workers(s, &["mon-w1", "mon-w2"])
            && tasks_done(s, "mon-textured", 64) == Some(64)
    });
    assert!(screen.contains("reconnected to"), "{screen}");

    // A snapshot of the new coordinator's (one comes every 0.5 s): the rows
    // the keys below act on are its workers, not the old one's.
    std::thread::sleep(Duration::from_millis(1500));
    tmux.wait_for("both workers after the restart", |s| {
        shows_workers(s, &["mon-w1", "mon-w2"])
    });

    // Drain the second worker in the table from the monitor: Tab to the
    // workers, down one, `d`, confirm with `y`. It has nothing to finish,
    // so it leaves; the other stays.
    tmux.keys(&["Tab"]);
    tmux.wait_for("the workers pane focused", |s| s.contains("▸ Workers"));
    tmux.keys(&["j"]);
    tmux.keys(&["d"]);
    let asked = tmux.wait_for("the drain question", |s| {
        ["mon-w1", "mon-w2"]
            .iter()
            .any(|n| s.contains(&format!("Drain worker {n} (")))
    });
    let (drained, stays) = if asked.contains("Drain worker mon-w1 (") {
        ("mon-w1", "mon-w2")
    } else {
        ("mon-w2", "mon-w1")
    };
    tmux.keys(&["y"]);
    let screen = tmux.wait_for("the drained worker gone, the other still there", |s| {
        s.contains(&format!("{drained} left"))
            && !s.lines().any(|l| l.contains(&format!("│{drained} ")))
            && s.contains(&format!("│{stays} "))
    });
    assert!(screen.contains("is draining"), "{screen}");

    tmux.keys(&["q"]);
    assert_eq!(
        wait_file(&exit_file).trim(),
        "0",
        "q ends the monitor with exit status 0"
    );
}

#[test]
#[ignore = "needs tmux"]
fn monitor_quits_on_q_and_leaves_the_terminal_usable() {
    require(Need::Tmux);
    let mut farm = Farm::start("monitor-tty", &[]);
    farm.add_worker("tty-w1");
    farm.add_worker("tty-w2");
    let scene = scenes().join("spheres.scene.json");
    let job = farm.json(&[
        "submit",
        scene.to_str().unwrap(),
        "--frames",
        "1",
        "--tiles",
        "2x2",
        "--name",
        "tty-spheres",
        "--json",
    ]);
    let id = job["id"].as_u64().unwrap();
    farm.wait_for(id, "the job to finish", |s| s["state"] == "done");

    // A plain shell in the terminal; the monitor runs from it as a person
    // would run it, and the shell notes the terminal's settings around it.
    let dir = farm.dir.clone();
    let tmux = Tmux::start(
        "tty",
        120,
        40,
        "env PS1='shell$ ' bash --norc --noprofile -i",
    );
    tmux.wait_for("the shell prompt", |s| s.contains("shell$"));
    let before = dir.join("stty-before");
    let after = dir.join("stty-after");
    let line = format!(
        "stty -g > {}; {}; echo monitor-exit=$?; stty -g > {}",
        shell_quote(before.to_str().unwrap()),
        monitor_command(&farm),
        shell_quote(after.to_str().unwrap()),
    );
    tmux.keys(&["-l", &line]);
    tmux.keys(&["Enter"]);

    // The tiles pane loads after the lists (it was seen still "loading
    // tiles…" on the first screen that had both).
    let screen = tmux.wait_for("the workers, the job and its tiles", |s| {
        shows_workers(s, &["tty-w1", "tty-w2"])
            && s.contains("tty-spheres")
            && s.contains("4/4")
            && s.matches("no NVIDIA driver").count() == 2
            && s.contains("frame 1 · 4/4 done")
    });
    assert!(screen.contains("● connected"), "{screen}");
    assert!(screen.contains("burn $0.00/h"), "{screen}");
    assert_eq!(
        tmux.display("#{alternate_on}"),
        "1",
        "the monitor draws on the alternate screen"
    );

    // Help opens and closes.
    tmux.keys(&["?"]);
    tmux.wait_for("the help", |s| s.contains("drain the selected worker"));
    tmux.keys(&["?"]);
    tmux.wait_for("the help gone", |s| {
        !s.contains("drain the selected worker")
    });

    // A smaller terminal: redrawn to fit, the essentials still there.
    tmux.run(&["resize-window", "-t", tmux.session, "-x", "80", "-y", "24"]);
    let small = tmux.wait_for("the 80×24 layout", |s| {
        s.lines().count() <= 24 && s.contains("CPU · no NVIDIA driver") && s.contains("tty-spheres")
    });
    assert!(small.lines().all(|l| l.chars().count() <= 80), "{small}");
    assert!(shows_workers(&small, &["tty-w1", "tty-w2"]), "{small}");
    tmux.run(&["resize-window", "-t", tmux.session, "-x", "120", "-y", "40"]);
    tmux.wait_for("the 120×40 layout", |s| s.contains("MEMORY"));

    // q: the monitor exits 0, the shell is back with the terminal as it was.
    tmux.keys(&["q"]);
    let screen = tmux.wait_for("the shell after the monitor", |s| {
        s.contains("monitor-exit=") && s.trim_end().ends_with("shell$")
    });
    assert!(screen.contains("monitor-exit=0"), "{screen}");
    assert!(
        !screen.contains("tty-w1"),
        "the monitor's screen is gone:\n{screen}"
    );
    assert_eq!(tmux.display("#{alternate_on}"), "0");
    assert_eq!(
        wait_file(&before),
        wait_file(&after),
        "the terminal settings (stty -g) are as before the monitor"
    );
    // The shell reads and echoes what is typed, as a cooked terminal does.
    tmux.keys(&["-l", "echo typed-$((6*7))"]);
    tmux.keys(&["Enter"]);
    let screen = tmux.wait_for("the typed command's output", |s| {
        s.lines().any(|l| l.trim() == "typed-42")
    });
    assert!(
        screen.contains("echo typed-$((6*7))"),
        "what was typed was echoed: {screen}"
    );
}

#[test]
#[ignore = "needs tmux"]
fn a_panic_in_the_monitor_restores_the_terminal() {
    require(Need::Tmux);
    let farm = Farm::start("monitor-panic", &[]);
    let tmux = Tmux::start(
        "panic",
        100,
        30,
        "env PS1='shell$ ' bash --norc --noprofile -i",
    );
    tmux.wait_for("the shell prompt", |s| s.contains("shell$"));
    let before = farm.dir.join("stty-before");
    let after = farm.dir.join("stty-after");
    let line = format!(
        "stty -g > {}; RUST_BACKTRACE=0 TESSERA_MONITOR_TEST_PANIC=1 {}; echo monitor-exit=$?; stty -g > {}",
        shell_quote(before.to_str().unwrap()),
        monitor_command(&farm),
        shell_quote(after.to_str().unwrap()),
    );
    tmux.keys(&["-l", &line]);
    tmux.keys(&["Enter"]);
    let screen = tmux.wait_for("the shell after the panic", |s| {
        s.contains("monitor-exit=") && s.trim_end().ends_with("shell$")
    });
    assert!(screen.contains("monitor-exit=101"), "{screen}");
    assert!(
        screen.contains("the monitor panics on purpose"),
        "the panic message is readable on the restored screen:\n{screen}"
    );
    assert_eq!(tmux.display("#{alternate_on}"), "0");
    assert_eq!(
        wait_file(&before),
        wait_file(&after),
        "the terminal settings (stty -g) are as before the monitor"
    );
}

#[test]
#[ignore = "needs tmux"]
fn monitor_with_a_wrong_ticket_says_why_and_leaves_the_terminal_alone() {
    require(Need::Tmux);
    let farm = Farm::start("monitor-ticket", &[]);
    let out = tessera()
        .args(["monitor", "--ticket"])
        .arg(format!("@{}", farm.data.join("worker.ticket").display()))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("worker ticket"), "{err}");
    assert!(
        !err.contains("\x1b[?1049h"),
        "no alternate screen was entered: {err:?}"
    );
    assert!(
        out.stdout.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&out.stdout)
    );
}

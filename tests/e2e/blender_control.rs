//! Every render the farm starts, it can stop (issue 25), on real Blender:
//! a cancel kills the renderer's process within 2 s and frees its slot for
//! the next job, whose render time is its own; a canceled task is never
//! rendered again; `--on-budget cancel` and a straggler's losing copy stop
//! their renderers the same way; `--task-timeout` and the stall window end
//! runaway renders with a reason; `kill -9` of a worker leaves no Blender
//! behind, and a worker started again on the same cache folder ends what a
//! crashed one left. Like `blender::`, these run on Debian's 3.4 and, with
//! `TESSERA_TEST_BLENDER_RUNTIME=bpy`, on the `bpy` module: each is also
//! `blender_control::on_bpy::TEST`, which CI runs in the same pass.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::blender::{also_on_bpy, blender_script, blender_worker, enabled, run_ok};
use crate::harness::Farm;

also_on_bpy!(
    a_cancel_kills_the_renderer_frees_the_slot_and_never_renders_the_task_again,
    a_budget_reached_mid_tile_with_on_budget_cancel_kills_the_renderer,
    a_stragglers_losing_copy_is_killed,
    a_task_past_its_time_limit_is_ended_and_the_job_fails_with_the_limit,
    a_stalled_renderer_is_ended_after_the_stall_window_with_its_log_kept,
    a_long_silent_render_that_works_is_not_taken_for_stalled,
    killing_a_worker_mid_render_leaves_no_blender_and_a_restart_ends_what_a_crash_left,
    a_renderer_gets_only_the_allow_listed_environment_never_the_workers_secrets,
);

/// Makes `DIR/slow.blend`: the factory scene on Cycles (CPU, no adaptive
/// sampling, no denoising) at 96x64 with a million samples per pixel, so
/// that a tile renders for hours unless it is stopped; `--samples 16` makes
/// a quick job of the same file.
fn slow_scene(dir: &Path) -> PathBuf {
    let path = dir.join("slow.blend");
    let src = format!(
        "s = bpy.context.scene\n\
         s.render.engine = 'CYCLES'\n\
         s.cycles.device = 'CPU'\n\
         s.cycles.samples = 1000000\n\
         s.cycles.use_adaptive_sampling = False\n\
         s.cycles.use_denoising = False\n\
         s.render.resolution_x = 96\n\
         s.render.resolution_y = 64\n\
         s.render.resolution_percentage = 100\n\
         s.frame_start = 1\n\
         s.frame_end = 1\n\
         bpy.ops.wm.save_as_mainfile(filepath={:?})\n",
        path.to_str().unwrap()
    );
    run_ok(&mut blender_script(None, &src, &[] as &[&str]));
    path
}

/// Every process below `pid` (children, grandchildren …), by /proc.
fn descendants(pid: u32) -> Vec<u32> {
    let mut parent_of = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().filter_map(Result::ok) {
        let Some(p) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) {
            let rest = &stat[stat.rfind(')').unwrap() + 1..];
            let ppid: u32 = rest.split_whitespace().nth(1).unwrap().parse().unwrap();
            parent_of.push((p, ppid));
        }
    }
    let mut found = vec![pid];
    let mut i = 0;
    while i < found.len() {
        let p = found[i];
        found.extend(parent_of.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    found.remove(0);
    found
}

/// A process that has exited (a zombie holds no memory and renders nothing).
fn gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s[s.rfind(')').unwrap() + 1..].trim_start().starts_with('Z'),
    }
}

/// Waits up to `limit` for every one of `pids` to be gone; the ones left.
fn wait_gone(pids: &[u32], limit: Duration) -> Vec<u32> {
    let deadline = Instant::now() + limit;
    loop {
        let left: Vec<u32> = pids.iter().copied().filter(|p| !gone(*p)).collect();
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The Blender sessions worker `i` runs now (its renderers: the processes
/// it started, with theirs).
fn renderers(farm: &Farm, i: usize) -> Vec<u32> {
    descendants(farm.worker_pid(i))
}

/// Waits until worker `i` logs that it renders a task of `job` and that
/// the Blender session it runs started; returns its renderers.
fn wait_rendering(farm: &Farm, i: usize, job: u64) -> Vec<u32> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let log = farm.log_of(i);
        let rendering = (log.lines())
            .any(|l| l.contains("task rendering") && l.contains(&format!(" job={job} ")));
        let pids = renderers(farm, i);
        // The session is running Blender, not a child still between fork
        // and exec: the worker logs its pid once the start is done.
        let started = (log.lines())
            .filter(|l| l.contains("blender session started"))
            .filter_map(|l| l.split(" pid=").nth(1))
            .filter_map(|p| p.split_whitespace().next()?.parse::<u32>().ok())
            .any(|p| pids.contains(&p));
        if rendering && started {
            return pids;
        }
        assert!(
            Instant::now() < deadline,
            "worker {i} never rendered job {job}: {log}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn submit(farm: &Farm, blend: &Path, extra: &[&str]) -> u64 {
    let mut args = vec!["submit", blend.to_str().unwrap(), "--json"];
    args.extend_from_slice(extra);
    farm.json(&args)["id"].as_u64().unwrap()
}

/// Lines worker `i` logged about job `job` containing `what`.
fn count(farm: &Farm, i: usize, job: u64, what: &str) -> usize {
    (farm.log_of(i).lines())
        .filter(|l| l.contains(what) && l.contains(&format!(" job={job} ")))
        .count()
}

fn add_worker(farm: &mut Farm, name: &str, extra: &[&str], env: &[(&str, &str)]) -> usize {
    let mut args = blender_worker();
    args.extend(extra.iter().map(|s| s.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    farm.add_worker_env(name, &args, env)
}

/// The quick job after a stopped one: it is rendered on the freed slot, and
/// its render time is its own (before, it waited inside the engine for the
/// canceled render to end, and was billed for it).
fn next_job_renders_on_the_freed_slot(farm: &Farm, blend: &Path) {
    let submitted = Instant::now();
    let quick = submit(farm, blend, &["--samples", "16"]);
    let out = farm.dir.join(format!("out-{quick}"));
    let done = farm.wait_done(quick, &out);
    let wall = submitted.elapsed();
    let render_ms = done["render_ms"].as_u64().unwrap();
    assert!(
        Duration::from_millis(render_ms) <= wall,
        "the next job was billed {render_ms} ms within {} ms of its submit",
        wall.as_millis()
    );
}

#[test]
#[ignore = "needs blender"]
fn a_cancel_kills_the_renderer_frees_the_slot_and_never_renders_the_task_again() {
    if !enabled() {
        return;
    }
    let mut farm = Farm::start("ctl-cancel", &[]);
    let blend = slow_scene(&farm.dir);
    let w = add_worker(&mut farm, "w1", &[], &[]);
    farm.wait_workers(1);
    let job = submit(&farm, &blend, &[]);
    let pids = wait_rendering(&farm, w, job);
    std::thread::sleep(Duration::from_secs(2));
    let out = farm.run(&["cancel", &job.to_string()]);
    assert!(out.status.success(), "{out:?}");
    let left = wait_gone(&pids, Duration::from_secs(2));
    assert!(
        left.is_empty(),
        "renderers {left:?} outlived the cancel by 2 s"
    );
    assert_eq!(farm.status(job)["state"], "canceled");

    next_job_renders_on_the_freed_slot(&farm, &blend);
    // The canceled task was never rendered again: one session was started
    // for it, and no render of it ended.
    assert_eq!(count(&farm, w, job, "blender session started"), 1);
    assert_eq!(count(&farm, w, job, "task rendered"), 0);
}

#[test]
#[ignore = "needs blender"]
fn a_budget_reached_mid_tile_with_on_budget_cancel_kills_the_renderer() {
    if !enabled() {
        return;
    }
    let mut farm = Farm::start("ctl-budget", &[]);
    let blend = slow_scene(&farm.dir);
    // $36 an hour is a cent a second of lease: a $0.05 budget is reached a
    // few seconds into the tile.
    let w = add_worker(&mut farm, "w1", &["--price-per-hour", "36"], &[]);
    farm.wait_workers(1);
    let job = submit(
        &farm,
        &blend,
        &["--budget-usd", "0.05", "--on-budget", "cancel"],
    );
    let pids = wait_rendering(&farm, w, job);
    farm.wait_for(job, "the budget to cancel the job", |s| {
        s["state"] == "canceled"
    });
    let left = wait_gone(&pids, Duration::from_secs(2));
    assert!(
        left.is_empty(),
        "renderers {left:?} outlived the budget's cancel by 2 s"
    );
    next_job_renders_on_the_freed_slot(&farm, &blend);
    assert_eq!(count(&farm, w, job, "task rendered"), 0);
}

#[test]
#[ignore = "needs blender"]
fn a_stragglers_losing_copy_is_killed() {
    if !enabled() {
        return;
    }
    let mut farm = Farm::start("ctl-straggler", &[]);
    let blend = slow_scene(&farm.dir);
    // w1's Blender hangs on every render (the stall hook; its stall window
    // is far away): the tile it took is rendered again on w2 as a
    // straggler, and w2's result wins. w1's copy must then be killed.
    let stalled = add_worker(
        &mut farm,
        "w1",
        &["--stall-window", "30m"],
        &[("TESSERA_TEST_STALL_RENDER", "1")],
    );
    farm.wait_workers(1);
    let job = submit(&farm, &blend, &["--samples", "16", "--tiles", "4x1"]);
    let pids = wait_rendering(&farm, stalled, job);
    add_worker(&mut farm, "w2", &[], &[]);
    let out = farm.dir.join("out");
    farm.wait_done(job, &out);
    let left = wait_gone(&pids, Duration::from_secs(2));
    assert!(
        left.is_empty(),
        "the losing copy's renderers {left:?} still run"
    );
    assert_eq!(count(&farm, stalled, job, "task rendered"), 0);
}

#[test]
#[ignore = "needs blender"]
fn a_task_past_its_time_limit_is_ended_and_the_job_fails_with_the_limit() {
    if !enabled() {
        return;
    }
    let mut farm = Farm::start("ctl-timeout", &[]);
    let blend = slow_scene(&farm.dir);
    let w = add_worker(&mut farm, "w1", &[], &[]);
    farm.wait_workers(1);
    let job = submit(&farm, &blend, &["--task-timeout", "5s"]);
    let pids = wait_rendering(&farm, w, job);
    let failed = farm.wait_for(job, "the job to fail at its limit", |s| {
        s["state"] == "failed"
    });
    let error = failed["error"].as_str().unwrap_or_default();
    assert!(error.contains("task ran past its 5s limit"), "{failed}");
    assert!(wait_gone(&pids, Duration::from_secs(2)).is_empty());
    assert!(renderers(&farm, w).is_empty(), "a renderer is left");
    // Each of its attempts failed with the limit, each after about 5 s.
    let attempts = farm.json(&["status", &job.to_string(), "--json"]);
    let failures = attempts["attempts"].as_array().cloned().unwrap_or_default();
    assert_eq!(attempts["attempts_total"], 3, "{attempts}");
    for f in &failures {
        assert!(f["error"].as_str().unwrap().contains("5s limit"), "{f}");
    }
    // Its failures were recorded and forgotten: drained now, the worker
    // holds nothing and leaves at once (it once kept a failure for ever
    // and never finished draining).
    let out = farm.run(&["drain", "w1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let status = farm.wait_worker_exit(w, Duration::from_secs(10));
    assert!(status.success(), "the drained worker exited with {status}");
}

#[test]
#[ignore = "needs blender"]
fn a_stalled_renderer_is_ended_after_the_stall_window_with_its_log_kept() {
    if !enabled() {
        return;
    }
    let mut farm = Farm::start("ctl-stall", &[]);
    let blend = slow_scene(&farm.dir);
    let w = add_worker(
        &mut farm,
        "w1",
        &["--stall-window", "3s"],
        &[("TESSERA_TEST_STALL_RENDER", "1")],
    );
    farm.wait_workers(1);
    let job = submit(&farm, &blend, &["--samples", "16"]);
    let pids = wait_rendering(&farm, w, job);
    let failed = farm.wait_for(job, "the stalled job to fail", |s| s["state"] == "failed");
    let error = failed["error"].as_str().unwrap_or_default();
    assert!(error.contains("stalled"), "{failed}");
    assert!(wait_gone(&pids, Duration::from_secs(2)).is_empty());
    // The renderer's log is kept for `tessera logs`: the session's own
    // lines from before it stalled.
    let logs = farm.json(&["logs", &job.to_string(), "--json"]);
    let attempts = logs["attempts"].as_array().unwrap();
    assert!(!attempts.is_empty(), "{logs}");
    for a in attempts {
        assert!(a["error"].as_str().unwrap().contains("stalled"), "{a}");
        assert!(
            a["log"]
                .as_str()
                .unwrap()
                .contains("tessera-session: ready"),
            "{a}"
        );
    }
}

/// A healthy render that prints nothing for many times the stall window
/// (Cycles in the background prints its first sample and then rarely) is
/// not taken for stalled: it uses the CPU, and the stall watch sees that.
#[test]
#[ignore = "needs blender"]
fn a_long_silent_render_that_works_is_not_taken_for_stalled() {
    if !enabled() {
        return;
    }
    let mut farm = Farm::start("ctl-silent", &[]);
    let blend = slow_scene(&farm.dir);
    let w = add_worker(&mut farm, "w1", &["--stall-window", "2s"], &[]);
    farm.wait_workers(1);
    let job = submit(&farm, &blend, &[]);
    let pids = wait_rendering(&farm, w, job);
    // Twelve seconds, six stall windows: it renders on, with no failure.
    let until = Instant::now() + Duration::from_secs(12);
    while Instant::now() < until {
        let s = farm.status(job);
        assert_eq!(s["state"], "running", "{s}");
        assert_eq!(s["attempts_total"], 0, "a working render was ended: {s}");
        assert!(
            wait_gone(&pids, Duration::ZERO) == pids,
            "the renderer ended"
        );
        std::thread::sleep(Duration::from_millis(500));
    }
    let out = farm.run(&["cancel", &job.to_string()]);
    assert!(out.status.success());
    assert!(wait_gone(&pids, Duration::from_secs(2)).is_empty());
}

#[test]
#[ignore = "needs blender"]
fn killing_a_worker_mid_render_leaves_no_blender_and_a_restart_ends_what_a_crash_left() {
    if !enabled() {
        return;
    }
    let mut farm = Farm::start("ctl-orphans", &[]);
    let blend = slow_scene(&farm.dir);
    let w = add_worker(&mut farm, "w1", &[], &[]);
    farm.wait_workers(1);
    let job = submit(&farm, &blend, &[]);
    let pids = wait_rendering(&farm, w, job);
    farm.kill_worker(w);
    let left = wait_gone(&pids, Duration::from_secs(2));
    assert!(
        left.is_empty(),
        "renderers {left:?} outlived their worker by 2 s"
    );

    // A crash that leaves its renderer running (the failpoint arms no
    // parent-death signal): the next worker on that cache folder ends it
    // before it joins.
    let crashing = add_worker(
        &mut farm,
        "w1",
        &[],
        &[("TESSERA_FAILPOINT", "orphan-renderers")],
    );
    let orphans = wait_rendering(&farm, crashing, job);
    farm.kill_worker(crashing);
    std::thread::sleep(Duration::from_millis(500));
    let running: Vec<u32> = orphans.iter().copied().filter(|p| !gone(*p)).collect();
    // Ends them whatever happens below.
    struct Reap(Vec<u32>);
    impl Drop for Reap {
        fn drop(&mut self) {
            for p in &self.0 {
                unsafe { libc::kill(*p as i32, libc::SIGKILL) };
            }
        }
    }
    let _reap = Reap(orphans.clone());
    assert!(
        !running.is_empty(),
        "the failpoint left no renderer running"
    );
    let again = add_worker(&mut farm, "w1", &[], &[]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !farm.log_of(again).contains("joined the farm") {
        assert!(Instant::now() < deadline, "{}", farm.log_of(again));
        std::thread::sleep(Duration::from_millis(20));
    }
    let left: Vec<u32> = running.iter().copied().filter(|p| !gone(*p)).collect();
    assert!(
        left.is_empty(),
        "left-over renderers {left:?} still run after the worker joined"
    );
    farm.run(&["cancel", &job.to_string()]);
}

#[test]
#[ignore = "needs blender"]
fn a_renderer_gets_only_the_allow_listed_environment_never_the_workers_secrets() {
    if !enabled() {
        return;
    }
    let mut farm = Farm::start("ctl-environ", &[]);
    let blend = slow_scene(&farm.dir);
    let ticket = std::fs::read_to_string(farm.data.join("worker.ticket")).unwrap();
    // The worker takes its ticket from the environment here, as the fleet's
    // nodes do, and has a provider's key in it too.
    let w = add_worker(
        &mut farm,
        "w1",
        &[],
        &[
            ("TESSERA_WORKER_TICKET", ticket.trim()),
            ("VAST_API_KEY", "provider-key-secret"),
            ("AWS_SECRET_ACCESS_KEY", "aws-secret"),
        ],
    );
    farm.wait_workers(1);
    let job = submit(&farm, &blend, &[]);
    let pids = wait_rendering(&farm, w, job);
    let secret = ticket.trim().rsplit("secret=").next().unwrap().to_string();
    for pid in &pids {
        let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
            continue;
        };
        for var in environ.split(|b| *b == 0).filter(|v| !v.is_empty()) {
            let var = String::from_utf8_lossy(var);
            let (name, value) = var.split_once('=').unwrap_or((&var, ""));
            let set_for_it = [
                "HOME",
                "PYTHONDONTWRITEBYTECODE",
                "TESSERA_RENDERER_OF",
                "TESSERA_RENDERER_WORKER",
            ];
            assert!(
                tessera_worker::child::allowed(name) || set_for_it.contains(&name),
                "{name} reached Blender (pid {pid})"
            );
            assert!(!value.contains("secret"), "{name} carries a secret");
            assert!(!value.contains(&secret), "{name} carries the worker ticket");
        }
    }
    farm.run(&["cancel", &job.to_string()]);
}

//! The command line as a script sees it: every exit code docs/pipeline-td.md lists,
//! `status` filters and details, `wait` on several jobs with a timeout,
//! frames written while the job still runs and across a coordinator
//! restart, drain by name, and docs/pipeline-td.md's three-shot bash script run as
//! written.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::harness::{
    assert_frames_match_reference, assert_frames_match_reference_samples, scenes, tessera, Farm,
};

/// The exit codes of the table in docs/pipeline-td.md.
const FAILED: i32 = 3;
const CANCELED: i32 = 4;
const TIMED_OUT: i32 = 5;
const UNREACHABLE: i32 = 6;
const USAGE: i32 = 2;
const ERROR: i32 = 1;

fn code(out: &Output) -> i32 {
    out.status.code().expect("exited by itself")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "no JSON ({e}): {} / {}",
            String::from_utf8_lossy(&out.stdout),
            stderr(out)
        )
    })
}

/// A copy of `textured.scene.json` whose wood texture is not a PNG: the
/// client finds the file (it only checks that it exists), every render of
/// it fails on the worker, and the job fails after its retries.
pub(crate) fn broken_scene(dir: &Path) -> PathBuf {
    let src = scenes();
    let dest = dir.join("broken");
    std::fs::create_dir_all(dest.join("textures")).unwrap();
    std::fs::copy(
        src.join("textured.scene.json"),
        dest.join("textured.scene.json"),
    )
    .unwrap();
    for t in std::fs::read_dir(src.join("textures")).unwrap() {
        let t = t.unwrap();
        std::fs::copy(t.path(), dest.join("textures").join(t.file_name())).unwrap();
    }
    std::fs::write(dest.join("textures/wood.png"), b"this is not a PNG").unwrap();
    dest.join("textured.scene.json")
}

fn submit(farm: &Farm, scene: &Path, extra: &[&str]) -> u64 {
    let mut args = vec!["submit", scene.to_str().unwrap(), "--json"];
    args.extend_from_slice(extra);
    farm.json(&args)["id"].as_u64().unwrap()
}

#[test]
fn every_exit_code_means_what_the_readme_says() {
    let mut farm = Farm::start("t14b-exit", &[]);
    let scene = scenes().join("textured.scene.json");
    let scene_s = scene.to_str().unwrap();

    // 2: bad usage, before anything is uploaded.
    let out = farm.run(&["submit", scene_s, "--output", "frames"]);
    assert_eq!(code(&out), USAGE, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("--output needs --wait"),
        "{}",
        stderr(&out)
    );
    assert_eq!(
        farm.json(&["status", "--json"])["jobs"],
        serde_json::json!([])
    );
    for args in [
        &["wait"][..],
        &["status", "--state", "paused"],
        &["wait", "1", "--timeout", "soon"],
    ] {
        let out = farm.run(args);
        assert_eq!(code(&out), USAGE, "{args:?}: {}", stderr(&out));
    }

    // 5: no worker yet, so the job is still queued when the time runs out;
    // the JSON says so and the job goes on.
    let queued = submit(&farm, &scene, &["--frames", "1", "--name", "sh010"]);
    let out = farm.run(&["wait", &queued.to_string(), "--timeout", "1s", "--json"]);
    assert_eq!(code(&out), TIMED_OUT, "{}", stderr(&out));
    let v = json_of(&out);
    assert_eq!(
        (v["timed_out"].clone(), v["state"].clone()),
        (true.into(), "queued".into())
    );

    // 4: canceled.
    assert!(farm.run(&["cancel", &queued.to_string()]).status.success());
    let out = farm.run(&["wait", &queued.to_string()]);
    assert_eq!(code(&out), CANCELED, "{}", stderr(&out));

    // 1: a refusal of every kind the CLI meets, one line each: canceling
    // or pausing a finished job (a conflict), an unknown job (not found).
    for args in [
        &["cancel", &queued.to_string()][..],
        &["pause", &queued.to_string()],
        &["cancel", "999"],
        &["status", "999"],
        &["logs", "999"],
        &["retry", "999"],
        &["retry", &queued.to_string()],
    ] {
        let out = farm.run(args);
        assert_eq!(code(&out), ERROR, "{args:?}: {}", stderr(&out));
        assert_eq!(stderr(&out).trim().lines().count(), 1, "{args:?}");
    }
    let v = farm.json(&["status", &queued.to_string(), "--json"]);
    assert_eq!(v["state"], "canceled", "refusals changed nothing: {v}");

    // 1: a reused request id with another submit is refused, naming the
    // job; the same submit again gets the same job.
    let first = submit(
        &farm,
        &scene,
        &["--frames", "1", "--request-id", "r-1", "--name", "sh020"],
    );
    let again = submit(
        &farm,
        &scene,
        &["--frames", "1", "--request-id", "r-1", "--name", "sh020"],
    );
    assert_eq!(first, again);
    let out = farm.run(&[
        "submit",
        scene_s,
        "--frames",
        "2",
        "--request-id",
        "r-1",
        "--name",
        "sh020",
    ]);
    assert_eq!(code(&out), ERROR, "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!(
            "request id `r-1` was already used for job {first}"
        )),
        "{}",
        stderr(&out)
    );

    // 3: a job whose every render fails; 0: a job that renders; several
    // jobs: the worst of them.
    let dir = farm.dir.clone();
    let broken = submit(
        &farm,
        &broken_scene(&dir),
        &["--frames", "1", "--name", "sh030"],
    );
    farm.add_worker("w1");
    let out = farm.run(&["wait", &first.to_string(), "--json"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let out = farm.run(&["wait", &broken.to_string(), &first.to_string(), "--json"]);
    assert_eq!(code(&out), FAILED, "{}", stderr(&out));
    let v = json_of(&out);
    let states: Vec<&str> = (v["jobs"].as_array().unwrap().iter())
        .map(|j| j["state"].as_str().unwrap())
        .collect();
    assert_eq!(states, ["failed", "done"]);

    // `status JOB`: the failed job's attempts with their errors, its
    // frame still waiting; the done one's frame and the worker that
    // rendered it.
    let d = farm.status(broken);
    assert_eq!(d["attempts_total"], 3, "{d}");
    assert!(
        (d["attempts"].as_array().unwrap().iter()).all(|a| a["error"]
            .as_str()
            .unwrap()
            .contains("wood.png")
            && a["frame"] == 1),
        "{d}"
    );
    assert_eq!(
        d["frames"],
        serde_json::json!([{"first": 1, "last": 1, "count": 1, "state": "waiting"}])
    );
    let d = farm.status(first);
    assert_eq!(d["frames"][0]["state"], "done", "{d}");
    assert_eq!(d["workers"][0]["name"], "w1", "{d}");
    assert_eq!(d["workers"][0]["tasks_done"], 1, "{d}");
    let text = farm.run(&["status", &broken.to_string()]);
    assert!(String::from_utf8_lossy(&text.stdout).contains("failed attempts: 3"));

    // Filters: by state, by name glob, by ids, by time.
    let ids = |args: &[&str]| -> Vec<u64> {
        let mut a = vec!["status", "--json"];
        a.extend_from_slice(args);
        (farm.json(&a)["jobs"].as_array().unwrap().iter())
            .map(|j| j["id"].as_u64().unwrap())
            .collect()
    };
    assert_eq!(ids(&["--state", "failed"]), [broken]);
    assert_eq!(ids(&["--state", "failed,canceled"]), [queued, broken]);
    assert_eq!(ids(&["--state", "finished", "--name", "sh020"]), [first]);
    assert_eq!(ids(&["--name", "sh0?0", "--state", "done"]), [first]);
    assert_eq!(ids(&["--name", "sh*"]), [queued, first, broken]);
    assert_eq!(
        ids(&[&broken.to_string(), &queued.to_string()]),
        [queued, broken]
    );
    assert_eq!(ids(&["--since", "1h"]).len(), 3);
    assert_eq!(ids(&["--since", "2999-01-01"]), Vec::<u64>::new());

    // 6: nobody answers on the ticket's address.
    farm.kill_coordinator();
    let out = farm.run(&["status"]);
    assert_eq!(code(&out), UNREACHABLE, "{}", stderr(&out));
    assert!(
        stderr(&out).contains("cannot reach the coordinator"),
        "{}",
        stderr(&out)
    );
}

/// The frame files in `dir` with their inode and modification time.
fn frame_files(dir: &Path) -> Vec<(String, u64, i64, i64)> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok())
                .filter(|e| e.file_name().to_string_lossy().starts_with("frame_"))
                .map(|e| {
                    let m = e.metadata().unwrap();
                    (
                        e.file_name().to_string_lossy().into_owned(),
                        m.ino(),
                        m.mtime(),
                        m.mtime_nsec(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

#[test]
fn frames_arrive_as_they_finish_and_a_coordinator_restart_loses_none() {
    let mut farm = Farm::start("t14b-stream", &[]);
    farm.add_worker("w1");
    farm.wait_workers(1);
    let scene = scenes().join("demo.scene.json");
    let out_dir = farm.dir.join("frames");
    // Six whole frames, one after another on the one worker.
    let mut client = tessera()
        .args([
            "submit",
            scene.to_str().unwrap(),
            "--frames",
            "1-6",
            "--samples",
            "4",
        ])
        .args(["--name", "stream", "--wait", "--json", "--output"])
        .arg(&out_dir)
        .env("TESSERA_TICKET", farm.client_ticket())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The first frame is on disk while the job still runs.
    let deadline = Instant::now() + Duration::from_secs(120);
    let first = loop {
        let files = frame_files(&out_dir);
        if !files.is_empty() {
            break files;
        }
        assert!(Instant::now() < deadline, "no frame was written");
        std::thread::sleep(Duration::from_millis(20));
    };
    let status = farm.json(&["status", "--json", "--name", "stream"]);
    let job = &status["jobs"][0];
    assert_ne!(
        job["state"], "done",
        "the job ended before its first frame showed: {job}"
    );
    assert!(job["frames_done"].as_u64().unwrap() < 6, "{job}");
    let id = job["id"].as_u64().unwrap();

    // The coordinator dies mid-job and comes back on the same port.
    farm.kill_coordinator();
    farm.start_coordinator();

    let done = client.wait_with_output_deadline(Duration::from_secs(180));
    assert_eq!(code(&done), 0, "{}", stderr(&done));
    let v = json_of(&done);
    assert_eq!(
        (v["id"].as_u64(), v["state"].as_str()),
        (Some(id), Some("done")),
        "{v}"
    );
    assert_eq!(v["files"].as_array().unwrap().len(), 6, "{v}");
    assert_frames_match_reference_samples(&out_dir, &scene, &[1, 2, 3, 4, 5, 6], 4);
    // Written once: what was on disk before the restart was never
    // replaced (same inode, same modification time).
    let after = frame_files(&out_dir);
    for f in &first {
        assert!(after.contains(f), "{} was written again: {after:?}", f.0);
    }
}

/// `wait_with_output` with a deadline (the child is killed past it).
trait WaitDeadline {
    fn wait_with_output_deadline(&mut self, limit: Duration) -> Output;
}

impl WaitDeadline for std::process::Child {
    fn wait_with_output_deadline(&mut self, limit: Duration) -> Output {
        let deadline = Instant::now() + limit;
        while self.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                let _ = self.kill();
                panic!("the client did not finish within {limit:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut stdout = Vec::new();
        let mut stderr = Vec::new();
        use std::io::Read;
        self.stdout
            .take()
            .unwrap()
            .read_to_end(&mut stdout)
            .unwrap();
        self.stderr
            .take()
            .unwrap()
            .read_to_end(&mut stderr)
            .unwrap();
        Output {
            status: self.wait().unwrap(),
            stdout,
            stderr,
        }
    }
}

#[test]
fn a_canceled_jobs_finished_frames_come_with_partial_and_progress_goes_to_stderr() {
    let mut farm = Farm::start("t14b-partial", &[]);
    farm.add_worker("w1");
    farm.wait_workers(1);
    let scene = scenes().join("demo.scene.json");
    let id = submit(
        &farm,
        &scene,
        &["--frames", "1-8", "--samples", "4", "--name", "long"],
    );
    farm.wait_for(id, "two frames", |s| {
        s["frames_done"].as_u64().unwrap() >= 2
    });
    assert!(farm.run(&["cancel", &id.to_string()]).status.success());
    let out_dir = farm.dir.join("partial");
    let out_s = out_dir.to_str().unwrap();
    let out = farm.run(&["wait", &id.to_string(), "--output", out_s, "--partial"]);
    assert_eq!(code(&out), CANCELED, "{}", stderr(&out));
    let got = frame_files(&out_dir).len() as u64;
    let done = farm.status(id)["frames_done"].as_u64().unwrap();
    assert!(
        got >= 2 && got == done,
        "{got} frames written of {done} done"
    );
    // Without --partial nothing is fetched.
    let out = farm.run(&[
        "wait",
        &id.to_string(),
        "--output",
        farm.dir.join("none").to_str().unwrap(),
    ]);
    assert_eq!(code(&out), CANCELED);
    assert!(frame_files(&farm.dir.join("none")).is_empty());

    // Progress: stderr is a pipe here, so a line, not a bar.
    let job = submit(
        &farm,
        &scene,
        &["--frames", "1", "--samples", "1", "--name", "lines"],
    );
    let out = farm.run(&["wait", &job.to_string()]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let text = stderr(&out);
    assert!(
        text.lines()
            .any(|l| l.starts_with(&format!("job {job} (lines): "))),
        "{text}"
    );
    assert!(!text.contains('\r'), "{text:?}");
}

#[test]
fn drain_takes_a_worker_name_and_an_idle_worker_leaves_at_once() {
    let mut farm = Farm::start("t14b-drain", &[]);
    let w = farm.add_worker("render-a");
    farm.wait_workers(1);
    let out = farm.run(&["drain", "nobody"]);
    assert_eq!(code(&out), ERROR);
    assert!(
        stderr(&out).contains("no connected worker is named `nobody`"),
        "{}",
        stderr(&out)
    );
    let out = farm.run(&["drain", "render-a"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let status = farm.wait_worker_exit(w, Duration::from_secs(10));
    assert!(status.success(), "{status}");
}

/// The three-shot script of docs/pipeline-td.md (the ```bash block under
/// Scripting),
/// run by bash as written, with `tessera` on the PATH.
#[test]
fn the_readmes_three_shot_script_runs() {
    let mut farm = Farm::start("t14b-readme", &[]);
    farm.add_worker("w1");
    let readme =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/pipeline-td.md"))
            .unwrap();
    let start = readme
        .find("# three_shots.sh")
        .expect("the script in docs/pipeline-td.md");
    let start = readme[..start].rfind("```bash\n").unwrap() + "```bash\n".len();
    let script = &readme[start..start + readme[start..].find("```").unwrap()];
    let work = farm.dir.join("script");
    std::fs::create_dir_all(&work).unwrap();
    std::fs::write(work.join("three_shots.sh"), script).unwrap();
    let bin = Path::new(env!("CARGO_BIN_EXE_tessera")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let run = || {
        std::process::Command::new("bash")
            .arg("three_shots.sh")
            .current_dir(&work)
            .env("PATH", &path)
            .env("TESSERA_TICKET", farm.client_ticket())
            .env("SCENE", scenes().join("textured.scene.json"))
            .output()
            .unwrap()
    };
    let out = run();
    assert_eq!(
        code(&out),
        0,
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
    let scene = scenes().join("textured.scene.json");
    for shot in ["sh010", "sh020", "sh030"] {
        assert_frames_match_reference(&work.join("shots").join(shot), &scene, &[1, 2, 3, 4]);
    }
    // Run again: the same jobs (request ids), nothing rendered twice.
    let again = run();
    assert_eq!(code(&again), 0, "{}", stderr(&again));
    assert_eq!(
        farm.json(&["status", "--json"])["jobs"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
}

#[test]
fn retry_puts_a_failed_job_back_and_it_finishes_on_a_healthy_worker() {
    use tessera_worker::engine::{FAILPOINT, FAILPOINT_ABORT_IN_RENDER};
    let mut farm = Farm::start("t14b-retry", &[]);
    // Three workers whose process dies as each starts rendering: the job
    // fails (three lost in a row).
    for name in ["d1", "d2", "d3"] {
        farm.add_worker_env(name, &[], &[(FAILPOINT, FAILPOINT_ABORT_IN_RENDER)]);
    }
    farm.wait_workers(3);
    let scene = scenes().join("textured.scene.json");
    let id = submit(&farm, &scene, &["--frames", "1", "--name", "retry-me"]);
    let out = farm.run(&["wait", &id.to_string(), "--timeout", "120s"]);
    assert_eq!(code(&out), FAILED, "{}", stderr(&out));
    // A done or canceled job is not retried; an unknown one neither.
    let out = farm.run(&["retry", "999"]);
    assert_eq!(code(&out), ERROR);
    assert!(stderr(&out).contains("no job 999"), "{}", stderr(&out));
    // A healthy worker joins; the failed job goes back and finishes.
    farm.add_worker("healthy");
    let out = farm.run(&["retry", &id.to_string(), "--wait", "--json"]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let v = json_of(&out);
    assert_eq!(
        (v["state"].as_str(), v["error"].is_null()),
        (Some("done"), true),
        "{v}"
    );
    let out_dir = farm.dir.join("retried");
    let out = farm.run(&[
        "wait",
        &id.to_string(),
        "--output",
        out_dir.to_str().unwrap(),
    ]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    assert_frames_match_reference(&out_dir, &scene, &[1]);
    let out = farm.run(&["retry", &id.to_string()]);
    assert_eq!(code(&out), ERROR);
    assert!(
        stderr(&out).contains("only a failed job can be retried"),
        "{}",
        stderr(&out)
    );
}

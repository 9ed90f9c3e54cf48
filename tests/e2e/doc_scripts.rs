//! The scripts of docs/pipeline-td.md -- the bash three-shot script and
//! the Python one -- extracted from the document as written (so the docs
//! cannot drift) and run one after the other on one farm, as a studio
//! whose TDs both use it would. Their request ids must not collide, and a
//! rerun of the bash script, which finds its jobs again and has nothing
//! left to fetch, must count what it did: no frame written.

use std::path::Path;
use std::process::{Command, Output};

use crate::harness::{scenes, Farm};
use crate::requires::{require, Need};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The text of the fenced block of `lang` that follows `marker` in
/// docs/pipeline-td.md (the marker may be inside the block).
fn block(marker: &str, lang: &str) -> String {
    let doc = std::fs::read_to_string(repo().join("docs/pipeline-td.md")).unwrap();
    let at = doc
        .find(marker)
        .unwrap_or_else(|| panic!("docs/pipeline-td.md has no `{marker}`"));
    let fence = format!("```{lang}\n");
    let start = match doc[..at].rfind(&fence) {
        // The marker is inside the block (its first comment line).
        Some(s) if !doc[s..at].contains("\n```\n") => s + fence.len(),
        _ => at + doc[at..].find(&fence).unwrap() + fence.len(),
    };
    doc[start..start + doc[start..].find("```").unwrap()].to_string()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The counts in the `N frames written to DIR` lines `tessera wait` printed.
fn written_counts(out: &Output) -> Vec<u64> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once(" frames written to ").map(|(n, _)| n))
        .map(|n| n.trim().parse().unwrap())
        .collect()
}

#[test]
#[ignore = "needs TESSERA_TEST_PYTHON (a Python 3.9+ with prometheus_client)"]
fn the_docs_bash_and_python_scripts_run_one_after_the_other_on_one_farm() {
    require(Need::PyClient);
    let py = std::env::var_os("TESSERA_TEST_PYTHON").unwrap();
    let mut farm = Farm::start("doc-scripts", &["--http"]);
    farm.add_worker_with("w1", &["--engine", "builtin"]);
    farm.add_worker_with("w2", &["--engine", "builtin"]);
    farm.wait_workers(2);
    let bin = Path::new(env!("CARGO_BIN_EXE_tessera")).parent().unwrap();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );

    // The bash TD's folder.
    let bash_dir = farm.dir.join("bash-td");
    std::fs::create_dir_all(&bash_dir).unwrap();
    std::fs::write(
        bash_dir.join("three_shots.sh"),
        block("# three_shots.sh", "bash"),
    )
    .unwrap();
    let bash = || {
        Command::new("bash")
            .arg("three_shots.sh")
            .current_dir(&bash_dir)
            .env("PATH", &path)
            .env("TESSERA_TICKET", farm.client_ticket())
            .env("SCENE", scenes().join("textured.scene.json"))
            .output()
            .unwrap()
    };
    let first = bash();
    assert!(first.status.success(), "bash: {}", text(&first));
    assert_eq!(written_counts(&first), [4, 4, 4], "{}", text(&first));

    // The Python TD's folder: three shots of the demo scene.
    let py_dir = farm.dir.join("python-td");
    std::fs::create_dir_all(py_dir.join("shots/textures")).unwrap();
    for texture in std::fs::read_dir(scenes().join("textures")).unwrap() {
        let texture = texture.unwrap().path();
        let to = py_dir
            .join("shots/textures")
            .join(texture.file_name().unwrap());
        std::fs::copy(&texture, to).unwrap();
    }
    for shot in ["sh010", "sh020", "sh030"] {
        let to = py_dir.join(format!("shots/{shot}.scene.json"));
        std::fs::copy(scenes().join("demo.scene.json"), to).unwrap();
    }
    std::fs::write(
        py_dir.join("three_shot.py"),
        block("<!-- three-shot.py -->", "python"),
    )
    .unwrap();
    let out = Command::new(&py)
        .arg("three_shot.py")
        .current_dir(&py_dir)
        .env("PYTHONPATH", repo().join("python"))
        .env("TESSERA_TICKET", farm.client_ticket())
        .env("TESSERA_BIN", env!("CARGO_BIN_EXE_tessera"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "the Python script after the bash one: {}",
        text(&out)
    );
    for shot in ["sh010", "sh020", "sh030"] {
        let frames = std::fs::read_dir(py_dir.join("renders").join(shot))
            .unwrap()
            .count();
        assert_eq!(frames, 2, "{shot}");
    }
    let jobs = farm.json(&["status", "--json"])["jobs"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(jobs, 6, "three jobs of each script");

    // The bash script again: the same three jobs, nothing to write.
    let again = bash();
    assert!(again.status.success(), "bash again: {}", text(&again));
    assert_eq!(written_counts(&again), [0, 0, 0], "{}", text(&again));
    let jobs = farm.json(&["status", "--json"])["jobs"]
        .as_array()
        .unwrap()
        .len();
    assert_eq!(jobs, 6, "the rerun made no job");
}

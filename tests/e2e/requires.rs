//! What some tests need beyond Rust: Blender, tmux, root with iproute2.
//!
//! Such a test is `#[ignore = "needs …"]`, so a plain `cargo test` lists it
//! as ignored in its summary instead of passing it silently. CI runs
//! `cargo test -- --include-ignored`; a test run that way whose requirement
//! is missing fails, naming what to install. With `CI=true`,
//! [`ci_has_every_requirement`] fails even a plain run on a machine that
//! lacks one.

use std::process::{Command, Stdio};

/// One thing a test may need.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// `blender` (or `$TESSERA_BLENDER`) runs.
    Blender,
    /// `tmux` runs.
    Tmux,
    /// Root, with iproute2's `ip` (network namespaces).
    RootNetns,
    /// What the WAN bench (`wan.rs`) needs: root, `ip` and nftables' `nft`.
    WanBench,
    /// `python3` runs.
    Python3,
    /// `$TESSERA_TEST_BPY` names a Python where `import bpy` works (the
    /// official Blender 4.5 LTS as a module; `.ci/run` installs it).
    Bpy,
    /// `$TESSERA_TEST_PYTHON` names a Python (3.9+) with `prometheus_client`
    /// (`.ci/run` makes that venv and `pip install`s `./python` into it).
    PyClient,
    /// A Docker Engine that answers (the tests' worker image is made from
    /// this machine's files; `TESSERA_TEST_WORKER_IMAGE=release` also needs
    /// root and debootstrap, which `fleet/image/build.sh` checks).
    Docker,
    /// `$TESSERA_TEST_OPENJD` names the reference implementation's CLI
    /// (`openjd`, from PyPI's openjd-cli; `.ci/run` installs it).
    OpenJd,
    /// `$TESSERA_TEST_SCHEMATHESIS` names schemathesis (PyPI; `.ci/run`
    /// installs it).
    Schemathesis,
    /// `ffmpeg` and `ffprobe` run (Debian's `ffmpeg` package).
    Ffmpeg,
    /// Debian's `chromium` and its `chromedriver` (the dashboard's browser
    /// tests).
    Chromium,
    /// PostgreSQL's `initdb` and `postgres` (a scratch cluster per test).
    Postgres,
}

impl Need {
    const ALL: [Need; 13] = [
        Need::Blender,
        Need::Tmux,
        Need::RootNetns,
        Need::WanBench,
        Need::Python3,
        Need::Bpy,
        Need::PyClient,
        Need::Docker,
        Need::OpenJd,
        Need::Schemathesis,
        Need::Ffmpeg,
        Need::Chromium,
        Need::Postgres,
    ];

    fn what(self) -> &'static str {
        match self {
            Need::Blender => {
                "Blender on the PATH (apt-get install blender, or set TESSERA_BLENDER)"
            }
            Need::Tmux => "tmux on the PATH (apt-get install tmux)",
            Need::RootNetns => "root and iproute2's `ip` (network namespaces)",
            Need::WanBench => "root, iproute2's `ip` and nftables' `nft` (apt-get install nftables)",
            Need::Python3 => "python3 on the PATH (apt-get install python3)",
            Need::PyClient => {
                "TESSERA_TEST_PYTHON naming a Python 3.9+ with prometheus_client (.ci/run makes it in $HOME/.cache/tessera-ci/pyclient)"
            }
            Need::Docker => "a running Docker Engine (`docker info` answers)",
            Need::OpenJd => {
                "TESSERA_TEST_OPENJD naming openjd-cli's `openjd` (.ci/run installs openjd-cli==0.8.0 in $HOME/.cache/tessera-ci/openjd-cli-0.8.0)"
            }
            Need::Schemathesis => {
                "TESSERA_TEST_SCHEMATHESIS naming schemathesis (.ci/run installs schemathesis==4.32.5 in $HOME/.cache/tessera-ci/schemathesis-4.32.5)"
            }
            Need::Ffmpeg => "ffmpeg and ffprobe on the PATH (apt-get install ffmpeg)",
            Need::Chromium => {
                "/usr/bin/chromium and chromedriver (apt-get install chromium chromium-driver)"
            }
            Need::Postgres => tessera_coordinator::scratch_postgres::NEEDED,
            Need::Bpy => {
                "TESSERA_TEST_BPY naming a Python with bpy 4.5 (.ci/run installs bpy==4.5.4 in $HOME/.cache/tessera-ci/bpy-4.5.4)"
            }
        }
    }

    fn present(self) -> bool {
        let runs = |cmd: &mut Command| {
            cmd.stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        match self {
            Need::Blender => {
                let exe = std::env::var_os("TESSERA_BLENDER").unwrap_or_else(|| "blender".into());
                runs(Command::new(exe).arg("--version"))
            }
            Need::Tmux => runs(Command::new("tmux").arg("-V")),
            Need::Python3 => runs(Command::new("python3").arg("--version")),
            Need::Ffmpeg => {
                runs(Command::new("ffmpeg").arg("-version"))
                    && runs(Command::new("ffprobe").arg("-version"))
            }
            Need::Chromium => {
                runs(Command::new("/usr/bin/chromium").arg("--version"))
                    && runs(Command::new("chromedriver").arg("--version"))
            }
            Need::PyClient => std::env::var_os("TESSERA_TEST_PYTHON").is_some_and(|py| {
                runs(Command::new(py).args([
                    "-c",
                    "import sys, prometheus_client; assert sys.version_info >= (3, 9)",
                ]))
            }),
            Need::Bpy => std::env::var_os("TESSERA_TEST_BPY")
                .is_some_and(|py| runs(Command::new(py).args(["-c", "import bpy"]))),
            Need::WanBench => crate::wan::unavailable().is_none(),
            Need::Postgres => tessera_coordinator::scratch_postgres::bin_dir().is_some(),
            Need::Docker => runs(Command::new("docker").arg("info")),
            Need::OpenJd => std::env::var_os("TESSERA_TEST_OPENJD")
                .is_some_and(|cli| runs(Command::new(cli).arg("--help"))),
            Need::Schemathesis => std::env::var_os("TESSERA_TEST_SCHEMATHESIS")
                .is_some_and(|cli| runs(Command::new(cli).arg("--version"))),
            Need::RootNetns => {
                let root = (Command::new("id").arg("-u").output())
                    .is_ok_and(|o| o.status.success() && o.stdout.trim_ascii() == b"0");
                root && runs(Command::new("ip").args(["netns", "list"]))
            }
        }
    }
}

/// Fails the running test when `need` is missing: it was asked to run
/// (`--include-ignored`), so skipping it would be a silent pass.
pub fn require(need: Need) {
    assert!(
        need.present(),
        "this test needs {}, which is missing here; install it, or run `cargo test` without --include-ignored to list the test as ignored",
        need.what()
    );
}

#[test]
fn ci_has_every_requirement() {
    if std::env::var("CI").is_ok_and(|v| v == "true") {
        let missing: Vec<&str> = (Need::ALL.into_iter())
            .filter(|n| !n.present())
            .map(Need::what)
            .collect();
        assert!(
            missing.is_empty(),
            "CI=true but missing: {}",
            missing.join("; ")
        );
    }
}

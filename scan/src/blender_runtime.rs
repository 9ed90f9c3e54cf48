//! The Blenders a machine has, and how to run them.
//!
//! A Blender is either an executable (Debian's package, an official Linux
//! tarball unpacked anywhere) or the `bpy` module inside a Python interpreter
//! (PyPI's `bpy`, which is the official build as a module). Both run the same
//! embedded scripts (`session.py`, `scan.py`, `probe.py`) under the same
//! rules: factory settings, a submitted file's scripts never run, arguments
//! as a vector, never through a shell. An executable gets
//! `-b --factory-startup --disable-autoexec`; the module gets a prelude that
//! calls `read_factory_settings` and then `open_mainfile(use_scripts=False)`.
//!
//! Each Blender is probed once: its version, its Cycles devices, whether it
//! has OpenImageDenoise, OSL and a GPU context for Eevee. That is the
//! [`BlenderOffer`] a worker reports, and what the scheduler matches jobs
//! against. The version a `.blend` needs is read from its header
//! ([`file_version`]), compressed files too, without running any Blender.

use std::ffi::OsStr;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use serde::Deserialize;
use tessera_protocol::blender::{header_version, BlenderOffer, BlenderVersion, HEADER_LEN};

/// The capability probe, run inside each Blender once.
pub const PROBE_PY: &str = include_str!("blender/probe.py");
/// What every executable Blender invocation starts with.
pub use crate::blender::SAFE_ARGS;
/// How long a probe may take before the Blender counts as broken.
const PROBE_TIMEOUT: Duration = Duration::from_secs(120);
const REPLY: &str = "@@TESSERA@@ ";

/// What a `bpy` interpreter runs: takes the .blend path, the thread count,
/// the folder holding `bpy/` (empty: the interpreter's own) and the script
/// from after `--`, resets to factory settings and opens the
/// file with its scripts off, leaves `sys.argv` as Blender's own would be
/// (`... -- ARGS`), runs the script, and exits at once with its status: a
/// module Blender can hang in Python's own shutdown, which an executable
/// never reaches. `-t N` has no module equivalent, so a load handler fixes
/// each scene's thread count.
const BPY_RUNNER: &str = r#"
import os as _os
import sys as _sys
_i = _sys.argv.index("--")
_blend, _threads, _site, _script = _sys.argv[_i + 1], int(_sys.argv[_i + 2]), _sys.argv[_i + 3], _sys.argv[_i + 4]
del _sys.argv[_i + 1:_i + 5]
if _site:
    _sys.path.insert(0, _site)


def _tessera_exit(code):
    try:
        _sys.stdout.flush()
        _sys.stderr.flush()
    finally:
        _os._exit(code)


import bpy
if _threads > 0:
    @bpy.app.handlers.persistent
    def _tessera_threads(*_a):
        for _s in bpy.data.scenes:
            _s.render.threads_mode = "FIXED"
            _s.render.threads = _threads
    bpy.app.handlers.load_post.append(_tessera_threads)
bpy.ops.wm.read_factory_settings(use_empty=True)
if _blend:
    try:
        bpy.ops.wm.open_mainfile(filepath=_blend, load_ui=False, use_scripts=False)
    except Exception as _e:
        print("Error: " + " ".join(str(_e).split()).replace("Error: ", "", 1))
        _tessera_exit(1)
_code = 0
try:
    exec(compile(_script, "<tessera>", "exec"), {"__name__": "__main__"})
except SystemExit as _e:
    _code = _e.code if isinstance(_e.code, int) else (0 if _e.code is None else 1)
except BaseException:
    import traceback
    traceback.print_exc()
    _code = 3
_tessera_exit(_code)
"#;

/// A Blender this machine can run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Runtime {
    /// A `blender` executable.
    Executable(PathBuf),
    /// A Python interpreter in which `import bpy` works.
    Module(PathBuf),
    /// A Python 3.11 running the `bpy` module of a build unpacked in
    /// `site` (a folder holding `bpy/`), which comes first on its path.
    ModuleIn { python: PathBuf, site: PathBuf },
}

impl Runtime {
    /// An executable given as a file, or as an unpacked official build's
    /// folder (holding `blender`).
    pub fn executable(path: &Path) -> Runtime {
        if path.is_dir() {
            Runtime::Executable(path.join("blender"))
        } else {
            Runtime::Executable(path.to_path_buf())
        }
    }

    pub fn path(&self) -> &Path {
        match self {
            Runtime::Executable(p) | Runtime::Module(p) => p,
            Runtime::ModuleIn { python, .. } => python,
        }
    }

    /// A command running Python `script` in this Blender, with `blend`
    /// (if any) opened safely first and `args` after `--` in `sys.argv`.
    /// `threads`: render threads (0: Blender's default).
    pub fn command<S: AsRef<OsStr>>(
        &self,
        blend: Option<&Path>,
        script: &str,
        args: &[S],
        threads: usize,
    ) -> Command {
        match self {
            Runtime::Executable(exe) => {
                let mut cmd = Command::new(exe);
                // Where Blender's Python reads the environment: no bytecode
                // written into the build (see -B below).
                cmd.env("PYTHONDONTWRITEBYTECODE", "1");
                cmd.args(SAFE_ARGS);
                if threads > 0 {
                    cmd.args(["-t", &threads.to_string()]);
                }
                if let Some(blend) = blend {
                    cmd.arg(blend);
                }
                cmd.args(["--python-exit-code", "3", "--python-expr", script, "--"])
                    .args(args);
                cmd
            }
            Runtime::Module(python) | Runtime::ModuleIn { python, .. } => {
                let site = match self {
                    Runtime::ModuleIn { site, .. } => site.as_os_str(),
                    _ => OsStr::new(""),
                };
                let mut cmd = Command::new(python);
                // -I: no PYTHONPATH, no user site, no current folder on the
                // path; a build's folder goes first on it through the runner.
                // -B: no `__pycache__` written into the build, whose files
                // are links to the worker's cache, checked before each task
                // (a session rewriting them failed the next task's check).
                cmd.arg("-I")
                    .arg("-B")
                    .arg("-c")
                    .arg(BPY_RUNNER)
                    .arg("--")
                    .arg(blend.map_or(OsStr::new(""), Path::as_os_str))
                    .arg(threads.to_string())
                    .arg(site)
                    .arg(script)
                    .args(args);
                cmd
            }
        }
    }
}

/// One Blender, probed.
#[derive(Debug, Clone)]
pub struct Installed {
    pub runtime: Runtime,
    pub offer: BlenderOffer,
    /// The file Blender said it was loaded from (`bpy.__file__`, or the
    /// executable's own path).
    pub loaded_from: PathBuf,
}

#[derive(Deserialize)]
struct ProbeReply {
    version: Vec<u16>,
    version_string: String,
    #[serde(default)]
    path: Option<String>,
    oidn: bool,
    osl: bool,
    device_types: Vec<String>,
    devices: Vec<(String, String)>,
    render: Option<ProbeRender>,
}

#[derive(Deserialize)]
struct ProbeRender {
    ok: bool,
    device: Option<String>,
    error: Option<String>,
}

/// Runs `cmd` with a deadline; returns (status, stdout, stderr).
fn run_bounded(mut cmd: Command, limit: Duration) -> anyhow::Result<(bool, String, String)> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = out.read_to_end(&mut s);
        s
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        s
    });
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait()? {
            break st;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            bail!("gave no answer within {} s", limit.as_secs());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = String::from_utf8_lossy(&reader.join().unwrap_or_default()).into_owned();
    let err = String::from_utf8_lossy(&err_reader.join().unwrap_or_default()).into_owned();
    Ok((status.success(), out, err))
}

/// Eevee (or Workbench, which needs the same context) renders a 4x4 frame.
const EEVEE_PROBE: &str = r#"
import bpy
s = bpy.context.scene
names = {e.identifier for e in s.render.bl_rna.properties["engine"].enum_items}
s.render.engine = "BLENDER_EEVEE_NEXT" if "BLENDER_EEVEE_NEXT" in names else "BLENDER_EEVEE"
s.render.resolution_x = s.render.resolution_y = 4
s.eevee.taa_render_samples = 1
cam = bpy.data.objects.new("probe", bpy.data.cameras.new("probe"))
s.collection.objects.link(cam)
s.camera = cam
bpy.ops.render.render()
print("TESSERA_EEVEE_OK")
"#;

/// What `name`'s family calls it: `Debian's Blender 3.4.1` for the
/// distribution's package, `Blender 4.5.4 LTS (bpy)` for the module.
fn offer_name(runtime: &Runtime, version_string: &str) -> String {
    match runtime {
        Runtime::Module(_) | Runtime::ModuleIn { .. } => format!("Blender {version_string} (bpy)"),
        Runtime::Executable(exe) => {
            let real = on_path(exe);
            let real = std::fs::canonicalize(&real).unwrap_or(real);
            let debian = std::fs::read_to_string("/var/lib/dpkg/info/blender.list")
                .is_ok_and(|list| list.lines().any(|l| Path::new(l) == real));
            if debian {
                format!("Debian's Blender {version_string}")
            } else {
                format!("Blender {version_string}")
            }
        }
    }
}

/// Whether `runtime` can render Eevee here. The probe compiles shaders
/// (seconds to tens of seconds), so its answer is kept per Blender build
/// (path, size, modification time) under `cache`.
fn eevee_works(runtime: &Runtime, cache: Option<&Path>) -> bool {
    let file = cache
        .zip(build_key(runtime))
        .map(|(dir, k)| dir.join(format!("eevee-{k}")));
    if let Some(known) = file.as_ref().and_then(|f| std::fs::read(f).ok()) {
        return known == b"yes";
    }
    let cmd = runtime.command(None, EEVEE_PROBE, &[] as &[&str], 1);
    let works = run_bounded(cmd, PROBE_TIMEOUT)
        .is_ok_and(|(ok, out, _)| ok && out.contains("TESSERA_EEVEE_OK"));
    if let Some(f) = file {
        let _ = std::fs::create_dir_all(f.parent().expect("a folder"));
        let _ = std::fs::write(f, if works { "yes" } else { "no" });
    }
    works
}

/// Names one build of a Blender: its path, size and modification time (of
/// the interpreter, for the module).
fn build_key(runtime: &Runtime) -> Option<String> {
    let m = std::fs::metadata(on_path(runtime.path())).ok()?;
    let mtime = m
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos());
    let site = match runtime {
        Runtime::ModuleIn { site, .. } => site.display().to_string(),
        _ => String::new(),
    };
    let id = format!("{}\0{}\0{mtime}\0{site}", runtime.path().display(), m.len());
    Some(blake3::hash(id.as_bytes()).to_hex()[..32].to_string())
}

/// Where probe answers are kept between runs.
pub fn probe_cache_dir() -> Option<PathBuf> {
    std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .map(|b| b.join("tessera").join("blender-probes"))
}

/// The version of the Blender `runtime` runs, without the slower checks.
pub fn version(runtime: &Runtime) -> anyhow::Result<BlenderVersion> {
    probe_with(runtime, "CPU", None, &[], false).map(|i| i.offer.version)
}

/// `exe` as the PATH resolves it, when it is a bare name.
fn on_path(exe: &Path) -> PathBuf {
    if exe.components().count() == 1 {
        if let Some(path) = std::env::var_os("PATH") {
            for dir in std::env::split_paths(&path) {
                let candidate = dir.join(exe);
                if candidate.is_file() {
                    return candidate;
                }
            }
        }
    }
    exe.to_path_buf()
}

/// Probes `runtime`: version and capabilities, and, for a GPU device, a
/// probe render on it (`gpu_index` among Cycles' devices of that type). A
/// GPU that fails is an error: the worker never falls back to the CPU
/// silently.
pub fn probe(
    runtime: &Runtime,
    device: &str,
    gpu_index: Option<usize>,
) -> anyhow::Result<Installed> {
    probe_with(runtime, device, gpu_index, &[], true)
}

/// Probes `runtime` as one slot runs it: in the slot's environment `env`
/// (the variable that leaves it only its own GPU visible), rendering on the
/// first device of type `device` it sees, which is that GPU.
pub fn probe_pinned(
    runtime: &Runtime,
    device: &str,
    env: &[(&str, String)],
) -> anyhow::Result<Installed> {
    let gpu_index = (device != "CPU" && !env.is_empty()).then_some(0);
    probe_with(runtime, device, gpu_index, env, true)
}

/// Probes a stored build (`--blender auto`) as [`probe_pinned`] does, but
/// without the Eevee probe (tens of seconds of shader compiling): a stored
/// build is never offered for Eevee, so its answer would change nothing.
pub fn probe_build(
    runtime: &Runtime,
    device: &str,
    env: &[(&str, String)],
) -> anyhow::Result<Installed> {
    let gpu_index = (device != "CPU" && !env.is_empty()).then_some(0);
    let mut installed = probe_with(runtime, device, gpu_index, env, false)?;
    installed.offer.eevee = false;
    Ok(installed)
}

fn probe_with(
    runtime: &Runtime,
    device: &str,
    gpu_index: Option<usize>,
    env: &[(&str, String)],
    check_eevee: bool,
) -> anyhow::Result<Installed> {
    let what = runtime.path().display().to_string();
    let mut args: Vec<String> = Vec::new();
    if device != "CPU" {
        args.push(device.to_string());
        args.push(gpu_index.map_or(String::new(), |i| i.to_string()));
    }
    let mut cmd = runtime.command(None, PROBE_PY, &args, 0);
    cmd.envs(env.iter().map(|(k, v)| (k, v)));
    // The Eevee probe may abort its Blender (no GPU context): its own process.
    let eevee_runtime = runtime.clone();
    let eevee = std::thread::spawn(move || {
        check_eevee && eevee_works(&eevee_runtime, probe_cache_dir().as_deref())
    });
    // An executable's capabilities are kept per build (a package upgrade
    // changes the key); a module's are asked each time (its interpreter
    // stays the same when `pip` replaces bpy), and so is every GPU probe
    // render, which checks the device works now.
    let cached = match (runtime, device, probe_cache_dir(), build_key(runtime)) {
        (Runtime::Executable(_), "CPU", Some(dir), Some(k)) => Some(dir.join(format!("caps-{k}"))),
        _ => None,
    };
    let known = cached
        .as_ref()
        .and_then(|f| std::fs::read_to_string(f).ok());
    let (out, err) = match known {
        Some(line) => (format!("{REPLY}{line}"), String::new()),
        None => {
            let (_, out, err) = run_bounded(cmd, PROBE_TIMEOUT).with_context(|| what.clone())?;
            if let (Some(f), Some(line)) =
                (&cached, out.lines().find_map(|l| l.strip_prefix(REPLY)))
            {
                let _ = std::fs::create_dir_all(f.parent().expect("a folder"));
                let _ = std::fs::write(f, line);
            }
            (out, err)
        }
    };
    let eevee = eevee.join().unwrap_or(false);
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix(REPLY))
        .with_context(|| {
            let tail: Vec<&str> = err.lines().chain(out.lines()).rev().take(3).collect();
            format!("{what} is not a working Blender: {}", tail.join(" | "))
        })?;
    let reply: ProbeReply = serde_json::from_str(line).context("unreadable probe reply")?;
    let v = |i: usize| reply.version.get(i).copied().unwrap_or(0);
    let version = BlenderVersion::new(v(0), v(1), v(2));
    let render_device = match &reply.render {
        None => "CPU".to_string(),
        Some(r) if r.ok => r.device.clone().unwrap_or_else(|| device.to_string()),
        Some(r) => bail!(
            "the probe render on {device} failed in Blender {} ({what}): {}; fix the GPU or start the worker with --blender-device CPU",
            reply.version_string,
            r.error.as_deref().unwrap_or("no reason given")
        ),
    };
    Ok(Installed {
        offer: BlenderOffer {
            version,
            name: offer_name(runtime, &reply.version_string),
            device_types: reply.device_types,
            devices: reply
                .devices
                .into_iter()
                .map(|(t, n)| format!("{t}: {n}"))
                .collect(),
            render_device,
            oidn: reply.oidn,
            osl: reply.osl,
            eevee,
        },
        runtime: runtime.clone(),
        loaded_from: PathBuf::from(reply.path.unwrap_or_default()),
    })
}

/// The Cycles device `--blender-device auto` picks from what Cycles found:
/// OPTIX, then CUDA, then HIP, then ONEAPI, else CPU.
pub fn auto_device(devices: &[String]) -> &'static str {
    for want in ["OPTIX", "CUDA", "HIP", "ONEAPI"] {
        if devices.iter().any(|d| d.starts_with(&format!("{want}:"))) {
            return want;
        }
    }
    "CPU"
}

/// The Blender that saved `path`, from its header; gzip- and
/// zstd-compressed files are read through their first bytes.
pub fn file_version(path: &Path) -> anyhow::Result<BlenderVersion> {
    let mut head = [0u8; HEADER_LEN];
    let got = read_up_to(&mut open_blend(path)?, &mut head)
        .with_context(|| format!("cannot read {}", path.display()))?;
    header_version(&head[..got]).with_context(|| format!("`{}`", path.display()))
}

/// A `.blend` as Blender reads it: gzip- and zstd-compressed files
/// decompressed as they are read.
pub fn open_blend(path: &Path) -> anyhow::Result<Box<dyn Read>> {
    let mut file =
        std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?;
    let mut magic = [0u8; 4];
    let n = read_up_to(&mut file, &mut magic)
        .with_context(|| format!("cannot read {}", path.display()))?;
    let rest = std::io::Read::chain(std::io::Cursor::new(magic[..n].to_vec()), file);
    Ok(match magic {
        [0x28, 0xb5, 0x2f, 0xfd] => Box::new(ZstdFrames {
            src: rest,
            dec: ruzstd::decoding::FrameDecoder::new(),
            live: false,
            done: false,
        }),
        [0x1f, 0x8b, ..] => Box::new(flate2::read::GzDecoder::new(rest)),
        _ => Box::new(rest),
    })
}

/// Every frame of a zstd stream, decompressed in turn: Blender writes a
/// compressed `.blend` as many frames, with a skippable seek table after
/// them.
struct ZstdFrames<R: Read> {
    src: R,
    dec: ruzstd::decoding::FrameDecoder,
    /// A frame is being decoded.
    live: bool,
    /// The stream ended.
    done: bool,
}

impl<R: Read> Read for ZstdFrames<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        use ruzstd::decoding::errors::{FrameDecoderError as F, ReadFrameHeaderError as H};
        use ruzstd::decoding::BlockDecodingStrategy;
        loop {
            if self.done || buf.is_empty() {
                return Ok(0);
            }
            if !self.live {
                match self.dec.init(&mut self.src) {
                    Ok(()) => self.live = true,
                    Err(F::ReadFrameHeaderError(H::SkipFrame { length, .. })) => {
                        let skip = &mut (&mut self.src).take(u64::from(length));
                        std::io::copy(skip, &mut std::io::sink())?;
                        continue;
                    }
                    Err(F::ReadFrameHeaderError(H::MagicNumberReadError(e)))
                        if e.kind() == std::io::ErrorKind::UnexpectedEof =>
                    {
                        self.done = true;
                        return Ok(0);
                    }
                    Err(e) => return Err(std::io::Error::other(e)),
                }
            }
            while self.dec.can_collect() < buf.len() && !self.dec.is_finished() {
                let need = buf.len() - self.dec.can_collect();
                (self.dec)
                    .decode_blocks(&mut self.src, BlockDecodingStrategy::UptoBytes(need))
                    .map_err(std::io::Error::other)?;
            }
            let n = self.dec.read(buf)?;
            if n > 0 {
                return Ok(n);
            }
            if self.dec.is_finished() {
                self.live = false;
            }
        }
    }
}

fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..])? {
            0 => break,
            n => got += n,
        }
    }
    Ok(got)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sample_files_name_the_blender_that_saved_them_compressed_or_not() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scenes/blender/sample/project");
        let plain = file_version(&dir.join("shot.blend")).unwrap();
        let zstd = file_version(&dir.join("shot_zstd.blend")).unwrap();
        assert_eq!(plain.series(), (3, 4));
        assert_eq!(zstd, plain);
        // Read whole, a zstd file is every one of its frames: it ends with
        // the ENDB block, as the plain file does.
        let whole = |name: &str| {
            let mut bytes = Vec::new();
            open_blend(&dir.join(name))
                .unwrap()
                .read_to_end(&mut bytes)
                .unwrap();
            bytes
        };
        for bytes in [whole("shot.blend"), whole("shot_zstd.blend")] {
            assert!(bytes.starts_with(b"BLENDER"));
            let tail = &bytes[bytes.len().saturating_sub(64)..];
            assert!(tail.windows(4).any(|w| w == b"ENDB"), "{tail:?}");
        }
        let tmp = std::env::temp_dir().join(format!("tessera-gz-{}.blend", std::process::id()));
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, b"BLENDER-v405REND\0\0\0").unwrap();
        std::fs::write(&tmp, gz.finish().unwrap()).unwrap();
        assert_eq!(file_version(&tmp).unwrap(), BlenderVersion::new(4, 5, 0));
        std::fs::write(&tmp, b"PK\x03\x04 not a blend").unwrap();
        let err = file_version(&tmp).unwrap_err();
        assert!(
            format!("{err:#}").contains("does not start with BLENDER"),
            "{err:#}"
        );
        let _ = std::fs::remove_file(&tmp);
    }

    #[test]
    fn both_kinds_of_blender_open_files_safely_with_arguments_as_a_vector() {
        let blend = Path::new("/jobs/7/shot; rm -rf ~.blend");
        let args = |cmd: &Command| -> Vec<String> {
            cmd.get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect()
        };
        let exe = Runtime::Executable("/opt/blender/blender".into());
        let cmd = exe.command(Some(blend), "print(1)", &["cfg.json"], 4);
        assert_eq!(cmd.get_program(), "/opt/blender/blender");
        assert_eq!(
            args(&cmd),
            [
                "-b",
                "--factory-startup",
                "--disable-autoexec",
                "-t",
                "4",
                "/jobs/7/shot; rm -rf ~.blend",
                "--python-exit-code",
                "3",
                "--python-expr",
                "print(1)",
                "--",
                "cfg.json"
            ]
        );
        let module = Runtime::Module("/venv/bin/python".into());
        let cmd = module.command(Some(blend), "print(1)", &["cfg.json"], 4);
        let a = args(&cmd);
        // Isolated, and writing no bytecode into the build.
        assert_eq!(a[..3], ["-I", "-B", "-c"]);
        let prelude = a[3].find("read_factory_settings").unwrap();
        let open = a[3].find("open_mainfile(filepath=_blend, load_ui=False, use_scripts=False)");
        assert!(
            open.is_some_and(|o| o > prelude),
            "factory settings, then open without scripts"
        );
        assert_eq!(
            a[4..],
            [
                "--",
                "/jobs/7/shot; rm -rf ~.blend",
                "4",
                "",
                "print(1)",
                "cfg.json"
            ]
        );
    }

    #[test]
    fn auto_device_prefers_optix_then_cuda_then_hip_then_oneapi() {
        let d = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(auto_device(&d(&[])), "CPU");
        assert_eq!(auto_device(&d(&["CUDA: H100", "OPTIX: H100"])), "OPTIX");
        assert_eq!(auto_device(&d(&["HIP: MI300", "ONEAPI: Arc"])), "HIP");
        assert_eq!(auto_device(&d(&["ONEAPI: Arc"])), "ONEAPI");
    }
}

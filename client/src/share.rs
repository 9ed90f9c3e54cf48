//! What `submit` may upload: only what the artist meant to share. A scene
//! names its files itself (a `.blend`'s images, libraries, caches; an
//! Unreal project's folders), and a scene from someone else can name any
//! file the artist can read (`~/.ssh/id_rsa`). So a referenced file is
//! uploaded only when its real path (symbolic links resolved) lies
//!
//! - under the **project root**: the scene's folder, or `--project-root`;
//! - under an **asset root** the studio names: `--asset-root DIR`
//!   (repeatable), `TESSERA_ASSET_ROOTS` (a `:`-separated list) and
//!   `asset_roots = [...]` in the client config file ([`config_path`]);
//! - or is named one by one with `--allow-file PATH`.
//!
//! Private places are refused even under an asset root: a hidden entry of
//! a home directory (`~/.ssh`, `~/.aws`, `~/.config`, `~/.netrc` …, of
//! this user or any other) and anything in another user's home directory.
//! Only `--allow-file` shares a file there, or a project root that lies
//! there itself (the artist chose the scene's folder by naming the scene;
//! its own files travel, nothing else of that place).
//!
//! Files Blender ships (`…/4.5/datafiles/…`: brushes, fonts, the asset
//! bundles a default scene references) are never uploaded and never
//! warned about: the worker's own Blender has them ([`blender_own`]).

use std::collections::HashSet;
use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context};
use serde::Deserialize;

/// The environment variable naming asset roots (`:`-separated).
pub const ASSET_ROOTS_ENV: &str = "TESSERA_ASSET_ROOTS";
/// The environment variable naming the client config file.
pub const CONFIG_ENV: &str = "TESSERA_CONFIG";
/// The largest client config file read, and the most asset roots and
/// allowed files a submit takes.
pub const MAX_CONFIG_BYTES: u64 = 64 * 1024;
pub const MAX_ROOTS: usize = 256;
/// The most refused files named one by one in the error (the count says
/// how many more there are).
pub const MAX_NAMED: usize = 100;
/// The most of `/etc/passwd` read to find home directories.
const MAX_PASSWD_BYTES: u64 = 4 << 20;
/// The most entries of `/home` looked at.
const MAX_HOME_ENTRIES: usize = 10_000;

/// What the command line says about sharing, before the environment and
/// the config file are added ([`ShareOptions::with_studio_roots`]).
#[derive(Debug, Clone, Default)]
pub struct ShareOptions {
    /// `--project-root`: default, the scene's folder.
    pub project_root: Option<PathBuf>,
    /// Asset roots and where each was named (`--asset-root`,
    /// `TESSERA_ASSET_ROOTS`, the config file).
    pub asset_roots: Vec<(PathBuf, String)>,
    /// `--allow-file`.
    pub allow_files: Vec<PathBuf>,
}

/// The client config file: `asset_roots = ["/studio/assets"]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default)]
    asset_roots: Vec<PathBuf>,
}

/// The client config file: `$TESSERA_CONFIG`, else
/// `$XDG_CONFIG_HOME/tessera/client.toml`, else
/// `~/.config/tessera/client.toml`. Whether it must exist: only when named
/// by `TESSERA_CONFIG`.
pub fn config_path() -> Option<(PathBuf, bool)> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
    if let Some(p) = var(CONFIG_ENV) {
        return Some((PathBuf::from(p), true));
    }
    let base = var("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .or_else(|| var("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some((base.join("tessera/client.toml"), false))
}

impl ShareOptions {
    /// Adds the asset roots of `TESSERA_ASSET_ROOTS` and of the config
    /// file to those of the command line.
    pub fn with_studio_roots(mut self) -> anyhow::Result<ShareOptions> {
        if let Some(list) = std::env::var_os(ASSET_ROOTS_ENV) {
            for p in std::env::split_paths(&list).filter(|p| !p.as_os_str().is_empty()) {
                (self.asset_roots).push((p, ASSET_ROOTS_ENV.to_string()));
            }
        }
        if let Some((path, must)) = config_path() {
            for p in read_config(&path, must)?.asset_roots {
                let from = format!("asset_roots in {}", path.display());
                self.asset_roots.push((p, from));
            }
        }
        if self.asset_roots.len() > MAX_ROOTS || self.allow_files.len() > MAX_ROOTS {
            bail!("at most {MAX_ROOTS} asset roots and {MAX_ROOTS} --allow-file are taken");
        }
        Ok(self)
    }
}

fn read_config(path: &Path, must: bool) -> anyhow::Result<Config> {
    use std::io::Read;
    let file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !must => return Ok(Config::default()),
        Err(e) => bail!("cannot read the client config {}: {e}", path.display()),
    };
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES + 1)
        .read_to_string(&mut text)
        .with_context(|| format!("cannot read the client config {}", path.display()))?;
    if text.len() as u64 > MAX_CONFIG_BYTES {
        bail!(
            "the client config {} is larger than {MAX_CONFIG_BYTES} bytes",
            path.display()
        );
    }
    let config: Config = toml::from_str(&text)
        .map_err(|e| anyhow::anyhow!("the client config {}: {e}", path.display()))?;
    if let Some(p) = config.asset_roots.iter().find(|p| !p.is_absolute()) {
        bail!(
            "the client config {}: asset root `{}` is not an absolute path",
            path.display(),
            p.display()
        );
    }
    Ok(config)
}

/// Where submit may read files from, resolved on this disk.
#[derive(Debug, Clone)]
pub struct Sharing {
    project: PathBuf,
    roots: Vec<PathBuf>,
    allowed: HashSet<PathBuf>,
    homes: Homes,
}

/// Why a file is not uploaded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Outside the project root and every asset root.
    Outside,
    /// In a hidden entry of a home directory (the entry).
    Hidden(PathBuf),
    /// In another user's home directory (that directory).
    OtherUser(PathBuf),
}

/// A refused file: its path as the scene names it, and what uses it.
#[derive(Debug, Clone)]
pub struct Refused {
    pub path: String,
    pub used_by: String,
    pub why: Refusal,
}

impl Sharing {
    /// The policy for a scene at `scene` (a file), with `opts`.
    pub fn new(scene: &Path, opts: &ShareOptions) -> anyhow::Result<Sharing> {
        Sharing::with_homes(scene, opts, Homes::of_this_machine())
    }

    fn with_homes(scene: &Path, opts: &ShareOptions, homes: Homes) -> anyhow::Result<Sharing> {
        let scene = std::fs::canonicalize(scene)
            .with_context(|| format!("scene `{}` cannot be read", scene.display()))?;
        let project = match &opts.project_root {
            Some(root) => {
                let real = real_dir(root).map_err(|e| {
                    crate::exit::usage(format!("--project-root {}: {e}", root.display()))
                })?;
                if !scene.starts_with(&real) {
                    return Err(crate::exit::usage(format!(
                        "--project-root {} does not hold the scene `{}`",
                        root.display(),
                        scene.display()
                    )));
                }
                real
            }
            None => scene
                .parent()
                .context("a scene lies in a folder")?
                .to_path_buf(),
        };
        let mut roots = Vec::new();
        for (root, from) in &opts.asset_roots {
            match real_dir(root) {
                Ok(real) => roots.push(real),
                Err(e) if from == "--asset-root" => {
                    return Err(crate::exit::usage(format!(
                        "--asset-root {}: {e}",
                        root.display()
                    )))
                }
                // A studio's list may name a share this machine lacks now:
                // left out (a refusal names the roots in effect).
                Err(e) => {
                    tracing::debug!("asset root {} (from {from}) left out: {e}", root.display())
                }
            }
        }
        let mut allowed = HashSet::new();
        for f in &opts.allow_files {
            let real = std::fs::canonicalize(f)
                .ok()
                .filter(|r| r.is_file())
                .ok_or_else(|| {
                    crate::exit::usage(format!("--allow-file {}: no such file", f.display()))
                })?;
            allowed.insert(real);
        }
        Ok(Sharing {
            project,
            roots,
            allowed,
            homes,
        })
    }

    /// Whether the file at `path` may be uploaded: its real path if so.
    pub fn check(&self, path: &Path) -> Result<PathBuf, Refusal> {
        let real = std::fs::canonicalize(path).map_err(|_| Refusal::Outside)?;
        self.check_real(real)
    }

    fn check_real(&self, real: PathBuf) -> Result<PathBuf, Refusal> {
        if self.allowed.contains(&real) {
            return Ok(real);
        }
        let in_project = real.starts_with(&self.project);
        let in_root = self.roots.iter().any(|r| real.starts_with(r));
        match self.homes.private(&real) {
            // The project root was chosen by naming the scene: its own
            // files travel even when it lies in such a place.
            Some(area) if !(in_project && self.project.starts_with(area.path())) => Err(area),
            _ if in_project || in_root => Ok(real),
            _ => Err(Refusal::Outside),
        }
    }

    /// The error for `refused` (non-empty), naming each (up to
    /// [`MAX_NAMED`]) with what uses it and why, and how to share them.
    pub fn refusal(&self, refused: &[Refused], nothing: &str) -> anyhow::Error {
        let shown = |s: &str| crate::shown::text(s);
        let mut named: Vec<String> = (refused.iter().take(MAX_NAMED))
            .map(|r| {
                let why = match &r.why {
                    Refusal::Outside => String::new(),
                    Refusal::Hidden(p) => format!(
                        "; in {}, a hidden folder of a home directory: only --allow-file shares it",
                        shown(&p.to_string_lossy())
                    ),
                    Refusal::OtherUser(p) => format!(
                        "; in {}, another user's home directory: only --allow-file shares it",
                        shown(&p.to_string_lossy())
                    ),
                };
                format!("{} ({}{why})", shown(&r.path), shown(&r.used_by))
            })
            .collect();
        if refused.len() > MAX_NAMED {
            named.push(format!("and {} more", refused.len() - MAX_NAMED));
        }
        let roots = if self.roots.is_empty() {
            "none named".to_string()
        } else {
            let r: Vec<String> = (self.roots.iter())
                .map(|r| r.display().to_string())
                .collect();
            r.join(", ")
        };
        let config = config_path().map_or("the client config".to_string(), |(p, _)| {
            format!("asset_roots in {}", p.display())
        });
        anyhow::anyhow!(
            "{} file(s) the scene uses lie outside the project {} and the asset roots ({roots}), so they are not shared; {nothing}: {}. To share them: --asset-root DIR for a folder of assets (also {ASSET_ROOTS_ENV} or {config}), --project-root DIR for a project above the scene's folder, or --allow-file PATH for one file",
            refused.len(),
            self.project.display(),
            named.join(", ")
        )
    }
}

impl Refusal {
    fn path(&self) -> &Path {
        match self {
            Refusal::Outside => Path::new("/"),
            Refusal::Hidden(p) | Refusal::OtherUser(p) => p,
        }
    }
}

/// `dir`, made real (symbolic links resolved); it must be a folder.
fn real_dir(dir: &Path) -> Result<PathBuf, String> {
    match std::fs::canonicalize(dir) {
        Ok(real) if real.is_dir() => Ok(real),
        Ok(_) => Err("not a folder".into()),
        Err(e) => Err(e.to_string()),
    }
}

/// Home directories on this machine: this user's (`$HOME` and the
/// password database's) and other users' (`/root`, `/home/*`, and the
/// password database's users from uid 1000 on).
#[derive(Debug, Clone, Default)]
struct Homes {
    mine: Vec<PathBuf>,
    others: Vec<PathBuf>,
}

impl Homes {
    fn of_this_machine() -> Homes {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let me = unsafe { libc::geteuid() };
        let mut mine = Vec::new();
        let mut others = vec![PathBuf::from("/root")];
        if let Some(h) = std::env::var_os("HOME").map(PathBuf::from) {
            mine.push(h);
        }
        for (uid, home) in passwd_homes() {
            if uid == me {
                mine.push(home);
            } else if uid == 0 || (1000..65534).contains(&uid) {
                others.push(home);
            }
        }
        if let Ok(entries) = std::fs::read_dir("/home") {
            others.extend(
                entries
                    .take(MAX_HOME_ENTRIES)
                    .filter_map(|e| e.ok())
                    .map(|e| e.path()),
            );
        }
        Homes::from_lists(mine, others)
    }

    /// Real paths; `/` is no home, and a home of this user is never
    /// another's (nor is a folder holding one of this user's homes).
    fn from_lists(mine: Vec<PathBuf>, others: Vec<PathBuf>) -> Homes {
        let real = |v: Vec<PathBuf>| -> Vec<PathBuf> {
            let mut out: Vec<PathBuf> = (v.into_iter())
                .filter(|p| p.is_absolute())
                .filter_map(|p| std::fs::canonicalize(p).ok())
                .filter(|p| p.parent().is_some() && p.is_dir())
                .collect();
            out.sort();
            out.dedup();
            out
        };
        let mine = real(mine);
        let others = (real(others).into_iter())
            .filter(|o| !mine.iter().any(|m| m.starts_with(o)))
            .collect();
        Homes { mine, others }
    }

    /// The private place `real` lies in, if any.
    fn private(&self, real: &Path) -> Option<Refusal> {
        for home in self.mine.iter().chain(&self.others) {
            if let Ok(rest) = real.strip_prefix(home) {
                if let Some(Component::Normal(first)) = rest.components().next() {
                    if first.as_encoded_bytes().starts_with(b".") {
                        return Some(Refusal::Hidden(home.join(first)));
                    }
                }
            }
        }
        (self.others.iter())
            .find(|h| real.starts_with(h))
            .map(|h| Refusal::OtherUser(h.clone()))
    }
}

/// (uid, home) of each user in `/etc/passwd` (bounded).
fn passwd_homes() -> Vec<(u32, PathBuf)> {
    use std::io::Read;
    let mut text = String::new();
    let Ok(f) = std::fs::File::open("/etc/passwd") else {
        return Vec::new();
    };
    if f.take(MAX_PASSWD_BYTES).read_to_string(&mut text).is_err() {
        return Vec::new();
    }
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            let uid = f.get(2)?.parse().ok()?;
            let home = f.get(5).filter(|h| h.starts_with('/'))?;
            Some((uid, PathBuf::from(home)))
        })
        .collect()
}

/// Whether `path` is a file Blender ships: under a `X.Y/datafiles` folder
/// of an installation (`blender-4.5.4-linux-x64/4.5/datafiles/…`,
/// `bpy/4.5/datafiles/…`, `/usr/share/blender/3.4/datafiles/…`). A file
/// that exists here counts only when its `X.Y` folder is an installation's
/// (it holds `scripts` beside `datafiles`): a project's own
/// `assets/4.5/datafiles/…` is the artist's, and uploaded. One that does
/// not exist (a moved `.blend`'s relative reference to Blender's files
/// points elsewhere) counts by its path alone; the worker resolves it in its
/// own Blender, or renders it as missing, never from a file of its own. A
/// user's own Blender folder (`~/.config/blender/4.5/datafiles`) is not an
/// installation: it is checked like any file.
pub fn blender_own(path: &Path) -> bool {
    let version = |dir: &Path| {
        dir.file_name().and_then(|n| n.to_str()).is_some_and(|v| {
            v.split_once('.').is_some_and(|(a, b)| {
                [a, b]
                    .iter()
                    .all(|n| !n.is_empty() && n.len() <= 3 && n.bytes().all(|c| c.is_ascii_digit()))
            })
        })
    };
    let Some(release) = (path.ancestors())
        .filter(|a| a.file_name().is_some_and(|n| n == "datafiles"))
        .filter_map(Path::parent)
        .find(|parent| version(parent))
    else {
        return false;
    };
    let in_config = (release.components()).any(|c| c.as_os_str() == ".config");
    !in_config && (!path.exists() || release.join("scripts").is_dir())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn touch(p: &Path) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, b"x").unwrap();
    }

    /// The rules, on a made-up machine: a project, an asset root, a home
    /// of this user and one of another, and links between them.
    #[test]
    fn only_the_project_asset_roots_and_named_files_are_shared() {
        let dir = std::env::temp_dir().join(format!("tessera-share-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let d = |p: &str| dir.join(p);
        for f in [
            "proj/shot.blend",
            "proj/tex/a.png",
            "lib/wood.png",
            "elsewhere/b.png",
            "me/.ssh/id_rsa",
            "me/.netrc",
            "me/assets/c.png",
            "bob/d.png",
            "me/.hidden_proj/shot.blend",
            "me/.hidden_proj/e.png",
            "me/.hidden_proj/../.aws/credentials",
        ] {
            touch(&d(f));
        }
        std::os::unix::fs::symlink(d("me/.ssh/id_rsa"), d("proj/tex/key.png")).unwrap();
        std::os::unix::fs::symlink(d("lib"), d("proj/lib")).unwrap();
        let homes = Homes::from_lists(vec![d("me")], vec![d("bob"), PathBuf::from("/")]);
        let opts = ShareOptions {
            asset_roots: vec![(d("lib"), "--asset-root".into()), (d("me"), "x".into())],
            ..Default::default()
        };
        let s = Sharing::with_homes(&d("proj/shot.blend"), &opts, homes.clone()).unwrap();
        let real = |p: &str| std::fs::canonicalize(d(p)).unwrap();
        assert_eq!(s.check(&d("proj/tex/a.png")), Ok(real("proj/tex/a.png")));
        assert_eq!(s.check(&d("lib/wood.png")), Ok(real("lib/wood.png")));
        // Through a link in the project, to a shared place: its real path.
        assert_eq!(s.check(&d("proj/lib/wood.png")), Ok(real("lib/wood.png")));
        assert_eq!(s.check(&d("elsewhere/b.png")), Err(Refusal::Outside));
        assert_eq!(s.check(Path::new("/etc/hostname")), Err(Refusal::Outside));
        assert_eq!(s.check(&d("me/assets/c.png")), Ok(real("me/assets/c.png")));
        // Hidden entries of a home: refused under an asset root, and
        // through a link from the project.
        let ssh = Err(Refusal::Hidden(real("me/.ssh")));
        assert_eq!(s.check(&d("me/.ssh/id_rsa")), ssh);
        assert_eq!(s.check(&d("proj/tex/key.png")), ssh);
        assert_eq!(
            s.check(&d("me/.netrc")),
            Err(Refusal::Hidden(real("me/.netrc")))
        );
        // Another user's home, even as an asset root.
        let opts_bob = ShareOptions {
            asset_roots: vec![(d("bob"), "--asset-root".into())],
            ..Default::default()
        };
        let sb = Sharing::with_homes(&d("proj/shot.blend"), &opts_bob, homes.clone()).unwrap();
        assert_eq!(
            sb.check(&d("bob/d.png")),
            Err(Refusal::OtherUser(real("bob")))
        );
        // Named one by one, they travel.
        let opts_named = ShareOptions {
            allow_files: vec![d("bob/d.png"), d("me/.ssh/id_rsa")],
            ..Default::default()
        };
        let sn = Sharing::with_homes(&d("proj/shot.blend"), &opts_named, homes.clone()).unwrap();
        assert_eq!(sn.check(&d("bob/d.png")), Ok(real("bob/d.png")));
        assert_eq!(sn.check(&d("proj/tex/key.png")), Ok(real("me/.ssh/id_rsa")));
        // A project inside a hidden folder shares its own files, nothing
        // else of that place.
        let sh = Sharing::with_homes(
            &d("me/.hidden_proj/shot.blend"),
            &ShareOptions::default(),
            homes.clone(),
        )
        .unwrap();
        assert_eq!(
            sh.check(&d("me/.hidden_proj/e.png")),
            Ok(real("me/.hidden_proj/e.png"))
        );
        assert_eq!(
            sh.check(&d("me/.aws/credentials")),
            Err(Refusal::Hidden(real("me/.aws")))
        );
        // Outside every root too: said so, since no asset root would share it.
        assert_eq!(
            s.check(&d("bob/d.png")),
            Err(Refusal::OtherUser(real("bob")))
        );
        // --project-root must hold the scene; roots must exist.
        let bad = ShareOptions {
            project_root: Some(d("lib")),
            ..Default::default()
        };
        assert!(Sharing::with_homes(&d("proj/shot.blend"), &bad, homes.clone()).is_err());
        let up = ShareOptions {
            project_root: Some(dir.clone()),
            ..Default::default()
        };
        let su = Sharing::with_homes(&d("proj/shot.blend"), &up, homes.clone()).unwrap();
        assert_eq!(su.check(&d("elsewhere/b.png")), Ok(real("elsewhere/b.png")));
        // The project root lies over a home here: its hidden folders are
        // still refused.
        assert_eq!(su.check(&d("me/.ssh/id_rsa")), ssh);
        let missing = ShareOptions {
            asset_roots: vec![(d("nope"), "--asset-root".into())],
            ..Default::default()
        };
        assert!(Sharing::with_homes(&d("proj/shot.blend"), &missing, homes.clone()).is_err());
        let missing_env = ShareOptions {
            asset_roots: vec![(d("nope"), ASSET_ROOTS_ENV.into())],
            ..Default::default()
        };
        assert!(Sharing::with_homes(&d("proj/shot.blend"), &missing_env, homes).is_ok());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn files_blender_ships_are_recognised_wherever_they_are() {
        for (p, own) in [
            ("/opt/blender-4.5.4-linux-x64/4.5/datafiles/assets/brushes/essentials_brushes-gp_draw.blend", true),
            ("/tmp/moved/root/.cache/bpy/lib/python3.11/site-packages/bpy/4.5/datafiles/assets/brushes/b.blend", true),
            ("/usr/share/blender/3.4/datafiles/fonts/x.ttf", true),
            ("/home/a/.config/blender/4.5/datafiles/brushes/mine.blend", false),
            ("/home/a/proj/4.5/textures/datafiles/x.png", false),
            ("/home/a/proj/v4.5/datafiles/x.png", false),
            ("/home/a/proj/tex.png", false),
        ] {
            assert_eq!(blender_own(Path::new(p)), own, "{p}");
        }
        // A file that exists counts only in an installation: a project's
        // own `4.5/datafiles` folder is the artist's.
        let dir = std::env::temp_dir().join(format!("tessera-own-{}", std::process::id()));
        let project = dir.join("proj/assets/4.5/datafiles/tex.png");
        touch(&project);
        assert!(
            !blender_own(&project),
            "a project file was taken for Blender's"
        );
        let install = dir.join("blender-4.5.4/4.5/datafiles/fonts/f.ttf");
        touch(&install);
        std::fs::create_dir_all(dir.join("blender-4.5.4/4.5/scripts")).unwrap();
        assert!(blender_own(&install));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn the_config_file_names_absolute_asset_roots_and_nothing_else() {
        let dir = std::env::temp_dir().join(format!("tessera-share-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("client.toml");
        std::fs::write(&f, "asset_roots = [\"/studio/assets\", \"/mnt/lib\"]\n").unwrap();
        let c = read_config(&f, true).unwrap();
        assert_eq!(
            c.asset_roots,
            [PathBuf::from("/studio/assets"), PathBuf::from("/mnt/lib")]
        );
        std::fs::write(&f, "asset_root = [\"/a\"]\n").unwrap();
        assert!(read_config(&f, true).is_err(), "a misspelt key is an error");
        std::fs::write(&f, "asset_roots = [\"rel\"]\n").unwrap();
        assert!(read_config(&f, true).is_err());
        std::fs::write(&f, vec![b'#'; MAX_CONFIG_BYTES as usize + 1]).unwrap();
        assert!(read_config(&f, true).is_err());
        assert!(read_config(&dir.join("none.toml"), false).is_ok());
        assert!(read_config(&dir.join("none.toml"), true).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}

//! The client side of an Unreal job: which files of a `.uproject`'s folder
//! travel (`Content/`, `Config/`, `Plugins/` and the `.uproject` itself;
//! never `Saved/`, `Intermediate/` or `DerivedDataCache/`, at any depth),
//! that the assets the job names are there, and the shots and chunks the
//! job splits into. Large files go by the existing chunked dedupe, so an
//! edited `.umap` sends only its changed chunks.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use tessera_protocol::job::{parse_frames, OutputFormat};
use tessera_protocol::unreal::{content_path, Shot, UnrealJob};

use crate::client::SceneFile;
use crate::share::Sharing;

/// Top-level folders of a project that travel.
const UPLOADED: [&str; 3] = ["Content", "Config", "Plugins"];
/// Folders that never travel, wherever they are: Unreal makes them again.
const NEVER: [&str; 3] = ["Saved", "Intermediate", "DerivedDataCache"];

/// What the user asked for an Unreal job (`tessera submit X.uproject …`).
#[derive(Debug, Clone, Default)]
pub struct UnrealOptions {
    pub level_sequence: Option<String>,
    pub map: Option<String>,
    pub mrq_config: Option<String>,
    /// `--shots sh010=1-40,sh020=41-90`: the sequence's camera cuts.
    pub shots: Option<String>,
    /// `--chunk N`: frames per task (0: one task per shot).
    pub chunk: u32,
    /// `--warm-up N`: frames rendered and discarded before a chunk.
    pub warm_up: u32,
    pub format: Option<OutputFormat>,
    pub file_name_format: Option<String>,
    pub zero_pad: Option<u32>,
    pub resolution: Option<(u32, u32)>,
}

/// An Unreal project, scanned.
pub struct Project {
    pub frames: Vec<u32>,
    /// The `.uproject` first, then every file that travels.
    pub files: Vec<SceneFile>,
    pub unreal: UnrealJob,
    pub output: OutputFormat,
    pub resolution: (u32, u32),
}

/// `sh010=1-40,sh020=41-90`.
pub fn parse_shots(s: &str) -> Result<Vec<Shot>, String> {
    s.split(',')
        .map(|part| {
            let bad =
                || format!("`{part}` is not a shot: expected NAME=FIRST-LAST, e.g. sh010=1-40");
            let (name, span) = part.trim().split_once('=').ok_or_else(bad)?;
            let (a, b) = span.split_once('-').ok_or_else(bad)?;
            Ok(Shot {
                name: name.trim().to_string(),
                first: a.trim().parse().map_err(|_| bad())?,
                last: b.trim().parse().map_err(|_| bad())?,
            })
        })
        .collect()
}

/// Reads the job from the options and the project folder; refuses a job
/// whose sequence, map or config is not in `Content/`, naming the asset.
pub fn scan(
    uproject: &Path,
    frames: Option<&str>,
    o: &UnrealOptions,
    sharing: &Sharing,
) -> anyhow::Result<Project> {
    let need = |v: &Option<String>, flag: &str| {
        v.clone()
            .with_context(|| format!("an Unreal project needs {flag}; nothing was uploaded"))
    };
    let level_sequence = need(&o.level_sequence, "--level-sequence /Game/...")?;
    let map = need(&o.map, "--map /Game/...")?;
    let config = need(
        &o.mrq_config,
        "--mrq-config /Game/... (a Movie Render Queue preset)",
    )?;
    let dir = uproject.parent().unwrap_or(Path::new("."));
    for (what, path, ext) in [
        ("level sequence", &level_sequence, "uasset"),
        ("map", &map, "umap"),
        ("Movie Render Queue config", &config, "uasset"),
    ] {
        let file = content_path(path, ext).map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
        if !dir.join(&file).is_file() {
            bail!(
                "the {what} `{path}` is not in the project: {} does not exist; nothing was uploaded",
                dir.join(&file).display()
            );
        }
    }
    let shots = match &o.shots {
        Some(s) => parse_shots(s).map_err(anyhow::Error::msg)?,
        None => Vec::new(),
    };
    let frames = match (frames, shots.is_empty()) {
        (Some(f), _) => parse_frames(f).map_err(anyhow::Error::msg)?,
        (None, false) => {
            let spans: Vec<String> = shots.iter().map(|s| format!("{}-{}", s.first, s.last)).collect();
            parse_frames(&spans.join(",")).map_err(anyhow::Error::msg)?
        }
        (None, true) => bail!(
            "an Unreal job needs --frames (or --shots): Tessera cannot read the sequence's range from its .uasset; nothing was uploaded"
        ),
    };
    let unreal = UnrealJob {
        level_sequence,
        map,
        config,
        shots,
        chunk: o.chunk,
        warm_up: o.warm_up,
        file_name_format: (o.file_name_format.clone())
            .unwrap_or_else(|| tessera_protocol::unreal::DEFAULT_FILE_NAME_FORMAT.into()),
        zero_pad: o
            .zero_pad
            .unwrap_or(tessera_protocol::unreal::DEFAULT_ZERO_PAD),
    };
    let output = o.format.unwrap_or(OutputFormat::Png);
    unreal
        .check(&frames, output)
        .map_err(|e| anyhow::anyhow!("{e}; nothing was uploaded"))?;
    let name = uproject
        .file_name()
        .and_then(|n| n.to_str())
        .context("the project's file name is not UTF-8")?
        .to_string();
    let mut files = vec![SceneFile {
        job_path: name,
        on_disk: crate::client::real_path(uproject)?,
        origin: None,
    }];
    // A top-level folder that is a symbolic link is followed only where it
    // leads to a shared place (see `share.rs`); deeper links stay behind.
    let mut refused = Vec::new();
    for top in UPLOADED {
        let path = dir.join(top);
        let linked = std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_symlink());
        if !linked {
            walk(&path, top, sharing, &mut files, &mut refused)?;
            continue;
        }
        match sharing.check(&path) {
            Ok(real) if real.is_dir() => walk(&real, top, sharing, &mut files, &mut refused)?,
            Ok(_) => {}
            Err(why) => refused.push(crate::share::Refused {
                path: path.to_string_lossy().into_owned(),
                used_by: format!(
                    "a symbolic link to {}",
                    std::fs::read_link(&path).map_or("?".into(), |t| t.display().to_string())
                ),
                why,
            }),
        }
    }
    if !refused.is_empty() {
        return Err(sharing.refusal(&refused, "nothing was uploaded"));
    }
    Ok(Project {
        frames,
        files,
        unreal,
        output,
        resolution: o.resolution.unwrap_or((1920, 1080)),
    })
}

/// Adds every regular file under `dir` (job path `rel/...`), skipping the
/// folders Unreal makes again and anything that is not a plain file or
/// folder (symbolic links stay behind); a file `sharing` refuses (in a
/// home's hidden folder, say) goes to `refused`.
fn walk(
    dir: &Path,
    rel: &str,
    sharing: &Sharing,
    out: &mut Vec<SceneFile>,
    refused: &mut Vec<crate::share::Refused>,
) -> anyhow::Result<()> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    let mut entries: Vec<(String, PathBuf)> = entries
        .map(|e| {
            let e = e.with_context(|| format!("cannot list {}", dir.display()))?;
            let name = e.file_name().into_string().map_err(|n| {
                anyhow::anyhow!(
                    "`{}` in {} is not UTF-8",
                    n.to_string_lossy(),
                    dir.display()
                )
            })?;
            Ok((name, e.path()))
        })
        .collect::<anyhow::Result<_>>()?;
    entries.sort();
    for (name, path) in entries {
        let job_path = format!("{rel}/{name}");
        let meta = std::fs::symlink_metadata(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        if meta.is_dir() {
            if !NEVER.contains(&name.as_str()) {
                walk(&path, &job_path, sharing, out, refused)?;
            }
        } else if meta.is_file() {
            tessera_protocol::job::sanitize_manifest_path(&job_path)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            match sharing.check(&path) {
                Ok(real) => out.push(SceneFile {
                    job_path,
                    on_disk: real,
                    origin: None,
                }),
                Err(why) => refused.push(crate::share::Refused {
                    path: path.to_string_lossy().into_owned(),
                    used_by: format!("the project's {job_path}"),
                    why,
                }),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_content_config_plugins_and_the_project_travel() {
        let dir = std::env::temp_dir().join(format!("tessera-uproject-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for f in [
            "Film.uproject",
            "Content/Seq/Main.uasset",
            "Content/Maps/Main.umap",
            "Content/Cine/Config.uasset",
            "Config/DefaultEngine.ini",
            "Plugins/Fx/Fx.uplugin",
            "Plugins/Fx/Intermediate/junk.obj",
            "Saved/Logs/Film.log",
            "Intermediate/x.bin",
            "DerivedDataCache/a.ddp",
            "Content/DerivedDataCache/b.ddp",
            "Source/Film.cpp",
        ] {
            let p = dir.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, f).unwrap();
        }
        let mut o = UnrealOptions {
            level_sequence: Some("/Game/Seq/Main".into()),
            map: Some("/Game/Maps/Main".into()),
            mrq_config: Some("/Game/Cine/Config".into()),
            shots: Some("sh010=1-4,sh020=5-8".into()),
            ..Default::default()
        };
        let sharing = Sharing::new(&dir.join("Film.uproject"), &Default::default()).unwrap();
        let p = scan(&dir.join("Film.uproject"), None, &o, &sharing).unwrap();
        let paths: Vec<&str> = p.files.iter().map(|f| f.job_path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "Film.uproject",
                "Content/Cine/Config.uasset",
                "Content/Maps/Main.umap",
                "Content/Seq/Main.uasset",
                "Config/DefaultEngine.ini",
                "Plugins/Fx/Fx.uplugin"
            ]
        );
        assert_eq!(p.frames, (1..=8).collect::<Vec<_>>());
        o.level_sequence = Some("/Game/Seq/Missing".into());
        let err = scan(&dir.join("Film.uproject"), None, &o, &sharing)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("level sequence `/Game/Seq/Missing` is not in the project"),
            "{err}"
        );
        assert!(err.contains("Content/Seq/Missing.uasset"), "{err}");
        o.level_sequence = Some("/Game/Seq/Main".into());
        o.mrq_config = Some("/Game/Cine/Nope".into());
        let err = scan(&dir.join("Film.uproject"), None, &o, &sharing)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("Movie Render Queue config `/Game/Cine/Nope` is not in the project"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// `Plugins -> /somewhere/else`: refused and named, nothing of it
    /// listed; followed once its target is an asset root. A link deeper
    /// down stays behind either way.
    #[test]
    fn a_top_level_folder_linked_out_of_the_project_is_refused() {
        let root =
            std::env::temp_dir().join(format!("tessera-uproject-link-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let dir = root.join("Film");
        let elsewhere = root.join("elsewhere");
        for f in [
            "Film/Film.uproject",
            "Film/Content/Seq/Main.uasset",
            "Film/Content/Maps/Main.umap",
            "Film/Content/Cine/Config.uasset",
            "elsewhere/Fx/Fx.uplugin",
            "elsewhere/Fx/Content/Fx.uasset",
        ] {
            let p = root.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, f).unwrap();
        }
        std::os::unix::fs::symlink(&elsewhere, dir.join("Plugins")).unwrap();
        std::os::unix::fs::symlink(elsewhere.join("Fx"), dir.join("Content/Fx")).unwrap();
        let o = UnrealOptions {
            level_sequence: Some("/Game/Seq/Main".into()),
            map: Some("/Game/Maps/Main".into()),
            mrq_config: Some("/Game/Cine/Config".into()),
            shots: Some("sh010=1-4".into()),
            ..Default::default()
        };
        let project = dir.join("Film.uproject");
        let sharing = Sharing::new(&project, &Default::default()).unwrap();
        let err = scan(&project, None, &o, &sharing)
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains(&format!(
                "{} (a symbolic link to {}",
                dir.join("Plugins").display(),
                elsewhere.display()
            )),
            "{err}"
        );
        assert!(err.contains("nothing was uploaded"), "{err}");
        let opts = crate::share::ShareOptions {
            asset_roots: vec![(elsewhere.clone(), "--asset-root".into())],
            ..Default::default()
        };
        let sharing = Sharing::new(&project, &opts).unwrap();
        let p = scan(&project, None, &o, &sharing).unwrap();
        let paths: Vec<&str> = p.files.iter().map(|f| f.job_path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "Film.uproject",
                "Content/Cine/Config.uasset",
                "Content/Maps/Main.umap",
                "Content/Seq/Main.uasset",
                "Plugins/Fx/Content/Fx.uasset",
                "Plugins/Fx/Fx.uplugin"
            ]
        );
        let _ = std::fs::remove_dir_all(&root);
    }
}

//! The `.blend`, frames, output names and format of a Blender command
//! line.

use super::*;

/// What a Blender command line renders: its `.blend`, frames, how
/// `--render-output` names them and the `--render-format` they are in.
pub(super) struct Rendered {
    pub(super) scene: PathBuf,
    pub(super) frames: Option<String>,
    pub(super) output: Option<RenderOutput>,
    pub(super) format: Option<ImageFormat>,
}

/// The `.blend`, frames and output names of a Blender command line;
/// `out_dirs` are the values of the template's output-directory parameters.
pub(super) fn blender_options(
    field: &str,
    args: &[String],
    frame: Option<&(String, Vec<u32>)>,
    base: &Path,
    out_dirs: &[PathBuf],
    notes: &mut Vec<String>,
) -> Result<Rendered, String> {
    let mut scene: Option<PathBuf> = None;
    let (mut output, mut extension) = (None, true);
    let mut render_frames: Option<String> = None;
    let mut format = None;
    let (mut anim, mut start, mut end, mut jump) = (false, None, None, None);
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "-b" | "--background" | "--factory-startup" | "--disable-autoexec" | "-noaudio"
            | "--noaudio" => {}
            "-x" | "--use-extension" => {
                extension = match next_value(&mut it, field, arg)?.trim() {
                    "1" => true,
                    "0" => false,
                    v => return Err(format!("{field}: `{arg} {v}`: expected 0 or 1")),
                };
            }
            "-o" | "--render-output" => output = Some(next_value(&mut it, field, arg)?),
            "-t" | "--threads" => {
                next_value(&mut it, field, arg)?;
                notes.push(format!("{field}: `{arg}` is not used: each worker sets its own render threads"));
            }
            "-f" | "--render-frame" => render_frames = Some(next_value(&mut it, field, arg)?),
            "-a" | "--render-anim" => anim = true,
            "-s" | "--frame-start" => start = Some(next_value(&mut it, field, arg)?),
            "-e" | "--frame-end" => end = Some(next_value(&mut it, field, arg)?),
            "-j" | "--frame-jump" => jump = Some(next_value(&mut it, field, arg)?),
            "-F" | "--render-format" => {
                let v = next_value(&mut it, field, arg)?;
                if v.contains(FRAME) {
                    return Err(format!("{field}: `{arg}` must not depend on the task parameter"));
                }
                format = Some(v.parse::<ImageFormat>().map_err(|e| {
                    format!("{field}: `{arg}` {e} (other formats: set them in the .blend file and drop `{arg}`)")
                })?);
            }
            "-E" | "--engine" | "-S" | "--scene" => {
                return Err(format!("{field}: `{arg}` cannot be mapped: Tessera renders the .blend file's own scene and engine; set them there"))
            }
            "-P" | "--python" | "--python-expr" | "--python-text" | "--python-console"
            | "-y" | "--enable-autoexec" | "--addons" => {
                return Err(format!("{field}: `{arg}` runs Python; Tessera never runs a template's or a file's scripts"))
            }
            "--" => cycles_options(field, it.by_ref(), notes)?,
            a if !a.starts_with('-') && a.to_ascii_lowercase().ends_with(".blend") => {
                if scene.is_some() {
                    return Err(format!("{field}: names two .blend files; make each a step of its own"));
                }
                if a.contains(FRAME) {
                    return Err(format!("{field}: the .blend path depends on the frame parameter"));
                }
                let p = PathBuf::from(a);
                scene = Some(if p.is_relative() { base.join(p) } else { p });
            }
            other => {
                return Err(format!(
                    "{field}: `{}` cannot be mapped to a Tessera job",
                    other.replace(FRAME, "{{frame}}")
                ))
            }
        }
    }
    let scene = scene.ok_or_else(|| format!("{field}: names no .blend file"))?;
    let task_frames = || frame.map(|(_, f)| frame_list(f));
    let frames = match (render_frames, anim) {
        (Some(_), true) => return Err(format!("{field}: both --render-frame and --render-anim")),
        (Some(f), false) if f == FRAME => task_frames(),
        (Some(f), false) if f.contains(FRAME) => {
            return Err(format!(
                "{field}: --render-frame `{}` must be the frame parameter alone",
                f.replace(FRAME, "{{frame}}")
            ))
        }
        (Some(f), false) => {
            Some(blender_frames(&f).map_err(|e| format!("{field}: --render-frame {e}"))?)
        }
        (None, true) => anim_frames(field, [start, end, jump], task_frames)?,
        (None, false) => {
            return Err(format!(
                "{field}: renders no frame: give --render-frame or --render-anim"
            ))
        }
    };
    if let (Some((name, _)), false) = (frame, args.iter().any(|a| a.contains(FRAME))) {
        return Err(format!("{field}: the task parameter {name} is not used by the Blender command, so every task would render the same frames"));
    }
    let output = match output {
        Some(o) => Some(render_output(field, &o, out_dirs, extension)?),
        None => None,
    };
    Ok(Rendered {
        scene,
        frames,
        output,
        format,
    })
}

/// `--render-output PATTERN`: a path under one of `out_dirs` (the
/// template's output-directory parameters) or relative (`./frames/f-####`,
/// Blender's `//frames/f-####`), without `..`; its last part names the
/// frames (`####` appended when it has no `#`, as Blender does).
pub(super) fn render_output(
    field: &str,
    pattern: &str,
    out_dirs: &[PathBuf],
    extension: bool,
) -> Result<RenderOutput, String> {
    let (root, subdir, mut name) = output_path(field, "--render-output", pattern, out_dirs)?;
    if !name.contains('#') {
        name.push_str("####");
    }
    Ok(RenderOutput {
        root,
        subdir,
        name,
        extension,
    })
}

/// A path a step writes (`opt` names the option it came with, for
/// errors): under one of `out_dirs` or relative (`./x`, Blender's `//x`),
/// without `..`. Its root (the output-directory parameter's value, `None`
/// for a relative path), the folder under it (`/`-separated) and its last
/// part (empty for a path ending in `/`).
pub(super) fn output_path(
    field: &str,
    opt: &str,
    pattern: &str,
    out_dirs: &[PathBuf],
) -> Result<(Option<PathBuf>, String, String), String> {
    let shown = pattern.replace(FRAME, "{{frame}}");
    if pattern.contains(FRAME) || pattern.contains('\u{0}') {
        return Err(format!("{field}: {opt} `{shown}` must not depend on the task parameter; `#` stands for the frame"));
    }
    let path = Path::new(pattern);
    let (root, rest) = if let Some(r) = pattern.strip_prefix("//") {
        (None, r.to_string())
    } else if path.is_absolute() {
        let dir = out_dirs.iter().find(|d| path.starts_with(d)).ok_or_else(|| {
            format!("{field}: {opt} `{shown}` lies outside the template's output directory; write it under an output-directory parameter (a PATH with dataFlow: OUT, e.g. `{{{{Param.OutputDir}}}}/output_####`) or as a relative path")
        })?;
        // As a string, so that a trailing `/` (a folder, frames `####`) stays.
        let rest = match pattern.strip_prefix(&*dir.to_string_lossy()) {
            Some(r) => r.to_string(),
            None => path
                .strip_prefix(dir)
                .expect("checked")
                .to_string_lossy()
                .into_owned(),
        };
        (Some(dir.clone()), rest)
    } else {
        (None, pattern.to_string())
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in rest.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                return Err(format!(
                    "{field}: {opt} `{shown}` climbs out of the output directory with `..`"
                ))
            }
            p => parts.push(p),
        }
    }
    let name = if rest.ends_with('/') || parts.is_empty() {
        String::new()
    } else {
        parts.pop().expect("not empty").to_string()
    };
    if name.len() > tessera_protocol::job::MAX_OUTPUT_NAME - 8 {
        return Err(format!(
            "{field}: {opt} `{shown}`: the file name is too long"
        ));
    }
    Ok((root, parts.join("/"), name))
}

/// What follows `--` on a Blender command line: Cycles' own options, of
/// which only the device (decided by each worker) and stats are known.
fn cycles_options<'a>(
    field: &str,
    rest: impl Iterator<Item = &'a String>,
    notes: &mut Vec<String>,
) -> Result<(), String> {
    let mut r = rest;
    while let Some(a) = r.next() {
        if a.as_str() == "--cycles-device" {
            r.next();
            notes.push(format!(
                "{field}: `--cycles-device` is not used: each worker's --blender-device decides"
            ));
        } else if a.as_str() != "--cycles-print-stats" {
            return Err(format!("{field}: `{a}` after `--` cannot be mapped"));
        }
    }
    Ok(())
}

/// The frames of `--render-anim` with `--frame-start`, `--frame-end` and
/// `--frame-jump` as given: the task parameter's frames when start and end
/// are it, the range they name, or none given, the file's own range.
fn anim_frames(
    field: &str,
    [start, end, jump]: [Option<String>; 3],
    task_frames: impl Fn() -> Option<String>,
) -> Result<Option<String>, String> {
    let is_frame = |v: &Option<String>| v.as_deref() == Some(FRAME);
    if is_frame(&start) && is_frame(&end) && jump.is_none() {
        return Ok(task_frames());
    }
    if [&start, &end, &jump]
        .iter()
        .any(|v| v.as_deref().is_some_and(|v| v.contains(FRAME)))
    {
        return Err(format!(
            "{field}: --frame-start and --frame-end must both be the frame parameter"
        ));
    }
    match (start, end) {
        (None, None) if jump.is_none() => Ok(None),
        (Some(s), Some(e)) => {
            let (s, e) = (frame_number(s.trim())?, frame_number(e.trim())?);
            let j = match jump {
                Some(j) => frame_number(j.trim())?.max(1),
                None => 1,
            };
            Ok(Some(frame_list(&(s..=e).step_by(j as usize).collect::<Vec<_>>())))
        }
        _ => Err(format!("{field}: with --render-anim give both --frame-start and --frame-end, or neither (the file's range)")),
    }
}

/// Blender's `--render-frame` syntax: `5`, `1..10`, `1,3,5`.
pub(super) fn blender_frames(s: &str) -> Result<String, String> {
    let mut frames = Vec::new();
    for part in s.split(',') {
        let part = part.trim();
        if part.starts_with('+') || part.starts_with('-') {
            return Err(format!(
                "`{part}`: frames relative to the file's end cannot be mapped"
            ));
        }
        match part.split_once("..") {
            Some((a, b)) => {
                let (a, b) = (frame_number(a.trim())?, frame_number(b.trim())?);
                if b < a {
                    return Err(format!("`{part}` ends before it starts"));
                }
                frames.extend(
                    a..=b.min(a.saturating_add(tessera_protocol::job::limits::MAX_FRAMES as u32)),
                );
            }
            None => frames.push(frame_number(part)?),
        }
    }
    Ok(frame_list(&frames))
}

/// Frames as a `--frames` list, runs folded (`1-10,12`).
pub(super) fn frame_list(frames: &[u32]) -> String {
    let mut sorted = frames.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        out.push(if j > i {
            format!("{}-{}", sorted[i], sorted[j])
        } else {
            sorted[i].to_string()
        });
        i = j + 1;
    }
    out.join(",")
}

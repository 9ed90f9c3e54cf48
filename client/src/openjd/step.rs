//! One step: its task parameters (the frame range) and its command
//! (Blender, or an ffmpeg encode).

use super::*;

pub(super) fn map_step(
    i: usize,
    step: &Value,
    params: &HashMap<String, ParamValue>,
    base: &Path,
    notes: &mut Vec<String>,
) -> Result<(Step, Vec<String>), String> {
    let name = text_of(step.get("name"), &format!("steps[{i}].name"))?;
    let at = format!("steps[{i}] ({name})");
    check_step_fields(&at, step)?;
    let frame = frame_parameter(&at, step.get("parameterSpace"), params)?;
    let host = match step.get("hostRequirements") {
        Some(v) => Some(host_requirements(&at, v)?).filter(|h| !h.is_empty()),
        None => None,
    };
    let script = step
        .get("script")
        .ok_or_else(|| format!("{at}.script: missing"))?;
    let files = embedded_files(&at, script)?;
    let on_run = script
        .get("actions")
        .and_then(|a| a.get("onRun"))
        .ok_or_else(|| format!("{at}.script.actions.onRun: missing"))?;
    if on_run.get("timeout").is_some() {
        return Err(format!("{at}.script.actions.onRun.timeout: Tessera has no per-task timeout; a stuck worker's lease expires instead (drop it)"));
    }
    let scope = Scope {
        params,
        frame: frame.as_ref().map(|(n, _)| n.as_str()),
        files: &files,
    };
    let command = scope.resolve(
        &text_of(
            on_run.get("command"),
            &format!("{at}.script.actions.onRun.command"),
        )?,
        &format!("{at}.script.actions.onRun.command"),
    )?;
    let mut args = Vec::new();
    for (k, a) in on_run
        .get("args")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .enumerate()
    {
        let field = format!("{at}.script.actions.onRun.args[{k}]");
        args.push(scope.resolve(&text_of(Some(a), &field)?, &field)?);
    }
    let (program, field, program_args) = step_command(&at, &command, &args, &files, &scope)?;
    let out_dirs: Vec<PathBuf> = (params.values())
        .filter(|p| p.out_dir && !p.value.is_empty())
        .map(|p| PathBuf::from(&p.value))
        .collect();
    let (rendered, encode) = match program {
        Program::Blender => {
            let r = blender_options(
                &field,
                &program_args,
                frame.as_ref(),
                base,
                &out_dirs,
                notes,
            )?;
            (r, None)
        }
        Program::Ffmpeg => {
            if let Some((name, _)) = &frame {
                return Err(format!("{at}.parameterSpace: an ffmpeg step encodes once; its task parameter {name} cannot be mapped (drop the parameterSpace)"));
            }
            let nothing = Rendered {
                scene: PathBuf::new(),
                frames: None,
                output: None,
                format: None,
            };
            let e = ffmpeg_options(&field, &program_args, &out_dirs)?;
            (nothing, Some(e))
        }
    };
    let Rendered {
        scene,
        frames,
        output,
        format,
    } = rendered;
    let after = dependencies(&at, step)?;
    Ok((
        Step {
            name,
            scene,
            frames,
            after: Vec::new(),
            output,
            format,
            encode,
            host,
        },
        after,
    ))
}

/// A step holds only the fields Tessera maps.
fn check_step_fields(at: &str, step: &Value) -> Result<(), String> {
    let obj = step
        .as_object()
        .ok_or_else(|| format!("{at}: expected a mapping"))?;
    for key in obj.keys() {
        match key.as_str() {
            "name" | "description" | "dependencies" | "parameterSpace" | "script"
            | "hostRequirements" => {}
            "stepEnvironments" => {
                return Err(format!("{at}.stepEnvironments: environments run their own commands around every task; Tessera runs only Blender and ffmpeg"))
            }
            other => return Err(format!("{at}.{other}: unknown field of a step")),
        }
    }
    Ok(())
}

/// The names of the steps a step depends on.
fn dependencies(at: &str, step: &Value) -> Result<Vec<String>, String> {
    (step.get("dependencies").and_then(Value::as_array))
        .into_iter()
        .flatten()
        .enumerate()
        .map(|(k, d)| {
            text_of(
                d.get("dependsOn"),
                &format!("{at}.dependencies[{k}].dependsOn"),
            )
        })
        .collect()
}

/// A step script's `embeddedFiles` (TEXT only), by name.
fn embedded_files(at: &str, script: &Value) -> Result<HashMap<String, String>, String> {
    let mut files = HashMap::new();
    if let Some(list) = script.get("embeddedFiles") {
        for (k, f) in list.as_array().into_iter().flatten().enumerate() {
            let fname = text_of(
                f.get("name"),
                &format!("{at}.script.embeddedFiles[{k}].name"),
            )?;
            let kind = f.get("type").and_then(Value::as_str).unwrap_or("TEXT");
            if kind != "TEXT" {
                return Err(format!(
                    "{at}.script.embeddedFiles[{k}] ({fname}).type: `{kind}` is not TEXT"
                ));
            }
            let data = text_of(
                f.get("data"),
                &format!("{at}.script.embeddedFiles[{k}] ({fname}).data"),
            )?;
            files.insert(fname, data);
        }
    }
    Ok(files)
}

/// The step's frame task parameter and its frames, if it has one: one INT
/// parameter (any other kind, or more than one, cannot be mapped).
pub(super) fn frame_parameter(
    at: &str,
    space: Option<&Value>,
    params: &HashMap<String, ParamValue>,
) -> Result<Option<(String, Vec<u32>)>, String> {
    let Some(space) = space else {
        return Ok(None);
    };
    let defs = space
        .get("taskParameterDefinitions")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("{at}.parameterSpace.taskParameterDefinitions: missing"))?;
    if defs.len() != 1 {
        return Err(format!("{at}.parameterSpace.taskParameterDefinitions: {} task parameters; Tessera maps one, an INT frame parameter", defs.len()));
    }
    let def = &defs[0];
    let field = format!("{at}.parameterSpace.taskParameterDefinitions[0]");
    let name = text_of(def.get("name"), &format!("{field}.name"))?;
    let field = format!("{field} ({name})");
    let kind = text_of(def.get("type"), &format!("{field}.type"))?;
    if kind != "INT" {
        return Err(format!("{field}.type: a {kind} task parameter cannot be mapped; Tessera maps an INT frame parameter"));
    }
    if let Some(c) = space.get("combination") {
        if c.as_str().map(str::trim) != Some(name.as_str()) {
            return Err(format!(
                "{at}.parameterSpace.combination: only the one frame parameter can be combined"
            ));
        }
    }
    let scope = Scope {
        params,
        frame: None,
        files: &HashMap::new(),
    };
    let range_field = format!("{field}.range");
    let mut frames = Vec::new();
    match def.get("range") {
        Some(Value::String(expr)) => {
            let expr = scope.resolve(expr, &range_field)?;
            frames = int_range_expr(&expr).map_err(|e| format!("{range_field}: {e}"))?;
        }
        Some(Value::Array(list)) => {
            for (k, v) in list.iter().enumerate() {
                let f = format!("{range_field}[{k}]");
                let s = scope.resolve(&text_of(Some(v), &f)?, &f)?;
                frames.push(frame_number(s.trim()).map_err(|e| format!("{f}: {e}"))?);
            }
        }
        _ => {
            return Err(format!(
                "{range_field}: expected a list or a range expression such as \"1-10\""
            ))
        }
    }
    frames.sort_unstable();
    frames.dedup();
    if frames.is_empty() {
        return Err(format!("{range_field}: no frames"));
    }
    if frames.len() > tessera_protocol::job::limits::MAX_FRAMES {
        return Err(format!(
            "{range_field}: more than {} frames",
            tessera_protocol::job::limits::MAX_FRAMES
        ));
    }
    Ok(Some((name, frames)))
}

pub(super) fn frame_number(s: &str) -> Result<u32, String> {
    let n: i64 = s.parse().map_err(|_| format!("`{s}` is not an integer"))?;
    u32::try_from(n).map_err(|_| format!("frame {n} is out of range (0 to {})", u32::MAX))
}

/// An OpenJD `IntRangeExpr`: `1-10`, `1-10:2`, `3`, comma-separated.
pub(super) fn int_range_expr(expr: &str) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    for part in expr.split(',') {
        let part = part.trim();
        let (range, step) = match part.split_once(':') {
            Some((r, s)) => {
                let s: i64 = s
                    .trim()
                    .parse()
                    .map_err(|_| format!("`{part}`: bad step"))?;
                if s == 0 {
                    return Err(format!("`{part}`: the step must not be 0"));
                }
                (r.trim(), s)
            }
            None => (part, 1),
        };
        // The dash between two integers (either may be negative).
        let dash = range
            .char_indices()
            .skip(1)
            .find(|&(i, c)| c == '-' && !range[..i].trim_end().ends_with('-'))
            .map(|(i, _)| i);
        let (a, b) = match dash {
            Some(i) => (range[..i].trim(), range[i + 1..].trim()),
            None => (range, range),
        };
        let (a, b): (i64, i64) = (
            a.parse()
                .map_err(|_| format!("`{part}` is not a range such as 1-10"))?,
            b.parse()
                .map_err(|_| format!("`{part}` is not a range such as 1-10"))?,
        );
        let mut f = a;
        loop {
            let done = if step > 0 { f > b } else { f < b };
            if done && f != a {
                break;
            }
            out.push(frame_number(&f.to_string())?);
            if out.len() > tessera_protocol::job::limits::MAX_FRAMES {
                return Err("too many frames".into());
            }
            if dash.is_none() {
                break;
            }
            f += step;
            if (step > 0 && f > b) || (step < 0 && f < b) {
                break;
            }
        }
    }
    Ok(out)
}

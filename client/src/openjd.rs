//! Open Job Description import (`tessera submit job.template.yaml`): a job
//! template of specification `jobtemplate-2023-09`, in YAML or JSON, whose
//! steps run Blender, becomes one Tessera job per step. Job parameters are
//! substituted (a value given with `--job-param NAME=VALUE`, else the
//! default); an INT task parameter that `--render-frame` names becomes the
//! job's frames; `dependencies` between steps become `--after`.
//!
//! A step's command is Blender itself, or a shell running one embedded
//! script whose only command (besides `set`, `mkdir` and `echo`) is
//! Blender. Whatever has no meaning on Tessera — environments, host
//! requirements, other commands, other task parameters, Blender options
//! that change what the `.blend` file says or run Python — is refused with
//! the field it was found in, never dropped silently. Nothing of the
//! template runs: it is read, and Blender is started by the workers as for
//! any `.blend` (scripts off).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde_json::Value;

/// The specification this reads.
pub const SPECIFICATION: &str = "jobtemplate-2023-09";

/// The largest template read (the specification caps most lists; this caps
/// the whole).
pub const MAX_TEMPLATE_BYTES: u64 = 1 << 20;

/// Stands for the frame task parameter inside a resolved argument.
const FRAME: &str = "\u{0}FRAME\u{0}";

/// A template turned into Tessera jobs, one per step.
#[derive(Debug, Clone, PartialEq)]
pub struct Imported {
    /// The job name the template gives (its `name`, resolved).
    pub name: String,
    /// In an order where every step comes after the steps it depends on.
    pub steps: Vec<Step>,
    /// What was read but has no effect here (a render output path, say).
    pub notes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub name: String,
    /// The `.blend` it renders.
    pub scene: PathBuf,
    /// A `--frames` list, or `None` for the file's own frame range.
    pub frames: Option<String>,
    /// Indices into [`Imported::steps`] of the steps it runs after.
    pub after: Vec<usize>,
}

/// Whether `path` names an OpenJD template rather than a scene: a `.yaml`
/// or `.yml` file, or a `.json` one that declares a specification version.
pub fn is_template(path: &Path) -> bool {
    let name = path.to_string_lossy().to_ascii_lowercase();
    if name.ends_with(".yaml") || name.ends_with(".yml") {
        return true;
    }
    if name.ends_with(".json") && !name.ends_with(".scene.json") {
        return std::fs::read_to_string(path).is_ok_and(|t| t.contains("specificationVersion"));
    }
    false
}

/// Reads and maps the template at `path`, with `params` (`NAME=VALUE`)
/// overriding its job parameters' defaults. Relative PATH values resolve
/// against the template's folder.
pub fn load(path: &Path, params: &[String]) -> anyhow::Result<Imported> {
    use anyhow::Context;
    let size = std::fs::metadata(path)
        .with_context(|| format!("cannot read {}", path.display()))?
        .len();
    if size > MAX_TEMPLATE_BYTES {
        anyhow::bail!(
            "{} is {size} bytes; a job template may have at most {MAX_TEMPLATE_BYTES}",
            path.display()
        );
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let base = path.parent().unwrap_or(Path::new("."));
    let base = if base.as_os_str().is_empty() {
        Path::new(".")
    } else {
        base
    };
    import(&text, base, params).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))
}

/// Maps a template's text (YAML or JSON); see [`load`].
pub fn import(text: &str, base: &Path, params: &[String]) -> Result<Imported, String> {
    let doc: Value = serde_yaml_ng::from_str(text)
        .map_err(|e| format!("not a YAML or JSON job template: {e}"))?;
    let root = doc
        .as_object()
        .ok_or("a job template is a mapping with specificationVersion, name and steps")?;
    let version = root.get("specificationVersion").and_then(Value::as_str);
    if version != Some(SPECIFICATION) {
        return Err(match version {
            Some(v) if v.starts_with("environment-") => format!(
                "specificationVersion: `{v}` is an environment template; Tessera imports job templates ({SPECIFICATION})"
            ),
            Some(v) => format!(
                "specificationVersion: `{v}` is not supported; Tessera reads {SPECIFICATION}"
            ),
            None => format!("specificationVersion: missing; expected `{SPECIFICATION}`"),
        });
    }
    for key in root.keys() {
        match key.as_str() {
            "specificationVersion" | "$schema" | "name" | "description"
            | "parameterDefinitions" | "steps" => {}
            "jobEnvironments" => {
                return Err("jobEnvironments: environments run their own commands around every task; Tessera runs only Blender (drop them, or render those steps elsewhere)".into())
            }
            other => return Err(format!("{other}: unknown field of a job template")),
        }
    }
    let values = job_parameters(root.get("parameterDefinitions"), base, params)?;
    let scope = Scope {
        params: &values,
        frame: None,
        files: &HashMap::new(),
    };
    let name = text_of(root.get("name"), "name")?;
    let name = scope.resolve(&name, "name")?;
    let steps = root
        .get("steps")
        .and_then(Value::as_array)
        .filter(|s| !s.is_empty())
        .ok_or("steps: a job template needs at least one step")?;
    let mut notes = Vec::new();
    let mut mapped = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        mapped.push(map_step(i, step, &values, base, &mut notes)?);
    }
    let steps = order(mapped)?;
    Ok(Imported { name, steps, notes })
}

/// A value of a job parameter: as given (`raw`) and as used (`value`; a
/// relative PATH resolved against the template's folder).
struct ParamValue {
    raw: String,
    value: String,
}

fn text_of(v: Option<&Value>, field: &str) -> Result<String, String> {
    match v {
        Some(Value::String(s)) => Ok(s.clone()),
        Some(Value::Number(n)) => Ok(n.to_string()),
        Some(Value::Bool(b)) => Ok(b.to_string()),
        Some(_) => Err(format!("{field}: expected a string")),
        None => Err(format!("{field}: missing")),
    }
}

fn job_parameters(
    defs: Option<&Value>,
    base: &Path,
    given: &[String],
) -> Result<HashMap<String, ParamValue>, String> {
    let mut overrides: BTreeMap<&str, &str> = BTreeMap::new();
    for g in given {
        let (k, v) = g
            .split_once('=')
            .ok_or_else(|| format!("--job-param `{g}`: expected NAME=VALUE"))?;
        overrides.insert(k.trim(), v);
    }
    let mut out = HashMap::new();
    let empty = Vec::new();
    let defs = match defs {
        None => &empty,
        Some(Value::Array(a)) => a,
        Some(_) => return Err("parameterDefinitions: expected a list".into()),
    };
    for (i, def) in defs.iter().enumerate() {
        let at = format!("parameterDefinitions[{i}]");
        let name = text_of(def.get("name"), &format!("{at}.name"))?;
        let at = format!("{at} ({name})");
        let kind = text_of(def.get("type"), &format!("{at}.type"))?;
        let raw = match overrides.remove(name.as_str()) {
            Some(v) => v.to_string(),
            None => match def.get("default") {
                Some(d) => text_of(Some(d), &format!("{at}.default"))?,
                None => return Err(format!("{at}: no default; pass --job-param {name}=VALUE")),
            },
        };
        match kind.as_str() {
            "STRING" | "PATH" => {}
            "INT" => {
                raw.trim()
                    .parse::<i64>()
                    .map_err(|_| format!("{at}: `{raw}` is not an integer"))?;
            }
            "FLOAT" => {
                raw.trim()
                    .parse::<f64>()
                    .map_err(|_| format!("{at}: `{raw}` is not a number"))?;
            }
            other => return Err(format!("{at}.type: `{other}` is not a job parameter type")),
        }
        if let Some(Value::Array(allowed)) = def.get("allowedValues") {
            let ok = allowed
                .iter()
                .any(|a| text_of(Some(a), "").is_ok_and(|a| a == raw));
            if !ok {
                return Err(format!("{at}: `{raw}` is not one of its allowedValues"));
            }
        }
        let value = if kind == "PATH" && !raw.is_empty() && Path::new(&raw).is_relative() {
            base.join(&raw).to_string_lossy().into_owned()
        } else {
            raw.clone()
        };
        out.insert(name, ParamValue { raw, value });
    }
    if let Some((name, _)) = overrides.into_iter().next() {
        return Err(format!(
            "--job-param {name}: the template defines no such parameter"
        ));
    }
    Ok(out)
}

/// What a format string may name where it is resolved.
struct Scope<'a> {
    params: &'a HashMap<String, ParamValue>,
    /// The frame task parameter's name, inside a step's script.
    frame: Option<&'a str>,
    /// Embedded files by name, inside a step's script.
    files: &'a HashMap<String, String>,
}

impl Scope<'_> {
    /// Resolves every `{{ NAME }}` of `s`; `field` names where it was, for
    /// errors.
    fn resolve(&self, s: &str, field: &str) -> Result<String, String> {
        let mut out = String::new();
        let mut rest = s;
        while let Some(start) = rest.find("{{") {
            out.push_str(&rest[..start]);
            let after = &rest[start + 2..];
            let end = after
                .find("}}")
                .ok_or_else(|| format!("{field}: `{{{{` without its `}}}}`"))?;
            let name = after[..end].trim();
            out.push_str(&self.value(name, field)?);
            rest = &after[end + 2..];
        }
        out.push_str(rest);
        Ok(out)
    }

    fn value(&self, name: &str, field: &str) -> Result<String, String> {
        if let Some(p) = name.strip_prefix("Param.") {
            if let Some(v) = self.params.get(p) {
                return Ok(v.value.clone());
            }
        } else if let Some(p) = name.strip_prefix("RawParam.") {
            if let Some(v) = self.params.get(p) {
                return Ok(v.raw.clone());
            }
        } else if let Some(p) =
            (name.strip_prefix("Task.Param.")).or_else(|| name.strip_prefix("Task.RawParam."))
        {
            if self.frame == Some(p) {
                return Ok(FRAME.to_string());
            }
        } else if let Some(f) = name.strip_prefix("Task.File.") {
            if self.files.contains_key(f) {
                return Ok(format!("\u{0}FILE:{f}\u{0}"));
            }
        } else if name.starts_with("Session.") {
            return Err(format!(
                "{field}: `{{{{{name}}}}}` names the worker's session, which a Tessera job has no use for"
            ));
        }
        Err(format!(
            "{field}: `{{{{{name}}}}}` names nothing this template defines"
        ))
    }
}

fn map_step(
    i: usize,
    step: &Value,
    params: &HashMap<String, ParamValue>,
    base: &Path,
    notes: &mut Vec<String>,
) -> Result<(Step, Vec<String>), String> {
    let name = text_of(step.get("name"), &format!("steps[{i}].name"))?;
    let at = format!("steps[{i}] ({name})");
    let obj = step
        .as_object()
        .ok_or_else(|| format!("{at}: expected a mapping"))?;
    for key in obj.keys() {
        match key.as_str() {
            "name" | "description" | "dependencies" | "parameterSpace" | "script" => {}
            "stepEnvironments" => {
                return Err(format!("{at}.stepEnvironments: environments run their own commands around every task; Tessera runs only Blender"))
            }
            "hostRequirements" => {
                return Err(format!("{at}.hostRequirements: Tessera matches jobs to workers by their Blender, not by host attributes or amounts; drop them"))
            }
            other => return Err(format!("{at}.{other}: unknown field of a step")),
        }
    }
    let frame = frame_parameter(&at, step.get("parameterSpace"), params)?;
    let script = step
        .get("script")
        .ok_or_else(|| format!("{at}.script: missing"))?;
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
    let (field, blender_args) = blender_command(&at, &command, &args, &files, &scope)?;
    let (scene, frames) = blender_options(&field, &blender_args, frame.as_ref(), base, notes)?;
    let mut after = Vec::new();
    if let Some(deps) = step.get("dependencies") {
        for (k, d) in deps.as_array().into_iter().flatten().enumerate() {
            after.push(text_of(
                d.get("dependsOn"),
                &format!("{at}.dependencies[{k}].dependsOn"),
            )?);
        }
    }
    Ok((
        Step {
            name,
            scene,
            frames,
            after: Vec::new(),
        },
        after,
    ))
}

/// The step's frame task parameter and its frames, if it has one: one INT
/// parameter (any other kind, or more than one, cannot be mapped).
fn frame_parameter(
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

fn frame_number(s: &str) -> Result<u32, String> {
    let n: i64 = s.parse().map_err(|_| format!("`{s}` is not an integer"))?;
    u32::try_from(n).map_err(|_| format!("frame {n} is out of range (0 to {})", u32::MAX))
}

/// An OpenJD `IntRangeExpr`: `1-10`, `1-10:2`, `3`, comma-separated.
fn int_range_expr(expr: &str) -> Result<Vec<u32>, String> {
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

/// The Blender arguments a step runs, and the field they came from: its
/// command is Blender, or a shell running an embedded script whose one
/// command is Blender.
fn blender_command(
    at: &str,
    command: &str,
    args: &[String],
    files: &HashMap<String, String>,
    scope: &Scope<'_>,
) -> Result<(String, Vec<String>), String> {
    let field = format!("{at}.script.actions.onRun");
    if is_blender(command) {
        return Ok((format!("{field}.args"), args.to_vec()));
    }
    let shell = matches!(program(command), "bash" | "sh" | "zsh" | "dash");
    let script_file: Option<String> = if shell {
        args.first().cloned()
    } else {
        Some(command.to_string()).filter(|c| c.starts_with("\u{0}FILE:"))
    };
    let Some(file) = script_file
        .as_deref()
        .and_then(|a| a.strip_prefix("\u{0}FILE:"))
        .and_then(|a| a.strip_suffix('\u{0}'))
    else {
        return Err(format!(
            "{field}.command: `{command}` is not Blender; Tessera runs Blender steps only"
        ));
    };
    let field = format!("{at}.script.embeddedFiles ({file})");
    let data = scope.resolve(&files[file], &field)?;
    let mut command = None;
    for line in logical_lines(&data) {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let words = shell_words(line).map_err(|e| format!("{field}: `{line}`: {e}"))?;
        match words.first().map(|w| program(w)) {
            Some("set" | "mkdir" | "echo") => continue,
            Some(p) if is_blender(p) => {
                if command.is_some() {
                    return Err(format!(
                        "{field}: runs Blender twice; make each render a step of its own"
                    ));
                }
                command = Some(words[1..].to_vec());
            }
            _ => {
                return Err(format!(
                    "{field}: `{line}` is not a Blender command; Tessera runs Blender steps only"
                ))
            }
        }
    }
    let args = command.ok_or_else(|| format!("{field}: runs no Blender"))?;
    Ok((field, args))
}

fn program(command: &str) -> &str {
    command.rsplit(['/', '\\']).next().unwrap_or(command)
}

fn is_blender(command: &str) -> bool {
    let p = program(command).to_ascii_lowercase();
    p == "blender" || p == "blender.exe" || p.starts_with("blender-")
}

/// Lines with backslash-newline continuations joined.
fn logical_lines(data: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in data.lines() {
        match line.strip_suffix('\\') {
            Some(start) => {
                cur.push_str(start);
                cur.push(' ');
            }
            None => {
                cur.push_str(line);
                out.push(std::mem::take(&mut cur));
            }
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Splits a shell line into words (quotes and backslashes as a POSIX shell
/// reads them); refuses what only a shell could evaluate.
fn shell_words(line: &str) -> Result<Vec<String>, String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut in_word = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            ' ' | '\t' => {
                if in_word {
                    words.push(std::mem::take(&mut cur));
                    in_word = false;
                }
            }
            '\'' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => cur.push(c),
                        None => return Err("an unclosed quote".into()),
                    }
                }
            }
            '"' => {
                in_word = true;
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c) => cur.push(c),
                            None => return Err("an unclosed quote".into()),
                        },
                        Some('$' | '`') => return Err("shell expansion cannot be mapped".into()),
                        Some(c) => cur.push(c),
                        None => return Err("an unclosed quote".into()),
                    }
                }
            }
            '\\' => {
                in_word = true;
                if let Some(c) = chars.next() {
                    cur.push(c);
                }
            }
            '$' | '`' => return Err("shell expansion cannot be mapped".into()),
            ';' | '|' | '&' | '>' | '<' | '(' | ')' => {
                return Err(format!("`{c}`: only one plain command can be mapped"))
            }
            '#' if !in_word => break,
            c => {
                in_word = true;
                cur.push(c);
            }
        }
    }
    if in_word {
        words.push(cur);
    }
    Ok(words)
}

/// The `.blend` and frames of a Blender command line.
fn blender_options(
    field: &str,
    args: &[String],
    frame: Option<&(String, Vec<u32>)>,
    base: &Path,
    notes: &mut Vec<String>,
) -> Result<(PathBuf, Option<String>), String> {
    let mut scene: Option<PathBuf> = None;
    let mut render_frames: Option<String> = None;
    let (mut anim, mut start, mut end, mut jump) = (false, None, None, None);
    let mut it = args.iter();
    let value = |it: &mut std::slice::Iter<'_, String>, opt: &str| {
        it.next()
            .cloned()
            .ok_or_else(|| format!("{field}: `{opt}` needs a value"))
    };
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "-b" | "--background" | "--factory-startup" | "--disable-autoexec" | "-noaudio"
            | "--noaudio" => {}
            "-x" | "--use-extension" => {
                value(&mut it, arg)?;
            }
            "-o" | "--render-output" => {
                let out = value(&mut it, arg)?;
                notes.push(format!("{field}: `{arg} {}` is not used: frames are named as the .blend names them and land in --output", out.replace(FRAME, "#")));
            }
            "-t" | "--threads" => {
                value(&mut it, arg)?;
                notes.push(format!("{field}: `{arg}` is not used: each worker sets its own render threads"));
            }
            "-f" | "--render-frame" => render_frames = Some(value(&mut it, arg)?),
            "-a" | "--render-anim" => anim = true,
            "-s" | "--frame-start" => start = Some(value(&mut it, arg)?),
            "-e" | "--frame-end" => end = Some(value(&mut it, arg)?),
            "-j" | "--frame-jump" => jump = Some(value(&mut it, arg)?),
            "-F" | "--render-format" => {
                return Err(format!("{field}: `{arg}` cannot be mapped: Tessera renders the format the .blend file sets; set it there"))
            }
            "-E" | "--engine" | "-S" | "--scene" => {
                return Err(format!("{field}: `{arg}` cannot be mapped: Tessera renders the .blend file's own scene and engine; set them there"))
            }
            "-P" | "--python" | "--python-expr" | "--python-text" | "--python-console"
            | "-y" | "--enable-autoexec" | "--addons" => {
                return Err(format!("{field}: `{arg}` runs Python; Tessera never runs a template's or a file's scripts"))
            }
            "--" => {
                let rest: Vec<&String> = it.by_ref().collect();
                let mut r = rest.iter();
                while let Some(a) = r.next() {
                    if a.as_str() == "--cycles-device" {
                        r.next();
                        notes.push(format!("{field}: `--cycles-device` is not used: each worker's --blender-device decides"));
                    } else if a.as_str() != "--cycles-print-stats" {
                        return Err(format!("{field}: `{a}` after `--` cannot be mapped"));
                    }
                }
            }
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
        (None, true) => {
            let is_frame = |v: &Option<String>| v.as_deref() == Some(FRAME);
            if is_frame(&start) && is_frame(&end) && jump.is_none() {
                task_frames()
            } else if [&start, &end, &jump]
                .iter()
                .any(|v| v.as_deref().is_some_and(|v| v.contains(FRAME)))
            {
                return Err(format!(
                    "{field}: --frame-start and --frame-end must both be the frame parameter"
                ));
            } else {
                match (start, end) {
                    (None, None) if jump.is_none() => None,
                    (Some(s), Some(e)) => {
                        let (s, e) = (frame_number(s.trim())?, frame_number(e.trim())?);
                        let j = match jump {
                            Some(j) => frame_number(j.trim())?.max(1),
                            None => 1,
                        };
                        Some(frame_list(&(s..=e).step_by(j as usize).collect::<Vec<_>>()))
                    }
                    _ => return Err(format!("{field}: with --render-anim give both --frame-start and --frame-end, or neither (the file's range)")),
                }
            }
        }
        (None, false) => {
            return Err(format!(
                "{field}: renders no frame: give --render-frame or --render-anim"
            ))
        }
    };
    if let (Some((name, _)), false) = (frame, args.iter().any(|a| a.contains(FRAME))) {
        return Err(format!("{field}: the task parameter {name} is not used by the Blender command, so every task would render the same frames"));
    }
    Ok((scene, frames))
}

/// Blender's `--render-frame` syntax: `5`, `1..10`, `1,3,5`.
fn blender_frames(s: &str) -> Result<String, String> {
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
fn frame_list(frames: &[u32]) -> String {
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

/// Orders steps so that each comes after those it depends on; refuses
/// unknown names and cycles.
fn order(steps: Vec<(Step, Vec<String>)>) -> Result<Vec<Step>, String> {
    let index: HashMap<String, usize> = (steps.iter().enumerate())
        .map(|(i, (s, _))| (s.name.clone(), i))
        .collect();
    if index.len() != steps.len() {
        return Err("steps: two steps have the same name".into());
    }
    let mut deps = Vec::new();
    for (i, (s, names)) in steps.iter().enumerate() {
        let mut d = Vec::new();
        for n in names {
            let j = *index.get(n).ok_or_else(|| {
                format!(
                    "steps[{i}] ({}).dependencies: no step is named `{n}`",
                    s.name
                )
            })?;
            d.push(j);
        }
        deps.push(d);
    }
    let mut placed: Vec<Option<usize>> = vec![None; steps.len()];
    let mut ordered: Vec<usize> = Vec::new();
    while ordered.len() < steps.len() {
        let next = (0..steps.len())
            .find(|&i| placed[i].is_none() && deps[i].iter().all(|&d| placed[d].is_some()));
        let Some(i) = next else {
            return Err("steps: their dependencies form a cycle".into());
        };
        placed[i] = Some(ordered.len());
        ordered.push(i);
    }
    let mut steps: Vec<Option<(Step, Vec<String>)>> = steps.into_iter().map(Some).collect();
    Ok(ordered
        .iter()
        .map(|&i| {
            let (mut s, _) = steps[i].take().expect("each step once");
            s.after = deps[i]
                .iter()
                .map(|&d| placed[d].expect("placed"))
                .collect();
            s
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps_of(yaml: &str) -> Result<Imported, String> {
        import(yaml, Path::new("/shots"), &[])
    }

    const TEMPLATE: &str = r#"
specificationVersion: jobtemplate-2023-09
name: "{{Param.Title}}"
parameterDefinitions:
- name: Title
  type: STRING
  default: Tree shot
- name: SceneFile
  type: PATH
  objectType: FILE
  dataFlow: IN
  default: tree.blend
- name: Last
  type: INT
  default: 3
steps:
- name: Final
  dependencies:
  - dependsOn: Preview
  parameterSpace:
    taskParameterDefinitions:
    - name: Frame
      type: INT
      range: "1-{{Param.Last}}"
  script:
    actions:
      onRun:
        command: blender
        args: ["--background", "{{Param.SceneFile}}", "--render-output", "/tmp/out/f-####", "--render-frame", "{{Task.Param.Frame}}"]
- name: Preview
  script:
    actions:
      onRun:
        command: bash
        args: ["{{Task.File.Run}}"]
    embeddedFiles:
    - name: Run
      type: TEXT
      data: |
        #!/usr/bin/env bash
        set -euo pipefail
        blender -b '{{Param.SceneFile}}' \
          --render-frame 2
"#;

    #[test]
    fn a_blender_template_maps_to_jobs_in_dependency_order() {
        let got = steps_of(TEMPLATE).unwrap();
        assert_eq!(got.name, "Tree shot");
        assert_eq!(
            got.steps,
            vec![
                Step {
                    name: "Preview".into(),
                    scene: "/shots/tree.blend".into(),
                    frames: Some("2".into()),
                    after: vec![],
                },
                Step {
                    name: "Final".into(),
                    scene: "/shots/tree.blend".into(),
                    frames: Some("1-3".into()),
                    after: vec![0],
                },
            ]
        );
        assert_eq!(got.notes.len(), 1, "{:?}", got.notes);
        let more = import(
            TEMPLATE,
            Path::new("/shots"),
            &["Last=5".into(), "SceneFile=/abs/x.blend".into()],
        )
        .unwrap();
        assert_eq!(more.steps[1].frames.as_deref(), Some("1-5"));
        assert_eq!(more.steps[1].scene, PathBuf::from("/abs/x.blend"));
    }

    #[test]
    fn what_cannot_be_mapped_is_refused_naming_its_field() {
        let cases: &[(&str, &str, &str)] = &[
            ("command: blender", "command: ffmpeg", "steps[0] (Final).script.actions.onRun.command: `ffmpeg` is not Blender"),
            ("        set -euo pipefail\n", "        set -euo pipefail\n        ffmpeg -i x.png out.mp4\n", "steps[1] (Preview).script.embeddedFiles (Run): `ffmpeg -i x.png out.mp4` is not a Blender command"),
            ("      type: INT\n      range", "      type: STRING\n      range", "taskParameterDefinitions[0] (Frame).type: a STRING task parameter cannot be mapped"),
            ("\"--render-frame\", \"{{Task.Param.Frame}}\"", "\"--render-frame\", \"1\"", "the task parameter Frame is not used"),
            ("\"--background\",", "\"--python-expr\", \"x\",", "`--python-expr` runs Python"),
            ("- name: Preview\n", "- name: Preview\n  hostRequirements:\n    attributes: []\n", "steps[1] (Preview).hostRequirements"),
            ("steps:\n", "jobEnvironments: []\nsteps:\n", "jobEnvironments: environments run their own commands"),
            ("- dependsOn: Preview", "- dependsOn: Nothing", "no step is named `Nothing`"),
            ("  default: 3\n", "\n", "parameterDefinitions[2] (Last): no default; pass --job-param Last=VALUE"),
            ("jobtemplate-2023-09", "jobtemplate-2099-01", "specificationVersion: `jobtemplate-2099-01` is not supported"),
            ("--render-frame 2", "--render-frame 2 --render-format PNG", "`--render-format` cannot be mapped"),
        ];
        for (from, to, want) in cases {
            assert!(TEMPLATE.contains(from), "{from}");
            let err = steps_of(&TEMPLATE.replacen(from, to, 1)).unwrap_err();
            assert!(err.contains(want), "{from} → {err}");
        }
        let cycle = TEMPLATE.replacen(
            "- name: Preview\n",
            "- name: Preview\n  dependencies:\n  - dependsOn: Final\n",
            1,
        );
        assert!(steps_of(&cycle).unwrap_err().contains("form a cycle"));
        let unknown = import(TEMPLATE, Path::new("/"), &["Nope=1".into()]).unwrap_err();
        assert!(unknown.contains("--job-param Nope: the template defines no such parameter"));
    }

    #[test]
    fn int_range_expressions_and_blender_frames_become_frame_lists() {
        assert_eq!(int_range_expr("1 - 5").unwrap(), vec![1, 2, 3, 4, 5]);
        assert_eq!(int_range_expr("1-10:4").unwrap(), vec![1, 5, 9]);
        assert_eq!(
            int_range_expr("10-15:2,1-3").unwrap(),
            vec![10, 12, 14, 1, 2, 3]
        );
        assert_eq!(int_range_expr("7").unwrap(), vec![7]);
        assert!(int_range_expr("-1 - 1")
            .unwrap_err()
            .contains("out of range"));
        assert_eq!(blender_frames("1..4,9").unwrap(), "1-4,9");
        assert!(blender_frames("-1").is_err());
        assert_eq!(frame_list(&[5, 1, 2, 3, 9]), "1-3,5,9");
    }

    #[test]
    fn the_json_form_reads_too() {
        let json = r#"{"specificationVersion": "jobtemplate-2023-09", "name": "j",
          "steps": [{"name": "s", "script": {"actions": {"onRun": {"command": "/usr/bin/blender",
          "args": ["-b", "a.blend", "-a"]}}}}]}"#;
        let got = import(json, Path::new("/p"), &[]).unwrap();
        assert_eq!(got.steps[0].scene, PathBuf::from("/p/a.blend"));
        assert_eq!(got.steps[0].frames, None, "the file's own range");
    }
}

//! Open Job Description import (`tessera submit job.template.yaml`): a job
//! template of specification `jobtemplate-2023-09`, in YAML or JSON, whose
//! steps run Blender or encode with ffmpeg, becomes one Tessera job per
//! step. Job parameters are substituted (a value given with `--job-param
//! NAME=VALUE`, else the default); an INT task parameter that
//! `--render-frame` names becomes the job's frames; `dependencies` between
//! steps become `--after`; `--render-output DIR/NAME####` (with
//! `--use-extension`) names the frames and the folder under the output
//! directory they are fetched into; `--render-format` is the format they
//! are written in; `hostRequirements` become the job's host needs.
//!
//! A step's command is Blender or ffmpeg itself, or a shell running one
//! embedded script whose only command (besides `set`, `mkdir` and `echo`)
//! is one of them. An ffmpeg step encodes the frames of the one Blender
//! step it depends on ([`Encode`]). Whatever has no meaning on Tessera —
//! environments, host requirements workers do not report, other commands,
//! other task parameters, Blender options that change what the `.blend`
//! file says or run Python, ffmpeg options beyond an encode's — is refused
//! with the field it was found in, never dropped silently. Nothing of the
//! template runs: it is read; Blender is started by the workers as for any
//! `.blend` (scripts off), ffmpeg with arguments they build.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use serde_json::Value;
use tessera_protocol::blender::ImageFormat;

mod command;
mod encode;
mod host;
mod options;
mod params;
mod step;
#[cfg(test)]
mod tests;

use command::*;
pub use encode::Encode;
use encode::*;
use host::*;
use options::*;
use params::*;
use step::*;

/// The specification this reads.
pub const SPECIFICATION: &str = "jobtemplate-2023-09";

/// The largest template read (the specification caps most lists; this caps
/// the whole).
pub const MAX_TEMPLATE_BYTES: u64 = 1 << 20;

/// The most steps a template may have (each becomes a job; a template
/// file's 1 MiB would otherwise hold thousands).
pub const MAX_STEPS: usize = 100;

/// The deepest nesting of flow collections (`[`, `{`) read: a template
/// nests a handful; thousands of `[` make the YAML parser's work grow far
/// faster than the file before it reaches its own limit.
const MAX_FLOW_DEPTH: usize = 64;

/// Stands for the frame task parameter inside a resolved argument.
const FRAME: &str = "\u{0}FRAME\u{0}";

/// A template turned into Tessera jobs, one per step.
#[derive(Debug, Clone, PartialEq)]
pub struct Imported {
    /// The job name the template gives (its `name`, resolved).
    pub name: String,
    /// In an order where every step comes after the steps it depends on.
    pub steps: Vec<Step>,
    /// What was read but has no effect here (a thread count, say).
    pub notes: Vec<String>,
    /// The template's output-directory parameter (a PATH of `dataFlow:
    /// OUT`), the first when several: frames are fetched under it when no
    /// `--output` is given.
    pub output_dir: Option<PathBuf>,
}

/// A step: a Blender render (its `.blend`, frames and output names), or
/// an ffmpeg encode of the frames of the step it depends on (`encode`;
/// its `scene` is then empty and it renders nothing).
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    pub name: String,
    /// The `.blend` it renders.
    pub scene: PathBuf,
    /// A `--frames` list, or `None` for the file's own frame range.
    pub frames: Option<String>,
    /// Indices into [`Imported::steps`] of the steps it runs after.
    pub after: Vec<usize>,
    /// How `--render-output` names its frames, when given.
    pub output: Option<RenderOutput>,
    /// `--render-format`: the frames are written in it instead of the
    /// `.blend` file's own format.
    pub format: Option<ImageFormat>,
    /// An ffmpeg step: what it encodes, how, and where the movie goes.
    pub encode: Option<Encode>,
    /// Its `hostRequirements`: what a worker's machine must have.
    pub host: Option<tessera_protocol::host::HostNeeds>,
}

/// A step's `--render-output DIR/NAME####` (with `--use-extension`): the
/// frames are named `NAME####` (plus the format's extension) in `DIR`,
/// which lies under `--output`, or under the template's output-directory
/// parameter when no `--output` is given; never outside it.
#[derive(Debug, Clone, PartialEq)]
pub struct RenderOutput {
    /// The output-directory parameter's value the pattern was written
    /// under (`{{Param.OutputDir}}/...`); `None` for a relative pattern.
    pub root: Option<PathBuf>,
    /// The folder under that root (`""` for the root itself), `/`-separated.
    pub subdir: String,
    /// The file-name template, one run of `#` for the frame (`output_####`).
    pub name: String,
    /// `--use-extension`: the format's extension is appended (Blender's
    /// default, 1).
    pub extension: bool,
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
    check_flow_depth(text)?;
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
                return Err("jobEnvironments: environments run their own commands around every task; Tessera runs only Blender and ffmpeg (drop them, or render those steps elsewhere)".into())
            }
            other => return Err(format!("{other}: unknown field of a job template")),
        }
    }
    // Relative PATH values are resolved against the template's folder made
    // absolute: a pattern `{{Param.OutputDir}}/output_####` is then seen to
    // lie under OutputDir also when the template was named relatively
    // (`submit shot.yaml`), not taken for a folder `out/` under it.
    let base =
        std::path::absolute(base).map_err(|e| format!("cannot resolve {}: {e}", base.display()))?;
    let base = base.as_path();
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
    if steps.len() > MAX_STEPS {
        return Err(format!(
            "steps: {} steps; a template may have at most {MAX_STEPS} (each is a job)",
            steps.len()
        ));
    }
    let mut notes = Vec::new();
    let mut mapped = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        mapped.push(map_step(i, step, &values, base, &mut notes)?);
    }
    let steps = order(mapped)?;
    for step in &steps {
        let Some(encode) = &step.encode else {
            continue;
        };
        let at = format!("steps ({})", step.name);
        let input = match step.after[..] {
            [d] if steps[d].encode.is_none() => &steps[d],
            _ => return Err(format!("{at}.dependencies: an ffmpeg step depends on exactly one step, the Blender step whose frames it encodes")),
        };
        check_input(&at, encode, input)?;
    }
    let output_dir = (root.get("parameterDefinitions").and_then(Value::as_array))
        .into_iter()
        .flatten()
        .filter_map(|d| d.get("name").and_then(Value::as_str))
        .find_map(|n| values.get(n).filter(|v| v.out_dir))
        .map(|v| PathBuf::from(&v.value));
    Ok(Imported {
        name,
        steps,
        notes,
        output_dir,
    })
}

/// A value of a job parameter: as given (`raw`) and as used (`value`; a
/// relative PATH resolved against the template's folder).
struct ParamValue {
    raw: String,
    value: String,
    /// A PATH parameter of `dataFlow: OUT` naming a directory: where the
    /// frames go when no `--output` is given.
    out_dir: bool,
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

/// The value after option `opt` of a command line (`field` names where it
/// is, for the error).
fn next_value(
    it: &mut std::slice::Iter<'_, String>,
    field: &str,
    opt: &str,
) -> Result<String, String> {
    it.next()
        .cloned()
        .ok_or_else(|| format!("{field}: `{opt}` needs a value"))
}

/// Refuses text whose brackets nest deeper than [`MAX_FLOW_DEPTH`],
/// counted over the whole text (quotes too: it is a bound, not a parse).
fn check_flow_depth(text: &str) -> Result<(), String> {
    let mut depth = 0usize;
    for (line, l) in text.lines().enumerate() {
        for c in l.chars() {
            match c {
                '[' | '{' => depth += 1,
                ']' | '}' => depth = depth.saturating_sub(1),
                _ => {}
            }
            if depth > MAX_FLOW_DEPTH {
                return Err(format!(
                    "line {}: brackets nest deeper than {MAX_FLOW_DEPTH}; a job template nests a few",
                    line + 1
                ));
            }
        }
    }
    Ok(())
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

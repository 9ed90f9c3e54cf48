//! A template's job parameters and the `{{Param.X}}` scope they make.

use super::*;

pub(super) fn job_parameters(
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
        let out_dir = kind == "PATH"
            && def.get("dataFlow").and_then(Value::as_str) == Some("OUT")
            && def.get("objectType").and_then(Value::as_str) != Some("FILE");
        out.insert(
            name,
            ParamValue {
                raw,
                value,
                out_dir,
            },
        );
    }
    if let Some((name, _)) = overrides.into_iter().next() {
        return Err(format!(
            "--job-param {name}: the template defines no such parameter"
        ));
    }
    Ok(out)
}

/// What a format string may name where it is resolved.
pub(super) struct Scope<'a> {
    pub(super) params: &'a HashMap<String, ParamValue>,
    /// The frame task parameter's name, inside a step's script.
    pub(super) frame: Option<&'a str>,
    /// Embedded files by name, inside a step's script.
    pub(super) files: &'a HashMap<String, String>,
}

impl Scope<'_> {
    /// Resolves every `{{ NAME }}` of `s`; `field` names where it was, for
    /// errors.
    pub(super) fn resolve(&self, s: &str, field: &str) -> Result<String, String> {
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

    pub(super) fn value(&self, name: &str, field: &str) -> Result<String, String> {
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

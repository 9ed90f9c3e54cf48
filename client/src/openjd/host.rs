//! A step's `hostRequirements`: the amounts and attributes Tessera's
//! workers report (GPU count and memory, CPU cores, memory, OS family, CPU
//! architecture) become the job's host needs, which the scheduler matches;
//! any other (a custom amount or attribute, scratch disk) is refused by
//! name.

use tessera_protocol::host::{Amount, HostNeeds};

use super::*;

/// Maps `hostRequirements` (`at` names the step).
pub(super) fn host_requirements(at: &str, v: &Value) -> Result<HostNeeds, String> {
    let at = format!("{at}.hostRequirements");
    let obj = v
        .as_object()
        .ok_or_else(|| format!("{at}: expected a mapping with amounts and attributes"))?;
    if obj.is_empty() {
        return Err(format!(
            "{at}: lists neither amounts nor attributes (drop it, or give one)"
        ));
    }
    let mut needs = HostNeeds::default();
    for (key, list) in obj {
        let amounts = match key.as_str() {
            "amounts" => true,
            "attributes" => false,
            other => return Err(format!("{at}.{other}: unknown field of hostRequirements")),
        };
        let list = list
            .as_array()
            .ok_or_else(|| format!("{at}.{key}: expected a list"))?;
        for (i, item) in list.iter().enumerate() {
            let name = text_of(item.get("name"), &format!("{at}.{key}[{i}].name"))?;
            let field = format!("{at}.{key}[{i}] ({name})");
            if amounts {
                amount(&field, &name, item, &mut needs)?;
            } else {
                attribute(&field, &name, item, &mut needs)?;
            }
        }
    }
    Ok(needs)
}

/// The largest amount a template may ask for (GPUs, cores, MiB): more
/// than any machine has, far less than where numbers wrap.
const MAX_AMOUNT: u64 = u32::MAX as u64;

fn amount(field: &str, name: &str, item: &Value, needs: &mut HostNeeds) -> Result<(), String> {
    let slot = match name {
        "amount.worker.gpu" => &mut needs.gpus,
        "amount.worker.gpu.memory" => &mut needs.gpu_memory_mib,
        "amount.worker.vcpu" => &mut needs.cpus,
        "amount.worker.memory" => &mut needs.memory_mib,
        other => {
            return Err(format!(
                "{field}: `{other}` cannot be mapped: Tessera's workers report amount.worker.gpu, amount.worker.gpu.memory, amount.worker.vcpu and amount.worker.memory"
            ))
        }
    };
    let number = |key: &str| -> Result<Option<u64>, String> {
        match item.get(key) {
            None => Ok(None),
            Some(v) => {
                let n = v
                    .as_f64()
                    .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()));
                match n {
                    Some(n) if (0.0..=MAX_AMOUNT as f64).contains(&n) => Ok(Some(n.ceil() as u64)),
                    _ => Err(format!(
                        "{field}.{key}: expected a number from 0 to {MAX_AMOUNT}"
                    )),
                }
            }
        }
    };
    let (min, max) = (number("min")?.unwrap_or(0), number("max")?);
    if max == Some(0) {
        return Err(format!("{field}.max: 0 allows no machine; at least 1"));
    }
    if max.is_some_and(|m| m < min) {
        return Err(format!("{field}: max is below min"));
    }
    if slot.is_some() {
        return Err(format!("{field}: `{name}` is listed twice"));
    }
    *slot = Some(Amount { min, max });
    Ok(())
}

fn attribute(field: &str, name: &str, item: &Value, needs: &mut HostNeeds) -> Result<(), String> {
    let (slot, known): (&mut Vec<String>, &[&str]) = match name {
        "attr.worker.os.family" => (&mut needs.os, &["linux", "windows", "macos"]),
        "attr.worker.cpu.arch" => (&mut needs.arch, &["x86_64", "arm64"]),
        other => {
            return Err(format!(
                "{field}: `{other}` cannot be mapped: Tessera's workers report attr.worker.os.family and attr.worker.cpu.arch"
            ))
        }
    };
    let values = |key: &str| -> Result<Option<Vec<String>>, String> {
        match item.get(key) {
            None => Ok(None),
            Some(Value::Array(a)) => (a.iter().enumerate())
                .map(|(k, v)| text_of(Some(v), &format!("{field}.{key}[{k}]")))
                .map(|v| v.map(|v| v.to_ascii_lowercase()))
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(_) => Err(format!("{field}.{key}: expected a list")),
        }
    };
    let names = match (values("anyOf")?, values("allOf")?) {
        (Some(any), None) => any,
        (None, Some(all)) if all.len() == 1 => all,
        (None, Some(_)) => {
            return Err(format!(
                "{field}.allOf: a machine has one {name}; list one, or use anyOf"
            ))
        }
        _ => return Err(format!("{field}: give anyOf or allOf")),
    };
    if let Some(bad) = names.iter().find(|n| !known.contains(&n.as_str())) {
        return Err(format!(
            "{field}: `{bad}` is not one of {}",
            known.join(", ")
        ));
    }
    if names.is_empty() {
        return Err(format!("{field}: lists no value"));
    }
    *slot = names;
    Ok(())
}

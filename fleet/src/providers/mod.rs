//! The cloud adapters (`vast`, `runpod`, `lambda`, `paperspace`,
//! `kubernetes`) and what they share: how a node gets its worker's
//! environment and command line from a [`LaunchSpec`].
//!
//! The ticket goes into the environment only: into a provider's `env`
//! field (Vast.ai, RunPod), or into an env file (mode 0600) that the node's
//! boot script writes and `docker run --env-file` reads (Lambda's cloud-init
//! user data, Paperspace's startup script). It is never an argument of any
//! command, so it never shows in `ps`, in a provider's console column of
//! "docker args", or in a log of commands run.

pub mod kubernetes;
pub mod lambda;
pub mod paperspace;
pub mod runpod;
pub mod vast;

use serde_json::{Map, Value};

use crate::provider::{LaunchSpec, Provider, ProviderError, Secret};

/// What every `[[provider]]` table of the fleet file may say, whatever the
/// kind; each adapter takes the fields it has.
#[derive(Clone, Debug, Default)]
pub struct Common {
    pub gpu_types: Vec<String>,
    pub min_vram_gib: u32,
    pub max_usd_per_gpu_hour: Option<f64>,
    pub regions: Vec<String>,
    pub interruptible: bool,
}

/// A cloud adapter from its kind, the table's `options` (the adapter's own
/// settings, e.g. `ssh_key_name` for Lambda; an unknown one is an error
/// naming it) with the common fields added, and its credential.
pub fn build(
    kind: &str,
    common: &Common,
    options: Map<String, Value>,
    credential: Secret,
) -> Result<Box<dyn Provider>, ProviderError> {
    let mut settings = options;
    let mut put = |k: &str, v: Value| {
        settings.entry(k.to_string()).or_insert(v);
    };
    let has_gpus = kind != "kubernetes";
    if has_gpus {
        put("gpu_types", common.gpu_types.clone().into());
        put("min_vram_gib", common.min_vram_gib.into());
        if let Some(max) = common.max_usd_per_gpu_hour {
            put("max_usd_per_gpu_hour", max.into());
        }
    }
    if matches!(kind, "vast" | "lambda") {
        put("regions", common.regions.clone().into());
    }
    if matches!(kind, "vast" | "runpod" | "kubernetes") {
        put("interruptible", common.interruptible.into());
    }
    let settings = Value::Object(settings);
    let bad = |e: serde_json::Error| ProviderError::Other(format!("provider {kind}: {e}"));
    Ok(match kind {
        "vast" => Box::new(vast::Vast::new(
            serde_json::from_value(settings).map_err(bad)?,
            credential,
        )?),
        "runpod" => Box::new(runpod::Runpod::new(
            serde_json::from_value(settings).map_err(bad)?,
            credential,
        )?),
        "lambda" => Box::new(lambda::Lambda::new(
            serde_json::from_value(settings).map_err(bad)?,
            credential,
        )?),
        "paperspace" => Box::new(paperspace::Paperspace::new(
            serde_json::from_value(settings).map_err(bad)?,
            credential,
        )?),
        "kubernetes" => Box::new(kubernetes::Kubernetes::new(
            serde_json::from_value(settings).map_err(bad)?,
            credential,
        )?),
        other => {
            return Err(ProviderError::Other(format!(
                "{other} is not a cloud adapter"
            )))
        }
    })
}

/// The environment variable the worker reads its ticket from.
pub const TICKET_ENV: &str = "TESSERA_WORKER_TICKET";
/// Where a VM's boot script writes the worker's environment.
pub const ENV_FILE: &str = "/etc/tessera/worker.env";
/// The longest env value (or argument) accepted from a spec.
pub const MAX_VALUE: usize = 4096;

/// Checks what a spec would put on a node: env names are shell-safe, no
/// value has a newline or NUL (an env file is one line a variable), the
/// ticket is set, and neither the ticket nor anything holding it is among
/// the worker's arguments.
pub fn check_spec(spec: &LaunchSpec) -> Result<(), ProviderError> {
    let ticket = spec.worker_ticket.expose();
    let bad = |why: String| {
        Err(ProviderError::Other(format!(
            "launch spec {}: {why}",
            spec.name
        )))
    };
    if ticket.is_empty() {
        return bad("no worker ticket".into());
    }
    if ticket.len() > MAX_VALUE || ticket.contains(['\n', '\r', '\0']) {
        return bad("the worker ticket is not one line".into());
    }
    if spec.name.is_empty()
        || spec.name.len() > 63
        || !spec
            .name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    {
        return bad("a node name is 1–63 letters, digits, '-' or '_'".into());
    }
    for (k, v) in &spec.env {
        let name_ok = !k.is_empty()
            && k.bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
            && !k.as_bytes()[0].is_ascii_digit();
        if !name_ok {
            return bad(format!("environment name {k:?} is not NAME_LIKE_THIS"));
        }
        if k == TICKET_ENV {
            return bad(format!("{TICKET_ENV} comes from the ticket, not from env"));
        }
        if v.len() > MAX_VALUE || v.contains(['\n', '\r', '\0']) {
            return bad(format!("the value of {k} is not one line"));
        }
    }
    for a in spec.worker_args.iter().chain([&spec.image]) {
        if a.contains(ticket) {
            return bad("the worker ticket must not be on a command line".into());
        }
        if a.len() > MAX_VALUE || a.contains(['\n', '\r', '\0']) {
            return bad("an argument is not one line".into());
        }
    }
    Ok(())
}

/// `e` with every occurrence of `secret` replaced: a provider that echoes
/// a request in its error (an env it refused) must not put the ticket into
/// the fleet's log through the error.
pub fn scrub(e: ProviderError, secret: &str) -> ProviderError {
    if secret.is_empty() {
        return e;
    }
    let clean = |m: String| m.replace(secret, "[ticket]");
    match e {
        ProviderError::Quota(m) => ProviderError::Quota(clean(m)),
        ProviderError::Auth(m) => ProviderError::Auth(clean(m)),
        ProviderError::Other(m) => ProviderError::Other(clean(m)),
        other => other,
    }
}

/// The worker's environment: the ticket first, then the spec's own.
pub fn worker_env(spec: &LaunchSpec) -> Vec<(String, String)> {
    let mut env = vec![(
        TICKET_ENV.to_string(),
        spec.worker_ticket.expose().to_string(),
    )];
    env.extend(spec.env.iter().cloned());
    env
}

/// The arguments after the image's `tessera` entrypoint: `worker --name
/// NAME` and the spec's own arguments (the ticket is read from the env).
pub fn worker_args(spec: &LaunchSpec) -> Vec<String> {
    let mut args = vec![
        "worker".to_string(),
        "--name".to_string(),
        spec.name.clone(),
    ];
    args.extend(spec.worker_args.iter().cloned());
    args
}

/// The env file's text: `NAME=value` lines, as `docker run --env-file`
/// reads them (no quoting: the value is everything after `=`).
pub fn env_file(spec: &LaunchSpec) -> String {
    worker_env(spec)
        .into_iter()
        .map(|(k, v)| format!("{k}={v}\n"))
        .collect()
}

/// The command a VM runs to start the worker container: the GPUs, the env
/// file, restart after a reboot, the image, the worker's arguments. None of
/// it is secret.
pub fn docker_run_argv(spec: &LaunchSpec) -> Vec<String> {
    let mut argv: Vec<String> = [
        "docker",
        "run",
        "--detach",
        "--restart",
        "unless-stopped",
        "--gpus",
        "all",
        "--stop-timeout",
        "300",
        "--name",
        "tessera-worker",
        "--env-file",
        ENV_FILE,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    argv.push(spec.image.clone());
    argv.extend(worker_args(spec));
    argv
}

/// `s` quoted for a POSIX shell (single quotes; a `'` as `'\''`).
pub fn shell_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Lower-cases and keeps letters and digits: `RTX 4090` and `RTX_4090`
/// and `rtx4090` compare equal.
pub fn gpu_key(name: &str) -> String {
    name.chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_lowercase())
        .collect()
}

/// Whether `gpu` is one of `wanted` (empty: any), compared by [`gpu_key`].
/// A wanted name matches a longer provider name that contains it
/// (`A100` matches `NVIDIA A100 80GB PCIe`).
pub fn gpu_wanted(wanted: &[String], gpu: &str) -> bool {
    let g = gpu_key(gpu);
    wanted.is_empty() || wanted.iter().any(|w| g.contains(&gpu_key(w)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::Secret;

    fn spec() -> LaunchSpec {
        LaunchSpec {
            name: "fleet-1".into(),
            image: "tessera-worker:1".into(),
            worker_ticket: Secret::new("tsr1-ticket-abc"),
            env: vec![("RUST_LOG".into(), "info".into())],
            worker_args: vec!["--slots".into(), "auto".into()],
        }
    }

    #[test]
    fn the_ticket_is_in_the_env_file_and_nowhere_in_the_command() {
        let s = spec();
        check_spec(&s).unwrap();
        assert_eq!(
            env_file(&s),
            "TESSERA_WORKER_TICKET=tsr1-ticket-abc\nRUST_LOG=info\n"
        );
        let argv = docker_run_argv(&s);
        assert!(
            argv.iter().all(|a| !a.contains("tsr1-ticket-abc")),
            "{argv:?}"
        );
        assert!(argv.windows(2).any(|w| w == ["--env-file", ENV_FILE]));
        assert_eq!(
            &argv[argv.len() - 5..],
            ["worker", "--name", "fleet-1", "--slots", "auto"]
        );
    }

    #[test]
    fn a_spec_that_would_leak_or_break_the_env_file_is_refused() {
        let mut s = spec();
        s.worker_args.push("--ticket=tsr1-ticket-abc".into());
        assert!(check_spec(&s)
            .unwrap_err()
            .to_string()
            .contains("command line"));
        let mut s = spec();
        s.env
            .push(("X".into(), "a\nTESSERA_WORKER_TICKET=evil".into()));
        assert!(check_spec(&s).is_err());
        let mut s = spec();
        s.env.push(("lower".into(), "x".into()));
        assert!(check_spec(&s).is_err());
        let mut s = spec();
        s.name = "a b".into();
        assert!(check_spec(&s).is_err());
    }

    #[test]
    fn a_provider_is_built_from_its_table_and_a_misspelt_option_is_named() {
        let common = Common {
            gpu_types: vec!["A100".into()],
            max_usd_per_gpu_hour: Some(2.5),
            regions: vec!["us-east-1".into()],
            ..Common::default()
        };
        let options = serde_json::json!({"ssh_key_name": "farm"})
            .as_object()
            .unwrap()
            .clone();
        let p = build("lambda", &common, options, Secret::new("k")).unwrap();
        assert_eq!(p.name(), "lambda");
        let options = serde_json::json!({"ssh_keyname": "farm"})
            .as_object()
            .unwrap()
            .clone();
        let e = build("lambda", &common, options, Secret::new("k"))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("ssh_keyname"), "{e}");
        let k = build("kubernetes", &common, Map::new(), Secret::new("t")).unwrap();
        assert_eq!(k.name(), "kubernetes");
    }

    #[test]
    fn gpu_names_compare_loosely() {
        assert!(gpu_wanted(&["RTX 4090".into()], "RTX_4090"));
        assert!(gpu_wanted(&["A100".into()], "NVIDIA A100 80GB PCIe"));
        assert!(!gpu_wanted(&["H100".into()], "RTX 4090"));
        assert!(gpu_wanted(&[], "anything"));
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}

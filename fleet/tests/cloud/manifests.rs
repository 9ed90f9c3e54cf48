//! The CoreWeave manifests in `deploy/kubernetes/` validate offline against
//! the Kubernetes schemas (PyPI's `kubernetes-validate`, which bundles them;
//! `.ci/run` installs it), and say what the fleet relies on.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use tessera_fleet::providers::kubernetes::KubernetesConfig;

/// The schema version the manifests are held to.
const KUBERNETES_VERSION: &str = "1.31.0";

fn validator() -> PathBuf {
    std::env::var_os("TESSERA_TEST_KUBERNETES_VALIDATE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(&std::env::var_os("HOME").unwrap_or_default())
                .join(".cache/tessera-ci/kubernetes-validate/bin/kubernetes-validate")
        })
}

fn manifests() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/kubernetes")
}

fn validate(files: &[PathBuf]) -> std::process::Output {
    let exe = validator();
    Command::new(&exe)
        .args(["--strict", "-k", KUBERNETES_VERSION])
        .args(files)
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}: install it with `.ci/run` (pip install kubernetes-validate into $HOME/.cache/tessera-ci/kubernetes-validate) or set TESSERA_TEST_KUBERNETES_VALIDATE", exe.display()))
}

/// Every document of a YAML file, read by the validator's own PyYAML.
fn documents(file: &Path) -> Vec<Value> {
    let python = validator().with_file_name("python");
    let out = Command::new(python)
        .args(["-c", "import json,sys,yaml; print(json.dumps([d for d in yaml.safe_load_all(open(sys.argv[1])) if d]))"])
        .arg(file)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
#[ignore = "needs kubernetes-validate (.ci/run installs it)"]
fn the_coreweave_manifests_validate_and_drain_before_the_kill() {
    let mut files: Vec<PathBuf> = std::fs::read_dir(manifests())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    assert!(files.len() >= 4, "{files:?}");
    let out = validate(&files);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert_eq!(text.matches(" passed for resource ").count(), 8, "{text}");

    // The validator is not a rubber stamp: a misspelt field fails.
    let tmp = std::env::temp_dir().join(format!("t15b-manifest-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    let bad = tmp.join("deployment.yaml");
    let text = std::fs::read_to_string(manifests().join("deployment.yaml")).unwrap();
    std::fs::write(
        &bad,
        text.replace(
            "terminationGracePeriodSeconds",
            "terminationGracePeriodSecond",
        ),
    )
    .unwrap();
    assert!(
        !validate(&[bad]).status.success(),
        "a misspelt field passed"
    );
    std::fs::remove_dir_all(&tmp).unwrap();

    let d = &documents(&manifests().join("deployment.yaml"))[0];
    let config = KubernetesConfig::default();
    assert_eq!(d["metadata"]["name"], config.deployment);
    assert_eq!(d["metadata"]["namespace"], config.namespace);
    let (key, value) = config.pod_selector.split_once('=').unwrap();
    assert_eq!(
        d["spec"]["selector"]["matchLabels"][key], value,
        "the adapter's pod selector finds the pods"
    );
    let pod = &d["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    // The ticket comes from the Secret, never from the command line.
    let env = c["env"].as_array().unwrap();
    let ticket = env
        .iter()
        .find(|e| e["name"] == "TESSERA_WORKER_TICKET")
        .unwrap();
    assert_eq!(
        ticket["valueFrom"]["secretKeyRef"]["name"],
        "tessera-worker-ticket"
    );
    let secret = &documents(&manifests().join("secret.yaml"))[0];
    assert_eq!(secret["metadata"]["name"], "tessera-worker-ticket");
    assert!(secret["stringData"]["ticket"].is_string());
    let args: Vec<&str> = c["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(!args.iter().any(|a| a.contains("ticket")), "{args:?}");
    // The worker's name is the pod's name.
    assert!(args.windows(2).any(|w| w == ["--name", "$(POD_NAME)"]));
    let pod_name = env.iter().find(|e| e["name"] == "POD_NAME").unwrap();
    assert_eq!(
        pod_name["valueFrom"]["fieldRef"]["fieldPath"],
        "metadata.name"
    );
    assert_eq!(c["resources"]["limits"]["nvidia.com/gpu"], 1);
    // preStop drains (SIGTERM to the worker, wait for it), within the grace period.
    let pre_stop = c["lifecycle"]["preStop"]["exec"]["command"].to_string();
    assert!(pre_stop.contains("kill -TERM 1"), "{pre_stop}");
    let grace = pod["terminationGracePeriodSeconds"].as_u64().unwrap();
    let drain: u64 = args.windows(2).find(|w| w[0] == "--drain-grace").unwrap()[1]
        .parse()
        .unwrap();
    assert!(
        drain + 30 <= grace,
        "the drain ({drain} s) must end well inside the grace period ({grace} s)"
    );
    let term = &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"][0];
    assert_eq!(term["matchExpressions"][0]["key"], "gpu.nvidia.com/class");
}

/// The manifests of a farm with a standby (`deploy/kubernetes/coordinators/`:
/// two coordinators, PostgreSQL, Garage as the object store) validate
/// offline, and run what the docs say: both coordinators `--standby` on the
/// shared state and bucket, each with a data dir of its own, never on one
/// node, the database password and the store's keys only in Secrets.
#[test]
#[ignore = "needs kubernetes-validate (.ci/run installs it)"]
fn the_coordinator_manifests_validate_and_run_a_standby_on_shared_state() {
    let dir = manifests().join("coordinators");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let out = validate(&files);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{text}");
    assert_eq!(text.matches(" passed for resource ").count(), 12, "{text}");

    let docs = documents(&dir.join("coordinators.yaml"));
    let kind = |k: &str| docs.iter().find(|d| d["kind"] == k).unwrap().clone();
    let set = kind("StatefulSet");
    assert_eq!(set["spec"]["replicas"], 2);
    let pod = &set["spec"]["template"]["spec"];
    let c = &pod["containers"][0];
    let args: Vec<&str> = (c["args"].as_array().unwrap().iter())
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args[0], "coordinator");
    assert!(args.contains(&"--standby"), "{args:?}");
    let flag = |name: &str| args.windows(2).find(|w| w[0] == name).unwrap()[1];
    assert_eq!(flag("--advertise"), "$(POD_IP):7700");
    assert!(
        args.contains(&"--http"),
        "/metrics, active or standby: {args:?}"
    );
    // The data dir is the pod's own volume; the blobs the shared one.
    let mounts = c["volumeMounts"].as_array().unwrap();
    let mounted = |path: &str| {
        let name = mounts.iter().find(|m| m["mountPath"] == path).unwrap()["name"].clone();
        name.as_str().unwrap().to_string()
    };
    assert_eq!(mounted(flag("--data-dir")), "data");
    assert_eq!(
        set["spec"]["volumeClaimTemplates"][0]["metadata"]["name"],
        "data"
    );
    assert_eq!(mounts.len(), 1, "one volume of its own, no shared one");
    assert_eq!(pod["securityContext"]["fsGroup"], 1000, "the image's user");
    // The assets in the bucket; its endpoint the store's Service, its keys
    // from a Secret, never the command line.
    assert_eq!(flag("--blobs"), "s3://tessera/farm");
    let env = c["env"].as_array().unwrap();
    let var = |name: &str| env.iter().find(|e| e["name"] == name).unwrap().clone();
    let garage = documents(&dir.join("garage.yaml"));
    let garage_kind = |k: &str| garage.iter().find(|d| d["kind"] == k).unwrap().clone();
    let service = garage_kind("Service");
    let port = service["spec"]["ports"][0]["port"].as_u64().unwrap();
    assert_eq!(
        var("AWS_ENDPOINT_URL")["value"],
        format!(
            "http://{}:{port}",
            service["metadata"]["name"].as_str().unwrap()
        )
    );
    assert_eq!(var("AWS_REGION")["value"], "garage");
    let config = garage_kind("ConfigMap")["data"]["garage.toml"].clone();
    let config = config.as_str().unwrap();
    assert!(config.contains("s3_region = \"garage\""), "{config}");
    assert!(!config.contains("rpc_secret"), "{config}");
    for (name, key) in [
        ("AWS_ACCESS_KEY_ID", "access-key-id"),
        ("AWS_SECRET_ACCESS_KEY", "secret-access-key"),
    ] {
        let secret = var(name)["valueFrom"]["secretKeyRef"].clone();
        assert_eq!(secret["key"], key);
        let named = (docs.iter())
            .find(|d| d["kind"] == "Secret" && d["metadata"]["name"] == secret["name"])
            .unwrap();
        assert!(named["stringData"][key].is_string());
    }
    assert!(
        !args.iter().any(|a| a.contains("AWS") || a.contains("key")),
        "{args:?}"
    );
    let store = &garage_kind("StatefulSet")["spec"]["template"]["spec"]["containers"][0];
    let rpc = &store["env"][0];
    assert_eq!(rpc["name"], "GARAGE_RPC_SECRET");
    assert_eq!(
        rpc["valueFrom"]["secretKeyRef"]["name"],
        garage_kind("Secret")["metadata"]["name"]
    );
    // The state's URL names no password; PGPASSWORD comes from the Secret.
    let url = var("TESSERA_STATE")["value"].as_str().unwrap().to_string();
    let userinfo = url.split('@').next().unwrap();
    assert!(
        !userinfo.trim_start_matches("postgres://").contains(':'),
        "{url}"
    );
    assert!(url.contains("tessera-postgres"), "{url}");
    let secret = var("PGPASSWORD")["valueFrom"]["secretKeyRef"].clone();
    assert_eq!(secret["name"], "tessera-state");
    assert!(docs
        .iter()
        .any(|d| d["kind"] == "Secret" && d["metadata"]["name"] == "tessera-state"));
    assert_eq!(
        var("POD_IP")["valueFrom"]["fieldRef"]["fieldPath"],
        "status.podIP"
    );
    // Never both on one node; SIGTERM's 1.5 s fit the grace period.
    let anti =
        &pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0];
    assert_eq!(anti["topologyKey"], "kubernetes.io/hostname");
    assert!(pod["terminationGracePeriodSeconds"].as_u64().unwrap() >= 5);
    let postgres = documents(&dir.join("postgres.yaml"));
    let pg_set = postgres
        .iter()
        .find(|d| d["kind"] == "StatefulSet")
        .unwrap();
    let pg_env = pg_set["spec"]["template"]["spec"]["containers"][0]["env"].to_string();
    assert!(pg_env.contains("tessera-state"), "{pg_env}");
    // PostgreSQL takes connections from the coordinators alone; Garage's
    // RPC from Garage alone; its S3 port from anyone (signed URLs).
    let policies = documents(&dir.join("network-policy.yaml"));
    let labels = |d: &Value| {
        let name = &d["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/name"];
        serde_json::json!({ "app.kubernetes.io/name": name })
    };
    let policy = |selects: &Value| {
        (policies.iter())
            .find(|p| p["spec"]["podSelector"]["matchLabels"] == *selects)
            .unwrap()
            .clone()
    };
    let pg = policy(&labels(pg_set));
    let from = &pg["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"];
    assert_eq!(*from, labels(&set), "PostgreSQL's clients");
    assert_eq!(pg["spec"]["ingress"].as_array().unwrap().len(), 1);
    let store = policy(&labels(&garage_kind("StatefulSet")));
    let rules = store["spec"]["ingress"].as_array().unwrap();
    let rpc = (rules.iter())
        .find(|r| r["ports"][0]["port"] == 3901)
        .unwrap();
    assert_eq!(
        rpc["from"][0]["podSelector"]["matchLabels"],
        labels(&garage_kind("StatefulSet"))
    );
    let s3 = (rules.iter())
        .find(|r| r["ports"][0]["port"] == 3900)
        .unwrap();
    assert!(s3.get("from").is_none(), "workers fetch from anywhere");
}

/// `docker-compose` (Debian's, 1.29; `.ci/run` installs it), which checks a
/// Compose file against the Compose schema offline (`config`).
fn compose() -> PathBuf {
    std::env::var_os("TESSERA_TEST_DOCKER_COMPOSE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("docker-compose"))
}

/// `docker-compose config` of `file` in `dir` (where its `.env` is).
fn compose_config(dir: &Path, file: &Path) -> std::process::Output {
    Command::new(compose())
        .arg("-f")
        .arg(file)
        .arg("config")
        .current_dir(dir)
        .env_remove("COMPOSE_PROJECT_NAME")
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}: install Debian's docker-compose (.ci/run does) or set TESSERA_TEST_DOCKER_COMPOSE", compose().display()))
}

/// The Compose file of a farm with a standby (`deploy/compose/`: two
/// coordinators, PostgreSQL, Garage) validates offline against the Compose
/// schema with the example `.env` filled in, refuses to start without it,
/// and runs what the docs say: both coordinators `--standby` on the shared
/// state and bucket with volumes of their own, advertising the ports they
/// publish, every secret from `.env`, none on a command line.
#[test]
#[ignore = "needs docker-compose (.ci/run installs it)"]
fn the_compose_file_validates_and_runs_a_standby_on_postgres_and_a_bucket() {
    let source = manifests().join("../compose");
    let tmp = std::env::temp_dir().join(format!("tessera-compose-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp).unwrap();
    for name in ["compose.yaml", "garage.toml", "env.example"] {
        std::fs::copy(source.join(name), tmp.join(name)).unwrap();
    }
    let file = tmp.join("compose.yaml");

    // Without a filled-in .env it refuses, naming what is missing.
    let out = compose_config(&tmp, &file);
    assert!(!out.status.success(), "it validated with no .env");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("TESSERA_DB_PASSWORD"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Every line of the example filled in.
    let example = std::fs::read_to_string(tmp.join("env.example")).unwrap();
    let secrets = [
        ("TESSERA_DB_PASSWORD", "db-password-1"),
        ("GARAGE_RPC_SECRET", "rpc-secret-2"),
        ("AWS_ACCESS_KEY_ID", "GKkey-id-3"),
        ("AWS_SECRET_ACCESS_KEY", "secret-key-4"),
    ];
    let filled = |key: bool| {
        let mut env = String::new();
        for line in example.lines().filter(|l| !l.starts_with('#')) {
            let (name, value) = line.split_once('=').unwrap();
            let value = match secrets.iter().find(|(n, _)| *n == name) {
                Some(_) if !key && name.starts_with("AWS_") => String::new(),
                Some((_, v)) => v.to_string(),
                None if name == "TESSERA_HOST" => "198.51.100.7".to_string(),
                None => {
                    assert!(!value.is_empty(), "{name} is left empty in env.example");
                    value.to_string()
                }
            };
            env.push_str(&format!("{name}={value}\n"));
        }
        for (name, _) in secrets {
            assert!(
                env.contains(&format!("{name}=")),
                "env.example lacks {name}"
            );
        }
        env
    };
    // The key comes from the store once it runs: `up` of the store (the
    // setup's first step) works without it.
    std::fs::write(tmp.join(".env"), filled(false)).unwrap();
    let out = compose_config(&tmp, &file);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::write(tmp.join(".env"), filled(true)).unwrap();
    let out = compose_config(&tmp, &file);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let resolved = tmp.join("resolved.yaml");
    std::fs::write(&resolved, &out.stdout).unwrap();
    let config = &documents(&resolved)[0];

    // The schema is checked: a misspelt key fails.
    let text = std::fs::read_to_string(&file).unwrap();
    std::fs::write(
        &file,
        text.replace("stop_grace_period", "stop_grace_periods"),
    )
    .unwrap();
    assert!(
        !compose_config(&tmp, &file).status.success(),
        "a misspelt key passed"
    );

    let services = &config["services"];
    for (name, port) in [("coordinator-a", 7700), ("coordinator-b", 7701)] {
        let c = &services[name];
        let args: Vec<&str> = (c["command"].as_array().unwrap().iter())
            .map(|a| a.as_str().unwrap())
            .collect();
        assert_eq!(args[0], "coordinator", "{name}");
        assert!(args.contains(&"--standby"), "{name}: {args:?}");
        let flag = |f: &str| args.windows(2).find(|w| w[0] == f).unwrap()[1];
        assert_eq!(flag("--blobs"), "s3://tessera/farm");
        assert_eq!(flag("--advertise"), format!("198.51.100.7:{port}"));
        assert!(
            args.contains(&"--http"),
            "/metrics, active or standby: {args:?}"
        );
        assert_eq!(c["ports"][1]["published"].as_u64(), Some(port));
        assert_eq!(c["ports"][1]["protocol"], "tcp");
        assert_eq!(c["ports"][0]["published"].as_u64(), Some(port));
        assert_eq!(c["ports"][0]["protocol"], "udp");
        // A volume of its own, holding the data dir.
        let volume = c["volumes"][0].as_str().unwrap();
        let (source, target) = volume.split_once(':').unwrap();
        assert_eq!(source, name);
        assert!(flag("--data-dir").starts_with(&format!("{}/", target.split(':').next().unwrap())));
        let env = &c["environment"];
        let state = env["TESSERA_STATE"].as_str().unwrap();
        assert!(
            !state
                .trim_start_matches("postgres://")
                .split('@')
                .next()
                .unwrap()
                .contains(':'),
            "{state}"
        );
        assert!(state.contains("@postgres:5432/"), "{state}");
        assert_eq!(env["PGPASSWORD"], "db-password-1");
        assert_eq!(env["AWS_ACCESS_KEY_ID"], "GKkey-id-3");
        assert_eq!(env["AWS_SECRET_ACCESS_KEY"], "secret-key-4");
        // Workers reach the store where the coordinator signs its URLs.
        assert_eq!(env["AWS_ENDPOINT_URL"], "http://198.51.100.7:3900");
        for (_, secret) in secrets {
            assert!(!args.iter().any(|a| a.contains(secret)), "{args:?}");
        }
        assert_eq!(c["depends_on"]["postgres"]["condition"], "service_healthy");
    }
    let postgres = &services["postgres"];
    assert_eq!(
        postgres["environment"]["POSTGRES_PASSWORD"],
        "db-password-1"
    );
    assert_eq!(postgres["environment"]["POSTGRES_USER"], "tessera");
    let garage = &services["garage"];
    assert_eq!(garage["environment"]["GARAGE_RPC_SECRET"], "rpc-secret-2");
    assert_eq!(garage["ports"][0]["published"].as_u64(), Some(3900));
    assert!(
        garage["ports"].as_array().unwrap().len() == 1,
        "RPC stays inside"
    );
    std::fs::remove_dir_all(&tmp).unwrap();
}

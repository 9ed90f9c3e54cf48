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
/// two coordinators, PostgreSQL, a shared asset volume) validate offline,
/// and run what the docs say: both coordinators `--standby` on the shared
/// state and blob volume, each with a data dir of its own, never on one
/// node, the database password only in a Secret.
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
    assert_eq!(text.matches(" passed for resource ").count(), 6, "{text}");

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
    let blobs = mounted(flag("--blobs"));
    let volume = (pod["volumes"].as_array().unwrap().iter())
        .find(|v| v["name"] == blobs.as_str())
        .unwrap();
    let claim = volume["persistentVolumeClaim"]["claimName"].clone();
    let pvc = kind("PersistentVolumeClaim");
    assert_eq!(pvc["metadata"]["name"], claim);
    assert_eq!(pvc["spec"]["accessModes"][0], "ReadWriteMany");
    // The state's URL names no password; PGPASSWORD comes from the Secret.
    let env = c["env"].as_array().unwrap();
    let var = |name: &str| env.iter().find(|e| e["name"] == name).unwrap().clone();
    let url = var("TESSERA_STATE")["value"].as_str().unwrap().to_string();
    let userinfo = url.split('@').next().unwrap();
    assert!(
        !userinfo.trim_start_matches("postgres://").contains(':'),
        "{url}"
    );
    assert!(url.contains("tessera-postgres"), "{url}");
    let secret = var("PGPASSWORD")["valueFrom"]["secretKeyRef"].clone();
    assert_eq!(secret["name"], kind("Secret")["metadata"]["name"]);
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
}

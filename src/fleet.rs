//! `tessera fleet run` and `tessera fleet plan`: the fleet as a client of
//! the coordinator. It reads the queue with the client ticket (`status`),
//! asks the autoscaling policy (`tessera_fleet::policy`, pure) what to do,
//! and carries it out through the providers: launches nodes with the worker
//! ticket in their environment, drains workers through the coordinator,
//! releases nodes. It counts what the providers bill for each node, from
//! launch to release rounded up to the billing increment, beside what the
//! jobs' leases were billed, and writes both to its status file.
//!
//! It keeps the nodes it holds in a state file, written every tick; started
//! again after a crash, it adopts them (from that file and each provider's
//! own listing, by the name prefix) and treats them as its own. Every node
//! it launches runs its worker with `--exit-after-idle`, so a node whose
//! fleet never returns stops by itself.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context};
use serde_json::json;
use tessera_fleet::config::{FleetFile, ProviderConfig};
use tessera_fleet::docker::DockerProvider;
use tessera_fleet::local::LocalProvider;
use tessera_fleet::policy::{
    Action, Autoscaler, JobDemand, Millis, NodeView, Observation, Rentable,
};
use tessera_fleet::provider::{LaunchSpec, NodeId, NodeState, Offer, Provider, Secret};
use tessera_fleet::sim::{run_autoscaled, SimJob, Trace, TraceOffer};
use tessera_fleet::state::{FleetState, SavedNode};
use tessera_protocol::messages::{JobState, JobStatus, WorkerState, WorkerStatus};

use crate::client::Client;

/// How often the fleet looks at the farm.
const TICK: Duration = Duration::from_millis(1000);
/// How often offers are listed again.
const OFFERS_EVERY: Duration = Duration::from_secs(60);

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The providers the fleet file names, with their tables.
fn providers(
    file: &FleetFile,
    base: &Path,
) -> anyhow::Result<Vec<(ProviderConfig, Box<dyn Provider>)>> {
    let mut out: Vec<(ProviderConfig, Box<dyn Provider>)> = Vec::new();
    for p in &file.providers {
        let name = p.name();
        let gpu = p.gpu.clone().unwrap_or_else(|| "cpu".to_string());
        let provider: Box<dyn Provider> = match p.kind.as_str() {
            "local" => {
                let binary = match &p.binary {
                    Some(b) => base.join(b),
                    None => std::env::current_exe().context("where is this tessera binary")?,
                };
                let work = base.join(
                    (p.work_dir.clone()).unwrap_or_else(|| PathBuf::from("fleet-workers")),
                );
                Box::new(LocalProvider::new(&name, binary, work, &gpu, p.usd_per_hour))
            }
            "docker" => {
                let network = p.network.clone().unwrap_or_else(|| "bridge".to_string());
                let mut d = DockerProvider::new(&name, &network, &gpu, p.usd_per_hour);
                if let Some(dir) = &p.work_dir {
                    d.log_dir = Some(base.join(dir));
                }
                // The ticket file mounted into containers: next to the
                // fleet file, owner-only.
                let safe: String = (name.chars())
                    .map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' })
                    .collect();
                d.secret_dir = base.join(format!(".tessera-fleet-{safe}"));
                if let Some(args) = p.options.get("run_args").and_then(|v| v.as_array()) {
                    d.run_args = args
                        .iter()
                        .filter_map(|a| a.as_str().map(str::to_string))
                        .collect();
                }
                if let Some(t) = p.options.get("stop_timeout_secs").and_then(|v| v.as_integer()) {
                    d.stop_timeout_secs = t.clamp(0, 3600) as u32;
                }
                Box::new(d)
            }
            kind @ ("vast" | "runpod" | "lambda" | "paperspace" | "kubernetes") => {
                let source = (p.credential.as_ref()).with_context(|| {
                    format!("provider {name:?}: a {kind} provider needs `credential = {{ env = \"VAR\" }}` or `{{ file = \"PATH\" }}`")
                })?;
                let credential = source
                    .read(base)
                    .map_err(|e| anyhow::anyhow!("provider {name:?}: {e}"))?;
                let common = tessera_fleet::providers::Common {
                    gpu_types: p.gpu_types.clone(),
                    min_vram_gib: p.min_vram_gib,
                    max_usd_per_gpu_hour: p.max_usd_per_gpu_hour,
                    regions: p.regions.clone(),
                    interruptible: p.interruptible.unwrap_or(file.interruptible),
                };
                let options = serde_json::to_value(&p.options)
                    .context("the provider's options")?
                    .as_object()
                    .cloned()
                    .unwrap_or_default();
                tessera_fleet::providers::build(kind, &common, options, credential)
                    .map_err(|e| anyhow::anyhow!("provider {name:?}: {e}"))?
            }
            kind => bail!(
                "provider {name:?}: unknown kind {kind:?} (local, docker, vast, runpod, lambda, paperspace or kubernetes)"
            ),
        };
        // Read now, so a missing credential fails at start, not at launch.
        if let Some(c) = &p.credential {
            c.read(base).map_err(anyhow::Error::msg)?;
        }
        out.push((p.clone(), provider));
    }
    Ok(out)
}

/// Every offer the providers list that their tables want.
fn list_offers(
    file: &FleetFile,
    providers: &mut [(ProviderConfig, Box<dyn Provider>)],
) -> Vec<Rentable> {
    let mut out = Vec::new();
    for (cfg, p) in providers.iter_mut() {
        match p.offers() {
            Ok(offers) => {
                for offer in offers {
                    if cfg.wants(&offer, file.interruptible) {
                        out.push(Rentable {
                            provider: cfg.name(),
                            offer,
                            count: cfg.max_nodes.unwrap_or(file.max_nodes),
                        });
                    }
                }
            }
            Err(e) => eprintln!("fleet: {}: cannot list offers: {e}", cfg.name()),
        }
    }
    out
}

/// What the coordinator's jobs ask for, on the fleet's clock.
fn demand(jobs: &[JobStatus], policy: &mut Autoscaler, unix0: u64, ms0: Millis) -> Vec<JobDemand> {
    let mut out = Vec::new();
    for j in jobs {
        if !matches!(j.state, JobState::Queued | JobState::Running) {
            continue;
        }
        if j.tasks_done > 0 {
            policy.set_task_mean(
                j.id,
                "any",
                j.render_ms as f64 / f64::from(j.tasks_done),
                j.tasks_done,
            );
        }
        let left = j.tasks_total.saturating_sub(j.tasks_done);
        let running = j.tasks_running.min(left);
        let queued = if j.paused { 0 } else { left - running };
        out.push(JobDemand {
            id: j.id,
            queued,
            running,
            deadline_ms: j.deadline_unix_ms.map(|d| ms0 + d.saturating_sub(unix0)),
        });
    }
    out
}

/// A node the fleet rented.
struct Rented {
    provider: usize,
    id: NodeId,
    offer: Offer,
    launched: Instant,
    /// The same, on the wall clock (kept in the state file).
    launched_unix_ms: u64,
    state: NodeState,
    /// Launched by an earlier run of the fleet and adopted by this one.
    adopted: bool,
}

/// What every node was billed: (name, USD, GPU-seconds) of released ones.
#[derive(Default)]
struct Bill {
    closed_usd: f64,
    closed_gpu_secs: f64,
    released: Vec<serde_json::Value>,
}

fn billed(offer: &Offer, secs: f64) -> (f64, f64) {
    let inc = offer.billing.increment().as_secs_f64();
    let secs = (secs / inc).ceil() * inc;
    (
        secs * offer.usd_per_hour / 3600.0,
        secs * f64::from(offer.gpu_count.max(1)),
    )
}

/// `tessera fleet run`: until SIGINT or SIGTERM, then every node is
/// released.
// Long because: the fleet's control loop (observe, plan, act, write the
// status, wait for the tick or a signal) and its release on the way
// out, read whole; the policy itself lives in tessera-fleet.
pub async fn run(
    config: &Path,
    client: &mut Client,
    status_file: Option<&Path>,
    tick: Option<Duration>,
) -> anyhow::Result<i32> {
    let file = FleetFile::load(config).map_err(anyhow::Error::msg)?;
    let base = config.parent().unwrap_or(Path::new(".")).to_path_buf();
    let ticket: Secret = file.worker_ticket.read(&base).map_err(anyhow::Error::msg)?;
    let mut providers = providers(&file, &base)?;
    let mut policy = Autoscaler::new(file.policy(), file.name_prefix.clone());
    let started = Instant::now();
    let unix0 = unix_ms();
    let tick = tick.unwrap_or(TICK);
    let mut offers = list_offers(&file, &mut providers);
    let mut offers_at = Instant::now();
    let mut nodes: BTreeMap<String, Rented> = BTreeMap::new();
    let mut bill = Bill::default();
    let state_path = match &file.state_file {
        Some(p) => base.join(p),
        None => config.with_extension("state.json"),
    };
    adopt(
        &file,
        &state_path,
        &mut providers,
        &offers,
        &mut policy,
        &mut nodes,
    );
    save_state(&file, &state_path, &providers, &nodes);
    let exit_after_idle = file.node_exit_after_idle_secs();
    // Job costs and render time when the fleet started, to count what it
    // added since.
    let (jobs0, _) = client.status(None).await?;
    let base_cost: BTreeMap<u64, (f64, u64)> = jobs0
        .iter()
        .map(|j| (j.id, (j.cost_usd, j.render_ms)))
        .collect();
    eprintln!(
        "fleet: {} providers, at most {} nodes, idle timeout {} s, nodes leave by themselves after {exit_after_idle} s idle",
        providers.len(),
        file.max_nodes,
        file.idle_timeout_secs
    );
    let mut stop = Box::pin(crate::shutdown_signal());
    loop {
        let now = started.elapsed().as_millis() as Millis;
        let (jobs, workers) = client.status(None).await?;
        if offers_at.elapsed() >= OFFERS_EVERY {
            offers = tokio::task::block_in_place(|| list_offers(&file, &mut providers));
            offers_at = Instant::now();
        }
        let demand = demand(&jobs, &mut policy, unix0, 0);
        let mut views = Vec::new();
        for (name, n) in nodes.iter_mut() {
            let p = &mut providers[n.provider].1;
            let state = tokio::task::block_in_place(|| p.state(&n.id)).unwrap_or_else(|e| {
                eprintln!("fleet: {name}: cannot read its state: {e}");
                n.state.clone()
            });
            if state != n.state {
                eprintln!("fleet: {name} is {state:?}");
                n.state = state.clone();
            }
            let worker = worker_of(&workers, name, &n.id);
            views.push(NodeView {
                name: name.clone(),
                state,
                joined: worker.is_some(),
                busy: worker.is_some_and(|w| w.running > 0),
            });
        }
        let obs = Observation {
            jobs: demand,
            nodes: views,
            offers: offers.clone(),
        };
        for action in policy.tick(now, &obs) {
            match action {
                Action::Launch {
                    name,
                    provider,
                    offer,
                } => {
                    let Some(i) = providers.iter().position(|(c, _)| c.name() == provider) else {
                        policy.launch_failed(&name, now);
                        continue;
                    };
                    let (cfg, p) = &mut providers[i];
                    let spec = LaunchSpec {
                        name: name.clone(),
                        image: cfg.image.clone().unwrap_or_else(|| file.image.clone()),
                        worker_ticket: ticket.clone(),
                        env: Vec::new(),
                        worker_args: (file.worker_args.iter().cloned())
                            .chain(["--exit-after-idle".into(), format!("{exit_after_idle}s")])
                            .collect(),
                    };
                    match tokio::task::block_in_place(|| p.launch(&offer, &spec)) {
                        Ok(id) => {
                            eprintln!(
                                "fleet: launched {name} on {provider} ({} at ${:.3}/h)",
                                offer.gpu, offer.usd_per_hour
                            );
                            nodes.insert(
                                name,
                                Rented {
                                    provider: i,
                                    id,
                                    offer,
                                    launched: Instant::now(),
                                    launched_unix_ms: unix_ms(),
                                    state: NodeState::Starting,
                                    adopted: false,
                                },
                            );
                            // Said at once: a crash now must not lose it.
                            save_state(&file, &state_path, &providers, &nodes);
                        }
                        Err(e) => {
                            eprintln!("fleet: cannot launch {name} on {provider}: {e}");
                            policy.launch_failed(&name, now);
                        }
                    }
                }
                Action::Drain { name } => {
                    let node = nodes.get(&name).map(|n| n.id.clone());
                    if let Some(w) = node.and_then(|id| worker_of(&workers, &name, &id)) {
                        eprintln!("fleet: draining {name}");
                        if let Err(e) = client.drain(w.id).await {
                            eprintln!("fleet: cannot drain {name}: {e:#}");
                        }
                    }
                }
                Action::Release { name, reason } => {
                    if let Some(n) = nodes.remove(&name) {
                        let p = &mut providers[n.provider].1;
                        if let Err(e) = tokio::task::block_in_place(|| p.release(&n.id)) {
                            eprintln!("fleet: cannot release {name}: {e}");
                        }
                        let secs = n.launched.elapsed().as_secs_f64();
                        let (usd, gpu_secs) = billed(&n.offer, secs);
                        bill.closed_usd += usd;
                        bill.closed_gpu_secs += gpu_secs;
                        eprintln!(
                            "fleet: released {name} ({}) after {secs:.0} s, billed ${usd:.4}",
                            reason.as_str()
                        );
                        bill.released.push(json!({
                            "name": name, "reason": reason.as_str(),
                            "secs": secs, "usd": usd,
                        }));
                    }
                }
            }
        }
        save_state(&file, &state_path, &providers, &nodes);
        let status = fleet_status(&nodes, &bill, &jobs, &base_cost, policy.replaced);
        if let Some(path) = status_file {
            write_atomically(path, &status.to_string())?;
        }
        // The dashboard's farm page shows the latest; a refusal costs the
        // fleet nothing.
        match serde_json::from_value::<tessera_protocol::messages::FleetReport>(status) {
            Ok(mut report) => {
                report.fit();
                if let Err(e) = client.fleet_report(report).await {
                    eprintln!("fleet: the coordinator did not take the fleet's report: {e:#}");
                }
            }
            Err(e) => eprintln!("fleet: no report for the coordinator: {e}"),
        }
        tokio::select! {
            _ = &mut stop => break,
            _ = tokio::time::sleep(tick) => {}
        }
    }
    eprintln!("fleet: stopping: releasing {} nodes", nodes.len());
    for (name, n) in std::mem::take(&mut nodes) {
        let p = &mut providers[n.provider].1;
        let _ = tokio::task::block_in_place(|| p.release(&n.id));
        let (usd, gpu_secs) = billed(&n.offer, n.launched.elapsed().as_secs_f64());
        bill.closed_usd += usd;
        bill.closed_gpu_secs += gpu_secs;
        bill.released
            .push(json!({"name": name, "reason": "fleet-stopped", "usd": usd}));
    }
    save_state(&file, &state_path, &providers, &nodes);
    if let Some(path) = status_file {
        let (jobs, _) = client.status(None).await.unwrap_or_default();
        let status = fleet_status(&nodes, &bill, &jobs, &base_cost, policy.replaced);
        write_atomically(path, &status.to_string())?;
    }
    Ok(0)
}

/// Takes over the nodes an earlier run of this fleet left (killed, or its
/// machine died): those its state file names and those each provider lists
/// under the name prefix. Each becomes the policy's and this run's like a
/// node it launched (released when idle); one that is gone is released
/// (a stopped container removed) and forgotten.
fn adopt(
    file: &FleetFile,
    path: &Path,
    providers: &mut [(ProviderConfig, Box<dyn Provider>)],
    offers: &[Rentable],
    policy: &mut Autoscaler,
    nodes: &mut BTreeMap<String, Rented>,
) {
    let saved = FleetState::load(path).unwrap_or_else(|e| {
        eprintln!("fleet: ignoring the state file: {e}");
        FleetState::default()
    });
    let now_unix = unix_ms();
    for (i, (cfg, p)) in providers.iter_mut().enumerate() {
        let name = cfg.name();
        let mut found: BTreeMap<String, (NodeId, Option<SavedNode>)> = (saved.nodes.iter())
            .filter(|n| n.provider == name && n.name.starts_with(&file.name_prefix))
            .map(|n| (n.name.clone(), (NodeId(n.node.clone()), Some(n.clone()))))
            .collect();
        match tokio::task::block_in_place(|| p.list(&file.name_prefix)) {
            Ok(Some(listed)) => {
                for id in listed {
                    let key = id.0.clone();
                    found.entry(key).or_insert((id, None));
                }
            }
            Ok(None) => {}
            Err(e) => eprintln!("fleet: {name}: cannot list its nodes: {e}"),
        }
        for (node_name, (id, saved)) in found {
            let state = match tokio::task::block_in_place(|| p.adopt(&id)) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("fleet: {node_name}: cannot adopt it: {e}");
                    continue;
                }
            };
            if state == NodeState::Gone {
                let _ = tokio::task::block_in_place(|| p.release(&id));
                eprintln!("fleet: {node_name} (left by an earlier run) is gone; released");
                continue;
            }
            let offer = saved.as_ref().map(|s| s.offer.clone()).or_else(|| {
                (offers.iter())
                    .find(|r| r.provider == name)
                    .map(|r| r.offer.clone())
            });
            let Some(offer) = offer else {
                eprintln!("fleet: {node_name}: no offer of {name} to bill it at; releasing it");
                let _ = tokio::task::block_in_place(|| p.release(&id));
                continue;
            };
            let saved_known = saved.is_some();
            let launched_unix_ms = saved.map_or(now_unix, |s| s.launched_unix_ms.min(now_unix));
            let age = Duration::from_millis(now_unix - launched_unix_ms);
            eprintln!(
                "fleet: adopted {node_name} on {name} ({state:?}, launched {:.1} s ago by an earlier run{})",
                age.as_secs_f64(),
                if saved_known { "" } else { "; not in the state file" }
            );
            policy.adopt(&node_name, &name, offer.clone(), 0);
            nodes.insert(
                node_name,
                Rented {
                    provider: i,
                    id,
                    offer,
                    launched: Instant::now().checked_sub(age).unwrap_or_else(Instant::now),
                    launched_unix_ms,
                    state,
                    adopted: true,
                },
            );
        }
    }
}

/// Writes the nodes held now to the state file; a failure is reported, and
/// the provider's listing is then what a restart relies on.
fn save_state(
    file: &FleetFile,
    path: &Path,
    providers: &[(ProviderConfig, Box<dyn Provider>)],
    nodes: &BTreeMap<String, Rented>,
) {
    let state = FleetState {
        name_prefix: file.name_prefix.clone(),
        nodes: (nodes.iter())
            .map(|(name, n)| SavedNode {
                name: name.clone(),
                provider: providers[n.provider].0.name(),
                node: n.id.0.clone(),
                offer: n.offer.clone(),
                launched_unix_ms: n.launched_unix_ms,
            })
            .collect(),
    };
    let r = tokio::task::block_in_place(|| state.save(path));
    if let Err(e) = r {
        eprintln!("fleet: cannot write the state file: {e}");
    }
}

/// The live worker on the fleet's node `name`: named after it (the fleet
/// names the workers it launches), or after its node id where the provider
/// names the worker itself (a Kubernetes pod's worker takes the pod's name).
fn worker_of<'a>(workers: &'a [WorkerStatus], name: &str, id: &NodeId) -> Option<&'a WorkerStatus> {
    let named = |n: &str| (workers.iter()).find(|w| w.name == n && w.state != WorkerState::Silent);
    named(name).or_else(|| named(&id.0))
}

/// The fleet's status file: its nodes, what the providers billed, what the
/// jobs' leases were billed since the fleet started, and the rest as farm
/// overhead; billed and rendered GPU-hours and their ratio.
fn fleet_status(
    nodes: &BTreeMap<String, Rented>,
    bill: &Bill,
    jobs: &[JobStatus],
    base: &BTreeMap<u64, (f64, u64)>,
    replaced: u32,
) -> serde_json::Value {
    let mut usd = bill.closed_usd;
    let mut gpu_secs = bill.closed_gpu_secs;
    let list: Vec<_> = (nodes.iter())
        .map(|(name, n)| {
            let secs = n.launched.elapsed().as_secs_f64();
            let (u, g) = billed(&n.offer, secs);
            usd += u;
            gpu_secs += g;
            json!({
                "name": name, "node": n.id.0, "gpu": n.offer.gpu,
                "usd_per_hour": n.offer.usd_per_hour,
                "state": format!("{:?}", n.state).to_lowercase(),
                "adopted": n.adopted,
                "secs": secs, "usd": u,
            })
        })
        .collect();
    let (attributed, rendered_ms) = jobs.iter().fold((0.0, 0u64), |(c, r), j| {
        let (c0, r0) = base.get(&j.id).copied().unwrap_or((0.0, 0));
        (
            c + (j.cost_usd - c0).max(0.0),
            r + j.render_ms.saturating_sub(r0),
        )
    });
    let billed_h = gpu_secs / 3600.0;
    let rendered_h = rendered_ms as f64 / 3_600_000.0;
    json!({
        "nodes": list,
        "released": bill.released,
        "replaced": replaced,
        "billed_usd": usd,
        "attributed_to_jobs_usd": attributed,
        "farm_overhead_usd": (usd - attributed).max(0.0),
        "billed_gpu_hours": billed_h,
        "rendered_gpu_hours": rendered_h,
        "billed_per_rendered": if rendered_h > 0.0 { Some(billed_h / rendered_h) } else { None },
    })
}

fn write_atomically(path: &Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

/// `tessera fleet plan`: what the fleet would rent for the queue now, for
/// how long, at what cost and finishing when, played on virtual time
/// against the offers listed now (boot times as the policy assumes them,
/// no preemptions). Nothing is launched.
pub async fn plan(config: &Path, client: &mut Client, json_out: bool) -> anyhow::Result<i32> {
    let file = FleetFile::load(config).map_err(anyhow::Error::msg)?;
    let base = config.parent().unwrap_or(Path::new(".")).to_path_buf();
    let mut providers = providers(&file, &base)?;
    let offers = tokio::task::block_in_place(|| list_offers(&file, &mut providers));
    let (jobs, _) = client.status(None).await?;
    let unix0 = unix_ms();
    let mut policy = Autoscaler::new(file.policy(), "plan-");
    let demand = demand(&jobs, &mut policy, unix0, 0);
    let tasks: u32 = demand.iter().map(|d| d.queued + d.running).sum();
    let frames: u32 = (jobs.iter())
        .filter(|j| matches!(j.state, JobState::Queued | JobState::Running))
        .map(|j| j.frames_total.saturating_sub(j.frames_done))
        .sum();
    if tasks == 0 {
        if json_out {
            println!(
                "{}",
                json!({"tasks": 0, "nodes": [], "cost_usd": 0.0, "finish_secs": 0})
            );
        } else {
            println!("nothing is queued: the fleet would rent nothing");
        }
        return Ok(0);
    }
    // One task time for the plan: the mean over jobs with finished tasks,
    // weighted by what is left, else the policy's default.
    let task_ms = {
        let (sum, n) = demand.iter().fold((0.0, 0u32), |(s, n), d| {
            let left = d.queued + d.running;
            (s + policy.task_ms(d.id, "any") * f64::from(left), n + left)
        });
        sum / f64::from(n.max(1))
    };
    let deadline = demand.iter().filter_map(|d| d.deadline_ms).min();
    let boot = policy.config.boot_estimate_ms;
    let mut trace = Trace::default();
    for r in &offers {
        for _ in 0..r.count.min(file.max_nodes) {
            trace.offers.push(TraceOffer {
                provider: r.provider.clone(),
                offer: r.offer.clone(),
                appears_ms: 0,
                withdrawn_ms: u64::MAX,
                boot_ms: boot,
                preempt_after_ms: None,
                speed: 1.0,
            });
        }
    }
    let job = SimJob {
        frames,
        tasks,
        task_ms,
        deadline_ms: deadline,
    };
    let mut config = file.policy();
    config.default_task_ms = task_ms as u64;
    let r = run_autoscaled(&trace, &job, config);
    if json_out {
        let nodes: Vec<_> = (r.rented.iter())
            .map(|(p, o, from, to)| json!({"provider": p, "offer": o, "from_secs": from / 1000, "to_secs": to / 1000}))
            .collect();
        println!(
            "{}",
            json!({
                "tasks": tasks, "task_secs": task_ms / 1000.0,
                "nodes": nodes, "cost_usd": r.cost_usd,
                "finish_secs": r.finish_ms / 1000,
                "finish_unix_ms": unix0 + r.finish_ms,
                "deadline_met": r.deadline_met,
                "billed_gpu_hours": r.billed_gpu_ms / 3.6e6,
            })
        );
        return Ok(0);
    }
    println!(
        "{tasks} tasks left ({frames} frames) at about {:.1} s a task; {} offers listed",
        task_ms / 1000.0,
        offers.len()
    );
    for (p, o, from, to) in &r.rented {
        println!(
            "  rent {o} on {p} from +{} s to +{} s ({:.1} min)",
            from / 1000,
            to / 1000,
            (to - from) as f64 / 60_000.0
        );
    }
    println!(
        "estimated cost ${:.2}, finished in about {} ({} GPU-hours billed){}",
        r.cost_usd,
        human_secs(r.finish_ms as f64 / 1000.0),
        format_args!("{:.2}", r.billed_gpu_ms / 3.6e6),
        match deadline {
            Some(_) if !r.deadline_met => "; the deadline cannot be met with these offers",
            Some(_) => "; the deadline is met",
            None => "",
        }
    );
    Ok(0)
}

/// `3 h 20 min`, `12 min`, `45 s`.
fn human_secs(secs: f64) -> String {
    let s = secs.max(0.0).round() as u64;
    match s {
        0..=119 => format!("{s} s"),
        120..=7199 => format!("{} min", s / 60),
        _ => format!("{} h {} min", s / 3600, s % 3600 / 60),
    }
}

#[cfg(test)]
mod tests {
    use tessera_protocol::messages::{WorkerState, WorkerStatus};

    use super::worker_of;
    use tessera_fleet::provider::NodeId;

    fn worker(id: u64, name: &str, state: WorkerState) -> WorkerStatus {
        WorkerStatus {
            id,
            name: name.into(),
            hostname: name.into(),
            engines: Vec::new(),
            slots: 1,
            state,
            running: 0,
            tasks_done: 0,
            price_per_hour: 0.0,
            connected_secs: 0,
            tasks: Vec::new(),
            telemetry: None,
            interruptible: false,
            blenders: Vec::new(),
        }
    }

    /// A node's worker is found by the fleet's name for the node, or by the
    /// node id where the provider names the worker (a Kubernetes pod), and
    /// never as a silent one (a drain would not reach it).
    #[test]
    fn a_nodes_worker_is_found_by_the_fleets_name_or_the_pod_name() {
        let workers = [
            worker(1, "fleet-1", WorkerState::Idle),
            worker(2, "tessera-worker-7d9f-abcde", WorkerState::Busy),
            worker(3, "fleet-3", WorkerState::Silent),
        ];
        let found =
            |name: &str, id: &str| worker_of(&workers, name, &NodeId(id.into())).map(|w| w.id);
        assert_eq!(found("fleet-1", "container-1"), Some(1));
        assert_eq!(found("fleet-2", "tessera-worker-7d9f-abcde"), Some(2));
        assert_eq!(found("fleet-3", "container-3"), None);
        assert_eq!(found("fleet-4", "pending-4"), None);
    }
}

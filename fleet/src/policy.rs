//! The autoscaling policy: which offers to rent, which nodes to drain and
//! when to release them, decided from the queue, the job deadlines and the
//! prices. Pure and deterministic like the scheduler core: no I/O, no clock
//! (`now` is passed in), the same observations give the same actions.
//!
//! The plan at each tick: every job's remaining task-seconds (estimated from
//! the task times observed per job and GPU type) must fit before the
//! earliest deadline (a job without one is planned to finish within
//! `default_horizon_ms`, or as fast as `max_nodes` allows). Live nodes and
//! rentable offers are ranked by cost per unit of work — an offer's boot
//! time is paid for, an interruptible one is discounted by its expected
//! losses — and taken cheapest first until the work fits, within
//! `max_nodes` and `max_usd_per_hour`. Offers taken are launched; live nodes
//! not taken are drained near the end of their paid billing increment and
//! released once drained. A node that never boots, vanishes or is
//! preempted is replaced, its offer avoided for a while; a paused node
//! counts as gone and is taken back if it resumes. With nothing queued, no
//! node stays idle past `idle_timeout_ms`.

use std::collections::{BTreeMap, HashMap};

use crate::provider::{NodeState, Offer};

/// Milliseconds on the caller's clock (virtual in tests and benches).
pub type Millis = u64;

/// What the policy is allowed to do.
#[derive(Clone, Debug)]
pub struct PolicyConfig {
    pub max_nodes: u32,
    /// Farm-wide cap on what every billed node costs together.
    pub max_usd_per_hour: Option<f64>,
    /// With nothing queued, an idle node is released after this long.
    pub idle_timeout_ms: Millis,
    /// A node not running its worker this long after launch is released
    /// and its offer avoided.
    pub boot_timeout_ms: Millis,
    /// Boot time assumed before any node of a provider was seen booting.
    pub boot_estimate_ms: Millis,
    /// Task time assumed before any task of a job finished.
    pub default_task_ms: Millis,
    /// A job without a deadline is planned to finish within this.
    pub default_horizon_ms: Millis,
    /// Rent interruptible offers at all.
    pub interruptible: bool,
    /// The share of an interruptible node's time counted on to meet a
    /// deadline (the rest is expected to be lost to preemptions).
    pub interruptible_yield: f64,
    /// Capacity planned beyond the estimate, for estimates that are off.
    pub safety: f64,
    /// How long an offer whose node failed or vanished is avoided.
    pub avoid_ms: Millis,
    /// A paused node not back after this long is released.
    pub pause_give_up_ms: Millis,
    /// At most this many launches per tick.
    pub max_launches_per_tick: u32,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            max_nodes: 4,
            max_usd_per_hour: None,
            idle_timeout_ms: 120_000,
            boot_timeout_ms: 900_000,
            boot_estimate_ms: 120_000,
            default_task_ms: 60_000,
            default_horizon_ms: 1_200_000,
            interruptible: false,
            interruptible_yield: 0.7,
            safety: 1.1,
            avoid_ms: 1_800_000,
            pause_give_up_ms: 1_800_000,
            max_launches_per_tick: 4,
        }
    }
}

/// An offer and the provider it came from, and how many nodes of it may be
/// rented at once (1 for a Vast.ai ask, more for an instance type).
#[derive(Clone, Debug)]
pub struct Rentable {
    pub provider: String,
    pub offer: Offer,
    pub count: u32,
}

/// A job's demand as the coordinator reports it.
#[derive(Clone, Debug)]
pub struct JobDemand {
    pub id: u64,
    /// Tasks not started.
    pub queued: u32,
    /// Tasks rendering now.
    pub running: u32,
    /// When the job must be done, on the policy's clock.
    pub deadline_ms: Option<Millis>,
}

/// A node the fleet launched, as seen now.
#[derive(Clone, Debug)]
pub struct NodeView {
    /// The fleet's name for it (also its worker's name).
    pub name: String,
    pub state: NodeState,
    /// Its worker is connected to the coordinator.
    pub joined: bool,
    /// Its worker holds tasks.
    pub busy: bool,
}

/// Everything one tick decides with.
#[derive(Clone, Debug, Default)]
pub struct Observation {
    pub jobs: Vec<JobDemand>,
    pub nodes: Vec<NodeView>,
    pub offers: Vec<Rentable>,
}

/// What the fleet must do.
#[derive(Clone, Debug, PartialEq)]
pub enum Action {
    /// Rent a node of this offer, named `name`.
    Launch {
        name: String,
        provider: String,
        offer: Offer,
    },
    /// Stop giving the node's worker tasks; it finishes what it holds.
    Drain { name: String },
    /// Stop paying for the node.
    Release { name: String, reason: Release },
}

/// Why a node is released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// Nothing queued for the idle timeout.
    Idle,
    /// Drained: the plan needs fewer or cheaper nodes.
    ScaledDown,
    /// It did not start its worker within the boot timeout.
    NeverBooted,
    /// Paused for longer than the fleet waits for it.
    PausedTooLong,
    /// The provider says it is gone (preempted, destroyed, exited).
    Vanished,
}

impl Release {
    pub fn as_str(self) -> &'static str {
        match self {
            Release::Idle => "idle",
            Release::ScaledDown => "scaled-down",
            Release::NeverBooted => "never-booted",
            Release::PausedTooLong => "paused-too-long",
            Release::Vanished => "vanished",
        }
    }
}

#[derive(Clone, Debug)]
struct Node {
    provider: String,
    offer: Offer,
    launched: Millis,
    /// When its worker first joined.
    joined: Option<Millis>,
    /// Since when it has been idle with nothing queued.
    idle_since: Option<Millis>,
    paused_since: Option<Millis>,
    /// Scale-down decided: drain at this time.
    drain_at: Option<Millis>,
    drained: bool,
    released: bool,
}

/// The policy and what it remembers between ticks.
pub struct Autoscaler {
    pub config: PolicyConfig,
    nodes: BTreeMap<String, Node>,
    /// Observed task times: (job, GPU) → (Σ ms, count).
    task_times: HashMap<(u64, String), (f64, u32)>,
    /// Observed boot times per provider: (Σ ms, count).
    boot_times: HashMap<String, (f64, u32)>,
    /// Offers avoided until the time given: (provider, offer id).
    avoid: HashMap<(String, String), Millis>,
    next_name: u64,
    name_prefix: String,
    /// Nodes lost (vanished, preempted, never booted) and replaced.
    pub replaced: u32,
}

/// One candidate for the plan: a live node or an offer to rent.
struct Candidate {
    /// Index into live nodes, or into the offers.
    live: Option<String>,
    rentable: Option<usize>,
    /// Fraction of the remaining work it does by the horizon.
    share: f64,
    /// USD per unit of work, with boot and expected losses paid.
    cost_per_work: f64,
    usd_per_hour: f64,
}

impl Autoscaler {
    /// `name_prefix` starts every node name (e.g. `tessera-fleet-`).
    pub fn new(config: PolicyConfig, name_prefix: impl Into<String>) -> Autoscaler {
        Autoscaler {
            config,
            nodes: BTreeMap::new(),
            task_times: HashMap::new(),
            boot_times: HashMap::new(),
            avoid: HashMap::new(),
            next_name: 1,
            name_prefix: name_prefix.into(),
            replaced: 0,
        }
    }

    /// Takes over a node an earlier run of the fleet launched (found in its
    /// state file or the provider's listing after a crash): it is the
    /// policy's like any other, released when idle, and no new node is given
    /// its name.
    pub fn adopt(&mut self, name: &str, provider: &str, offer: Offer, launched: Millis) {
        if let Some(n) = name
            .strip_prefix(self.name_prefix.as_str())
            .and_then(|n| n.parse::<u64>().ok())
        {
            self.next_name = self.next_name.max(n.saturating_add(1));
        }
        self.nodes.insert(
            name.to_string(),
            Node {
                provider: provider.to_string(),
                offer,
                launched,
                joined: None,
                idle_since: None,
                paused_since: None,
                drain_at: None,
                drained: false,
                released: false,
            },
        );
    }

    /// A task of `job` took `ms` on a `gpu`.
    pub fn observe_task(&mut self, job: u64, gpu: &str, ms: f64) {
        let e = self.task_times.entry((job, gpu.to_string())).or_default();
        e.0 += ms;
        e.1 += 1;
    }

    /// Replaces what is known of a job's task times on a GPU by a mean
    /// over `count` tasks (for a caller that reads totals, not tasks).
    pub fn set_task_mean(&mut self, job: u64, gpu: &str, mean_ms: f64, count: u32) {
        if count > 0 && mean_ms.is_finite() && mean_ms > 0.0 {
            self.task_times
                .insert((job, gpu.to_string()), (mean_ms * f64::from(count), count));
        }
    }

    /// The task time of `job` expected on `gpu`: observed there, else the
    /// job's mean on every GPU, else the default.
    pub fn task_ms(&self, job: u64, gpu: &str) -> f64 {
        if let Some((sum, n)) = self.task_times.get(&(job, gpu.to_string())) {
            return sum / f64::from(*n);
        }
        let (sum, n) = (self.task_times.iter())
            .filter(|((j, _), _)| *j == job)
            .fold((0.0, 0), |(s, c), (_, (ms, n))| (s + ms, c + n));
        if n > 0 {
            sum / f64::from(n)
        } else {
            self.config.default_task_ms as f64
        }
    }

    /// The boot time expected of a node of `provider`.
    pub fn boot_ms(&self, provider: &str) -> f64 {
        match self.boot_times.get(provider) {
            Some((sum, n)) => sum / f64::from(*n),
            None => self.config.boot_estimate_ms as f64,
        }
    }

    /// The nodes the policy believes it holds (not released), by name.
    pub fn nodes(&self) -> impl Iterator<Item = (&str, &str, &Offer)> {
        (self.nodes.iter())
            .filter(|(_, n)| !n.released)
            .map(|(name, n)| (name.as_str(), n.provider.as_str(), &n.offer))
    }

    /// Node-seconds one node of `offer` needs to render all the work
    /// alone (remaining tasks × task time ÷ its GPUs).
    fn work_ms(&self, jobs: &[JobDemand], offer: &Offer) -> f64 {
        let slots = f64::from(offer.gpu_count.max(1));
        (jobs.iter())
            .map(|j| f64::from(j.queued + j.running) * self.task_ms(j.id, &offer.gpu))
            .sum::<f64>()
            / slots
    }

    fn yield_of(&self, offer: &Offer) -> f64 {
        if offer.interruptible {
            self.config.interruptible_yield
        } else {
            1.0
        }
    }

    /// One tick: what to launch, drain and release now.
    pub fn tick(&mut self, now: Millis, obs: &Observation) -> Vec<Action> {
        let mut actions = Vec::new();
        let seen: HashMap<&str, &NodeView> =
            obs.nodes.iter().map(|n| (n.name.as_str(), n)).collect();
        let queued: u32 = obs.jobs.iter().map(|j| j.queued).sum();
        let running: u32 = obs.jobs.iter().map(|j| j.running).sum();

        // What happened to each node since the last tick.
        let names: Vec<String> = self.nodes.keys().cloned().collect();
        for name in names {
            let view = seen.get(name.as_str());
            let state = view.map_or(NodeState::Gone, |v| v.state.clone());
            let joined = view.is_some_and(|v| v.joined);
            let busy = view.is_some_and(|v| v.busy);
            let boot_timeout = self.config.boot_timeout_ms;
            let node = self.nodes.get_mut(&name).expect("listed");
            if state == NodeState::Gone {
                if !node.released {
                    if !node.drained {
                        // Vanished or preempted: replace it, elsewhere for
                        // a while.
                        self.avoid.insert(
                            (node.provider.clone(), node.offer.id.clone()),
                            now + self.config.avoid_ms,
                        );
                        self.replaced += 1;
                    }
                    // Whatever is left of it (an exited container, a
                    // terminated instance) is cleaned up.
                    actions.push(Action::Release {
                        name: name.clone(),
                        reason: if node.drained {
                            Release::ScaledDown
                        } else {
                            Release::Vanished
                        },
                    });
                }
                self.nodes.remove(&name);
                continue;
            }
            if node.released {
                continue;
            }
            if joined && node.joined.is_none() {
                node.joined = Some(now);
                let e = self.boot_times.entry(node.provider.clone()).or_default();
                e.0 += now.saturating_sub(node.launched) as f64;
                e.1 += 1;
            }
            if state == NodeState::Paused {
                let since = *node.paused_since.get_or_insert(now);
                if now.saturating_sub(since) >= self.config.pause_give_up_ms {
                    node.released = true;
                    actions.push(Action::Release {
                        name: name.clone(),
                        reason: Release::PausedTooLong,
                    });
                }
                continue;
            }
            node.paused_since = None;
            if node.joined.is_none() && now.saturating_sub(node.launched) >= boot_timeout {
                node.released = true;
                self.avoid.insert(
                    (node.provider.clone(), node.offer.id.clone()),
                    now + self.config.avoid_ms,
                );
                self.replaced += 1;
                actions.push(Action::Release {
                    name: name.clone(),
                    reason: Release::NeverBooted,
                });
                continue;
            }
            if state == NodeState::Preempting && !node.drained {
                node.drained = true;
                actions.push(Action::Drain { name: name.clone() });
            }
            // Idle with nothing queued: the idle timeout runs. A drained
            // node goes as soon as it holds nothing.
            let idle = !busy && (queued == 0 || node.drained);
            if idle {
                let since = *node.idle_since.get_or_insert(now);
                let idle_for = now.saturating_sub(since);
                if node.drained || (queued == 0 && idle_for >= self.config.idle_timeout_ms) {
                    node.released = true;
                    let reason = if node.drained {
                        Release::ScaledDown
                    } else {
                        Release::Idle
                    };
                    actions.push(Action::Release {
                        name: name.clone(),
                        reason,
                    });
                    continue;
                }
            } else {
                node.idle_since = None;
            }
            // A scale-down decided earlier: drain when its time comes.
            if let Some(at) = node.drain_at {
                if now >= at && !node.drained {
                    node.drained = true;
                    actions.push(Action::Drain { name: name.clone() });
                }
            }
        }
        self.avoid.retain(|_, until| *until > now);

        if queued + running == 0 {
            return actions;
        }
        self.plan(now, obs, &mut actions);
        actions
    }

    /// Ranks live nodes and offers and launches or scales down to fit the
    /// work before the horizon.
    fn plan(&mut self, now: Millis, obs: &Observation, actions: &mut Vec<Action>) {
        let jobs: Vec<JobDemand> = (obs.jobs.iter())
            .filter(|j| j.queued + j.running > 0)
            .cloned()
            .collect();
        let horizon = self.horizon(now, obs, &jobs);
        let candidates = self.candidates(now, horizon, obs, &jobs);
        let (keep, launch) = self.choose(&candidates);
        self.drain_ranked_out(now, &jobs, &keep, actions);
        self.launch(now, obs, launch, actions);
    }

    /// When the work should be done: the earliest deadline, else the
    /// default horizon or what `max_nodes` of the fastest offer need.
    fn horizon(&self, now: Millis, obs: &Observation, jobs: &[JobDemand]) -> Millis {
        let cfg = &self.config;
        let deadline = jobs.iter().filter_map(|j| j.deadline_ms).min();
        match deadline {
            Some(d) => d,
            None => {
                let fastest_alone = (obs.offers.iter())
                    .map(|r| self.work_ms(jobs, &r.offer))
                    .fold(f64::INFINITY, f64::min);
                let spread = if fastest_alone.is_finite() {
                    fastest_alone / f64::from(cfg.max_nodes.max(1))
                } else {
                    0.0
                };
                now + (cfg.default_horizon_ms as f64).max(spread) as Millis
            }
        }
    }

    /// Every live node and every rentable place, ranked by what a unit of
    /// work costs on it, cheapest first.
    fn candidates(
        &self,
        now: Millis,
        horizon: Millis,
        obs: &Observation,
        jobs: &[JobDemand],
    ) -> Vec<Candidate> {
        let cfg = &self.config;
        let mut candidates = Vec::new();
        for (name, node) in &self.nodes {
            if node.released || node.drained || node.paused_since.is_some() {
                continue;
            }
            let ready = match node.joined {
                Some(_) => now,
                None => now.max(node.launched + self.boot_ms(&node.provider) as Millis),
            };
            let avail = horizon.saturating_sub(ready) as f64;
            let work = self.work_ms(jobs, &node.offer);
            let y = self.yield_of(&node.offer);
            // A live node's boot is paid already: it is ranked on price
            // alone, and a little ahead of offers (no churn for pennies).
            let cost = node.offer.usd_per_hour * work / y * 0.8;
            candidates.push(Candidate {
                live: Some(name.clone()),
                rentable: None,
                share: avail * y / work.max(1.0),
                cost_per_work: cost,
                usd_per_hour: node.offer.usd_per_hour,
            });
        }
        let live_per_offer = |provider: &str, id: &str| {
            (self.nodes.values())
                .filter(|n| {
                    // A paused node counts as gone: its place may be rented again.
                    !n.released
                        && n.paused_since.is_none()
                        && n.provider == provider
                        && n.offer.id == id
                })
                .count() as u32
        };
        for (i, r) in obs.offers.iter().enumerate() {
            if r.offer.interruptible && !cfg.interruptible {
                continue;
            }
            // An offer whose node failed lately is taken only when nothing
            // else is left (ten times its price).
            let avoided = (self.avoid).contains_key(&(r.provider.clone(), r.offer.id.clone()));
            let left = r
                .count
                .saturating_sub(live_per_offer(&r.provider, &r.offer.id));
            let boot = self.boot_ms(&r.provider);
            let avail = horizon as f64 - now as f64 - boot;
            let work = self.work_ms(jobs, &r.offer);
            let y = self.yield_of(&r.offer);
            // Renting pays the boot too; a node that would boot after the
            // horizon is still ranked (the deadline may be lost anyway).
            let useful = avail.max(work.min(avail.abs()) * 0.1).max(1.0);
            let cost = r.offer.usd_per_hour * work / y
                * (1.0 + boot / useful.min(work))
                * if avoided { 10.0 } else { 1.0 };
            for _ in 0..left.min(cfg.max_nodes) {
                candidates.push(Candidate {
                    live: None,
                    rentable: Some(i),
                    share: avail.max(0.0) * y / work.max(1.0),
                    cost_per_work: cost,
                    usd_per_hour: r.offer.usd_per_hour,
                });
            }
        }
        candidates.sort_by(|a, b| {
            (a.cost_per_work.total_cmp(&b.cost_per_work))
                .then_with(|| b.share.total_cmp(&a.share))
                .then_with(|| a.live.cmp(&b.live))
        });
        candidates
    }

    /// The candidates taken, cheapest first until the work fits before the
    /// horizon, within the node and hourly caps: the live nodes to keep and
    /// the offers to rent.
    fn choose(&self, candidates: &[Candidate]) -> (Vec<String>, Vec<usize>) {
        let cfg = &self.config;
        // Cheapest first until the work fits before the horizon. A node
        // that can do nothing before it is skipped while others can.
        let need = cfg.safety;
        let mut have = 0.0;
        let mut taken = 0u32;
        let mut rate = 0.0;
        let mut keep: Vec<String> = Vec::new();
        let mut launch: Vec<usize> = Vec::new();
        // Live nodes that are draining or paused still bill: count them
        // against the hourly cap.
        let committed_rate: f64 = (self.nodes.values())
            .filter(|n| !n.released && (n.drained || n.paused_since.is_some()))
            .map(|n| n.offer.usd_per_hour)
            .sum();
        let mut chosen = vec![false; candidates.len()];
        // Two passes: first what helps before the horizon; then, when the
        // work cannot fit (the deadline is lost or passed), the rest as
        // best effort, cheapest first, up to the limits.
        for best_effort in [false, true] {
            for (i, c) in candidates.iter().enumerate() {
                if have >= need || taken >= cfg.max_nodes {
                    break;
                }
                if chosen[i] || (!best_effort && c.share <= 0.0) {
                    continue;
                }
                if let Some(cap) = cfg.max_usd_per_hour {
                    if committed_rate + rate + c.usd_per_hour > cap + 1e-9 {
                        continue;
                    }
                }
                chosen[i] = true;
                have += c.share.max(0.0);
                taken += 1;
                rate += c.usd_per_hour;
                match (&c.live, c.rentable) {
                    (Some(name), _) => keep.push(name.clone()),
                    (None, Some(i)) => launch.push(i),
                    _ => {}
                }
            }
        }
        (keep, launch)
    }

    /// Drains the joined nodes not kept, near the end of their paid
    /// increment.
    fn drain_ranked_out(
        &mut self,
        now: Millis,
        jobs: &[JobDemand],
        keep: &[String],
        actions: &mut Vec<Action>,
    ) {
        // Busy nodes are never dropped before the queue is empty of work
        // they could take, only ranked out; a node ranked out is drained
        // near the end of its paid increment.
        let to_drop: Vec<String> = (self.nodes.iter())
            .filter(|(name, n)| {
                !n.released
                    && !n.drained
                    && n.drain_at.is_none()
                    && n.paused_since.is_none()
                    && n.joined.is_some()
                    && !keep.contains(name)
            })
            .map(|(name, _)| name.clone())
            .collect();
        for name in to_drop {
            let gpu = self.nodes[&name].offer.gpu.clone();
            let task = self.task_ms_any(jobs, &gpu) as Millis;
            let node = self.nodes.get_mut(&name).expect("listed");
            let inc = node.offer.billing.increment().as_millis() as Millis;
            let used = now.saturating_sub(node.launched);
            let paid_until = node.launched + used.div_ceil(inc.max(1)) * inc;
            let at = paid_until.saturating_sub(task).max(now);
            node.drain_at = Some(at);
            if at <= now {
                node.drained = true;
                actions.push(Action::Drain { name });
            }
        }
    }

    /// Rents the chosen offers, at most `max_launches_per_tick` a tick.
    fn launch(
        &mut self,
        now: Millis,
        obs: &Observation,
        launch: Vec<usize>,
        actions: &mut Vec<Action>,
    ) {
        let max_launches = self.config.max_launches_per_tick as usize;
        for i in launch.into_iter().take(max_launches) {
            let r = &obs.offers[i];
            let name = format!("{}{}", self.name_prefix, self.next_name);
            self.next_name += 1;
            self.nodes.insert(
                name.clone(),
                Node {
                    provider: r.provider.clone(),
                    offer: r.offer.clone(),
                    launched: now,
                    joined: None,
                    idle_since: None,
                    paused_since: None,
                    drain_at: None,
                    drained: false,
                    released: false,
                },
            );
            actions.push(Action::Launch {
                name,
                provider: r.provider.clone(),
                offer: r.offer.clone(),
            });
        }
    }

    /// The longest task time among the jobs with work, on `gpu`.
    fn task_ms_any(&self, jobs: &[JobDemand], gpu: &str) -> f64 {
        (jobs.iter())
            .map(|j| self.task_ms(j.id, gpu))
            .fold(0.0, f64::max)
    }

    /// A launch the policy asked for failed (quota, offer gone, rate
    /// limited): forget the node and avoid the offer for a while.
    pub fn launch_failed(&mut self, name: &str, now: Millis) {
        if let Some(node) = self.nodes.remove(name) {
            self.avoid
                .insert((node.provider, node.offer.id), now + self.config.avoid_ms);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::Billing;

    fn offer(id: &str, usd: f64, billing: u32) -> Rentable {
        Rentable {
            provider: "p".into(),
            offer: Offer {
                id: id.into(),
                gpu: "RTX_4090".into(),
                gpu_count: 1,
                vram_gib: 24,
                usd_per_hour: usd,
                interruptible: false,
                region: None,
                billing: Billing::Increment(billing),
            },
            count: 4,
        }
    }

    fn job(queued: u32, running: u32, deadline_ms: Option<Millis>) -> JobDemand {
        JobDemand {
            id: 1,
            queued,
            running,
            deadline_ms,
        }
    }

    fn node(name: &str, state: NodeState, joined: bool, busy: bool) -> NodeView {
        NodeView {
            name: name.into(),
            state,
            joined,
            busy,
        }
    }

    fn launches(actions: &[Action]) -> Vec<String> {
        (actions.iter())
            .filter_map(|a| match a {
                Action::Launch { offer, .. } => Some(offer.id.clone()),
                _ => None,
            })
            .collect()
    }

    fn policy() -> Autoscaler {
        Autoscaler::new(
            PolicyConfig {
                max_nodes: 4,
                idle_timeout_ms: 120_000,
                boot_estimate_ms: 120_000,
                default_task_ms: 60_000,
                ..PolicyConfig::default()
            },
            "n",
        )
    }

    /// Nodes an earlier run left are the policy's: kept while busy,
    /// released when idle, and their names never given to a new node.
    #[test]
    fn adopted_nodes_are_released_when_idle_and_their_names_not_reused() {
        let mut p = policy();
        p.adopt("n7", "p", offer("a", 1.0, 1).offer, 0);
        p.adopt("n3", "p", offer("a", 1.0, 1).offer, 0);
        let busy = Observation {
            jobs: vec![job(0, 1, None)],
            nodes: vec![node("n7", NodeState::Running, true, true)],
            offers: vec![],
        };
        // n3 is not seen any more: gone, released as vanished.
        let actions = p.tick(0, &busy);
        assert_eq!(
            actions,
            vec![Action::Release {
                name: "n3".into(),
                reason: Release::Vanished
            }]
        );
        let idle = Observation {
            jobs: vec![],
            nodes: vec![node("n7", NodeState::Running, true, false)],
            offers: vec![],
        };
        assert!(p.tick(1_000, &idle).is_empty(), "idle timeout not reached");
        let actions = p.tick(121_000, &idle);
        assert_eq!(
            actions,
            vec![Action::Release {
                name: "n7".into(),
                reason: Release::Idle
            }]
        );
        let demand = Observation {
            jobs: vec![job(10, 0, Some(60_000))],
            nodes: vec![],
            offers: vec![offer("a", 1.0, 1)],
        };
        let names: Vec<String> = (p.tick(122_000, &demand).into_iter())
            .filter_map(|a| match a {
                Action::Launch { name, .. } => Some(name),
                _ => None,
            })
            .collect();
        assert_eq!(names.first().map(String::as_str), Some("n8"), "{names:?}");
    }

    #[test]
    fn nothing_queued_rents_nothing() {
        let mut p = policy();
        let obs = Observation {
            jobs: vec![job(0, 0, None)],
            nodes: vec![],
            offers: vec![offer("a", 1.0, 1)],
        };
        assert!(p.tick(0, &obs).is_empty());
    }

    #[test]
    fn a_deadline_rents_the_cheapest_offers_that_meet_it_counting_boot_time() {
        let mut p = policy();
        // 100 tasks × 60 s = 6,000 s of work, due in 2,000 s: a node booting
        // 120 s does 1,880 s of it, so four nodes are needed (with the 10 %
        // margin: 4 × 1,880 ≥ 1.1 × 6,000 fails with three).
        let obs = Observation {
            jobs: vec![job(100, 0, Some(2_000_000))],
            nodes: vec![],
            offers: vec![offer("dear", 2.0, 1), offer("cheap", 0.5, 1)],
        };
        let got = launches(&p.tick(0, &obs));
        assert_eq!(got, ["cheap", "cheap", "cheap", "cheap"]);
        // Without a deadline the default horizon (20 min) asks for all four too;
        // with a loose deadline, one does.
        let mut p = policy();
        let obs = Observation {
            jobs: vec![job(10, 0, Some(3_600_000))],
            ..obs
        };
        assert_eq!(launches(&p.tick(0, &obs)), ["cheap"]);
    }

    #[test]
    fn a_node_that_vanishes_is_replaced_by_another_offer() {
        let mut p = policy();
        let mut obs = Observation {
            jobs: vec![job(10, 0, Some(3_600_000))],
            nodes: vec![],
            offers: vec![offer("cheap", 0.5, 1), offer("other", 0.6, 1)],
        };
        assert_eq!(launches(&p.tick(0, &obs)), ["cheap"]);
        obs.nodes = vec![node("n1", NodeState::Running, true, true)];
        assert!(launches(&p.tick(200_000, &obs)).is_empty());
        // Gone without a release: cleaned up, and replaced elsewhere.
        obs.nodes = vec![node("n1", NodeState::Gone, false, false)];
        let actions = p.tick(300_000, &obs);
        assert!(actions.contains(&Action::Release {
            name: "n1".into(),
            reason: Release::Vanished
        }));
        assert_eq!(launches(&actions), ["other"]);
        assert_eq!(p.replaced, 1);
    }

    #[test]
    fn a_paused_node_counts_as_gone_and_is_taken_back_when_it_resumes() {
        let mut p = policy();
        let mut obs = Observation {
            jobs: vec![job(10, 0, Some(3_600_000))],
            nodes: vec![],
            offers: vec![offer("cheap", 0.5, 1)],
        };
        p.tick(0, &obs);
        obs.nodes = vec![node("n1", NodeState::Running, true, true)];
        p.tick(200_000, &obs);
        obs.nodes = vec![node("n1", NodeState::Paused, false, false)];
        let actions = p.tick(210_000, &obs);
        assert_eq!(
            launches(&actions),
            ["cheap"],
            "a replacement for the paused node"
        );
        assert!(!actions.iter().any(|a| matches!(a, Action::Release { .. })));
        // It resumes: it is kept (not released), and nothing more is rented.
        obs.nodes = vec![
            node("n1", NodeState::Running, true, true),
            node("n2", NodeState::Running, true, true),
        ];
        let actions = p.tick(400_000, &obs);
        assert!(launches(&actions).is_empty());
        assert!(!actions.iter().any(|a| matches!(a, Action::Release { .. })));
        assert_eq!(p.nodes().count(), 2);
    }

    #[test]
    fn idle_nodes_go_after_the_idle_timeout_and_never_booted_ones_are_replaced() {
        let mut p = policy();
        let mut obs = Observation {
            jobs: vec![job(10, 0, Some(3_600_000))],
            nodes: vec![],
            offers: vec![offer("slow", 0.5, 1), offer("other", 0.6, 1)],
        };
        p.tick(0, &obs);
        obs.nodes = vec![node("n1", NodeState::Starting, false, false)];
        let actions = p.tick(900_000, &obs);
        assert!(actions.contains(&Action::Release {
            name: "n1".into(),
            reason: Release::NeverBooted
        }));
        assert_eq!(launches(&actions), ["other"]);
        // n2 joins, renders, the queue empties: released at the idle timeout.
        obs.nodes = vec![node("n2", NodeState::Running, true, true)];
        p.tick(1_000_000, &obs);
        obs.jobs = vec![job(0, 0, None)];
        obs.nodes = vec![node("n2", NodeState::Running, true, false)];
        assert!(p.tick(1_100_000, &obs).is_empty());
        assert!(p.tick(1_219_000, &obs).is_empty());
        assert_eq!(
            p.tick(1_220_000, &obs),
            [Action::Release {
                name: "n2".into(),
                reason: Release::Idle
            }]
        );
    }

    #[test]
    fn a_node_no_longer_needed_is_drained_at_the_end_of_its_paid_minute() {
        let mut p = policy();
        let mut obs = Observation {
            jobs: vec![job(100, 0, Some(2_000_000))],
            nodes: vec![],
            offers: vec![offer("minute", 0.5, 60)],
        };
        assert_eq!(launches(&p.tick(0, &obs)).len(), 4);
        let all: Vec<NodeView> = (1..=4)
            .map(|i| node(&format!("n{i}"), NodeState::Running, true, true))
            .collect();
        obs.nodes = all.clone();
        // Almost done: one node is enough now. At 1,010 s each node has used
        // 17 paid minutes up to 1,020 s; with 60 s tasks, drain at 960 s,
        // i.e. now (the minute is used by the task it runs).
        obs.jobs = vec![job(1, 3, Some(2_000_000))];
        obs.offers = vec![];
        let actions = p.tick(1_010_000, &obs);
        let drained: Vec<_> = (actions.iter())
            .filter(|a| matches!(a, Action::Drain { .. }))
            .collect();
        assert_eq!(drained.len(), 3, "{actions:?}");
        // A drained node goes once it holds nothing.
        obs.nodes[1].busy = false;
        let actions = p.tick(1_030_000, &obs);
        assert_eq!(
            (actions.iter())
                .filter(|a| matches!(
                    a,
                    Action::Release {
                        reason: Release::ScaledDown,
                        ..
                    }
                ))
                .count(),
            1
        );
    }
}

//! A fleet on virtual time: a recorded trace of offers (prices, when they
//! appear and are withdrawn, boot delays, spot preemptions) and one job's
//! tasks, played against the autoscaling policy or a static fleet. Used by
//! `cargo bench --bench fleet` and by `tessera fleet plan`; no I/O.
//!
//! The farm is modelled as the coordinator runs it: one task per GPU slot,
//! tasks handed out first in, first out, a task lost with its node goes
//! back to the front of the queue, and a task is accepted once. A node is
//! billed from launch to release, rounded up to its billing increment.

use std::collections::{BTreeMap, VecDeque};

use crate::policy::{
    Action, Autoscaler, JobDemand, Millis, NodeView, Observation, PolicyConfig, Rentable,
};
use crate::provider::{Billing, NodeState, Offer};

/// One machine on the market in the trace.
#[derive(Clone, Debug)]
pub struct TraceOffer {
    pub provider: String,
    pub offer: Offer,
    /// Listed from this time until `withdrawn_ms` (a node rented from it
    /// keeps running).
    pub appears_ms: Millis,
    pub withdrawn_ms: Millis,
    /// From launch until its worker joins.
    pub boot_ms: Millis,
    /// An interruptible node rented from it is preempted this long after
    /// launch.
    pub preempt_after_ms: Option<Millis>,
    /// Tasks take the job's reference time divided by this.
    pub speed: f64,
}

/// The recorded market.
#[derive(Clone, Debug, Default)]
pub struct Trace {
    pub offers: Vec<TraceOffer>,
}

impl Trace {
    /// Reads the CSV trace: `provider,offer,gpu,vram_gib,usd_per_hour,
    /// interruptible,billing_s,appears_s,withdrawn_s,boot_s,preempt_after_s,speed`
    /// (`#` starts a comment; an empty `preempt_after_s` is never).
    pub fn parse(text: &str) -> Result<Trace, String> {
        let mut offers = Vec::new();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let f: Vec<&str> = line.split(',').map(str::trim).collect();
            if f.len() != 12 {
                return Err(format!(
                    "trace line {}: want 12 fields, got {}",
                    n + 1,
                    f.len()
                ));
            }
            let num = |i: usize| -> Result<f64, String> {
                (f[i].parse::<f64>())
                    .ok()
                    .filter(|v| v.is_finite() && *v >= 0.0)
                    .ok_or_else(|| format!("trace line {}: field {} is not a number", n + 1, i + 1))
            };
            let secs = |i: usize| num(i).map(|v| (v * 1000.0) as Millis);
            offers.push(TraceOffer {
                provider: f[0].to_string(),
                offer: Offer {
                    id: f[1].to_string(),
                    gpu: f[2].to_string(),
                    gpu_count: 1,
                    vram_gib: num(3)? as u32,
                    usd_per_hour: num(4)?,
                    interruptible: f[5] == "1" || f[5] == "true",
                    region: None,
                    billing: Billing::Increment(num(6)?.max(1.0) as u32),
                },
                appears_ms: secs(7)?,
                withdrawn_ms: secs(8)?,
                boot_ms: secs(9)?,
                preempt_after_ms: if f[10].is_empty() {
                    None
                } else {
                    Some(secs(10)?)
                },
                speed: num(11)?.max(0.01),
            });
        }
        Ok(Trace { offers })
    }
}

/// The job played: `tasks` tasks (frames × sample ranges) of
/// `task_ms` each on a GPU of speed 1.
#[derive(Clone, Debug)]
pub struct SimJob {
    pub frames: u32,
    pub tasks: u32,
    pub task_ms: f64,
    pub deadline_ms: Option<Millis>,
}

/// What a run cost and did.
#[derive(Clone, Debug, Default)]
pub struct SimResult {
    pub finish_ms: Millis,
    pub cost_usd: f64,
    pub billed_gpu_ms: f64,
    pub rendered_gpu_ms: f64,
    /// Task time lost with preempted nodes (their sample ranges in flight).
    pub lost_gpu_ms: f64,
    pub tasks_accepted: u32,
    pub tasks_lost: u32,
    /// Tasks accepted more than once (must be 0).
    pub accepted_twice: u32,
    pub nodes_launched: u32,
    pub preempted: u32,
    pub deadline_met: bool,
    /// (provider, offer) of every node rented, in launch order.
    pub rented: Vec<(String, String, Millis, Millis)>,
}

impl SimResult {
    pub fn billed_per_rendered(&self) -> f64 {
        self.billed_gpu_ms / self.rendered_gpu_ms.max(1.0)
    }
}

struct SimNode {
    row: usize,
    launched: Millis,
    /// Tasks in flight: (task, started, ends).
    slots: Vec<Option<(u32, Millis, Millis)>>,
    draining: bool,
    ended: Option<Millis>,
    preempted: bool,
}

/// Virtual time step and policy period.
const STEP_MS: Millis = 1000;
const TICK_MS: Millis = 5000;
/// A run that has not finished by then stops (a policy that never ends).
const GIVE_UP_MS: Millis = 7 * 24 * 3_600_000;

struct World<'a> {
    trace: &'a Trace,
    job: &'a SimJob,
    queue: VecDeque<u32>,
    accepted: Vec<u8>,
    nodes: BTreeMap<String, SimNode>,
    /// Rows rented now or preempted (a preempted machine is not listed again).
    taken: Vec<bool>,
    result: SimResult,
}

impl<'a> World<'a> {
    fn new(trace: &'a Trace, job: &'a SimJob) -> World<'a> {
        World {
            trace,
            job,
            queue: (0..job.tasks).collect(),
            accepted: vec![0; job.tasks as usize],
            nodes: BTreeMap::new(),
            taken: vec![false; trace.offers.len()],
            result: SimResult::default(),
        }
    }

    fn launch(&mut self, name: String, row: usize, now: Millis) {
        let t = &self.trace.offers[row];
        self.taken[row] = true;
        self.result.nodes_launched += 1;
        self.nodes.insert(
            name,
            SimNode {
                row,
                launched: now,
                slots: vec![None; t.offer.gpu_count.max(1) as usize],
                draining: false,
                ended: None,
                preempted: false,
            },
        );
    }

    fn end(&mut self, name: &str, now: Millis) {
        let Some(n) = self.nodes.get_mut(name) else {
            return;
        };
        if n.ended.is_some() {
            return;
        }
        n.ended = Some(now);
        for slot in n.slots.iter_mut() {
            if let Some((task, started, _)) = slot.take() {
                self.result.lost_gpu_ms += now.saturating_sub(started) as f64;
                self.result.tasks_lost += 1;
                self.queue.push_front(task);
            }
        }
        let t = &self.trace.offers[n.row];
        let inc = t.offer.billing.increment().as_millis() as Millis;
        let billed = now.saturating_sub(n.launched).div_ceil(inc) * inc;
        let gpus = f64::from(t.offer.gpu_count.max(1));
        self.result.billed_gpu_ms += billed as f64 * gpus;
        self.result.cost_usd += billed as f64 * t.offer.usd_per_hour / 3_600_000.0;
        if !n.preempted {
            self.taken[n.row] = false;
        }
        let row = n.row;
        self.result
            .rented
            .push((t.provider.clone(), t.offer.id.clone(), n.launched, now));
        let _ = row;
    }

    fn ready(&self, n: &SimNode, now: Millis) -> bool {
        now >= n.launched + self.trace.offers[n.row].boot_ms
    }

    /// Moves nodes on by one step: preemptions, finished tasks, new tasks.
    /// Returns the finished tasks' (gpu, ms) for the policy.
    fn step(&mut self, now: Millis) -> Vec<(String, f64)> {
        let mut observed = Vec::new();
        let names: Vec<String> = self.nodes.keys().cloned().collect();
        for name in names {
            let (row, launched, ended) = {
                let n = &self.nodes[&name];
                (n.row, n.launched, n.ended)
            };
            if ended.is_some() {
                continue;
            }
            let t = &self.trace.offers[row];
            if t.offer.interruptible {
                if let Some(after) = t.preempt_after_ms {
                    if now >= launched + after {
                        self.nodes.get_mut(&name).expect("node").preempted = true;
                        self.result.preempted += 1;
                        self.end(&name, now);
                        continue;
                    }
                }
            }
            if !self.ready(&self.nodes[&name], now) {
                continue;
            }
            let speed = t.speed;
            let gpu = t.offer.gpu.clone();
            let task_ms = (self.job.task_ms / speed) as Millis;
            let n = self.nodes.get_mut(&name).expect("node");
            for slot in n.slots.iter_mut() {
                if let Some((task, started, ends)) = *slot {
                    if now >= ends {
                        *slot = None;
                        let a = &mut self.accepted[task as usize];
                        *a += 1;
                        if *a > 1 {
                            self.result.accepted_twice += 1;
                        } else {
                            self.result.tasks_accepted += 1;
                        }
                        let ms = ends.saturating_sub(started) as f64;
                        self.result.rendered_gpu_ms += ms;
                        observed.push((gpu.clone(), ms));
                        self.result.finish_ms = self.result.finish_ms.max(ends);
                    }
                }
                if slot.is_none() && !n.draining {
                    if let Some(task) = self.queue.pop_front() {
                        *slot = Some((task, now, now + task_ms.max(1)));
                    }
                }
            }
        }
        observed
    }

    fn running(&self) -> u32 {
        (self.nodes.values())
            .filter(|n| n.ended.is_none())
            .map(|n| n.slots.iter().filter(|s| s.is_some()).count() as u32)
            .sum()
    }

    fn all_done(&self) -> bool {
        self.result.tasks_accepted == self.job.tasks
    }

    fn finish(mut self) -> SimResult {
        self.result.deadline_met = self.all_done()
            && self
                .job
                .deadline_ms
                .is_none_or(|d| self.result.finish_ms <= d);
        self.result
    }
}

/// Plays the trace with the policy renting and releasing nodes.
pub fn run_autoscaled(trace: &Trace, job: &SimJob, config: PolicyConfig) -> SimResult {
    let mut world = World::new(trace, job);
    let mut policy = Autoscaler::new(config, "sim-");
    let mut now: Millis = 0;
    let mut rows_of: BTreeMap<String, usize> = BTreeMap::new();
    loop {
        for (gpu, ms) in world.step(now) {
            policy.observe_task(1, &gpu, ms);
        }
        let alive = world.nodes.values().any(|n| n.ended.is_none());
        if world.all_done() && !alive {
            break;
        }
        if now >= GIVE_UP_MS {
            break;
        }
        if now.is_multiple_of(TICK_MS) {
            let running = world.running();
            let obs = Observation {
                jobs: vec![JobDemand {
                    id: 1,
                    queued: world.queue.len() as u32,
                    running,
                    deadline_ms: job.deadline_ms,
                }],
                nodes: (world.nodes.iter())
                    .map(|(name, n)| NodeView {
                        name: name.clone(),
                        state: if n.ended.is_some() {
                            NodeState::Gone
                        } else if world.ready(n, now) {
                            NodeState::Running
                        } else {
                            NodeState::Starting
                        },
                        joined: n.ended.is_none() && world.ready(n, now),
                        busy: n.slots.iter().any(|s| s.is_some()),
                    })
                    .collect(),
                offers: (trace.offers.iter().enumerate())
                    .filter(|(i, t)| {
                        !world.taken[*i] && t.appears_ms <= now && now < t.withdrawn_ms
                    })
                    .map(|(_, t)| Rentable {
                        provider: t.provider.clone(),
                        offer: t.offer.clone(),
                        count: 1,
                    })
                    .collect(),
            };
            for action in policy.tick(now, &obs) {
                match action {
                    Action::Launch {
                        name,
                        provider,
                        offer,
                    } => {
                        let row = trace.offers.iter().enumerate().position(|(i, t)| {
                            !world.taken[i] && t.provider == provider && t.offer.id == offer.id
                        });
                        match row {
                            Some(row) => {
                                rows_of.insert(name.clone(), row);
                                world.launch(name, row, now);
                            }
                            None => policy.launch_failed(&name, now),
                        }
                    }
                    Action::Drain { name } => {
                        if let Some(n) = world.nodes.get_mut(&name) {
                            n.draining = true;
                        }
                    }
                    Action::Release { name, .. } => world.end(&name, now),
                }
            }
            // Ended nodes are reported gone once, then forgotten.
            world.nodes.retain(|_, n| n.ended.is_none());
        }
        now += STEP_MS;
    }
    world.result.nodes_launched = world.result.rented.len() as u32
        + world.nodes.values().filter(|n| n.ended.is_none()).count() as u32;
    world.finish()
}

/// Plays the trace with these rows rented at the start and all released
/// when the job is done.
pub fn run_static(trace: &Trace, job: &SimJob, rows: &[usize]) -> SimResult {
    let mut world = World::new(trace, job);
    for (i, &row) in rows.iter().enumerate() {
        world.launch(format!("static-{i}"), row, 0);
    }
    let mut now = 0;
    while !world.all_done() && now < GIVE_UP_MS {
        world.step(now);
        if world.nodes.values().all(|n| n.ended.is_some()) {
            break;
        }
        now += STEP_MS;
    }
    let names: Vec<String> = world.nodes.keys().cloned().collect();
    for name in names {
        world.end(&name, now);
    }
    world.finish()
}

/// The cheapest static fleet of on-demand offers listed at the start that
/// meets the job's deadline: for each fleet size, the offers cheapest per
/// unit of work; the size that costs least wins.
pub fn cheapest_static(trace: &Trace, job: &SimJob) -> Option<(Vec<usize>, SimResult)> {
    let mut rows: Vec<usize> = (trace.offers.iter().enumerate())
        .filter(|(_, t)| !t.offer.interruptible && t.appears_ms == 0)
        .map(|(i, _)| i)
        .collect();
    rows.sort_by(|&a, &b| {
        let ca = trace.offers[a].offer.usd_per_hour / trace.offers[a].speed;
        let cb = trace.offers[b].offer.usd_per_hour / trace.offers[b].speed;
        ca.total_cmp(&cb)
    });
    let mut best: Option<(Vec<usize>, SimResult)> = None;
    // Every size, and for each the cheapest per work, or the cheapest
    // per work among the faster half (a few fast nodes may beat many).
    for n in 1..=rows.len() {
        let fleet: Vec<usize> = rows[..n].to_vec();
        let r = run_static(trace, job, &fleet);
        if r.deadline_met && best.as_ref().is_none_or(|(_, b)| r.cost_usd < b.cost_usd) {
            best = Some((fleet, r));
        }
    }
    best
}

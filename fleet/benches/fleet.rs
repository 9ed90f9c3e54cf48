//! The cost policy on virtual time: a 500-frame job (4 sample ranges a
//! frame) against the recorded market in `benches/data/fleet_trace.csv`
//! (offers coming and going, prices, boot delays of 60–180 s, spot
//! preemptions). Run 1: the autoscaler on on-demand offers against the
//! cheapest static fleet that meets the same deadline. Run 2: the
//! autoscaler allowed interruptible offers against run 1's on-demand-only
//! fleet. Prints the figures and fails when a target is missed.
//!
//! `cargo bench -p tessera-fleet --bench fleet`

use tessera_fleet::policy::PolicyConfig;
use tessera_fleet::sim::{cheapest_static, run_autoscaled, SimJob, SimResult, Trace};

fn show(label: &str, r: &SimResult, frames: u32) {
    println!(
        "{label:<34} ${:>7.2}  ${:.4}/frame  finish {:>6.0} s  billed {:>6.2} GPU-h  rendered {:>6.2} GPU-h  ratio {:.3}  nodes {:>2}  preempted {:>2}  lost {:>3} ranges ({:.2} GPU-h)  twice {}",
        r.cost_usd,
        r.cost_usd / f64::from(frames),
        r.finish_ms as f64 / 1000.0,
        r.billed_gpu_ms / 3.6e6,
        r.rendered_gpu_ms / 3.6e6,
        r.billed_per_rendered(),
        r.nodes_launched,
        r.preempted,
        r.tasks_lost,
        r.lost_gpu_ms / 3.6e6,
        r.accepted_twice,
    );
}

fn main() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../benches/data/fleet_trace.csv"
    );
    let trace = Trace::parse(&std::fs::read_to_string(path).expect("trace")).expect("trace parses");
    let deadline_ms = 2 * 3_600_000;
    let job = SimJob {
        frames: 500,
        tasks: 2000,
        task_ms: 15_000.0,
        deadline_ms: Some(deadline_ms),
    };
    let config = PolicyConfig {
        max_nodes: 16,
        default_task_ms: 15_000,
        ..PolicyConfig::default()
    };
    println!(
        "fleet cost policy: {} frames × 4 sample ranges, 15 s a range on an RTX 4090, deadline {} s, {} offers in the trace",
        job.frames,
        deadline_ms / 1000,
        trace.offers.len()
    );
    let (rows, fixed) = cheapest_static(&trace, &job).expect("a static fleet meets the deadline");
    let names: Vec<&str> = rows
        .iter()
        .map(|&i| trace.offers[i].offer.id.as_str())
        .collect();
    show("static (cheapest meeting deadline)", &fixed, job.frames);
    println!("  static fleet: {}", names.join(", "));
    let auto = run_autoscaled(&trace, &job, config.clone());
    show("autoscaled, on-demand", &auto, job.frames);
    let spot = run_autoscaled(
        &trace,
        &job,
        PolicyConfig {
            interruptible: true,
            ..config
        },
    );
    show("autoscaled, with interruptible", &spot, job.frames);

    let cost_ratio = auto.cost_usd / fixed.cost_usd;
    let frame_ratio = spot.cost_usd / auto.cost_usd;
    println!("autoscaled ÷ static cost:              {cost_ratio:.3} (target ≤ 0.9)");
    println!(
        "autoscaled billed ÷ rendered GPU-hours: {:.3} (target ≤ 1.15)",
        auto.billed_per_rendered()
    );
    println!(
        "deadline met: static {}, autoscaled {}, with interruptible {}",
        fixed.deadline_met, auto.deadline_met, spot.deadline_met
    );
    println!("with interruptible ÷ on-demand-only cost per frame: {frame_ratio:.3} (target ≤ 0.4)");
    println!(
        "rendered beyond the job's own GPU-hours with interruptible: {:.3} GPU-h, all of it {} preempted sample ranges",
        spot.lost_gpu_ms / 3.6e6,
        spot.tasks_lost
    );
    let mut missed = Vec::new();
    if cost_ratio > 0.9 {
        missed.push("autoscaled cost > 0.9 × static");
    }
    if auto.billed_per_rendered() > 1.15 {
        missed.push("billed ÷ rendered > 1.15");
    }
    if !(auto.deadline_met && spot.deadline_met && fixed.deadline_met) {
        missed.push("a deadline was missed");
    }
    if frame_ratio > 0.4 {
        missed.push("interruptible cost per frame > 0.4 × on-demand");
    }
    let all = |r: &SimResult| r.tasks_accepted == job.tasks && r.accepted_twice == 0;
    if !(all(&auto) && all(&spot) && all(&fixed)) {
        missed.push("a task was not accepted exactly once");
    }
    // Lost work is only what preempted nodes held: at most one range per
    // GPU of each preempted node, none lost otherwise.
    if spot.tasks_lost > spot.preempted || auto.tasks_lost > 0 || fixed.tasks_lost > 0 {
        missed.push("ranges were lost beyond those preempted nodes held");
    }
    if std::env::var_os("FLEET_BENCH_NODES").is_some() {
        for (p, o, from, to) in &spot.rented {
            println!(
                "  {p} {o} {:.0}-{:.0} s",
                *from as f64 / 1e3,
                *to as f64 / 1e3
            );
        }
    }
    if !missed.is_empty() {
        eprintln!("targets missed: {}", missed.join("; "));
        std::process::exit(1);
    }
}

//! A network partition for real: the farm runs in two network namespaces
//! this test creates (`ip netns`, iproute2), joined by a veth pair that
//! carries loopback-range addresses only. The coordinator and one worker
//! live in one namespace, the victim worker in the other; taking the
//! victim's end of the link down cuts it off like a pulled cable, and
//! bringing it up heals it. Needs root (the test machines and CI are):
//! `#[ignore = "needs root and iproute2"]`, failed if run without them.

use std::process::Command;

use crate::harness::{assert_frames_match_reference_samples, field, scenes, Farm, State};
use crate::requires::{require, Need};

/// Two namespaces and the veth pair between them, removed on drop.
struct Partition {
    farm_ns: String,
    victim_ns: String,
    victim_link: String,
}

/// The coordinator's side of the link, and the victim's.
const FARM_IP: &str = "127.77.0.1";
const VICTIM_IP: &str = "127.77.0.2";

pub fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("iproute2's `ip` runs (apt-get install iproute2)");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Partition {
    fn create() -> Partition {
        let id = std::process::id();
        let p = Partition {
            farm_ns: format!("tessera-farm-{id}"),
            victim_ns: format!("tessera-victim-{id}"),
            victim_link: format!("tsv{id}"),
        };
        let farm_link = format!("tsf{id}");
        for ns in [&p.farm_ns, &p.victim_ns] {
            ip(&["netns", "add", ns]);
        }
        ip(&[
            "link",
            "add",
            &farm_link,
            "type",
            "veth",
            "peer",
            "name",
            &p.victim_link,
        ]);
        for (ns, link, addr) in [
            (&p.farm_ns, &farm_link, FARM_IP),
            (&p.victim_ns, &p.victim_link, VICTIM_IP),
        ] {
            ip(&["link", "set", link, "netns", ns]);
            ip(&["-n", ns, "link", "set", "lo", "up"]);
            ip(&["-n", ns, "addr", "add", &format!("{addr}/30"), "dev", link]);
            // 127/8 is local to `lo` and martian on other links: let these
            // namespaces route their slice of it over the veth instead.
            ip(&[
                "-n",
                ns,
                "route",
                "del",
                "127.0.0.0/8",
                "dev",
                "lo",
                "table",
                "local",
            ]);
            for conf in ["all", link.as_str()] {
                let out = Command::new("ip")
                    .args(["netns", "exec", ns, "sysctl", "-qw"])
                    .arg(format!("net.ipv4.conf.{conf}.route_localnet=1"))
                    .output()
                    .unwrap();
                assert!(out.status.success(), "{out:?}");
            }
            ip(&["-n", ns, "link", "set", link, "up"]);
        }
        p
    }

    /// Cuts the victim off: its end of the link goes down.
    fn cut(&self) {
        ip(&[
            "-n",
            &self.victim_ns,
            "link",
            "set",
            &self.victim_link,
            "down",
        ]);
    }

    fn heal(&self) {
        ip(&[
            "-n",
            &self.victim_ns,
            "link",
            "set",
            &self.victim_link,
            "up",
        ]);
    }
}

impl Drop for Partition {
    fn drop(&mut self) {
        // Deleting a namespace deletes the veth pair with it.
        for ns in [&self.farm_ns, &self.victim_ns] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

#[test]
#[ignore = "needs root and iproute2"]
fn a_partitioned_worker_loses_its_tasks_then_rejoins_and_its_stale_result_is_refused() {
    a_partitioned_worker_loses_its_tasks_then_rejoins_and_its_stale_result_is_refused_on(
        State::Sqlite,
    );
}

/// The same with the coordinator's state in PostgreSQL and its assets in
/// an S3-compatible object store (Garage, in the coordinator's namespace).
#[test]
#[ignore = "needs PostgreSQL (initdb, postgres), Garage and root with iproute2"]
fn a_partitioned_worker_loses_its_tasks_then_rejoins_and_its_stale_result_is_refused_on_postgresql_and_s3(
) {
    a_partitioned_worker_loses_its_tasks_then_rejoins_and_its_stale_result_is_refused_on(
        State::PostgresS3,
    );
}

fn a_partitioned_worker_loses_its_tasks_then_rejoins_and_its_stale_result_is_refused_on(
    state: State,
) {
    require(Need::RootNetns);
    let net = Partition::create();
    // Heartbeats every 300 ms, leases of 1 s; the QUIC idle timeout is 10 s.
    let mut farm = Farm::start_in_state(
        "partition",
        &["--heartbeat-ms", "300", "--lease-ms", "1000"],
        Some(&net.farm_ns),
        FARM_IP,
        state,
    );
    let victim = farm.add_worker_in(Some(&net.victim_ns), "victim", &[], &[]);
    farm.add_worker("survivor");
    let scene = scenes().join("demo.scene.json");
    let id = farm.submit_demo_frame("4x4");
    // Cut the victim off while it renders (after it finished one tile, so
    // it is known to work across the link).
    farm.wait_for(id, "the victim to render a tile over the veth", |_| {
        farm.log_of(victim).contains("result accepted")
    });
    farm.wait_mid_render(id, victim, "victim");
    let rendered_before = farm.log_of(victim).matches("task rendered").count();
    net.cut();
    // The coordinator gives the victim's task to the survivor and, after
    // the idle timeout, drops its connection (it leaves `status`), while
    // the victim finishes its render and cannot deliver it.
    let rendered = |farm: &Farm| -> Vec<u64> {
        (farm.log_of(victim).lines())
            .filter(|l| l.contains("task rendered"))
            .filter_map(|l| field(l, "task"))
            .collect()
    };
    farm.wait_for(
        id,
        "the victim to render during the partition and be dropped",
        |_| {
            let workers = farm.json(&["status", "--json"])["workers"].clone();
            let gone = !(workers.as_array().unwrap().iter()).any(|w| w["name"] == "victim");
            gone && rendered(&farm).len() > rendered_before
        },
    );
    // Follow the task the victim actually rendered during the partition.
    // Its lease expired and the survivor took it over — unless its result
    // got through just as the link was cut (only the acknowledgement was
    // lost); then the lease that expired is one handed to the victim at
    // the cut, which never reached it. Either way, every lease the victim
    // lost went to the survivor.
    let lost_task = rendered(&farm)[rendered_before];
    let log = farm.coordinator_log();
    let expired: Vec<u64> = (log.lines())
        .filter(|l| l.contains("lease expired; task requeued") && l.contains("name=\"victim\""))
        .filter_map(|l| field(l, "task"))
        .collect();
    assert!(!expired.is_empty(), "no lease of the victim expired: {log}");
    // The survivor (one slot) takes them one after another, each once it
    // finished what it renders: waited for, not asserted at this instant
    // (it was still rendering the first when the victim left, under load).
    let restarted = |task: u64| {
        (farm.coordinator_log().lines()).any(|l| {
            l.contains("requeued task restarted")
                && l.contains("name=\"survivor\"")
                && field(l, "task") == Some(task)
        })
    };
    farm.wait_for(
        id,
        "the victim's lost tasks restarted on the survivor",
        |_| expired.iter().all(|&task| restarted(task)),
    );
    net.heal();

    let out = farm.dir.join("out");
    let done = farm.wait_done(id, &out);
    assert_eq!(done["tasks_done"], 16);
    assert_frames_match_reference_samples(&out, &scene, &[1], 256);

    // Healed, the victim rejoins by itself and names the task it still
    // holds; the coordinator does not take it back, and refuses the stale
    // result the victim sends again.
    farm.wait_for(id, "the victim to rejoin", |_| {
        farm.log_of(victim).matches("joined the farm").count() == 2
    });
    let about_lost = |log: &str, what: &str| {
        log.lines()
            .any(|l| l.contains(what) && field(l, "task") == Some(lost_task))
    };
    farm.wait_for(id, "the stale result refused", |_| {
        about_lost(&farm.log_of(victim), "result refused")
    });
    let log = farm.coordinator_log();
    assert!(about_lost(&log, "not re-adopted"), "{log}");
    assert!(about_lost(&log, "result refused"), "{log}");
    // No task was accepted twice (the job counted 16 above; an
    // acknowledgement lost at the cut is the one a worker may not have
    // heard).
    let mut accepted = farm.accepted();
    let n = accepted.len();
    accepted.sort();
    accepted.dedup();
    assert_eq!(accepted.len(), n, "a task was accepted twice");
    assert!((15..=16).contains(&n), "{n} acknowledgements for 16 tasks");

    // And it takes new work again.
    let before = farm.log_of(victim).matches("result accepted").count();
    let next = farm.json(&[
        "submit",
        scene.to_str().unwrap(),
        "--frames",
        "2",
        "--tiles",
        "4x4",
        "--samples",
        "32",
        "--json",
    ]);
    let next = next["id"].as_u64().unwrap();
    assert_eq!(
        farm.json(&["wait", &next.to_string(), "--json"])["state"],
        "done"
    );
    assert!(
        farm.log_of(victim).matches("result accepted").count() > before,
        "the rejoined worker rendered none of the next job"
    );
}

//! Unreal project dedupe (`cargo bench --bench unreal`): a generated
//! project of `TESSERA_BENCH_MIB` MiB (default 2048) whose one `.umap` is
//! changed by 1 % and resubmitted; prints the bytes the resubmit uploads
//! and the bytes a worker holding the previous version fetches, each as a
//! ratio to the changed bytes (target <= 3). Rendering uses the STAND-IN for
//! Unreal (`tests/unreal_standin.py`, needs python3); no real Unreal runs.

#[path = "../tests/e2e/harness.rs"]
#[allow(dead_code)]
mod harness;
#[path = "../tests/e2e/unreal_dedupe.rs"]
mod unreal_dedupe;

fn main() {
    let mib: u64 = std::env::var("TESSERA_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2048);
    let started = std::time::Instant::now();
    let f = unreal_dedupe::resubmit_with_the_map_edited("bench-unreal", mib);
    f.print();
    println!("  ({:.0} s in all)", started.elapsed().as_secs_f64());
}

//! An Unreal project resubmitted with one `.umap` changed by 1 %: the
//! resubmit uploads about the changed bytes, and a worker that rendered the
//! previous version fetches only the chunks it lacks. Rendering uses the
//! STAND-IN for Unreal (`tests/unreal_standin.py`); the bytes that travel
//! are Tessera's own.
//!
//! This file is shared: the e2e test runs it on a small project (CI), and
//! `cargo bench --bench unreal` on a 2 GiB one (`TESSERA_BENCH_MIB`).

use std::path::{Path, PathBuf};

use crate::harness::{noise, Farm};

const MIB: u64 = 1 << 20;

/// What one run measured.
pub struct Figures {
    pub project_bytes: u64,
    pub map_bytes: u64,
    pub changed: u64,
    pub first_uploaded: u64,
    pub resubmit_uploaded: u64,
    pub first_to_worker: u64,
    pub resubmit_to_worker: u64,
}

/// A project of about `mib` MiB: a `.umap` of a quarter of it (starting
/// with the stand-in's `StandInMap` line), the rest in `.uasset` files of
/// at most 64 MiB, plus the stand-in's sequence and config.
fn generate(dir: &Path, mib: u64) -> PathBuf {
    let write = |rel: &str, body: &[u8]| {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, body).unwrap();
    };
    write("Film.uproject", br#"{"FileVersion": 3, "Plugins": []}"#);
    write(
        "Content/Seq/Main.uasset",
        b"StandInLevelSequence\nshots=sh010:1-2\n",
    );
    write(
        "Content/Cine/Config.uasset",
        b"StandInMoviePipelinePrimaryConfig\nformat=png\nhistory=1\n",
    );
    let total = mib * MIB;
    let mut map = b"StandInMap\n".to_vec();
    map.extend(noise((total / 4) as usize, 1));
    write("Content/Maps/Main.umap", &map);
    let mut left = total - total / 4;
    let mut i = 0;
    while left > 0 {
        let n = left.min(64 * MIB);
        write(
            &format!("Content/Assets/A{i:03}.uasset"),
            &noise(n as usize, 100 + i),
        );
        left -= n;
        i += 1;
    }
    dir.join("Film.uproject")
}

/// XORs 1 % of the map's bytes, in regions of about 48 KiB or more (at
/// most 40) spread over it; returns how many bytes changed.
fn edit_map(path: &Path) -> u64 {
    let mut data = std::fs::read(path).unwrap();
    let target = data.len() / 100;
    let regions = (target / (48 * 1024)).clamp(1, 40);
    let len = target / regions;
    let stride = (data.len() - 16) / regions;
    for i in 0..regions {
        let start = 16 + i * stride + (stride - len) / 2;
        for b in &mut data[start..start + len] {
            *b ^= 0xa5;
        }
    }
    std::fs::write(path, &data).unwrap();
    (len * regions) as u64
}

fn u(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// Submits the project, renders it on one stand-in worker, edits the map,
/// resubmits, renders again on the same worker; returns the figures.
pub fn resubmit_with_the_map_edited(name: &str, mib: u64) -> Figures {
    let mut farm = Farm::start(name, &[]);
    let dir = farm.dir.join("Film");
    let uproject = generate(&dir, mib);
    let project_bytes: u64 = walk_size(&dir);
    let standin = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/unreal_standin.py");
    farm.add_worker_with(
        "ue",
        &[
            "--engine",
            "unreal",
            "--unreal-editor",
            standin.to_str().unwrap(),
        ],
    );
    let submit = |farm: &Farm| {
        farm.json(&[
            "submit",
            uproject.to_str().unwrap(),
            "--level-sequence",
            "/Game/Seq/Main",
            "--map",
            "/Game/Maps/Main",
            "--mrq-config",
            "/Game/Cine/Config",
            "--frames",
            "1-2",
            "--resolution",
            "8x8",
            "--json",
        ])
    };
    let render = |farm: &Farm, job: &serde_json::Value| {
        let id = u(&job["id"]);
        let done = farm.wait_for(id, "the job to finish", |s| {
            matches!(s["state"].as_str(), Some("done" | "failed"))
        });
        assert_eq!(done["state"], "done", "{done}");
        u(&done["bytes_to_workers"])
    };
    let first = submit(&farm);
    let first_to_worker = render(&farm, &first);
    let map = dir.join("Content/Maps/Main.umap");
    let changed = edit_map(&map);
    let second = submit(&farm);
    let resubmit_to_worker = render(&farm, &second);
    Figures {
        project_bytes,
        map_bytes: std::fs::metadata(&map).unwrap().len(),
        changed,
        first_uploaded: u(&first["bytes_uploaded"]),
        resubmit_uploaded: u(&second["bytes_uploaded"]),
        first_to_worker,
        resubmit_to_worker,
    }
}

fn walk_size(dir: &Path) -> u64 {
    (std::fs::read_dir(dir).unwrap().flatten())
        .map(|e| {
            let m = e.metadata().unwrap();
            if m.is_dir() {
                walk_size(&e.path())
            } else {
                m.len()
            }
        })
        .sum()
}

impl Figures {
    pub fn print(&self) {
        let ratio = |a: u64| a as f64 / self.changed as f64;
        println!(
            "unreal project {:.1} MiB, map {:.1} MiB, {} bytes of the map changed (1 %)",
            self.project_bytes as f64 / MIB as f64,
            self.map_bytes as f64 / MIB as f64,
            self.changed
        );
        println!(
            "  first submit uploaded {} bytes; resubmit uploaded {} bytes = {:.2}x the changed bytes (target <= 3)",
            self.first_uploaded,
            self.resubmit_uploaded,
            ratio(self.resubmit_uploaded)
        );
        println!(
            "  the worker fetched {} bytes for the first version, {} for the edited one = {:.2}x the changed bytes (target <= 3)",
            self.first_to_worker,
            self.resubmit_to_worker,
            ratio(self.resubmit_to_worker)
        );
    }
}

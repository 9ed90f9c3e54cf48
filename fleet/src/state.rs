//! The fleet's state file: the nodes it holds, written after every tick, so
//! that a fleet killed with SIGKILL (or whose machine died) adopts them when
//! it starts again instead of leaving them to bill. The provider's own
//! listing (by the name prefix) covers a node launched just before the
//! crash, before the file said so.
//!
//! The file is read as untrusted input: its size, node count and names are
//! bounded, and a file that does not parse is reported and ignored (the
//! listing still finds the nodes of providers that can list).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::config::MAX_NODES;
use crate::provider::Offer;

/// The most a state file may hold, in bytes.
pub const MAX_STATE_BYTES: u64 = 4 << 20;

/// One node the fleet holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SavedNode {
    /// The fleet's name for it (also its worker's name).
    pub name: String,
    /// The provider's name in the fleet file.
    pub provider: String,
    /// The provider's own id for it.
    pub node: String,
    pub offer: Offer,
    /// When it was launched (for what it is billed).
    pub launched_unix_ms: u64,
}

#[derive(Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FleetState {
    pub name_prefix: String,
    pub nodes: Vec<SavedNode>,
}

impl FleetState {
    /// Reads the state file; a missing file is an empty state.
    pub fn load(path: &Path) -> Result<FleetState, String> {
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(FleetState::default()),
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
        };
        if meta.len() > MAX_STATE_BYTES {
            return Err(format!(
                "{} is {} bytes, more than a state file holds ({MAX_STATE_BYTES})",
                path.display(),
                meta.len()
            ));
        }
        let bytes =
            std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        FleetState::parse(&bytes).map_err(|e| format!("{}: {e}", path.display()))
    }

    pub fn parse(bytes: &[u8]) -> Result<FleetState, String> {
        let state: FleetState =
            serde_json::from_slice(bytes).map_err(|e| format!("not a fleet state file: {e}"))?;
        if state.nodes.len() > MAX_NODES as usize {
            return Err(format!("more than {MAX_NODES} nodes"));
        }
        for n in &state.nodes {
            // A name is the fleet's (prefix and number); a provider's id may
            // hold `.`, `:` or `/` (a pod, an instance URL), never `..`.
            let ok = |s: &str, extra: &str| {
                !s.is_empty()
                    && s.len() <= 256
                    && !s.contains("..")
                    && (s.chars()).all(|c| c.is_ascii_alphanumeric() || extra.contains(c))
            };
            if !ok(&n.name, "-_") || !ok(&n.node, "-_.:/") || n.provider.len() > 256 {
                return Err(format!("a node with an invalid name or id: {:?}", n.name));
            }
        }
        Ok(state)
    }

    /// Writes the file whole (a temporary file renamed over it).
    pub fn save(&self, path: &Path) -> Result<(), String> {
        let text = serde_json::to_vec_pretty(self).map_err(|e| e.to_string())?;
        let tmp = path.with_extension("tmp");
        std::fs::write(&tmp, text).map_err(|e| format!("cannot write {}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, path).map_err(|e| format!("cannot write {}: {e}", path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::Billing;

    fn node(name: &str) -> SavedNode {
        SavedNode {
            name: name.into(),
            provider: "local".into(),
            node: name.into(),
            offer: Offer {
                id: "local-node".into(),
                gpu: "cpu".into(),
                gpu_count: 1,
                vram_gib: 0,
                usd_per_hour: 0.36,
                interruptible: false,
                region: None,
                billing: Billing::Increment(1),
            },
            launched_unix_ms: 1_700_000_000_000,
        }
    }

    #[test]
    fn a_state_file_round_trips_and_bad_ones_are_refused() {
        let dir = std::env::temp_dir().join(format!("fleet-state-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("fleet.state.json");
        assert_eq!(FleetState::load(&path).unwrap(), FleetState::default());
        let state = FleetState {
            name_prefix: "f-".into(),
            nodes: vec![node("f-1"), node("f-2")],
        };
        state.save(&path).unwrap();
        assert_eq!(FleetState::load(&path).unwrap(), state);

        assert!(FleetState::parse(b"{not json").is_err());
        let mut bad = FleetState::default();
        bad.nodes.push(node("../../etc"));
        let text = serde_json::to_vec(&bad).unwrap();
        assert!(FleetState::parse(&text)
            .unwrap_err()
            .contains("invalid name"));
        let many = FleetState {
            name_prefix: "f-".into(),
            nodes: (0..=MAX_NODES).map(|i| node(&format!("f-{i}"))).collect(),
        };
        let text = serde_json::to_vec(&many).unwrap();
        assert!(FleetState::parse(&text).unwrap_err().contains("more than"));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

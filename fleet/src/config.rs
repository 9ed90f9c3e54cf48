//! The fleet file (`fleet.toml`): which providers to rent from, what to
//! rent, the worker image, the limits. Credentials are named, never
//! written: `{ env = "VAR" }` or `{ file = "PATH" }`, read when the fleet
//! starts and held as [`Secret`]s, which never print.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::policy::PolicyConfig;
use crate::provider::{Offer, Secret};

/// Where a credential comes from.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum CredentialSource {
    Env { env: String },
    File { file: PathBuf },
}

impl CredentialSource {
    /// Reads the credential; a file's content is trimmed of its line end.
    /// A relative file is read from the fleet file's folder.
    pub fn read(&self, base: &Path) -> Result<Secret, String> {
        match self {
            CredentialSource::Env { env } => match std::env::var(env) {
                Ok(v) if !v.trim().is_empty() => Ok(Secret::new(v.trim())),
                _ => Err(format!(
                    "the credential's environment variable {env} is not set"
                )),
            },
            CredentialSource::File { file } => {
                let path = base.join(file);
                let text = std::fs::read_to_string(&path).map_err(|e| {
                    format!("cannot read the credential file {}: {e}", path.display())
                })?;
                let v = text.trim();
                if v.is_empty() {
                    return Err(format!("the credential file {} is empty", path.display()));
                }
                Ok(Secret::new(v))
            }
        }
    }
}

/// The whole fleet file.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FleetFile {
    /// The worker ticket given to each node (as `TESSERA_WORKER_TICKET`).
    pub worker_ticket: CredentialSource,
    /// The worker image (Docker reference or template id), for providers
    /// that run images.
    #[serde(default = "default_image")]
    pub image: String,
    /// Arguments after `tessera worker` on every node.
    #[serde(default)]
    pub worker_args: Vec<String>,
    #[serde(default = "default_max_nodes")]
    pub max_nodes: u32,
    pub max_usd_per_hour: Option<f64>,
    #[serde(default = "default_idle")]
    pub idle_timeout_secs: u64,
    #[serde(default = "default_boot_timeout")]
    pub boot_timeout_secs: u64,
    /// Allow interruptible (spot, bid) offers.
    #[serde(default)]
    pub interruptible: bool,
    /// A job without a deadline is planned to finish within this.
    #[serde(default = "default_horizon")]
    pub default_horizon_secs: u64,
    /// Node names start with this (also their workers' names). A fleet
    /// started again adopts the provider's nodes with this prefix.
    #[serde(default = "default_prefix")]
    pub name_prefix: String,
    /// Every node's worker leaves by itself after this long with no task
    /// held or assigned (`tessera worker --exit-after-idle`), so that nodes
    /// outlive a dead fleet by at most this. Default: 600 s, or the idle
    /// timeout + 60 s when that is longer; it must exceed the idle timeout.
    pub node_exit_after_idle_secs: Option<u64>,
    /// Where the fleet keeps the nodes it holds, to adopt them when it
    /// starts again (default: beside the fleet file, `NAME.state.json`).
    pub state_file: Option<PathBuf>,
    #[serde(default, rename = "provider")]
    pub providers: Vec<ProviderConfig>,
}

/// One `[[provider]]` table.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderConfig {
    /// `local`, `docker`, `vast`, `runpod`, `lambda`, `paperspace`, `kubernetes`.
    pub kind: String,
    /// Its name in logs and status (default: the kind).
    pub name: Option<String>,
    /// The API key or token, for cloud providers.
    pub credential: Option<CredentialSource>,
    #[serde(default)]
    pub gpu_types: Vec<String>,
    #[serde(default)]
    pub min_vram_gib: u32,
    pub max_usd_per_gpu_hour: Option<f64>,
    #[serde(default)]
    pub regions: Vec<String>,
    /// Rent this provider's interruptible offers (default: the file's).
    pub interruptible: Option<bool>,
    /// At most this many nodes of this provider.
    pub max_nodes: Option<u32>,
    /// Overrides the file's image for this provider.
    pub image: Option<String>,
    /// `local`/`docker`: what each node is reported to cost per hour.
    #[serde(default)]
    pub usd_per_hour: f64,
    /// `local`/`docker`: GPU name reported for the offer.
    pub gpu: Option<String>,
    /// `docker`: the network containers join (default `bridge`).
    pub network: Option<String>,
    /// `local`: the `tessera` binary (default: this one).
    pub binary: Option<PathBuf>,
    /// `local`: where worker cache folders go.
    pub work_dir: Option<PathBuf>,
    /// Provider-specific settings for the cloud adapters.
    #[serde(default)]
    pub options: toml::Table,
}

fn default_image() -> String {
    "tessera-worker:latest".to_string()
}
fn default_max_nodes() -> u32 {
    4
}
fn default_idle() -> u64 {
    120
}
fn default_boot_timeout() -> u64 {
    900
}
fn default_horizon() -> u64 {
    1200
}
fn default_prefix() -> String {
    "tessera-fleet-".to_string()
}

/// Kinds the fleet knows.
pub const KINDS: [&str; 7] = [
    "local",
    "docker",
    "vast",
    "runpod",
    "lambda",
    "paperspace",
    "kubernetes",
];

/// Bounds on what a fleet file may ask for.
pub const MAX_NODES: u32 = 1000;
/// The highest price a node may be listed at (the coordinator refuses a
/// worker asking more: `tessera_protocol::messages::MAX_PRICE_PER_HOUR`).
pub const MAX_USD_PER_HOUR: f64 = 1_000_000.0;

impl FleetFile {
    pub fn parse(text: &str) -> Result<FleetFile, String> {
        let file: FleetFile = toml::from_str(text).map_err(|e| format!("fleet file: {e}"))?;
        file.check()?;
        Ok(file)
    }

    pub fn load(path: &Path) -> Result<FleetFile, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the fleet file {}: {e}", path.display()))?;
        FleetFile::parse(&text)
    }

    fn check(&self) -> Result<(), String> {
        if self.providers.is_empty() {
            return Err("fleet file: no [[provider]] table: name at least one".into());
        }
        if self.max_nodes == 0 || self.max_nodes > MAX_NODES {
            return Err(format!("fleet file: max_nodes must be 1..={MAX_NODES}"));
        }
        if let Some(cap) = self.max_usd_per_hour {
            if !cap.is_finite() || cap <= 0.0 {
                return Err("fleet file: max_usd_per_hour must be a positive number".into());
            }
        }
        if self.name_prefix.is_empty()
            || self.name_prefix.len() > 40
            || !(self.name_prefix.chars()).all(|c| c.is_ascii_alphanumeric() || c == '-')
        {
            return Err("fleet file: name_prefix must be 1-40 letters, digits or '-'".into());
        }
        if let Some(secs) = self.node_exit_after_idle_secs {
            if secs <= self.idle_timeout_secs {
                return Err(format!(
                    "fleet file: node_exit_after_idle_secs ({secs}) must exceed idle_timeout_secs ({}): a node's worker would leave before the fleet releases it",
                    self.idle_timeout_secs
                ));
            }
        }
        let mut names = std::collections::HashSet::new();
        for p in &self.providers {
            if !KINDS.contains(&p.kind.as_str()) {
                return Err(format!(
                    "fleet file: unknown provider kind {:?} (known: {})",
                    p.kind,
                    KINDS.join(", ")
                ));
            }
            if !names.insert(p.name()) {
                return Err(format!(
                    "fleet file: two providers are named {:?}",
                    p.name()
                ));
            }
            if !(0.0..=MAX_USD_PER_HOUR).contains(&p.usd_per_hour) {
                return Err(format!(
                    "fleet file: usd_per_hour must be from 0 to {MAX_USD_PER_HOUR}"
                ));
            }
            if !matches!(p.kind.as_str(), "local" | "docker") && p.credential.is_none() {
                return Err(format!(
                    "fleet file: provider {:?} needs `credential = {{ env = \"VAR\" }}` or `{{ file = \"PATH\" }}`",
                    p.name()
                ));
            }
        }
        Ok(())
    }

    /// How long a node's worker waits idle before it leaves by itself.
    pub fn node_exit_after_idle_secs(&self) -> u64 {
        (self.node_exit_after_idle_secs)
            .unwrap_or_else(|| 600.max(self.idle_timeout_secs.saturating_add(60)))
    }

    /// The policy's settings from the file.
    pub fn policy(&self) -> PolicyConfig {
        PolicyConfig {
            max_nodes: self.max_nodes,
            max_usd_per_hour: self.max_usd_per_hour,
            idle_timeout_ms: self.idle_timeout_secs * 1000,
            boot_timeout_ms: self.boot_timeout_secs * 1000,
            default_horizon_ms: self.default_horizon_secs * 1000,
            interruptible: self.interruptible
                || self.providers.iter().any(|p| p.interruptible == Some(true)),
            ..PolicyConfig::default()
        }
    }
}

impl ProviderConfig {
    pub fn name(&self) -> String {
        self.name.clone().unwrap_or_else(|| self.kind.clone())
    }

    /// Whether an offer is one this provider's table asks for (GPU type,
    /// VRAM, price per GPU-hour, region, interruptible).
    pub fn wants(&self, offer: &Offer, file_interruptible: bool) -> bool {
        let gpus = f64::from(offer.gpu_count.max(1));
        (self.gpu_types.is_empty()
            || self
                .gpu_types
                .iter()
                .any(|g| g.eq_ignore_ascii_case(&offer.gpu)))
            && offer.vram_gib >= self.min_vram_gib
            && self
                .max_usd_per_gpu_hour
                .is_none_or(|max| offer.usd_per_hour / gpus <= max + 1e-9)
            && (self.regions.is_empty()
                || (offer.region.as_ref())
                    .is_some_and(|r| self.regions.iter().any(|w| w.eq_ignore_ascii_case(r))))
            && (!offer.interruptible || self.interruptible.unwrap_or(file_interruptible))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::Billing;

    #[test]
    fn a_fleet_file_reads_with_defaults_and_credentials_stay_secret() {
        let f = FleetFile::parse(
            r#"
            worker_ticket = { env = "T15A_TEST_TICKET" }
            max_nodes = 3
            [[provider]]
            kind = "docker"
            usd_per_hour = 0.5
            [[provider]]
            kind = "vast"
            credential = { file = "vast.key" }
            gpu_types = ["RTX_4090"]
            min_vram_gib = 20
            max_usd_per_gpu_hour = 0.6
            interruptible = true
            "#,
        )
        .unwrap();
        assert_eq!(f.idle_timeout_secs, 120);
        assert_eq!(f.policy().idle_timeout_ms, 120_000);
        assert_eq!(f.node_exit_after_idle_secs(), 600, "default: 10 min");
        assert!(f.policy().interruptible);
        std::env::set_var("T15A_TEST_TICKET", "tessera-worker-secret\n");
        let s = f.worker_ticket.read(Path::new("/")).unwrap();
        assert_eq!(s.expose(), "tessera-worker-secret");
        assert_eq!(format!("{s:?}"), "Secret(..)");
        let offer = |gpu: &str, vram, price, spot| Offer {
            id: "1".into(),
            gpu: gpu.into(),
            gpu_count: 1,
            vram_gib: vram,
            usd_per_hour: price,
            interruptible: spot,
            region: None,
            billing: Billing::Increment(1),
        };
        let vast = &f.providers[1];
        assert!(vast.wants(&offer("rtx_4090", 24, 0.5, true), false));
        assert!(!vast.wants(&offer("RTX_4090", 16, 0.5, false), false));
        assert!(!vast.wants(&offer("RTX_4090", 24, 0.7, false), false));
        assert!(!vast.wants(&offer("A100", 80, 0.5, false), false));
    }

    /// A node's own idle bound outlasts the fleet's idle timeout: a live
    /// fleet releases an idle node before its worker would leave.
    #[test]
    fn a_nodes_idle_bound_exceeds_the_fleets_idle_timeout() {
        let file = |extra: &str| {
            FleetFile::parse(&format!(
                "worker_ticket = {{ env = \"X\" }}\n{extra}\n[[provider]]\nkind = \"local\""
            ))
        };
        let long = file("idle_timeout_secs = 1200").unwrap();
        assert_eq!(long.node_exit_after_idle_secs(), 1260);
        let set = file("idle_timeout_secs = 3\nnode_exit_after_idle_secs = 15").unwrap();
        assert_eq!(set.node_exit_after_idle_secs(), 15);
        let err = file("idle_timeout_secs = 30\nnode_exit_after_idle_secs = 30").unwrap_err();
        assert!(err.contains("must exceed idle_timeout_secs"), "{err}");
    }

    #[test]
    fn bad_fleet_files_say_what_to_fix() {
        let err = |text: &str| FleetFile::parse(text).unwrap_err();
        assert!(err("worker_ticket = { env = \"X\" }").contains("no [[provider]]"));
        assert!(
            err("worker_ticket = { env = \"X\" }\n[[provider]]\nkind = \"aws\"")
                .contains("unknown provider kind")
        );
        assert!(
            err("worker_ticket = { env = \"X\" }\n[[provider]]\nkind = \"runpod\"")
                .contains("needs `credential")
        );
        // A key on the command line is not a thing: a literal string is refused.
        assert!(
            err("worker_ticket = \"tessera1...\"\n[[provider]]\nkind = \"local\"")
                .contains("fleet file")
        );
        assert!(err(
            "worker_ticket = { env = \"X\" }\nmax_nodes = 0\n[[provider]]\nkind = \"local\""
        )
        .contains("max_nodes"));
    }
}

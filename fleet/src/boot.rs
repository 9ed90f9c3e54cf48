//! Getting one node up: launch on the cheapest offer that fits, wait for
//! the provider to report it running, and when it never boots (or the offer
//! is gone) release it and try the next offer, never one that already
//! failed. The fleet's policy calls this for each node it wants; it is kept
//! apart so that the adapters' tests can play "a node that never boots".

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::provider::{LaunchSpec, NodeId, NodeState, Offer, Provider, ProviderError};

/// How long a node may take to boot, and how often to ask.
#[derive(Clone, Copy, Debug)]
pub struct BootPolicy {
    pub boot_timeout: Duration,
    pub poll: Duration,
    /// Offers tried before giving up.
    pub max_attempts: usize,
}

impl Default for BootPolicy {
    fn default() -> Self {
        BootPolicy {
            boot_timeout: Duration::from_secs(600),
            poll: Duration::from_secs(5),
            max_attempts: 5,
        }
    }
}

/// Why an offer was passed over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Skipped {
    /// Taken between listing and launch.
    Gone,
    /// Launched, then not running within the boot timeout (released).
    NeverBooted(NodeId),
    /// Launched, then gone before it ran.
    Vanished(NodeId),
}

/// A node that booted, on which offer, and what was tried before.
#[derive(Debug)]
pub struct Booted {
    pub node: NodeId,
    pub offer: Offer,
    pub skipped: Vec<(String, Skipped)>,
}

/// The cheapest offer (per hour) whose id is not in `avoid`.
pub fn next_offer<'a>(offers: &'a [Offer], avoid: &HashSet<String>) -> Option<&'a Offer> {
    offers
        .iter()
        .filter(|o| !avoid.contains(&o.id) && o.usd_per_hour.is_finite())
        .min_by(|a, b| a.usd_per_hour.total_cmp(&b.usd_per_hour))
}

/// Launches `spec` on the cheapest of `offers` not in `avoid` and waits for
/// it to run; a node that does not boot within the policy's timeout is
/// released and the next offer tried. A quota, refused credentials or a
/// rate limit end the attempt with that error (the caller waits, or tries
/// another provider); so does running out of offers.
pub fn launch_until_booted(
    provider: &mut dyn Provider,
    offers: &[Offer],
    spec: &LaunchSpec,
    policy: BootPolicy,
    avoid: &mut HashSet<String>,
) -> Result<Booted, ProviderError> {
    let mut skipped = Vec::new();
    for _ in 0..policy.max_attempts.max(1) {
        let Some(offer) = next_offer(offers, avoid) else {
            break;
        };
        let offer = offer.clone();
        let node = match provider.launch(&offer, spec) {
            Ok(node) => node,
            Err(ProviderError::OfferGone(_)) => {
                avoid.insert(offer.id.clone());
                skipped.push((offer.id.clone(), Skipped::Gone));
                continue;
            }
            Err(e) => return Err(e),
        };
        let deadline = Instant::now() + policy.boot_timeout;
        let outcome = loop {
            match provider.state(&node)? {
                NodeState::Running => break None,
                NodeState::Gone => break Some(Skipped::Vanished(node.clone())),
                _ if Instant::now() >= deadline => break Some(Skipped::NeverBooted(node.clone())),
                _ => std::thread::sleep(policy.poll),
            }
        };
        match outcome {
            None => {
                return Ok(Booted {
                    node,
                    offer,
                    skipped,
                })
            }
            Some(why) => {
                tracing::warn!(provider = provider.name(), offer = %offer.id, node = %node, "node did not boot ({why:?}); trying another offer");
                provider.release(&node)?;
                avoid.insert(offer.id.clone());
                skipped.push((offer.id.clone(), why));
            }
        }
    }
    Err(ProviderError::Other(format!(
        "{}: no offer booted a node (tried {})",
        provider.name(),
        skipped
            .iter()
            .map(|(id, _)| id.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    )))
}

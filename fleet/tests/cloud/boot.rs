//! `boot::next_offer`: the cheapest offer not yet failed.

use std::collections::HashSet;

use tessera_fleet::boot::next_offer;
use tessera_fleet::provider::{Billing, Offer};

fn offer(id: &str, usd: f64) -> Offer {
    Offer {
        id: id.into(),
        gpu: "RTX 4090".into(),
        gpu_count: 1,
        vram_gib: 24,
        usd_per_hour: usd,
        interruptible: false,
        region: None,
        billing: Billing::Increment(1),
    }
}

#[test]
fn the_next_offer_is_the_cheapest_not_yet_failed() {
    let offers = [
        offer("a", 0.5),
        offer("b", 0.3),
        offer("c", 0.4),
        offer("nan", f64::NAN),
    ];
    let mut avoid = HashSet::new();
    let order: Vec<String> = std::iter::from_fn(|| {
        let o = next_offer(&offers, &avoid)?.id.clone();
        avoid.insert(o.clone());
        Some(o)
    })
    .collect();
    assert_eq!(order, ["b", "c", "a"]);
}

//! Tessera's default congestion controller: CUBIC (RFC 9438) that tells a
//! random loss from a congestive one, by TCP Veno's rule.
//!
//! A loss-based controller reads every lost packet as a full queue and
//! cuts its window. On the paths rented GPUs sit behind, many losses are
//! not: a lossy peering link or radio hop drops packets whatever the load.
//! There plain CUBIC (quinn's, or the kernel's for TCP) settles at the
//! window the loss rate allows, about `sqrt(1.5 / p)` packets: 17 packets,
//! 4–5 Mbit/s, at 0.5 % loss and 40 ms, on a path that carries 1 Gbit/s.
//!
//! Veno (Fu & Liew, IEEE JSAC 2003; `tcp_veno` in Linux) looks at the
//! queue when a loss is detected: the packets of ours waiting in it are
//! `window × (RTT − min RTT) ÷ RTT`. With fewer than [`RANDOM_BACKLOG`]
//! there, nothing was full, and the loss is taken as random: the window is
//! cut by [`BETA_RANDOM`] instead of CUBIC's [`BETA`], and the curve's
//! plateau stays where it was. A loss with a queue behind it, an ECN mark,
//! or persistent congestion gets CUBIC's answer unchanged, so on a link
//! that is really full this is CUBIC: it backs off as much and loses as
//! little (BENCHMARKS.md measures both on the WAN bench, with BBR, which
//! is fast on lossy paths but overruns a full link's queue).
//!
//! [`Window`] is the arithmetic, on plain numbers and instants so that
//! tests drive it on virtual time; [`CubicVeno`] feeds it from quinn.

use std::any::Any;
use std::sync::Arc;
use std::time::{Duration, Instant};

use quinn::congestion::{Controller, ControllerFactory};
use quinn_proto::RttEstimator;

/// CUBIC's multiplicative decrease on a congestive loss (RFC 9438 §4.6).
pub const BETA: f64 = 0.7;
/// The decrease on a loss seen with (almost) no queue: half of CUBIC's cut.
pub const BETA_RANDOM: f64 = 0.85;
/// Fewer of our packets than this in the path's queue when a loss is seen:
/// the loss was random (Veno's β, 3 packets).
pub const RANDOM_BACKLOG: f64 = 3.0;
/// CUBIC's scaling constant, in segments per second cubed (RFC 9438 §5.1).
const C: f64 = 0.4;
/// RFC 9002's initial window: 10 datagrams of QUIC's smallest size.
const INITIAL_WINDOW: u64 = 10 * 1200;

/// What a loss was taken to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LossKind {
    /// Seen with at most a few packets queued: the window shrinks by
    /// [`BETA_RANDOM`].
    Random,
    /// A queue behind it (or an ECN mark): CUBIC's [`BETA`].
    Congestive,
}

/// The congestion window and CUBIC's state, in bytes; time passed in.
#[derive(Debug, Clone)]
pub struct Window {
    /// Bytes a segment carries (the path's datagram size).
    mtu: u64,
    window: f64,
    ssthresh: f64,
    /// Losses of packets sent before this don't cut the window again, and
    /// their acknowledgements don't grow it (RFC 9002 §7.3.2).
    recovery_start: Option<Instant>,
    /// When congestion avoidance began after the last cut; None in slow
    /// start or right after a cut.
    epoch_start: Option<Instant>,
    /// The window CUBIC climbs back towards (bytes).
    w_max: f64,
    /// Seconds CUBIC takes to get back to `w_max` (RFC 9438 Eq. 2).
    k: f64,
    /// The window Reno would have, for the Reno-friendly region (bytes).
    w_est: f64,
    /// The smallest smoothed RTT seen: with `RttEstimator::min` (a raw
    /// sample, which may include the peer's acknowledgement delay), the
    /// RTT of an empty queue.
    min_rtt: Option<Duration>,
    /// The smoothed RTT at the last acknowledgement.
    srtt: Option<Duration>,
    pub random_losses: u64,
    pub congestive_losses: u64,
}

impl Window {
    pub fn new(initial_window: u64, mtu: u16) -> Window {
        Window {
            mtu: mtu.into(),
            window: initial_window as f64,
            ssthresh: f64::INFINITY,
            recovery_start: None,
            epoch_start: None,
            w_max: 0.0,
            k: 0.0,
            w_est: 0.0,
            min_rtt: None,
            srtt: None,
            random_losses: 0,
            congestive_losses: 0,
        }
    }

    /// Bytes that may be in flight.
    pub fn bytes(&self) -> u64 {
        self.window as u64
    }

    pub fn ssthresh(&self) -> Option<u64> {
        self.ssthresh.is_finite().then_some(self.ssthresh as u64)
    }

    fn minimum(&self) -> f64 {
        (2 * self.mtu) as f64
    }

    /// Records the path's round-trip times: `smoothed` (acknowledgement
    /// delay taken out) and `min` (the smallest raw sample).
    pub fn observe_rtt(&mut self, smoothed: Duration, min: Duration) {
        self.srtt = Some(smoothed);
        let low = smoothed.min(min);
        self.min_rtt = Some(self.min_rtt.map_or(low, |m| m.min(low)));
    }

    /// Our packets waiting in the path's queue, as the RTTs tell.
    pub fn backlog(&self) -> f64 {
        match (self.srtt, self.min_rtt) {
            (Some(srtt), Some(min)) if !srtt.is_zero() => {
                let queued = srtt.saturating_sub(min).as_secs_f64() / srtt.as_secs_f64();
                self.window / self.mtu as f64 * queued
            }
            _ => 0.0,
        }
    }

    /// `bytes` of a packet sent at `sent` were acknowledged at `now`.
    pub fn on_ack(&mut self, now: Instant, sent: Instant, bytes: u64, app_limited: bool) {
        if app_limited || self.recovery_start.is_some_and(|r| sent <= r) {
            return;
        }
        let bytes = bytes as f64;
        if self.window < self.ssthresh {
            self.window += bytes;
            return;
        }
        let mtu = self.mtu as f64;
        let epoch_start = *self.epoch_start.get_or_insert_with(|| {
            // RFC 9438 §4.2: a new epoch climbs from here back to w_max.
            if self.window < self.w_max {
                self.k = ((self.w_max - self.window) / mtu / C).cbrt();
            } else {
                self.k = 0.0;
                self.w_max = self.window;
            }
            self.w_est = self.window;
            now
        });
        let t = now.saturating_duration_since(epoch_start).as_secs_f64();
        let rtt = self
            .srtt
            .unwrap_or(Duration::from_millis(100))
            .as_secs_f64();
        // Reno-friendly estimate (§4.3): α per window acknowledged, 1 once
        // past the old plateau.
        let alpha = if self.w_est >= self.w_max {
            1.0
        } else {
            3.0 * (1.0 - BETA) / (1.0 + BETA)
        };
        self.w_est += alpha * bytes / self.window * mtu;
        let cubic = |t: f64| (C * (t - self.k).powi(3)) * mtu + self.w_max;
        if cubic(t) < self.w_est {
            self.window = self.window.max(self.w_est);
        } else {
            // §4.4–4.5: towards W_cubic one RTT ahead, at most 1.5× a
            // window per RTT.
            let target = cubic(t + rtt).clamp(self.window, 1.5 * self.window);
            self.window += (target - self.window) / self.window * bytes;
        }
    }

    /// A loss (or an ECN mark, `lost_bytes` 0) of a packet sent at `sent`,
    /// detected at `now`. Returns what it was taken for, or None when it
    /// belongs to a recovery already under way.
    pub fn on_congestion(
        &mut self,
        now: Instant,
        sent: Instant,
        persistent: bool,
        lost_bytes: u64,
    ) -> Option<LossKind> {
        if self.recovery_start.is_some_and(|r| sent <= r) && !persistent {
            return None;
        }
        self.recovery_start = Some(now);
        self.epoch_start = None;
        let kind = if lost_bytes > 0 && !persistent && self.backlog() < RANDOM_BACKLOG {
            LossKind::Random
        } else {
            LossKind::Congestive
        };
        let beta = match kind {
            LossKind::Random => {
                self.random_losses += 1;
                // The plateau stays: nothing says the path holds less.
                self.w_max = self.window.max(self.w_max);
                BETA_RANDOM
            }
            LossKind::Congestive => {
                self.congestive_losses += 1;
                // Fast convergence (§4.7): below the last plateau, leave
                // room for the flows that took it.
                self.w_max = if self.window < self.w_max {
                    self.window * (1.0 + BETA) / 2.0
                } else {
                    self.window
                };
                BETA
            }
        };
        self.window = (self.window * beta).max(self.minimum());
        self.ssthresh = self.window;
        if persistent {
            // RFC 9002 §7.6.2: back to the minimum window.
            self.w_max = self.window;
            self.window = self.minimum();
        }
        Some(kind)
    }

    pub fn on_mtu_update(&mut self, mtu: u16) {
        self.mtu = mtu.into();
        self.window = self.window.max(self.minimum());
    }
}

/// [`Window`] as quinn's congestion controller.
#[derive(Debug, Clone)]
pub struct CubicVeno {
    window: Window,
    initial_window: u64,
}

impl Controller for CubicVeno {
    fn on_ack(
        &mut self,
        now: Instant,
        sent: Instant,
        bytes: u64,
        app_limited: bool,
        rtt: &RttEstimator,
    ) {
        self.window.observe_rtt(rtt.get(), rtt.min());
        self.window.on_ack(now, sent, bytes, app_limited);
    }

    fn on_congestion_event(
        &mut self,
        now: Instant,
        sent: Instant,
        is_persistent_congestion: bool,
        lost_bytes: u64,
    ) {
        self.window
            .on_congestion(now, sent, is_persistent_congestion, lost_bytes);
    }

    fn on_mtu_update(&mut self, new_mtu: u16) {
        self.window.on_mtu_update(new_mtu);
    }

    fn window(&self) -> u64 {
        self.window.bytes()
    }

    fn clone_box(&self) -> Box<dyn Controller> {
        Box::new(self.clone())
    }

    fn initial_window(&self) -> u64 {
        self.initial_window
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// The losses a connection's [`CubicVeno`] took as random and as
/// congestive so far; None under another controller.
pub fn losses(connection: &quinn::Connection) -> Option<(u64, u64)> {
    let state = connection.congestion_state().into_any();
    let veno = state.downcast::<CubicVeno>().ok()?;
    Some((veno.window.random_losses, veno.window.congestive_losses))
}

/// Builds a [`CubicVeno`] for each connection.
#[derive(Debug, Clone, Default)]
pub struct CubicVenoConfig;

impl ControllerFactory for CubicVenoConfig {
    fn build(self: Arc<Self>, _now: Instant, current_mtu: u16) -> Box<dyn Controller> {
        Box::new(CubicVeno {
            window: Window::new(INITIAL_WINDOW, current_mtu),
            initial_window: INITIAL_WINDOW,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MTU: u16 = 1400;
    const MS: Duration = Duration::from_millis(1);

    /// A window in congestion avoidance at `packets` packets, on a path of
    /// `rtt` whose queue adds `queued`.
    fn steady(packets: u64, rtt: Duration, queued: Duration) -> (Window, Instant) {
        let mut w = Window::new(packets * MTU as u64, MTU);
        w.observe_rtt(rtt, rtt);
        w.observe_rtt(rtt + queued, rtt + queued);
        w.ssthresh = w.window;
        (w, Instant::now())
    }

    /// (window in packets, RTT, queue delay) → what a loss is taken for and
    /// the window after it, in packets.
    fn check(packets: u64, queued_ms: u64, expected: Option<(LossKind, f64)>) {
        let (mut w, t0) = steady(packets, 40 * MS, Duration::from_millis(queued_ms));
        let got = w
            .on_congestion(t0 + 10 * MS, t0 + 5 * MS, false, MTU as u64)
            .map(|k| (k, w.bytes() as f64 / MTU as f64));
        match (got, expected) {
            (Some((k, after)), Some((ek, eafter))) => {
                assert_eq!(k, ek, "{packets} packets, {queued_ms} ms queued");
                assert!(
                    (after - eafter).abs() < 0.01,
                    "{packets} packets, {queued_ms} ms queued: {after} packets after, expected {eafter}"
                );
            }
            (got, expected) => assert_eq!(got.map(|g| g.0), expected.map(|e| e.0)),
        }
    }

    #[test]
    fn a_loss_with_no_queue_is_random_and_one_behind_a_queue_congestive() {
        // 17 packets, no queue: random, cut to 0.85.
        check(17, 0, Some((LossKind::Random, 17.0 * BETA_RANDOM)));
        // 100 packets, 1 ms of 41 queued: 2.4 packets waiting, random.
        check(100, 1, Some((LossKind::Random, 100.0 * BETA_RANDOM)));
        // 100 packets, 2 ms queued: 4.8 packets waiting, congestive.
        check(100, 2, Some((LossKind::Congestive, 100.0 * BETA)));
        // A full queue of one RTT: half the window waits there.
        check(1000, 40, Some((LossKind::Congestive, 1000.0 * BETA)));
    }

    #[test]
    fn an_ecn_mark_and_persistent_congestion_are_never_random() {
        let (mut w, t0) = steady(50, 40 * MS, Duration::ZERO);
        let ecn = w.on_congestion(t0 + MS, t0, false, 0);
        assert_eq!(ecn, Some(LossKind::Congestive));
        assert_eq!(w.bytes(), (50.0 * MTU as f64 * BETA) as u64);
        let persistent = w.on_congestion(t0 + 500 * MS, t0 + 400 * MS, true, 10 * MTU as u64);
        assert_eq!(persistent, Some(LossKind::Congestive));
        assert_eq!(w.bytes(), 2 * MTU as u64, "the minimum window");
    }

    #[test]
    fn losses_of_one_recovery_period_cut_the_window_once() {
        let (mut w, t0) = steady(40, 40 * MS, Duration::ZERO);
        assert!(w
            .on_congestion(t0 + 50 * MS, t0 + 10 * MS, false, 1)
            .is_some());
        let after = w.bytes();
        // Sent before the recovery began: the same loss episode.
        assert_eq!(w.on_congestion(t0 + 60 * MS, t0 + 20 * MS, false, 1), None);
        assert_eq!(w.bytes(), after);
        // Its acknowledgements don't grow the window either.
        w.on_ack(t0 + 70 * MS, t0 + 30 * MS, MTU as u64, false);
        assert_eq!(w.bytes(), after);
        // Sent after it: a new episode.
        assert!(w
            .on_congestion(t0 + 200 * MS, t0 + 100 * MS, false, 1)
            .is_some());
        assert!(w.bytes() < after);
    }

    /// Acknowledges a whole window every RTT for `rtts` round trips.
    fn run(w: &mut Window, t: &mut Instant, rtt: Duration, rtts: u32) {
        for _ in 0..rtts {
            let sent = *t;
            *t += rtt;
            let packets = w.bytes() / MTU as u64;
            for _ in 0..packets {
                w.on_ack(*t, sent, MTU as u64, false);
            }
        }
    }

    #[test]
    fn after_a_cut_the_window_climbs_back_to_its_plateau_and_past_it() {
        let rtt = 40 * MS;
        let (mut w, mut t) = steady(100, rtt, Duration::ZERO);
        let before = w.bytes();
        w.on_congestion(t + MS, t, false, 1).unwrap();
        t += 2 * MS;
        assert!(w.bytes() < before);
        // K = cbrt(15 / 0.4) = 3.3 s to the plateau; well before it the
        // window is back near it, and it then probes beyond.
        run(&mut w, &mut t, rtt, 60);
        assert!(w.bytes() > before * 95 / 100, "{} of {before}", w.bytes());
        run(&mut w, &mut t, rtt, 100);
        assert!(w.bytes() > before, "{} of {before}", w.bytes());
    }

    #[test]
    fn slow_start_doubles_each_round_trip_until_the_first_loss() {
        let rtt = 40 * MS;
        let mut w = Window::new(10 * MTU as u64, MTU);
        w.observe_rtt(rtt, rtt);
        let mut t = Instant::now();
        run(&mut w, &mut t, rtt, 3);
        assert_eq!(w.bytes(), 80 * MTU as u64);
        w.on_congestion(t + MS, t, false, 1).unwrap();
        assert_eq!(w.ssthresh(), Some(w.bytes()));
        t += 2 * MS;
        run(&mut w, &mut t, rtt, 1);
        assert!(w.bytes() < 80 * MTU as u64, "no more slow start");
    }

    /// The same random losses, one in `every` packets, on a path with no
    /// queue: the window Veno keeps on average, ÷ CUBIC's (every loss
    /// taken as congestive).
    fn average_window(every: u64, random_rule: bool) -> f64 {
        let rtt = 40 * MS;
        let mut w = Window::new(10 * MTU as u64, MTU);
        w.observe_rtt(rtt, rtt);
        let mut t = Instant::now();
        let (mut sum, mut n, mut sent_packets) = (0.0, 0u64, 0u64);
        for _ in 0..20_000 {
            let sent = t;
            t += rtt;
            let packets = (w.bytes() / MTU as u64).max(1);
            for _ in 0..packets {
                sent_packets += 1;
                if sent_packets.is_multiple_of(every) {
                    if !random_rule {
                        // Plain CUBIC: a queue it does not have.
                        w.observe_rtt(10 * rtt, rtt);
                    }
                    w.on_congestion(t, sent + MS, false, MTU as u64);
                    w.observe_rtt(rtt, rtt);
                } else {
                    w.on_ack(t, sent, MTU as u64, false);
                }
            }
            sum += w.bytes() as f64 / MTU as f64;
            n += 1;
        }
        sum / n as f64
    }

    #[test]
    fn under_random_loss_the_window_stays_larger_than_cubics() {
        // 0.5 % loss: CUBIC's average window is close to sqrt(1.5 / p) = 17
        // packets; Veno's rule keeps well above it.
        let cubic = average_window(200, false);
        let veno = average_window(200, true);
        assert!(
            (14.0..24.0).contains(&cubic),
            "CUBIC averaged {cubic:.1} packets"
        );
        assert!(
            veno > 1.3 * cubic,
            "Veno {veno:.1} packets, CUBIC {cubic:.1}"
        );
    }
}

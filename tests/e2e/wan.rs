//! The WAN bench: real network paths with a chosen round-trip time, loss
//! and rate, for tests and benchmarks, on a kernel without `netem`.
//!
//! A coordinator namespace talks to each worker namespace over its own
//! path: `coordinator ns ─veth─ relay ns ─veth─ worker ns`, every veth at
//! MTU 1500 with checksum and segmentation offloads off, so that what
//! crosses it are ordinary Ethernet frames. In the relay namespace a
//! thread of this process per direction copies every frame between the
//! two veths through `AF_PACKET` sockets (a user-space bridge for UDP,
//! TCP, ARP alike): it stamps each frame as it arrives with the time its
//! last bit would leave a link of the path's rate (tail drop past a queue
//! of one round trip), and hands it on one-way delay later. Loss
//! is nftables' `numgen random` dropping each direction's packets on
//! arrival (in the worker namespace, and in the coordinator namespace per
//! path). The coordinator is `10.77.0.1`, worker `i` is `10.77.{i+1}.2`.
//!
//! Needs root, iproute2 and nftables (`unavailable` says what is
//! missing). Everything it creates carries [`PREFIX`] and the process id;
//! dropping the [`Bench`] (also while a test panics) stops the relays,
//! kills what still runs in its namespaces and deletes them, which
//! deletes their veths and nft tables; a bench left by a killed process
//! is removed by the next one.
//!
//! From a test or a bench (`#[path = "../tests/e2e/wan.rs"] mod wan;` in
//! `benches/`, next to the harness):
//! ```ignore
//! let bench = wan::Bench::start(&[wan::Link::new(80, 0.0, 100); 2]);
//! let mut farm = Farm::start_in("x", &[], Some(&bench.coordinator_ns), wan::COORDINATOR_IP);
//! farm.add_worker_in(Some(&bench.paths[0].ns), "w0", &[], &[]);
//! // In-process endpoints: a thread that enters a namespace opens its
//! // sockets there (`wan::spawn_in(&bench.paths[0].ns, || ...)`).
//! ```
//! Declare the bench before the farm, so that the farm's processes end
//! before the namespaces go.

#![allow(dead_code)]

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Every namespace this bench creates starts with this.
pub const PREFIX: &str = "t16a-";
/// The coordinator's address, on its namespace's loopback device.
pub const COORDINATOR_IP: &str = "10.77.0.1";
/// The MTU of every veth of the bench.
pub const MTU: u32 = 1500;

/// One path between the coordinator and a worker.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Link {
    /// Round-trip time the relay adds (half each way).
    pub rtt: Duration,
    /// Share of packets dropped in each direction, in percent.
    pub loss_percent: f64,
    /// Rate of each direction, in bits per second.
    pub rate_bps: u64,
    /// The longest a frame waits in the relay's queue before it is
    /// dropped (tail drop): one round trip by default, at least 10 ms.
    pub queue: Duration,
}

impl Link {
    pub fn new(rtt_ms: u64, loss_percent: f64, mbit_per_s: u64) -> Link {
        let rtt = Duration::from_millis(rtt_ms);
        Link {
            rtt,
            loss_percent,
            rate_bps: mbit_per_s * 1_000_000,
            queue: rtt.max(Duration::from_millis(10)),
        }
    }
}

impl std::fmt::Display for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ms RTT, {} % loss each way, {} Mbit/s, MTU {MTU}, queue {} ms",
            self.rtt.as_millis(),
            self.loss_percent,
            self.rate_bps / 1_000_000,
            self.queue.as_millis()
        )
    }
}

/// What the relay counted on one direction of a path.
#[derive(Debug, Default)]
pub struct Counters {
    pub frames: AtomicU64,
    pub bytes: AtomicU64,
    /// Dropped because the queue was full (the rate limit's tail drop).
    pub queue_drops: AtomicU64,
    /// Frames the other veth would not take (larger than the MTU: an
    /// offload left on).
    pub send_errors: AtomicU64,
    /// While true, every frame of this direction is dropped: a one-way
    /// outage (see [`PathEnd::cut_down`]).
    pub cut: AtomicBool,
}

/// A worker's end of the bench.
pub struct PathEnd {
    /// The worker's namespace.
    pub ns: String,
    /// The worker's address there.
    pub ip: String,
    pub link: Link,
    pub relay_ns: String,
    /// Coordinator → worker, and worker → coordinator.
    pub down: Arc<Counters>,
    pub up: Arc<Counters>,
}

impl PathEnd {
    /// Drops (true) or carries again (false) everything the coordinator
    /// sends this worker, while the worker's own packets still arrive.
    pub fn cut_down(&self, cut: bool) {
        self.down.cut.store(cut, Ordering::Relaxed);
    }
}

pub struct Bench {
    pub coordinator_ns: String,
    pub paths: Vec<PathEnd>,
    stop: Arc<AtomicBool>,
    relays: Vec<JoinHandle<()>>,
    /// Every namespace created so far (what drop removes).
    created: Vec<String>,
}

/// Why the bench cannot run here, or None.
pub fn unavailable() -> Option<String> {
    let runs = |cmd: &str, args: &[&str]| {
        Command::new(cmd)
            .args(args)
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if unsafe { libc::geteuid() } != 0 {
        return Some("the WAN bench needs root (network namespaces, AF_PACKET)".into());
    }
    if !runs("ip", &["netns", "list"]) {
        return Some("the WAN bench needs iproute2's `ip` (apt-get install iproute2)".into());
    }
    if !runs("nft", &["--version"]) {
        return Some("the WAN bench needs nftables' `nft` (apt-get install nftables)".into());
    }
    None
}

fn run(cmd: &str, args: &[&str]) {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd} runs: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn ip(args: &[&str]) {
    run("ip", args);
}

fn sysctl(ns: &str, key: &str, value: &str) {
    run(
        "ip",
        &[
            "netns",
            "exec",
            ns,
            "sysctl",
            "-qw",
            &format!("{key}={value}"),
        ],
    );
}

fn nft(ns: &str, script: &str) {
    use std::io::Write;
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("nft runs (apt-get install nftables)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(script.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "nft in {ns}: {}\n{script}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Moves the calling thread into network namespace `ns`: the sockets it
/// opens from then on live there. Only for a thread of one's own.
pub fn enter(ns: &str) -> io::Result<()> {
    let f = std::fs::File::open(format!("/run/netns/{ns}"))?;
    if unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Runs `f` on a new thread inside namespace `ns`.
pub fn spawn_in<T: Send + 'static>(
    ns: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> JoinHandle<T> {
    let ns = ns.to_string();
    std::thread::spawn(move || {
        enter(&ns).unwrap_or_else(|e| panic!("cannot enter network namespace {ns}: {e}"));
        f()
    })
}

/// Runs `f` inside namespace `ns` and returns what it returns.
pub fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    spawn_in(ns, f)
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
}

/// The pids running in namespace `ns`.
fn pids_in(ns: &str) -> Vec<i32> {
    (Command::new("ip").args(["netns", "pids", ns]).output())
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn remove_netns(ns: &str) {
    for pid in pids_in(ns) {
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    let _ = Command::new("ip").args(["netns", "del", ns]).status();
}

/// Removes benches whose process is gone (killed before its drop ran).
fn remove_stale() {
    let Ok(dir) = std::fs::read_dir("/run/netns") else {
        return;
    };
    for entry in dir.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let pid = rest.split('-').next().and_then(|p| p.parse::<u32>().ok());
        if pid.is_some_and(|p| !std::path::Path::new(&format!("/proc/{p}")).exists()) {
            remove_netns(&name);
        }
    }
}

impl Bench {
    /// A coordinator namespace and one worker namespace per link; panics
    /// (after removing what it made) when a step fails.
    pub fn start(links: &[Link]) -> Bench {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        assert!(links.len() < 250, "at most 249 paths");
        if let Some(why) = unavailable() {
            panic!("{why}");
        }
        remove_stale();
        let base = format!(
            "{PREFIX}{}-{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        let mut bench = Bench {
            coordinator_ns: format!("{base}-c"),
            paths: Vec::new(),
            stop: Arc::new(AtomicBool::new(false)),
            relays: Vec::new(),
            created: Vec::new(),
        };
        let c = bench.coordinator_ns.clone();
        bench.add_netns(&c);
        ip(&[
            "-n",
            &c,
            "addr",
            "add",
            &format!("{COORDINATOR_IP}/32"),
            "dev",
            "lo",
        ]);
        ip(&["-n", &c, "link", "set", "dev", "lo", "up"]);
        let mut coordinator_rules = String::new();
        for (i, link) in links.iter().enumerate() {
            let (r, w) = (format!("{base}-r{i}"), format!("{base}-w{i}"));
            bench.add_netns(&r);
            bench.add_netns(&w);
            let (cdev, wip) = (format!("c{i}"), format!("10.77.{}.2", i + 1));
            let mtu = MTU.to_string();
            ip(&[
                "link", "add", "name", &cdev, "netns", &c, "mtu", &mtu, "type", "veth", "peer",
                "name", "a", "netns", &r, "mtu", &mtu,
            ]);
            ip(&[
                "link", "add", "name", "b", "netns", &r, "mtu", &mtu, "type", "veth", "peer",
                "name", "w", "netns", &w, "mtu", &mtu,
            ]);
            // The endpoints compute every checksum and cut every segment
            // themselves: the relay copies frames as they are.
            for (ns, dev) in [(&c, &cdev), (&w, &"w".to_string())] {
                let (ns, dev) = (ns.clone(), dev.clone());
                let dev2 = dev.clone();
                in_netns(&ns.clone(), move || offloads_off(&dev2))
                    .unwrap_or_else(|e| panic!("cannot turn offloads off on {dev} in {ns}: {e}"));
            }
            ip(&["-n", &c, "link", "set", "dev", &cdev, "up"]);
            ip(&[
                "-n",
                &c,
                "route",
                "add",
                &format!("{wip}/32"),
                "dev",
                &cdev,
                "src",
                COORDINATOR_IP,
            ]);
            ip(&["-n", &w, "addr", "add", &format!("{wip}/32"), "dev", "w"]);
            ip(&["-n", &w, "link", "set", "dev", "lo", "up"]);
            ip(&["-n", &w, "link", "set", "dev", "w", "up"]);
            ip(&[
                "-n",
                &w,
                "route",
                "add",
                &format!("{COORDINATOR_IP}/32"),
                "dev",
                "w",
                "src",
                &wip,
            ]);
            for dev in ["a", "b"] {
                ip(&["-n", &r, "link", "set", "dev", dev, "promisc", "on", "up"]);
            }
            let drop = loss_rule(link.loss_percent);
            if !drop.is_empty() {
                nft(
                    &w,
                    &format!(
                        "table inet t16a_loss {{\n chain arrive {{\n  type filter hook prerouting priority raw;\n  iifname \"w\" {drop}\n }}\n}}\n"
                    ),
                );
                coordinator_rules.push_str(&format!("  iifname \"{cdev}\" {drop}\n"));
            }
            let (down, up) = (Arc::new(Counters::default()), Arc::new(Counters::default()));
            let relays = start_relay(&r, *link, &bench.stop, &down, &up)
                .unwrap_or_else(|e| panic!("cannot start the relay in {r}: {e}"));
            bench.relays.extend(relays);
            bench.paths.push(PathEnd {
                ns: w,
                ip: wip,
                link: *link,
                relay_ns: r,
                down,
                up,
            });
        }
        if !coordinator_rules.is_empty() {
            nft(
                &c,
                &format!(
                    "table inet t16a_loss {{\n chain arrive {{\n  type filter hook prerouting priority raw;\n{coordinator_rules} }}\n}}\n"
                ),
            );
        }
        bench
    }

    /// Lets the paths' ends reach one another through the hub (the
    /// coordinator's namespace, forwarding): a star whose hub serves
    /// something else (an object store), with the coordinator at the end
    /// of a path of its own.
    pub fn route_between_paths(&self) {
        sysctl(&self.coordinator_ns, "net.ipv4.ip_forward", "1");
        for from in &self.paths {
            for to in self.paths.iter().filter(|p| p.ip != from.ip) {
                ip(&[
                    "-n",
                    &from.ns,
                    "route",
                    "add",
                    &format!("{}/32", to.ip),
                    "via",
                    COORDINATOR_IP,
                    "dev",
                    "w",
                    "onlink",
                    "src",
                    &from.ip,
                ]);
            }
        }
    }

    fn add_netns(&mut self, ns: &str) {
        ip(&["netns", "add", ns]);
        self.created.push(ns.to_string());
        // No IPv6 chatter (router solicitations) on the paths.
        for conf in ["all", "default"] {
            sysctl(ns, &format!("net.ipv6.conf.{conf}.disable_ipv6"), "1");
        }
        // TCP buffers that may grow as far as QUIC's windows (64 MiB), so
        // that a TCP baseline is not held back by the kernel's 4 MiB
        // default on long fat paths.
        sysctl(ns, "net.ipv4.tcp_rmem", "4096 131072 67108864");
        sysctl(ns, "net.ipv4.tcp_wmem", "4096 16384 67108864");
    }

    /// Runs `tessera ARGS` (or anything) in the coordinator's namespace.
    pub fn command_in(ns: &str, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", ns, program]);
        c
    }
}

impl Drop for Bench {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for r in self.relays.drain(..) {
            let _ = r.join();
        }
        for ns in self.created.iter().rev() {
            remove_netns(ns);
        }
    }
}

/// The nft statement dropping `percent` of packets, or "" for none.
fn loss_rule(percent: f64) -> String {
    let per_million = (percent * 10_000.0).round() as u64;
    if per_million == 0 {
        String::new()
    } else {
        format!("numgen random mod 1000000 < {per_million} drop")
    }
}

/// Turns off transmit checksumming, scatter-gather and TSO on `dev` (the
/// legacy ethtool ioctls; no `ethtool` needed): frames then leave with
/// their checksums and at most the MTU long.
fn offloads_off(dev: &str) -> io::Result<()> {
    #[repr(C)]
    struct EthtoolValue {
        cmd: u32,
        data: u32,
    }
    const SIOCETHTOOL: libc::c_ulong = 0x8946;
    const ETHTOOL_STXCSUM: u32 = 0x17;
    const ETHTOOL_SSG: u32 = 0x19;
    const ETHTOOL_STSO: u32 = 0x1f;
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    for cmd in [ETHTOOL_STSO, ETHTOOL_SSG, ETHTOOL_STXCSUM] {
        let mut value = EthtoolValue { cmd, data: 0 };
        let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
        for (d, s) in ifr.ifr_name.iter_mut().zip(dev.bytes()) {
            *d = s as libc::c_char;
        }
        ifr.ifr_ifru.ifru_data = (&mut value as *mut EthtoolValue).cast();
        if unsafe { libc::ioctl(fd.as_raw_fd(), SIOCETHTOOL as _, &mut ifr) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// An AF_PACKET socket that sees every frame arriving on `dev` (not the
/// ones it sends), with buffers for a burst of them.
fn packet_socket(dev: &str) -> io::Result<OwnedFd> {
    // Protocol 0: no frames until bound to the one device.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let name = CString::new(dev).unwrap();
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        return Err(io::Error::last_os_error());
    }
    let mut sll: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    sll.sll_family = libc::AF_PACKET as u16;
    sll.sll_protocol = (libc::ETH_P_ALL as u16).to_be();
    sll.sll_ifindex = index as i32;
    let setopt = |level, opt, value: &[u8]| {
        let r = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                level,
                opt,
                value.as_ptr().cast(),
                value.len() as libc::socklen_t,
            )
        };
        if r != 0 {
            Err(io::Error::last_os_error())
        } else {
            Ok(())
        }
    };
    const PACKET_IGNORE_OUTGOING: libc::c_int = 23;
    setopt(
        libc::SOL_PACKET,
        PACKET_IGNORE_OUTGOING,
        &1i32.to_ne_bytes(),
    )?;
    let buffer = (16i32 << 20).to_ne_bytes();
    setopt(libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, &buffer)?;
    setopt(libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, &buffer)?;
    let r = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&sll as *const libc::sockaddr_ll).cast(),
            std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(fd)
}

/// When each frame of one direction arrives: its last bit leaves the
/// link at `rate` after the frames before it, then it travels `delay`.
struct Shaper {
    rate_bps: u64,
    delay: Duration,
    queue: Duration,
    link_free: Instant,
}

impl Shaper {
    /// The instant `len` bytes arriving `now` reach the far end, or None
    /// when the queue is full.
    fn admit(&mut self, now: Instant, len: usize) -> Option<Instant> {
        let start = self.link_free.max(now);
        if start - now > self.queue {
            return None;
        }
        // Preamble, FCS and inter-frame gap count on a wire too.
        let bits = (len as u64 + 24) * 8;
        self.link_free = start + Duration::from_nanos(bits * 1_000_000_000 / self.rate_bps);
        Some(self.link_free + self.delay)
    }
}

/// Starts both directions of the relay in namespace `ns`: `a` faces the
/// coordinator, `b` the worker.
fn start_relay(
    ns: &str,
    link: Link,
    stop: &Arc<AtomicBool>,
    down: &Arc<Counters>,
    up: &Arc<Counters>,
) -> io::Result<Vec<JoinHandle<()>>> {
    let (a, b) = in_netns(ns, || -> io::Result<_> {
        Ok((packet_socket("a")?, packet_socket("b")?))
    })?;
    let (a, b) = (Arc::new(a), Arc::new(b));
    let mut threads = Vec::new();
    for (from, to, counters) in [(a.clone(), b.clone(), down), (b, a, up)] {
        let shaper = Shaper {
            rate_bps: link.rate_bps,
            delay: link.rtt / 2,
            queue: link.queue,
            link_free: Instant::now(),
        };
        let (stop, counters) = (stop.clone(), counters.clone());
        threads.push(std::thread::spawn(move || {
            relay(&from, &to, shaper, &counters, &stop)
        }));
    }
    Ok(threads)
}

/// The longest frame the relay carries: the MTU and an Ethernet header
/// (with a VLAN tag). A longer one (an offload left on) is counted as a
/// send error and dropped, as the veth beyond would refuse it.
const FRAME_MAX: usize = MTU as usize + 18;
/// Frames due this close together leave in one wake-up.
const DEPARTURE_SLACK: Duration = Duration::from_micros(50);
/// Frames read in one go before the queue's departures are looked at.
const READ_BURST: usize = 64;

/// One direction of a path, on one thread: frames are read from `from` as
/// they arrive, stamped by the shaper, and written to `to` when due; the
/// thread sleeps in `ppoll` until the next frame arrives or departs. Frame
/// buffers are reused.
fn relay(from: &OwnedFd, to: &OwnedFd, mut shaper: Shaper, counters: &Counters, stop: &AtomicBool) {
    let mut queue: std::collections::VecDeque<(Instant, Vec<u8>)> = Default::default();
    let mut spare: Vec<Vec<u8>> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let wait = match queue.front() {
            Some((at, _)) => at.saturating_duration_since(Instant::now()),
            None => Duration::from_millis(100),
        };
        if !wait.is_zero() {
            let mut fds = libc::pollfd {
                fd: from.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ts = libc::timespec {
                tv_sec: wait.as_secs() as libc::time_t,
                tv_nsec: wait.subsec_nanos() as libc::c_long,
            };
            unsafe { libc::ppoll(&mut fds, 1, &ts, std::ptr::null()) };
        }
        for _ in 0..READ_BURST {
            let mut buf = spare.pop().unwrap_or_default();
            buf.resize(FRAME_MAX, 0);
            let n = unsafe {
                libc::recv(
                    from.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT | libc::MSG_TRUNC,
                )
            };
            if n < 0 {
                spare.push(buf);
                break;
            }
            let n = n as usize;
            if n > FRAME_MAX {
                counters.send_errors.fetch_add(1, Ordering::Relaxed);
                spare.push(buf);
                continue;
            }
            if counters.cut.load(Ordering::Relaxed) {
                spare.push(buf);
                continue;
            }
            match shaper.admit(Instant::now(), n) {
                Some(at) => {
                    buf.truncate(n);
                    queue.push_back((at, buf));
                }
                None => {
                    counters.queue_drops.fetch_add(1, Ordering::Relaxed);
                    spare.push(buf);
                }
            }
        }
        let due = Instant::now() + DEPARTURE_SLACK;
        while queue.front().is_some_and(|(at, _)| *at <= due) {
            let (_, frame) = queue.pop_front().expect("a frame is due");
            let n = unsafe { libc::send(to.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0) };
            if n < 0 {
                counters.send_errors.fetch_add(1, Ordering::Relaxed);
            } else {
                counters.frames.fetch_add(1, Ordering::Relaxed);
                counters
                    .bytes
                    .fetch_add(frame.len() as u64, Ordering::Relaxed);
            }
            spare.push(frame);
        }
    }
}

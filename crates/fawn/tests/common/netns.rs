//! Network namespaces for back-ends, so that tests can cut the link between two back-ends
//! while both still reach the manager and the front-ends.
//!
//! Layout of one [`Netns`] (number `n`, unique among the test processes of the machine):
//! a bridge `fawnbr<n>` in the root namespace with address 10.77.n.1/24 (the manager, the
//! front-ends and the clients listen there); per back-end `node` a namespace `fawn<n>b<node>`
//! whose veth `fv<n>b<node>p` (peer `fv<n>b<node>` on the bridge) has 10.77.n.(10+node).
//! A cut of A↔B is a blackhole route to B's address in A's namespace and to A's in B's:
//! packets are dropped silently, so established TCP connections stall as on a real cut.
//!
//! Numbers are claimed with an flock on `/tmp/fawn-netns/<n>.lock`, held for the life of the
//! [`Netns`] (the kernel releases it when the test process dies), so whoever holds the lock
//! may delete anything left under that number by a killed run.
//!
//! Needs root (CAP_NET_ADMIN) and iproute2; without them [`Netns::create`] panics with the
//! reason — a test that needs a link cut must not pass without one.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs::File;
use std::os::fd::AsRawFd as _;
use std::process::Command;

/// Namespaces, a bridge and the cuts currently in place; all removed on drop.
pub struct Netns {
    pub n: u8,
    bridge: String,
    /// Node -> (namespace, address).
    nodes: BTreeMap<u32, (String, String)>,
    /// Cut pairs (a < b).
    cuts: Vec<(u32, u32)>,
    /// Nodes cut off from the root namespace (the front-ends and clients).
    host_cuts: Vec<u32>,
    _lock: File,
}

/// Runs `ip` with `args`; `Err` with its stderr if it fails.
fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip").args(args).output().map_err(|e| format!("running `ip`: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("`ip {}`: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

fn ip_ok(args: &[&str]) {
    ip(args).unwrap_or_else(|e| panic!("network namespace setup failed: {e}"));
}

fn ip_stdout(args: &[&str]) -> String {
    Command::new("ip")
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

impl Netns {
    /// Claims a free number and creates its bridge. Panics (with the reason) when namespaces
    /// cannot be made here.
    pub fn create() -> Netns {
        // SAFETY: geteuid has no preconditions.
        let euid = unsafe { libc::geteuid() };
        assert_eq!(
            euid, 0,
            "link-cut tests need root (CAP_NET_ADMIN) to create network namespaces; run as root \
             (CI runs scripts/test.sh as root)"
        );
        assert!(
            Command::new("ip").arg("-V").output().is_ok_and(|o| o.status.success()),
            "link-cut tests need iproute2 (`ip`): apt-get install iproute2"
        );
        let lock_dir = std::path::Path::new("/tmp/fawn-netns");
        std::fs::create_dir_all(lock_dir).expect("/tmp/fawn-netns");
        let start = std::process::id() as usize;
        for i in 0..250usize {
            let n = ((start + i) % 250 + 1) as u8;
            let lock = File::create(lock_dir.join(format!("{n}.lock"))).expect("netns lock file");
            // SAFETY: flock on an fd we own.
            if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
                continue;
            }
            remove_stale(n);
            let bridge = format!("fawnbr{n}");
            ip_ok(&["link", "add", &bridge, "type", "bridge"]);
            let me = Netns {
                n,
                bridge: bridge.clone(),
                nodes: BTreeMap::new(),
                cuts: Vec::new(),
                host_cuts: Vec::new(),
                _lock: lock,
            };
            ip_ok(&["addr", "add", &format!("{}/24", me.host_ip()), "dev", &bridge]);
            ip_ok(&["link", "set", &bridge, "up"]);
            return me;
        }
        panic!("no free network namespace number in /tmp/fawn-netns (250 test clusters running?)");
    }

    /// The root namespace's address on the bridge (manager, front-ends, clients).
    pub fn host_ip(&self) -> String {
        format!("10.77.{}.1", self.n)
    }

    /// The namespace of back-end `node` and its address, creating them on first use.
    pub fn node(&mut self, node: u32) -> (String, String) {
        if let Some(x) = self.nodes.get(&node) {
            return x.clone();
        }
        assert!(node < 240, "netns: node ids up to 239");
        let n = self.n;
        let ns = format!("fawn{n}b{node}");
        let (outer, inner) = (format!("fv{n}b{node}"), format!("fv{n}b{node}p"));
        let addr = format!("10.77.{n}.{}", 10 + node);
        ip_ok(&["netns", "add", &ns]);
        ip_ok(&["link", "add", &outer, "type", "veth", "peer", "name", &inner, "netns", &ns]);
        ip_ok(&["link", "set", &outer, "master", &self.bridge]);
        ip_ok(&["link", "set", &outer, "up"]);
        ip_ok(&["-n", &ns, "link", "set", "lo", "up"]);
        ip_ok(&["-n", &ns, "addr", "add", &format!("{addr}/24"), "dev", &inner]);
        ip_ok(&["-n", &ns, "link", "set", &inner, "up"]);
        self.nodes.insert(node, (ns.clone(), addr.clone()));
        (ns, addr)
    }

    /// Cuts the link between back-ends `a` and `b` (both directions); they still reach the
    /// bridge's address and every other back-end.
    pub fn cut(&mut self, a: u32, b: u32) {
        let (na, aa) = self.node(a);
        let (nb, ab) = self.node(b);
        ip_ok(&["-n", &na, "route", "add", "blackhole", &format!("{ab}/32")]);
        ip_ok(&["-n", &nb, "route", "add", "blackhole", &format!("{aa}/32")]);
        self.cuts.push((a.min(b), a.max(b)));
    }

    /// Heals a cut made by [`Netns::cut`].
    pub fn heal(&mut self, a: u32, b: u32) {
        let (na, aa) = self.node(a);
        let (nb, ab) = self.node(b);
        ip_ok(&["-n", &na, "route", "del", "blackhole", &format!("{ab}/32")]);
        ip_ok(&["-n", &nb, "route", "del", "blackhole", &format!("{aa}/32")]);
        self.cuts.retain(|c| *c != (a.min(b), a.max(b)));
    }

    /// Cuts `node` off from the root namespace (the front-ends, the clients and the test
    /// itself), both directions: a blackhole route to the bridge's address in `node`'s
    /// namespace, and one to `node`'s address in the root namespace. Traffic bridged between
    /// namespaces never consults the root namespace's routes, so `node` still reaches every
    /// other namespace.
    pub fn cut_host(&mut self, node: u32) {
        let (ns, addr) = self.node(node);
        ip_ok(&["-n", &ns, "route", "add", "blackhole", &format!("{}/32", self.host_ip())]);
        ip_ok(&["route", "add", "blackhole", &format!("{addr}/32")]);
        self.host_cuts.push(node);
    }

    /// Heals a cut made by [`Netns::cut_host`].
    pub fn heal_host(&mut self, node: u32) {
        let (ns, addr) = self.node(node);
        ip_ok(&["-n", &ns, "route", "del", "blackhole", &format!("{}/32", self.host_ip())]);
        ip_ok(&["route", "del", "blackhole", &format!("{addr}/32")]);
        self.host_cuts.retain(|n| *n != node);
    }

    /// Heals every cut.
    pub fn heal_all(&mut self) {
        for (a, b) in self.cuts.clone() {
            self.heal(a, b);
        }
        for node in self.host_cuts.clone() {
            self.heal_host(node);
        }
    }

    /// The `ip netns exec` prefix that runs a command in `node`'s namespace.
    pub fn exec_prefix(&mut self, node: u32) -> Vec<String> {
        let (ns, _) = self.node(node);
        vec!["netns".into(), "exec".into(), ns]
    }
}

/// Deletes the bridge, veths and namespaces of number `n` (left by a killed run).
fn remove_stale(n: u8) {
    // "blackhole 10.77.3.200" (a route left by `cut_host` in the root namespace)
    let prefix = format!("10.77.{n}.");
    for line in ip_stdout(&["route", "show", "type", "blackhole"]).lines() {
        if let Some(dst) = line.split_whitespace().nth(1).filter(|d| d.starts_with(&prefix)) {
            let _ = ip(&["route", "del", "blackhole", dst]);
        }
    }
    let ns_prefix = format!("fawn{n}b");
    for line in ip_stdout(&["netns", "list"]).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        if name.strip_prefix(&ns_prefix).is_some_and(|rest| rest.chars().all(|c| c.is_ascii_digit())) {
            let _ = ip(&["netns", "del", name]);
        }
    }
    let veth_prefix = format!("fv{n}b");
    let bridge = format!("fawnbr{n}");
    for line in ip_stdout(&["-o", "link", "show"]).lines() {
        // "7: fv3b0@if6: <...>" -> "fv3b0"
        let Some(name) = line.split(": ").nth(1).map(|s| s.split('@').next().unwrap_or(s)) else { continue };
        let ours = name == bridge
            || name
                .strip_prefix(&veth_prefix)
                .is_some_and(|rest| rest.trim_end_matches('p').chars().all(|c| c.is_ascii_digit()));
        if ours {
            let _ = ip(&["link", "del", name]);
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for (ns, _) in self.nodes.values() {
            let _ = ip(&["netns", "del", ns]);
        }
        remove_stale(self.n);
    }
}

//! Which wedges this front-end serves, and when its query cache may be used for them.
//!
//! The configuration maps every wedge to the front-end serving it (`ClusterConfig::wedges`):
//! its own front-end, or a live one while its own is declared dead. The cache stays coherent
//! across those moves by three rules (docs/PROTOCOL.md, "Front-end failover"):
//!
//! * **Lease.** The front-end uses its cache, and sends updates to heads, only within
//!   [`FRONTEND_LEASE`] of sending its last heartbeat report that the group's leader answered
//!   (the answer is the configuration, read after the leader confirmed a majority follows it).
//!   The manager declares a front-end dead only after a longer silence, so a front-end cut off
//!   from the group stops before another takes its wedge. Once the lease lapses the cache is
//!   dropped at the next answered report, before the cache is used again.
//! * **Only the own wedge is cached.** A borrowed wedge is served from the chains alone: its
//!   own front-end takes it back as soon as it registers, while the borrower may not yet know
//!   (it still holds its lease); a borrower that cached could then serve a value the returned
//!   owner has since overwritten.
//! * **Hold after acquiring.** The own wedge taken back (at start, after a lapse, or after it
//!   was lent) takes no cache fill for the unsettled hold: the borrower, or this front-end's
//!   previous life, may have updates in flight that commit later without a notice here.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use fawn_proto::native::ClusterConfig;

use super::cache::QueryCache;
use crate::manager::FRONTEND_LEASE;

/// This front-end's hold on its wedges.
pub(super) struct Ownership {
    id: u32,
    hold: Duration,
    origin: Instant,
    /// Nanoseconds since `origin` until which the lease holds.
    lease_until: AtomicU64,
    /// Nanoseconds since `origin` before which the cache takes no fill.
    fills_from: AtomicU64,
    lapses: AtomicU64,
    /// The newest manager-group term a lease was renewed in.
    term: AtomicU64,
}

impl Ownership {
    /// Front-end `id`, whose lease begins at `sent` (its registration) and whose cache takes
    /// no fill for `hold`.
    pub(super) fn new(id: u32, hold: Duration, sent: Instant) -> Ownership {
        let origin = sent.min(Instant::now());
        let o = Ownership {
            id,
            hold,
            origin,
            lease_until: AtomicU64::new(0),
            fills_from: AtomicU64::new(0),
            lapses: AtomicU64::new(0),
            term: AtomicU64::new(0),
        };
        o.lease_until.store(o.nanos(sent + FRONTEND_LEASE), Ordering::SeqCst);
        o.fills_from.store(o.nanos(Instant::now() + hold), Ordering::SeqCst);
        o
    }

    fn nanos(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.origin).as_nanos() as u64
    }

    /// Whether the lease holds now.
    pub(super) fn leased(&self) -> bool {
        self.nanos(Instant::now()) < self.lease_until.load(Ordering::SeqCst)
    }

    /// Whether this front-end serves `wedge` in `config`.
    pub(super) fn serves(&self, config: &ClusterConfig, wedge: u32) -> bool {
        config.wedge_server(wedge) == self.id
    }

    /// Whether a get of a key in `wedge` may be answered from the cache.
    pub(super) fn caches(&self, config: &ClusterConfig, wedge: u32) -> bool {
        wedge == self.id && self.serves(config, wedge) && self.leased()
    }

    /// Whether a get of a key in `wedge` that read the tail may fill the cache now.
    pub(super) fn fills(&self, config: &ClusterConfig, wedge: u32) -> bool {
        self.caches(config, wedge) && self.nanos(Instant::now()) >= self.fills_from.load(Ordering::SeqCst)
    }

    fn hold_fills(&self) {
        self.fills_from.fetch_max(self.nanos(Instant::now() + self.hold), Ordering::SeqCst);
    }

    /// The leader of manager-group term `term` answered a report sent at `sent` (a lease the
    /// caller accepted: `manager::client::accept_lease`). After a lapse the cache is dropped
    /// and held before the lease is extended, so no get serves what it held meanwhile.
    pub(super) fn renew(&self, sent: Instant, term: u64, cache: &QueryCache) {
        if !self.leased() {
            self.lapses.fetch_add(1, Ordering::Relaxed);
            self.hold_fills();
            cache.clear();
        }
        self.term.fetch_max(term, Ordering::SeqCst);
        self.lease_until.fetch_max(self.nanos(sent + FRONTEND_LEASE), Ordering::SeqCst);
    }

    /// The newest term a lease was renewed in (0: none yet).
    pub(super) fn term(&self) -> u64 {
        self.term.load(Ordering::SeqCst)
    }

    /// Called before the view moves from `old` to `new`: taking the own wedge back holds the
    /// cache; losing it drops the cache (it was lent while this front-end was declared dead,
    /// so its lease had lapsed and the cache was not in use).
    pub(super) fn moving(&self, old: &ClusterConfig, new: &ClusterConfig, cache: &QueryCache) {
        let (had, has) = (self.serves(old, self.id), self.serves(new, self.id));
        if has && !had {
            self.hold_fills();
        }
        if had != has {
            cache.clear();
        }
    }

    /// Gives the lease up for good (the process is stopping): no cache hit and no update to
    /// a head from now on, before its listeners close and the manager may lend its wedge on
    /// finding them refusing (docs/PROTOCOL.md, "Front-end failover").
    pub(super) fn release(&self) {
        self.lease_until.store(0, Ordering::SeqCst);
        self.fills_from.store(u64::MAX, Ordering::SeqCst);
    }

    /// Wedges this front-end serves in `config`.
    pub(super) fn wedges_served(&self, config: &ClusterConfig) -> u64 {
        (0..config.frontends_expected.max(1)).filter(|w| self.serves(config, *w)).count() as u64
    }

    /// Leases that lapsed and were renewed later.
    pub(super) fn lapses(&self) -> u64 {
        self.lapses.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frontend::cache::CacheTiming;
    use fawn_proto::op::Item;

    fn config(wedges: Vec<u32>) -> ClusterConfig {
        ClusterConfig { frontends_expected: 2, wedges, ..ClusterConfig::default() }
    }

    fn item(cas: u64) -> Item {
        Item { value: b"v".to_vec(), flags: 0, expiry: 0, cas, state: 0 }
    }

    #[test]
    fn only_the_own_wedge_is_cached_and_only_under_the_lease() {
        let o = Ownership::new(1, Duration::ZERO, Instant::now());
        let normal = config(vec![]);
        assert!(o.caches(&normal, 1) && o.fills(&normal, 1));
        assert!(!o.caches(&normal, 0), "another front-end's wedge");
        let borrowed = config(vec![1, 1]);
        assert!(o.serves(&borrowed, 0) && !o.caches(&borrowed, 0), "a borrowed wedge is not cached");
        assert_eq!(o.wedges_served(&borrowed), 2);
        let lent = config(vec![0, 0]);
        assert!(!o.caches(&lent, 1), "a lent wedge is not served");

        let late = Ownership::new(1, Duration::ZERO, Instant::now() - FRONTEND_LEASE);
        assert!(!late.leased() && !late.caches(&normal, 1), "lapsed");
    }

    #[test]
    fn a_renewal_after_a_lapse_drops_the_cache_and_holds_fills() {
        let hold = Duration::from_secs(60);
        let cache = QueryCache::new(100, 1 << 20, CacheTiming { unsettled_hold: Duration::ZERO });
        let o = Ownership::new(0, Duration::ZERO, Instant::now() - FRONTEND_LEASE);
        let normal = config(vec![]);
        let generation = cache.generation(b"k");
        cache.fill(b"k", item(1), generation);
        assert_eq!(cache.len(), 1);
        let o = Ownership { hold, ..o };
        assert!(!o.leased());
        o.renew(Instant::now(), 3, &cache);
        assert!(o.leased());
        assert_eq!(o.term(), 3);
        assert_eq!(cache.len(), 0, "what was cached before the lapse is gone");
        assert!(o.caches(&normal, 0) && !o.fills(&normal, 0), "held after the lapse");
        assert_eq!(o.lapses(), 1);
    }

    #[test]
    fn taking_the_own_wedge_back_holds_fills_and_losing_it_drops_the_cache() {
        let cache = QueryCache::new(100, 1 << 20, CacheTiming { unsettled_hold: Duration::ZERO });
        let mut o = Ownership::new(0, Duration::ZERO, Instant::now());
        o.hold = Duration::from_secs(60);
        let (own, lent) = (config(vec![0, 1]), config(vec![1, 1]));
        cache.fill(b"k", item(1), cache.generation(b"k"));
        o.moving(&own, &lent, &cache);
        assert_eq!(cache.len(), 0);
        assert!(o.fills(&own, 0), "no hold while nothing was taken back");
        o.moving(&lent, &own, &cache);
        assert!(o.caches(&own, 0) && !o.fills(&own, 0));
    }
}

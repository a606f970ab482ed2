//! Update operations and their semantics, decided at the head of a chain.
//!
//! The head of a range's chain orders every update of that range, so conditional and
//! read-modify-write operations (add, replace, cas, append, prepend, incr, decr, touch) are
//! evaluated there against the head's current item, by [`decide`], and what is replicated down
//! the chain is only the resulting plain put or delete.

use serde::{Deserialize, Serialize};

/// Absolute Unix time in seconds; `0` means "never expires".
pub type UnixSeconds = u32;

/// An item as clients see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Item {
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    /// memcached client flags (opaque to the server).
    pub flags: u32,
    /// Absolute expiry, `0` = never.
    pub expiry: UnixSeconds,
    /// The item's version: the sequence number the head assigned to the put that wrote it.
    /// memcached's "cas unique".
    pub cas: u64,
    /// memcached's per-item access marks decided at the head ([`state`] bits; 0 for none).
    pub state: u8,
}

/// Bits of [`Item::state`]: memcached's stale-while-revalidate marks. They are decided at the
/// chain head like any conditional update and stored with the item (the datastore record's
/// state byte), so every reader of a chain sees the same marks and one client alone wins.
pub mod state {
    /// Invalidated (`md I`, `ms I`): readers see `X`; the first one also wins (`W`).
    pub const STALE: u8 = 1;
    /// A client was told it won the right to recache (`W`); later readers see `Z`.
    pub const TOKEN_SENT: u8 = 2;
}

impl Item {
    pub fn is_stale(&self) -> bool {
        self.state & state::STALE != 0
    }

    pub fn token_sent(&self) -> bool {
        self.state & state::TOKEN_SENT != 0
    }
}

/// What an update does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Mutation {
    /// Unconditional store.
    Set,
    /// Store only if the key holds no live item.
    Add,
    /// Store only if the key holds a live item.
    Replace,
    /// Append the value to a live item's value (flags and expiry unchanged).
    Append,
    /// Prepend the value to a live item's value (flags and expiry unchanged).
    Prepend,
    /// Store only if the live item's cas unique equals this.
    Cas { unique: u64 },
    /// Add to a live item holding a decimal u64 (wraps at 2^64 like memcached).
    Incr { delta: u64 },
    /// Subtract from a live item holding a decimal u64 (floors at 0 like memcached).
    Decr { delta: u64 },
    /// Change only the expiry of a live item.
    Touch,
    /// Remove the item.
    Delete,
    /// `then`, only if a live item's cas unique equals `unique` (memcached's meta `C` flag on
    /// `md`, `ma` and `ms` in append/prepend mode): a live item with another unique is
    /// `Exists`; a missing one gets what `then` does on a miss.
    IfCas { unique: u64, then: Guarded },
    /// memcached's `md I`: mark a live item stale (and clear its token), keeping its value;
    /// with `new_expiry`, `Update::expiry` replaces its expiry (`md I T`).
    Invalidate { new_expiry: bool },
    /// memcached's `ms I` with a compare value: a plain cas if `unique` matches; a `unique`
    /// below the live item's stores the value as stale, keeping the old expiry and token.
    CasStale { unique: u64 },
    /// memcached's `mg` decisions that change the item: on a miss with `vivify`, create an
    /// empty item (`Update::expiry`) and win; on a live item, win if no token was sent yet
    /// and it is stale or (`recache`) expires before that absolute time. Winning marks the
    /// token sent. Answers [`Outcome::Claimed`].
    Claim { vivify: bool, recache: Option<UnixSeconds> },
}

/// The mutations a compare-cas can guard besides a plain store (which is [`Mutation::Cas`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Guarded {
    Delete,
    Append,
    Prepend,
    Incr { delta: u64 },
    Decr { delta: u64 },
    Invalidate { new_expiry: bool },
    Touch,
}

impl From<Guarded> for Mutation {
    fn from(guarded: Guarded) -> Mutation {
        match guarded {
            Guarded::Delete => Mutation::Delete,
            Guarded::Append => Mutation::Append,
            Guarded::Prepend => Mutation::Prepend,
            Guarded::Incr { delta } => Mutation::Incr { delta },
            Guarded::Decr { delta } => Mutation::Decr { delta },
            Guarded::Invalidate { new_expiry } => Mutation::Invalidate { new_expiry },
            Guarded::Touch => Mutation::Touch,
        }
    }
}

/// An update request as the head receives it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Update {
    #[serde(with = "serde_bytes")]
    pub key: Vec<u8>,
    pub mutation: Mutation,
    /// The value for Set/Add/Replace/Append/Prepend/Cas; empty otherwise.
    #[serde(with = "serde_bytes")]
    pub value: Vec<u8>,
    /// Flags for Set/Add/Replace/Cas.
    pub flags: u32,
    /// Absolute expiry for Set/Add/Replace/Cas/Touch (`0` = never).
    pub expiry: UnixSeconds,
}

/// The outcome reported to the client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// Stored; the new item's cas unique.
    Stored { cas: u64 },
    /// add on an existing key, replace/append/prepend on a missing one.
    NotStored,
    /// cas with a stale unique.
    Exists,
    /// cas/delete/incr/decr/touch on a missing key.
    NotFound,
    /// delete succeeded.
    Deleted,
    /// incr/decr succeeded: the new value.
    Counter { value: u64, cas: u64 },
    /// touch succeeded.
    Touched { cas: u64 },
    /// incr/decr on a value that is not a decimal u64.
    NonNumeric,
    /// A claim on a live (or just created) item: whether this client won (was the one to mark
    /// the token sent), whether the claim created the item (`N`), and the item's cas after
    /// the claim. The item itself is read at the tail afterwards: an outcome is remembered
    /// for retries and sent down the chain, so it carries no value.
    Claimed { won: bool, created: bool, cas: u64 },
    /// Invalidated: the stale item's cas.
    Invalidated { cas: u64 },
}

/// What the head writes (and replicates) as the effect of an update.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Effect {
    /// Nothing to write (the condition failed).
    None,
    Put {
        #[serde(with = "serde_bytes")]
        value: Vec<u8>,
        flags: u32,
        expiry: UnixSeconds,
        /// The written item's [`state`] bits.
        state: u8,
    },
    Delete,
}

/// True if an item with this absolute expiry is dead at `now` (memcached: `exptime <= now`).
pub fn is_expired(expiry: UnixSeconds, now: UnixSeconds) -> bool {
    expiry != 0 && expiry <= now
}

/// Decides an update against the head's current item, with exact memcached 1.6 semantics.
///
/// - `current` is the head's item for the key, if any; an expired one counts as absent.
/// - `now` is the head's clock, used only for that expiry test.
/// - `new_cas` is the cas unique the written item will carry: the caller (the chain head) passes
///   the sequence number it will assign to the resulting put, so outcomes report the cas the
///   client will later see from `gets`. It is ignored when the effect is not a put.
///
/// Returns what to tell the client and what to write (and replicate). The effect is always a
/// plain put or delete (or nothing), so replicas never re-evaluate conditions.
///
/// Deviation from memcached, by design: `touch` writes a put, so the item gets `new_cas`
/// (memcached keeps the cas on touch); a cas token taken before a touch is then stale.
pub fn decide(update: &Update, current: Option<&Item>, now: UnixSeconds, new_cas: u64) -> (Outcome, Effect) {
    let live = current.filter(|item| !is_expired(item.expiry, now));
    apply(update.mutation, update, live, new_cas)
}

/// `decide` for one mutation against the live item (`update.mutation` is not looked at).
fn apply(mutation: Mutation, update: &Update, live: Option<&Item>, new_cas: u64) -> (Outcome, Effect) {
    match mutation {
        Mutation::Set => store(update, new_cas),
        Mutation::Add => match live {
            None => store(update, new_cas),
            Some(_) => not_stored(),
        },
        Mutation::Replace => match live {
            Some(_) => store(update, new_cas),
            None => not_stored(),
        },
        Mutation::Append | Mutation::Prepend => match live {
            Some(item) => concat(mutation == Mutation::Append, update, item, new_cas),
            None => not_stored(),
        },
        Mutation::Cas { unique } => match live {
            Some(item) if item.cas == unique => store(update, new_cas),
            Some(_) => (Outcome::Exists, Effect::None),
            None => (Outcome::NotFound, Effect::None),
        },
        Mutation::Incr { delta } => arith(live, new_cas, |v| v.wrapping_add(delta)),
        Mutation::Decr { delta } => arith(live, new_cas, |v| v.saturating_sub(delta)),
        Mutation::Touch => match live {
            Some(item) => touch(update, item, new_cas),
            None => (Outcome::NotFound, Effect::None),
        },
        Mutation::Delete => match live {
            Some(_) => (Outcome::Deleted, Effect::Delete),
            None => (Outcome::NotFound, Effect::None),
        },
        Mutation::Invalidate { new_expiry } => match live {
            Some(item) => invalidate(update, item, new_expiry, new_cas),
            None => (Outcome::NotFound, Effect::None),
        },
        Mutation::CasStale { unique } => match live {
            Some(item) if unique < item.cas => store_stale(update, item, new_cas),
            _ => apply(Mutation::Cas { unique }, update, live, new_cas),
        },
        Mutation::Claim { vivify, recache } => claim(update, live, vivify, recache, new_cas),
        Mutation::IfCas { unique, then } => match live {
            // memcached refuses an empty counter before it compares the cas.
            Some(item) if is_arith(then) && item.value.is_empty() => (Outcome::NonNumeric, Effect::None),
            Some(item) if item.cas != unique => (Outcome::Exists, Effect::None),
            _ => apply(then.into(), update, live, new_cas),
        },
    }
}

fn is_arith(guarded: Guarded) -> bool {
    matches!(guarded, Guarded::Incr { .. } | Guarded::Decr { .. })
}

fn not_stored() -> (Outcome, Effect) {
    (Outcome::NotStored, Effect::None)
}

fn store(update: &Update, new_cas: u64) -> (Outcome, Effect) {
    let effect =
        Effect::Put { value: update.value.clone(), flags: update.flags, expiry: update.expiry, state: 0 };
    (Outcome::Stored { cas: new_cas }, effect)
}

/// `md I`: the item stays, stale and with no token sent, under a new cas (as memcached).
fn invalidate(update: &Update, item: &Item, new_expiry: bool, new_cas: u64) -> (Outcome, Effect) {
    let expiry = if new_expiry { update.expiry } else { item.expiry };
    let effect = Effect::Put { value: item.value.clone(), flags: item.flags, expiry, state: state::STALE };
    (Outcome::Invalidated { cas: new_cas }, effect)
}

/// `ms I` with an older cas: the new value, stale, with the old item's expiry and token.
fn store_stale(update: &Update, item: &Item, new_cas: u64) -> (Outcome, Effect) {
    let state = state::STALE | (item.state & state::TOKEN_SENT);
    let effect = Effect::Put { value: update.value.clone(), flags: update.flags, expiry: item.expiry, state };
    (Outcome::Stored { cas: new_cas }, effect)
}

/// `mg` with `N`/`R`, or on a stale item: who wins the right to recache, as memcached 1.6
/// decides it. A win rewrites the item with its token marked sent (so it gets `new_cas`;
/// memcached keeps the cas there); no win writes nothing.
fn claim(
    update: &Update,
    live: Option<&Item>,
    vivify: bool,
    recache: Option<UnixSeconds>,
    new_cas: u64,
) -> (Outcome, Effect) {
    let Some(item) = live else {
        if !vivify {
            return (Outcome::NotFound, Effect::None);
        }
        let effect =
            Effect::Put { value: Vec::new(), flags: 0, expiry: update.expiry, state: state::TOKEN_SENT };
        return (Outcome::Claimed { won: true, created: true, cas: new_cas }, effect);
    };
    let recache_due = recache.is_some_and(|at| item.expiry != 0 && item.expiry < at);
    if item.token_sent() || !(item.is_stale() || recache_due) {
        return (Outcome::Claimed { won: false, created: false, cas: item.cas }, Effect::None);
    }
    let state = item.state | state::TOKEN_SENT;
    let effect = Effect::Put { value: item.value.clone(), flags: item.flags, expiry: item.expiry, state };
    (Outcome::Claimed { won: true, created: false, cas: new_cas }, effect)
}

/// append/prepend keep the stored item's flags and expiry (memcached ignores the new ones).
fn concat(append: bool, update: &Update, item: &Item, new_cas: u64) -> (Outcome, Effect) {
    let mut value = Vec::with_capacity(item.value.len() + update.value.len());
    if append {
        value.extend_from_slice(&item.value);
        value.extend_from_slice(&update.value);
    } else {
        value.extend_from_slice(&update.value);
        value.extend_from_slice(&item.value);
    }
    let effect = Effect::Put { value, flags: item.flags, expiry: item.expiry, state: 0 };
    (Outcome::Stored { cas: new_cas }, effect)
}

fn touch(update: &Update, item: &Item, new_cas: u64) -> (Outcome, Effect) {
    // memcached touches in place: the item keeps its marks.
    let effect = Effect::Put {
        value: item.value.clone(),
        flags: item.flags,
        expiry: update.expiry,
        state: item.state,
    };
    (Outcome::Touched { cas: new_cas }, effect)
}

/// incr/decr: the value must be a decimal u64; flags and expiry are kept. As memcached does,
/// a result no longer than the old value is written over it, padded with spaces to the old
/// length (so `incr` past 2^64 leaves `0` and spaces, and `decr 10 1` leaves `9 `).
fn arith(live: Option<&Item>, new_cas: u64, apply: impl Fn(u64) -> u64) -> (Outcome, Effect) {
    let Some(item) = live else {
        return (Outcome::NotFound, Effect::None);
    };
    let Some(old) = parse_counter(&item.value) else {
        return (Outcome::NonNumeric, Effect::None);
    };
    let value = apply(old);
    let mut text = value.to_string().into_bytes();
    if text.len() < item.value.len() {
        text.resize(item.value.len(), b' ');
    }
    // memcached changes a counter in place: the item keeps its marks.
    let effect = Effect::Put { value: text, flags: item.flags, expiry: item.expiry, state: item.state };
    (Outcome::Counter { value, cas: new_cas }, effect)
}

/// Parses a stored counter the way memcached's `safe_strtoull` reads it: optional leading
/// white space, an optional sign (`-` only for zero), decimal digits, and then the end or a
/// white-space byte, after which anything is ignored (memcached pads shrunk counters with
/// spaces). An empty value, no digits, overflow or a non-space byte after the digits is
/// non-numeric.
pub fn parse_counter(value: &[u8]) -> Option<u64> {
    let is_space = |b: &u8| matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r');
    let start = value.iter().position(|b| !is_space(b))?;
    let (negative, rest) = match value[start..].split_first() {
        Some((b'-', tail)) => (true, tail),
        Some((b'+', tail)) => (false, tail),
        _ => (false, &value[start..]),
    };
    let digits_end = rest.iter().position(|b| !b.is_ascii_digit()).unwrap_or(rest.len());
    if digits_end == 0 || rest.get(digits_end).is_some_and(|b| !is_space(b)) {
        return None;
    }
    let parsed: u64 = std::str::from_utf8(&rest[..digits_end]).ok()?.parse().ok()?;
    if negative && parsed != 0 {
        return None;
    }
    Some(parsed)
}

#[cfg(test)]
mod decide_tests {
    use super::*;

    const NOW: UnixSeconds = 1_000_000;
    const NEW: u64 = 77;

    fn item(value: &[u8], flags: u32, expiry: UnixSeconds, cas: u64) -> Item {
        Item { value: value.to_vec(), flags, expiry, cas, state: 0 }
    }

    fn upd(mutation: Mutation, value: &[u8], flags: u32, expiry: UnixSeconds) -> Update {
        Update { key: b"k".to_vec(), mutation, value: value.to_vec(), flags, expiry }
    }

    fn put(value: &[u8], flags: u32, expiry: UnixSeconds) -> Effect {
        Effect::Put { value: value.to_vec(), flags, expiry, state: 0 }
    }

    fn live() -> Item {
        item(b"old", 5, 0, 9)
    }

    fn expired() -> Item {
        item(b"old", 5, NOW, 9)
    }

    #[test]
    fn set_always_stores() {
        let u = upd(Mutation::Set, b"v", 3, 0);
        let want = (Outcome::Stored { cas: NEW }, put(b"v", 3, 0));
        assert_eq!(decide(&u, None, NOW, NEW), want);
        assert_eq!(decide(&u, Some(&live()), NOW, NEW), want);
    }

    #[test]
    fn add_only_when_absent_or_expired() {
        let u = upd(Mutation::Add, b"v", 3, 0);
        assert_eq!(decide(&u, Some(&live()), NOW, NEW), (Outcome::NotStored, Effect::None));
        let stored = (Outcome::Stored { cas: NEW }, put(b"v", 3, 0));
        assert_eq!(decide(&u, None, NOW, NEW), stored);
        assert_eq!(decide(&u, Some(&expired()), NOW, NEW), stored);
    }

    #[test]
    fn replace_only_when_live() {
        let u = upd(Mutation::Replace, b"v", 3, 0);
        assert_eq!(decide(&u, None, NOW, NEW), (Outcome::NotStored, Effect::None));
        assert_eq!(decide(&u, Some(&expired()), NOW, NEW), (Outcome::NotStored, Effect::None));
        let stored = (Outcome::Stored { cas: NEW }, put(b"v", 3, 0));
        assert_eq!(decide(&u, Some(&live()), NOW, NEW), stored);
    }

    #[test]
    fn append_prepend_keep_flags_and_expiry() {
        let cur = item(b"mid", 5, NOW + 10, 9);
        let a = upd(Mutation::Append, b"+", 99, 1);
        let stored = (Outcome::Stored { cas: NEW }, put(b"mid+", 5, NOW + 10));
        assert_eq!(decide(&a, Some(&cur), NOW, NEW), stored);
        let p = upd(Mutation::Prepend, b"-", 99, 1);
        let stored = (Outcome::Stored { cas: NEW }, put(b"-mid", 5, NOW + 10));
        assert_eq!(decide(&p, Some(&cur), NOW, NEW), stored);
        assert_eq!(decide(&a, None, NOW, NEW), (Outcome::NotStored, Effect::None));
        assert_eq!(decide(&p, Some(&expired()), NOW, NEW), (Outcome::NotStored, Effect::None));
    }

    #[test]
    fn cas_compares_unique() {
        let ok = upd(Mutation::Cas { unique: 9 }, b"v", 1, 0);
        let stale = upd(Mutation::Cas { unique: 8 }, b"v", 1, 0);
        let stored = (Outcome::Stored { cas: NEW }, put(b"v", 1, 0));
        assert_eq!(decide(&ok, Some(&live()), NOW, NEW), stored);
        assert_eq!(decide(&stale, Some(&live()), NOW, NEW), (Outcome::Exists, Effect::None));
        assert_eq!(decide(&ok, None, NOW, NEW), (Outcome::NotFound, Effect::None));
        assert_eq!(decide(&ok, Some(&expired()), NOW, NEW), (Outcome::NotFound, Effect::None));
    }

    #[test]
    fn incr_adds_wraps_and_keeps_flags_expiry() {
        let cur = item(b"10", 4, NOW + 5, 1);
        let u = upd(Mutation::Incr { delta: 5 }, b"", 0, 0);
        let want = (Outcome::Counter { value: 15, cas: NEW }, put(b"15", 4, NOW + 5));
        assert_eq!(decide(&u, Some(&cur), NOW, NEW), want);
        let max = item(u64::MAX.to_string().as_bytes(), 0, 0, 1);
        let u = upd(Mutation::Incr { delta: 2 }, b"", 0, 0);
        // memcached overwrites in place: `1` padded to the old 20 bytes.
        let want = (Outcome::Counter { value: 1, cas: NEW }, put(format!("{:<20}", 1).as_bytes(), 0, 0));
        assert_eq!(decide(&u, Some(&max), NOW, NEW), want);
    }

    #[test]
    fn decr_floors_at_zero() {
        let cur = item(b"3", 0, 0, 1);
        let u = upd(Mutation::Decr { delta: 5 }, b"", 0, 0);
        let want = (Outcome::Counter { value: 0, cas: NEW }, put(b"0", 0, 0));
        assert_eq!(decide(&u, Some(&cur), NOW, NEW), want);
        let u = upd(Mutation::Decr { delta: 1 }, b"", 0, 0);
        let want = (Outcome::Counter { value: 2, cas: NEW }, put(b"2", 0, 0));
        assert_eq!(decide(&u, Some(&cur), NOW, NEW), want);
        let ten = item(b"10", 0, 0, 1);
        let want = (Outcome::Counter { value: 9, cas: NEW }, put(b"9 ", 0, 0));
        assert_eq!(decide(&u, Some(&ten), NOW, NEW), want);
    }

    #[test]
    fn arith_missing_and_non_numeric() {
        let u = upd(Mutation::Incr { delta: 1 }, b"", 0, 0);
        assert_eq!(decide(&u, None, NOW, NEW), (Outcome::NotFound, Effect::None));
        assert_eq!(decide(&u, Some(&expired()), NOW, NEW), (Outcome::NotFound, Effect::None));
        for bad in [&b"abc"[..], b"", b"  ", b"-1", b"1x", b"18446744073709551616"] {
            let cur = item(bad, 0, 0, 1);
            assert_eq!(decide(&u, Some(&cur), NOW, NEW), (Outcome::NonNumeric, Effect::None));
        }
        // As memcached's strtoull: white space, then anything.
        for (stored, value, written) in
            [(&b"7  "[..], 8, &b"8  "[..]), (b" +5", 6, b"6  "), (b"1 2", 2, b"2  ")]
        {
            let want = (Outcome::Counter { value, cas: NEW }, put(written, 0, 0));
            assert_eq!(decide(&u, Some(&item(stored, 0, 0, 1)), NOW, NEW), want, "{stored:?}");
        }
    }

    #[test]
    fn touch_changes_only_expiry() {
        let u = upd(Mutation::Touch, b"", 0, NOW + 100);
        let want = (Outcome::Touched { cas: NEW }, put(b"old", 5, NOW + 100));
        assert_eq!(decide(&u, Some(&live()), NOW, NEW), want);
        assert_eq!(decide(&u, None, NOW, NEW), (Outcome::NotFound, Effect::None));
        assert_eq!(decide(&u, Some(&expired()), NOW, NEW), (Outcome::NotFound, Effect::None));
    }

    #[test]
    fn delete_only_live() {
        let u = upd(Mutation::Delete, b"", 0, 0);
        assert_eq!(decide(&u, Some(&live()), NOW, NEW), (Outcome::Deleted, Effect::Delete));
        assert_eq!(decide(&u, None, NOW, NEW), (Outcome::NotFound, Effect::None));
        assert_eq!(decide(&u, Some(&expired()), NOW, NEW), (Outcome::NotFound, Effect::None));
    }

    #[test]
    fn if_cas_guards_delete_append_and_arith() {
        let guard = |then| upd(Mutation::IfCas { unique: 9, then }, b"+", 0, 0);
        let stale = |then| upd(Mutation::IfCas { unique: 8, then }, b"+", 0, 0);
        let exists = (Outcome::Exists, Effect::None);
        assert_eq!(
            decide(&guard(Guarded::Delete), Some(&live()), NOW, NEW),
            (Outcome::Deleted, Effect::Delete)
        );
        assert_eq!(decide(&stale(Guarded::Delete), Some(&live()), NOW, NEW), exists);
        assert_eq!(decide(&guard(Guarded::Delete), None, NOW, NEW), (Outcome::NotFound, Effect::None));
        let appended = (Outcome::Stored { cas: NEW }, put(b"old+", 5, 0));
        assert_eq!(decide(&guard(Guarded::Append), Some(&live()), NOW, NEW), appended);
        assert_eq!(decide(&stale(Guarded::Prepend), Some(&live()), NOW, NEW), exists);
        assert_eq!(decide(&guard(Guarded::Prepend), None, NOW, NEW), (Outcome::NotStored, Effect::None));
        let counter = item(b"5", 0, 0, 9);
        let incr = (Outcome::Counter { value: 7, cas: NEW }, put(b"7", 0, 0));
        assert_eq!(decide(&guard(Guarded::Incr { delta: 2 }), Some(&counter), NOW, NEW), incr);
        assert_eq!(decide(&stale(Guarded::Decr { delta: 2 }), Some(&counter), NOW, NEW), exists);
        assert_eq!(
            decide(&stale(Guarded::Incr { delta: 1 }), Some(&expired()), NOW, NEW),
            (Outcome::NotFound, Effect::None)
        );
        // A non-numeric value is compared first; an empty one is refused first.
        assert_eq!(decide(&stale(Guarded::Incr { delta: 1 }), Some(&live()), NOW, NEW), exists);
        let empty = item(b"", 0, 0, 9);
        let non_numeric = (Outcome::NonNumeric, Effect::None);
        assert_eq!(decide(&stale(Guarded::Incr { delta: 1 }), Some(&empty), NOW, NEW), non_numeric);
    }

    fn with_state(mut item: Item, bits: u8) -> Item {
        item.state = bits;
        item
    }

    #[test]
    fn invalidate_marks_stale_and_clears_the_token() {
        let keep = upd(Mutation::Invalidate { new_expiry: false }, b"", 0, NOW + 30);
        let sent = with_state(item(b"old", 5, NOW + 9, 9), state::TOKEN_SENT);
        let stale = Effect::Put { value: b"old".to_vec(), flags: 5, expiry: NOW + 9, state: state::STALE };
        assert_eq!(decide(&keep, Some(&sent), NOW, NEW), (Outcome::Invalidated { cas: NEW }, stale));
        let ttl = upd(Mutation::Invalidate { new_expiry: true }, b"", 0, NOW + 30);
        let (_, effect) = decide(&ttl, Some(&sent), NOW, NEW);
        assert!(matches!(effect, Effect::Put { expiry, .. } if expiry == NOW + 30));
        assert_eq!(decide(&keep, None, NOW, NEW), (Outcome::NotFound, Effect::None));
        let guarded = Mutation::IfCas { unique: 8, then: Guarded::Invalidate { new_expiry: false } };
        assert_eq!(
            decide(&upd(guarded, b"", 0, 0), Some(&live()), NOW, NEW),
            (Outcome::Exists, Effect::None)
        );
    }

    #[test]
    fn cas_stale_stores_an_older_value_as_stale() {
        let cur = with_state(item(b"old", 5, NOW + 9, 9), state::STALE | state::TOKEN_SENT);
        let older = upd(Mutation::CasStale { unique: 8 }, b"v", 1, 0);
        let all = state::STALE | state::TOKEN_SENT;
        let want = Effect::Put { value: b"v".to_vec(), flags: 1, expiry: NOW + 9, state: all };
        assert_eq!(decide(&older, Some(&cur), NOW, NEW), (Outcome::Stored { cas: NEW }, want));
        let same = upd(Mutation::CasStale { unique: 9 }, b"v", 1, 0);
        assert_eq!(decide(&same, Some(&cur), NOW, NEW), (Outcome::Stored { cas: NEW }, put(b"v", 1, 0)));
        let newer = upd(Mutation::CasStale { unique: 10 }, b"v", 1, 0);
        assert_eq!(decide(&newer, Some(&cur), NOW, NEW), (Outcome::Exists, Effect::None));
        assert_eq!(decide(&older, None, NOW, NEW), (Outcome::NotFound, Effect::None));
    }

    #[test]
    fn claim_vivifies_a_miss_once() {
        let u = upd(Mutation::Claim { vivify: true, recache: None }, b"", 0, NOW + 30);
        let (outcome, effect) = decide(&u, None, NOW, NEW);
        assert_eq!(outcome, Outcome::Claimed { won: true, created: true, cas: NEW });
        let want = Effect::Put { value: Vec::new(), flags: 0, expiry: NOW + 30, state: state::TOKEN_SENT };
        assert_eq!(effect, want);
        // The next reader finds the empty item, token sent: no win, nothing written.
        let created =
            Item { value: Vec::new(), flags: 0, expiry: NOW + 30, cas: NEW, state: state::TOKEN_SENT };
        let again = decide(&u, Some(&created), NOW, NEW + 1);
        assert_eq!(again, (Outcome::Claimed { won: false, created: false, cas: NEW }, Effect::None));
        let plain = upd(Mutation::Claim { vivify: false, recache: None }, b"", 0, 0);
        assert_eq!(decide(&plain, None, NOW, NEW), (Outcome::NotFound, Effect::None));
    }

    #[test]
    fn claim_wins_a_stale_item_or_a_due_recache() {
        let plain = upd(Mutation::Claim { vivify: false, recache: None }, b"", 0, 0);
        let fresh = item(b"old", 5, NOW + 100, 9);
        let not_won = Outcome::Claimed { won: false, created: false, cas: 9 };
        assert_eq!(decide(&plain, Some(&fresh), NOW, NEW), (not_won, Effect::None));
        let stale = with_state(fresh.clone(), state::STALE);
        let (outcome, effect) = decide(&plain, Some(&stale), NOW, NEW);
        assert_eq!(outcome, Outcome::Claimed { won: true, created: false, cas: NEW });
        let all = state::STALE | state::TOKEN_SENT;
        let want = Effect::Put { value: b"old".to_vec(), flags: 5, expiry: NOW + 100, state: all };
        assert_eq!(effect, want);
        let won = with_state(Item { cas: NEW, ..fresh.clone() }, all);
        assert_eq!(decide(&plain, Some(&won), NOW, NEW).1, Effect::None);
        // Recache: only an expiring item whose expiry is before the threshold.
        let due = |at| upd(Mutation::Claim { vivify: false, recache: Some(at) }, b"", 0, 0);
        assert!(matches!(
            decide(&due(NOW + 101), Some(&fresh), NOW, NEW).0,
            Outcome::Claimed { won: true, .. }
        ));
        assert!(matches!(
            decide(&due(NOW + 100), Some(&fresh), NOW, NEW).0,
            Outcome::Claimed { won: false, .. }
        ));
        assert!(matches!(
            decide(&due(NOW + 101), Some(&live()), NOW, NEW).0,
            Outcome::Claimed { won: false, .. }
        ));
    }

    #[test]
    fn guarded_touch_keeps_marks() {
        let marked = with_state(item(b"v", 3, 0, 9), state::STALE | state::TOKEN_SENT);
        let guard = |unique| upd(Mutation::IfCas { unique, then: Guarded::Touch }, b"", 0, NOW + 5);
        let all = state::STALE | state::TOKEN_SENT;
        let want = Effect::Put { value: b"v".to_vec(), flags: 3, expiry: NOW + 5, state: all };
        assert_eq!(decide(&guard(9), Some(&marked), NOW, NEW), (Outcome::Touched { cas: NEW }, want));
        assert_eq!(decide(&guard(8), Some(&marked), NOW, NEW), (Outcome::Exists, Effect::None));
        assert_eq!(decide(&guard(9), None, NOW, NEW), (Outcome::NotFound, Effect::None));
    }

    #[test]
    fn plain_writes_clear_marks_in_place_changes_keep_them() {
        let marked = with_state(item(b"5", 0, 0, 9), state::STALE);
        let set = upd(Mutation::Set, b"v", 0, 0);
        assert!(matches!(decide(&set, Some(&marked), NOW, NEW).1, Effect::Put { state: 0, .. }));
        let append = upd(Mutation::Append, b"v", 0, 0);
        assert!(matches!(decide(&append, Some(&marked), NOW, NEW).1, Effect::Put { state: 0, .. }));
        let incr = upd(Mutation::Incr { delta: 1 }, b"", 0, 0);
        assert!(matches!(decide(&incr, Some(&marked), NOW, NEW).1, Effect::Put { state: state::STALE, .. }));
        let touch = upd(Mutation::Touch, b"", 0, NOW + 5);
        assert!(matches!(decide(&touch, Some(&marked), NOW, NEW).1, Effect::Put { state: state::STALE, .. }));
    }

    #[test]
    fn expiry_boundary_is_inclusive() {
        assert!(is_expired(NOW, NOW));
        assert!(!is_expired(NOW + 1, NOW));
        assert!(!is_expired(0, NOW));
    }
}

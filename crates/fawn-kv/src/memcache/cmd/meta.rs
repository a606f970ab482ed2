//! Meta commands `mg`, `ms`, `md`, `ma` (`mn` is answered in `run`).
//!
//! Reply codes: `VA <len>` (value follows), `HD` (success), `EN` (miss), `NF` (not found),
//! `NS` (not stored), `EX` (cas mismatch). Return flags follow in the order the client asked
//! for them. `q` hides the success reply (`HD`, and `VA` for `ma`) and `mg`'s `EN`; failures
//! are always sent — checked against memcached 1.6.18.
//!
//! Access state, as memcached 1.6 keeps it:
//! - stale-while-revalidate and vivify (`md I`, `ms I`, `mg N`/`R`, and the `W`, `X`, `Z`
//!   reply flags) pick one winning client, so they are updates decided at the chain head
//!   ([`Mutation::Invalidate`], [`Mutation::CasStale`], [`Mutation::Claim`]) and their marks
//!   are stored with the item. A plain `mg` reads at the tail as usual and goes to the head
//!   only when the item it read is stale with no token sent (it may win);
//! - `h` and `l` are read-side marks this front-end keeps in memory (`memcache::access`).

use fawn_proto::memcache::{
    absolute_expiry, reply, ArithMode, MetaArith, MetaDelete, MetaFlags, MetaGet, MetaSet, SetMode,
};
use fawn_proto::op::{is_expired, state, Guarded, Item, Mutation, Outcome, UnixSeconds, Update};

use crate::memcache::access::Marks;

use super::{bare_update, get, now, store, Ctx};
use crate::memcache::stats::Stats;
use crate::service::{KvService, ServiceError};

/// What return flags may report about the item.
struct Info {
    cas: u64,
    flags: u32,
    size: usize,
    expiry: UnixSeconds,
    /// The read marks (`mg` only).
    marks: Option<Marks>,
}

impl Info {
    fn of(item: &Item) -> Self {
        Info { cas: item.cas, flags: item.flags, size: item.value.len(), expiry: item.expiry, marks: None }
    }
}

/// Writes `code`, the requested return flags (those known without `info` on a miss), `\r\n`.
fn header(out: &mut Vec<u8>, code: &[u8], meta: &MetaFlags, key: &[u8], info: Option<&Info>) {
    header_with(out, code, meta, key, info, b"");
}

/// [`header`] with `tail` (`mg`'s ` Z`, ` X`, ` W`) after the return flags.
fn header_with(
    out: &mut Vec<u8>,
    code: &[u8],
    meta: &MetaFlags,
    key: &[u8],
    info: Option<&Info>,
    tail: &[u8],
) {
    out.extend_from_slice(code);
    for letter in &meta.order {
        match (letter, info) {
            (b'k', _) => reply::meta_key(out, key, meta.base64),
            (b'O', _) => reply::meta_opaque(out, meta.opaque.as_deref().unwrap_or_default()),
            (b'c', Some(info)) => reply::meta_flag(out, b'c', info.cas),
            (b'f', Some(info)) => reply::meta_flag(out, b'f', info.flags),
            (b's', Some(info)) => reply::meta_flag(out, b's', info.size),
            (b't', Some(info)) => reply::meta_flag(out, b't', ttl(info.expiry)),
            (b'h', Some(Info { marks: Some(marks), .. })) => {
                reply::meta_flag(out, b'h', u8::from(marks.fetched))
            }
            (b'l', Some(Info { marks: Some(marks), .. })) => reply::meta_flag(out, b'l', marks.idle_secs),
            _ => {}
        }
    }
    out.extend_from_slice(tail);
    out.extend_from_slice(b"\r\n");
}

/// Remaining seconds to live; -1 for an item that never expires.
fn ttl(expiry: UnixSeconds) -> i64 {
    if expiry == 0 {
        -1
    } else {
        (i64::from(expiry) - i64::from(now())).max(0)
    }
}

/// `me`: `ME <key> exp=<-ttl> la=<idle secs> cas=<cas> fetch=<yes|no> cls=<class> size=<bytes>`.
/// `la` and `fetch` are this front-end's read marks; FAWN has no slab class (`cls=1`), and
/// `size` is the key and value bytes (memcached adds its item header).
pub(super) async fn debug<S: KvService>(ctx: &mut Ctx<'_, S>, key: Vec<u8>) {
    Stats::incr(&ctx.stats().counters.cmd_meta);
    let item = match get::fetch(ctx, &key).await {
        Ok(item) => item,
        Err(error) => return ctx.server_error(&error, false),
    };
    let Some(item) = item else {
        return ctx.reply(b"EN\r\n");
    };
    let size = key.len() + item.value.len();
    let now = now();
    let marks = ctx.shared.access.peek(&key, item.cas, now);
    let fetch = if marks.fetched { "yes" } else { "no" };
    // As memcached 1.6 prints it: seconds since the expiry, so negative while the item lives.
    let exp = if item.expiry == 0 { -1 } else { i64::from(now) - i64::from(item.expiry) };
    let (la, cas) = (marks.idle_secs, item.cas);
    let line = format!(" exp={exp} la={la} cas={cas} fetch={fetch} cls=1 size={size}\r\n");
    let out = ctx.out();
    out.extend_from_slice(b"ME ");
    out.extend_from_slice(&key);
    out.extend_from_slice(line.as_bytes());
}

/// `mg`: with `T`, the hit is also touched (as `gat`). `u` leaves the read marks alone.
pub(super) async fn get<S: KvService>(ctx: &mut Ctx<'_, S>, mg: MetaGet) {
    Stats::incr(&ctx.stats().counters.cmd_meta);
    let found = match find(ctx, &mg).await {
        Ok(found) => found,
        Err(error) => return ctx.server_error(&error, false),
    };
    let Some(Found { item, won, created }) = found else {
        if !mg.meta.quiet {
            header(ctx.out(), reply::META_EN, &mg.meta, &mg.key, None);
        }
        return;
    };
    let access = &ctx.shared.access;
    let now = now();
    if created {
        access.stored(&mg.key, item.cas, now);
    } else if won {
        access.carried(&mg.key, item.cas);
    }
    let no_bump = mg.meta.order.contains(&b'u');
    let marks = if no_bump { access.peek(&mg.key, item.cas, now) } else { get::seen(ctx, &mg.key, &item) };
    let info = Info { marks: Some(marks), ..Info::of(&item) };
    // As memcached: `Z` if a token was sent before this request, `X` if stale, `W` if won.
    let mut tail = Vec::new();
    if item.token_sent() && !won {
        tail.extend_from_slice(b" Z");
    }
    if item.is_stale() {
        tail.extend_from_slice(b" X");
    }
    if won {
        tail.extend_from_slice(b" W");
    }
    if mg.value {
        let code = format!("VA {}", item.value.len());
        // memcached 1.6.18 returns the key of a `VA` reply decoded, without `b`.
        let meta = MetaFlags { base64: false, ..mg.meta.clone() };
        header_with(ctx.out(), code.as_bytes(), &meta, &mg.key, Some(&info), &tail);
        ctx.out().extend_from_slice(&item.value);
        ctx.out().extend_from_slice(b"\r\n");
    } else {
        header_with(ctx.out(), reply::META_HD, &mg.meta, &mg.key, Some(&info), &tail);
    }
}

/// What `mg` answers about: the item, and whether this request won it or created it.
struct Found {
    item: Item,
    won: bool,
    created: bool,
}

/// Reads the item at the tail (touching it first with `T`), and goes to the head when the
/// answer may change the item: `N` or `R`, or a stale item no one has won yet.
async fn find<S: KvService>(ctx: &mut Ctx<'_, S>, mg: &MetaGet) -> Result<Option<Found>, ServiceError> {
    let to_head = mg.vivify.is_some() || mg.recache.is_some();
    let item = match mg.meta.ttl {
        Some(exptime) => get::touch_and_fetch(ctx, &mg.key, exptime).await?,
        None if to_head => None,
        None => get::fetch(ctx, &mg.key).await?,
    };
    if to_head || item.as_ref().is_some_and(|item| item.is_stale() && !item.token_sent()) {
        return claim(ctx, mg).await;
    }
    Ok(item.map(|item| Found { item, won: false, created: false }))
}

/// The head decides who wins (see [`Mutation::Claim`]); the item is then read at the tail,
/// which holds the claim once the head has answered. (If the key was written again in
/// between, the newer item is answered, with this request's win.)
async fn claim<S: KvService>(ctx: &mut Ctx<'_, S>, mg: &MetaGet) -> Result<Option<Found>, ServiceError> {
    let now = now();
    let mutation = Mutation::Claim {
        vivify: mg.vivify.is_some(),
        recache: mg.recache.map(|threshold| absolute_expiry(threshold, now)),
    };
    let expiry = mg.vivify.map_or(0, |exptime| absolute_expiry(exptime, now));
    let outcome = ctx.service().update(bare_update(mg.key.clone(), mutation, expiry)).await?;
    let Outcome::Claimed { won, created, cas } = outcome else {
        count_claim(ctx.stats(), mg, false);
        return Ok(None);
    };
    count_claim(ctx.stats(), mg, true);
    if created {
        // Answered as created even if its exptime has passed (`N-1`), as memcached does.
        let item = Item { value: Vec::new(), flags: 0, expiry, cas, state: state::TOKEN_SENT };
        return Ok(Some(Found { item, won, created }));
    }
    // The claim is not repeated to fit a reply: room for the largest one.
    let room = ctx.reserve_reads(ctx.shared.budget.room_max()).await;
    let read = ctx.service().get(&mg.key).await;
    let used = get::observe(ctx, &mg.key, &read);
    ctx.hold_largest(room, used);
    let item = read?.filter(|item| !is_expired(item.expiry, now));
    Ok(item.map(|item| Found { item, won, created }))
}

/// A claim is a read as far as `stats` counts (a `T` was counted as a touch already).
fn count_claim(stats: &Stats, mg: &MetaGet, hit: bool) {
    if mg.meta.ttl.is_none() {
        let counters = &stats.counters;
        Stats::incr(&counters.cmd_get);
        Stats::incr(if hit { &counters.get_hits } else { &counters.get_misses });
    }
}

/// `ms`: `M` picks the storage mode; `C` makes it a compare-and-set.
pub(super) async fn set<S: KvService>(ctx: &mut Ctx<'_, S>, ms: MetaSet) {
    let counters = &ctx.stats().counters;
    Stats::incr(&counters.cmd_meta);
    Stats::incr(&counters.cmd_set);
    let mutation = set_mutation(ms.mode, ms.compare_cas, ms.invalidate);
    let size = ms.value.len();
    let update = Update {
        key: ms.key.clone(),
        mutation,
        value: ms.value,
        flags: ms.client_flags,
        expiry: absolute_expiry(ms.meta.ttl.unwrap_or(0), now()),
    };
    let Some(outcome) = ctx.update(update, false).await else {
        return;
    };
    let (code, info) = match outcome {
        Outcome::Stored { cas } => {
            Stats::incr(&ctx.stats().counters.total_items);
            ctx.shared.access.stored(&ms.key, cas, now());
            if ms.meta.quiet {
                return;
            }
            let info = Info { cas, flags: ms.client_flags, size, expiry: 0, marks: None };
            (reply::META_HD, Some(info))
        }
        Outcome::Exists => (reply::META_EX, None),
        Outcome::NotFound => (reply::META_NF, None),
        _ => (reply::META_NS, None),
    };
    header(ctx.out(), code, &ms.meta, &ms.key, info.as_ref());
}

/// What `ms` does with its mode and `C`, as memcached 1.6 decides it: with a compare value,
/// set and replace are a cas (with `I`, one that may store an older value as stale), append
/// and prepend are guarded only by a non-zero value, and add ignores it.
fn set_mutation(mode: SetMode, compare_cas: Option<u64>, invalidate: bool) -> Mutation {
    match (mode, compare_cas) {
        (SetMode::Set | SetMode::Replace, Some(unique)) if invalidate => Mutation::CasStale { unique },
        (SetMode::Set | SetMode::Replace, Some(unique)) => Mutation::Cas { unique },
        (SetMode::Append, Some(unique)) if unique != 0 => Mutation::IfCas { unique, then: Guarded::Append },
        (SetMode::Prepend, Some(unique)) if unique != 0 => Mutation::IfCas { unique, then: Guarded::Prepend },
        _ => store::mutation(mode),
    }
}

/// A mutation guarded by the request's `C` value, if it has one.
fn guarded(then: Guarded, compare_cas: Option<u64>) -> Mutation {
    match compare_cas {
        Some(unique) => Mutation::IfCas { unique, then },
        None => then.into(),
    }
}

/// `md`: with `C`, only an item with that cas is deleted (`EX` otherwise); with `I`, the
/// item is marked stale instead (and `T` sets its exptime).
pub(super) async fn delete<S: KvService>(ctx: &mut Ctx<'_, S>, md: MetaDelete) {
    Stats::incr(&ctx.stats().counters.cmd_meta);
    let (then, expiry) = if md.invalidate {
        let new_expiry = md.meta.ttl.is_some();
        (Guarded::Invalidate { new_expiry }, absolute_expiry(md.meta.ttl.unwrap_or(0), now()))
    } else {
        (Guarded::Delete, 0)
    };
    let update = bare_update(md.key.clone(), guarded(then, md.compare_cas), expiry);
    let Some(outcome) = ctx.update(update, false).await else {
        return;
    };
    if let Outcome::Invalidated { cas } = outcome {
        ctx.shared.access.carried(&md.key, cas);
    }
    let counters = &ctx.stats().counters;
    match outcome {
        Outcome::Deleted | Outcome::Invalidated { .. } => {
            Stats::incr(&counters.delete_hits);
            if !md.meta.quiet {
                header(ctx.out(), reply::META_HD, &md.meta, &md.key, None);
            }
        }
        Outcome::Exists => header(ctx.out(), reply::META_EX, &md.meta, &md.key, None),
        _ => {
            Stats::incr(&counters.delete_misses);
            header(ctx.out(), reply::META_NF, &md.meta, &md.key, None);
        }
    }
}

/// `ma`: incr/decr; with `N`, a miss creates the counter at `J` (then it is not incremented,
/// as memcached does).
pub(super) async fn arith<S: KvService>(ctx: &mut Ctx<'_, S>, ma: MetaArith) {
    Stats::incr(&ctx.stats().counters.cmd_meta);
    let result = match apply_arith(ctx, &ma).await {
        Ok(result) => result,
        Err(error) => return ctx.server_error(&error, false),
    };
    match result {
        ArithResult::Value { value, cas, expiry } => {
            if !ma.meta.quiet {
                counter_reply(ctx.out(), &ma, value, cas, expiry);
            }
        }
        ArithResult::Miss => header(ctx.out(), reply::META_NF, &ma.meta, &ma.key, None),
        ArithResult::Exists => header(ctx.out(), reply::META_EX, &ma.meta, &ma.key, None),
        ArithResult::NonNumeric => ctx.reply(reply::NON_NUMERIC),
    }
}

enum ArithResult {
    Value { value: u64, cas: u64, expiry: UnixSeconds },
    Miss,
    Exists,
    NonNumeric,
}

async fn apply_arith<S: KvService>(
    ctx: &mut Ctx<'_, S>,
    ma: &MetaArith,
) -> Result<ArithResult, ServiceError> {
    let incr = ma.mode == ArithMode::Incr;
    // Twice at most: a miss with `N` creates the counter with `add`; if another client created
    // it first, the second round applies the delta to theirs.
    for _ in 0..2 {
        match incr_once(ctx, ma, incr).await? {
            ArithResult::Miss => {}
            done => return Ok(done),
        }
        let Some(exptime) = ma.vivify else {
            return Ok(ArithResult::Miss);
        };
        if let Some(created) = vivify(ctx, ma, exptime).await? {
            return Ok(created);
        }
    }
    Ok(ArithResult::Miss)
}

async fn incr_once<S: KvService>(
    ctx: &mut Ctx<'_, S>,
    ma: &MetaArith,
    incr: bool,
) -> Result<ArithResult, ServiceError> {
    let then = if incr { Guarded::Incr { delta: ma.delta } } else { Guarded::Decr { delta: ma.delta } };
    let mutation = guarded(then, ma.compare_cas);
    let outcome = ctx.service().update(bare_update(ma.key.clone(), mutation, 0)).await?;
    let c = &ctx.stats().counters;
    let hit = matches!(outcome, Outcome::Counter { .. });
    Stats::incr(match (incr, hit) {
        (true, true) => &c.incr_hits,
        (true, false) => &c.incr_misses,
        (false, true) => &c.decr_hits,
        (false, false) => &c.decr_misses,
    });
    Ok(match outcome {
        Outcome::Counter { value, cas } => {
            // The outcome does not carry the expiry; read it only if the client asked (`t`).
            let expiry = if ma.ret_ttl { current_expiry(ctx, &ma.key).await? } else { 0 };
            ArithResult::Value { value, cas, expiry }
        }
        Outcome::NonNumeric => ArithResult::NonNumeric,
        Outcome::Exists => ArithResult::Exists,
        _ => ArithResult::Miss,
    })
}

async fn current_expiry<S: KvService>(ctx: &Ctx<'_, S>, key: &[u8]) -> Result<UnixSeconds, ServiceError> {
    let item = ctx.service().get(key).await?;
    Ok(item.filter(|item| !is_expired(item.expiry, now())).map_or(0, |item| item.expiry))
}

/// Creates a missing counter at its initial value; `None` if someone else created it first.
async fn vivify<S: KvService>(
    ctx: &mut Ctx<'_, S>,
    ma: &MetaArith,
    exptime: i32,
) -> Result<Option<ArithResult>, ServiceError> {
    let expiry = absolute_expiry(exptime, now());
    let update = Update {
        key: ma.key.clone(),
        mutation: Mutation::Add,
        value: ma.initial.to_string().into_bytes(),
        flags: 0,
        expiry,
    };
    Ok(match ctx.service().update(update).await? {
        Outcome::Stored { cas } => Some(ArithResult::Value { value: ma.initial, cas, expiry }),
        _ => None,
    })
}

fn counter_reply(out: &mut Vec<u8>, ma: &MetaArith, value: u64, cas: u64, expiry: UnixSeconds) {
    let text = value.to_string();
    let info = Info { cas, flags: 0, size: text.len(), expiry, marks: None };
    if ma.value {
        let code = format!("VA {}", text.len());
        header(out, code.as_bytes(), &ma.meta, &ma.key, Some(&info));
        out.extend_from_slice(text.as_bytes());
        out.extend_from_slice(b"\r\n");
    } else {
        header(out, reply::META_HD, &ma.meta, &ma.key, Some(&info));
    }
}

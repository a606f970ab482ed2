//! Parsed memcached requests.

use super::REALTIME_MAXDELTA_SECS;
use crate::op::UnixSeconds;

/// One memcached request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// `get`, `gets`, `gat`, `gats`.
    Get(GetCommand),
    /// `set`, `add`, `replace`, `append`, `prepend`, `cas`.
    Store(StoreCommand),
    /// `delete <key> [0] [noreply]`.
    Delete { key: Vec<u8>, noreply: bool },
    /// `incr`/`decr <key> <delta> [noreply]`.
    Arith { key: Vec<u8>, incr: bool, delta: u64, noreply: bool },
    /// `touch <key> <exptime> [noreply]`.
    Touch { key: Vec<u8>, exptime: i32, noreply: bool },
    /// `flush_all [delay] [noreply]`.
    FlushAll { delay: i32, noreply: bool },
    /// `version`.
    Version,
    /// `verbosity <level> [noreply]` (accepted and ignored, like a level change).
    Verbosity { noreply: bool },
    /// `stats [group]`.
    Stats { group: Option<Vec<u8>> },
    /// `refresh_certs [noreply]`: read the TLS certificate and key files again.
    RefreshCerts { noreply: bool },
    /// `quit`: close the connection without a reply.
    Quit,
    /// `mg`.
    MetaGet(MetaGet),
    /// `ms`.
    MetaSet(MetaSet),
    /// `md`.
    MetaDelete(MetaDelete),
    /// `ma`.
    MetaArith(MetaArith),
    /// `mn`: replies `MN`, marking the end of a pipeline of quiet meta requests.
    MetaNoop,
    /// `me <key>`: one line describing the item (`EN` on a miss).
    MetaDebug { key: Vec<u8> },
}

/// A retrieval: `get`/`gets` (`touch == None`) or `gat`/`gats` (`touch == Some(exptime)`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GetCommand {
    pub keys: Vec<Vec<u8>>,
    /// Return the cas unique (`gets`, `gats`).
    pub cas: bool,
    /// New exptime for `gat`/`gats`.
    pub touch: Option<i32>,
}

/// Which storage command.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetMode {
    Set,
    Add,
    Replace,
    Append,
    Prepend,
    /// `cas` with the client's unique.
    Cas(u64),
}

/// A storage request with its data block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreCommand {
    pub mode: SetMode,
    pub key: Vec<u8>,
    pub flags: u32,
    /// Raw exptime as sent; convert with [`absolute_expiry`].
    pub exptime: i32,
    pub value: Vec<u8>,
    pub noreply: bool,
}

/// Flags common to the meta commands, with the order the client gave them (return flags are
/// echoed in request order, as memcached does).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetaFlags {
    /// Flag letters in request order.
    pub order: Vec<u8>,
    /// `b`: the key was sent base64-encoded (it is decoded in `key`); return it encoded.
    pub base64: bool,
    /// `q`: suppress the common success/miss reply (see each command).
    pub quiet: bool,
    /// `O<token>`: opaque, echoed back.
    pub opaque: Option<Vec<u8>>,
    /// `k`: return the key.
    pub ret_key: bool,
    /// `c`: return the cas unique.
    pub ret_cas: bool,
    /// `T<ttl>`: new exptime.
    pub ttl: Option<i32>,
}

/// `mg <key> <flags>*` (flags v, c, f, h, k, l, s, t, O, q, b, T, N, R, u).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaGet {
    pub key: Vec<u8>,
    pub meta: MetaFlags,
    /// `v`: return the value.
    pub value: bool,
    /// `f`: return client flags.
    pub ret_flags: bool,
    /// `s`: return the value size.
    pub ret_size: bool,
    /// `t`: return the remaining ttl (-1 for none).
    pub ret_ttl: bool,
    /// `h`: return whether the item was fetched before (`h0`/`h1`).
    pub ret_hit: bool,
    /// `l`: return the seconds since the item was last accessed.
    pub ret_last_access: bool,
    /// `N<ttl>`: on a miss, create an empty item with this exptime and win (`W`).
    pub vivify: Option<i32>,
    /// `R<ttl>`: win (`W`) if the item's remaining ttl is below this many seconds.
    pub recache: Option<i32>,
}

/// `ms <key> <datalen> <flags>*` (flags b, c, C, F, I, k, O, q, T, M).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaSet {
    pub key: Vec<u8>,
    pub meta: MetaFlags,
    pub value: Vec<u8>,
    /// `F<flags>`.
    pub client_flags: u32,
    /// `C<cas>`: as memcached 1.6 reads it per mode: set and replace become a cas (`C0`
    /// included, which never matches), append and prepend go ahead only if a live item's
    /// cas matches (`C0` compares nothing), add ignores it.
    pub compare_cas: Option<u64>,
    /// `M<mode>`: E add, A append, P prepend, R replace, S set (default).
    pub mode: SetMode,
    /// `I`: with a compare value below the item's cas, store the value as stale.
    pub invalidate: bool,
}

/// `md <key> <flags>*` (flags b, C, I, k, O, q, T).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaDelete {
    pub key: Vec<u8>,
    pub meta: MetaFlags,
    /// `C<cas>`: delete only if the item's cas equals this (`C0` included, as memcached).
    pub compare_cas: Option<u64>,
    /// `I`: mark the item stale instead of deleting it (`T` then sets its exptime).
    pub invalidate: bool,
}

/// Direction of `ma`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArithMode {
    Incr,
    Decr,
}

/// `ma <key> <flags>*` (flags b, c, C, t, v, k, O, q, N, J, D, M).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaArith {
    pub key: Vec<u8>,
    pub meta: MetaFlags,
    /// `v`: return the new value.
    pub value: bool,
    /// `t`: return the remaining ttl.
    pub ret_ttl: bool,
    /// `C<cas>`: apply only if the item's cas equals this; `C0` is `None` (memcached
    /// compares only a non-zero value here).
    pub compare_cas: Option<u64>,
    /// `N<ttl>`: on a miss, create the item with `initial` and this exptime.
    pub vivify: Option<i32>,
    /// `J<n>`: initial value for `N` (default 0).
    pub initial: u64,
    /// `D<n>`: delta (default 1).
    pub delta: u64,
    /// `M<mode>`: I/+ incr (default), D/- decr.
    pub mode: ArithMode,
}

/// Converts a memcached exptime to an absolute expiry at `now` (the server's clock):
/// `0` = never; negative = already expired; up to 30 days = relative seconds; above = an
/// absolute Unix time (possibly in the past, hence expired).
pub fn absolute_expiry(exptime: i32, now: UnixSeconds) -> UnixSeconds {
    let exptime = i64::from(exptime);
    if exptime == 0 {
        0
    } else if exptime < 0 {
        // Any non-zero time in the past reads as expired; 1 is the smallest such.
        1
    } else if exptime > REALTIME_MAXDELTA_SECS {
        u32::try_from(exptime).unwrap_or(u32::MAX)
    } else {
        u32::try_from(i64::from(now) + exptime).unwrap_or(u32::MAX)
    }
}

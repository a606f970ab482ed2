//! Which records survive a maintenance copy: the survivor policy of compaction, split and
//! merge.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use crate::error::Error;
use crate::index::KeyHash;
use crate::record::Header;
use crate::shared::KeyFilter;
use crate::store::Inner;
use crate::types::RecordKind;

/// Which records of a source log are written to the new one.
#[derive(Clone)]
pub(crate) enum Keep {
    /// Compaction: drop out-of-filter keys, superseded puts, expired puts, superseded
    /// deletes and deletes at or below the watermark. `dropped`: the highest seq of a record
    /// dropped for its age or key (not because a later record of its key survives).
    Compact { watermark: u64, filter: Option<KeyFilter>, now: u32, dropped: Arc<AtomicU64> },
    /// Split / merge: the live put of each key in the filter, and its unsuperseded deletes.
    Carry { filter: Option<KeyFilter> },
}

impl Keep {
    /// Whether the record of `src` at `offset` goes into `dst`. A record dropped for its
    /// age (expired put, delete under the watermark) is still written when `dst` already
    /// holds a version of the key: a catch-up pass copied an older put before this record
    /// superseded it, and dropping this one would resurrect that put.
    pub(crate) fn wants(
        &self,
        src: &Inner,
        dst: &Inner,
        units: u32,
        header: &Header,
        key: &[u8],
    ) -> Result<bool, Error> {
        let keep = self.decide(src, dst, units, header, key)?;
        if let (Decision::DropTerminal, Keep::Compact { dropped, .. }) = (keep, self) {
            dropped.fetch_max(header.meta.seq, Ordering::AcqRel);
        }
        Ok(keep == Decision::Keep)
    }

    /// The highest seq a compaction with this policy dropped for age or key so far (0 for
    /// split and merge policies, which drop only superseded records and foreign keys).
    pub(crate) fn dropped_max(&self) -> u64 {
        match self {
            Keep::Compact { dropped, .. } => dropped.load(Ordering::Acquire),
            Keep::Carry { .. } => 0,
        }
    }

    pub(crate) fn decide(
        &self,
        src: &Inner,
        dst: &Inner,
        units: u32,
        header: &Header,
        key: &[u8],
    ) -> Result<Decision, Error> {
        let filter = match self {
            Keep::Compact { filter, .. } | Keep::Carry { filter } => filter,
        };
        if filter.as_ref().is_some_and(|f| !f(key)) {
            return Ok(Decision::DropTerminal);
        }
        let kh = KeyHash::of(key);
        let kept = |yes: bool| if yes { Decision::Keep } else { Decision::DropTerminal };
        match header.kind {
            RecordKind::Put => {
                if !src.is_live_at(kh, units) {
                    return Ok(Decision::DropSuperseded);
                }
                if let Keep::Compact { now, .. } = self {
                    let e = header.meta.expiry;
                    if e != 0 && e <= *now {
                        return Ok(kept(dst.find_existing(kh, key)?.is_some()));
                    }
                }
                Ok(Decision::Keep)
            }
            RecordKind::Delete => {
                // A live put of the key is later than this delete: the delete is superseded.
                if src.find_existing(kh, key)?.is_some() {
                    return Ok(Decision::DropSuperseded);
                }
                if let Keep::Compact { watermark, .. } = self {
                    if header.meta.seq <= *watermark {
                        return Ok(kept(dst.find_existing(kh, key)?.is_some()));
                    }
                }
                Ok(Decision::Keep)
            }
        }
    }
}

/// What `Keep` does with one record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Decision {
    Keep,
    /// A later record of the key survives (or is itself accounted for when dropped).
    DropSuperseded,
    /// Dropped for its age (expired put, delete under the watermark) or its key (filter):
    /// the key's latest state is no longer in the log.
    DropTerminal,
}

//! Maintenance (paper §3.3.2–3.3.3): split, merge, compact, and the automatic compactor.
//!
//! Each operation is a sequential scan of a log that writes the surviving records into a
//! new log while the store keeps serving. Because the log is append-only, the scan runs
//! until it reaches the end, repeats over what was appended meanwhile until only a small
//! tail is left, then takes the store's lock (writers wait; lookups continue on the old
//! log), copies that last tail, makes the new log durable and swaps it in atomically
//! (`rename` over `data.log`, then the in-memory state), and releases the lock.
//!
//! What survives: the live put of every key (the one the index points at) and delete
//! records not superseded by a later put. Compaction also drops keys outside the key
//! filter, expired puts, and delete records at or below the tombstone watermark.
//!
//! Crash safety: before the `rename` the old `data.log` is complete and authoritative
//! (`data.log.compact` is deleted at open); after it, the new log is complete and
//! fsynced. `max_seq` survives the loss of the record that held it through the `MAXSEQ`
//! file, written (atomically) before the rename whenever the new log would lack it.
//!
//! A compaction that drops a record for its age or key (a delete at or below the watermark,
//! an expired put, an out-of-filter key) rather than because a later record of the key
//! survives raises the `DROPSEQ` floor to that record's seq, written the same way before the
//! rename: every record above the floor that was its key's latest is still in the logs
//! (`DataStore::dropped_seq_max`; a replica re-syncing only a suffix relies on it).
//!
//! Layers, bottom-up: `keep` (the survivor policy) < `copier` (scan and append) < `build`
//! (the new state and its undo) < `swap` (catch-up, brief lock, commit, publish) <
//! `rewrite`, `hot` (the operations) < `auto` (the automatic compactor). The public methods
//! (`DataStore::compact`, `merge`, `split`, ...) are in `datastore`, above all of these.

pub(crate) mod auto;
pub(crate) mod build;
pub(crate) mod copier;
pub(crate) mod hot;
pub(crate) mod keep;
pub(crate) mod rewrite;
pub(crate) mod swap;

//! FAWN-DS: the per-node log-structured datastore of FAWN (SOSP 2009, §3.3).
//!
//! Every write is an append to one log file; every read is one positional read of that
//! log, located through a compact in-DRAM hash index (6-byte slots: 32-bit offset + 16-bit
//! tag holding a 13-bit key fragment, bucketized cuckoo hashing over linear hashing, growth a
//! bucket at a time, 6.4 B per key). Periodic checkpoints of
//! the index make restarts fast; the log alone can always rebuild it.
//!
//! Architecture Invariant: no networking, no async runtime. This crate is synchronous Rust
//! over `std::fs`; callers on an async runtime use `spawn_blocking`.
//!
//! Module map, bottom-up (a module imports only from the layers below it; no import cycle):
//! - leaves: [`limits`] (every size limit, relations checked at compile time), `error`,
//!   `fault` (fault injection), `report` (maintenance reports), `types` (options, metadata,
//!   stats), `files` (the directory's file names, fsync, lock and floor files).
//! - formats: `record` (the record codec), `log` (positional I/O, header, scanner), `index`
//!   (the hash index and its checkpoint image), `tags` (recent caller tags), `checkpoint` and
//!   `manifest` (pure encode / decode plus atomic replacement), `reclaim`, `iter`.
//! - `store`: `Inner`, one state of the engine (logs + index): reads, writes, growth,
//!   group commit, checkpoints.
//! - `shared`: what all handles share (the current `Inner`, maintenance settings, helper
//!   threads). `recovery`: open = checkpoint + replay, or rebuild from the log.
//! - `maint`: split/merge/compact machinery under live traffic (scan, catch up, brief lock,
//!   atomic swap), the `MAXSEQ`/`DROPSEQ` floors, the automatic compactor.
//! - `datastore`: the public `DataStore` on top; `fuzzing` (hidden): the decoders' fuzz
//!   entry points, beside it.
//!
//! File formats and media assumptions: `docs/FORMAT.md`.

mod checkpoint;
mod datastore;
mod error;
mod fault;
mod files;
#[doc(hidden)]
pub mod fuzzing;
mod index;
mod iter;
pub mod limits;
mod log;
mod maint;
mod manifest;
mod reclaim;
mod record;
mod recovery;
mod report;
mod shared;
mod store;
mod tags;
mod types;

pub use datastore::merge::MergeInProgress;
pub use datastore::split::SplitInProgress;
pub use datastore::DataStore;
pub use error::Error;
pub use fault::{FaultInjector, IoOp};
pub use files::{create_dir_durable, split_interrupted};
pub use iter::Iter;
pub use report::{LockPhases, MaintenanceKind, MaintenanceReport};
pub use shared::KeyFilter;
pub use store::BatchOp;
pub use types::{Entry, Meta, Options, Record, RecordKind, RecoveryReport, Stats, SyncPolicy};

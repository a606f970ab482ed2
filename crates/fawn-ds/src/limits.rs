//! Named limits of the engine and the relations between them (checked at compile time).

/// Largest key accepted by `store`/`delete` (memcached's limit).
pub const KEY_BYTES_MAX: usize = 250;

/// Largest value accepted by `store` (memcached's default item size limit).
pub const VALUE_BYTES_MAX: usize = 1 << 20;

/// Longest caller tag a record may carry (`BatchOp::with_tag`, record format 3), in bytes: a
/// request id and its outcome, written in the same record and so exactly as durable as it.
pub const TAG_BYTES_MAX: usize = 40;

/// Tags of the most recent tagged records a datastore keeps across a reopen
/// (`DataStore::recent_tags`, stored in the checkpoint): as many as FAWN-KV's request dedup
/// table holds (`DEDUP_ENTRIES_MAX`, checked there). Packed, 9 bytes plus the tag each, in
/// memory as in a checkpoint: 1.5 MB when full of 17-byte tags, at most 2.8 MB.
pub const RECENT_TAGS_MAX: usize = 57_344;

/// Records start on multiples of this many bytes, so the index stores offsets in these units.
pub const OFFSET_UNIT: u64 = 16;

/// Width of the offset field of an index slot, in bits.
pub const OFFSET_BITS: u32 = 32;

/// Bits of that field holding the offset within one log: the top bit says which log (hot
/// `data.log` or cold `data.cold`, see `COLD_UNITS_BIT`).
pub const LOG_OFFSET_BITS: u32 = OFFSET_BITS - 1;

/// Set in an index slot's offset (in units) when the record is in the cold log.
pub const COLD_UNITS_BIT: u32 = 1 << LOG_OFFSET_BITS;

/// Largest size of one log file (hot or cold): the index addresses `2^31` units of 16 bytes
/// in each. An append that would end beyond it fails with `Error::StoreFull`.
pub const DATASTORE_BYTES_MAX: u64 = (1u64 << LOG_OFFSET_BITS) * OFFSET_UNIT;

/// Bytes of the fixed log file header (a whole number of offset units).
pub const LOG_HEADER_BYTES: u64 = 32;

/// Bytes of the fixed record header.
pub const RECORD_HEADER_BYTES: usize = 32;

/// Largest record on disk: header + max key + max value, padded.
pub const RECORD_BYTES_MAX: usize =
    pad_to_unit(RECORD_HEADER_BYTES + KEY_BYTES_MAX + VALUE_BYTES_MAX + TAG_BYTES_MAX);

/// Index slots per bucket (set associativity).
pub const SLOTS_PER_BUCKET: usize = 8;

/// Bytes of DRAM per index slot: 32-bit offset (in units) + 16-bit tag (key fragment and
/// the hash bits the next bucket splits need).
pub const SLOT_BYTES: usize = 6;

/// Bits of the key fragment in a slot's tag (the other 3 carry growth state, see
/// `index.rs`). A lookup compares it against up to 8 slots: ~1 in 1,000 lookups of an
/// absent key reads one record for nothing at full load.
pub const INDEX_FRAGMENT_BITS: u32 = 13;

/// Load factor an index is sized for (`expected_keys`, rebuilds): 6 B / 0.935 = 6.42 B/key;
/// a short estimate only splits a few buckets more.
pub const INDEX_SIZING_LOAD: f64 = 0.935;

/// Load factor above which the index splits a bucket (grows by one bucket): the load a
/// growing index stays at, 6 B / 0.94 = 6.38 B per key (at 0.95, 6.32 B, inserts did ~1.5x
/// more displacement work: the buckets a level has not split yet are nearly all full).
pub const INDEX_LOAD_MAX: f64 = 0.94;

/// Pause of one write while garbage is past `Options::stall_garbage_ratio` (microseconds):
/// bounds a single writer to ~2,000 writes/s until compaction has caught up.
pub const GARBAGE_STALL_US: u64 = 500;

/// Round `n` up to a multiple of `OFFSET_UNIT`.
pub const fn pad_to_unit(n: usize) -> usize {
    let u = OFFSET_UNIT as usize;
    n.div_ceil(u) * u
}

// Relations the code relies on.
const _: () = assert!(OFFSET_UNIT.is_power_of_two());
const _: () = assert!(LOG_HEADER_BYTES.is_multiple_of(OFFSET_UNIT));
// Offset 0 is the log header, never a record: an index slot with offset 0 means "empty".
const _: () = assert!(LOG_HEADER_BYTES >= OFFSET_UNIT);
const _: () = assert!((RECORD_HEADER_BYTES as u64).is_multiple_of(OFFSET_UNIT));
// Key length is stored in a u16, value length in a u32.
const _: () = assert!(KEY_BYTES_MAX <= u16::MAX as usize);
// Record format 2 keeps the key length in one byte (the other holds the item state).
const _: () = assert!(KEY_BYTES_MAX <= u8::MAX as usize);
const _: () = assert!(VALUE_BYTES_MAX <= u32::MAX as usize);
// Record format 3 keeps the value length in three bytes and the tag length in the fourth.
const _: () = assert!(VALUE_BYTES_MAX < 1 << 24);
const _: () = assert!(TAG_BYTES_MAX <= u8::MAX as usize);
// A maximal record fits far inside the addressable log.
const _: () = assert!((RECORD_BYTES_MAX as u64) < DATASTORE_BYTES_MAX / 1024);
const _: () = assert!(SLOT_BYTES * 8 == OFFSET_BITS as usize + 16);
// The log-select bit and the in-log offset share the slot's offset field exactly; every
// in-log offset (in units) stays below the bit.
const _: () = assert!(LOG_OFFSET_BITS + 1 == OFFSET_BITS);
const _: () = assert!(DATASTORE_BYTES_MAX / OFFSET_UNIT <= COLD_UNITS_BIT as u64);
const _: () = assert!(INDEX_SIZING_LOAD < INDEX_LOAD_MAX && INDEX_LOAD_MAX < 1.0);

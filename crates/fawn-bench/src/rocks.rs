//! RocksDB as an embedded peer of FAWN-DS (feature `rocksdb`): same keys, values and threads.

use std::path::Path;

use anyhow::{Context, Result};
use fawn_ds::SyncPolicy;

/// A RocksDB instance configured the way a careful user would for point lookups.
pub struct Rocks {
    db: rocksdb::DB,
    write: rocksdb::WriteOptions,
}

impl Rocks {
    /// Create a database at `path`. `SyncPolicy::Always` maps to synced writes; the other
    /// policies to RocksDB's default (WAL written, not synced).
    pub fn open(path: &Path, sync: SyncPolicy) -> Result<Rocks> {
        let mut opts = rocksdb::Options::default();
        opts.create_if_missing(true);
        opts.increase_parallelism(2);
        // Bloom filters: the standard configuration for point lookups.
        let mut table = rocksdb::BlockBasedOptions::default();
        table.set_bloom_filter(10.0, false);
        opts.set_block_based_table_factory(&table);
        let db = rocksdb::DB::open(&opts, path)
            .with_context(|| format!("opening RocksDB at {}", path.display()))?;
        let mut write = rocksdb::WriteOptions::default();
        write.set_sync(sync == SyncPolicy::Always);
        Ok(Rocks { db, write })
    }

    pub fn put(&self, key: &[u8], value: &[u8]) -> Result<()> {
        self.db.put_opt(key, value, &self.write).context("RocksDB put")
    }

    /// Flush and compact after the load, so lookups see RocksDB at its best (one sorted level).
    pub fn finish_load(&self) -> Result<()> {
        self.db.flush().context("RocksDB flush")?;
        self.db.compact_range::<&[u8], &[u8]>(None, None);
        Ok(())
    }

    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>> {
        self.db.get(key).context("RocksDB get")
    }
}

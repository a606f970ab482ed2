//! The Raft log and vote of one manager replica, on disk. The log is one append-only file of
//! checksummed records (an append, or a truncation of a conflicting suffix), fsynced before
//! openraft is told the entries are stored; purging behind a snapshot rewrites the file with
//! what is kept. A torn record at the end (a crash mid-append) is cut off at open: it was
//! never acknowledged. The vote is a small file replaced atomically.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::fs::{File, OpenOptions};
use std::io::{Read, Write};
use std::ops::RangeBounds;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bincode::Options;
use openraft::storage::{LogFlushed, LogState, RaftLogReader, RaftLogStorage};
use openraft::{Entry, LogId, OptionalSend, StorageError, StorageIOError, Vote};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};

use super::files;
use super::TypeConfig;

const LOG_FILE: &str = "raft-log";
const VOTE_FILE: &str = "raft-vote.json";
/// Largest log record accepted when reading the file back (a configuration is far smaller).
const RECORD_BYTES_MAX: usize = 64 << 20;

/// One record of the log file.
#[derive(Serialize, Deserialize)]
enum Record {
    /// Everything up to this log id was purged (first record of a rewritten file).
    Purged(LogId<u64>),
    Append(Entry<TypeConfig>),
    /// Entries from this index on were removed.
    TruncateFrom(u64),
}

fn codec() -> impl bincode::Options {
    bincode::DefaultOptions::new().with_limit(RECORD_BYTES_MAX as u64)
}

/// The log store; clones share it (openraft reads through a clone while appending).
#[derive(Clone)]
pub struct LogStore {
    inner: Arc<Mutex<Inner>>,
}

struct Inner {
    dir: PathBuf,
    file: File,
    entries: BTreeMap<u64, Entry<TypeConfig>>,
    purged: Option<LogId<u64>>,
    vote: Option<Vote<u64>>,
}

fn frame(record: &Record, out: &mut Vec<u8>) -> std::io::Result<()> {
    let body = codec().serialize(record).map_err(std::io::Error::other)?;
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
    out.extend_from_slice(&body);
    Ok(())
}

/// The records of `bytes` up to the first torn or corrupt one, and the length they cover. A
/// record whose checksum holds but which does not decode was written whole by another version
/// of the format: an error, since cutting it off would drop committed entries.
fn parse(bytes: &[u8]) -> std::io::Result<(Vec<Record>, usize)> {
    let (mut records, mut at) = (Vec::new(), 0);
    while bytes.len() - at >= 8 {
        let len = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap_or_default()) as usize;
        let crc = u32::from_le_bytes(bytes[at + 4..at + 8].try_into().unwrap_or_default());
        let Some(body) = bytes.get(at + 8..at + 8 + len) else { break };
        if len > RECORD_BYTES_MAX || crc32c::crc32c(body) != crc {
            break;
        }
        let record = codec().deserialize::<Record>(body).map_err(|e| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("Raft log record at byte {at} is whole but does not decode ({e}): written by another version?"),
            )
        })?;
        records.push(record);
        at += 8 + len;
    }
    Ok((records, at))
}

impl LogStore {
    /// Opens (or creates) the log in `dir`.
    pub fn open(dir: &Path) -> std::io::Result<LogStore> {
        let path = dir.join(LOG_FILE);
        let mut file = OpenOptions::new().create(true).truncate(false).read(true).append(true).open(&path)?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        let (records, good) = parse(&bytes)?;
        if good < bytes.len() {
            tracing::warn!(dropped_bytes = bytes.len() - good, "cutting a torn record off the Raft log");
            file.set_len(good as u64)?;
            file.sync_all()?;
        }
        let (mut entries, mut purged) = (BTreeMap::new(), None);
        for record in records {
            match record {
                Record::Purged(id) => {
                    entries.retain(|i, _| *i > id.index);
                    purged = Some(id);
                }
                Record::Append(e) => {
                    entries.insert(e.log_id.index, e);
                }
                Record::TruncateFrom(i) => {
                    entries.split_off(&i);
                }
            }
        }
        let vote = match files::read(dir, VOTE_FILE)? {
            Some(b) => Some(serde_json::from_slice(&b).map_err(std::io::Error::other)?),
            None => None,
        };
        let inner = Inner { dir: dir.to_path_buf(), file, entries, purged, vote };
        Ok(LogStore { inner: Arc::new(Mutex::new(inner)) })
    }

    /// True if this replica never stored a log entry or a vote.
    pub fn is_empty(&self) -> bool {
        let i = self.inner.lock();
        i.entries.is_empty() && i.purged.is_none() && i.vote.is_none()
    }
}

impl Inner {
    fn write(&mut self, records: &[Record]) -> std::io::Result<()> {
        let mut out = Vec::new();
        for r in records {
            frame(r, &mut out)?;
        }
        self.file.write_all(&out)?;
        self.file.sync_data()
    }

    /// Rewrites the file with only what is kept (after a purge).
    fn rewrite(&mut self) -> std::io::Result<()> {
        let mut out = Vec::new();
        if let Some(p) = self.purged {
            frame(&Record::Purged(p), &mut out)?;
        }
        for e in self.entries.values() {
            frame(&Record::Append(e.clone()), &mut out)?;
        }
        files::replace(&self.dir, LOG_FILE, &out)?;
        self.file = OpenOptions::new().append(true).open(self.dir.join(LOG_FILE))?;
        Ok(())
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry<TypeConfig>>, StorageError<u64>> {
        Ok(self.inner.lock().entries.range(range).map(|(_, e)| e.clone()).collect())
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = LogStore;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError<u64>> {
        let i = self.inner.lock();
        let last = i.entries.values().next_back().map(|e| e.log_id).or(i.purged);
        Ok(LogState { last_purged_log_id: i.purged, last_log_id: last })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<u64>) -> Result<(), StorageError<u64>> {
        let mut i = self.inner.lock();
        let bytes = serde_json::to_vec(vote).map_err(|e| StorageIOError::write_vote(&e))?;
        files::replace(&i.dir, VOTE_FILE, &bytes).map_err(|e| StorageIOError::write_vote(&e))?;
        i.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<u64>>, StorageError<u64>> {
        Ok(self.inner.lock().vote)
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry<TypeConfig>> = entries.into_iter().collect();
        let records: Vec<Record> = entries.iter().cloned().map(Record::Append).collect();
        let mut i = self.inner.lock();
        let written = i.write(&records);
        if written.is_ok() {
            for e in entries {
                i.entries.insert(e.log_id.index, e);
            }
        }
        let failed = written.as_ref().err().map(StorageIOError::write_logs);
        callback.log_io_completed(written);
        match failed {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    async fn truncate(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        let mut i = self.inner.lock();
        i.write(&[Record::TruncateFrom(log_id.index)]).map_err(|e| StorageIOError::write_logs(&e))?;
        i.entries.split_off(&log_id.index);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId<u64>) -> Result<(), StorageError<u64>> {
        let mut i = self.inner.lock();
        i.entries.retain(|idx, _| *idx > log_id.index);
        i.purged = Some(log_id);
        i.rewrite().map_err(|e| StorageIOError::write_logs(&e))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;

    fn entry(index: u64) -> Entry<TypeConfig> {
        Entry { log_id: LogId::new(CommittedLeaderId::new(1, 1), index), payload: EntryPayload::Blank }
    }

    fn write_file(dir: &Path, records: &[Record], tail: &[u8]) {
        let mut out = Vec::new();
        for r in records {
            frame(r, &mut out).expect("frame");
        }
        out.extend_from_slice(tail);
        std::fs::write(dir.join(LOG_FILE), out).expect("write log");
    }

    fn indexes(store: &LogStore) -> Vec<u64> {
        store.inner.lock().entries.keys().copied().collect()
    }

    /// A record torn by a crash mid-append is cut off at open; everything before it is kept.
    #[test]
    fn a_torn_tail_is_cut_off() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut torn = Vec::new();
        frame(&Record::Append(entry(3)), &mut torn).expect("frame");
        torn.truncate(torn.len() - 2);
        write_file(dir.path(), &[Record::Append(entry(1)), Record::Append(entry(2))], &torn);
        let store = LogStore::open(dir.path()).expect("open");
        assert_eq!(indexes(&store), vec![1, 2]);
        drop(store);
        let (_, good) = parse(&std::fs::read(dir.path().join(LOG_FILE)).expect("read")).expect("parse");
        assert_eq!(good as u64, std::fs::metadata(dir.path().join(LOG_FILE)).expect("meta").len());
    }

    /// Truncations and purges replay in order.
    #[test]
    fn truncate_and_purge_records_replay() {
        let dir = tempfile::tempdir().expect("tempdir");
        let records = [
            Record::Purged(entry(1).log_id),
            Record::Append(entry(2)),
            Record::Append(entry(3)),
            Record::Append(entry(4)),
            Record::TruncateFrom(3),
            Record::Append(entry(3)),
        ];
        write_file(dir.path(), &records, &[]);
        let store = LogStore::open(dir.path()).expect("open");
        assert_eq!(indexes(&store), vec![2, 3]);
        assert_eq!(store.inner.lock().purged.map(|p| p.index), Some(1));
        assert!(!store.is_empty());
    }

    /// A corrupt record (bad checksum) ends what is read, like a torn one.
    #[test]
    fn a_corrupt_record_ends_the_log() {
        let dir = tempfile::tempdir().expect("tempdir");
        write_file(dir.path(), &[Record::Append(entry(1)), Record::Append(entry(2))], &[]);
        let path = dir.path().join(LOG_FILE);
        let mut bytes = std::fs::read(&path).expect("read");
        let last = bytes.len() - 1;
        bytes[last] ^= 0xFF;
        std::fs::write(&path, bytes).expect("write");
        assert_eq!(indexes(&LogStore::open(dir.path()).expect("open")), vec![1]);
    }

    /// A whole record that does not decode (another format version) is refused, not cut off.
    #[test]
    fn a_whole_record_of_another_format_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let body = [0xFFu8; 5];
        let mut alien = Vec::new();
        alien.extend_from_slice(&(body.len() as u32).to_le_bytes());
        alien.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        alien.extend_from_slice(&body);
        write_file(dir.path(), &[Record::Append(entry(1))], &alien);
        let err = LogStore::open(dir.path()).err().expect("refused");
        assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
        let len = std::fs::metadata(dir.path().join(LOG_FILE)).expect("meta").len() as usize;
        assert!(len > alien.len(), "nothing was cut");
    }
}

//! The manager group's state machine: the cluster configuration, changed only by applying
//! committed log entries (`command::apply`). Snapshots hold the configuration and are kept
//! in one file, replaced atomically with fsync; at open the state machine starts from it, so
//! a replica replays only the log after it. Each applied change is published to the
//! manager's tasks (answers, pushes, the failure detector).

use std::io::Cursor;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fawn_proto::native::ClusterConfig;
use openraft::storage::{RaftSnapshotBuilder, RaftStateMachine, Snapshot};
use openraft::{
    BasicNode, Entry, EntryPayload, LogId, OptionalSend, SnapshotMeta, StorageError, StorageIOError,
    StoredMembership,
};
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::files;
use super::TypeConfig;
use crate::manager::command::{self, Applied};

const SNAPSHOT_FILE: &str = "raft-snapshot.json";

/// What a snapshot holds besides its metadata.
#[derive(Clone, Default, Serialize, Deserialize)]
struct Data {
    config: Option<ClusterConfig>,
}

/// A snapshot as kept on disk.
#[derive(Serialize, Deserialize)]
struct Stored {
    meta: SnapshotMeta<u64, BasicNode>,
    data: Data,
}

struct Inner {
    dir: PathBuf,
    applied: Option<LogId<u64>>,
    membership: StoredMembership<u64, BasicNode>,
    data: Data,
    snapshot: Option<Stored>,
    snapshots_taken: u64,
}

/// The state machine; clones share it (the snapshot builder is a clone).
#[derive(Clone)]
pub struct StateMachine {
    inner: Arc<Mutex<Inner>>,
    published: Arc<watch::Sender<Option<ClusterConfig>>>,
}

/// The applied configuration as the manager's tasks see it.
#[derive(Clone)]
pub struct Published {
    config: watch::Receiver<Option<ClusterConfig>>,
    had_snapshot: bool,
}

impl Published {
    /// The configuration of the latest applied entry; `None` before the group's first.
    pub fn current(&self) -> Option<ClusterConfig> {
        self.config.borrow().clone()
    }

    /// A receiver woken on every change.
    pub fn subscribe(&self) -> watch::Receiver<Option<ClusterConfig>> {
        self.config.clone()
    }

    /// True if the replica started from a snapshot on disk.
    pub fn has_snapshot(&self) -> bool {
        self.had_snapshot
    }
}

fn io_error(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(e.to_string())
}

impl StateMachine {
    /// Opens the state machine in `dir`, starting from its snapshot if there is one.
    pub fn open(dir: &Path) -> std::io::Result<(StateMachine, Published)> {
        let snapshot: Option<Stored> = match files::read(dir, SNAPSHOT_FILE)? {
            Some(b) => Some(serde_json::from_slice(&b).map_err(io_error)?),
            None => None,
        };
        let (applied, membership, data) = match &snapshot {
            Some(s) => (s.meta.last_log_id, s.meta.last_membership.clone(), s.data.clone()),
            None => (None, StoredMembership::default(), Data::default()),
        };
        let (tx, rx) = watch::channel(data.config.clone());
        let published = Published { config: rx, had_snapshot: snapshot.is_some() };
        let inner = Inner { dir: dir.to_path_buf(), applied, membership, data, snapshot, snapshots_taken: 0 };
        Ok((StateMachine { inner: Arc::new(Mutex::new(inner)), published: Arc::new(tx) }, published))
    }

    fn publish(&self, config: Option<ClusterConfig>) {
        self.published.send_if_modified(|current| {
            let changed = *current != config;
            *current = config;
            changed
        });
    }
}

impl Inner {
    /// Persists `stored` as the current snapshot.
    fn keep(&mut self, stored: Stored) -> std::io::Result<()> {
        let bytes = serde_json::to_vec(&stored).map_err(io_error)?;
        files::replace(&self.dir, SNAPSHOT_FILE, &bytes)?;
        self.snapshot = Some(stored);
        Ok(())
    }
}

fn to_snapshot(stored: &Stored) -> Result<Snapshot<TypeConfig>, StorageError<u64>> {
    let bytes = serde_json::to_vec(&stored.data)
        .map_err(|e| StorageIOError::read_snapshot(Some(stored.meta.signature()), &e))?;
    Ok(Snapshot { meta: stored.meta.clone(), snapshot: Box::new(Cursor::new(bytes)) })
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError<u64>> {
        let mut i = self.inner.lock();
        i.snapshots_taken += 1;
        let snapshot_id = match i.applied {
            Some(id) => format!("{}-{}-{}", id.leader_id, id.index, i.snapshots_taken),
            None => format!("none-{}", i.snapshots_taken),
        };
        let meta =
            SnapshotMeta { last_log_id: i.applied, last_membership: i.membership.clone(), snapshot_id };
        let stored = Stored { meta, data: i.data.clone() };
        let snapshot = to_snapshot(&stored)?;
        i.keep(stored).map_err(|e| StorageIOError::write_snapshot(Some(snapshot.meta.signature()), &e))?;
        Ok(snapshot)
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(
        &mut self,
    ) -> Result<(Option<LogId<u64>>, StoredMembership<u64, BasicNode>), StorageError<u64>> {
        let i = self.inner.lock();
        Ok((i.applied, i.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Applied>, StorageError<u64>>
    where
        I: IntoIterator<Item = Entry<TypeConfig>> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut out = Vec::new();
        let config = {
            let mut i = self.inner.lock();
            for entry in entries {
                i.applied = Some(entry.log_id);
                out.push(match entry.payload {
                    EntryPayload::Blank => Applied::Group,
                    EntryPayload::Normal(cmd) => command::apply(&mut i.data.config, &cmd),
                    EntryPayload::Membership(m) => {
                        i.membership = StoredMembership::new(Some(entry.log_id), m);
                        Applied::Group
                    }
                });
            }
            i.data.config.clone()
        };
        self.publish(config);
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError<u64>> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta<u64, BasicNode>,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError<u64>> {
        let data: Data = serde_json::from_slice(snapshot.get_ref())
            .map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?;
        let config = data.config.clone();
        {
            let mut i = self.inner.lock();
            i.keep(Stored { meta: meta.clone(), data: data.clone() })
                .map_err(|e| StorageIOError::write_snapshot(Some(meta.signature()), &e))?;
            i.applied = meta.last_log_id;
            i.membership = meta.last_membership.clone();
            i.data = data;
        }
        self.publish(config);
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError<u64>> {
        let i = self.inner.lock();
        i.snapshot.as_ref().map(to_snapshot).transpose()
    }
}

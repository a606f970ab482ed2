//! The typed errors of the engine.

/// Everything that can go wrong in a datastore operation.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Keys must be at least one byte long.
    #[error("key is empty")]
    EmptyKey,
    /// The key is longer than the configured maximum; nothing was written.
    #[error("key is {len} bytes, the maximum is {max}")]
    KeyTooLarge { len: usize, max: usize },
    /// The value is longer than the configured maximum; nothing was written.
    #[error("value is {len} bytes, the maximum is {max}")]
    ValueTooLarge { len: usize, max: usize },
    /// The file system is full (ENOSPC). The failed record was removed again; the store
    /// stays usable and everything stored before is intact.
    #[error("no space left on device")]
    NoSpace,
    /// Any other I/O failure.
    #[error("I/O error while {context}: {source}")]
    Io {
        context: &'static str,
        #[source]
        source: std::io::Error,
    },
    /// Bytes on disk failed a check (checksum, magic, version, length).
    #[error("corrupt data at offset {offset}: {reason}")]
    Corrupt { offset: u64, reason: String },
    /// A previous write or fsync failed, so the durable state is unknown: writes are
    /// refused until the store is reopened (which recovers from what is on disk). Reads work.
    #[error("store is poisoned by an earlier failed write or fsync; writes are refused until reopen")]
    Poisoned,
    /// The log reached `limits::DATASTORE_BYTES_MAX` (the index offset width).
    #[error("datastore is full: the log would exceed {} bytes", crate::limits::DATASTORE_BYTES_MAX)]
    StoreFull,
    /// Another `DataStore` (in this or another process) has the directory open.
    #[error("datastore directory is locked by another open store")]
    Locked,
    /// A maintenance request that cannot be carried out as asked (e.g. a split target that
    /// already exists, a store merged into itself). Nothing was changed.
    #[error("invalid maintenance request: {0}")]
    InvalidRequest(String),
    /// Maintenance stopped because the store is closing; the old state stands.
    #[error("maintenance cancelled: the store is closing")]
    Cancelled,
}

impl Error {
    /// Wrap an `io::Error`, mapping ENOSPC to `Error::NoSpace`.
    pub(crate) fn io(context: &'static str, source: std::io::Error) -> Error {
        if source.raw_os_error() == Some(libc::ENOSPC) {
            Error::NoSpace
        } else {
            Error::Io { context, source }
        }
    }

    pub(crate) fn corrupt(offset: u64, reason: impl Into<String>) -> Error {
        Error::Corrupt { offset, reason: reason.into() }
    }
}

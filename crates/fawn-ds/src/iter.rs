//! Iteration over the log in order.

use std::sync::Arc;

use crate::error::Error;
use crate::limits::LOG_HEADER_BYTES;
use crate::log::{LogFile, Scanner};
use crate::record;
use crate::types::Record;

/// Records in log order, from a start offset to the log end at creation time. Holds its
/// own handle on the log file, so concurrent writes (and even closing the store) are fine.
/// Stops after the first error.
pub struct Iter {
    scanner: Scanner,
    /// Logs still to read after the current one (cold log first, then hot).
    rest: std::collections::VecDeque<(Arc<LogFile>, u64, u64)>,
    pending_error: Option<Error>,
    done: bool,
}

impl Iter {
    pub(crate) fn new(log: Arc<LogFile>, offset: u64, end: u64) -> Iter {
        let pending_error = if offset < LOG_HEADER_BYTES || offset > end {
            Some(Error::corrupt(
                offset,
                format!("iteration start outside the log [{LOG_HEADER_BYTES}, {end}]"),
            ))
        } else {
            None
        };
        Iter { scanner: Scanner::new(log, offset, end), rest: Default::default(), pending_error, done: false }
    }

    /// The records of several logs, one after the other (each `(log, from, end)`).
    pub(crate) fn chain(first: (Arc<LogFile>, u64, u64), then: Vec<(Arc<LogFile>, u64, u64)>) -> Iter {
        let mut it = Iter::new(first.0, first.1, first.2);
        it.rest = then.into();
        it
    }
}

impl Iterator for Iter {
    type Item = Result<Record, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        if let Some(e) = self.pending_error.take() {
            self.done = true;
            return Some(Err(e));
        }
        match self.scanner.next_record() {
            Ok(Some((offset, header, bytes))) => Some(Ok(Record {
                kind: header.kind,
                key: record::key_of(bytes, &header).to_vec(),
                value: record::value_of(bytes, &header).to_vec(),
                tag: record::tag_of(bytes, &header).to_vec(),
                meta: header.meta,
                offset,
            })),
            Ok(None) => match self.rest.pop_front() {
                Some((log, from, end)) => {
                    self.scanner = Scanner::new(log, from, end);
                    self.next()
                }
                None => {
                    self.done = true;
                    None
                }
            },
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

impl std::fmt::Debug for Iter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Iter").field("pos", &self.scanner.pos).finish()
    }
}

//! Fault injection for tests: a hook called before every log append and fsync. A leaf.

use std::io;
use std::sync::Arc;

/// An I/O operation a `FaultInjector` may fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoOp {
    /// Appending a record to the log.
    Write,
    /// `fdatasync` of the log.
    Sync,
}

type FaultFn = dyn Fn(IoOp) -> Option<io::Error> + Send + Sync;

/// Test hook: called before every log append and fsync; returning an error makes that
/// operation fail as if the device had. Costs one branch on the hot path when unset.
#[derive(Clone, Default)]
pub struct FaultInjector(Option<Arc<FaultFn>>);

impl FaultInjector {
    /// A hook that fails an operation whenever `f` returns `Some(error)`.
    pub fn new(f: impl Fn(IoOp) -> Option<io::Error> + Send + Sync + 'static) -> FaultInjector {
        FaultInjector(Some(Arc::new(f)))
    }

    pub(crate) fn check(&self, op: IoOp) -> io::Result<()> {
        match self.0.as_ref().and_then(|f| f(op)) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl std::fmt::Debug for FaultInjector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "FaultInjector(set)" } else { "FaultInjector(none)" })
    }
}

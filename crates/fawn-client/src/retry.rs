//! The one retry policy for requests routed by a cluster configuration: the Rust client and the
//! front-end both follow it, so a client sees the same behaviour through either.
//!
//! It is sans-I/O: the caller makes an attempt, tells [`Retry::after`] how it went and the epoch
//! of the configuration it routed by, and gets back whether to stop, retry at once, or wait first.
//! Before every retry the caller refreshes its configuration.
//!
//! The rules:
//! - an answer, or a refusal that another attempt cannot change, stops the loop;
//! - a refusal that only says "a newer configuration exists" than the one routed by is fixed by
//!   fetching it, so the retry goes at once (a join or a repair bumps the epoch several times);
//! - other retryable refusals and unreachable peers wait, doubling from `backoff_start` up to
//!   `backoff_max`;
//! - after `attempts_max` attempts the loop stops with the last error.
//!
//! Retrying an update is safe because it carries the same request id, so the head applies it
//! once.

use std::time::Duration;

use fawn_proto::native::WireError;

/// How often and how patiently to retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included.
    pub attempts_max: u32,
    /// The wait before the first retry that waits.
    pub backoff_start: Duration,
    /// The longest wait between two attempts.
    pub backoff_max: Duration,
}

impl RetryPolicy {
    /// Enough attempts to ride out a failure detection and a chain repair (a few seconds) with
    /// the backoff capped at one second.
    pub const DEFAULT: RetryPolicy = RetryPolicy {
        attempts_max: 9,
        backoff_start: Duration::from_millis(20),
        backoff_max: Duration::from_secs(1),
    };
}

const _: () = assert!(RetryPolicy::DEFAULT.attempts_max >= 2);
const _: () =
    assert!(RetryPolicy::DEFAULT.backoff_start.as_nanos() <= RetryPolicy::DEFAULT.backoff_max.as_nanos());

impl Default for RetryPolicy {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// How one attempt went.
#[derive(Clone, Copy, Debug)]
pub enum Attempt<'a> {
    /// The peer answered (anything but a refusal).
    Answered,
    /// The peer refused with this error.
    Refused(&'a WireError),
    /// No answer: connection refused or broken, or the request timed out.
    Unreachable,
}

/// What to do next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// Return the attempt's result to the caller.
    Stop,
    /// Refresh the configuration and retry without waiting.
    RetryNow,
    /// Wait this long, refresh the configuration and retry.
    RetryAfter(Duration),
}

/// The state of one request's retry loop.
#[derive(Clone, Debug)]
pub struct Retry {
    policy: RetryPolicy,
    attempts: u32,
    backoff: Duration,
}

impl Retry {
    pub fn new(policy: RetryPolicy) -> Self {
        Self { policy, attempts: 0, backoff: policy.backoff_start }
    }

    /// Attempts made so far.
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Records one attempt, routed by the configuration of epoch `routed_by`, and decides the next
    /// step.
    pub fn after(&mut self, attempt: Attempt<'_>, routed_by: u64) -> Next {
        self.attempts += 1;
        let retryable = match attempt {
            Attempt::Answered => return Next::Stop,
            Attempt::Refused(error) => is_retryable(error),
            Attempt::Unreachable => true,
        };
        if !retryable || self.attempts >= self.policy.attempts_max {
            return Next::Stop;
        }
        if let Attempt::Refused(WireError::StaleEpoch { current }) = attempt {
            if *current > routed_by {
                return Next::RetryNow;
            }
        }
        let wait = self.backoff;
        self.backoff = (self.backoff * 2).min(self.policy.backoff_max);
        Next::RetryAfter(wait)
    }
}

/// Errors after which the same request may succeed.
pub fn is_retryable(e: &WireError) -> bool {
    matches!(
        e,
        WireError::StaleEpoch { .. }
            | WireError::Unavailable(_)
            | WireError::Timeout
            | WireError::WrongNode(_)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: RetryPolicy = RetryPolicy {
        attempts_max: 5,
        backoff_start: Duration::from_millis(10),
        backoff_max: Duration::from_millis(25),
    };

    #[test]
    fn an_answer_or_a_final_refusal_stops_at_once() {
        assert_eq!(Retry::new(POLICY).after(Attempt::Answered, 1), Next::Stop);
        let refused = WireError::Unavailable("x".into());
        assert_ne!(Retry::new(POLICY).after(Attempt::Refused(&refused), 1), Next::Stop);
        let final_error = WireError::TooLarge;
        assert_eq!(Retry::new(POLICY).after(Attempt::Refused(&final_error), 1), Next::Stop);
    }

    #[test]
    fn backoff_doubles_up_to_the_cap_and_attempts_are_bounded() {
        let mut retry = Retry::new(POLICY);
        let waits: Vec<Next> = (0..5).map(|_| retry.after(Attempt::Unreachable, 1)).collect();
        let ms = |n| Next::RetryAfter(Duration::from_millis(n));
        assert_eq!(waits, vec![ms(10), ms(20), ms(25), ms(25), Next::Stop]);
        assert_eq!(retry.attempts(), 5);
    }

    #[test]
    fn a_newer_epoch_is_fetched_without_waiting_and_without_growing_the_backoff() {
        let mut retry = Retry::new(POLICY);
        let newer = WireError::StaleEpoch { current: 7 };
        assert_eq!(retry.after(Attempt::Refused(&newer), 6), Next::RetryNow);
        assert_eq!(retry.after(Attempt::Refused(&newer), 7), Next::RetryAfter(Duration::from_millis(10)));
        assert_eq!(retry.after(Attempt::Unreachable, 7), Next::RetryAfter(Duration::from_millis(20)));
    }
}

//! fawn-bench (being built).

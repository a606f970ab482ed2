//! fawn-ds (being built).

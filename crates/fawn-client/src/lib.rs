//! fawn-client (being built).

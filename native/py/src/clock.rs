//! The wall clock as Python's `time.time()` reads it, for the calls that stamp (`tracing`) or age
//! (`columns`, through `deadlines`) what they handle without a clock read from Python.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Since the Unix epoch; zero for a clock set before it.
fn since_epoch() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// Seconds since the epoch, as `time.time()` gives them.
pub fn unix_now_s() -> f64 {
    since_epoch().as_secs_f64()
}

/// Nanoseconds since the epoch, as `time.time_ns()` gives them (OTLP's span timestamps).
pub fn unix_now_ns() -> u64 {
    u64::try_from(since_epoch().as_nanos()).unwrap_or(u64::MAX)
}

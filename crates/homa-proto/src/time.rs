//! Time as the engine sees it: nanoseconds on the driver's clock. Owns the
//! `Time` type so that every module (and every driver) names one definition.

/// Time in nanoseconds on the driver's clock (any epoch; must not go backwards).
/// The engine never reads a clock: drivers pass `now` into every call, and
/// deterministic drivers (the test network, the simulator) use virtual time
/// in the same unit.
pub type Time = u64;

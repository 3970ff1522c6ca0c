//! Optional trace points inside the engine, for latency breakdowns of its
//! fast path (cargo feature `trace`; without it `trace_point!` compiles to
//! nothing). The engine reads no clock: a driver installs a hook that
//! timestamps each point (the UDP runtime's time trace does, with the `homa`
//! crate's `engine-trace` feature), which keeps the engine sans-IO.

#[cfg(feature = "trace")]
static HOOK: std::sync::OnceLock<fn(&'static str)> = std::sync::OnceLock::new();

/// Installs the function every trace point calls (the first call wins).
/// Without the `trace` feature it does nothing.
pub fn set_hook(hook: fn(&'static str)) {
    #[cfg(feature = "trace")]
    {
        let _ = HOOK.set(hook);
    }
    #[cfg(not(feature = "trace"))]
    let _ = hook;
}

/// Whether trace points are compiled in.
pub const ENABLED: bool = cfg!(feature = "trace");

#[cfg(feature = "trace")]
#[doc(hidden)]
#[inline]
pub fn hit(point: &'static str) {
    if let Some(f) = HOOK.get() {
        f(point)
    }
}

/// Marks a point on the engine's fast path (see the module docs).
#[macro_export]
#[doc(hidden)]
macro_rules! trace_point {
    ($name:literal) => {
        #[cfg(feature = "trace")]
        $crate::trace::hit($name);
    };
}

#[cfg(all(test, feature = "trace"))]
mod tests {
    use std::sync::Mutex;

    static SEEN: Mutex<Vec<&'static str>> = Mutex::new(Vec::new());

    #[test]
    fn points_reach_the_hook() {
        super::set_hook(|p| SEEN.lock().unwrap().push(p));
        crate::trace_point!("test point");
        assert!(SEEN.lock().unwrap().contains(&"test point"));
    }
}

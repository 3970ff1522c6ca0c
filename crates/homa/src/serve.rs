//! Serving inside the receive pass ([`crate::Endpoint::serve`]): a request
//! that a serving thread's own pass brings in runs the handler right there,
//! and calls the handler makes into the same endpoint reuse that pass.

use crate::driver::Driver;
use crate::endpoint::Request;
use crate::error::{Error, Result};
use crate::shared::Shared;
use std::cell::Cell;
use std::sync::Arc;

thread_local! {
    /// Set while this thread runs a [`Endpoint::serve`] handler inside a
    /// drive pass: that endpoint's engine lock is held by this very thread,
    /// so its calls into the same endpoint use the pass's driver instead of
    /// locking (which would deadlock).
    static INLINE: Cell<Option<Inline>> = const { Cell::new(None) };
}

#[derive(Clone, Copy)]
struct Inline {
    shared: *const Shared,
    /// Null when the handler runs outside a pass (a request that another
    /// thread's pass queued): calls then lock as usual, but blocking waits
    /// are refused all the same, so a handler behaves alike either way.
    driver: *mut Driver,
    now: u64,
}

/// Puts back what [`INLINE`] held before when the handler returns or
/// unwinds.
pub(crate) struct InlineGuard(Option<Inline>);

impl InlineGuard {
    /// Marks this thread as running `shared`'s serve handler, inside the
    /// pass that holds `driver` (null: outside any pass).
    pub(crate) fn enter(shared: &Shared, driver: *mut Driver, now: u64) -> InlineGuard {
        InlineGuard(INLINE.with(|c| {
            c.replace(Some(Inline {
                shared,
                driver,
                now,
            }))
        }))
    }
}

impl Drop for InlineGuard {
    fn drop(&mut self) {
        INLINE.with(|c| c.set(self.0));
    }
}

/// A serving thread's handler, run on requests its own drive passes bring in.
pub(crate) struct Serving<'a> {
    pub(crate) shared: &'a Arc<Shared>,
    pub(crate) handler: &'a mut dyn FnMut(Request),
    /// Requests handled inline so far (the poll loop keeps polling while
    /// this grows).
    pub(crate) served: u64,
}

/// The error of a blocking wait on an endpoint from inside its own serve
/// handler, which would wait for the handler itself.
pub(crate) fn wait_in_handler() -> Error {
    Error::WaitInHandler
}

impl Shared {
    /// The driver of the drive pass running on this thread, if it is
    /// running this endpoint's serve handler.
    #[allow(clippy::mut_from_ref)]
    pub(crate) fn inline_driver(&self) -> Option<(&mut Driver, u64)> {
        let i = INLINE.with(|c| c.get())?;
        if !std::ptr::eq(i.shared, self) || i.driver.is_null() {
            return None;
        }
        // SAFETY: `dispatch_serving` set this pointer from the `&mut Driver` of
        // the pass that is calling the handler on this thread, does not use
        // that reference until the handler returns, and clears the pointer
        // then. The pass holds the engine lock throughout.
        Some((unsafe { &mut *i.driver }, i.now))
    }

    /// Whether this thread is inside this endpoint's serve handler, where
    /// waiting on the endpoint would wait for the handler itself.
    pub(crate) fn in_handler(&self) -> bool {
        INLINE
            .with(|c| c.get())
            .is_some_and(|i| std::ptr::eq(i.shared, self))
    }

    /// Refuses a blocking wait from inside this endpoint's serve handler.
    pub(crate) fn check_may_wait(&self) -> Result<()> {
        if self.in_handler() {
            return Err(wait_in_handler());
        }
        Ok(())
    }
}

//! Serving inside the receive pass ([`crate::Endpoint::serve`]): a request
//! that a serving thread's own pass brings in runs the handler right there,
//! and calls the handler makes into the same endpoint reuse that pass.

use crate::driver::{Driver, DriverGuard};
use crate::endpoint::Request;
use crate::error::{Error, Result};
use crate::shared::Shared;
use std::cell::RefCell;
use std::sync::Arc;

thread_local! {
    /// Set while this thread runs a [`Endpoint::serve`] handler: which
    /// endpoint, and the engine lock of the drive pass that is calling the
    /// handler (lent by the pass, given back when the handler returns), so
    /// that the handler's calls into the same endpoint use that pass instead
    /// of locking again (which would deadlock). No raw pointer: the lock
    /// guard itself is lent, and the endpoint is recognised by address only.
    static INLINE: RefCell<Option<Inline>> = const { RefCell::new(None) };
}

struct Inline {
    /// The endpoint's shared state, by address (compared, never followed).
    endpoint: usize,
    /// The pass's lock and engine time; `None` when the handler runs
    /// outside a pass (a request that another thread's pass queued): calls
    /// then lock as usual, but blocking waits are refused all the same, so
    /// a handler behaves alike either way.
    pass: Option<(DriverGuard, u64)>,
}

/// Marks this thread as running a serve handler until [`InlineGuard::leave`]
/// (or, if the handler unwinds, until dropped: the lent lock is released
/// then and the previous state restored).
pub(crate) struct InlineGuard {
    previous: Option<Option<Inline>>,
}

impl InlineGuard {
    /// Marks this thread as running `shared`'s serve handler, inside the
    /// pass whose lock is `pass` (`None`: outside any pass).
    pub(crate) fn enter(shared: &Shared, pass: Option<(DriverGuard, u64)>) -> InlineGuard {
        let previous = INLINE.with(|c| {
            c.borrow_mut().replace(Inline {
                endpoint: shared as *const Shared as usize,
                pass,
            })
        });
        InlineGuard {
            previous: Some(previous),
        }
    }

    /// The handler returned: gives the pass its lock back.
    pub(crate) fn leave(mut self) -> Option<DriverGuard> {
        let previous = self.previous.take().flatten();
        let mine = INLINE.with(|c| std::mem::replace(&mut *c.borrow_mut(), previous));
        mine.and_then(|i| i.pass).map(|(g, _)| g)
    }
}

impl Drop for InlineGuard {
    fn drop(&mut self) {
        if let Some(previous) = self.previous.take() {
            let mine = INLINE.with(|c| std::mem::replace(&mut *c.borrow_mut(), previous));
            drop(mine);
        }
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
    /// Runs `f` with the driver of the drive pass that is running this
    /// endpoint's serve handler on this thread, if there is one; otherwise
    /// gives `f` back.
    pub(crate) fn with_inline_driver<R, F: FnOnce(&mut Driver, u64) -> R>(
        &self,
        f: F,
    ) -> Result<R, F> {
        let me = self as *const Shared as usize;
        INLINE.with(|c| {
            let mut inline = c.borrow_mut();
            match inline.as_mut() {
                Some(Inline {
                    endpoint,
                    pass: Some((guard, now)),
                }) if *endpoint == me => Ok(f(guard, *now)),
                _ => Err(f),
            }
        })
    }

    /// Whether this thread is inside this endpoint's serve handler, where
    /// waiting on the endpoint would wait for the handler itself.
    pub(crate) fn in_handler(&self) -> bool {
        let me = self as *const Shared as usize;
        INLINE.with(|c| c.borrow().as_ref().is_some_and(|i| i.endpoint == me))
    }

    /// Refuses a blocking wait from inside this endpoint's serve handler.
    pub(crate) fn check_may_wait(&self) -> Result<()> {
        if self.in_handler() {
            return Err(wait_in_handler());
        }
        Ok(())
    }
}

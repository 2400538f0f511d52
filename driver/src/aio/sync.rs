//! The synchronisation primitives of the cross-thread parts of `aio` ([`super::spsc`],
//! [`super::notify`], `wire` and the reactor), in one place so that a build with
//! `--cfg loom` swaps them for [loom](https://docs.rs/loom)'s, which run the code under
//! a model checker that explores every interleaving of its threads (and the values a
//! load may read under the C11 memory model) and fails on a data race or a broken
//! assertion. The ordinary build uses `std`'s unchanged: the [`UnsafeCell`] wrapper is
//! a `#[repr(transparent)]` `std` cell whose closures inline away.
//!
//! The loom tests are the `loom_*` tests of the library (`spsc`, `notify`, the
//! reactor's poller); `scripts/test.sh` runs them:
//! `RUSTFLAGS="--cfg loom" cargo test -p kestrel --release --lib loom_`.

#[cfg(not(loom))]
pub(super) use std::sync::atomic;

#[cfg(loom)]
pub(super) use loom::sync::atomic;

#[cfg(loom)]
pub(super) use loom::cell::UnsafeCell;

/// `std`'s `UnsafeCell` with loom's interface: the value is reached only inside
/// [`UnsafeCell::with`] (read) or [`UnsafeCell::with_mut`] (write), which under loom
/// record the access so that one not ordered after a conflicting one on another thread
/// fails the model.
#[cfg(not(loom))]
#[repr(transparent)]
pub(super) struct UnsafeCell<T>(std::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    /// A cell holding `v`.
    pub(super) const fn new(v: T) -> Self {
        UnsafeCell(std::cell::UnsafeCell::new(v))
    }

    /// Calls `f` with a pointer for reading the value.
    #[inline(always)]
    pub(super) fn with<R>(&self, f: impl FnOnce(*const T) -> R) -> R {
        f(self.0.get())
    }

    /// Calls `f` with a pointer for writing the value.
    #[inline(always)]
    pub(super) fn with_mut<R>(&self, f: impl FnOnce(*mut T) -> R) -> R {
        f(self.0.get())
    }
}

/// Runs `f` under loom: every interleaving of its threads with at most
/// `LOOM_MAX_PREEMPTIONS` preemptions, 3 when that is unset (with no bound the models
/// whose threads spin would not finish; 3 is more than any bug these tests were shown
/// to catch needs, and keeps all of them to seconds).
#[cfg(all(test, loom))]
pub(super) fn model<F: Fn() + Sync + Send + 'static>(f: F) {
    let mut b = loom::model::Builder::new();
    b.preemption_bound.get_or_insert(3);
    b.check(f);
}

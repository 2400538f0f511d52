//! The aio layer: the aio-style API ([`IoContext`], [`Iocb`], [`Event`]) and the reactor's
//! pollers ([`reactor`]) that serve it across threads. It may import the target layer and
//! below (`target`, `io`, `dma`, `spec`), never `capi` or `target_spec`.
//!
//! Inside, bottom up: `sync` (the atomics these use: `std`'s, or loom's under `--cfg loom`),
//! [`spsc`] and [`notify`] (ring and wake-up primitives), `types` and
//! `error`, `wire` (the token and message format a context and a poller share), `core`
//! (slots, validation, bounce buffers), `context` ([`IoContext`]), [`reactor`].
//!
//! # The API
//! Shaped after Linux aio, io_uring and xNVMe's queue API.
//!
//! An [`IoContext`] takes [`Iocb`]s ([`IoContext::submit`]) and gives back [`Event`]s
//! ([`IoContext::getevents`]), one per accepted iocb, exactly once. It comes in two modes
//! with the same methods:
//!
//! - **Run-to-completion** ([`IoContext::setup`]): the calling thread owns a queue on the
//!   target (an NVMe qpair or an io_uring) and `getevents` polls it. Lowest latency, like
//!   SPDK: pin the thread and keep it busy.
//! - **Cross-thread** ([`crate::reactor::Reactor::context`]): requests travel lock-free
//!   rings to pinned poller threads, which own the queues; `getevents` waits for their
//!   completions (spinning briefly, then sleeping on an eventfd the pollers signal).
//!
//! # Rules
//! - `submit` takes as many iocbs as fit, in order, and returns the count; it never
//!   sleeps. Zero accepted is [`AioError::Busy`]. An invalid iocb stops the batch: it is
//!   an error if it is the first, else the count so far is returned. One doorbell per
//!   submit call per queue (run-to-completion: one [`crate::target::TargetQueue::flush`]; cross-thread:
//!   one ring tail store per poller, and the poller rings each queue once per pass).
//! - `nr_events` bounds the requests outstanding (accepted and not yet returned by
//!   `getevents`); it is also the size of every ring, so completions never wait for room.
//! - Offsets and lengths are bytes and must be multiples of the target's block size.
//! - Buffers are [`crate::hw::dma::DmaSlice`]s of the target's [`crate::hw::dma::DmaPool`] (checked), or, with
//!   the bounce path enabled ([`ContextOptions::bounce`]), ordinary memory that is copied
//!   through bounce buffers preallocated at setup.
//! - `cancel(user_data)`: a request that has not reached the device is cancelled
//!   ([`CancelOutcome::Cancelled`]); one at the device gets an NVMe Abort, and its event
//!   says whether it was aborted ([`CancelOutcome::Aborted`]) or completed anyway
//!   ([`CancelOutcome::TooLate`]).
//! - Nothing allocates per I/O: request slots, bounce buffers and rings are made at setup.

pub mod notify;
pub mod reactor;
pub mod spsc;

mod context;
mod core;
mod error;
#[cfg(all(test, loom))]
mod loom_tests;
mod sync;
mod types;
mod wire;

pub use context::IoContext;
pub use error::{AioError, IocbError};
pub use types::{
    AioStats, BounceOptions, CancelOutcome, CancelStatus, ContextOptions, Event, IoBuf, Iocb,
    Opcode, UserBuf, MAX_BOUNCE_BUFFERS, MAX_BOUNCE_BUF_SIZE, MAX_EVENTS,
};

//! The file target against real files: on the machine's disk with direct I/O, on tmpfs
//! with the buffered fallback, and on a loop device when one can be set up.
//!
//! A module per area: plain I/O, queue behaviour, threads (queues and aio contexts), bad
//! input and open errors, crash consistency and process limits (child processes of this
//! test binary), exclusive access (locks), and block devices.

mod common;

mod block_device;
mod child;
mod crash;
mod errors;
mod io;
mod limits;
mod locks;
mod queue;
mod threads;

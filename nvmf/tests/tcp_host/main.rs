//! The driver's NVMe/TCP host (`kestrel::target::tcp`, the `tcp:` target kind) against
//! `kestrel serve`'s target on an ephemeral loopback port, over emulated controllers: the
//! bring-up, reads and writes compared byte for byte from 4 KiB to 1 MiB (in-capsule,
//! R2T, split at MDTS), digests, several I/O queues and namespaces, the aio API over it,
//! discovery, a target killed mid-write (no acknowledged write lost), randrw with many
//! I/Os in flight over awkward transfers (`stress`), and responses a relay forges
//! (`forged`); SQ flow control disabled on I/O queues, or kept (`sqflow`); asynchronous
//! events a relay reports (`events`).
//!
//! It lives here because it needs both crates: the driver does not depend on the target.

mod common;
#[path = "../../../driver/tests/support/counting_alloc.rs"]
mod counting_alloc;

mod aio;
mod capi;
mod discovery;
mod events;
mod forged;
mod io;
mod noalloc;
mod recovery;
mod sqflow;
mod stress;

//! The target against a host written here from the specification (the kernel's initiator
//! is not on this machine): ICReq, Connect of admin and I/O queues, properties, Identify,
//! writes in capsule and through R2T, reads, digests on and off, SQ flow control off
//! (C2HData SUCCESS), discovery, host refusal, keep-alive expiry, and a malformed PDU
//! closing only its own connection. Every server runs on an ephemeral loopback port over
//! an emulated controller.
//!
//! A module per area: the host ([`host::Host`]), the whole life of a host with admin and
//! I/O commands, refusals (malformed PDUs, unknown hosts, limits), discovery, connections
//! that end (keep-alive expiry, a connection killed mid-I/O), several namespaces of one
//! subsystem, a `null` namespace whose reads leave buffers as they are (no host reads
//! another's data), Asynchronous Event Requests, and a panic in one connection's handling
//! that the others survive.

mod common;
mod host;

mod admin_io;
mod async_events;
mod connection_loss;
mod discovery;
mod namespaces;
mod null_fill;
mod panics;
mod refusals;

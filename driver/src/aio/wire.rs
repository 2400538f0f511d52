//! What a context and a reactor's pollers share: the token format, the messages on the
//! rings between them, and the state each side can see of the other. Both
//! [`super::context`] and [`super::reactor`] import this; it imports neither.
//!
//! # Tokens
//! A context names a request by a token of [`CONTEXT_TOKEN_BITS`] bits: its slot index in
//! the low [`SLOT_BITS`] and the slot's generation above, so a repeated or stray
//! completion names no live request. A poller puts the identifier of the context's ring
//! in the 16 bits above ([`with_ring`]) before handing the request to a queue, so routing
//! a completion back is an index ([`ring_of`]), and strips it again ([`context_part`])
//! before posting.

use std::sync::{Arc, Mutex};

use crossbeam_utils::CachePadded;

use crate::io::{Completion, IoRequest};
use crate::target::Target;

use super::error::AioError;
use super::notify::Notify;
use super::spsc::{self, Consumer, Producer};
// `std`'s atomics, or loom's in a `--cfg loom` build (see `super::sync`).
use super::sync::atomic::{AtomicBool, Ordering};

/// Token bits a context may use; the poller puts its ring identifier above them.
pub(super) const CONTEXT_TOKEN_BITS: u32 = 48;
const CONTEXT_TOKEN_MASK: u64 = (1 << CONTEXT_TOKEN_BITS) - 1;
/// Bits of a context token that hold the slot index (the generation is above them).
pub(super) const SLOT_BITS: u32 = 24;
const SLOT_MASK: u64 = (1 << SLOT_BITS) - 1;
const GEN_MASK: u32 = (1 << (CONTEXT_TOKEN_BITS - SLOT_BITS)) - 1;
/// The most contexts attached to one poller at once (ring identifiers are 16 bits).
pub const MAX_CONTEXTS_PER_POLLER: usize = 1 << (64 - CONTEXT_TOKEN_BITS);

const _: () = assert!(super::types::MAX_EVENTS as u64 <= SLOT_MASK + 1);

/// The token of slot `slot` in generation `gen`.
pub(super) fn context_token(slot: u32, gen: u32) -> u64 {
    ((gen & GEN_MASK) as u64) << SLOT_BITS | slot as u64
}

/// The slot a context token names.
pub(super) fn slot_of(token: u64) -> usize {
    (token & SLOT_MASK) as usize
}

/// The generation a context token carries.
pub(super) fn gen_of(token: u64) -> u32 {
    (token >> SLOT_BITS) as u32 & GEN_MASK
}

/// The generation after `gen` (wrapping within the token's bits).
pub(super) fn next_gen(gen: u32) -> u32 {
    (gen + 1) & GEN_MASK
}

/// A context token with ring identifier `ring` above it, as a poller hands it to a queue.
pub(super) fn with_ring(token: u64, ring: usize) -> u64 {
    context_part(token) | (ring as u64) << CONTEXT_TOKEN_BITS
}

/// The ring identifier a queue token carries.
pub(super) fn ring_of(token: u64) -> usize {
    (token >> CONTEXT_TOKEN_BITS) as usize
}

/// The context's part of a queue token.
pub(super) fn context_part(token: u64) -> u64 {
    token & CONTEXT_TOKEN_MASK
}

/// A request from a context to a poller: hand `req` to the queue of target `target`.
#[derive(Clone, Copy, Debug)]
pub(super) struct Msg {
    pub target: u16,
    pub req: IoRequest,
}

/// A cancel from a context to a poller: the request with `token` on target `target`.
#[derive(Clone, Copy, Debug)]
pub(super) struct CancelMsg {
    pub target: u16,
    pub token: u64,
}

/// State of a context the pollers can see.
pub(super) struct ContextShared {
    /// Set (SeqCst) for the length of a submit or cancel call; see the shutdown protocol.
    pub submitting: CachePadded<AtomicBool>,
    /// Set when the context is dropped: its rings may be freed once nothing is in flight.
    pub closed: AtomicBool,
    /// Wakes the context's thread sleeping in `getevents`.
    pub waiter: Notify,
}

/// The poller's end of a context's rings.
pub(super) struct PollerEnd {
    pub sq: Consumer<Msg>,
    pub cancels: Consumer<CancelMsg>,
    pub cq: Producer<Completion>,
    pub ctx: Arc<ContextShared>,
}

/// The context's end of its rings to one poller.
pub(super) struct ContextEnd {
    pub sq: Producer<Msg>,
    pub cancels: Producer<CancelMsg>,
    pub cq: Consumer<Completion>,
    pub poller: Arc<PollerShared>,
}

/// State of a poller other threads can see.
pub(super) struct PollerShared {
    /// The core it runs on.
    pub core: usize,
    /// Wakes it from an idle sleep.
    pub notify: Notify,
    /// Ring ends of new contexts, taken by the poller when `attach_pending` is set.
    pub attach: Mutex<Vec<PollerEnd>>,
    /// Set (release) after a push to `attach`.
    pub attach_pending: AtomicBool,
    /// Set (release) when the reactor stops.
    pub stop: AtomicBool,
}

/// State shared by the reactor handle and its contexts.
pub(super) struct ReactorShared {
    /// Set (SeqCst) once shutdown begins; contexts check it in every submit call.
    pub stopped: CachePadded<AtomicBool>,
    /// Serialises attaching contexts against shutdown.
    pub attach_lock: Mutex<()>,
    /// One per poller, in poller order.
    pub pollers: Vec<Arc<PollerShared>>,
    /// The targets, in index order.
    pub targets: Vec<Arc<dyn Target>>,
}

impl ReactorShared {
    /// Hands a new context's ring ends to the pollers they name (by index).
    pub(super) fn attach(&self, ends: Vec<(usize, PollerEnd)>) -> Result<(), AioError> {
        let _g = self.attach_lock.lock().unwrap_or_else(|p| p.into_inner());
        // Relaxed: read under the lock that shutdown takes to set it.
        if self.stopped.load(Ordering::Relaxed) {
            return Err(AioError::Stopped);
        }
        for (pi, end) in ends {
            let p = &self.pollers[pi];
            p.attach.lock().unwrap_or_else(|e| e.into_inner()).push(end);
            // Release: the push above (made under the mutex) is seen by the poller that
            // loads the flag with acquire and then takes the mutex.
            p.attach_pending.store(true, Ordering::Release);
            p.notify.signal();
        }
        Ok(())
    }
}

/// Makes a context's three rings to each poller of `pollers` (indices into
/// `reactor.pollers`) and hands the poller ends over; returns the context's ends, in the
/// same order. Submission rings hold `sq_entries`; cancel and completion rings hold
/// `nr_events`, so a poller never finds a completion ring full.
pub(super) fn connect(
    reactor: &ReactorShared,
    pollers: &[usize],
    ctx: &Arc<ContextShared>,
    sq_entries: usize,
    nr_events: usize,
) -> Result<Vec<ContextEnd>, AioError> {
    let mut ends = Vec::with_capacity(pollers.len());
    let mut poller_ends = Vec::with_capacity(pollers.len());
    for &pi in pollers {
        let (sq_p, sq_c) = spsc::channel::<Msg>(sq_entries);
        let (cn_p, cn_c) = spsc::channel::<CancelMsg>(nr_events);
        // Room for every outstanding request: a poller never finds it full.
        let (cq_p, cq_c) = spsc::channel::<Completion>(nr_events);
        ends.push(ContextEnd {
            sq: sq_p,
            cancels: cn_p,
            cq: cq_c,
            poller: Arc::clone(&reactor.pollers[pi]),
        });
        poller_ends.push((
            pi,
            PollerEnd {
                sq: sq_c,
                cancels: cn_c,
                cq: cq_p,
                ctx: Arc::clone(ctx),
            },
        ));
    }
    reactor.attach(poller_ends)?;
    Ok(ends)
}

impl ContextShared {
    /// A context's shared state, with its eventfd.
    pub(super) fn new() -> Result<ContextShared, AioError> {
        Ok(ContextShared {
            submitting: CachePadded::new(AtomicBool::new(false)),
            closed: AtomicBool::new(false),
            waiter: Notify::new().map_err(AioError::EventFd)?,
        })
    }
}

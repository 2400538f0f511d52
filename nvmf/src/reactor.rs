//! Reactor threads: one per core in the list, pinned, each owning its connections (edge-
//! triggered non-blocking sockets on its own epoll) and its own queue on each target. The
//! first reactor also owns the listeners and deals accepted connections round robin.
//!
//! A pass: wait for socket events (not at all while requests are in flight: the target is
//! polled; never in [`crate::PollMode::Busy`]), read and handle PDUs, poll the target queues and turn completions into PDUs,
//! resubmit requests the target refused as busy, write what is queued; every 100 ms check
//! keep-alive and controller state. A connection whose socket is closed stays until its
//! requests at the target have completed; its DMA buffers are lent to the target queues,
//! which free them only once nothing is outstanding, so none is freed under the device.
//!
//! Each step of one connection's handling (reading and handling its PDUs, a target
//! completion, transmitting, the controller check) runs under `catch_unwind`: a panic
//! there is logged naming the peer and the controller, and that connection alone is
//! dropped (closed as any other, kept until its requests at the target have finished);
//! the reactor and every other connection go on. A lock the panic poisoned is recovered
//! by the next connection that takes it ([`crate::ctrl::lock`]).

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kestrel::io::IoError;
use kestrel::{Completion, IoRequest, SubmitError, TargetQueue};

use crate::budget::Limit;
use crate::conn::{Close, Conn, Ctx, Role};
use crate::ctrl::Shared;
use crate::sys::{Epoll, EventFd, EV_ERR, EV_IN, EV_OUT};

const KEY_WAKE: u64 = u64::MAX;
/// Passes without progress polled back to back before the reactor waits on its sockets
/// (for at most 1 ms) between polls.
const IDLE_SPIN_PASSES: u32 = 256;
/// Passes between clock reads while the loop spins.
const CLOCK_EVERY: u32 = 64;
/// How often controllers are checked (keep-alive, end, reset).
const CHECK_PERIOD_NS: u64 = 100_000_000;
const KEY_LISTENER: u64 = u64::MAX - 16;

/// The time a reactor's passes took: busy (the pass had socket events or target
/// completions to handle) and idle, in nanoseconds of the TSC. A busy-polling reactor's
/// core is always 100 % used, so its CPU time says nothing of the work; its busy time
/// does (as SPDK's reactors count busy and idle ticks). Both stay 0 where the loop's
/// clock is not the TSC (reading another clock each pass would cost a system call).
#[derive(Debug, Default)]
pub struct PassTime {
    /// Nanoseconds in passes that handled something.
    pub busy_ns: AtomicU64,
    /// Nanoseconds in passes that found nothing (waiting in `epoll_wait` included).
    pub idle_ns: AtomicU64,
}

/// Busy and idle time counted in a reactor's loop, published to [`PassTime`] every
/// [`CLOCK_EVERY`] passes.
struct PassClock {
    on: bool,
    last: u64,
    busy: u64,
    idle: u64,
    passes: u32,
}

impl PassClock {
    fn new(clock: &kestrel::clock::Clock) -> Self {
        let on = clock.source() == kestrel::clock::ClockSource::Tsc;
        PassClock {
            on,
            last: if on { clock.now_ns() } else { 0 },
            busy: 0,
            idle: 0,
            passes: 0,
        }
    }

    /// A pass ended; `busy`: it handled something.
    #[inline]
    fn pass(&mut self, clock: &kestrel::clock::Clock, busy: bool, out: &PassTime) {
        if !self.on {
            return;
        }
        let now = clock.now_ns();
        let dt = now.saturating_sub(self.last);
        self.last = now;
        if busy {
            self.busy += dt;
        } else {
            self.idle += dt;
        }
        self.passes += 1;
        if self.passes >= CLOCK_EVERY {
            self.passes = 0;
            out.busy_ns
                .fetch_add(std::mem::take(&mut self.busy), Ordering::Relaxed);
            out.idle_ns
                .fetch_add(std::mem::take(&mut self.idle), Ordering::Relaxed);
        }
    }
}

/// Where other threads hand a reactor new connections.
pub struct Mailbox {
    /// Connections waiting to be taken.
    pub inbox: Mutex<Vec<(TcpStream, SocketAddr)>>,
    /// Wakes the reactor.
    pub wake: EventFd,
}

fn conn_key(idx: usize, gen: u32) -> u64 {
    ((gen as u64 & 0xff_ffff) << 40) | ((idx as u64 & 0xff_ffff) << 16)
}

fn split_token(t: u64) -> (usize, u32, u16) {
    (
        ((t >> 16) & 0xff_ffff) as usize,
        ((t >> 40) & 0xff_ffff) as u32,
        t as u16,
    )
}

/// Hands the result of the target request `token` to its connection, if that connection (slot
/// and generation in the token) is still there; the result of a request whose connection has
/// gone is ignored.
#[allow(clippy::too_many_arguments)]
fn deliver(
    epoll: &Epoll,
    conns: &mut [Option<Entry>],
    shared: &Shared,
    queues: &mut [Option<Box<dyn TargetQueue>>],
    retry: &mut VecDeque<(usize, IoRequest)>,
    depth: u32,
    token: u64,
    result: Result<(), IoError>,
) {
    let (idx, gen, slot) = split_token(token);
    if let Some(Some(e)) = conns.get_mut(idx) {
        if e.gen == gen {
            let r = catch_unwind(AssertUnwindSafe(|| {
                let mut ctx = Ctx {
                    shared,
                    queues,
                    retry,
                    key: conn_key(idx, gen),
                    queue_depth: depth,
                };
                e.conn.target_done(slot, result, &mut ctx);
            }));
            if let Err(p) = r {
                conn_panicked(epoll, shared, &mut e.conn, p.as_ref());
            }
        }
    }
}

/// The text of a panic's payload.
fn panic_text(p: &(dyn std::any::Any + Send)) -> &str {
    p.downcast_ref::<&str>()
        .copied()
        .or_else(|| p.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a panic without a message")
}

/// A step of `conn`'s handling panicked (`payload`): logs it with the peer and the
/// controller, counts it and closes the connection as any other (it stays until its
/// requests at the target have finished). The rest of the reactor goes on.
fn conn_panicked(
    epoll: &Epoll,
    shared: &Shared,
    conn: &mut Conn,
    payload: &(dyn std::any::Any + Send),
) {
    shared.panics.fetch_add(1, Ordering::Relaxed);
    let controller = match &conn.role {
        Role::Unbound => "none (before connect)".to_string(),
        Role::Admin(c) => format!("cntlid {} of {} (admin queue)", c.cntlid, c.subsys.nqn),
        Role::Io { ctrl, qid, .. } => {
            format!(
                "cntlid {} of {} (i/o queue {qid})",
                ctrl.cntlid, ctrl.subsys.nqn
            )
        }
    };
    tracing::error!(
        peer = %conn.peer,
        controller = %controller,
        "the handling of the connection from {} (controller {controller}) panicked: {}; that \
         connection is dropped, the target serves on",
        conn.peer,
        panic_text(payload)
    );
    // Closing releases the controller or queue; should that panic too, the connection is
    // still marked closing (the first thing `Conn::close` does) and only waits for its
    // requests at the target.
    if catch_unwind(AssertUnwindSafe(|| {
        close_conn(epoll, shared, conn, Close::Panicked)
    }))
    .is_err()
    {
        tracing::error!(peer = %conn.peer, "closing the connection after its panic panicked too");
        conn.closing = true;
    }
}

struct Entry {
    conn: Conn,
    gen: u32,
}

/// One reactor.
pub struct Reactor {
    id: usize,
    shared: Arc<Shared>,
    epoll: Epoll,
    me: Arc<Mailbox>,
    peers: Vec<Arc<Mailbox>>,
    next_peer: usize,
    listeners: Vec<TcpListener>,
    conns: Vec<Option<Entry>>,
    gens: Vec<u32>,
    free_idx: Vec<usize>,
    queues: Vec<Option<Box<dyn TargetQueue>>>,
    retry: VecDeque<(usize, IoRequest)>,
    completions: Vec<Completion>,
    /// The pieces of one gathered write, reused by every connection's flush (room for
    /// `sys::MAX_IOVS`, allocated once).
    iovs: Vec<crate::sys::RawIov>,
    events: Vec<(u32, u64)>,
}

impl Reactor {
    /// A reactor; `listeners` only for the first.
    pub fn new(
        id: usize,
        shared: Arc<Shared>,
        me: Arc<Mailbox>,
        peers: Vec<Arc<Mailbox>>,
        listeners: Vec<TcpListener>,
    ) -> std::io::Result<Self> {
        let epoll = Epoll::new(256)?;
        epoll.add(me.wake.fd(), KEY_WAKE, false)?;
        for (i, l) in listeners.iter().enumerate() {
            l.set_nonblocking(true)?;
            epoll.add(l, KEY_LISTENER + i as u64, false)?;
        }
        let nqueues = shared.target_queues;
        Ok(Reactor {
            id,
            shared,
            epoll,
            me,
            peers,
            next_peer: 0,
            listeners,
            conns: Vec::new(),
            gens: Vec::new(),
            free_idx: Vec::new(),
            queues: (0..nqueues).map(|_| None).collect(),
            retry: VecDeque::with_capacity(1024),
            completions: Vec::with_capacity(256),
            iovs: Vec::with_capacity(crate::sys::MAX_IOVS),
            events: Vec::with_capacity(256),
        })
    }

    /// Runs until the server stops.
    pub fn run(mut self) {
        // The loop's clock: the TSC where it is a usable clock. Elsewhere (virtual machines
        // without an invariant TSC) a clock read is a system call and an emulated timer
        // read that takes the device model's lock, so a spinning loop reads it only every
        // CLOCK_EVERY passes, or after a pass that may have slept.
        let clock = kestrel::clock::Clock::get();
        let mut last_check_ns = clock.now_ns();
        let mut passes_unclocked = 0u32;
        let mut empty_passes = 0u32;
        let mut pass_clock = PassClock::new(&clock);
        loop {
            if self.shared.stop.load(Ordering::Acquire) {
                self.shutdown();
                return;
            }
            // Poll while work is in flight; after a run of passes that found nothing, wait
            // on the sockets for up to a millisecond between polls of the targets, so a
            // core shared with the host's side (or a device model) is not starved.
            let timeout = self.wait_ms(empty_passes);
            self.events.clear();
            let evs = &mut self.events;
            if let Err(e) = self.epoll.wait(timeout, |ev, key| evs.push((ev, key))) {
                tracing::error!(reactor = self.id, "epoll_wait failed: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
            for i in 0..self.events.len() {
                let (ev, key) = self.events[i];
                if key == KEY_WAKE {
                    self.me.wake.drain();
                    self.take_inbox();
                } else if key >= KEY_LISTENER {
                    self.accept((key - KEY_LISTENER) as usize);
                } else {
                    let (idx, gen, _) = split_token(key);
                    if let Some(Some(e)) = self.conns.get_mut(idx) {
                        if e.gen == gen {
                            if ev & (EV_IN | EV_ERR) != 0 {
                                e.conn.mark_readable(ev & EV_ERR != 0);
                            }
                            if ev & (EV_OUT | EV_ERR) != 0 {
                                e.conn.writable = true;
                            }
                        }
                    }
                }
            }
            let completed = self.pass();
            let idle = completed == 0 && self.events.is_empty();
            if let Some(t) = self.shared.pass_time.get(self.id) {
                pass_clock.pass(&clock, !idle, t);
            }
            if idle {
                empty_passes = empty_passes.saturating_add(1);
                if timeout == 0 && self.shared.limits.poll == crate::PollMode::Hybrid {
                    // Let other threads of this core run.
                    std::thread::yield_now();
                }
            } else {
                empty_passes = 0;
            }
            passes_unclocked += 1;
            if timeout > 0 || passes_unclocked >= CLOCK_EVERY {
                passes_unclocked = 0;
                let now = clock.now_ns();
                if now.saturating_sub(last_check_ns) >= CHECK_PERIOD_NS {
                    last_check_ns = now;
                    self.check_controllers();
                }
            }
            self.reap();
        }
    }

    /// How long the next `epoll_wait` may wait, after `empty_passes` passes in a row that
    /// found nothing: not at all while work is in flight, up to 1 ms between polls after a
    /// run of empty passes, up to 50 ms with nothing in flight; never in busy mode (the
    /// core is the target's alone).
    fn wait_ms(&self, empty_passes: u32) -> i32 {
        if self.shared.limits.poll == crate::PollMode::Busy {
            0
        } else if !self.busy() {
            50
        } else if empty_passes >= IDLE_SPIN_PASSES {
            1
        } else {
            0
        }
    }

    /// Whether to poll rather than wait: work at the target or waiting, bytes to send, or a
    /// connection readable (its receive stage may hold PDUs read ahead, which no socket
    /// event will announce again).
    fn busy(&self) -> bool {
        !self.retry.is_empty()
            || self.conns.iter().flatten().any(|e| {
                e.conn.at_target > 0
                    || (!e.conn.closing
                        && (e.conn.has_waiting()
                            || e.conn.readable
                            || (e.conn.has_tx() && e.conn.writable)))
            })
    }

    /// One pass; returns the completions handled.
    fn pass(&mut self) -> usize {
        self.receive();
        let completed = self.complete();
        self.retry_refused();
        for q in self.queues.iter_mut().flatten() {
            q.flush();
        }
        self.transmit();
        completed
    }

    /// Each connection reads and handles what came, retries commands waiting for buffer
    /// room and sends what that produced.
    fn receive(&mut self) {
        let Reactor {
            shared,
            conns,
            queues,
            retry,
            epoll,
            iovs,
            ..
        } = self;
        let depth = shared.limits.target_queue_depth;
        for (idx, e) in conns.iter_mut().enumerate() {
            let Some(e) = e.as_mut() else {
                continue;
            };
            if e.conn.closing {
                continue;
            }
            let key = conn_key(idx, e.gen);
            let conn = &mut e.conn;
            let r = catch_unwind(AssertUnwindSafe(|| {
                let mut ctx = Ctx {
                    shared,
                    queues,
                    retry,
                    key,
                    queue_depth: depth,
                };
                let mut r = Ok(());
                if conn.readable {
                    r = conn.on_readable(&mut ctx);
                }
                if r.is_ok() && conn.has_waiting() {
                    conn.run_waiting(&mut ctx);
                }
                if r.is_ok() {
                    r = conn.flush(ctx.queues, iovs);
                }
                r
            }));
            match r {
                Ok(Ok(())) => {}
                Ok(Err(why)) => close_conn(epoll, shared, &mut e.conn, why),
                Err(p) => conn_panicked(epoll, shared, &mut e.conn, p.as_ref()),
            }
            e.conn.account(shared);
        }
    }

    /// Polls the target queues and hands each completion to its connection; returns how
    /// many.
    fn complete(&mut self) -> usize {
        let Reactor {
            shared,
            conns,
            queues,
            retry,
            completions,
            epoll,
            ..
        } = self;
        let depth = shared.limits.target_queue_depth;
        for (sub, q) in queues.iter_mut().enumerate() {
            let Some(q) = q.as_mut() else { continue };
            if q.outstanding() == 0 {
                // Buffers of connections gone while other requests were outstanding are
                // freed now that nothing is: no request the target holds names them. (The
                // queue would only do it when polled, and an idle queue is not.)
                q.collect_released();
                continue;
            }
            let room = completions.capacity() - completions.len();
            q.poll(room as u32, &mut |c| completions.push(c));
            let _ = sub;
        }
        let completed = completions.len();
        for c in completions.drain(..) {
            deliver(
                epoll, conns, shared, queues, retry, depth, c.token, c.result,
            );
        }
        completed
    }

    /// Submits again the requests the target refused as busy, in order.
    fn retry_refused(&mut self) {
        let Reactor {
            shared,
            conns,
            queues,
            retry,
            epoll,
            ..
        } = self;
        let depth = shared.limits.target_queue_depth;
        while let Some(&(sub, req)) = retry.front() {
            let (idx, gen, _) = split_token(req.token);
            let live = matches!(conns.get(idx), Some(Some(e)) if e.gen == gen && !e.conn.closing);
            let outcome = if !live {
                Some(Err(IoError::Cancelled))
            } else {
                match queues
                    .get_mut(sub)
                    .and_then(|q| q.as_mut())
                    .map(|q| q.submit(req))
                {
                    Some(Ok(())) => None,
                    Some(Err(SubmitError::Busy(_))) => break,
                    Some(Err(SubmitError::Invalid { reason, .. })) => Some(Err(IoError::Nvme(
                        crate::conn::io_status(IoError::Nvme(invalid(reason)), false),
                    ))),
                    Some(Err(SubmitError::DeviceRemoved)) | None => {
                        Some(Err(IoError::DeviceRemoved))
                    }
                }
            };
            retry.pop_front();
            if let Some(result) = outcome {
                deliver(
                    epoll, conns, shared, queues, retry, depth, req.token, result,
                );
            }
        }
    }

    /// Transmits what completions produced.
    fn transmit(&mut self) {
        let Reactor {
            conns,
            epoll,
            queues,
            shared,
            iovs,
            ..
        } = self;
        for e in conns.iter_mut().flatten() {
            if !e.conn.closing && e.conn.has_tx() && e.conn.writable {
                match catch_unwind(AssertUnwindSafe(|| e.conn.flush(queues, iovs))) {
                    Ok(Ok(())) => {}
                    Ok(Err(why)) => close_conn(epoll, shared, &mut e.conn, why),
                    Err(p) => conn_panicked(epoll, shared, &mut e.conn, p.as_ref()),
                }
                e.conn.account(shared);
            }
        }
    }

    fn check_controllers(&mut self) {
        for e in self.conns.iter_mut().flatten() {
            if e.conn.closing {
                continue;
            }
            match catch_unwind(AssertUnwindSafe(|| e.conn.check_controller(&self.shared))) {
                Ok(None) => {}
                Ok(Some(why)) => close_conn(&self.epoll, &self.shared, &mut e.conn, why),
                Err(p) => conn_panicked(&self.epoll, &self.shared, &mut e.conn, p.as_ref()),
            }
            e.conn.account(&self.shared);
        }
    }

    /// Drops closed connections whose target requests are all done, giving their DMA
    /// buffers up to the queues they are lent to (freed once those have nothing
    /// outstanding).
    fn reap(&mut self) {
        for idx in 0..self.conns.len() {
            let done =
                matches!(&self.conns[idx], Some(e) if e.conn.closing && e.conn.at_target == 0);
            if done {
                if let Some(e) = self.conns[idx].as_mut() {
                    e.conn.release_buffers(&mut self.queues);
                    e.conn.unaccount(&self.shared);
                }
                self.conns[idx] = None;
                self.free_idx.push(idx);
                self.shared.connections.fetch_sub(1, Ordering::AcqRel);
            }
        }
    }

    fn accept(&mut self, li: usize) {
        loop {
            let Some(l) = self.listeners.get(li) else {
                return;
            };
            match l.accept() {
                Ok((s, peer)) => {
                    let n = self.shared.connections.fetch_add(1, Ordering::AcqRel);
                    let target = self.deal(n);
                    let Some(target) = target.filter(|_| s.set_nonblocking(true).is_ok()) else {
                        self.shared.connections.fetch_sub(1, Ordering::AcqRel);
                        if target.is_none() {
                            self.shared.acct.hit(
                                Limit::ConnectionTable,
                                self.shared.now_ms(),
                                format_args!("peer {peer} refused: {n} connections are open"),
                            );
                        }
                        continue;
                    };
                    let _ = s.set_nodelay(true);
                    if target == self.id {
                        self.add_conn(s, peer);
                    } else {
                        let p = &self.peers[target];
                        crate::ctrl::lock(&p.inbox, "a reactor's inbox").push((s, peer));
                        p.wake.signal();
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!("accept failed: {e}");
                    return;
                }
            }
        }
    }

    /// The reactor a new connection goes to (`n` connections open before it), `None` when
    /// it is refused. Round robin; but while the connections that have not connected are
    /// at their limit, or the table is full, to the reactor with the most of them, which
    /// closes its oldest for it (`evict_pending`). A full table with none of them refuses.
    fn deal(&mut self, n: u32) -> Option<usize> {
        let lim = &self.shared.limits;
        let pending: Vec<u32> = self
            .shared
            .pending
            .iter()
            .map(|p| p.load(Ordering::Acquire))
            .collect();
        let total: u32 = pending.iter().sum();
        let full = n >= lim.max_connections;
        if (full && total == 0) || n >= lim.max_connections + lim.max_pending {
            return None;
        }
        if full || total >= lim.max_pending {
            return (0..pending.len()).max_by_key(|&r| pending[r]);
        }
        let target = self.next_peer % self.peers.len();
        self.next_peer = self.next_peer.wrapping_add(1);
        Some(target)
    }

    /// Closes this reactor's oldest connection that has not connected (not `keep`, the
    /// one just added) while such connections are over their limit or the table is over
    /// full.
    fn evict_pending(&mut self, keep: usize) {
        let lim = &self.shared.limits;
        let total: u32 = self
            .shared
            .pending
            .iter()
            .map(|p| p.load(Ordering::Acquire))
            .sum();
        let over = self.shared.connections.load(Ordering::Acquire) > lim.max_connections;
        if total <= lim.max_pending && !over {
            return;
        }
        let oldest = self
            .conns
            .iter()
            .enumerate()
            .filter_map(|(i, e)| Some((i, e.as_ref()?)))
            .filter(|(i, e)| *i != keep && e.conn.is_pending() && !e.conn.closing)
            .min_by_key(|(i, e)| (e.conn.born_ms, *i))
            .map(|(i, _)| i);
        let Some(e) = oldest.and_then(|i| self.conns[i].as_mut()) else {
            return;
        };
        self.shared.acct.hit(
            Limit::PendingEvicted,
            self.shared.now_ms(),
            format_args!(
                "peer {} closed: {total} connections have not connected ({} at most)",
                e.conn.peer, lim.max_pending
            ),
        );
        close_conn(
            &self.epoll,
            &self.shared,
            &mut e.conn,
            Close::Limit(Limit::PendingEvicted),
        );
    }

    fn take_inbox(&mut self) {
        let new: Vec<_> =
            std::mem::take(&mut *crate::ctrl::lock(&self.me.inbox, "a reactor's inbox"));
        for (s, peer) in new {
            self.add_conn(s, peer);
        }
    }

    fn add_conn(&mut self, s: TcpStream, peer: SocketAddr) {
        let idx = match self.free_idx.pop() {
            Some(i) => i,
            None => {
                self.conns.push(None);
                self.gens.push(0);
                self.conns.len() - 1
            }
        };
        self.gens[idx] = self.gens[idx].wrapping_add(1) & 0xff_ffff;
        let gen = self.gens[idx];
        let mut conn = Conn::new(s, peer, self.shared.now_ms(), self.id);
        if let Err(e) = self.epoll.add(conn.fd(), conn_key(idx, gen), true) {
            tracing::warn!(%peer, "cannot watch a connection: {e}");
            self.free_idx.push(idx);
            self.shared.connections.fetch_sub(1, Ordering::AcqRel);
            return;
        }
        tracing::debug!(%peer, reactor = self.id, "connection accepted");
        conn.mark_pending(&self.shared);
        conn.account(&self.shared);
        self.conns[idx] = Some(Entry { conn, gen });
        self.evict_pending(idx);
    }

    fn shutdown(&mut self) {
        for e in self.conns.iter_mut().flatten() {
            close_conn(&self.epoll, &self.shared, &mut e.conn, Close::Shutdown);
        }
        // Requests at the target finish before their buffers go.
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.conns.iter().flatten().any(|e| e.conn.at_target > 0) {
            if Instant::now() > deadline {
                tracing::error!(
                    reactor = self.id,
                    "target requests still outstanding after 10 s at shutdown"
                );
                // The connections' buffers are lent to the queues, which are dropped with
                // the reactor: a queue's drop makes sure the device is done with its
                // requests before freeing them, or leaks them.
                return;
            }
            self.pass();
            std::thread::sleep(Duration::from_micros(100));
        }
        self.conns.clear();
        self.queues.clear();
    }
}

fn invalid(r: kestrel::io::InvalidRequest) -> kestrel::spec::Status {
    use kestrel::io::InvalidRequest as I;
    use kestrel::spec::Status;
    match r {
        I::OutOfRange { .. } => Status::LBA_OUT_OF_RANGE.with_dnr(true),
        I::ReadOnly => Status::NAMESPACE_WRITE_PROTECTED.with_dnr(true),
        _ => Status::INVALID_FIELD.with_dnr(true),
    }
}

fn close_conn(epoll: &Epoll, shared: &Shared, conn: &mut Conn, why: Close) {
    if conn.closing {
        return;
    }
    epoll.del(conn.fd());
    match &why {
        Close::Protocol(_) | Close::HostTerm(..) | Close::Io(_) => {
            tracing::warn!(peer = %conn.peer, "closing connection: {why}")
        }
        Close::Controller(_) => {
            tracing::info!(peer = %conn.peer, "closing connection: {why}")
        }
        // A limit was logged where it was hit (rate-limited).
        Close::Limit(_) => tracing::debug!(peer = %conn.peer, "closing connection: {why}"),
        // A panic was logged as an error where it was caught.
        Close::Peer | Close::Shutdown | Close::Panicked => {}
    }
    conn.close(&why, shared);
}

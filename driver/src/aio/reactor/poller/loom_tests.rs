//! A cancel racing its request through a poller, under loom (`--cfg loom`;
//! scripts/test.sh).
//!
//! The poller is the real one ([`Poller::pass`]: cancels, submissions, doorbells, reaping,
//! posting) on the real rings of `aio::wire`; its queue is a small software device
//! ([`FakeQueue`]) that completes a request on the second poll after its doorbell, so
//! a cancel can find it queued, at the device, or already done. The context's side is
//! the ring traffic `IoContext::submit` and `IoContext::cancel` make: push the requests
//! and publish them with one tail store, wake the poller, then send the cancel and wake
//! it again. loom runs the poller's first passes on a thread of their own against it,
//! in every interleaving; then the test lets the poller finish and checks:
//!
//! - every request's completion reaches the context exactly once;
//! - its result is what the queue reported for it, or `Cancelled` for a request the
//!   queue was never given (only the cancelled one may skip the queue);
//! - the poller never forwards a cancel for a request the queue has not been given
//!   (one still in the submission ring must be found there: the acquire of the cancel
//!   ring's tail orders the look at the submission ring after the context published it);
//! - nothing is left behind: no stalled request, no leftover cancel, no overflow.

use std::collections::{BTreeSet, VecDeque};
use std::sync::Mutex;

use loom::thread;

use super::super::super::sync::atomic::AtomicBool;
use super::super::super::wire::{context_part, context_token, with_ring, ContextShared};
use super::super::super::{notify::Notify, spsc};
use super::*;
use crate::io::{Busy, QueueStats};

/// Passes the poller makes on its own thread, racing the context.
const RACING_PASSES: usize = 3;

/// What the software device saw, for the checks after the run.
#[derive(Default)]
struct Log {
    /// Tokens the queue accepted.
    given: Vec<u64>,
    /// Tokens a cancel or abort named before the queue had been given them.
    asked_unseen: Vec<u64>,
    /// Completions the queue delivered.
    delivered: Vec<Completion>,
}

/// A queue of `depth` requests: submitted requests wait for the doorbell, then complete
/// (successfully) on the second poll; `cancel_queued` takes one still waiting for the
/// doorbell, `abort` one at the device.
struct FakeQueue {
    depth: usize,
    queued: VecDeque<u64>,
    /// Requests at the device, with the polls left before they complete.
    at_device: Vec<(u64, u8)>,
    ready: VecDeque<Completion>,
    log: Arc<Mutex<Log>>,
    /// Nothing is lent to it: the poller submits the contexts' requests unchecked.
    leases: crate::hw::dma::Leases,
}

impl FakeQueue {
    fn note_cancel(&self, token: u64) {
        let mut log = self.log.lock().unwrap();
        if !log.given.contains(&token) {
            log.asked_unseen.push(token);
        }
    }
}

impl TargetQueue for FakeQueue {
    unsafe fn submit_unchecked(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        // The fake touches no memory of the request: only its token.
        self.submit(*req)
    }

    fn leases(&self) -> &crate::hw::dma::Leases {
        &self.leases
    }

    fn leases_mut(&mut self) -> crate::hw::dma::LeasesMut<'_> {
        crate::hw::dma::LeasesMut::new(&mut self.leases)
    }

    fn submit(&mut self, req: IoRequest) -> Result<(), SubmitError> {
        let held = self.outstanding();
        if held as usize >= self.depth {
            return Err(SubmitError::Busy(Busy {
                request: req,
                in_flight: held,
                queued: self.queued.len() as u32,
            }));
        }
        self.log.lock().unwrap().given.push(req.token);
        self.queued.push_back(req.token);
        Ok(())
    }

    fn flush(&mut self) {
        self.at_device.extend(self.queued.drain(..).map(|t| (t, 1)));
    }

    fn poll(&mut self, max: u32, done: &mut dyn FnMut(Completion)) -> u32 {
        for (token, left) in std::mem::take(&mut self.at_device) {
            match left {
                0 => self.ready.push_back(Completion {
                    token,
                    result: Ok(()),
                    value: 0,
                }),
                n => self.at_device.push((token, n - 1)),
            }
        }
        let mut n = 0;
        while n < max {
            let Some(c) = self.ready.pop_front() else {
                break;
            };
            self.log.lock().unwrap().delivered.push(c);
            done(c);
            n += 1;
        }
        n
    }

    fn outstanding(&self) -> u32 {
        (self.queued.len() + self.at_device.len() + self.ready.len()) as u32
    }

    fn stats(&self) -> QueueStats {
        QueueStats::default()
    }

    fn cancel_queued(&mut self, token: u64) -> bool {
        self.note_cancel(token);
        let Some(i) = self.queued.iter().position(|&t| t == token) else {
            return false;
        };
        self.queued.remove(i);
        self.ready.push_back(Completion {
            token,
            result: Err(IoError::Cancelled),
            value: 0,
        });
        true
    }

    fn abort(&mut self, token: u64) -> AbortOutcome {
        self.note_cancel(token);
        let Some(i) = self.at_device.iter().position(|&(t, _)| t == token) else {
            return AbortOutcome::NotFound;
        };
        self.at_device.remove(i);
        self.ready.push_back(Completion {
            token,
            result: Err(IoError::Aborted),
            value: 0,
        });
        AbortOutcome::Aborted
    }
}

/// A poller on core 0 with one queue and one context's rings (ring identifier 0).
fn poller(queue: FakeQueue, end: PollerEnd, shared: Arc<PollerShared>) -> Poller {
    Poller {
        core: 0,
        budget: 4,
        queues: vec![Box::new(queue)],
        dirty: vec![false],
        chans: vec![Some(Chan {
            end,
            stalled: None,
            cancelled: Vec::new(),
            in_queue: 0,
            posted: false,
            overflow: Vec::new(),
        })],
        free_ids: Vec::new(),
        rr: 0,
        shared,
        report: PollerReport::default(),
        warned_invalid: false,
        epoll: None,
    }
}

/// Where the cancelled request was when the poller took its cancel, as the end state
/// shows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Found {
    /// In the submission ring: completed as cancelled when taken.
    InRing,
    /// Held back by the full queue: completed as cancelled at once.
    Stalled,
    /// At the device: aborted.
    Aborted,
    /// Already completed: its own result (too late).
    Done,
}

/// The context submits `count` requests in one batch (one publish) on a queue of
/// `depth`, then cancels the one at `victim`; see the module documentation. Returns
/// every place the model found the cancelled request in.
fn model_cancel(count: u32, depth: usize, victim: u32) -> BTreeSet<Found> {
    let seen = Arc::new(Mutex::new(BTreeSet::new()));
    let seen_in = Arc::clone(&seen);
    crate::aio::sync::model(move || {
        let log = Arc::new(Mutex::new(Log::default()));
        let queue = FakeQueue {
            depth,
            queued: VecDeque::new(),
            at_device: Vec::new(),
            ready: VecDeque::new(),
            log: Arc::clone(&log),
            leases: crate::hw::dma::Leases::new(&crate::hw::dma::DmaPool::new(
                std::sync::Arc::new(crate::hw::dma::IdentityMapper),
                crate::hw::dma::DmaPoolOptions::default(),
            )),
        };
        let shared = Arc::new(PollerShared {
            core: 0,
            notify: Notify::new().expect("an eventfd"),
            attach: Mutex::new(Vec::new()),
            attach_pending: AtomicBool::new(false),
            stop: AtomicBool::new(false),
        });
        let ctx = Arc::new(ContextShared::new().expect("an eventfd"));
        let (mut sq, sq_c) = spsc::channel::<Msg>(4);
        let (mut cancels, cancels_c) = spsc::channel::<CancelMsg>(4);
        let (cq_p, mut cq) = spsc::channel::<Completion>(4);
        let end = PollerEnd {
            sq: sq_c,
            cancels: cancels_c,
            cq: cq_p,
            ctx,
        };
        let mut p = poller(queue, end, Arc::clone(&shared));
        let racing = thread::spawn(move || {
            for _ in 0..RACING_PASSES {
                p.pass();
            }
            p
        });

        // The context: what submit and cancel put on the rings.
        let tokens: Vec<u64> = (0..count).map(|slot| context_token(slot, 1)).collect();
        for &token in &tokens {
            let req = IoRequest::flush(1, token);
            sq.push(Msg { target: 0, req }).expect("room in the ring");
        }
        sq.publish();
        shared.notify.wake_if_sleeping();
        let victim = tokens[victim as usize];
        cancels
            .send(CancelMsg {
                target: 0,
                token: victim,
            })
            .expect("room in the cancel ring");
        shared.notify.wake_if_sleeping();
        let mut got: Vec<Completion> = std::iter::from_fn(|| cq.pop()).collect();

        let mut p = racing.join().unwrap();
        for _ in 0..16 {
            p.pass();
        }
        got.extend(std::iter::from_fn(|| cq.pop()));
        let found = check(&p, &log.lock().unwrap(), &tokens, victim, got);
        seen_in.lock().unwrap().insert(found);
    });
    let seen = seen.lock().unwrap().clone();
    seen
}

/// The checks of the module documentation; returns where the cancel found its request.
fn check(p: &Poller, log: &Log, tokens: &[u64], victim: u64, got: Vec<Completion>) -> Found {
    assert!(
        log.asked_unseen.is_empty(),
        "a cancel reached the queue before its request (not found in the submission ring or held back): {:x?}",
        log.asked_unseen
    );
    for &token in tokens {
        let mine: Vec<&Completion> = got.iter().filter(|c| c.token == token).collect();
        assert_eq!(
            mine.len(),
            1,
            "token {token:#x}: {} completions reached the context, want exactly 1: {got:?}",
            mine.len()
        );
        let full = with_ring(token, 0);
        let from_queue: Vec<&Completion> =
            log.delivered.iter().filter(|c| c.token == full).collect();
        if log.given.contains(&full) {
            assert_eq!(
                from_queue.len(),
                1,
                "token {token:#x}: the queue completed it once"
            );
            assert_eq!(mine[0].result, from_queue[0].result, "token {token:#x}");
        } else {
            assert_eq!(
                token, victim,
                "only the cancelled request may skip the queue"
            );
            assert_eq!(mine[0].result, Err(IoError::Cancelled));
        }
    }
    assert_eq!(got.len(), tokens.len(), "no stray completions: {got:?}");
    assert!(got.iter().all(|c| context_part(c.token) == c.token));
    let c = p.chans[0].as_ref().unwrap();
    assert!(c.stalled.is_none() && c.cancelled.is_empty() && c.overflow.is_empty());
    assert_eq!(c.in_queue, 0);
    assert_eq!((p.report.bogus, p.report.cq_overflow), (0, 0));
    assert_eq!(p.queues[0].outstanding(), 0);
    let given = log.given.contains(&with_ring(victim, 0));
    match got.iter().find(|c| c.token == victim).map(|c| c.result) {
        _ if !given && p.report.queue_busy > 0 => Found::Stalled,
        _ if !given => Found::InRing,
        Some(Err(IoError::Aborted)) => Found::Aborted,
        _ => Found::Done,
    }
}

/// One request and its cancel: the poller finds the cancel with the request still in
/// the ring, at the device (aborted), or after it completed (too late).
#[test]
fn loom_cancel_races_its_completion() {
    let seen = model_cancel(1, 4, 0);
    for want in [Found::InRing, Found::Aborted, Found::Done] {
        assert!(
            seen.contains(&want),
            "the model never reached {want:?}: {seen:?}"
        );
    }
}

/// Two requests on a queue of one: the second is held back (stalled) by the full queue
/// when its cancel may come, or still in the ring, or given to the queue after the
/// first completes.
#[test]
fn loom_cancel_of_a_request_held_back_by_a_full_queue() {
    let seen = model_cancel(2, 1, 1);
    for want in [Found::InRing, Found::Stalled, Found::Aborted] {
        assert!(
            seen.contains(&want),
            "the model never reached {want:?}: {seen:?}"
        );
    }
}

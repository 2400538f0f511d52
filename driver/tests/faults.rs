//! The fault matrix: each fault the emulated controller can inject, for reads and writes,
//! at queue depth 1 and 128, checking the promise: every submitted I/O completes exactly
//! once, with the right outcome; no tracker is leaked; completed writes read back; and
//! failed I/Os wrote nowhere else (the whole region is verified against a shadow copy).

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kestrel::emu::{EmuConfig, EmuController, EmuNamespace, EmuStore};
use kestrel::emu::{FaultAction, FaultPlan, FaultRule, FaultTarget};
use kestrel::io::{Completion, IoError, IoRequest};
use kestrel::spec::{nvm_opc, Status};
use kestrel::target::TargetQueue;
use kestrel::{Controller, ControllerOptions, DmaSlice, IoQpair, QpairOptions};

const BS: usize = 4096;
const BLOCKS: u64 = 2048;
const IOS: u64 = 400;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fault {
    RetryableStatus,
    DnrStatus,
    Delay,
    Drop,
    Duplicate,
    Spurious,
    ControllerFatal,
    SurpriseRemoval,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Op {
    Read,
    Write,
}

fn block_pattern(lba: u64, gen: u64) -> Vec<u8> {
    let mut v = vec![0u8; BS];
    v[..8].copy_from_slice(&lba.to_le_bytes());
    v[8..16].copy_from_slice(&gen.to_le_bytes());
    let mut x =
        lba.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ gen.wrapping_mul(0xD6E8_FEB8_6659_FD93) | 1;
    for b in v[16..].iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    v
}

struct Rig {
    emu: Arc<EmuController>,
    _ctrlr: Controller,
    qp: IoQpair,
    /// One block each, lent to `qp`.
    bufs: Vec<DmaSlice>,
}

/// The I/O timeout of a case. Only a dropped completion should ever time out; every other
/// fault gets a bound far above any scheduling delay, so a loaded machine (the emulator
/// thread descheduled for a while) cannot turn a late completion into a timeout.
fn io_timeout(fault: Fault) -> Duration {
    match fault {
        // Long enough that a retried command is not late on a loaded machine; each of
        // the (at most two) dropped completions costs a timeout and an abort timeout.
        Fault::Drop => Duration::from_millis(1500),
        _ => Duration::from_secs(20),
    }
}

fn rig(qd: u32, depth: u32, timeout: Duration) -> Rig {
    let emu = EmuController::start(EmuConfig {
        namespaces: vec![EmuNamespace::new(
            BLOCKS * BS as u64,
            BS as u32,
            EmuStore::Memory,
        )],
        ..Default::default()
    })
    .unwrap();
    let ctrlr = Controller::new(
        emu.clone(),
        ControllerOptions {
            admin_timeout: Duration::from_secs(5),
            ..Default::default()
        },
    )
    .unwrap();
    let mut qp = ctrlr
        .create_io_qpair(&QpairOptions {
            depth,
            sw_queue_depth: 256,
            timeout,
            abort_timeout: timeout,
            ..Default::default()
        })
        .unwrap();
    let bufs = (0..qd)
        .map(|_| common::lend(&mut qp, ctrlr.dma_pool(), BS))
        .collect();
    Rig {
        emu,
        _ctrlr: ctrlr,
        qp,
        bufs,
    }
}

/// Writes generation 0 everywhere, with no faults.
fn prefill(r: &mut Rig) -> Vec<Vec<u8>> {
    let mut shadow = Vec::new();
    let buf = common::lend(&mut r.qp, r._ctrlr.dma_pool(), 64 * BS);
    for chunk in 0..BLOCKS / 64 {
        for i in 0..64 {
            let lba = chunk * 64 + i;
            let p = block_pattern(lba, 0);
            r.qp.write_lent(&buf, i as usize * BS, &p).unwrap();
            shadow.push(p);
        }
        let req = IoRequest::write(1, chunk * 64, 64, buf, chunk);
        assert_eq!(common::complete_one(&mut r.qp, req), Ok(()));
    }
    shadow
}

fn plan(fault: Fault, op: Op) -> FaultPlan {
    let opc = match op {
        Op::Read => nvm_opc::READ,
        Op::Write => nvm_opc::WRITE,
    };
    let rule = |action, rate: f64| FaultRule::new(FaultTarget::Io(opc), action).rate(rate);
    let mut p = FaultPlan {
        seed: 42,
        ..Default::default()
    };
    match fault {
        Fault::RetryableStatus => p
            .rules
            .push(rule(FaultAction::Status(Status::INTERNAL_ERROR), 0.3)),
        Fault::DnrStatus => {
            let s = match op {
                Op::Read => Status::UNRECOVERED_READ_ERROR,
                Op::Write => Status::WRITE_FAULT,
            };
            p.rules
                .push(rule(FaultAction::Status(s.with_dnr(true)), 0.2));
        }
        Fault::Delay => p
            .rules
            .push(rule(FaultAction::Delay(Duration::from_millis(2)), 0.3)),
        Fault::Drop => p.rules.push(rule(FaultAction::Drop, 0.02).max(2)),
        Fault::Duplicate => p.rules.push(rule(FaultAction::Duplicate, 0.1)),
        Fault::Spurious => p.rules.push(rule(FaultAction::Spurious, 0.1)),
        Fault::ControllerFatal => p.fatal_after = Some(IOS / 4),
        Fault::SurpriseRemoval => p.remove_after = Some(IOS / 4),
    }
    p
}

fn run_case(fault: Fault, op: Op, qd: u32) {
    run_case_depth(fault, op, qd, 256, 128)
}

fn run_case_depth(fault: Fault, op: Op, qd: u32, depth: u32, per_poll: u32) {
    let mut r = rig(qd, depth, io_timeout(fault));
    let shadow = prefill(&mut r);
    r.emu.faults().set(plan(fault, op));
    let mut case = Case::new(fault, op, qd, shadow);
    case.run(&mut r, per_poll);
    r.emu.faults().clear();

    case.assert_each_completed_once(&mut r);
    if fault == Fault::SurpriseRemoval {
        case.assert_removal_failed_everything_at_once(&mut r);
    } else {
        case.assert_errors_match_the_fault(&r);
        case.assert_region_matches_the_shadow(&mut r);
    }
}

/// One case of the matrix: `IOS` single-block I/Os on distinct blocks, at most `qd` in
/// flight, and what they must leave behind.
struct Case {
    fault: Fault,
    op: Op,
    qd: u32,
    /// The contents every block must have.
    shadow: Vec<Vec<u8>>,
    /// Blocks a failed write may or may not have reached: old or new contents allowed.
    maybe: HashMap<u64, Vec<u8>>,
    free_bufs: Vec<usize>,
    /// token -> (buf, lba)
    inflight: HashMap<u64, (usize, u64)>,
    /// How many completions each token got.
    seen: HashMap<u64, u32>,
    results: Vec<(u64, Result<(), IoError>)>,
    /// The token of the next I/O.
    next: u64,
    removed_at: Option<Instant>,
    last_done: Instant,
}

impl Case {
    fn new(fault: Fault, op: Op, qd: u32, shadow: Vec<Vec<u8>>) -> Self {
        Case {
            fault,
            op,
            qd,
            shadow,
            maybe: HashMap::new(),
            free_bufs: (0..qd as usize).collect(),
            inflight: HashMap::new(),
            seen: HashMap::new(),
            results: Vec::new(),
            next: 0,
            removed_at: None,
            last_done: Instant::now(),
        }
    }

    /// Submits while buffers are free and reaps until every I/O has completed (or
    /// panics after 30 s, naming the I/Os stuck).
    fn run(&mut self, r: &mut Rig, per_poll: u32) {
        let (fault, op, qd) = (self.fault, self.op, self.qd);
        let deadline = Instant::now() + Duration::from_secs(30);
        while (self.results.len() as u64) < IOS {
            self.submit_while_buffers_are_free(r);
            r.qp.flush();
            let mut done = Vec::new();
            r.qp.process_completions(per_poll, &mut |c| done.push(c));
            for c in done {
                self.complete(r, c);
            }
            assert!(
                Instant::now() < deadline,
                "{fault:?} {op:?} qd {qd}: {} of {IOS} completed; stuck: {:?}; stats {:?}",
                self.results.len(),
                self.inflight.keys().collect::<Vec<_>>(),
                r.qp.stats()
            );
        }
    }

    fn submit_while_buffers_are_free(&mut self, r: &mut Rig) {
        while self.next < IOS && !self.free_bufs.is_empty() {
            let (b, next) = (self.free_bufs.pop().unwrap(), self.next);
            // Distinct blocks for every I/O, spread over the region.
            let lba = (next * 5) % BLOCKS;
            let req = match self.op {
                Op::Read => IoRequest::read(1, lba, 1, r.bufs[b], next),
                Op::Write => {
                    r.qp.write_lent(&r.bufs[b], 0, &block_pattern(lba, next + 1))
                        .unwrap();
                    IoRequest::write(1, lba, 1, r.bufs[b], next)
                }
            };
            r.qp.submit(req)
                .unwrap_or_else(|e| panic!("submit {next}: {e}"));
            self.inflight.insert(next, (b, lba));
            self.next += 1;
        }
    }

    /// Takes one completion: checks a read's data, records what a write left, frees its
    /// buffer.
    fn complete(&mut self, r: &Rig, c: Completion) {
        let (fault, op, qd) = (self.fault, self.op, self.qd);
        *self.seen.entry(c.token).or_insert(0) += 1;
        let (b, lba) = self.inflight.remove(&c.token).unwrap_or_else(|| {
            panic!(
                "completion for token {} that is not in flight ({fault:?} {op:?} qd {qd})",
                c.token
            )
        });
        match (op, &c.result) {
            (Op::Read, Ok(())) => {
                let got = common::lent_bytes(&r.qp, &r.bufs[b]);
                assert!(
                    got == self.shadow[lba as usize],
                    "read of lba {lba} returned wrong data ({fault:?} qd {qd})"
                );
            }
            (Op::Write, Ok(())) => self.shadow[lba as usize] = block_pattern(lba, c.token + 1),
            (Op::Write, Err(_)) => {
                self.maybe.insert(lba, block_pattern(lba, c.token + 1));
            }
            (Op::Read, Err(_)) => {}
        }
        if c.result == Err(IoError::DeviceRemoved) && self.removed_at.is_none() {
            self.removed_at = Some(Instant::now());
        }
        self.results.push((c.token, c.result));
        self.free_bufs.push(b);
        self.last_done = Instant::now();
    }

    fn errors(&self) -> Vec<&(u64, Result<(), IoError>)> {
        self.results.iter().filter(|(_, r)| r.is_err()).collect()
    }

    /// Exactly once, every one, and no tracker left behind.
    fn assert_each_completed_once(&self, r: &mut Rig) {
        assert_eq!(self.seen.len() as u64, IOS);
        assert!(
            self.seen.values().all(|&n| n == 1),
            "a completion was delivered twice"
        );
        common::assert_quiet(&mut r.qp);
        assert_eq!(r.qp.outstanding(), 0, "outstanding after quiesce");
        assert_eq!(r.qp.free_slots(), r.qp.slots(), "trackers leaked");
    }

    /// The errors each fault may cause, and the counters that prove it was injected.
    fn assert_errors_match_the_fault(&self, r: &Rig) {
        let fault = self.fault;
        let st = r.qp.stats();
        let errs = self.errors();
        let injected = r.emu.faults().injected();
        match fault {
            Fault::RetryableStatus => {
                assert!(injected > 0 && st.retries > 0, "{st:?}");
                for (t, e) in &errs {
                    assert!(
                        matches!(e, Err(IoError::Nvme(s)) if s.same_code(Status::INTERNAL_ERROR)),
                        "token {t}: {e:?}"
                    );
                }
            }
            Fault::DnrStatus => {
                assert_eq!(st.retries, 0, "dnr statuses must not be retried");
                assert_eq!(
                    errs.len() as u64,
                    injected,
                    "each injected error fails exactly its i/o"
                );
                assert!(injected > 0);
            }
            Fault::Delay
            | Fault::Duplicate
            | Fault::Spurious
            | Fault::Drop
            | Fault::ControllerFatal => {
                assert!(errs.is_empty(), "{fault:?}: errors {errs:?}");
                match fault {
                    Fault::Duplicate | Fault::Spurious => {
                        assert!(st.bogus_completions > 0, "{st:?}")
                    }
                    Fault::Drop => assert!(st.timeouts > 0, "{st:?}"),
                    _ => {}
                }
            }
            Fault::SurpriseRemoval => {
                unreachable!("see assert_removal_failed_everything_at_once")
            }
        }
    }

    /// After a surprise removal every failed I/O says so, all completed within 1 s of
    /// detection, and later submissions complete with `DeviceRemoved` too (the poller lives
    /// on). The region cannot be read back.
    fn assert_removal_failed_everything_at_once(&self, r: &mut Rig) {
        for (t, e) in &self.errors() {
            assert_eq!(*e, Err(IoError::DeviceRemoved), "token {t}");
        }
        let at = self.removed_at.expect("some i/o saw the removal");
        assert!(
            self.last_done.duration_since(at) < Duration::from_secs(1),
            "all i/o completed within 1 s of detection"
        );
        let req = IoRequest::read(1, 0, 1, r.bufs[0], 9999);
        assert_eq!(
            common::complete_one(&mut r.qp, req),
            Err(IoError::DeviceRemoved)
        );
    }

    /// The whole region against the shadow copy: completed writes read back, failed ones
    /// left their block old or new, and nothing else changed.
    fn assert_region_matches_the_shadow(&self, r: &mut Rig) {
        let buf = common::lend(&mut r.qp, r._ctrlr.dma_pool(), 64 * BS);
        let mut mismatches = HashSet::new();
        for chunk in 0..BLOCKS / 64 {
            common::fill_lent(&mut r.qp, &buf, 0xEE);
            let req = IoRequest::read(1, chunk * 64, 64, buf, 1_000_000 + chunk);
            assert_eq!(common::complete_one(&mut r.qp, req), Ok(()), "verify read");
            let v = common::lent_bytes(&r.qp, &buf);
            for i in 0..64u64 {
                let lba = chunk * 64 + i;
                let got = &v[i as usize * BS..(i as usize + 1) * BS];
                let ok = got == self.shadow[lba as usize].as_slice()
                    || self.maybe.get(&lba).is_some_and(|m| got == m.as_slice());
                if !ok {
                    mismatches.insert(lba);
                }
            }
        }
        let (fault, op, qd) = (self.fault, self.op, self.qd);
        assert!(
            mismatches.is_empty(),
            "{fault:?} {op:?} qd {qd}: blocks differ from the shadow copy: {mismatches:?}"
        );
    }
}

macro_rules! matrix {
    ($($name:ident: $fault:ident, $op:ident, $qd:expr;)*) => {
        $(
            #[test]
            fn $name() {
                run_case(Fault::$fault, Op::$op, $qd);
            }
        )*
    };
}

matrix! {
    retryable_status_read_qd1: RetryableStatus, Read, 1;
    retryable_status_read_qd128: RetryableStatus, Read, 128;
    retryable_status_write_qd1: RetryableStatus, Write, 1;
    retryable_status_write_qd128: RetryableStatus, Write, 128;
    dnr_status_read_qd1: DnrStatus, Read, 1;
    dnr_status_read_qd128: DnrStatus, Read, 128;
    dnr_status_write_qd1: DnrStatus, Write, 1;
    dnr_status_write_qd128: DnrStatus, Write, 128;
    delay_read_qd1: Delay, Read, 1;
    delay_read_qd128: Delay, Read, 128;
    delay_write_qd1: Delay, Write, 1;
    delay_write_qd128: Delay, Write, 128;
    drop_read_qd1: Drop, Read, 1;
    drop_read_qd128: Drop, Read, 128;
    drop_write_qd1: Drop, Write, 1;
    drop_write_qd128: Drop, Write, 128;
    duplicate_read_qd1: Duplicate, Read, 1;
    duplicate_read_qd128: Duplicate, Read, 128;
    duplicate_write_qd1: Duplicate, Write, 1;
    duplicate_write_qd128: Duplicate, Write, 128;
    spurious_read_qd1: Spurious, Read, 1;
    spurious_read_qd128: Spurious, Read, 128;
    spurious_write_qd1: Spurious, Write, 1;
    spurious_write_qd128: Spurious, Write, 128;
    controller_fatal_read_qd1: ControllerFatal, Read, 1;
    controller_fatal_read_qd128: ControllerFatal, Read, 128;
    controller_fatal_write_qd1: ControllerFatal, Write, 1;
    controller_fatal_write_qd128: ControllerFatal, Write, 128;
    surprise_removal_read_qd1: SurpriseRemoval, Read, 1;
    surprise_removal_read_qd128: SurpriseRemoval, Read, 128;
    surprise_removal_write_qd1: SurpriseRemoval, Write, 1;
    surprise_removal_write_qd128: SurpriseRemoval, Write, 128;
}

/// With every tracker busy (depth 33, 32 in flight) a freed CID is reused at once, so a
/// duplicate completion would complete its successor early (a read seeing stale data, a
/// write's buffer reused while the device still reads it) unless the SQ Head check
/// rejects it.
#[test]
fn duplicate_completions_with_every_tracker_busy() {
    // Few completions per pass, so a pass often ends between a completion and its
    // duplicate and the CID is reused before the duplicate is seen.
    run_case_depth(Fault::Duplicate, Op::Write, 32, 33, 4);
    run_case_depth(Fault::Duplicate, Op::Read, 32, 33, 4);
}

#[test]
fn qpair_error_injection_without_the_device() {
    let (_emu, c) = common::emu();
    let mut qp = c.create_io_qpair(&QpairOptions::default()).unwrap();
    let buf = common::lend(&mut qp, c.dma_pool(), BS);
    // Complete two reads without submitting them, and rewrite one write's status.
    assert!(qp.inject_error(kestrel::nvme::qpair::ErrorInjection {
        opcode: Some(nvm_opc::READ),
        status: Status::UNRECOVERED_READ_ERROR.with_dnr(true),
        count: 2,
        submit: false,
    }));
    assert!(qp.inject_error(kestrel::nvme::qpair::ErrorInjection {
        opcode: Some(nvm_opc::WRITE),
        status: Status::WRITE_FAULT.with_dnr(true),
        count: 1,
        submit: true,
    }));
    for i in 0..3 {
        qp.submit(IoRequest::read(1, i, 1, buf, i)).unwrap();
    }
    qp.submit(IoRequest::write(1, 9, 1, buf, 10)).unwrap();
    qp.submit(IoRequest::write(1, 9, 1, buf, 11)).unwrap();
    qp.flush();
    let mut done = common::reap(&mut qp, 5);
    done.sort_by_key(|c| c.token);
    let err = |s: Status| Err(IoError::Nvme(s.with_dnr(true)));
    assert_eq!(done[0].result, err(Status::UNRECOVERED_READ_ERROR));
    assert_eq!(done[1].result, err(Status::UNRECOVERED_READ_ERROR));
    assert_eq!(done[2].result, Ok(()));
    assert_eq!(done[3].result, err(Status::WRITE_FAULT));
    assert_eq!(done[4].result, Ok(()));
    // Only three commands reached the device: the third read and the two writes.
    assert_eq!(qp.stats().commands, 3);
    assert_eq!(qp.stats().sq_doorbell_writes, 1);
    assert_eq!(qp.free_slots(), qp.slots());
}

#[test]
fn explicit_reset_with_io_in_flight() {
    let (_emu, c) = common::emu();
    let mut qp = c.create_io_qpair(&QpairOptions::default()).unwrap();
    let buf = common::lend(&mut qp, c.dma_pool(), 64 * BS);
    qp.write_lent(&buf, 0, &common::pattern(64 * BS, 3))
        .unwrap();
    for i in 0..64u64 {
        qp.submit(IoRequest::write(
            1,
            i,
            1,
            buf.slice(i as usize * BS, BS).unwrap(),
            i,
        ))
        .unwrap();
    }
    qp.flush();
    c.reset().unwrap();
    assert_eq!(c.state(), kestrel::nvme::ctrlr::CtrlrState::Ready);
    // Submissions after the reset queue until the qpair has recreated its queues.
    qp.submit(IoRequest::flush(1, 100)).unwrap();
    let done = common::reap(&mut qp, 65);
    assert!(done.iter().all(|c| c.result.is_ok()), "{done:?}");
    let r = common::lend(&mut qp, c.dma_pool(), 64 * BS);
    qp.submit(IoRequest::read(1, 0, 64, r, 200)).unwrap();
    qp.flush();
    assert_eq!(common::reap(&mut qp, 1)[0].result, Ok(()));
    assert!(
        common::lent_bytes(&qp, &r) == common::lent_bytes(&qp, &buf),
        "data written around the reset reads back"
    );
    assert_eq!(qp.free_slots(), qp.slots());
}

#[test]
fn retry_waits_for_the_command_retry_delay() {
    // CRD 1 selects CRDT1, which the emulator reports as 100 ms.
    let (emu, c) = common::emu();
    assert_eq!(c.identify().crdt[0], 1);
    let mut qp = c.create_io_qpair(&QpairOptions::default()).unwrap();
    let buf = common::lend(&mut qp, c.dma_pool(), BS);
    emu.faults().add(
        FaultRule::new(
            FaultTarget::Io(nvm_opc::READ),
            FaultAction::Status(Status::NAMESPACE_NOT_READY.with_crd(1)),
        )
        .max(1),
    );
    let start = Instant::now();
    qp.submit(IoRequest::read(1, 0, 1, buf, 1)).unwrap();
    qp.flush();
    let done = common::reap(&mut qp, 1);
    let took = start.elapsed();
    assert_eq!(
        done[0].result,
        Ok(()),
        "retried after the delay and succeeded"
    );
    assert_eq!(qp.stats().retries, 1);
    assert!(
        took >= Duration::from_millis(100),
        "retried before CRDT1 passed: {took:?}"
    );
}

/// A qpair on the default emulator with an I/O timeout of `timeout`.
fn timed_qpair(timeout: Duration) -> (Arc<EmuController>, Controller, IoQpair) {
    let (emu, c) = common::emu();
    let qp = c
        .create_io_qpair(&QpairOptions {
            timeout,
            ..Default::default()
        })
        .unwrap();
    (emu, c, qp)
}

/// A lost completion with a 500 ms timeout: found late after 500 ms (never before), the
/// Abort finds nothing at the device, the controller is reset and the read resubmitted;
/// not after the 30 s default (the upper bound is loose: a loaded machine may stall).
#[test]
fn a_lost_completion_is_recovered_within_the_timeout_set() {
    let (emu, c, mut qp) = timed_qpair(Duration::from_millis(500));
    assert_eq!(qp.timeout(), Duration::from_millis(500));
    assert_eq!(qp.tick(), Duration::from_millis(100));
    let buf = common::lend(&mut qp, c.dma_pool(), BS);
    emu.faults()
        .add(FaultRule::new(FaultTarget::Io(nvm_opc::READ), FaultAction::Drop).max(1));
    let start = Instant::now();
    qp.submit(IoRequest::read(1, 0, 1, buf, 1)).unwrap();
    qp.flush();
    let done = common::reap(&mut qp, 1);
    let took = start.elapsed();
    assert_eq!(done[0].result, Ok(()), "resubmitted after the reset");
    let st = qp.stats();
    assert_eq!((st.timeouts, st.aborts, st.resets), (1, 1, 1), "{st:?}");
    assert_eq!(c.resets(), 1);
    assert!(
        took >= Duration::from_millis(500),
        "timed out before its timeout: {took:?}"
    );
    assert!(
        took < Duration::from_secs(15),
        "the 500 ms timeout was not honoured: {took:?}"
    );
}

/// A qpair from [`timed_qpair`] with one read at the device whose completion the controller holds back for 60 s
/// (far past any timeout here); the read's buffer is lent to the queue, which keeps it
/// while the read is outstanding, and its slice is returned.
fn held_read(
    (emu, c, mut qp): (Arc<EmuController>, Controller, IoQpair),
) -> (Arc<EmuController>, Controller, IoQpair, DmaSlice) {
    let buf = common::lend(&mut qp, c.dma_pool(), BS);
    emu.faults().add(
        FaultRule::new(
            FaultTarget::Io(nvm_opc::READ),
            FaultAction::Delay(Duration::from_secs(60)),
        )
        .max(1),
    );
    qp.submit(IoRequest::read(1, 0, 1, buf, 1)).unwrap();
    qp.flush();
    (emu, c, qp, buf)
}

/// A command the controller holds past the timeout is aborted, and the Abort wins: the
/// I/O completes with `Timeout` (not retried), no reset.
#[test]
fn a_held_command_is_aborted_and_completes_as_timed_out() {
    let (_emu, c, mut qp, _buf) = held_read(timed_qpair(Duration::from_secs(1)));
    let done = common::reap(&mut qp, 1);
    assert_eq!(done[0].result, Err(IoError::Timeout));
    let st = qp.stats();
    assert_eq!((st.timeouts, st.aborts, st.resets), (1, 1, 0), "{st:?}");
    assert_eq!(c.resets(), 0);
    assert_eq!(qp.free_slots(), qp.slots());
}

/// The same when the expiry is seen late (the polling thread descheduled for several
/// timeouts after its clock had moved past the submission): the command is aborted, and
/// the abort gets its own timeout period; the controller is not reset at once, which would
/// discard the aborted completion already in the CQ and retry the read (here, successfully:
/// the delay fires once), reporting a timed-out command as a success.
#[test]
fn a_held_command_seen_late_is_aborted_not_reset_and_retried() {
    let (_emu, c, mut qp, _buf) = held_read(timed_qpair(Duration::from_millis(500)));
    // Poll long enough for the coarse clock to move past the submission's tick (two
    // ticks), without the command reaching its timeout...
    let start = Instant::now();
    while start.elapsed() < qp.tick() * 2 + qp.tick() / 2 {
        qp.process_completions(8, &mut |c| panic!("completed early: {c:?}"));
    }
    // ...then stop polling for three timeouts, as a descheduled thread would.
    std::thread::sleep(Duration::from_millis(1500));
    let done = common::reap(&mut qp, 1);
    assert_eq!(done[0].result, Err(IoError::Timeout));
    let st = qp.stats();
    assert_eq!(
        (st.timeouts, st.aborts, st.resets, st.retries),
        (1, 1, 0, 0),
        "{st:?}"
    );
    assert_eq!(c.resets(), 0);
}

/// The qpair reads its coarse clock only while polling: a command submitted after a long
/// pause in polling must not be taken as submitted before the pause and time out early.
#[test]
fn a_pause_in_polling_does_not_time_out_a_new_command() {
    let (emu, c, mut qp) = timed_qpair(Duration::from_secs(2));
    let buf = common::lend(&mut qp, c.dma_pool(), BS);
    // Poll enough for a clock read, then pause for more than two timeouts.
    qp.submit(IoRequest::read(1, 0, 1, buf, 1)).unwrap();
    qp.flush();
    common::reap(&mut qp, 1);
    for _ in 0..200 {
        qp.process_completions(8, &mut |_| {});
    }
    std::thread::sleep(Duration::from_secs(5));
    emu.faults().add(
        FaultRule::new(
            FaultTarget::Io(nvm_opc::READ),
            FaultAction::Delay(Duration::from_millis(100)),
        )
        .max(1),
    );
    qp.submit(IoRequest::read(1, 0, 1, buf, 2)).unwrap();
    qp.flush();
    let done = common::reap(&mut qp, 1);
    assert_eq!(done[0].result, Ok(()));
    assert_eq!(qp.stats().timeouts, 0, "{:?}", qp.stats());
}

/// Polls `r`'s qpair until `n` completions were delivered and `bogus` completions were
/// counted in all (at most 10 s); returns the completions.
fn poll_until(r: &mut Rig, n: usize, bogus: u64) -> Vec<Completion> {
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while (out.len() < n || r.qp.stats().bogus_completions < bogus) && Instant::now() < deadline {
        r.qp.process_completions(64, &mut |c| out.push(c));
    }
    assert_eq!(out.len(), n, "completions within 10 s: {out:?}");
    out
}

/// Completions whose CID names no outstanding command, beyond the qpair's trackers up to
/// 0xFFFF (and one free tracker's), posted while writes are in flight: each is counted as
/// bogus and ignored, in a release build as in a debug one (the reaping path looks a CID
/// up with a checked access, never an unchecked index), and the writes complete once each
/// and read back.
#[test]
fn completions_for_cids_beyond_the_trackers_are_counted_and_ignored() {
    const N: u64 = 8;
    let mut r = rig(N as u32, 64, Duration::from_secs(5));
    let slots = r.qp.slots() as u16;
    let bogus = [
        slots,
        slots + 1,
        63,
        4095,
        4096,
        0x7FFF,
        0xFFFE,
        0xFFFF,
        slots - 1,
    ];
    let before = r.qp.stats().bogus_completions;
    for i in 0..N {
        r.qp.write_lent(&r.bufs[i as usize], 0, &block_pattern(i, 7))
            .unwrap();
        let req = IoRequest::write(1, i, 1, r.bufs[i as usize], i);
        r.qp.submit(req).unwrap();
    }
    for &cid in &bogus {
        let cqe = kestrel::spec::Cqe {
            dw0: 0xDEAD_BEEF,
            dw1: 0,
            sqhd: 0,
            sqid: r.qp.qid(),
            cid,
            status: 0,
        };
        assert!(r.emu.faults().post_raw_cqe(r.qp.qid(), cqe));
    }
    r.qp.flush();
    let done = poll_until(&mut r, N as usize, before + bogus.len() as u64);
    let tokens: HashSet<u64> = done.iter().map(|c| c.token).collect();
    assert_eq!(tokens.len() as u64, N, "each write once: {done:?}");
    assert!(done.iter().all(|c| c.result.is_ok()), "{done:?}");
    let st = r.qp.stats();
    assert_eq!(st.bogus_completions - before, bogus.len() as u64, "{st:?}");
    common::assert_quiet(&mut r.qp);
    assert_eq!(r.qp.outstanding(), 0);
    assert_eq!(r.qp.free_slots(), r.qp.slots(), "trackers leaked");
    for i in 0..N {
        common::fill_lent(&mut r.qp, &r.bufs[i as usize], 0);
        let req = IoRequest::read(1, i, 1, r.bufs[i as usize], 100 + i);
        assert_eq!(common::complete_one(&mut r.qp, req), Ok(()));
        assert!(
            common::lent_bytes(&r.qp, &r.bufs[i as usize]) == block_pattern(i, 7),
            "lba {i} reads back"
        );
    }
}

//! The driver's completion path (`kestrel::IoQpair::process_completions`) fed arbitrary
//! completion queue entries on a live queue pair: unknown CIDs, CIDs of commands in
//! flight (early and duplicate completions), every status value, any dwords.
//!
//! One emulated controller and one qpair (depth 64) serve the whole run: the driver
//! brings the controller up and creates the qpair while the emulator's thread runs, then
//! the emulator is paused (`EmuController::pause`) and the target runs each controller
//! pass itself (`EmuController::step`), so the interleaving of submissions, injected
//! CQEs (`EmuFaults::post_raw_cqe`), controller passes and reaping is the input's and
//! replays exactly.
//!
//! Each input has two phases:
//! 1. Quiet: with nothing outstanding, up to 16 injected CQEs (any CID and status).
//!    Every one must be counted in `bogus_completions` and none may complete anything.
//! 2. Live: up to 16 real reads and writes and up to 16 injected CQEs, in an order the
//!    input chooses, with controller passes and reaping between them. An injected CQE
//!    whose CID is in flight completes that command as the device said (the driver cannot
//!    tell), and the real CQE that follows is then unknown.
//!
//! Invariants: nothing panics; every real I/O completes exactly once (its token is seen
//! once); `outstanding()` returns to 0; every CQE the driver reaped is accounted for, as
//! a completion, a retry or a bogus completion (`bogus + completed + retries` grows by
//! exactly the CQEs posted: each command the driver pushed, plus each injected one), so
//! the bogus count is exactly the CQEs that matched no outstanding CID; and afterwards a
//! write and a read-back of fresh data work.
//!
//! Injected statuses have CRD cleared: a Command Retry Delay of 100–500 ms (the
//! emulator's CRDT) would only make inputs slow. With at most 32 commands and CQEs per
//! input against 63 trackers, the SQ cannot overflow even when early completions free
//! trackers whose commands are still at the device.
#![no_main]

use std::sync::{Arc, Mutex, OnceLock};

use arbitrary::Arbitrary;
use kestrel::emu::{EmuConfig, EmuController, EmuNamespace, EmuStore};
use kestrel::spec::Cqe;
use kestrel::{Controller, ControllerOptions, DmaSlice, IoQpair, IoRequest, QpairOptions};
use libfuzzer_sys::fuzz_target;

const DEPTH: u32 = 64;
const MAX_IOS: usize = 16;
const MAX_INJECT: usize = 16;
const MAX_SCHEDULE: usize = 128;
/// Blocks of the data buffer: one 4-block slot per real I/O, and a spare for the final
/// check.
const SLOT_BLOCKS: usize = 4;
const BLOCK: usize = 4096;
/// Controller passes and polls the drain may take before the target calls it a hang.
const DRAIN_ROUNDS: usize = 256;
const CRD_MASK: u16 = 0x3 << 12;

#[derive(Arbitrary, Debug)]
struct Io {
    write: bool,
    /// LBA of the first block (masked to 0..64).
    lba: u8,
    /// Blocks (masked to 1..=4).
    nlb: u8,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Cid {
    /// The CID of the n-th real I/O submitted so far (modulo their number): in flight, or
    /// completed already (then the CQE is a duplicate). Found with `IoQpair::cid_of`, so
    /// an input targets the same commands wherever the qpair's CID rotation stands.
    Io(u8),
    /// A small CID (modulo 64: also 63, which no tracker of a depth-64 qpair has).
    Low(u8),
    /// Any CID.
    Any(u16),
}

#[derive(Arbitrary, Debug, Clone, Copy)]
struct Raw {
    cid: Cid,
    /// Status halfword (the phase bit is the controller's; CRD is cleared).
    status: u16,
    dw0: u32,
    dw1: u32,
    sqhd: u16,
    sqid: u16,
}

#[derive(Arbitrary, Debug, Clone, Copy)]
enum Step {
    Submit,
    Inject,
    Pass,
    Poll,
}

#[derive(Arbitrary, Debug)]
struct Input {
    quiet: Vec<Raw>,
    ios: Vec<Io>,
    injects: Vec<Raw>,
    schedule: Vec<Step>,
}

struct State {
    emu: Arc<EmuController>,
    qp: IoQpair,
    /// The data buffer, lent to `qp`.
    buf: DmaSlice,
    seq: u64,
    _ctrlr: Controller,
}

impl State {
    fn new() -> State {
        let emu = EmuController::start(EmuConfig {
            namespaces: vec![EmuNamespace::new(16 << 20, BLOCK as u32, EmuStore::Memory)],
            ..Default::default()
        })
        .expect("emulator starts");
        let ctrlr = Controller::new(emu.clone(), ControllerOptions::default()).expect("bring-up");
        let mut qp = ctrlr
            .create_io_qpair(&QpairOptions {
                depth: DEPTH,
                ..Default::default()
            })
            .expect("qpair");
        let buf = ctrlr
            .dma_pool()
            .alloc((MAX_IOS + 2) * SLOT_BLOCKS * BLOCK)
            .expect("data buffer");
        let buf = qp.lend(buf).expect("lend the data buffer");
        assert!(emu.pause(), "the controller thread stops");
        State {
            emu,
            qp,
            buf,
            seq: 0,
            _ctrlr: ctrlr,
        }
    }

    fn inject(&self, r: &Raw, cids: &[u16]) {
        let cid = match r.cid {
            Cid::Io(n) if !cids.is_empty() => cids[n as usize % cids.len()],
            Cid::Io(n) | Cid::Low(n) => (n % 64) as u16,
            Cid::Any(c) => c,
        };
        let cqe = Cqe {
            dw0: r.dw0,
            dw1: r.dw1,
            sqhd: r.sqhd,
            sqid: r.sqid,
            cid,
            status: r.status & !CRD_MASK,
        };
        assert!(
            self.emu.faults().post_raw_cqe(self.qp.qid(), cqe),
            "raw CQE queue full"
        );
    }

    fn poll(&mut self, seen: &mut [u32]) -> u32 {
        self.qp.process_completions(128, &mut |c| {
            let t = c.token as usize;
            assert!(t < seen.len(), "completion with unknown token {}", c.token);
            seen[t] += 1;
            assert_eq!(seen[t], 1, "token {t} completed twice: {:?}", c.result);
        })
    }
}

static STATE: OnceLock<Mutex<State>> = OnceLock::new();

fuzz_target!(|input: Input| {
    let mut s = STATE
        .get_or_init(|| Mutex::new(State::new()))
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    assert_eq!(
        s.qp.outstanding(),
        0,
        "an earlier input left I/O outstanding"
    );

    // Phase 1: nothing outstanding; every injected CQE is bogus.
    let quiet = &input.quiet[..input.quiet.len().min(MAX_INJECT)];
    let before = s.qp.stats();
    for r in quiet {
        s.inject(r, &[]);
    }
    let mut none: [u32; 0] = [];
    for _ in 0..4 {
        s.emu.step(false);
        s.poll(&mut none);
    }
    let st = s.qp.stats();
    assert_eq!(
        st.bogus_completions - before.bogus_completions,
        quiet.len() as u64,
        "with nothing outstanding, every CQE is bogus"
    );
    assert_eq!(
        st.completed, before.completed,
        "a bogus CQE completed something"
    );
    assert_eq!(s.qp.outstanding(), 0);

    // Phase 2: real I/O and injected CQEs, interleaved as the input says.
    let ios = &input.ios[..input.ios.len().min(MAX_IOS)];
    let injects = &input.injects[..input.injects.len().min(MAX_INJECT)];
    let before = s.qp.stats();
    let raw_before = s.emu.stats().raw_cqes;
    let mut seen = vec![0u32; ios.len()];
    let mut cids: Vec<u16> = Vec::with_capacity(ios.len());
    let (mut next_io, mut next_inject) = (0usize, 0usize);
    let submit = |s: &mut State, cids: &mut Vec<u16>, i: usize| {
        let io = &ios[i];
        let lba = (io.lba % 64) as u64;
        let nlb = (io.nlb % SLOT_BLOCKS as u8) as u32 + 1;
        let slice = s
            .buf
            .slice(i * SLOT_BLOCKS * BLOCK, nlb as usize * BLOCK)
            .expect("slot inside the buffer");
        let req = if io.write {
            IoRequest::write(1, lba, nlb, slice, i as u64)
        } else {
            IoRequest::read(1, lba, nlb, slice, i as u64)
        };
        s.qp.submit(req).expect("63 trackers hold 16 requests");
        cids.push(s.qp.cid_of(i as u64).expect("at the device"));
    };
    for step in input.schedule.iter().take(MAX_SCHEDULE) {
        match step {
            Step::Submit if next_io < ios.len() => {
                submit(&mut s, &mut cids, next_io);
                next_io += 1;
            }
            Step::Inject if next_inject < injects.len() => {
                s.inject(&injects[next_inject], &cids);
                next_inject += 1;
            }
            Step::Pass => {
                s.qp.flush();
                s.emu.step(false);
            }
            Step::Poll => {
                s.poll(&mut seen);
            }
            _ => {}
        }
    }
    while next_io < ios.len() {
        submit(&mut s, &mut cids, next_io);
        next_io += 1;
    }
    while next_inject < injects.len() {
        s.inject(&injects[next_inject], &cids);
        next_inject += 1;
    }
    s.qp.flush();

    // Drain: until every CQE posted (each command pushed, each injected) is reaped.
    let mut rounds = 0;
    loop {
        s.emu.step(false);
        s.poll(&mut seen);
        let st = s.qp.stats();
        let reaped = (st.bogus_completions - before.bogus_completions)
            + (st.completed - before.completed)
            + (st.retries - before.retries);
        let posted = (st.commands - before.commands) + injects.len() as u64;
        assert!(reaped <= posted, "reaped {reaped} CQEs of {posted} posted");
        if reaped == posted && s.qp.outstanding() == 0 {
            assert_eq!(
                s.emu.stats().raw_cqes - raw_before,
                injects.len() as u64,
                "every injected CQE was posted"
            );
            break;
        }
        rounds += 1;
        assert!(
            rounds < DRAIN_ROUNDS,
            "not drained after {DRAIN_ROUNDS} passes: outstanding {}, reaped {reaped} of {posted} CQEs, stats {st:?}",
            s.qp.outstanding()
        );
    }
    assert!(
        seen.iter().all(|&n| n == 1),
        "every real I/O completes exactly once: {seen:?}"
    );

    // A real I/O still works: fresh data written and read back, and no CQE is left over.
    let bogus = s.qp.stats().bogus_completions;
    s.seq += 1;
    let base = MAX_IOS * SLOT_BLOCKS * BLOCK;
    let data: Vec<u8> = (0..BLOCK)
        .map(|i| (i as u64 ^ s.seq.wrapping_mul(0x9E37_79B9)) as u8)
        .collect();
    let buf = s.buf;
    s.qp.leases_mut()
        .write(&buf, base, &data)
        .expect("in buffer");
    s.qp.leases_mut()
        .write(&buf, base + BLOCK, &[0u8; BLOCK])
        .expect("in buffer");
    let (w, r) = (
        s.buf.slice(base, BLOCK).expect("in buffer"),
        s.buf.slice(base + BLOCK, BLOCK).expect("in buffer"),
    );
    let mut done = Vec::new();
    s.qp.submit(IoRequest::write(1, 100, 1, w, 0))
        .expect("submit");
    for _ in 0..DRAIN_ROUNDS {
        s.qp.flush();
        s.emu.step(false);
        s.qp.process_completions(128, &mut |c| done.push(c));
        if !done.is_empty() {
            break;
        }
    }
    s.qp.submit(IoRequest::read(1, 100, 1, r, 1))
        .expect("submit");
    for _ in 0..DRAIN_ROUNDS {
        s.qp.flush();
        s.emu.step(false);
        s.qp.process_completions(128, &mut |c| done.push(c));
        if done.len() == 2 {
            break;
        }
    }
    assert_eq!(done.len(), 2, "the final write and read: {done:?}");
    assert!(
        done.iter()
            .enumerate()
            .all(|(i, c)| c.token == i as u64 && c.result.is_ok()),
        "{done:?}"
    );
    let mut back = vec![0u8; BLOCK];
    s.qp.leases()
        .read(&buf, base + BLOCK, &mut back)
        .expect("in buffer");
    assert!(back == data, "the final read returned other data");
    assert_eq!(s.qp.outstanding(), 0);
    assert_eq!(s.qp.stats().bogus_completions, bogus, "a CQE was left over");
});

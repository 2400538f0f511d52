//! Helpers shared by the integration tests: an emulated controller brought up by the
//! driver, and ways to wait for completions.
#![allow(dead_code)]

pub mod aio_ctx;

use std::sync::Arc;
use std::time::{Duration, Instant};

use kestrel::emu::{EmuConfig, EmuController};
use kestrel::hw::dma::{DmaPool, DmaSlice};
use kestrel::io::{Completion, IoError, IoRequest};
use kestrel::target::TargetQueue;
use kestrel::{Controller, ControllerOptions, IoQpair};

pub const WAIT: Duration = Duration::from_secs(20);

/// The emulator and a controller brought up on it; shadow doorbells (off by default in
/// the driver) are configured when the emulator offers them, so the tests keep covering
/// them.
pub fn emu_with(cfg: EmuConfig) -> (Arc<EmuController>, Controller) {
    let opts = ControllerOptions {
        shadow_doorbells: cfg.shadow_doorbells,
        ..Default::default()
    };
    let emu = EmuController::start(cfg).expect("start emulator");
    let ctrlr = Controller::new(emu.clone(), opts).expect("bring-up");
    (emu, ctrlr)
}

pub fn emu() -> (Arc<EmuController>, Controller) {
    emu_with(EmuConfig::default())
}

/// Polls `qp` with the driver's `IoQpair::drain` until the `n` requests it has
/// outstanding (all of them) have completed, and returns their completions; panics when
/// `n` is not what is outstanding, or with the queue's state when they have not completed
/// within WAIT.
pub fn reap(qp: &mut IoQpair, n: usize) -> Vec<Completion> {
    let outstanding = qp.outstanding() as usize;
    assert_eq!(outstanding, n, "reap of {n} with {outstanding} outstanding");
    let mut out = Vec::with_capacity(n);
    let left = qp.drain(WAIT, &mut |c| out.push(c));
    assert!(
        left == 0 && out.len() == n,
        "only {} of {n} completions within {WAIT:?} (qid {}, {left} outstanding, {}, stats {:?})",
        out.len(),
        qp.qid(),
        qp.doorbell_state(),
        qp.stats()
    );
    out
}

/// Submits one request, rings the doorbell and waits for its completion: its result.
pub fn complete_one(qp: &mut IoQpair, req: IoRequest) -> Result<(), IoError> {
    qp.submit(req).unwrap();
    qp.flush();
    reap(qp, 1)[0].result
}

/// Polls one more short while and asserts nothing else completes.
pub fn assert_quiet(qp: &mut IoQpair) {
    let mut extra = Vec::new();
    let deadline = Instant::now() + Duration::from_millis(50);
    while Instant::now() < deadline {
        qp.process_completions(128, &mut |c| extra.push(c));
        std::thread::yield_now();
    }
    assert!(extra.is_empty(), "unexpected completions: {extra:?}");
}

/// Allocates `len` bytes of `pool` and lends them to `q`: the slice requests carry.
pub fn lend<Q: TargetQueue + ?Sized>(q: &mut Q, pool: &DmaPool, len: usize) -> DmaSlice {
    let buf = pool
        .alloc(len)
        .unwrap_or_else(|e| panic!("alloc {len}: {e}"));
    q.lend(buf).unwrap_or_else(|e| panic!("lend {len}: {e}"))
}

/// The bytes of the lent slice `s`.
pub fn lent_bytes<Q: TargetQueue + ?Sized>(q: &Q, s: &DmaSlice) -> Vec<u8> {
    let mut v = vec![0u8; s.len()];
    q.read_lent(s, 0, &mut v).unwrap();
    v
}

/// Sets every byte of the lent slice `s` to `byte`.
pub fn fill_lent<Q: TargetQueue + ?Sized>(q: &mut Q, s: &DmaSlice, byte: u8) {
    q.write_lent(s, 0, &vec![byte; s.len()]).unwrap();
}

/// A deterministic byte pattern for (lba, generation).
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

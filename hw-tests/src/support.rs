//! What the cases share: qpairs, reaping completions, data patterns, the namespace a
//! case does its I/O on, status checks (write, read back and compare: `verify`).

use std::time::{Duration, Instant};

use kestrel::io::{Completion, IoError, IoRequest};
use kestrel::spec::{Sqe, Status};
use kestrel::{Controller, DmaBuf, IoQpair, QpairOptions};

use crate::CaseError;

pub(crate) const WAIT: Duration = Duration::from_secs(30);
/// LBAs the suite may overwrite on a real device: the first 64 MiB of each namespace it
/// does I/O to.
pub(crate) const SCRATCH_BYTES: u64 = 64 << 20;

pub(crate) fn qpair(c: &Controller, depth: u32) -> Result<IoQpair, String> {
    c.create_io_qpair(&QpairOptions {
        depth,
        ..Default::default()
    })
    .map_err(|e| e.to_string())
}

/// Polls `qp` until the `n` requests it has outstanding (all of them) have completed,
/// with the driver's `IoQpair::drain`, and returns their completions; an error with the
/// queue's state when they have not within [`WAIT`].
pub(crate) fn reap(qp: &mut IoQpair, n: usize) -> Result<Vec<Completion>, String> {
    let mut out = Vec::with_capacity(n);
    let left = qp.drain(WAIT, &mut |c| out.push(c));
    if left == 0 && out.len() >= n {
        return Ok(out);
    }
    let why = if left > 0 {
        format!("within {WAIT:?}")
    } else {
        "and nothing else outstanding".into()
    };
    Err(format!(
        "only {} of {n} completions {why} (qid {}, {} in flight, {}, stats {:?})",
        out.len(),
        qp.qid(),
        qp.in_flight(),
        qp.doorbell_state(),
        qp.stats()
    ))
}

pub(crate) fn quiet(qp: &mut IoQpair) -> Result<(), String> {
    let mut extra = Vec::new();
    let deadline = Instant::now() + Duration::from_millis(50);
    while Instant::now() < deadline {
        qp.process_completions(128, &mut |c| extra.push(c));
        std::thread::yield_now();
    }
    ensure!(extra.is_empty(), "completions nobody asked for: {extra:?}");
    Ok(())
}

pub(crate) fn all_ok(done: &[Completion]) -> Result<(), String> {
    for c in done {
        ensure!(c.result.is_ok(), "token {} failed: {:?}", c.token, c.result);
    }
    Ok(())
}

pub(crate) fn run_one(qp: &mut IoQpair, req: IoRequest) -> Result<Result<(), IoError>, String> {
    qp.submit(req).map_err(|e| e.to_string())?;
    qp.flush();
    Ok(reap(qp, 1)?[0].result)
}

pub(crate) fn pattern(len: usize, seed: u64) -> Vec<u8> {
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

pub(crate) struct Ns {
    pub(crate) bs: usize,
    pub(crate) blocks: u64,
    pub(crate) nsze: u64,
    pub(crate) deallocated_reads_zeroes: bool,
}

/// The namespace a case does its I/O on: a namespace whose format the driver refuses
/// (or none at all: nsid 0) makes the case a skip with the refusal as the reason.
pub(crate) fn ns_of(c: &Controller, nsid: u32) -> Result<Ns, CaseError> {
    if nsid == 0 {
        return Err(CaseError::Skip(no_io_namespace(c)));
    }
    let ns = c.namespace(nsid).map_err(|e| e.to_string())?;
    if let Some(u) = &ns.unsupported {
        return Err(CaseError::Skip(u.to_string()));
    }
    if ns.protection.required() {
        return Err(CaseError::Skip(format!(
            "nsid {nsid}: the format needs metadata with every read and write ({}); the \
             suite's data path cases send none (kestrel perf --verify and driver/tests/\
             formats.rs cover this format)",
            ns.protection.describe()
        )));
    }
    if ns.zones.is_some() {
        return Err(CaseError::Skip(format!(
            "nsid {nsid} is a zoned namespace: writes go at the zones' write pointers (the zoned_* cases cover it)"
        )));
    }
    Ok(Ns {
        bs: ns.block_size as usize,
        blocks: ns.num_blocks.min(SCRATCH_BYTES / ns.block_size as u64),
        nsze: ns.num_blocks,
        deallocated_reads_zeroes: ns.identify.deallocated_reads_zeroes(),
    })
}

/// Why a controller has no namespace for the I/O cases.
pub(crate) fn no_io_namespace(c: &Controller) -> String {
    if c.namespaces().is_empty() {
        return "the controller has no active namespace".into();
    }
    let why: Vec<String> = c
        .namespaces()
        .iter()
        .filter_map(|n| n.unsupported.as_ref().map(|u| u.to_string()))
        .collect();
    format!(
        "kestrel does i/o to none of the active namespaces: {}",
        why.join(" | ")
    )
}

pub(crate) fn mdts(c: &Controller) -> u64 {
    c.max_transfer_bytes()
        .min(kestrel::nvme::qpair::DEFAULT_MAX_COMMAND_BYTES)
}

pub(crate) fn alloc(c: &Controller, len: usize) -> Result<DmaBuf, String> {
    c.dma_pool().alloc(len).map_err(|e| e.to_string())
}

pub(crate) fn expect_nvme(r: Result<(), IoError>, want: Status, what: &str) -> Result<(), String> {
    match r {
        Err(IoError::Nvme(s)) if s.same_code(want) => Ok(()),
        other => Err(format!("{what}: expected {want}, got {other:?}")),
    }
}

pub(crate) fn raw_status(
    c: &Controller,
    sqe: Sqe,
    data: Option<kestrel::DmaSlice>,
) -> Result<Result<(), IoError>, String> {
    let mut qp = qpair(c, 8)?;
    let before = qp.doorbell_state();
    qp.submit_raw(sqe, data, 5).map_err(|e| e.to_string())?;
    let mid = qp.doorbell_state();
    qp.flush();
    let after = qp.doorbell_state();
    Ok(reap(&mut qp, 1)
        .map_err(|e| format!("{e}; before: {before}; submitted: {mid}; flushed: {after}"))?[0]
        .result)
}

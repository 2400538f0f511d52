//! What the cases share: qpairs, the buffers lent to them (a buffer of the controller's
//! DMA pool is lent to the qpair that submits with it, and its bytes are reached through
//! that qpair), reaping completions, data patterns, the namespace a case does its I/O on,
//! status checks (write, read back and compare: `verify`).

use std::time::{Duration, Instant};

use kestrel::io::{Completion, IoError, IoRequest};
use kestrel::spec::{Sqe, Status};
use kestrel::{Controller, DmaBuf, DmaSlice, IoQpair, QpairOptions};

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

/// `len` bytes of the controller's DMA memory, lent to `qp` (which owns them from then on
/// and frees them when it is dropped): the slice requests on `qp` carry.
pub(crate) fn lent(c: &Controller, qp: &mut IoQpair, len: usize) -> Result<DmaSlice, String> {
    qp.lend(alloc(c, len)?).map_err(|e| e.to_string())
}

/// Copies `data` into the slice `s` lent to `qp`, at its byte `off`.
pub(crate) fn put(qp: &mut IoQpair, s: &DmaSlice, off: usize, data: &[u8]) -> Result<(), String> {
    qp.leases_mut()
        .write(s, off, data)
        .map_err(|e| e.to_string())
}

/// Sets every byte of the slice `s` lent to `qp` to `byte`.
pub(crate) fn fill(qp: &mut IoQpair, s: &DmaSlice, byte: u8) -> Result<(), String> {
    put(qp, s, 0, &vec![byte; s.len()])
}

/// The bytes of the slice `s` lent to `qp`.
pub(crate) fn contents(qp: &IoQpair, s: &DmaSlice) -> Result<Vec<u8>, String> {
    let mut out = vec![0u8; s.len()];
    qp.leases()
        .read(s, 0, &mut out)
        .map_err(|e| e.to_string())?;
    Ok(out)
}

/// Gives the buffer of `s` back from `qp` (nothing may be outstanding on it).
pub(crate) fn reclaim(qp: &mut IoQpair, s: &DmaSlice) -> Result<DmaBuf, String> {
    qp.reclaim(s)
        .map_err(|e| format!("reclaiming a buffer from qid {}: {e}", qp.qid()))
}

pub(crate) fn expect_nvme(r: Result<(), IoError>, want: Status, what: &str) -> Result<(), String> {
    match r {
        Err(IoError::Nvme(s)) if s.same_code(want) => Ok(()),
        other => Err(format!("{what}: expected {want}, got {other:?}")),
    }
}

/// The status of the raw command `sqe`, without data, on a fresh qpair.
pub(crate) fn raw_status(c: &Controller, sqe: Sqe) -> Result<Result<(), IoError>, String> {
    let mut qp = qpair(c, 8)?;
    raw_on(&mut qp, sqe, None)
}

/// The status of the raw command `sqe` on a fresh qpair, its data pointer the first `len`
/// bytes of `buf` (lent to that qpair for the command); `buf` comes back with the status,
/// reclaimed once the command completed, for the next queue to use.
pub(crate) fn raw_status_with(
    c: &Controller,
    sqe: Sqe,
    buf: DmaBuf,
    len: usize,
) -> Result<(Result<(), IoError>, DmaBuf), String> {
    let mut qp = qpair(c, 8)?;
    let s = qp.lend(buf).map_err(|e| e.to_string())?;
    let data = s.slice(0, len).map_err(|e| e.to_string())?;
    let r = raw_on(&mut qp, sqe, Some(data))?;
    Ok((r, reclaim(&mut qp, &s)?))
}

fn raw_on(
    qp: &mut IoQpair,
    sqe: Sqe,
    data: Option<DmaSlice>,
) -> Result<Result<(), IoError>, String> {
    let before = qp.doorbell_state();
    // SAFETY: the suite's raw commands (`raw_status`, `raw_status_with`) carry no address
    // of their own (their SQEs are built with zero PRPs and MPTR), and each describes a
    // transfer that fits `data` when it has one (one command of at most `data`'s length,
    // checked by its case) or that the controller refuses before any transfer (an invalid
    // opcode, namespace or LBA range: what those cases test). `data` is lent to `qp`,
    // which keeps it until the completion is reaped below.
    unsafe { qp.submit_raw(sqe, data, 5) }.map_err(|e| e.to_string())?;
    let mid = qp.doorbell_state();
    qp.flush();
    let after = qp.doorbell_state();
    Ok(reap(qp, 1)
        .map_err(|e| format!("{e}; before: {before}; submitted: {mid}; flushed: {after}"))?[0]
        .result)
}

//! The cases that apply to any block target, run through the `Target` trait: an NVMe
//! namespace (emulated, or through VFIO) and the io_uring file target alike.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kestrel::io::{Completion, InvalidRequest, IoOp, IoRequest, SubmitError};
use kestrel::target::{QueueOptions, Target, TargetQueue};
use kestrel::{Controller, ControllerOptions, DmaSlice, NvmeNamespace};

use crate::support::pattern;
use crate::{CaseReport, Device, Outcome};

/// Something that opens a fresh target for each case.
#[derive(Clone, Debug)]
pub enum TargetKind {
    /// Namespace 1 of a controller on `Device`.
    Nvme(Device),
    /// A file (created sparse at 64 MiB if missing), with direct I/O when the file system
    /// allows it (`direct`: require it).
    File {
        /// Path of the file.
        path: PathBuf,
        /// Require direct I/O.
        direct: bool,
    },
}

impl TargetKind {
    /// A short name for the results table.
    pub fn name(&self) -> String {
        match self {
            TargetKind::Nvme(d) => format!("{}/ns1", d.name()),
            TargetKind::File { path, direct } => {
                format!(
                    "file:{}{}",
                    path.display(),
                    if *direct { "" } else { "(auto)" }
                )
            }
        }
    }

    fn open(&self) -> Result<Arc<dyn Target>, String> {
        match self {
            TargetKind::Nvme(d) => {
                let c: Controller = Controller::new(d.transport()?, ControllerOptions::default())
                    .map_err(|e| e.to_string())?;
                // The first namespace whose format the driver implements (the others are
                // listed by the identify cases, and refused for I/O).
                let nsid = c.io_namespaces().next().map(|n| n.nsid).ok_or_else(|| {
                    match c.namespaces().first() {
                        Some(n) => format!(
                            "no namespace kestrel can do i/o to: {}",
                            n.unsupported
                                .as_ref()
                                .map_or(String::new(), |u| u.to_string())
                        ),
                        None => "no active namespace".to_string(),
                    }
                })?;
                Ok(Arc::new(
                    NvmeNamespace::new(c, nsid).map_err(|e| e.to_string())?,
                ))
            }
            TargetKind::File { path, direct } => {
                let opts = kestrel::target::file::FileOptions {
                    size: Some(64 << 20),
                    direct: if *direct {
                        kestrel::target::file::Direct::Required
                    } else {
                        kestrel::target::file::Direct::Auto
                    },
                    ..Default::default()
                };
                let t = kestrel::target::file::FileTarget::open(path, &opts)
                    .map_err(|e| e.to_string())?;
                Ok(t)
            }
        }
    }
}

type TargetCase = fn(&dyn Target) -> Result<Outcome, String>;

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+));
        }
    };
}

const WAIT: Duration = Duration::from_secs(30);

fn queue(t: &dyn Target, depth: u32, sw: u32) -> Result<Box<dyn TargetQueue>, String> {
    t.create_queue(&QueueOptions {
        depth,
        sw_queue_depth: sw,
        ..Default::default()
    })
    .map_err(|e| e.to_string())
}

fn reap(q: &mut dyn TargetQueue, n: usize) -> Result<Vec<Completion>, String> {
    let mut out = Vec::with_capacity(n);
    let deadline = Instant::now() + WAIT;
    while out.len() < n {
        q.flush();
        if q.poll(128, &mut |c| out.push(c)) == 0 {
            std::thread::yield_now();
        }
        ensure!(
            Instant::now() < deadline,
            "only {} of {n} completions within {WAIT:?}",
            out.len()
        );
    }
    Ok(out)
}

/// `len` bytes of the target's DMA memory, lent to `q` (which owns them from then on and
/// frees them when it is dropped): the slice requests on `q` carry.
fn lent(t: &dyn Target, q: &mut dyn TargetQueue, len: usize) -> Result<DmaSlice, String> {
    let buf = t.dma_pool().alloc(len).map_err(|e| e.to_string())?;
    q.lend(buf).map_err(|e| e.to_string())
}

/// Copies `data` into the slice `s` lent to `q`, at its byte `off`.
fn put(q: &mut dyn TargetQueue, s: &DmaSlice, off: usize, data: &[u8]) -> Result<(), String> {
    q.write_lent(s, off, data).map_err(|e| e.to_string())
}

/// Sets every byte of the slice `s` lent to `q` to `byte`.
fn fill(q: &mut dyn TargetQueue, s: &DmaSlice, byte: u8) -> Result<(), String> {
    put(q, s, 0, &vec![byte; s.len()])
}

/// The bytes of the slice `s` lent to `q`.
fn contents(q: &dyn TargetQueue, s: &DmaSlice) -> Result<Vec<u8>, String> {
    let mut out = vec![0u8; s.len()];
    q.read_lent(s, 0, &mut out).map_err(|e| e.to_string())?;
    Ok(out)
}

fn one(q: &mut dyn TargetQueue, req: IoRequest) -> Result<(), String> {
    q.submit(req).map_err(|e| e.to_string())?;
    let c = reap(q, 1)?;
    c[0].result
        .map_err(|e| format!("{:?} of {} blocks at lba {}: {e}", req.op, req.nlb, req.lba))
}

fn t_rw_sizes(t: &dyn Target) -> Result<Outcome, String> {
    let info = t.info().clone();
    let bs = info.block_size as usize;
    let mut q = queue(t, 32, 64)?;
    let max = (1 << 20)
        .min(info.max_transfer_bytes as usize * 4)
        .max(bs * 8);
    let w = lent(t, &mut *q, max)?;
    let r = lent(t, &mut *q, max)?;
    let mut lba = 0u64;
    for blocks in [1usize, 2, 3, 8, 17, max / bs] {
        let len = blocks * bs;
        let data = pattern(len, lba + 7);
        put(&mut *q, &w, 0, &data)?;
        one(
            &mut *q,
            IoRequest::write(info.nsid, lba, blocks as u32, w.slice(0, len).unwrap(), 1),
        )?;
        one(
            &mut *q,
            IoRequest::read(info.nsid, lba, blocks as u32, r.slice(0, len).unwrap(), 2),
        )?;
        let mut got = vec![0u8; len];
        q.read_lent(&r, 0, &mut got).map_err(|e| e.to_string())?;
        ensure!(
            got == data,
            "{blocks} blocks at lba {lba} did not read back"
        );
        lba += blocks as u64;
    }
    Ok(Outcome::Pass)
}

fn t_vectored(t: &dyn Target) -> Result<Outcome, String> {
    let info = t.info().clone();
    let bs = info.block_size as usize;
    let mut q = queue(t, 16, 16)?;
    let seg = 4096.max(bs);
    let a = lent(t, &mut *q, 2 * seg)?;
    let b = lent(t, &mut *q, seg)?;
    let data = pattern(3 * seg, 5);
    put(&mut *q, &a, 0, &data[..2 * seg])?;
    put(&mut *q, &b, 0, &data[2 * seg..])?;
    let nlb = (3 * seg / bs) as u32;
    let req = IoRequest::vectored(IoOp::Write, info.nsid, 100, nlb, &[a, b], 1)
        .ok_or("too many segments")?;
    one(&mut *q, req)?;
    let r = lent(t, &mut *q, 3 * seg)?;
    one(&mut *q, IoRequest::read(info.nsid, 100, nlb, r, 2))?;
    ensure!(
        contents(&*q, &r)? == data,
        "vectored write did not read back"
    );
    Ok(Outcome::Pass)
}

fn t_zeroes_discard_flush(t: &dyn Target) -> Result<Outcome, String> {
    let info = t.info().clone();
    let bs = info.block_size as usize;
    let mut q = queue(t, 16, 16)?;
    let buf = lent(t, &mut *q, 16 * bs)?;
    fill(&mut *q, &buf, 0x77)?;
    one(&mut *q, IoRequest::write(info.nsid, 200, 16, buf, 1))?;
    ensure!(info.write_zeroes, "target does not offer write zeroes");
    one(&mut *q, IoRequest::write_zeroes(info.nsid, 200, 4, 2))?;
    if info.deallocate {
        one(&mut *q, IoRequest::deallocate(info.nsid, 208, 8, 3))?;
    }
    one(&mut *q, IoRequest::flush(info.nsid, 4))?;
    fill(&mut *q, &buf, 0xFF)?;
    one(&mut *q, IoRequest::read(info.nsid, 200, 16, buf, 5))?;
    let v = contents(&*q, &buf)?;
    for (i, blk) in v.chunks(bs).enumerate() {
        let zero = i < 4;
        let dealloc = (8..16).contains(&i) && info.deallocate;
        if zero {
            ensure!(
                blk.iter().all(|&x| x == 0),
                "block {i} after write zeroes is not zero"
            );
        } else if dealloc {
            // Deallocation is advisory: old data, or zeroes where the target says so.
            let old = blk.iter().all(|&x| x == 0x77);
            let zeroes = blk.iter().all(|&x| x == 0);
            ensure!(
                old || (zeroes && info.deallocate_reads_zeroes),
                "block {i} after deallocate is neither old data nor zeroes"
            );
        } else {
            ensure!(
                blk.iter().all(|&x| x == 0x77),
                "block {i} outside the ranges changed"
            );
        }
    }
    Ok(Outcome::Pass)
}

fn t_overflow_busy(t: &dyn Target) -> Result<Outcome, String> {
    let info = t.info().clone();
    let bs = info.block_size as usize;
    let depth = 16u32;
    let sw = 48u32;
    let mut q = queue(t, depth, sw)?;
    let buf = lent(t, &mut *q, bs)?;
    let mut accepted = 0u64;
    let mut busy = None;
    for i in 0..(4 * (depth + sw)) as u64 {
        match q.submit(IoRequest::read(info.nsid, i % 64, 1, buf, i)) {
            Ok(()) => accepted += 1,
            Err(SubmitError::Busy(b)) => {
                busy = Some(b);
                break;
            }
            Err(e) => return Err(format!("submit {i}: {e}")),
        }
    }
    let b = busy.ok_or("never Busy with every slot and the software queue full")?;
    ensure!(
        b.request.token == accepted,
        "busy did not hand back the refused request"
    );
    let done = reap(&mut *q, accepted as usize)?;
    let tokens: HashSet<u64> = done.iter().map(|c| c.token).collect();
    ensure!(
        tokens.len() as u64 == accepted && done.len() as u64 == accepted,
        "completions missing or repeated"
    );
    ensure!(
        done.iter().all(|c| c.result.is_ok()),
        "an overflowed read failed"
    );
    ensure!(
        q.outstanding() == 0,
        "{} still outstanding",
        q.outstanding()
    );
    Ok(Outcome::Pass)
}

fn t_mixed_verify(t: &dyn Target) -> Result<Outcome, String> {
    let info = t.info().clone();
    let bs = info.block_size as usize;
    let blocks = 128usize;
    let mut q = queue(t, 64, 256)?;
    let w = lent(t, &mut *q, blocks * bs)?;
    let mut shadow = vec![0u8; blocks];
    let base = 1000u64;
    // Start from known contents.
    fill(&mut *q, &w, 0)?;
    one(
        &mut *q,
        IoRequest::write(info.nsid, base, blocks as u32, w, 0),
    )?;
    let mut x = 99u64;
    for round in 1..=6u8 {
        let mut n = 0;
        for (blk, cur) in shadow.iter_mut().enumerate() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x % 2 == 0 {
                put(&mut *q, &w, blk * bs, &vec![round; bs])?;
                q.submit(IoRequest::write(
                    info.nsid,
                    base + blk as u64,
                    1,
                    w.slice(blk * bs, bs).unwrap(),
                    blk as u64,
                ))
                .map_err(|e| e.to_string())?;
                *cur = round;
                n += 1;
            }
        }
        let done = reap(&mut *q, n)?;
        ensure!(
            done.iter().all(|c| c.result.is_ok()),
            "a write failed in round {round}"
        );
    }
    let r = lent(t, &mut *q, blocks * bs)?;
    one(
        &mut *q,
        IoRequest::read(info.nsid, base, blocks as u32, r, 1),
    )?;
    let v = contents(&*q, &r)?;
    for (blk, want) in shadow.iter().enumerate() {
        ensure!(
            v[blk * bs..(blk + 1) * bs].iter().all(|b| b == want),
            "block {blk}: want {want}"
        );
    }
    Ok(Outcome::Pass)
}

fn t_bad_input(t: &dyn Target) -> Result<Outcome, String> {
    let info = t.info().clone();
    let bs = info.block_size as usize;
    let mut q = queue(t, 8, 8)?;
    let buf = lent(t, &mut *q, bs)?;
    let bad = [
        IoRequest::read(info.nsid, info.num_blocks, 1, buf, 1),
        IoRequest::read(info.nsid, 0, 0, buf, 2),
        IoRequest::read(info.nsid, 0, 2, buf, 3),
    ];
    for req in bad {
        match q.submit(req) {
            Err(SubmitError::Invalid { token, .. }) => {
                ensure!(token == req.token, "wrong token in the error")
            }
            other => {
                return Err(format!(
                    "request {req:?} was not refused before submission: {other:?}"
                ))
            }
        }
    }
    // The ownership rule: a read into a buffer lent to another queue, or one given back,
    // is refused as not lent, before it reaches the device or the kernel.
    let mut other = queue(t, 8, 8)?;
    let elsewhere = lent(t, &mut *other, bs)?;
    let back = lent(t, &mut *q, bs)?;
    drop(q.reclaim(&back).map_err(|e| e.to_string())?);
    for (s, token, what) in [
        (elsewhere, 4, "lent to another queue"),
        (back, 5, "reclaimed"),
    ] {
        match q.submit(IoRequest::read(info.nsid, 0, 1, s, token)) {
            Err(SubmitError::Invalid {
                token: t,
                reason: InvalidRequest::NotLent { .. },
            }) => ensure!(t == token, "wrong token in the error"),
            other => {
                return Err(format!(
                    "a read into a buffer {what} was not refused as not lent: {other:?}"
                ))
            }
        }
    }
    ensure!(q.outstanding() == 0, "a refused request is outstanding");
    Ok(Outcome::Pass)
}

/// The target cases, by name.
pub fn target_cases() -> Vec<(&'static str, TargetCase)> {
    vec![
        ("target_rw_sizes", t_rw_sizes as TargetCase),
        ("target_vectored", t_vectored),
        ("target_zeroes_discard_flush", t_zeroes_discard_flush),
        ("target_overflow_busy", t_overflow_busy),
        ("target_mixed_verify", t_mixed_verify),
        ("target_bad_input", t_bad_input),
    ]
}

/// Runs the target cases whose names contain `filter` against `kind`.
pub fn run_targets(kind: &TargetKind, filter: &str) -> Vec<CaseReport> {
    target_cases()
        .into_iter()
        .filter(|(n, _)| filter.is_empty() || n.contains(filter))
        .map(|(name, f)| {
            let start = Instant::now();
            let outcome = match std::panic::catch_unwind(|| kind.open().and_then(|t| f(t.as_ref())))
            {
                Ok(Ok(o)) => o,
                Ok(Err(why)) => Outcome::Fail(why),
                Err(_) => Outcome::Fail("panicked".into()),
            };
            CaseReport {
                name,
                target: kind.name(),
                outcome,
                elapsed: start.elapsed(),
            }
        })
        .collect()
}

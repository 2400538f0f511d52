//! The cases that apply to any block target, run through the `Target` trait: an NVMe
//! namespace (emulated, or through VFIO; every active namespace, in the form its format
//! needs) and the io_uring file target alike.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use kestrel::io::{InvalidRequest, IoMeta, IoOp, IoRequest, SubmitError};
use kestrel::target::{QueueOptions, Target, TargetQueue};
use kestrel::DmaSlice;

use crate::blocks::{Blocks, Check, Space, APP_TAG};
use crate::support::{all_ok, must, pattern, put, reap, with_wait, DEFAULT_WAIT};
use crate::verify::{read_compare, write_read};
use crate::{Case, CaseError, CaseReport, CaseResult, Need, NsDesc, Outcome, Run, Scope};

/// A case on a target: the target and its description.
pub type TargetCase = fn(&dyn Target, &NsDesc) -> CaseResult;

fn queue(t: &dyn Target, depth: u32, sw: u32) -> Result<Box<dyn TargetQueue>, String> {
    t.create_queue(&QueueOptions {
        depth,
        sw_queue_depth: sw,
        ..Default::default()
    })
    .map_err(|e| e.to_string())
}

fn t_rw_sizes(t: &dyn Target, ns: &NsDesc) -> CaseResult {
    let mut q = queue(t, 32, 64)?;
    let chunk = ns.chunk_blocks();
    let mut sizes = vec![1usize, 2, 3, 8, 17, chunk + 1, 4 * chunk];
    let most = ((1usize << 20) / ns.host_block()).max(8);
    sizes.retain(|&n| n <= most);
    if let Some(z) = ns.zones {
        let cap = z.capacity.unwrap_or(z.geometry.zone_size) as usize;
        sizes.retain(|&n| n <= chunk.min(cap));
    }
    sizes.sort_unstable();
    sizes.dedup();
    let max = *sizes.last().expect("1 is always there");
    let w = Blocks::lend(t.dma_pool(), &mut *q, ns, max)?;
    let r = Blocks::lend(t.dma_pool(), &mut *q, ns, max)?;
    let mut space = Space::at(ns, 0);
    for blocks in sizes {
        let lba = space.take(t.dma_pool(), &mut *q, blocks as u64)?;
        write_read(
            &mut *q,
            ns,
            &w,
            &r,
            lba,
            &pattern(blocks * ns.block_size, lba + 7),
        )?;
    }
    Ok(Outcome::Pass)
}

fn t_vectored(t: &dyn Target, ns: &NsDesc) -> CaseResult {
    let mut q = queue(t, 16, 16)?;
    let seg = 4096.max(ns.block_size);
    // Three segments' worth of blocks (with their metadata, extended): two segments and
    // the rest.
    let hb = ns.host_block();
    let nlb = (3 * seg).div_ceil(hb);
    let total = nlb * hb;
    if ns.zoned() && nlb > ns.chunk_blocks() {
        return Err(CaseError::Skip(format!(
            "nsid {} is zoned and its writes are not split: a vectored write of {total} bytes is more than one command carries ({} bytes, MDTS)",
            ns.nsid,
            ns.chunk_blocks() * hb
        )));
    }
    let lent = |q: &mut dyn TargetQueue, n: usize| -> Result<DmaSlice, String> {
        let b = t.dma_pool().alloc(n).map_err(|e| e.to_string())?;
        q.lend(b).map_err(|e| e.to_string())
    };
    let a = lent(&mut *q, 2 * seg)?;
    let b = lent(&mut *q, total - 2 * seg)?;
    let md = match ns.md_block() * nlb {
        0 => DmaSlice::EMPTY,
        n => lent(&mut *q, n)?,
    };
    let lba = Space::at(ns, 100).take(t.dma_pool(), &mut *q, nlb as u64)?;
    let data = pattern(nlb * ns.block_size, 5);
    let (host, mdb) = ns.image(lba, &data);
    put(&mut *q, &a, 0, &host[..2 * seg])?;
    put(&mut *q, &b, 0, &host[2 * seg..])?;
    if !md.is_empty() {
        put(&mut *q, &md, 0, &mdb)?;
    }
    let meta = match &ns.meta {
        None => IoMeta::NONE,
        Some(m) => IoMeta::for_layout(m, md).with_tags(NsDesc::ref_tag(lba), APP_TAG, 0xFFFF),
    };
    let req = IoRequest::vectored(IoOp::Write, ns.nsid, lba, nlb as u32, &[a, b], 1)
        .ok_or("too many segments")?
        .with_meta(meta);
    must(&mut *q, req, "vectored write")?;
    let r = Blocks::lend(t.dma_pool(), &mut *q, ns, nlb)?;
    read_compare(&mut *q, ns, &r, lba, &data, "vectored write read back")?;
    Ok(Outcome::Pass)
}

fn t_zeroes_discard_flush(t: &dyn Target, ns: &NsDesc) -> CaseResult {
    let info = t.info().clone();
    let bs = ns.block_size;
    let mut q = queue(t, 16, 16)?;
    let b = Blocks::lend(t.dma_pool(), &mut *q, ns, 16)?;
    let lba = Space::at(ns, 200).take(t.dma_pool(), &mut *q, 16)?;
    let data = pattern(16 * bs, 0x77);
    ns.write(&mut *q, &b, lba, &data)?;
    must(
        &mut *q,
        IoRequest::write_zeroes(ns.nsid, lba, 4, 2),
        "write zeroes",
    )?;
    if info.deallocate {
        must(
            &mut *q,
            IoRequest::deallocate(ns.nsid, lba + 8, 8, 3),
            "deallocate",
        )?;
    }
    if info.flush {
        must(&mut *q, IoRequest::flush(ns.nsid, 4), "flush")?;
    }
    let dealloc = |i: usize| (8..16).contains(&i) && info.deallocate;
    let v = ns.read_with(&mut *q, &b, lba, 16, &|i| {
        Some(if i < 4 || dealloc(i) {
            Check::Controller
        } else {
            Check::Written
        })
    })?;
    for (i, blk) in v.chunks(bs).enumerate() {
        let old = blk == &data[i * bs..(i + 1) * bs];
        let zeroes = blk.iter().all(|&x| x == 0);
        if i < 4 {
            ensure!(zeroes, "block {i} after write zeroes is not zero");
        } else if dealloc(i) {
            // Deallocation is advisory: old data, or zeroes where the target says so.
            ensure!(
                old || (zeroes && info.deallocate_reads_zeroes),
                "block {i} after deallocate is neither old data nor zeroes"
            );
        } else {
            ensure!(old, "block {i} outside the ranges changed");
        }
    }
    Ok(Outcome::Pass)
}

fn t_overflow_busy(t: &dyn Target, ns: &NsDesc) -> CaseResult {
    let depth = 16u32;
    let sw = 48u32;
    let mut q = queue(t, depth, sw)?;
    // 64 blocks written first: the reads read only what was written.
    let w = Blocks::lend(t.dma_pool(), &mut *q, ns, 64)?;
    let base = Space::at(ns, 300).take(t.dma_pool(), &mut *q, 64)?;
    ns.write(&mut *q, &w, base, &pattern(64 * ns.block_size, 300))?;
    let b = Blocks::lend(t.dma_pool(), &mut *q, ns, 1)?;
    let mut accepted = 0u64;
    let mut busy = None;
    for i in 0..(4 * (depth + sw)) as u64 {
        match q.submit(ns.read_req(base + i % 64, &b, true, i)) {
            Ok(()) => accepted += 1,
            Err(SubmitError::Busy(b)) => {
                busy = Some(b);
                break;
            }
            Err(e) => return Err(format!("submit {i}: {e}").into()),
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
    all_ok(&done).map_err(|e| format!("an overflowed read failed: {e}"))?;
    ensure!(
        q.outstanding() == 0,
        "{} still outstanding",
        q.outstanding()
    );
    Ok(Outcome::Pass)
}

fn t_mixed_verify(t: &dyn Target, ns: &NsDesc) -> CaseResult {
    let bs = ns.block_size;
    let blocks = 128usize;
    let mut q = queue(t, 64, 256)?;
    let w = Blocks::lend(t.dma_pool(), &mut *q, ns, blocks)?;
    let mut shadow = vec![0u8; blocks];
    let base = Space::at(ns, 1000).take(t.dma_pool(), &mut *q, blocks as u64)?;
    // Start from known contents.
    ns.write(&mut *q, &w, base, &vec![0; blocks * bs])?;
    let mut x = 99u64;
    for round in 1..=6u8 {
        let mut n = 0;
        for (blk, cur) in shadow.iter_mut().enumerate() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x % 2 == 0 {
                let one = w.sub(ns, blk, 1)?;
                ns.stage(&mut *q, &one, base + blk as u64, &vec![round; bs])?;
                q.submit(ns.write_req(base + blk as u64, &one, blk as u64))
                    .map_err(|e| e.to_string())?;
                *cur = round;
                n += 1;
            }
        }
        all_ok(&reap(&mut *q, n)?).map_err(|e| format!("a write in round {round}: {e}"))?;
    }
    let r = Blocks::lend(t.dma_pool(), &mut *q, ns, blocks)?;
    let v = ns.read(&mut *q, &r, base, blocks)?;
    for (blk, want) in shadow.iter().enumerate() {
        ensure!(
            v[blk * bs..(blk + 1) * bs].iter().all(|b| b == want),
            "block {blk}: want {want}"
        );
    }
    Ok(Outcome::Pass)
}

fn t_bad_input(t: &dyn Target, ns: &NsDesc) -> CaseResult {
    let info = t.info().clone();
    let mut q = queue(t, 8, 8)?;
    let b = Blocks::lend(t.dma_pool(), &mut *q, ns, 1)?;
    let two = IoRequest::read(ns.nsid, 0, 2, b.data, 3).with_meta(ns.meta(&b, 0, true));
    let bad = [
        ns.read_req(info.num_blocks, &b, true, 1),
        IoRequest::read(ns.nsid, 0, 0, b.data, 2).with_meta(ns.meta(&b, 0, true)),
        two,
    ];
    for req in bad {
        match q.submit(req) {
            Err(SubmitError::Invalid { token, .. }) => {
                ensure!(token == req.token, "wrong token in the error")
            }
            other => {
                return Err(
                    format!("request {req:?} was not refused before submission: {other:?}").into(),
                )
            }
        }
    }
    // The ownership rule: a read into a buffer lent to another queue, or one given back,
    // is refused as not lent, before it reaches the device or the kernel.
    let mut other = queue(t, 8, 8)?;
    let elsewhere = Blocks::lend(t.dma_pool(), &mut *other, ns, 1)?;
    let back = Blocks::lend(t.dma_pool(), &mut *q, ns, 1)?;
    drop(q.reclaim(&back.data).map_err(|e| e.to_string())?);
    for (data, token, what) in [
        (elsewhere.data, 4, "lent to another queue"),
        (back.data, 5, "reclaimed"),
    ] {
        let s = Blocks { data, ..b };
        match q.submit(ns.read_req(0, &s, true, token)) {
            Err(SubmitError::Invalid {
                token: t,
                reason: InvalidRequest::NotLent { .. },
            }) => ensure!(t == token, "wrong token in the error"),
            other => {
                return Err(format!(
                    "a read into a buffer {what} was not refused as not lent: {other:?}"
                )
                .into())
            }
        }
    }
    ensure!(q.outstanding() == 0, "a refused request is outstanding");
    Ok(Outcome::Pass)
}

/// The target cases, as entries of the registry (namespace cases run through the
/// `Target` trait).
pub fn target_cases() -> Vec<Case> {
    use Need::*;
    const OVERWRITES: &str = "the case overwrites blocks";
    let t = |name, about, needs, f: TargetCase| Case {
        name,
        about,
        scope: Scope::Namespace,
        needs,
        run: Run::Target(f),
    };
    vec![
        t(
            "target_rw_sizes",
            "through the Target trait: write/read/verify of many sizes",
            &[Io],
            t_rw_sizes,
        ),
        t(
            "target_vectored",
            "through the Target trait: a vectored write read back",
            &[Io],
            t_vectored,
        ),
        t(
            "target_zeroes_discard_flush",
            "through the Target trait: write zeroes, deallocate, flush",
            &[
                Io,
                WriteZeroes,
                Conventional("it zeroes and deallocates written blocks"),
            ],
            t_zeroes_discard_flush,
        ),
        t(
            "target_overflow_busy",
            "through the Target trait: the software queue, then Busy",
            &[Io],
            t_overflow_busy,
        ),
        t(
            "target_mixed_verify",
            "through the Target trait: random overwrites verified",
            &[Io, Conventional(OVERWRITES)],
            t_mixed_verify,
        ),
        t(
            "target_bad_input",
            "through the Target trait: bad requests and buffers not lent refused",
            &[Io, Queues(2)],
            t_bad_input,
        ),
    ]
}

/// A file target for the target cases.
#[derive(Clone, Debug)]
pub struct FileTarget {
    /// Path of the file (created sparse at 64 MiB if missing).
    pub path: PathBuf,
    /// Require direct I/O (else where the file system allows it).
    pub direct: bool,
}

impl FileTarget {
    /// A short name for the results table.
    pub fn name(&self) -> String {
        format!(
            "file:{}{}",
            self.path.display(),
            if self.direct { "" } else { "(auto)" }
        )
    }

    fn open(&self) -> Result<Arc<dyn Target>, String> {
        let opts = kestrel::target::file::FileOptions {
            size: Some(64 << 20),
            direct: if self.direct {
                kestrel::target::file::Direct::Required
            } else {
                kestrel::target::file::Direct::Auto
            },
            ..Default::default()
        };
        let t = kestrel::target::file::FileTarget::open(&self.path, &opts)
            .map_err(|e| e.to_string())?;
        Ok(t)
    }
}

/// Runs the target cases whose names contain `filter` against the file `f` (each case
/// opens it afresh and drops it).
pub fn run_file(f: &FileTarget, filter: &str) -> Vec<CaseReport> {
    target_cases()
        .into_iter()
        .filter(|c| filter.is_empty() || c.name.contains(filter))
        .map(|c| {
            let start = Instant::now();
            let Run::Target(run) = c.run else {
                unreachable!("target cases run on targets")
            };
            let r = std::panic::catch_unwind(|| {
                with_wait(DEFAULT_WAIT, || -> CaseResult {
                    let t = f.open()?;
                    let ns = NsDesc::of_target(t.info());
                    run(t.as_ref(), &ns)
                })
            });
            CaseReport {
                name: c.name,
                target: f.name(),
                nsid: None,
                outcome: crate::harness::outcome_of(r),
                elapsed: start.elapsed(),
            }
        })
        .collect()
}

/// Runs the target cases whose names contain `filter` against every namespace a target
/// string names that the suite's controller cases do not cover (a `tcp:` subsystem, or any
/// string the library opens): each case opens the target afresh and drops it.
pub fn run_spec(spec: &str, filter: &str) -> Vec<CaseReport> {
    let open = || -> Result<Vec<Arc<dyn Target>>, String> {
        let parsed = kestrel::target_spec::parse(spec).map_err(|e| e.to_string())?;
        let opened = kestrel::target_spec::open_with(&parsed, &Default::default())
            .map_err(|e| e.to_string())?;
        opened.block_targets().map_err(|e| e.to_string())
    };
    let nsids: Vec<u32> = match open() {
        Ok(ts) => ts.iter().map(|t| t.info().nsid).collect(),
        Err(e) => {
            return vec![CaseReport {
                name: "target_open",
                target: spec.to_string(),
                nsid: None,
                outcome: Outcome::Fail(e),
                elapsed: Default::default(),
            }]
        }
    };
    let mut rows = Vec::new();
    for c in target_cases()
        .into_iter()
        .filter(|c| filter.is_empty() || c.name.contains(filter))
    {
        let Run::Target(run) = c.run else {
            unreachable!("target cases run on targets")
        };
        for &nsid in &nsids {
            let start = Instant::now();
            let r = std::panic::catch_unwind(|| {
                with_wait(DEFAULT_WAIT, || -> CaseResult {
                    let ts = open()?;
                    let t = ts
                        .iter()
                        .find(|t| t.info().nsid == nsid)
                        .ok_or(format!("nsid {nsid} is gone"))?;
                    let ns = NsDesc::of_target(t.info());
                    run(t.as_ref(), &ns)
                })
            });
            rows.push(CaseReport {
                name: c.name,
                target: spec.to_string(),
                nsid: Some(nsid),
                outcome: crate::harness::outcome_of(r),
                elapsed: start.elapsed(),
            });
        }
    }
    rows
}

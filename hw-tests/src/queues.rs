//! The queue cases: queues granted and created, the software queue past the depth,
//! doorbell writes (batched, immediate, shadow), qpairs driven from several threads.

use std::time::Instant;

use kestrel::io::SubmitError;
use kestrel::nvme::ctrlr::CtrlrError;
use kestrel::{Controller, DoorbellMode, QpairOptions};

use crate::blocks::{Blocks, Space};
use crate::support::{all_ok, pattern, qpair, quiet, reap, wait, with_wait};
use crate::verify::{read_compare, write_read};
use crate::{CaseError, CaseResult, Ctx, NsDesc, Outcome};

pub(crate) fn queues_granted(t: &mut Ctx) -> CaseResult {
    let c = t.open_with(|o| o.io_queues = 4)?;
    let g = c.io_queues_granted();
    ensure!((1..=4).contains(&g), "asked for 4 queues, granted {g}");
    Ok(Outcome::Pass)
}

pub(crate) fn max_qpairs(t: &mut Ctx) -> CaseResult {
    let ns = t.ns()?;
    let c = t.open_with(|o| o.io_queues = 16)?;
    let n = c.io_queues_granted() as usize;
    let mut qps = Vec::new();
    for _ in 0..n {
        qps.push(qpair(c, 16)?);
    }
    let mut qids: Vec<u16> = qps.iter().map(|q| q.qid()).collect();
    qids.sort();
    qids.dedup();
    ensure!(qids.len() == n, "qids not distinct: {qids:?}");
    match c.create_io_qpair(&QpairOptions::default()) {
        Err(CtrlrError::NoFreeQueue { .. }) => {}
        Err(e) => return Err(format!("qpair {} failed with the wrong error: {e}", n + 1).into()),
        Ok(q) => {
            return Err(format!(
                "qpair {} created (qid {}) beyond the {n} granted",
                n + 1,
                q.qid()
            )
            .into())
        }
    }
    // Every one of them writes a block and reads it back.
    let mut space = Space::at(ns, 0);
    for (i, qp) in qps.iter_mut().enumerate() {
        let w = Blocks::lend(c.dma_pool(), qp, ns, 1)?;
        let r = Blocks::lend(c.dma_pool(), qp, ns, 1)?;
        let lba = space.take(c.dma_pool(), qp, 1)?;
        write_read(qp, ns, &w, &r, lba, &pattern(ns.block_size, i as u64))
            .map_err(|e| format!("qid {}: {e}", qp.qid()))?;
    }
    Ok(Outcome::Pass)
}

/// Writes `n` blocks at the start of `space` with one request on a qpair of its own, for
/// cases that then only read them; their first LBA.
fn prepare(c: &Controller, ns: &NsDesc, space: &mut Space, n: usize) -> Result<u64, CaseError> {
    let mut qp = qpair(c, 8)?;
    let w = Blocks::lend(c.dma_pool(), &mut qp, ns, n)?;
    let lba = space.take(c.dma_pool(), &mut qp, n as u64)?;
    ns.write(&mut qp, &w, lba, &pattern(n * ns.block_size, lba))?;
    Ok(lba)
}

pub(crate) fn overflow_beyond_depth(t: &mut Ctx) -> CaseResult {
    let ns = t.ns()?;
    let c = t.open()?;
    let base = prepare(c, ns, &mut Space::at(ns, 0), 64)?;
    let sw = 64u32;
    let mut qp = c
        .create_io_qpair(&QpairOptions {
            depth: 16,
            sw_queue_depth: sw,
            ..Default::default()
        })
        .map_err(|e| e.to_string())?;
    let slots = qp.slots() as u32;
    let b = Blocks::lend(c.dma_pool(), &mut qp, ns, 1)?;
    let total = slots + sw;
    let read = |i: u64, token: u64| ns.read_req(base + i % 64, &b, true, token);
    for i in 0..total {
        qp.submit(read(i as u64, i as u64))
            .map_err(|e| format!("submit {i}: {e}"))?;
    }
    let extra = read(0, 1 << 40);
    match qp.submit(extra) {
        Err(SubmitError::Busy(b)) => {
            ensure!(b.request == extra, "busy did not hand the request back")
        }
        other => return Err(format!("expected Busy with everything full, got {other:?}").into()),
    }
    qp.flush();
    let done = reap(&mut qp, total as usize)?;
    all_ok(&done)?;
    // Exactly once each. The order of completions is the device's business (QEMU's model
    // completes out of order); the driver's own tests check submission order against the
    // in-order emulator.
    let mut tokens: Vec<u64> = done.iter().map(|c| c.token).collect();
    tokens.sort_unstable();
    ensure!(
        tokens == (0..total as u64).collect::<Vec<_>>(),
        "completions missing or repeated"
    );
    quiet(&mut qp)?;
    ensure!(
        qp.outstanding() == 0 && qp.free_slots() as u32 == slots,
        "trackers leaked"
    );
    Ok(Outcome::Pass)
}

fn doorbell_counts(t: &mut Ctx, mode: DoorbellMode) -> Result<kestrel::QueueStats, CaseError> {
    let ns = t.ns()?;
    let c = t.open_with(|o| o.shadow_doorbells = false)?;
    let base = prepare(c, ns, &mut Space::at(ns, 0), 32)?;
    let mut qp = c
        .create_io_qpair(&QpairOptions {
            depth: 64,
            doorbell: mode,
            shadow_doorbells: false,
            ..Default::default()
        })
        .map_err(|e| e.to_string())?;
    let b = Blocks::lend(c.dma_pool(), &mut qp, ns, 1)?;
    let mut nonempty = 0u64;
    for batch in 0..20u64 {
        let reqs: Vec<_> = (0..32)
            .map(|i| ns.read_req(base + i, &b, true, batch * 32 + i))
            .collect();
        let n = qp.submit_batch(&reqs).map_err(|e| e.to_string())?;
        ensure!(n == 32, "batch took {n} of 32");
        let mut got = 0;
        let deadline = Instant::now() + wait();
        while got < 32 {
            let mut failed = None;
            if qp.process_completions(128, &mut |c| {
                got += 1;
                if c.result.is_err() {
                    failed = Some(c);
                }
            }) > 0
            {
                nonempty += 1;
            }
            if let Some(f) = failed {
                return Err(format!("read {} failed: {:?}", f.token, f.result).into());
            }
            ensure!(Instant::now() < deadline, "batch {batch} did not complete");
        }
    }
    let st = qp.stats();
    ensure!(
        st.cq_doorbell_writes <= nonempty,
        "cq doorbell writes {} > non-empty passes {nonempty}",
        st.cq_doorbell_writes
    );
    ensure!(st.cq_doorbell_writes > 0, "no cq doorbell writes at all");
    Ok(st)
}

pub(crate) fn doorbells_batched(t: &mut Ctx) -> CaseResult {
    let st = doorbell_counts(t, DoorbellMode::Batched)?;
    ensure!(
        st.sq_doorbell_writes == 20,
        "batched: {} sq doorbell writes for 20 batches",
        st.sq_doorbell_writes
    );
    Ok(Outcome::Pass)
}

pub(crate) fn doorbells_immediate(t: &mut Ctx) -> CaseResult {
    let st = doorbell_counts(t, DoorbellMode::Immediate)?;
    ensure!(
        st.sq_doorbell_writes == 640,
        "immediate: {} sq doorbell writes for 640 commands",
        st.sq_doorbell_writes
    );
    Ok(Outcome::Pass)
}

pub(crate) fn shadow_doorbells(t: &mut Ctx) -> CaseResult {
    let (dev, ns) = (t.dev(), t.ns()?);
    if !dev.shadow_doorbells {
        return Ok(Outcome::Skip(
            "controller does not offer Doorbell Buffer Config (OACS bit 8)".into(),
        ));
    }
    let c = t.open()?;
    ensure!(c.shadow_doorbells(), "offered but not configured");
    let mut qp = qpair(c, 64)?;
    ensure!(
        qp.uses_shadow_doorbells(),
        "qpair not using shadow doorbells"
    );
    let w = Blocks::lend(c.dma_pool(), &mut qp, ns, 32)?;
    let r = Blocks::lend(c.dma_pool(), &mut qp, ns, 32)?;
    let data = pattern(32 * ns.block_size, 11);
    // Ten batches of 32 single-block writes: over the same 32 blocks on a conventional
    // namespace; on a zoned one, 32 new blocks at the write pointer each time (one
    // command at a time: the order of a batch's writes is the device's business).
    let mut space = Space::at(ns, 7000);
    let mut lba = space.take(c.dma_pool(), &mut qp, 32)?;
    for round in 0..10u64 {
        if ns.zoned() && round > 0 {
            lba = space.take(c.dma_pool(), &mut qp, 32)?;
        }
        ns.stage(&mut qp, &w, lba, &data)?;
        let reqs: Vec<_> = (0..32usize)
            .map(|i| {
                w.sub(ns, i, 1)
                    .map(|b| ns.write_req(lba + i as u64, &b, round * 64 + i as u64))
            })
            .collect::<Result<_, _>>()?;
        if ns.zoned() {
            for req in reqs {
                qp.submit(req).map_err(|e| e.to_string())?;
                all_ok(&reap(&mut qp, 1)?)?;
            }
        } else {
            qp.submit_batch(&reqs).map_err(|e| e.to_string())?;
            all_ok(&reap(&mut qp, 32)?)?;
        }
    }
    read_compare(
        &mut qp,
        ns,
        &r,
        lba,
        &data,
        "data written with shadow doorbells",
    )?;
    let st = qp.stats();
    ensure!(
        st.shadow_doorbell_updates + st.sq_doorbell_writes > 0,
        "no doorbell updates recorded"
    );
    Ok(Outcome::Pass)
}

pub(crate) fn concurrent_pinned_qpairs(t: &mut Ctx) -> CaseResult {
    let (dev, ns) = (t.dev(), t.ns()?);
    let c = t.open()?;
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let threads = cores.len().clamp(2, 4).min(dev.queues_granted as usize);
    let w = wait();
    // Scoped: every thread is joined before the scope ends, even when one fails or
    // panics, so none outlives the case with the controller.
    let results: Vec<Result<(), String>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|i| {
                let core = cores.get(i % cores.len().max(1)).copied();
                s.spawn(move || {
                    with_wait(w, || -> Result<(), String> {
                        if let Some(core) = core {
                            if !core_affinity::set_for_current(core) {
                                return Err(format!(
                                    "could not pin thread {i} to core {}",
                                    core.id
                                ));
                            }
                        }
                        let mut qp = qpair(c, 32)?;
                        let wb = Blocks::lend(c.dma_pool(), &mut qp, ns, 32)?;
                        let rb = Blocks::lend(c.dma_pool(), &mut qp, ns, 32)?;
                        let mut space = Space::at(ns, 14_500 + i as u64 * 400);
                        let base = space
                            .take(c.dma_pool(), &mut qp, 320)
                            .map_err(|e| e.to_string())?;
                        for round in 0..20u64 {
                            let lba = base + (round % 10) * 32;
                            write_read(
                                &mut qp,
                                ns,
                                &wb,
                                &rb,
                                lba,
                                &pattern(32 * ns.block_size, i as u64 * 100 + round),
                            )
                            .map_err(|e| format!("thread {i} on qid {}: {e}", qp.qid()))?;
                        }
                        Ok(())
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .enumerate()
            .map(|(i, h)| {
                h.join()
                    .unwrap_or_else(|_| Err(format!("thread {i} panicked")))
            })
            .collect()
    });
    for r in results {
        r?;
    }
    Ok(Outcome::Pass)
}

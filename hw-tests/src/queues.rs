//! The queue cases: queues granted and created, the software queue past the depth,
//! doorbell writes (batched, immediate, shadow), qpairs driven from several threads.

use std::sync::Arc;
use std::time::Instant;

use kestrel::io::{IoRequest, SubmitError};
use kestrel::nvme::ctrlr::CtrlrError;
use kestrel::{ControllerOptions, DoorbellMode, QpairOptions};

use crate::support::{
    all_ok, alloc, lent, ns_of, pattern, put, qpair, quiet, reap, reclaim, run_one, WAIT,
};
use crate::verify::{read_compare, write_read};
use crate::{CaseError, CaseResult, Device, Outcome};

pub(crate) fn queues_granted(d: &Device, _nsid: u32) -> CaseResult {
    let c = d.open_with(ControllerOptions {
        io_queues: 4,
        ..Default::default()
    })?;
    let g = c.io_queues_granted();
    ensure!((1..=4).contains(&g), "asked for 4 queues, granted {g}");
    Ok(Outcome::Pass)
}

pub(crate) fn max_qpairs(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open_with(ControllerOptions {
        io_queues: 16,
        ..Default::default()
    })?;
    ns_of(&c, nsid)?;
    let n = c.io_queues_granted() as usize;
    let mut qps = Vec::new();
    for _ in 0..n {
        qps.push(qpair(&c, 16)?);
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
    // Every one of them does I/O, into one buffer: lent to each qpair in turn, and
    // reclaimed once its read completed.
    let mut buf = alloc(&c, 4096)?;
    for (i, qp) in qps.iter_mut().enumerate() {
        let s = qp.lend(buf).map_err(|e| e.to_string())?;
        let r = run_one(qp, IoRequest::read(nsid, i as u64, 1, s, i as u64))?;
        ensure!(r.is_ok(), "read on qid {}: {r:?}", qp.qid());
        buf = reclaim(qp, &s)?;
    }
    Ok(Outcome::Pass)
}

pub(crate) fn overflow_beyond_depth(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    ns_of(&c, nsid)?;
    let sw = 64u32;
    let mut qp = c
        .create_io_qpair(&QpairOptions {
            depth: 16,
            sw_queue_depth: sw,
            ..Default::default()
        })
        .map_err(|e| e.to_string())?;
    let slots = qp.slots() as u32;
    let buf = lent(&c, &mut qp, 4096)?;
    let total = slots + sw;
    for i in 0..total {
        qp.submit(IoRequest::read(nsid, i as u64, 1, buf, i as u64))
            .map_err(|e| format!("submit {i}: {e}"))?;
    }
    let extra = IoRequest::read(nsid, 0, 1, buf, 1 << 40);
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

fn doorbell_counts(
    d: &Device,
    nsid: u32,
    mode: DoorbellMode,
) -> Result<kestrel::QueueStats, String> {
    let c = d.open_with(ControllerOptions {
        shadow_doorbells: false,
        ..Default::default()
    })?;
    let mut qp = c
        .create_io_qpair(&QpairOptions {
            depth: 64,
            doorbell: mode,
            shadow_doorbells: false,
            ..Default::default()
        })
        .map_err(|e| e.to_string())?;
    let buf = lent(&c, &mut qp, 4096)?;
    let mut nonempty = 0u64;
    for b in 0..20u64 {
        let reqs: Vec<_> = (0..32)
            .map(|i| IoRequest::read(nsid, i, 1, buf, b * 32 + i))
            .collect();
        let n = qp.submit_batch(&reqs).map_err(|e| e.to_string())?;
        ensure!(n == 32, "batch took {n} of 32");
        let mut got = 0;
        let deadline = Instant::now() + WAIT;
        while got < 32 {
            if qp.process_completions(128, &mut |_| got += 1) > 0 {
                nonempty += 1;
            }
            ensure!(Instant::now() < deadline, "batch {b} did not complete");
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

pub(crate) fn doorbells_batched(d: &Device, nsid: u32) -> CaseResult {
    if nsid == 0 {
        return Err(CaseError::Skip(
            "no active namespace kestrel does i/o to (see the per-namespace rows)".into(),
        ));
    }
    let st = doorbell_counts(d, nsid, DoorbellMode::Batched)?;
    ensure!(
        st.sq_doorbell_writes == 20,
        "batched: {} sq doorbell writes for 20 batches",
        st.sq_doorbell_writes
    );
    Ok(Outcome::Pass)
}

pub(crate) fn doorbells_immediate(d: &Device, nsid: u32) -> CaseResult {
    if nsid == 0 {
        return Err(CaseError::Skip(
            "no active namespace kestrel does i/o to (see the per-namespace rows)".into(),
        ));
    }
    let st = doorbell_counts(d, nsid, DoorbellMode::Immediate)?;
    ensure!(
        st.sq_doorbell_writes == 640,
        "immediate: {} sq doorbell writes for 640 commands",
        st.sq_doorbell_writes
    );
    Ok(Outcome::Pass)
}

pub(crate) fn shadow_doorbells(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    if !c.identify().supports_shadow_doorbells() {
        return Ok(Outcome::Skip(
            "controller does not offer Doorbell Buffer Config (OACS bit 8)".into(),
        ));
    }
    ensure!(c.shadow_doorbells(), "offered but not configured");
    let mut qp = qpair(&c, 64)?;
    ensure!(
        qp.uses_shadow_doorbells(),
        "qpair not using shadow doorbells"
    );
    let ns = ns_of(&c, nsid)?;
    let w = lent(&c, &mut qp, 32 * ns.bs)?;
    let r = lent(&c, &mut qp, 32 * ns.bs)?;
    let data = pattern(32 * ns.bs, 11);
    put(&mut qp, &w, 0, &data)?;
    for round in 0..10u64 {
        let reqs: Vec<_> = (0..32)
            .map(|i| {
                IoRequest::write(
                    nsid,
                    7000 + i,
                    1,
                    w.slice(i as usize * ns.bs, ns.bs).unwrap(),
                    round * 64 + i,
                )
            })
            .collect();
        qp.submit_batch(&reqs).map_err(|e| e.to_string())?;
        all_ok(&reap(&mut qp, 32)?)?;
    }
    read_compare(
        &mut qp,
        nsid,
        &r,
        7000,
        ns.bs,
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

pub(crate) fn concurrent_pinned_qpairs(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    let ns = ns_of(&c, nsid)?;
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let threads = cores.len().clamp(1, 4).max(2);
    let c = Arc::new(c);
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let c = Arc::clone(&c);
            let core = cores.get(t % cores.len().max(1)).copied();
            let bs = ns.bs;
            std::thread::spawn(move || -> Result<(), String> {
                if let Some(core) = core {
                    if !core_affinity::set_for_current(core) {
                        return Err(format!("could not pin thread {t} to core {}", core.id));
                    }
                }
                let mut qp = qpair(&c, 32)?;
                let w = lent(&c, &mut qp, 32 * bs)?;
                let r = lent(&c, &mut qp, 32 * bs)?;
                let base = 10_000 + t as u64 * 1000;
                for round in 0..20u64 {
                    let lba = base + (round % 10) * 32;
                    write_read(
                        &mut qp,
                        nsid,
                        &w,
                        &r,
                        lba,
                        bs,
                        0,
                        &pattern(32 * bs, t as u64 * 100 + round),
                    )?;
                }
                Ok(())
            })
        })
        .collect();
    for (t, h) in handles.into_iter().enumerate() {
        h.join().map_err(|_| format!("thread {t} panicked"))??;
    }
    Ok(Outcome::Pass)
}

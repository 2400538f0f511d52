//! The data path cases, run on every namespace the driver serves: reads and writes of
//! every size, offset and depth, vectored I/O, Flush, Write Zeroes, Deallocate, splitting
//! past MDTS, visibility across qpairs, a mixed workload verified against a shadow copy.

use std::collections::HashMap;

use kestrel::io::{IoOp, IoRequest};
use kestrel::QpairOptions;

use crate::support::{
    all_ok, contents, fill, lent, mdts, ns_of, pattern, put, qpair, quiet, reap, reclaim, run_one,
};
use crate::verify::{compare, read_compare, write_read};
use crate::{CaseResult, Device, Outcome};

pub(crate) fn rw_sizes(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    let ns = ns_of(&c, nsid)?;
    let max = (4 * mdts(&c)) as usize;
    let mut qp = qpair(&c, 32)?;
    let w = lent(&c, &mut qp, max)?;
    let r = lent(&c, &mut qp, max)?;
    let mdts_blocks = mdts(&c) as usize / ns.bs;
    let mut sizes = vec![
        1usize,
        2,
        3,
        8,
        mdts_blocks.saturating_sub(1).max(1),
        mdts_blocks,
        mdts_blocks + 1,
        2 * mdts_blocks,
        4 * mdts_blocks,
    ];
    sizes.dedup();
    let mut lba = 0u64;
    for nlb in sizes {
        let len = nlb * ns.bs;
        ensure!(lba + nlb as u64 <= ns.blocks, "scratch area too small");
        write_read(&mut qp, nsid, &w, &r, lba, ns.bs, 0, &pattern(len, lba + 1))?;
        lba += nlb as u64;
    }
    ensure!(
        qp.stats().split > 0,
        "no request was split: {:?}",
        qp.stats()
    );
    Ok(Outcome::Pass)
}

pub(crate) fn rw_offsets(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    let ns = ns_of(&c, nsid)?;
    let mut qp = qpair(&c, 32)?;
    let w = lent(&c, &mut qp, 64 * 1024)?;
    let r = lent(&c, &mut qp, 64 * 1024)?;
    let mut lba = 1000u64;
    for off in [0usize, 4, 64, 512, 2048, 4092] {
        for blocks in [1usize, 2, 5] {
            let len = blocks * ns.bs;
            write_read(
                &mut qp,
                nsid,
                &w,
                &r,
                lba,
                ns.bs,
                off,
                &pattern(len, lba * 7 + off as u64),
            )?;
            lba += blocks as u64;
        }
    }
    Ok(Outcome::Pass)
}

pub(crate) fn rw_queue_depths(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    let ns = ns_of(&c, nsid)?;
    let depth = c.cap().max_queue_entries().min(256);
    let mut qp = qpair(&c, depth)?;
    let slots = qp.slots();
    let mut lba = 2000u64;
    for qd in [1usize, 2, 16, slots] {
        let w = lent(&c, &mut qp, qd * ns.bs)?;
        let r = lent(&c, &mut qp, qd * ns.bs)?;
        let data = pattern(qd * ns.bs, qd as u64);
        put(&mut qp, &w, 0, &data)?;
        for i in 0..qd {
            let s = w.slice(i * ns.bs, ns.bs).map_err(|e| e.to_string())?;
            qp.submit(IoRequest::write(nsid, lba + i as u64, 1, s, i as u64))
                .map_err(|e| e.to_string())?;
        }
        qp.flush();
        all_ok(&reap(&mut qp, qd)?)?;
        for i in 0..qd {
            let s = r.slice(i * ns.bs, ns.bs).map_err(|e| e.to_string())?;
            qp.submit(IoRequest::read(nsid, lba + i as u64, 1, s, i as u64))
                .map_err(|e| e.to_string())?;
        }
        qp.flush();
        all_ok(&reap(&mut qp, qd)?)?;
        compare(&contents(&qp, &r)?, &data, ns.bs)
            .map_err(|e| format!("data mismatch at queue depth {qd}: {e}"))?;
        // This depth's buffers back from the queue (nothing is outstanding), and freed.
        drop(reclaim(&mut qp, &w)?);
        drop(reclaim(&mut qp, &r)?);
        lba += qd as u64;
    }
    Ok(Outcome::Pass)
}

pub(crate) fn vectored_io(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    let ns = ns_of(&c, nsid)?;
    let mut qp = qpair(&c, 16)?;
    let lens = [8192usize, 4096, 12288];
    let mut segs = Vec::new();
    for l in lens {
        segs.push(lent(&c, &mut qp, l)?);
    }
    let total: usize = lens.iter().sum();
    let data = pattern(total, 3);
    let mut off = 0;
    for (s, l) in segs.iter().zip(lens) {
        put(&mut qp, s, 0, &data[off..off + l])?;
        off += l;
    }
    let nlb = (total / ns.bs) as u32;
    let req =
        IoRequest::vectored(IoOp::Write, nsid, 3000, nlb, &segs, 1).ok_or("too many segments")?;
    let res = run_one(&mut qp, req)?;
    ensure!(res.is_ok(), "vectored write: {res:?}");
    let r = lent(&c, &mut qp, total)?;
    read_compare(
        &mut qp,
        nsid,
        &r,
        3000,
        ns.bs,
        &data,
        "vectored write read back",
    )?;
    // And a vectored read into the three buffers.
    for s in &segs {
        fill(&mut qp, s, 0)?;
    }
    let req =
        IoRequest::vectored(IoOp::Read, nsid, 3000, nlb, &segs, 3).ok_or("too many segments")?;
    let res = run_one(&mut qp, req)?;
    ensure!(res.is_ok(), "vectored read: {res:?}");
    let mut got = Vec::new();
    for s in &segs {
        got.extend(contents(&qp, s)?);
    }
    compare(&got, &data, ns.bs).map_err(|e| format!("vectored read mismatch: {e}"))?;
    Ok(Outcome::Pass)
}

pub(crate) fn flush(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    ns_of(&c, nsid)?;
    let mut qp = qpair(&c, 16)?;
    let buf = lent(&c, &mut qp, 4096)?;
    qp.submit(IoRequest::write(nsid, 4000, 1, buf, 1))
        .map_err(|e| e.to_string())?;
    qp.submit(IoRequest::flush(nsid, 2))
        .map_err(|e| e.to_string())?;
    qp.flush();
    all_ok(&reap(&mut qp, 2)?)?;
    Ok(Outcome::Pass)
}

pub(crate) fn write_zeroes(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    if !c.identify().supports_write_zeroes() {
        return Ok(Outcome::Skip("ONCS: write zeroes not supported".into()));
    }
    let ns = ns_of(&c, nsid)?;
    let mut qp = qpair(&c, 16)?;
    let buf = lent(&c, &mut qp, 8 * ns.bs)?;
    fill(&mut qp, &buf, 0x5A)?;
    let r = run_one(&mut qp, IoRequest::write(nsid, 5000, 8, buf, 1))?;
    ensure!(r.is_ok(), "write: {r:?}");
    let r = run_one(&mut qp, IoRequest::write_zeroes(nsid, 5002, 4, 2))?;
    ensure!(r.is_ok(), "write zeroes: {r:?}");
    fill(&mut qp, &buf, 0xFF)?;
    let r = run_one(&mut qp, IoRequest::read(nsid, 5000, 8, buf, 3))?;
    ensure!(r.is_ok(), "read: {r:?}");
    let v = contents(&qp, &buf)?;
    for (i, blk) in v.chunks(ns.bs).enumerate() {
        let want = if (2..6).contains(&i) { 0 } else { 0x5A };
        ensure!(
            blk.iter().all(|&b| b == want),
            "block {i} after write zeroes: want {want:#x}"
        );
    }
    Ok(Outcome::Pass)
}

pub(crate) fn deallocate(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    if !c.identify().supports_dsm() {
        return Ok(Outcome::Skip(
            "ONCS: dataset management not supported".into(),
        ));
    }
    let ns = ns_of(&c, nsid)?;
    let zeroes = ns.deallocated_reads_zeroes;
    let mut qp = qpair(&c, 16)?;
    let buf = lent(&c, &mut qp, 8 * ns.bs)?;
    fill(&mut qp, &buf, 0xC3)?;
    let r = run_one(&mut qp, IoRequest::write(nsid, 6000, 8, buf, 1))?;
    ensure!(r.is_ok(), "write: {r:?}");
    let r = run_one(&mut qp, IoRequest::deallocate(nsid, 6000, 8, 2))?;
    ensure!(r.is_ok(), "deallocate: {r:?}");
    let r = run_one(&mut qp, IoRequest::read(nsid, 6000, 8, buf, 3))?;
    ensure!(r.is_ok(), "read after deallocate: {r:?}");
    // Dataset Management's Deallocate is advisory (the controller "may" deallocate), so
    // each block reads back either as it was or, deallocated, as DLFEAT says.
    let v = contents(&qp, &buf)?;
    let mut deallocated = 0;
    for (i, blk) in v.chunks(ns.bs).enumerate() {
        if blk.iter().all(|&b| b == 0xC3) {
            continue;
        }
        ensure!(
            zeroes,
            "block {i} changed after deallocate and DLFEAT promises nothing: {:#04x}",
            blk[0]
        );
        ensure!(
            blk.iter().all(|&b| b == 0),
            "block {i} after deallocate is neither its old data nor zeroes, as DLFEAT promises"
        );
        deallocated += 1;
    }
    if deallocated == 0 {
        return Ok(Outcome::Skip(
            "the controller kept every block (deallocate is advisory); contents unchanged".into(),
        ));
    }
    Ok(Outcome::Pass)
}

pub(crate) fn large_io_split(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    let ns = ns_of(&c, nsid)?;
    let m = mdts(&c) as usize;
    let len = 3 * m + 2 * ns.bs;
    let mut qp = c
        .create_io_qpair(&QpairOptions {
            depth: 4,
            ..Default::default()
        })
        .map_err(|e| e.to_string())?;
    let w = lent(&c, &mut qp, len)?;
    let r = lent(&c, &mut qp, len)?;
    write_read(&mut qp, nsid, &w, &r, 8000, ns.bs, 0, &pattern(len, 99))?;
    let st = qp.stats();
    ensure!(st.split == 2, "expected 2 split requests, stats {st:?}");
    ensure!(
        st.completed == 2,
        "parents completed {} times",
        st.completed
    );
    quiet(&mut qp)?;
    Ok(Outcome::Pass)
}

pub(crate) fn cross_qpair_visibility(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    let ns = ns_of(&c, nsid)?;
    let mut a = qpair(&c, 16)?;
    let mut b = qpair(&c, 16)?;
    // Each qpair owns its buffer: the writer's is lent to `a`, the reader's to `b`.
    let w = lent(&c, &mut a, 4 * ns.bs)?;
    let r = lent(&c, &mut b, 4 * ns.bs)?;
    let data = pattern(4 * ns.bs, 4242);
    put(&mut a, &w, 0, &data)?;
    let res = run_one(&mut a, IoRequest::write(nsid, 12_000, 4, w, 1))?;
    ensure!(res.is_ok(), "write on qid {}: {res:?}", a.qid());
    let what = format!("a write on qid {} read on qid {}", a.qid(), b.qid());
    read_compare(&mut b, nsid, &r, 12_000, ns.bs, &data, &what)?;
    Ok(Outcome::Pass)
}

pub(crate) fn mixed_workload_verify(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    let ns = ns_of(&c, nsid)?;
    let mut qp = qpair(&c, 64)?;
    let blocks = 256u64;
    let w = lent(&c, &mut qp, blocks as usize * ns.bs)?;
    let r = lent(&c, &mut qp, blocks as usize * ns.bs)?;
    let mut shadow: HashMap<u64, u8> = HashMap::new();
    let mut x = 0x1234_5678u64;
    for round in 0..8u8 {
        // Each round writes a random subset of blocks with the round's byte, QD up to 63.
        let mut n = 0;
        for blk in 0..blocks {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x % 3 == 0 {
                let off = blk as usize * ns.bs;
                put(&mut qp, &w, off, &vec![round + 1; ns.bs])?;
                qp.submit(IoRequest::write(
                    nsid,
                    13_000 + blk,
                    1,
                    w.slice(off, ns.bs).unwrap(),
                    blk,
                ))
                .map_err(|e| e.to_string())?;
                shadow.insert(blk, round + 1);
                n += 1;
            }
        }
        qp.flush();
        all_ok(&reap(&mut qp, n)?)?;
    }
    let res = run_one(&mut qp, IoRequest::read(nsid, 13_000, blocks as u32, r, 1))?;
    ensure!(res.is_ok(), "read: {res:?}");
    let v = contents(&qp, &r)?;
    for (blk, want) in shadow {
        let b = &v[blk as usize * ns.bs..(blk as usize + 1) * ns.bs];
        ensure!(
            b.iter().all(|&x| x == want),
            "block {blk}: want {want}, got {}",
            b[0]
        );
    }
    Ok(Outcome::Pass)
}

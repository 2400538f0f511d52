//! The data path cases, run on every namespace the driver serves, in the form its format
//! needs ([`crate::blocks`]): reads and writes of every size, offset and depth, vectored
//! I/O, Flush, Write Zeroes, Deallocate, splitting past MDTS, visibility across qpairs, a
//! mixed workload verified against a shadow copy, the PI the controller inserts.

use std::collections::HashMap;

use kestrel::io::{IoMeta, IoOp, IoRequest};
use kestrel::spec::Status;
use kestrel::target::TargetQueue;
use kestrel::{DmaSlice, QpairOptions};

use crate::blocks::{Blocks, Check, Space};
use crate::support::{
    all_ok, contents, expect_nvme, fill, lent, must, pattern, put, qpair, quiet, reap, reclaim,
    run_one,
};
use crate::verify::{compare, read_compare, write_read};
use crate::{CaseError, CaseResult, Ctx, Outcome};

/// The largest write a zoned namespace takes in one request (the driver does not split
/// writes to one: `None` for a conventional namespace).
fn zoned_limit(ns: &crate::NsDesc) -> Option<usize> {
    let z = ns.zones?;
    let cap = z.capacity.unwrap_or(z.geometry.zone_size) as usize;
    Some(ns.chunk_blocks().min(cap))
}

pub(crate) fn rw_sizes(t: &mut Ctx) -> CaseResult {
    let ns = t.ns()?;
    let c = t.open()?;
    let chunk = ns.chunk_blocks();
    let mut sizes = vec![
        1usize,
        2,
        3,
        8,
        chunk.saturating_sub(1).max(1),
        chunk,
        chunk + 1,
        2 * chunk,
        4 * chunk,
    ];
    if let Some(max) = zoned_limit(ns) {
        sizes.retain(|&n| n <= max);
    }
    sizes.sort_unstable();
    sizes.dedup();
    let max = *sizes.last().expect("1 is always there");
    let mut qp = qpair(c, 32)?;
    let w = Blocks::lend(c.dma_pool(), &mut qp, ns, max)?;
    let r = Blocks::lend(c.dma_pool(), &mut qp, ns, max)?;
    let mut space = Space::at(ns, 0);
    for &nlb in &sizes {
        let lba = space.take(c.dma_pool(), &mut qp, nlb as u64)?;
        write_read(
            &mut qp,
            ns,
            &w,
            &r,
            lba,
            &pattern(nlb * ns.block_size, lba + 1),
        )?;
    }
    if sizes.iter().any(|&n| n > chunk) {
        ensure!(
            qp.stats().split > 0,
            "no request was split ({} blocks per command): {:?}",
            chunk,
            qp.stats()
        );
    }
    Ok(Outcome::Pass)
}

pub(crate) fn rw_offsets(t: &mut Ctx) -> CaseResult {
    let ns = t.ns()?;
    let c = t.open()?;
    let mut qp = qpair(c, 32)?;
    let w = Blocks::lend_bytes(c.dma_pool(), &mut qp, ns, 64 * 1024, 5)?;
    let r = Blocks::lend_bytes(c.dma_pool(), &mut qp, ns, 64 * 1024, 5)?;
    let mut space = Space::at(ns, 1000);
    for off in [0usize, 4, 64, 512, 2048, 4092] {
        for blocks in [1usize, 2, 5] {
            let lba = space.take(c.dma_pool(), &mut qp, blocks as u64)?;
            let data = pattern(blocks * ns.block_size, lba * 7 + off as u64);
            let (wb, rb) = (w.at(ns, off, blocks)?, r.at(ns, off, blocks)?);
            ns.write(&mut qp, &wb, lba, &data)
                .map_err(|e| format!("buffer offset {off}: {e}"))?;
            read_compare(
                &mut qp,
                ns,
                &rb,
                lba,
                &data,
                &format!("buffer offset {off}"),
            )?;
        }
    }
    Ok(Outcome::Pass)
}

pub(crate) fn rw_queue_depths(t: &mut Ctx) -> CaseResult {
    let (dev, ns) = (t.dev(), t.ns()?);
    let c = t.open()?;
    let depth = dev.max_queue_entries.min(256);
    let mut qp = qpair(c, depth)?;
    let slots = qp.slots();
    let mut depths = vec![1usize, 2, 16, slots];
    if let Some(max) = zoned_limit(ns) {
        if ns.meta.is_some() {
            return Err(CaseError::Skip(format!(
                "nsid {}: zone appends of a format with metadata",
                ns.nsid
            )));
        }
        // One zone takes each depth's appends.
        depths.retain(|&d| d <= ns.zones.and_then(|z| z.capacity).unwrap_or(max as u64) as usize);
    }
    let mut space = Space::at(ns, 2000);
    let bs = ns.block_size;
    for qd in depths {
        let w = Blocks::lend(c.dma_pool(), &mut qp, ns, qd)?;
        let r = Blocks::lend(c.dma_pool(), &mut qp, ns, qd)?;
        let data = pattern(qd * bs, qd as u64);
        let lba = space.take(c.dma_pool(), &mut qp, qd as u64)?;
        // Where each block went: at lba + i, or (zoned) where its append landed.
        let mut at: Vec<u64> = (0..qd as u64).map(|i| lba + i).collect();
        ns.stage(&mut qp, &w, lba, &data)?;
        for i in 0..qd {
            let b = w.sub(ns, i, 1)?;
            let req = match &ns.zones {
                Some(z) => {
                    IoRequest::zone_append(ns.nsid, z.geometry.zone_start(lba), 1, b.data, i as u64)
                }
                None => ns.write_req(lba + i as u64, &b, i as u64),
            };
            qp.submit(req).map_err(|e| e.to_string())?;
        }
        qp.flush();
        for d in reap(&mut qp, qd)? {
            ensure!(
                d.result.is_ok(),
                "write {} at depth {qd}: {:?}",
                d.token,
                d.result
            );
            if ns.zoned() {
                at[d.token as usize] = d.value;
            }
        }
        fill(&mut qp, &r.data, 0xEE)?;
        fill(&mut qp, &r.md, 0xEE)?;
        for (i, &l) in at.iter().enumerate() {
            qp.submit(ns.read_req(l, &r.sub(ns, i, 1)?, true, i as u64))
                .map_err(|e| e.to_string())?;
        }
        qp.flush();
        all_ok(&reap(&mut qp, qd)?)?;
        let mut got = Vec::with_capacity(qd * bs);
        for (i, &l) in at.iter().enumerate() {
            got.extend(ns.fetch(&qp, &r.sub(ns, i, 1)?, l)?);
        }
        compare(&got, &data, bs).map_err(|e| format!("data mismatch at queue depth {qd}: {e}"))?;
        // This depth's buffers back from the queue (nothing is outstanding), and freed.
        for s in [w.data, w.md, r.data, r.md] {
            if !s.is_empty() {
                drop(reclaim(&mut qp, &s)?);
            }
        }
    }
    Ok(Outcome::Pass)
}

/// Copies `bytes` across the segments `segs` (lent to `q`), in order.
fn scatter(q: &mut dyn TargetQueue, segs: &[DmaSlice], bytes: &[u8]) -> Result<(), String> {
    let mut off = 0;
    for s in segs {
        put(q, s, 0, &bytes[off..off + s.len()])?;
        off += s.len();
    }
    Ok(())
}

pub(crate) fn vectored_io(t: &mut Ctx) -> CaseResult {
    let ns = t.ns()?;
    let c = t.open()?;
    let mut qp = qpair(c, 16)?;
    // 24 KiB of data in blocks with their metadata (extended), in three segments of
    // 8 KiB, 4 KiB and the rest.
    let hb = ns.host_block();
    let nlb = (24 * 1024usize).div_ceil(hb);
    let total = nlb * hb;
    if ns.zoned() && nlb > ns.chunk_blocks() {
        return Err(CaseError::Skip(format!(
            "nsid {} is zoned and its writes are not split: a vectored write of {total} bytes is more than one command carries ({} bytes, MDTS)",
            ns.nsid,
            ns.chunk_blocks() * hb
        )));
    }
    let lens = [8192usize, 4096, total - 12288];
    let mut segs = Vec::new();
    for l in lens {
        segs.push(lent(c, &mut qp, l)?);
    }
    let md = match ns.md_block() * nlb {
        0 => DmaSlice::EMPTY,
        n => lent(c, &mut qp, n)?,
    };
    let mut space = Space::at(ns, 3000);
    let lba = space.take(c.dma_pool(), &mut qp, nlb as u64)?;
    let data = pattern(nlb * ns.block_size, 3);
    let (host, mdb) = ns.image(lba, &data);
    scatter(&mut qp, &segs, &host)?;
    if !md.is_empty() {
        put(&mut qp, &md, 0, &mdb)?;
    }
    let meta = |app| match &ns.meta {
        None => IoMeta::NONE,
        Some(m) => IoMeta::for_layout(m, md).with_tags(
            crate::NsDesc::ref_tag(lba),
            crate::blocks::APP_TAG,
            if app { 0xFFFF } else { 0 },
        ),
    };
    let req = IoRequest::vectored(IoOp::Write, ns.nsid, lba, nlb as u32, &segs, 1)
        .ok_or("too many segments")?
        .with_meta(meta(true));
    must(&mut qp, req, "vectored write")?;
    let r = Blocks::lend(c.dma_pool(), &mut qp, ns, nlb)?;
    read_compare(&mut qp, ns, &r, lba, &data, "vectored write read back")?;
    // And a vectored read into the three buffers.
    for s in &segs {
        fill(&mut qp, s, 0)?;
    }
    fill(&mut qp, &md, 0)?;
    let req = IoRequest::vectored(IoOp::Read, ns.nsid, lba, nlb as u32, &segs, 3)
        .ok_or("too many segments")?
        .with_meta(meta(true));
    must(&mut qp, req, "vectored read")?;
    let mut got = Vec::new();
    for s in &segs {
        got.extend(contents(&qp, s)?);
    }
    let got = ns
        .unimage(lba, &got, &contents(&qp, &md)?, nlb, &|_| {
            Some(Check::Written)
        })
        .map_err(|e| format!("vectored read: {e}"))?;
    compare(&got, &data, ns.block_size).map_err(|e| format!("vectored read mismatch: {e}"))?;
    Ok(Outcome::Pass)
}

pub(crate) fn flush(t: &mut Ctx) -> CaseResult {
    let ns = t.ns()?;
    let c = t.open()?;
    let mut qp = qpair(c, 16)?;
    let b = Blocks::lend(c.dma_pool(), &mut qp, ns, 1)?;
    let lba = Space::at(ns, 4000).take(c.dma_pool(), &mut qp, 1)?;
    ns.stage(&mut qp, &b, lba, &pattern(ns.block_size, 4))?;
    qp.submit(ns.write_req(lba, &b, 1))
        .map_err(|e| e.to_string())?;
    qp.submit(IoRequest::flush(ns.nsid, 2))
        .map_err(|e| e.to_string())?;
    qp.flush();
    all_ok(&reap(&mut qp, 2)?)?;
    Ok(Outcome::Pass)
}

pub(crate) fn write_zeroes(t: &mut Ctx) -> CaseResult {
    let ns = t.ns()?;
    let c = t.open()?;
    let mut qp = qpair(c, 16)?;
    let bs = ns.block_size;
    let b = Blocks::lend(c.dma_pool(), &mut qp, ns, 8)?;
    let lba = Space::at(ns, 5000).take(c.dma_pool(), &mut qp, 8)?;
    let data = pattern(8 * bs, 0x5A);
    // Blocks 2..6 are zeroed: over written data on a conventional namespace; at the write
    // pointer, between two writes, on a zoned one.
    if ns.zoned() {
        ns.write(&mut qp, &b, lba, &data[..2 * bs])?;
        must(
            &mut qp,
            IoRequest::write_zeroes(ns.nsid, lba + 2, 4, 2),
            "write zeroes",
        )?;
        let rest = b.sub(ns, 6, 2)?;
        ns.write(&mut qp, &rest, lba + 6, &data[6 * bs..])?;
    } else {
        ns.write(&mut qp, &b, lba, &data)?;
        must(
            &mut qp,
            IoRequest::write_zeroes(ns.nsid, lba + 2, 4, 2),
            "write zeroes",
        )?;
    }
    let zeroed = |i: usize| (2..6).contains(&i);
    let got = ns.read_with(&mut qp, &b, lba, 8, &|i| {
        Some(if zeroed(i) {
            Check::Controller
        } else {
            Check::Written
        })
    })?;
    for (i, blk) in got.chunks(bs).enumerate() {
        let want = if zeroed(i) {
            vec![0; bs]
        } else {
            data[i * bs..(i + 1) * bs].to_vec()
        };
        ensure!(
            blk == &want[..],
            "block {i} after write zeroes over blocks 2..6: {}",
            if zeroed(i) { "not zeroes" } else { "changed" }
        );
    }
    Ok(Outcome::Pass)
}

pub(crate) fn deallocate(t: &mut Ctx) -> CaseResult {
    let ns = t.ns()?;
    let c = t.open()?;
    let zeroes = ns.deallocated_reads_zeroes;
    let bs = ns.block_size;
    let mut qp = qpair(c, 16)?;
    let b = Blocks::lend(c.dma_pool(), &mut qp, ns, 8)?;
    let lba = Space::at(ns, 6000).take(c.dma_pool(), &mut qp, 8)?;
    let data = pattern(8 * bs, 0xC3);
    ns.write(&mut qp, &b, lba, &data)?;
    must(
        &mut qp,
        IoRequest::deallocate(ns.nsid, lba, 8, 2),
        "deallocate",
    )?;
    // Dataset Management's Deallocate is advisory (the controller "may" deallocate), so
    // each block reads back either as it was or, deallocated, as DLFEAT says; its PI is
    // then the controller's (valid, or escaped).
    let got = ns.read_with(&mut qp, &b, lba, 8, &|_| Some(Check::Controller))?;
    let mut deallocated = 0;
    for (i, blk) in got.chunks(bs).enumerate() {
        if blk == &data[i * bs..(i + 1) * bs] {
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

pub(crate) fn large_io_split(t: &mut Ctx) -> CaseResult {
    let ns = t.ns()?;
    if ns.zoned() {
        return Err(CaseError::Skip(format!(
            "nsid {} is a zoned namespace: the driver splits no write to it (the pieces could reach the zone out of order); a read is split as on any other (rw_sizes)",
            ns.nsid
        )));
    }
    let c = t.open()?;
    let chunk = ns.chunk_blocks();
    let nlb = 3 * chunk + 2;
    let mut qp = c
        .create_io_qpair(&QpairOptions {
            depth: 4,
            ..Default::default()
        })
        .map_err(|e| e.to_string())?;
    let w = Blocks::lend(c.dma_pool(), &mut qp, ns, nlb)?;
    let r = Blocks::lend(c.dma_pool(), &mut qp, ns, nlb)?;
    let lba = Space::at(ns, 8000).take(c.dma_pool(), &mut qp, nlb as u64)?;
    write_read(&mut qp, ns, &w, &r, lba, &pattern(nlb * ns.block_size, 99))?;
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

pub(crate) fn cross_qpair_visibility(t: &mut Ctx) -> CaseResult {
    let ns = t.ns()?;
    let c = t.open()?;
    let mut a = qpair(c, 16)?;
    let mut b = qpair(c, 16)?;
    // Each qpair owns its buffer: the writer's is lent to `a`, the reader's to `b`.
    let w = Blocks::lend(c.dma_pool(), &mut a, ns, 4)?;
    let r = Blocks::lend(c.dma_pool(), &mut b, ns, 4)?;
    let lba = Space::at(ns, 12_000).take(c.dma_pool(), &mut a, 4)?;
    let data = pattern(4 * ns.block_size, 4242);
    ns.write(&mut a, &w, lba, &data)
        .map_err(|e| format!("on qid {}: {e}", a.qid()))?;
    let what = format!("a write on qid {} read on qid {}", a.qid(), b.qid());
    read_compare(&mut b, ns, &r, lba, &data, &what)?;
    Ok(Outcome::Pass)
}

pub(crate) fn mixed_workload_verify(t: &mut Ctx) -> CaseResult {
    let ns = t.ns()?;
    let c = t.open()?;
    let bs = ns.block_size;
    let mut qp = qpair(c, 64)?;
    let blocks = 256usize;
    let w = Blocks::lend(c.dma_pool(), &mut qp, ns, blocks)?;
    let r = Blocks::lend(c.dma_pool(), &mut qp, ns, blocks)?;
    let base = Space::at(ns, 13_000).take(c.dma_pool(), &mut qp, blocks as u64)?;
    // Every block written first (generation 0): nothing is read that was never written.
    let mut shadow: HashMap<u64, u8> = (0..blocks as u64).map(|b| (b, 0)).collect();
    let fill_of = |g: u8| -> Vec<u8> { vec![g.wrapping_mul(37).wrapping_add(11); bs] };
    let first: Vec<u8> = (0..blocks).flat_map(|_| fill_of(0)).collect();
    ns.write(&mut qp, &w, base, &first)?;
    let mut x = 0x1234_5678u64;
    for round in 1..=8u8 {
        // Each round writes a random subset of blocks with the round's byte, QD up to 63.
        let mut n = 0;
        for blk in 0..blocks as u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x % 3 == 0 {
                let one = w.sub(ns, blk as usize, 1)?;
                ns.stage(&mut qp, &one, base + blk, &fill_of(round))?;
                qp.submit(ns.write_req(base + blk, &one, blk))
                    .map_err(|e| e.to_string())?;
                shadow.insert(blk, round);
                n += 1;
            }
        }
        qp.flush();
        all_ok(&reap(&mut qp, n)?)?;
    }
    let v = ns.read(&mut qp, &r, base, blocks)?;
    for (blk, g) in shadow {
        let b = &v[blk as usize * bs..(blk as usize + 1) * bs];
        let want = fill_of(g);
        ensure!(
            b == &want[..],
            "block {blk} (lba {}): want generation {g} ({:#04x}), got {:#04x}",
            base + blk,
            want[0],
            b[0]
        );
    }
    Ok(Outcome::Pass)
}

/// On a format whose metadata is the 8-byte PI alone: data written without metadata gets
/// PI from the controller (PRACT), which reads back valid (guard, reference tags); data
/// written with the suite's PI reads back without metadata (the controller checks and
/// strips it); a write whose PI has a bad guard is refused by the controller (PRCHK). Each
/// I/O is larger than one command, so split.
pub(crate) fn pi_inserted_by_the_controller(t: &mut Ctx) -> CaseResult {
    let ns = t.ns()?;
    let c = t.open()?;
    let bs = ns.block_size;
    let nlb = ns.chunk_blocks() + 3;
    let mut qp = qpair(c, 32)?;
    let plain = lent(c, &mut qp, nlb * bs)?;
    let b = Blocks::lend(c.dma_pool(), &mut qp, ns, nlb)?;
    let mut space = Space::at(ns, 14_000);
    // Written without metadata: the controller's PI.
    let lba = space.take(c.dma_pool(), &mut qp, nlb as u64)?;
    let data = pattern(nlb * bs, 0x9A);
    put(&mut qp, &plain, 0, &data)?;
    must(
        &mut qp,
        IoRequest::write(ns.nsid, lba, nlb as u32, plain, 1),
        &format!("write of {nlb} blocks at lba {lba} without metadata (PRACT)"),
    )?;
    let got = ns
        .read_with(&mut qp, &b, lba, nlb, &|_| Some(Check::Controller))
        .map_err(|e| format!("the pi the controller inserted: {e}"))?;
    compare(&got, &data, bs).map_err(|e| format!("written without metadata, read with: {e}"))?;
    // Written with the suite's PI, read without metadata.
    let lba = space.take(c.dma_pool(), &mut qp, nlb as u64)?;
    let data = pattern(nlb * bs, 0x9B);
    ns.write(&mut qp, &b, lba, &data)?;
    fill(&mut qp, &plain, 0xEE)?;
    must(
        &mut qp,
        IoRequest::read(ns.nsid, lba, nlb as u32, plain, 2),
        &format!("read of {nlb} blocks at lba {lba} without metadata (PRACT)"),
    )?;
    compare(&contents(&qp, &plain)?, &data, bs)
        .map_err(|e| format!("written with pi, read without: {e}"))?;
    // A bad guard: refused by the controller.
    let one = b.sub(ns, 0, 1)?;
    let lba = space.take(c.dma_pool(), &mut qp, 1)?;
    ns.stage(&mut qp, &one, lba, &pattern(bs, 0x9C))?;
    // The guard is the PI's first two bytes, after the data (extended) or in the metadata.
    let m = ns.meta.expect("a pi format has metadata");
    let at = if m.extended {
        bs + m.pi_offset()
    } else {
        m.pi_offset()
    };
    let s = if m.extended { one.data } else { one.md };
    let mut guard = [0u8; 2];
    qp.read_lent(&s, at, &mut guard)
        .map_err(|e| e.to_string())?;
    put(&mut qp, &s, at, &[!guard[0], guard[1]])?;
    let r = run_one(&mut qp, ns.write_req(lba, &one, 3))?;
    expect_nvme(
        r,
        Status::E2E_GUARD_CHECK_ERROR,
        &format!("a write at lba {lba} whose pi guard is wrong"),
    )?;
    Ok(Outcome::Pass)
}

//! I/O queue pairs against the emulated controller: data integrity across sizes and
//! offsets, splitting, zeroes, overflow and Busy, doorbell accounting, shadow doorbells.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use common::*;
use kestrel::emu::{EmuConfig, EmuNamespace, EmuStore};
use kestrel::io::{IoOp, IoRequest, SubmitError};
use kestrel::target::TargetQueue;
use kestrel::{DoorbellMode, QpairOptions};

fn write_read_verify(cfg: EmuConfig, sizes_blocks: &[u32], offsets: &[usize]) {
    let (_emu, c) = emu_with(cfg);
    let bs = c.namespaces()[0].block_size as usize;
    let mut qp = c
        .create_io_qpair(&QpairOptions {
            depth: 64,
            ..Default::default()
        })
        .unwrap();
    let max_blocks = *sizes_blocks.iter().max().unwrap() as usize;
    let max_off = *offsets.iter().max().unwrap();
    let wbuf = lend(&mut qp, c.dma_pool(), max_blocks * bs + max_off);
    let rbuf = lend(&mut qp, c.dma_pool(), max_blocks * bs + max_off);
    let mut lba = 0u64;
    for &nlb in sizes_blocks {
        for &off in offsets {
            let len = nlb as usize * bs;
            let data = pattern(len, lba * 31 + off as u64);
            qp.write_lent(&wbuf, off, &data).unwrap();
            fill_lent(&mut qp, &rbuf, 0);
            qp.submit(IoRequest::write(
                1,
                lba,
                nlb,
                wbuf.slice(off, len).unwrap(),
                1,
            ))
            .unwrap();
            qp.flush();
            let w = reap(&mut qp, 1);
            assert_eq!(w[0].result, Ok(()), "write nlb {nlb} off {off}");
            qp.submit(IoRequest::read(
                1,
                lba,
                nlb,
                rbuf.slice(off, len).unwrap(),
                2,
            ))
            .unwrap();
            qp.flush();
            let r = reap(&mut qp, 1);
            assert_eq!(r[0].result, Ok(()), "read nlb {nlb} off {off}");
            let mut got = vec![0u8; len];
            qp.read_lent(&rbuf, off, &mut got).unwrap();
            assert!(
                got == data,
                "data mismatch for nlb {nlb} at buffer offset {off}"
            );
            lba += nlb as u64;
        }
    }
    assert_eq!(qp.outstanding(), 0);
}

#[test]
fn sizes_from_one_block_to_four_times_mdts() {
    // MDTS 5 = 128 KiB = 32 blocks of 4 KiB; go to 4 x MDTS and odd sizes around it.
    write_read_verify(
        EmuConfig::default(),
        &[1, 2, 3, 8, 31, 32, 33, 64, 100, 128],
        &[0],
    );
}

#[test]
fn prp1_offsets_within_a_page() {
    write_read_verify(
        EmuConfig {
            namespaces: vec![EmuNamespace::new(64 << 20, 512, EmuStore::Memory)],
            ..Default::default()
        },
        &[1, 7, 8, 9, 16, 300],
        &[0, 4, 512, 2048, 4092 - 508],
    );
}

#[test]
fn chained_prp_lists_without_mdts() {
    // No MDTS: commands of 8 MiB need 2048 PRP entries, four list pages chained.
    let (_emu, c) = emu_with(EmuConfig {
        mdts: 0,
        ..Default::default()
    });
    let mut qp = c
        .create_io_qpair(&QpairOptions {
            depth: 8,
            max_command_bytes: 8 << 20,
            ..Default::default()
        })
        .unwrap();
    let len = 8 << 20;
    let wbuf = lend(&mut qp, c.dma_pool(), len + 4096);
    let rbuf = lend(&mut qp, c.dma_pool(), len + 4096);
    let data = pattern(len, 77);
    qp.write_lent(&wbuf, 0, &data).unwrap();
    qp.submit(IoRequest::write(
        1,
        10,
        2048,
        wbuf.slice(0, len).unwrap(),
        1,
    ))
    .unwrap();
    qp.flush();
    assert_eq!(reap(&mut qp, 1)[0].result, Ok(()));
    assert_eq!(qp.stats().split, 0, "one command, not split");
    // Read back with PRP1 at an offset: 2049 entries.
    qp.submit(IoRequest::read(
        1,
        10,
        2048,
        rbuf.slice(512, len).unwrap(),
        2,
    ))
    .unwrap();
    qp.flush();
    assert_eq!(reap(&mut qp, 1)[0].result, Ok(()));
    let mut got = vec![0u8; len];
    qp.read_lent(&rbuf, 512, &mut got).unwrap();
    assert!(got == data);
}

#[test]
fn splitting_completes_parent_once() {
    let (_emu, c) = emu();
    let mdts = c.max_transfer_bytes() as usize;
    let mut qp = c
        .create_io_qpair(&QpairOptions {
            depth: 4, // 3 trackers: a 4 x MDTS request must wait for its own children
            ..Default::default()
        })
        .unwrap();
    let len = 4 * mdts + 8192;
    let buf = lend(&mut qp, c.dma_pool(), len);
    qp.write_lent(&buf, 0, &pattern(len, 5)).unwrap();
    let nlb = (len / 4096) as u32;
    qp.submit(IoRequest::write(1, 0, nlb, buf, 42)).unwrap();
    qp.submit(IoRequest::flush(1, 43)).unwrap();
    qp.flush();
    let done = reap(&mut qp, 2);
    assert_eq!(
        done.iter().map(|c| c.token).collect::<Vec<_>>(),
        vec![42, 43]
    );
    assert!(done.iter().all(|c| c.result.is_ok()));
    assert_quiet(&mut qp);
    let st = qp.stats();
    assert_eq!(st.split, 1);
    assert_eq!(st.commands, 5 + 1, "five children and a flush");
    assert_eq!(st.completed, 2);
}

#[test]
fn write_zeroes_and_deallocate_read_back_zeros() {
    let (_emu, c) = emu();
    let ns = c.namespaces()[0].clone();
    assert!(ns.identify.deallocated_reads_zeroes());
    let mut qp = c.create_io_qpair(&QpairOptions::default()).unwrap();
    let buf = lend(&mut qp, c.dma_pool(), 64 * 4096);
    fill_lent(&mut qp, &buf, 0xA5);
    qp.submit(IoRequest::write(1, 100, 64, buf, 1)).unwrap();
    qp.submit(IoRequest::write_zeroes(1, 100, 16, 2)).unwrap();
    qp.submit(IoRequest::deallocate(1, 132, 16, 3)).unwrap();
    qp.submit(IoRequest::flush(1, 4)).unwrap();
    qp.flush();
    let done = reap(&mut qp, 4);
    assert!(done.iter().all(|c| c.result.is_ok()), "{done:?}");
    fill_lent(&mut qp, &buf, 0xFF);
    qp.submit(IoRequest::read(1, 100, 64, buf, 5)).unwrap();
    qp.flush();
    assert_eq!(reap(&mut qp, 1)[0].result, Ok(()));
    let v = lent_bytes(&qp, &buf);
    let block = |i: usize| &v[i * 4096..(i + 1) * 4096];
    for i in 0..64 {
        let zero = (0..16).contains(&i) || (32..48).contains(&i);
        let want = if zero { 0 } else { 0xA5 };
        assert!(block(i).iter().all(|&b| b == want), "block {i}");
    }
}

#[test]
fn vectored_io_over_several_buffers() {
    let (_emu, c) = emu();
    let mut qp = c.create_io_qpair(&QpairOptions::default()).unwrap();
    let a = lend(&mut qp, c.dma_pool(), 8192);
    let b = lend(&mut qp, c.dma_pool(), 4096);
    let d = lend(&mut qp, c.dma_pool(), 16384);
    let data = pattern(28672, 9);
    qp.write_lent(&a, 0, &data[..8192]).unwrap();
    qp.write_lent(&b, 0, &data[8192..12288]).unwrap();
    qp.write_lent(&d, 0, &data[12288..]).unwrap();
    let req = IoRequest::vectored(IoOp::Write, 1, 40, 7, &[a, b, d], 1).unwrap();
    qp.submit(req).unwrap();
    qp.flush();
    assert_eq!(reap(&mut qp, 1)[0].result, Ok(()));
    let r = lend(&mut qp, c.dma_pool(), 28672);
    qp.submit(IoRequest::read(1, 40, 7, r, 2)).unwrap();
    qp.flush();
    assert_eq!(reap(&mut qp, 1)[0].result, Ok(()));
    assert!(lent_bytes(&qp, &r) == data);
    // A first segment that does not end on a page boundary cannot be followed by another
    // one in a PRP-described transfer.
    let odd = a.slice(0, 6144).unwrap();
    let req = IoRequest::vectored(IoOp::Write, 1, 0, 3, &[odd, d], 3).unwrap();
    let r = qp.submit(req);
    assert!(
        matches!(
            r,
            Err(SubmitError::Invalid {
                token: 3,
                reason: kestrel::io::InvalidRequest::Misaligned { index: 0, .. }
            })
        ),
        "{r:?}"
    );
}

#[test]
fn overflow_beyond_queue_depth_then_busy() {
    let (_emu, c) = emu();
    let depth = 16u32;
    let sw = 3 * depth;
    let mut qp = c
        .create_io_qpair(&QpairOptions {
            depth,
            sw_queue_depth: sw,
            ..Default::default()
        })
        .unwrap();
    let slots = qp.slots() as u32;
    assert_eq!(slots, depth - 1);
    let buf = lend(&mut qp, c.dma_pool(), 4096);
    // Fill trackers and the software queue without reaping.
    let total = slots + sw;
    for i in 0..total {
        qp.submit(IoRequest::read(1, i as u64, 1, buf, i as u64))
            .unwrap_or_else(|e| panic!("submit {i}: {e}"));
    }
    assert_eq!(qp.queued() as u32, sw);
    // Everything is full now: the next request comes back untouched.
    let extra = IoRequest::read(1, 999, 1, buf, 999_999);
    match qp.submit(extra) {
        Err(SubmitError::Busy(b)) => {
            assert_eq!(b.request, extra);
            assert_eq!(b.in_flight, slots);
            assert_eq!(b.queued, sw);
        }
        other => panic!("expected Busy, got {other:?}"),
    }
    qp.flush();
    let done = reap(&mut qp, total as usize);
    // Exactly once each, and in submission order (one tracker reused in FIFO order).
    let tokens: Vec<u64> = done.iter().map(|c| c.token).collect();
    assert_eq!(tokens, (0..total as u64).collect::<Vec<_>>());
    assert!(done.iter().all(|c| c.result.is_ok()));
    assert_quiet(&mut qp);
    assert_eq!(qp.outstanding(), 0);
    assert_eq!(qp.free_slots() as u32, slots);
    let st = qp.stats();
    assert_eq!(st.submitted, total as u64);
    assert_eq!(st.completed, total as u64);
    assert_eq!(st.sw_queued, sw as u64);
}

#[test]
fn four_times_depth_in_one_go() {
    let (_emu, c) = emu();
    let depth = 32u32;
    let mut qp = c
        .create_io_qpair(&QpairOptions {
            depth,
            sw_queue_depth: 4 * depth,
            ..Default::default()
        })
        .unwrap();
    let buf = lend(&mut qp, c.dma_pool(), 4096 * 4 * depth as usize);
    qp.write_lent(&buf, 0, &pattern(buf.len(), 1)).unwrap();
    let reqs: Vec<IoRequest> = (0..4 * depth as u64)
        .map(|i| IoRequest::write(1, i, 1, buf.slice(i as usize * 4096, 4096).unwrap(), i))
        .collect();
    assert_eq!(qp.submit_batch(&reqs).unwrap(), reqs.len());
    let done = reap(&mut qp, reqs.len());
    let mut seen = HashMap::new();
    for c in &done {
        *seen.entry(c.token).or_insert(0) += 1;
        assert_eq!(c.result, Ok(()));
    }
    assert_eq!(seen.len(), reqs.len());
    assert!(seen.values().all(|&n| n == 1));
    assert_quiet(&mut qp);
}

fn doorbell_run(mode: DoorbellMode, shadow: bool) -> (kestrel::QueueStats, u64) {
    let (_emu, c) = emu_with(EmuConfig {
        shadow_doorbells: shadow,
        ..Default::default()
    });
    let mut qp = c
        .create_io_qpair(&QpairOptions {
            depth: 64,
            doorbell: mode,
            shadow_doorbells: shadow,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(qp.uses_shadow_doorbells(), shadow);
    let buf = lend(&mut qp, c.dma_pool(), 4096);
    let batches = 50u64;
    let mut nonempty_passes = 0u64;
    for b in 0..batches {
        let reqs: Vec<IoRequest> = (0..32)
            .map(|i| IoRequest::read(1, i, 1, buf, b * 32 + i))
            .collect();
        assert_eq!(qp.submit_batch(&reqs).unwrap(), 32);
        let mut got = 0;
        while got < 32 {
            let before = qp.stats().cq_doorbell_writes + qp.stats().shadow_doorbell_updates;
            let n = qp.process_completions(128, &mut |_| got += 1);
            if n > 0 {
                nonempty_passes += 1;
            }
            let after = qp.stats().cq_doorbell_writes + qp.stats().shadow_doorbell_updates;
            assert!(
                after - before <= 1,
                "at most one cq doorbell update per pass"
            );
        }
    }
    // The CQ head of the last pass is published by the flush that ends the batch (or the
    // next pass); publish it so every pass is counted.
    qp.flush();
    (qp.stats(), nonempty_passes)
}

#[test]
fn batched_doorbells_once_per_batch() {
    let (st, nonempty) = doorbell_run(DoorbellMode::Batched, false);
    assert_eq!(st.commands, 50 * 32);
    assert_eq!(
        st.sq_doorbell_writes, 50,
        "one sq doorbell write per batch of 32"
    );
    assert!(
        st.cq_doorbell_writes <= nonempty,
        "{} > {nonempty}",
        st.cq_doorbell_writes
    );
    assert!(st.cq_doorbell_writes >= 1);
}

#[test]
fn immediate_doorbells_once_per_command() {
    let (st, nonempty) = doorbell_run(DoorbellMode::Immediate, false);
    assert_eq!(st.sq_doorbell_writes, 50 * 32);
    assert!(st.cq_doorbell_writes <= nonempty);
}

#[test]
fn shadow_doorbells_account_for_every_update() {
    let (st, nonempty) = doorbell_run(DoorbellMode::Batched, true);
    // Every doorbell update is either an MMIO write or a shadow update that needed none:
    // one SQ update per batch, one CQ update per non-empty reaping pass.
    let mmio = st.sq_doorbell_writes + st.cq_doorbell_writes;
    assert_eq!(mmio + st.shadow_doorbell_updates, 50 + nonempty, "{st:?}");
    // The emulator polls the shadow page while busy and keeps EventIdx one behind, so
    // some updates need no MMIO at all (how many depends on when it backs off to sleep;
    // the benchmark reports the ratio).
    assert!(st.shadow_doorbell_updates > 0, "{st:?}");
}

/// A ring of 33 entries with 32 commands in flight, reaped at most 8 per pass, on a
/// controller with shadow doorbells configured: the CQ wraps at a different point of each
/// pass, and SQ tail and CQ head updates land at every position relative to the
/// controller's passes (busy, polling, armed before sleeping). Every request completes
/// exactly once, the controller runs each command exactly once, and progress never stops
/// for long. `event_idx` false is a qpair that opts out of shadow doorbells on that
/// controller: it must keep the shadow page current too (the controller takes doorbell
/// values from there), and before it did, not a single I/O completed.
///
/// The test thread is deliberately not pinned: the emulator thread inherits the CPU
/// affinity of the thread that starts it, and sharing one core with this busy-polling
/// loop would let the two make progress only at scheduler time slices (a few thousand
/// I/Os per second, which looks like a hang).
fn small_ring_soak(store: EmuStore, event_idx: bool, ios: u64) {
    let (emu, c) = emu_with(EmuConfig {
        namespaces: vec![EmuNamespace::new(16 << 20, 4096, store)],
        ..Default::default()
    });
    assert!(c.shadow_doorbells(), "the emulator offers shadow doorbells");
    let mut qp = c
        .create_io_qpair(&QpairOptions {
            depth: 33,
            shadow_doorbells: event_idx,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(qp.uses_shadow_doorbells(), event_idx);
    assert_eq!(qp.slots(), 32);
    let buf = lend(&mut qp, c.dma_pool(), 4096);
    let blocks = c.namespaces()[0].num_blocks;
    let mut seen = vec![false; ios as usize];
    let (mut issued, mut done) = (0u64, 0u64);
    let mut last_progress = Instant::now();
    let stall = Duration::from_secs(10);
    while done < ios {
        while issued < ios && issued - done < 32 {
            qp.submit(IoRequest::read(1, issued % blocks, 1, buf, issued))
                .unwrap();
            issued += 1;
        }
        qp.flush();
        let n = qp.process_completions(8, &mut |c| {
            assert_eq!(c.result, Ok(()), "token {}", c.token);
            let s = &mut seen[c.token as usize];
            assert!(!*s, "token {} completed twice", c.token);
            *s = true;
            done += 1;
        });
        if n > 0 {
            last_progress = Instant::now();
        } else {
            assert!(
                last_progress.elapsed() < stall,
                "no completion for {stall:?} after {done} of {ios} ({issued} issued): {}; {:?}; {:?}",
                qp.doorbell_state(),
                qp.stats(),
                emu.stats()
            );
        }
    }
    let st = qp.stats();
    assert_eq!((st.submitted, st.completed, st.commands), (ios, ios, ios));
    assert_eq!((st.bogus_completions, st.retries, st.timeouts), (0, 0, 0));
    if !event_idx {
        assert_eq!(
            st.shadow_doorbell_updates, 0,
            "every update rings MMIO: {st:?}"
        );
    }
    let es = emu.stats();
    assert_eq!(es.reads, ios, "each command run once: {es:?}");
    assert_eq!((es.doorbell_errors, es.error_completions), (0, 0), "{es:?}");
    assert_quiet(&mut qp);
}

#[test]
fn small_ring_with_shadow_doorbells_null_store() {
    small_ring_soak(EmuStore::Null, true, 300_000);
}

#[test]
fn small_ring_with_shadow_doorbells_memory_store() {
    small_ring_soak(EmuStore::Memory, true, 200_000);
}

#[test]
fn small_ring_opting_out_of_shadow_doorbells() {
    small_ring_soak(EmuStore::Null, false, 100_000);
    small_ring_soak(EmuStore::Memory, false, 100_000);
}

#[test]
fn cancel_queued_request() {
    let (_emu, c) = emu();
    let mut qp = c
        .create_io_qpair(&QpairOptions {
            depth: 2,
            ..Default::default()
        })
        .unwrap();
    let buf = lend(&mut qp, c.dma_pool(), 4096);
    qp.submit(IoRequest::read(1, 0, 1, buf, 1)).unwrap();
    qp.submit(IoRequest::read(1, 1, 1, buf, 2)).unwrap();
    qp.submit(IoRequest::read(1, 2, 1, buf, 3)).unwrap();
    assert!(qp.cancel_queued(2));
    assert!(!qp.cancel_queued(1), "token 1 is at the device");
    qp.flush();
    let mut done = reap(&mut qp, 3);
    done.sort_by_key(|c| c.token);
    assert_eq!(done[0].result, Ok(()));
    assert_eq!(done[1].result, Err(kestrel::IoError::Cancelled));
    assert_eq!(done[2].result, Ok(()));
}

#[test]
fn memory_is_bounded_and_reported() {
    let (_emu, c) = emu();
    let qp = c
        .create_io_qpair(&QpairOptions {
            depth: 128,
            ..Default::default()
        })
        .unwrap();
    let m = qp.memory_bytes();
    // About one 4 KiB PRP page per slot plus the rings, the parents, the free CID ring
    // (65536 16-bit slots) and the software queue's 1024 requests (each with its data
    // segments and metadata inline).
    let sw = 1024 * std::mem::size_of::<kestrel::io::IoRequest>();
    let cids = 65536 * 2;
    assert!(
        (127 * 4096..127 * 4096 * 2 + cids + sw / 4).contains(&m),
        "{m}"
    );
}

/// Once a queue has taken the submission fast path (after a valid read), every request
/// still gets every rule: each broken one gets the same error as on a fresh queue, the
/// valid requests that follow still complete, and a transfer of more pages than two
/// (a PRP list) goes through as well.
#[test]
fn every_rule_holds_once_the_fast_path_is_open() {
    use kestrel::io::{InvalidRequest, IoMeta};
    let (_emu, c) = emu();
    let blocks = c.namespaces()[0].num_blocks;
    let mut qp = c.create_io_qpair(&QpairOptions::default()).unwrap();
    let buf = lend(&mut qp, c.dma_pool(), 4 * 4096);
    let read = |lba, nlb, token| IoRequest::read(1, lba, nlb, buf, token);
    let refused = |qp: &mut kestrel::IoQpair, r: IoRequest| match qp.submit(r) {
        Err(SubmitError::Invalid { reason, .. }) => reason,
        other => panic!("{r:?} was not refused: {other:?}"),
    };
    for round in 0..2u64 {
        // The first round opens the fast path; the second checks it stays right.
        qp.submit(read(0, 1, 100 + round)).unwrap();
        qp.flush();
        assert_eq!(reap(&mut qp, 1)[0].result, Ok(()));
        assert!(matches!(
            refused(&mut qp, read(0, 0, 1)),
            InvalidRequest::ZeroBlocks { .. }
        ));
        assert!(matches!(
            refused(&mut qp, read(blocks - 1, 2, 2)),
            InvalidRequest::OutOfRange { lba, nlb: 2, .. } if lba == blocks - 1
        ));
        assert!(matches!(
            refused(&mut qp, read(u64::MAX - 1, 4, 3)),
            InvalidRequest::OutOfRange { .. }
        ));
        assert!(matches!(
            refused(&mut qp, read(0, 5, 4)),
            InvalidRequest::LengthMismatch { .. }
        ));
        let odd = IoRequest::read(1, 0, 1, buf.slice(2, 4096).unwrap(), 5);
        assert!(matches!(
            refused(&mut qp, odd),
            InvalidRequest::Misaligned { .. }
        ));
        assert!(matches!(
            refused(&mut qp, IoRequest::read(7, 0, 1, buf, 6)),
            InvalidRequest::InactiveNamespace { nsid: 7 }
        ));
        assert!(matches!(
            refused(&mut qp, IoRequest::read(0, 0, 1, buf, 7)),
            InvalidRequest::InactiveNamespace { nsid: 0 }
        ));
        let mut with_meta = read(0, 1, 8);
        with_meta.meta = IoMeta::separate(buf.slice(0, 64).unwrap());
        assert!(matches!(
            refused(&mut qp, with_meta),
            InvalidRequest::Metadata { .. }
        ));
        // Four pages: a PRP list.
        qp.submit(read(8, 4, 200 + round)).unwrap();
        qp.flush();
        assert_eq!(reap(&mut qp, 1)[0].result, Ok(()));
    }
    let st = qp.stats();
    assert_eq!((st.submitted, st.completed), (4, 4));
    assert_eq!(qp.outstanding(), 0);
}

/// What the fast path leaves out, immediate doorbells and error injection, still happens
/// when it is turned on after the fast path has been taken.
#[test]
fn immediate_mode_and_injection_after_the_fast_path_opened() {
    use kestrel::nvme::qpair::ErrorInjection;
    use kestrel::spec::{nvm_opc, Status};
    let (_emu, c) = emu();
    // Every doorbell an MMIO write, so each one counts in `sq_doorbell_writes`.
    let mut qp = c
        .create_io_qpair(&QpairOptions {
            shadow_doorbells: false,
            ..Default::default()
        })
        .unwrap();
    let buf = lend(&mut qp, c.dma_pool(), 4096);
    for i in 0..4 {
        qp.submit(IoRequest::read(1, i, 1, buf, i)).unwrap();
    }
    qp.flush();
    reap(&mut qp, 4);
    // Immediate mode: one SQ doorbell per command, with no flush.
    qp.set_doorbell_mode(DoorbellMode::Immediate);
    let before = qp.stats().sq_doorbell_writes;
    for i in 0..4 {
        qp.submit(IoRequest::read(1, i, 1, buf, 10 + i)).unwrap();
    }
    assert_eq!(qp.stats().sq_doorbell_writes - before, 4);
    reap(&mut qp, 4);
    qp.set_doorbell_mode(DoorbellMode::Batched);
    for i in 0..4 {
        qp.submit(IoRequest::read(1, i, 1, buf, 20 + i)).unwrap();
    }
    qp.flush();
    reap(&mut qp, 4);
    // An injection rule added now applies to the next read.
    let status = Status::UNRECOVERED_READ_ERROR.with_dnr(true);
    assert!(qp.inject_error(ErrorInjection {
        opcode: Some(nvm_opc::READ),
        status,
        count: 1,
        submit: false,
    }));
    qp.submit(IoRequest::read(1, 0, 1, buf, 30)).unwrap();
    qp.submit(IoRequest::read(1, 1, 1, buf, 31)).unwrap();
    qp.flush();
    let mut done = reap(&mut qp, 2);
    done.sort_by_key(|c| c.token);
    assert_eq!(done[0].result, Err(kestrel::io::IoError::Nvme(status)));
    assert_eq!(done[1].result, Ok(()));
}

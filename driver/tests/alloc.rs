//! No heap allocation on the I/O path: a counting global allocator watches the submitting
//! thread across 100 000 I/Os after warm-up.

mod common;
#[path = "support/counting_alloc.rs"]
mod counting_alloc;

use common::*;
use counting_alloc::{unwatch_this_thread, Counter};
use kestrel::emu::testkit::meta_format;
use kestrel::emu::{EmuConfig, EmuNamespace, EmuStore};
use kestrel::io::{IoMeta, IoRequest};
use kestrel::spec::pi::{PiFormat, PiType};
use kestrel::target::TargetQueue;
use kestrel::{DmaPool, DmaSlice, IoQpair, QpairOptions};

#[test]
fn no_allocation_across_100k_ios() {
    let (_emu, c) = emu();
    let mut qp = c
        .create_io_qpair(&QpairOptions {
            depth: 64,
            sw_queue_depth: 256,
            ..Default::default()
        })
        .unwrap();
    let buf = lend(&mut qp, c.dma_pool(), 128 * 4096);
    fill_lent(&mut qp, &buf, 7);
    let big = lend(&mut qp, c.dma_pool(), 4 << 20);
    let run = |qp: &mut kestrel::IoQpair, n: u64| {
        let mut done = 0u64;
        let mut issued = 0u64;
        while done < n {
            // Keep well past the queue depth so the software queue and splitting are on
            // the path too.
            while issued < n && issued - done < 200 {
                let i = issued;
                let req = match i % 50 {
                    0 => IoRequest::write(
                        1,
                        4096 + (i % 64) * 64,
                        64,
                        big.slice(0, 64 * 4096).unwrap(),
                        i,
                    ),
                    1 => IoRequest::flush(1, i),
                    2 => IoRequest::write_zeroes(1, i % 1000, 4, i),
                    3 => IoRequest::deallocate(1, i % 1000, 4, i),
                    n if n % 2 == 0 => IoRequest::write(
                        1,
                        i % 10_000,
                        1,
                        buf.slice((i % 128) as usize * 4096, 4096).unwrap(),
                        i,
                    ),
                    _ => IoRequest::read(
                        1,
                        i % 10_000,
                        1,
                        buf.slice((i % 128) as usize * 4096, 4096).unwrap(),
                        i,
                    ),
                };
                qp.submit(req).unwrap();
                issued += 1;
            }
            qp.flush();
            qp.process_completions(64, &mut |c| {
                assert!(c.result.is_ok());
                done += 1;
            });
        }
    };
    run(&mut qp, 2_000);
    let counter = Counter::new();
    counter.watch_this_thread();
    counter.arm();
    run(&mut qp, 100_000);
    let n = counter.disarm();
    unwatch_this_thread();
    let st = qp.stats();
    assert!(
        st.split > 0 && st.sw_queued > 0,
        "the run exercised splitting and queueing: {st:?}"
    );
    assert_eq!(n, 0, "heap allocations on the i/o path");
}

/// The same with metadata: separate metadata with PI (MPTR, PRCHK, split pieces) and an
/// extended-LBA namespace beside it, the PI generated and checked in software on the same
/// thread: still no allocation.
#[test]
fn no_allocation_with_metadata_and_software_pi() {
    let (_emu, c) = emu_with(EmuConfig {
        namespaces: vec![meta_ns(16, false, 1), meta_ns(8, true, 0)],
        ..Default::default()
    });
    let mut qp = c
        .create_io_qpair(&QpairOptions {
            depth: 64,
            sw_queue_depth: 256,
            ..Default::default()
        })
        .unwrap();
    let mut w = MetaWorkload::new(&mut qp, c.dma_pool());
    w.run(&mut qp, 2_000);
    let counter = Counter::new();
    counter.watch_this_thread();
    counter.arm();
    w.run(&mut qp, 50_000);
    let n = counter.disarm();
    unwatch_this_thread();
    let st = qp.stats();
    assert!(st.split > 0 && st.sw_queued > 0, "{st:?}");
    assert_eq!(n, 0, "heap allocations on the i/o path");
}

/// A 16 MiB namespace of 512 B blocks in memory, with `ms` bytes of metadata per block.
fn meta_ns(ms: u16, extended: bool, pi_type: u8) -> EmuNamespace {
    EmuNamespace {
        format: meta_format(ms, extended, pi_type, false),
        ..EmuNamespace::new(16 << 20, 512, EmuStore::Memory)
    }
}

/// The buffers of the metadata run, all allocated and lent to the queue before it: 128
/// slots of data and metadata, the big write with its PI, and the scratch the software PI
/// is computed in.
struct MetaWorkload {
    data: DmaSlice,
    md: DmaSlice,
    big: DmaSlice,
    bigmd: DmaSlice,
    pif: PiFormat,
    scratch: Vec<u8>,
    mscratch: Vec<u8>,
}

// Slot i: 8 blocks of 512 B data (+8 B interleaved for nsid 2), 8 x 16 B metadata.
const DSTRIDE: usize = 8 * 520;
const MSTRIDE: usize = 8 * 16;

impl MetaWorkload {
    fn new(qp: &mut IoQpair, pool: &DmaPool) -> Self {
        let data = lend(qp, pool, 128 * DSTRIDE);
        let md = lend(qp, pool, 128 * MSTRIDE);
        let big = lend(qp, pool, 1 << 20);
        let bigmd = lend(qp, pool, 2048 * 16);
        let pif = PiFormat {
            data_size: 512,
            ms: 16,
            extended: false,
            pi_first: false,
            pi_type: PiType::Type1,
        };
        let scratch = vec![0u8; DSTRIDE];
        let mscratch = vec![0u8; MSTRIDE];
        // The big write: PI for 2048 blocks of zeroes at LBA 8192, generated once.
        let mut bigmd_bytes = vec![0u8; 2048 * 16];
        pif.fill(&mut vec![0u8; 1 << 20], &mut bigmd_bytes, 2048, 8192, 0);
        qp.write_lent(&bigmd, 0, &bigmd_bytes).unwrap();
        MetaWorkload {
            data,
            md,
            big,
            bigmd,
            pif,
            scratch,
            mscratch,
        }
    }

    /// Runs `n` requests to completion.
    fn run(&mut self, qp: &mut IoQpair, n: u64) {
        let mut done = 0u64;
        let mut issued = 0u64;
        while done < n {
            // At most 100 outstanding over 128 slots: a slot's buffers are never shared by
            // two requests in flight (a write's PI must match its data when it executes).
            while issued < n && issued - done < 100 {
                let req = self.request(qp, issued);
                qp.submit(req).unwrap();
                issued += 1;
            }
            qp.flush();
            qp.process_completions(64, &mut |c| {
                assert!(c.result.is_ok(), "{c:?}");
                done += 1;
            });
        }
    }

    /// Request `i`: every 40th the big write, else on slot i % 128 a write or read of the
    /// extended-LBA namespace or one with separate metadata, PI made in software.
    fn request(&mut self, qp: &mut IoQpair, i: u64) -> IoRequest {
        let pif = &self.pif;
        let (scratch, mscratch) = (&mut self.scratch, &mut self.mscratch);
        let s = (i % 128) as usize;
        let lba = (i % 1000) * 8;
        let d = self.data.slice(s * DSTRIDE, DSTRIDE).unwrap();
        let m = self.md.slice(s * MSTRIDE, MSTRIDE).unwrap();
        match i % 40 {
            0 => {
                IoRequest::write(1, 8192, 2048, self.big, i).with_meta(IoMeta::separate(self.bigmd))
            }
            n if n % 4 == 1 => IoRequest::write(2, lba, 8, d, i).with_meta(IoMeta::extended()),
            n if n % 4 == 2 => IoRequest::read(2, lba, 8, d, i).with_meta(IoMeta::extended()),
            n if n % 2 == 0 => {
                // Software PI over the slot's data, into its metadata.
                qp.read_lent(&self.data, s * DSTRIDE, &mut scratch[..8 * 512])
                    .unwrap();
                pif.fill(&mut scratch[..8 * 512], mscratch, 8, lba as u32, 0);
                assert_eq!(
                    pif.check(&scratch[..8 * 512], mscratch, 8, lba as u32, 0, 0),
                    Ok(())
                );
                qp.write_lent(&self.md, s * MSTRIDE, mscratch).unwrap();
                IoRequest::write(1, lba, 8, d, i).with_meta(IoMeta::separate(m))
            }
            _ => IoRequest::read(1, lba, 8, d, i).with_meta(IoMeta::separate(m)),
        }
    }
}

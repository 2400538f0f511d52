//! Zoned namespaces (Zoned Namespace Command Set, CSI 02h) through the driver, against the
//! emulated controller: bring-up learns the zone geometry, writes go at the write pointer
//! and the device's rule comes back by its spec name, Zone Append returns the LBA it wrote,
//! Zone Management Send moves zones between states, Report Zones shows them.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use kestrel::aio::{Event, IoContext, Iocb};
use kestrel::emu::{EmuConfig, EmuFormat, EmuNamespace, EmuStore, EmuZones};
use kestrel::io::{Completion, InvalidRequest, IoError, IoRequest, ZoneAction};
use kestrel::reactor::{Backoff, IdlePolicy, Reactor};
use kestrel::spec::zns::{parse_report, ZoneDescriptor, ZoneState};
use kestrel::spec::{csi, Status};
use kestrel::target::TargetQueue;
use kestrel::{DmaSlice, IoQpair, NvmeNamespace, QpairOptions, SubmitError, Target};

const ZONE_BYTES: u64 = 1 << 20;
const BS: u32 = 4096;
const ZONE_BLOCKS: u64 = ZONE_BYTES / BS as u64;

/// nsid 1: a plain namespace; nsid 2: 16 MiB zoned, 1 MiB zones, the given limits.
fn zoned(max_open: u32, max_active: u32) -> EmuConfig {
    EmuConfig {
        namespaces: vec![
            EmuNamespace::new(8 << 20, BS, EmuStore::Memory),
            EmuNamespace {
                format: EmuFormat {
                    csi: csi::ZONED,
                    zones: EmuZones {
                        zone_size: ZONE_BYTES,
                        max_open,
                        max_active,
                        ..Default::default()
                    },
                    ..Default::default()
                },
                ..EmuNamespace::new(16 << 20, BS, EmuStore::Memory)
            },
        ],
        ..Default::default()
    }
}

fn run(qp: &mut IoQpair, req: IoRequest) -> Completion {
    qp.submit(req).expect("submitted");
    qp.flush();
    reap(qp, 1).remove(0)
}

fn status(c: &Completion) -> Status {
    match c.result {
        Err(IoError::Nvme(s)) => s,
        other => panic!("expected an nvme status, got {other:?}"),
    }
}

/// Report Zones from `slba` into `buf` (lent to `qp`).
fn report(qp: &mut IoQpair, buf: &DmaSlice, slba: u64) -> Vec<ZoneDescriptor> {
    let c = run(qp, IoRequest::report_zones(2, slba, *buf, 99));
    assert_eq!(c.result, Ok(()), "report zones");
    parse_report(&lent_bytes(qp, buf)).collect()
}

fn zone(qp: &mut IoQpair, buf: &DmaSlice, z: u64) -> ZoneDescriptor {
    report(qp, buf, z * ZONE_BLOCKS)[0]
}

#[test]
fn bring_up_serves_the_zoned_namespace_with_its_geometry() {
    let (_emu, c) = emu_with(zoned(4, 6));
    let ns = c.namespace(2).unwrap();
    assert!(ns.supported(), "{:?}", ns.unsupported);
    let z = ns.zones.expect("zone geometry");
    assert_eq!(z.zone_size, ZONE_BLOCKS);
    assert_eq!(z.zones, 16);
    assert_eq!(z.max_open, Some(4));
    assert_eq!(z.max_active, Some(6));
    // The emulator's ZASL is its MDTS.
    assert_eq!(z.zasl_bytes, c.max_transfer_bytes());
    assert!(c.namespace(1).unwrap().zones.is_none());
    let t = NvmeNamespace::new(c.clone(), 2).expect("zoned namespace opens for i/o");
    assert_eq!(t.info().zones, Some(z));
    let (_emu, c) = emu_with(zoned(0, 0));
    let z = c.namespace(2).unwrap().zones.unwrap();
    assert_eq!((z.max_open, z.max_active), (None, None), "no limits");
}

#[test]
fn writes_at_the_write_pointer_succeed_and_others_fail_with_zone_invalid_write() {
    let (_emu, c) = emu_with(zoned(0, 0));
    let mut qp = c.create_io_qpair(&QpairOptions::default()).unwrap();
    let data = lend(&mut qp, c.dma_pool(), 4 * BS as usize);
    let rep = lend(&mut qp, c.dma_pool(), 4096);
    qp.write_lent(&data, 0, &pattern(4 * BS as usize, 1))
        .unwrap();
    let z3 = 3 * ZONE_BLOCKS;
    assert_eq!(zone(&mut qp, &rep, 3).state(), Some(ZoneState::Empty));
    let w = run(&mut qp, IoRequest::write(2, z3, 2, data, 1));
    assert_eq!(w.result, Ok(()));
    let d = zone(&mut qp, &rep, 3);
    assert_eq!((d.zslba, d.wp), (z3, z3 + 2));
    assert_eq!(d.state(), Some(ZoneState::ImplicitlyOpened));
    // Behind, past and far from the write pointer: the device's rule, by its spec name.
    for lba in [z3, z3 + 3, z3 + 100] {
        let w = run(&mut qp, IoRequest::write(2, lba, 1, data, 2));
        let s = status(&w);
        assert!(s.same_code(Status::ZONE_INVALID_WRITE), "{s}");
        assert!(s.to_string().contains("Zone Invalid Write"), "{s}");
    }
    // At the write pointer again: fine, and the data reads back.
    let w = run(
        &mut qp,
        IoRequest::write(2, z3 + 2, 2, data.slice(0, 8192).unwrap(), 3),
    );
    assert_eq!(w.result, Ok(()));
    let back = lend(&mut qp, c.dma_pool(), 4 * BS as usize);
    let r = run(&mut qp, IoRequest::read(2, z3, 4, back, 4));
    assert_eq!(r.result, Ok(()));
    let mut got = vec![0u8; 4 * BS as usize];
    qp.read_lent(&back, 0, &mut got).unwrap();
    let want = pattern(4 * BS as usize, 1);
    assert_eq!(got[..8192], want[..8192]);
    assert_eq!(got[8192..], want[..8192]);
    // And on at the new write pointer.
    let end = run(&mut qp, IoRequest::write(2, z3 + 4, 1, data, 5));
    assert_eq!(end.result, Ok(()));
}

#[test]
fn zone_append_returns_distinct_lbas_inside_the_zone() {
    let (_emu, c) = emu_with(zoned(0, 0));
    let mut qp = c.create_io_qpair(&QpairOptions::default()).unwrap();
    let n = 16usize;
    let bufs: Vec<DmaSlice> = (0..n)
        .map(|i| {
            let b = lend(&mut qp, c.dma_pool(), 2 * BS as usize);
            qp.write_lent(&b, 0, &pattern(2 * BS as usize, 100 + i as u64))
                .unwrap();
            b
        })
        .collect();
    let z5 = 5 * ZONE_BLOCKS;
    for (i, b) in bufs.iter().enumerate() {
        qp.submit(IoRequest::zone_append(2, z5, 2, *b, i as u64))
            .unwrap();
    }
    qp.flush();
    let done = reap(&mut qp, n);
    let mut lbas: Vec<(u64, u64)> = done
        .iter()
        .map(|c| {
            assert_eq!(c.result, Ok(()), "{c:?}");
            (c.value, c.token)
        })
        .collect();
    lbas.sort();
    for (k, (lba, _)) in lbas.iter().enumerate() {
        assert_eq!(
            *lba,
            z5 + 2 * k as u64,
            "distinct, in the zone, back to back"
        );
    }
    // Each append's data is at the LBA its completion named.
    let back = lend(&mut qp, c.dma_pool(), 2 * BS as usize);
    for (lba, token) in lbas {
        let r = run(&mut qp, IoRequest::read(2, lba, 2, back, 1000));
        assert_eq!(r.result, Ok(()));
        let mut got = vec![0u8; 2 * BS as usize];
        qp.read_lent(&back, 0, &mut got).unwrap();
        assert_eq!(got, pattern(2 * BS as usize, 100 + token), "lba {lba}");
    }
    let rep = lend(&mut qp, c.dma_pool(), 4096);
    assert_eq!(zone(&mut qp, &rep, 5).wp, z5 + 2 * n as u64);
    // Reads and ordinary writes carry no command specific result.
    let w = run(&mut qp, IoRequest::write(2, z5 + 32, 1, back, 7));
    assert_eq!((w.result, w.value), (Ok(()), 0));
}

#[test]
fn a_full_zone_refuses_writes_until_reset() {
    let (_emu, c) = emu_with(zoned(0, 0));
    let mut qp = c.create_io_qpair(&QpairOptions::default()).unwrap();
    let chunk = (c.max_transfer_bytes() / BS as u64) as u32; // blocks per write: mdts
    let data = lend(&mut qp, c.dma_pool(), (chunk * BS) as usize);
    let rep = lend(&mut qp, c.dma_pool(), 4096);
    let z1 = ZONE_BLOCKS;
    for k in 0..(ZONE_BLOCKS / chunk as u64) {
        let w = run(
            &mut qp,
            IoRequest::write(2, z1 + k * chunk as u64, chunk, data, k),
        );
        assert_eq!(w.result, Ok(()), "write {k}");
    }
    assert_eq!(zone(&mut qp, &rep, 1).state(), Some(ZoneState::Full));
    let a = run(&mut qp, IoRequest::zone_append(2, z1, 1, data, 50));
    let s = status(&a);
    assert!(s.same_code(Status::ZONE_IS_FULL), "{s}");
    assert!(s.to_string().contains("Zone Is Full"), "{s}");
    let r = run(&mut qp, IoRequest::zone_send(2, z1, ZoneAction::Reset, 51));
    assert_eq!(r.result, Ok(()));
    let d = zone(&mut qp, &rep, 1);
    assert_eq!((d.state(), d.wp), (Some(ZoneState::Empty), z1));
    let w = run(&mut qp, IoRequest::write(2, z1, 1, data, 52));
    assert_eq!(w.result, Ok(()), "writable again after reset");
}

#[test]
fn zone_management_moves_zones_between_states() {
    let (_emu, c) = emu_with(zoned(2, 3));
    let mut qp = c.create_io_qpair(&QpairOptions::default()).unwrap();
    let rep = lend(&mut qp, c.dma_pool(), 64 * 17);
    let zs = |z: u64| z * ZONE_BLOCKS;
    let send = |qp: &mut IoQpair, z: u64, a| run(qp, IoRequest::zone_send(2, zs(z), a, 0));
    assert_eq!(send(&mut qp, 0, ZoneAction::Open).result, Ok(()));
    assert_eq!(send(&mut qp, 1, ZoneAction::Open).result, Ok(()));
    let third = send(&mut qp, 2, ZoneAction::Open);
    assert!(
        status(&third).same_code(Status::TOO_MANY_OPEN_ZONES),
        "{}",
        status(&third)
    );
    assert_eq!(send(&mut qp, 1, ZoneAction::Close).result, Ok(()));
    assert_eq!(send(&mut qp, 2, ZoneAction::Open).result, Ok(()));
    let fourth = send(&mut qp, 3, ZoneAction::Open);
    assert!(
        status(&fourth).same_code(Status::TOO_MANY_ACTIVE_ZONES),
        "{}",
        status(&fourth)
    );
    assert_eq!(send(&mut qp, 2, ZoneAction::Finish).result, Ok(()));
    // Closing an empty zone is not a valid transition.
    let bad = send(&mut qp, 9, ZoneAction::Close);
    assert!(
        status(&bad).same_code(Status::INVALID_ZONE_STATE_TRANSITION),
        "{}",
        status(&bad)
    );
    let all = report(&mut qp, &rep, 0);
    assert_eq!(all.len(), 16, "one descriptor per zone");
    let states: Vec<_> = all.iter().take(4).map(|d| d.state().unwrap()).collect();
    assert_eq!(
        states,
        [
            ZoneState::ExplicitlyOpened,
            ZoneState::Closed,
            ZoneState::Full,
            ZoneState::Empty
        ]
    );
    for (i, d) in all.iter().enumerate() {
        assert_eq!(d.zslba, zs(i as u64));
        assert_eq!(d.zcap, ZONE_BLOCKS);
    }
    // Report from the middle of a zone starts at that zone.
    assert_eq!(report(&mut qp, &rep, zs(2) + 7)[0].zslba, zs(2));
    // Select All: every zone it applies to.
    let r = run(&mut qp, IoRequest::zone_send_all(2, ZoneAction::Reset, 0));
    assert_eq!(r.result, Ok(()));
    assert!(report(&mut qp, &rep, 0)
        .iter()
        .all(|d| d.state() == Some(ZoneState::Empty)));
}

#[track_caller]
fn invalid(r: Result<(), SubmitError>) -> InvalidRequest {
    match r {
        Err(SubmitError::Invalid { reason, .. }) => reason,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn the_driver_refuses_zone_requests_it_can_judge_before_the_device() {
    let (emu, c) = emu_with(zoned(0, 0));
    let mut qp = c.create_io_qpair(&QpairOptions::default()).unwrap();
    let buf = lend(&mut qp, c.dma_pool(), 8 << 20);
    let before = emu.stats();
    let z = c.namespace(2).unwrap().zones.unwrap();
    // Zoned operations on a namespace that is not zoned.
    let e = invalid(qp.submit(IoRequest::zone_append(1, 0, 1, buf, 1)));
    assert!(matches!(e, InvalidRequest::NotZoned { nsid: 1, .. }), "{e}");
    let e = invalid(qp.submit(IoRequest::zone_send(1, 0, ZoneAction::Reset, 1)));
    assert!(e.to_string().contains("not a zoned namespace"), "{e}");
    // Zone Append and zone actions name a zone start.
    let e = invalid(qp.submit(IoRequest::zone_append(2, 3, 1, buf, 1)));
    assert!(
        matches!(
            e,
            InvalidRequest::NotZoneStart {
                lba: 3,
                zslba: 0,
                ..
            }
        ),
        "{e}"
    );
    let e = invalid(qp.submit(IoRequest::zone_send(
        2,
        ZONE_BLOCKS + 1,
        ZoneAction::Open,
        1,
    )));
    assert!(e.to_string().contains("not the start of a zone"), "{e}");
    // A Zone Append is never split: larger than ZASL is refused.
    let nlb = (z.zasl_bytes / BS as u64 + 1) as u32;
    let e = invalid(qp.submit(IoRequest::zone_append(2, 0, nlb, buf, 1)));
    assert!(matches!(e, InvalidRequest::ZonedTooLarge { .. }), "{e}");
    assert!(e.to_string().contains("zasl"), "{e}");
    // Past the last zone.
    let e = invalid(qp.submit(IoRequest::zone_send(
        2,
        16 * ZONE_BLOCKS,
        ZoneAction::Reset,
        1,
    )));
    assert!(matches!(e, InvalidRequest::OutOfRange { .. }), "{e}");
    // A report buffer too small for a header and one descriptor.
    let e = invalid(qp.submit(IoRequest::report_zones(2, 0, buf.slice(0, 64).unwrap(), 1)));
    assert!(matches!(e, InvalidRequest::LengthMismatch { .. }), "{e}");
    assert_quiet(&mut qp);
    let after = emu.stats();
    assert_eq!(
        (after.writes, after.io_invalid),
        (before.writes, before.io_invalid),
        "nothing reached the device"
    );
}

/// Through the aio API, run to completion and through a poller thread: appends whose
/// events carry distinct LBAs in the zone, Zone Invalid Write by status, a zone action,
/// report zones; zoned iocbs on a namespace that is not zoned are refused.
#[test]
fn aio_contexts_carry_zone_append_lbas_and_zone_commands() {
    let (_emu, c) = emu_with(zoned(0, 0));
    let t: Arc<dyn Target> = Arc::new(NvmeNamespace::new(c.clone(), 2).unwrap());
    let plain: Arc<dyn Target> = Arc::new(NvmeNamespace::new(c, 1).unwrap());
    let reactor = one_core_reactor(&t);
    let contexts = [
        IoContext::setup(Arc::clone(&t), 16).unwrap(),
        reactor.context(16).unwrap(),
    ];
    for (round, mut ctx) in contexts.into_iter().enumerate() {
        let buf = ctx
            .lend(t.dma_pool().alloc(8 * BS as usize).unwrap())
            .unwrap();
        ctx.write_lent(&buf, 0, &pattern(8 * BS as usize, 9))
            .unwrap();
        let rep = ctx.lend(t.dma_pool().alloc(4096).unwrap()).unwrap();
        let z = 7 + round as u64; // zone 7, then zone 8
        assert_appends_get_distinct_lbas(&mut ctx, &buf, z, round);
        // Not at the write pointer.
        ctx.submit(&[Iocb::write(z * ZONE_BYTES, buf.slice(0, 4096).unwrap(), 50)])
            .unwrap();
        let e = events(&mut ctx, 1)[0];
        let s = e.nvme_status().expect("an nvme status");
        assert!(s.same_code(Status::ZONE_INVALID_WRITE), "{s}");
        assert_report_finish_report(&mut ctx, &rep, z);
    }
    // A namespace that is not zoned refuses zoned iocbs before the device.
    let mut ctx = IoContext::setup(Arc::clone(&plain), 4).unwrap();
    let b = ctx.lend(plain.dma_pool().alloc(4096).unwrap()).unwrap();
    let e = ctx.submit(&[Iocb::zone_append(0, b, 1)]).unwrap_err();
    assert!(e.to_string().contains("zone append"), "{e}");
}

/// Collects `n` events from `ctx` (or panics after WAIT).
fn events(ctx: &mut IoContext, n: usize) -> Vec<Event> {
    let mut out = Vec::new();
    let mut buf = vec![Event::default(); 16];
    let deadline = std::time::Instant::now() + WAIT;
    while out.len() < n {
        let want = (n - out.len()).min(16);
        let got = ctx
            .getevents(1, &mut buf[..want], Some(Duration::from_millis(100)))
            .unwrap();
        out.extend_from_slice(&buf[..got]);
        assert!(std::time::Instant::now() < deadline, "events missing");
    }
    out
}

/// A reactor polling `t` on the first core.
fn one_core_reactor(t: &Arc<dyn Target>) -> Reactor {
    Reactor::builder()
        .cores(vec![core_affinity::get_core_ids().unwrap()[0].id])
        .target(Arc::clone(t))
        // Back off when idle: the poller shares the cores with the emulator and the test.
        .idle(IdlePolicy::Backoff(Backoff {
            spin_passes: 64,
            pause_passes: 64,
            yield_passes: 256,
            max_sleep: Duration::from_millis(50),
        }))
        .start()
        .unwrap()
}

/// Eight 4 KiB appends to zone `z` (empty) complete with the eight first LBAs of the zone.
fn assert_appends_get_distinct_lbas(ctx: &mut IoContext, buf: &DmaSlice, z: u64, round: usize) {
    let iocbs: Vec<Iocb> = (0..8)
        .map(|i| Iocb::zone_append(z * ZONE_BYTES, buf.slice(i * 4096, 4096).unwrap(), i as u64))
        .collect();
    assert_eq!(ctx.submit(&iocbs).unwrap(), 8);
    let mut lbas: Vec<u64> = events(ctx, 8)
        .iter()
        .map(|e| {
            assert_eq!(e.res, Ok(4096), "{e:?}");
            e.value
        })
        .collect();
    lbas.sort();
    let want: Vec<u64> = (0..8).map(|i| z * ZONE_BLOCKS + i).collect();
    assert_eq!(lbas, want, "round {round}: distinct lbas in the zone");
}

/// Zone `z`, eight blocks written: reported with its write pointer, finished, reported
/// full.
fn assert_report_finish_report(ctx: &mut IoContext, rep: &DmaSlice, z: u64) {
    let zb = z * ZONE_BYTES;
    ctx.submit(&[Iocb::report_zones(zb, *rep, 51)]).unwrap();
    assert_eq!(events(ctx, 1)[0].res, Ok(4096));
    let mut bytes = vec![0u8; 4096];
    ctx.read_lent(rep, 0, &mut bytes).unwrap();
    let d = parse_report(&bytes).next().unwrap();
    assert_eq!((d.zslba, d.wp), (z * ZONE_BLOCKS, z * ZONE_BLOCKS + 8));
    ctx.submit(&[Iocb::zone_send(zb, ZoneAction::Finish, 52)])
        .unwrap();
    assert_eq!(events(ctx, 1)[0].res, Ok(0));
    ctx.submit(&[Iocb::report_zones(zb, *rep, 53)]).unwrap();
    events(ctx, 1);
    ctx.read_lent(rep, 0, &mut bytes).unwrap();
    assert_eq!(
        parse_report(&bytes).next().unwrap().state(),
        Some(ZoneState::Full)
    );
}

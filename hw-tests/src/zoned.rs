//! The zoned namespace cases: report zones, writes at and away from the write pointer,
//! Zone Append returning the LBA it wrote, reset, a zone written to its capacity. They run on every zoned namespace the
//! driver serves and skip, with the reason, on every other namespace. Each uses the last
//! zone of the namespace (reset first, so an earlier run's data does not matter).

use kestrel::io::{Completion, IoRequest, ZoneAction, ZoneGeometry};
use kestrel::spec::zns::{parse_report, ZoneDescriptor, ZoneState};
use kestrel::spec::Status;
use kestrel::{Controller, DmaSlice, IoQpair};

use crate::blocks::Blocks;
use crate::support::{contents, expect_nvme, lent, pattern, put, qpair, reap, run_one};
use crate::verify::read_compare;
use crate::{CaseError, CaseResult, Ctx, NsDesc, Outcome};

/// The case's namespace, its zone geometry and block size, and the controller (the
/// registry runs these cases on zoned namespaces only).
fn zoned<'c>(
    t: &'c mut Ctx,
) -> Result<(&'c Controller, &'c NsDesc, ZoneGeometry, usize), CaseError> {
    let ns = t.ns()?;
    let z = ns
        .zones
        .ok_or_else(|| CaseError::Skip(format!("nsid {} is not a zoned namespace", ns.nsid)))?;
    let c = t.open()?;
    Ok((c, ns, z.geometry, ns.block_size))
}

/// `n` blocks in `s` (a zoned namespace has no metadata).
fn blocks(s: DmaSlice, n: usize) -> Blocks {
    Blocks {
        data: s,
        md: DmaSlice::EMPTY,
        n,
    }
}

/// The descriptors Report Zones gives from the zone holding `slba`, into `buf` (lent to
/// `qp`).
fn report(
    qp: &mut IoQpair,
    nsid: u32,
    buf: &DmaSlice,
    slba: u64,
) -> Result<Vec<ZoneDescriptor>, String> {
    let r = run_one(qp, IoRequest::report_zones(nsid, slba, *buf, 7))?;
    ensure!(r.is_ok(), "report zones from lba {slba}: {r:?}");
    let bytes = contents(qp, buf)?;
    Ok(parse_report(&bytes).collect())
}

/// The last zone, reset: its start and capacity.
fn fresh_zone(
    qp: &mut IoQpair,
    nsid: u32,
    z: &ZoneGeometry,
    rep: &DmaSlice,
) -> Result<(u64, u64), String> {
    let zslba = (z.zones - 1) * z.zone_size;
    let r = run_one(qp, IoRequest::zone_send(nsid, zslba, ZoneAction::Reset, 8))?;
    ensure!(r.is_ok(), "reset of the zone at lba {zslba}: {r:?}");
    let d = report(qp, nsid, rep, zslba)?;
    let d = d.first().ok_or("report zones returned no descriptor")?;
    ensure!(
        d.zslba == zslba && d.wp == zslba && d.state() == Some(ZoneState::Empty),
        "after reset: zslba {} wp {} state {:?}, want {zslba}, {zslba}, Empty",
        d.zslba,
        d.wp,
        d.state()
    );
    ensure!(d.zcap >= 8, "zone capacity {} is below 8 blocks", d.zcap);
    Ok((zslba, d.zcap))
}

pub(super) fn zoned_report_zones(t: &mut Ctx) -> CaseResult {
    let (c, ns, z, _) = zoned(t)?;
    let nsid = ns.nsid;
    let mut qp = qpair(c, 8)?;
    let rep = lent(c, &mut qp, 4096)?;
    let all = report(&mut qp, nsid, &rep, 0)?;
    let want = z.zones.min(4096 / 64 - 1) as usize;
    ensure!(all.len() == want, "{} descriptors, want {want}", all.len());
    for (i, d) in all.iter().enumerate() {
        let zslba = i as u64 * z.zone_size;
        ensure!(
            d.zslba == zslba,
            "descriptor {i}: zslba {}, want {zslba}",
            d.zslba
        );
        ensure!(
            d.zcap > 0 && d.zcap <= z.zone_size,
            "descriptor {i}: zcap {} outside 1..={}",
            d.zcap,
            z.zone_size
        );
        ensure!(
            d.state().is_some(),
            "descriptor {i}: reserved state {:#x}",
            d.zs >> 4
        );
    }
    // From the middle of the last zone: that zone first.
    let last = (z.zones - 1) * z.zone_size;
    let tail = report(&mut qp, nsid, &rep, last + 1)?;
    ensure!(
        tail.len() == 1 && tail[0].zslba == last,
        "report from lba {}: {:?}",
        last + 1,
        tail.iter().map(|d| d.zslba).collect::<Vec<_>>()
    );
    Ok(Outcome::Pass)
}

pub(super) fn zoned_write_pointer(t: &mut Ctx) -> CaseResult {
    let (c, ns, z, bs) = zoned(t)?;
    let nsid = ns.nsid;
    let mut qp = qpair(c, 8)?;
    let rep = lent(c, &mut qp, 4096)?;
    let (zslba, _) = fresh_zone(&mut qp, nsid, &z, &rep)?;
    let w = lent(c, &mut qp, 4 * bs)?;
    let data = pattern(4 * bs, u64::from(nsid) + 77);
    put(&mut qp, &w, 0, &data)?;
    let s = |off: usize, n: usize| w.slice(off * bs, n * bs).map_err(|e| e.to_string());
    let r = run_one(&mut qp, IoRequest::write(nsid, zslba, 2, s(0, 2)?, 1))?;
    ensure!(r.is_ok(), "write at the write pointer {zslba}: {r:?}");
    // Behind and ahead of the write pointer: Zone Invalid Write, by name.
    for lba in [zslba, zslba + 3] {
        let r = run_one(&mut qp, IoRequest::write(nsid, lba, 1, s(0, 1)?, 2))?;
        expect_nvme(
            r,
            Status::ZONE_INVALID_WRITE,
            &format!("write at lba {lba}, write pointer {}", zslba + 2),
        )?;
    }
    let r = run_one(&mut qp, IoRequest::write(nsid, zslba + 2, 2, s(2, 2)?, 3))?;
    ensure!(r.is_ok(), "write at the write pointer {}: {r:?}", zslba + 2);
    let d = report(&mut qp, nsid, &rep, zslba)?;
    ensure!(
        d[0].wp == zslba + 4,
        "write pointer {}, want {}",
        d[0].wp,
        zslba + 4
    );
    let rbuf = lent(c, &mut qp, 4 * bs)?;
    read_compare(
        &mut qp,
        ns,
        &blocks(rbuf, 4),
        zslba,
        &data,
        "the zone's data",
    )?;
    Ok(Outcome::Pass)
}

pub(super) fn zoned_append(t: &mut Ctx) -> CaseResult {
    let (c, ns, z, bs) = zoned(t)?;
    let nsid = ns.nsid;
    let mut qp = qpair(c, 8)?;
    let rep = lent(c, &mut qp, 4096)?;
    let (zslba, _) = fresh_zone(&mut qp, nsid, &z, &rep)?;
    let n = 4usize;
    let w = lent(c, &mut qp, n * bs)?;
    let data = pattern(n * bs, u64::from(nsid) + 99);
    put(&mut qp, &w, 0, &data)?;
    for i in 0..n {
        let s = w.slice(i * bs, bs).map_err(|e| e.to_string())?;
        qp.submit(IoRequest::zone_append(nsid, zslba, 1, s, i as u64))
            .map_err(|e| e.to_string())?;
    }
    qp.flush();
    let done: Vec<Completion> = reap(&mut qp, n)?;
    let mut lbas = Vec::new();
    for c in &done {
        ensure!(c.result.is_ok(), "append {}: {:?}", c.token, c.result);
        ensure!(
            (zslba..zslba + n as u64).contains(&c.value),
            "append {} landed at lba {}, outside {zslba}..{}",
            c.token,
            c.value,
            zslba + n as u64
        );
        lbas.push(c.value);
    }
    let mut sorted = lbas.clone();
    sorted.sort();
    sorted.dedup();
    ensure!(
        sorted.len() == n,
        "appends returned lbas {lbas:?}: not distinct"
    );
    // Each append's data is at the LBA its completion named.
    let rbuf = lent(c, &mut qp, bs)?;
    for c in &done {
        let i = c.token as usize;
        let want = &data[i * bs..(i + 1) * bs];
        let what = format!("append {i}'s data at the lba its completion named");
        read_compare(&mut qp, ns, &blocks(rbuf, 1), c.value, want, &what)?;
    }
    Ok(Outcome::Pass)
}

pub(super) fn zoned_reset(t: &mut Ctx) -> CaseResult {
    let (c, ns, z, bs) = zoned(t)?;
    let nsid = ns.nsid;
    let mut qp = qpair(c, 8)?;
    let rep = lent(c, &mut qp, 4096)?;
    let (zslba, _) = fresh_zone(&mut qp, nsid, &z, &rep)?;
    let w = lent(c, &mut qp, bs)?;
    let r = run_one(&mut qp, IoRequest::write(nsid, zslba, 1, w, 1))?;
    ensure!(r.is_ok(), "write at {zslba}: {r:?}");
    // Finish: Full, and an append is then Zone Is Full.
    let r = run_one(
        &mut qp,
        IoRequest::zone_send(nsid, zslba, ZoneAction::Finish, 2),
    )?;
    ensure!(r.is_ok(), "finish: {r:?}");
    let d = report(&mut qp, nsid, &rep, zslba)?;
    ensure!(
        d[0].state() == Some(ZoneState::Full),
        "after finish: {:?}",
        d[0].state()
    );
    let r = run_one(&mut qp, IoRequest::zone_append(nsid, zslba, 1, w, 3))?;
    expect_nvme(r, Status::ZONE_IS_FULL, "append to a full zone")?;
    // Reset: Empty, and writable from its start.
    let r = run_one(
        &mut qp,
        IoRequest::zone_send(nsid, zslba, ZoneAction::Reset, 4),
    )?;
    ensure!(r.is_ok(), "reset: {r:?}");
    let d = report(&mut qp, nsid, &rep, zslba)?;
    ensure!(
        d[0].state() == Some(ZoneState::Empty) && d[0].wp == zslba,
        "after reset: {:?} wp {}",
        d[0].state(),
        d[0].wp
    );
    let r = run_one(&mut qp, IoRequest::write(nsid, zslba, 1, w, 5))?;
    ensure!(r.is_ok(), "write at the start of the reset zone: {r:?}");
    Ok(Outcome::Pass)
}

/// Writes a fresh zone up to its capacity (ZCAP, which real zoned SSDs make smaller than
/// the zone size): a write crossing the capacity is Zone Boundary Error and changes
/// nothing, the write that reaches it makes the zone Full, and a write past it is then
/// Zone Is Full. Where the capacity is the whole zone (the last zone: the namespace's end)
/// the two writes past it are the driver's to refuse and are not sent.
pub(super) fn zoned_capacity(t: &mut Ctx) -> CaseResult {
    let (c, ns, z, bs) = zoned(t)?;
    let nsid = ns.nsid;
    let mut qp = qpair(c, 8)?;
    let rep = lent(c, &mut qp, 4096)?;
    let (zslba, zcap) = fresh_zone(&mut qp, nsid, &z, &rep)?;
    let short = zcap < z.zone_size;
    let chunk = (ns.max_command_bytes as usize / bs).clamp(1, 32) as u64;
    let w = lent(c, &mut qp, chunk as usize * bs)?;
    put(
        &mut qp,
        &w,
        0,
        &pattern(chunk as usize * bs, u64::from(nsid) + 91),
    )?;
    // Everything but the last block of the capacity, a chunk at a time.
    let last = zslba + zcap - 1;
    let mut lba = zslba;
    while lba < last {
        let n = chunk.min(last - lba);
        let s = w.slice(0, n as usize * bs).map_err(|e| e.to_string())?;
        let r = run_one(&mut qp, IoRequest::write(nsid, lba, n as u32, s, 1))?;
        ensure!(
            r.is_ok(),
            "write of {n} blocks at {lba} (capacity {zcap}): {r:?}"
        );
        lba += n;
    }
    let one = |w: &DmaSlice| w.slice(0, bs).map_err(|e| e.to_string());
    if short {
        let two = w.slice(0, 2 * bs).map_err(|e| e.to_string())?;
        let r = run_one(&mut qp, IoRequest::write(nsid, last, 2, two, 2))?;
        expect_nvme(
            r,
            Status::ZONE_BOUNDARY_ERROR,
            &format!("write of 2 blocks at {last}, across the capacity ({zcap} blocks)"),
        )?;
        let d = report(&mut qp, nsid, &rep, zslba)?;
        ensure!(
            d[0].wp == last && d[0].state() != Some(ZoneState::Full),
            "after a write across the capacity: {:?} wp {}, want wp {last}, not full",
            d[0].state(),
            d[0].wp
        );
    }
    let r = run_one(&mut qp, IoRequest::write(nsid, last, 1, one(&w)?, 3))?;
    ensure!(
        r.is_ok(),
        "write of the zone's last writable block {last}: {r:?}"
    );
    let d = report(&mut qp, nsid, &rep, zslba)?;
    ensure!(
        d[0].state() == Some(ZoneState::Full),
        "written to its capacity ({zcap} blocks): {:?} wp {}, want Full",
        d[0].state(),
        d[0].wp
    );
    if short {
        let past = zslba + zcap;
        let r = run_one(&mut qp, IoRequest::write(nsid, past, 1, one(&w)?, 4))?;
        expect_nvme(
            r,
            Status::ZONE_IS_FULL,
            &format!("write at {past}, past the capacity"),
        )?;
    }
    let r = run_one(
        &mut qp,
        IoRequest::zone_send(nsid, zslba, ZoneAction::Reset, 5),
    )?;
    ensure!(r.is_ok(), "reset: {r:?}");
    Ok(Outcome::Pass)
}

//! Zoned namespaces: Identify, the write-pointer rule, zone states and resources, Zone
//! Append, Zone Management Send and Receive, and the command set selection.

use super::*;
use crate::spec::zns::{
    zra, zsa, IdentifyNsZoned, ReportZonesHeader, ZoneDescriptor, ZoneState, ZONE_DESCRIPTOR_SIZE,
};

/// 16 MiB of 4 KiB blocks in 1 MiB zones: 16 zones of 256 blocks.
const ZONE: u64 = 256;

fn zoned_cfg(max_open: u32, max_active: u32) -> EmuConfig {
    EmuConfig {
        namespaces: vec![
            EmuNamespace::new(8 << 20, 4096, EmuStore::Memory),
            EmuNamespace {
                format: EmuFormat {
                    csi: crate::spec::csi::ZONED,
                    zones: EmuZones {
                        zone_size: 1 << 20,
                        max_open,
                        max_active,
                        ..Default::default()
                    },
                    ..Default::default()
                },
                ..EmuNamespace::new(16 << 20, 4096, EmuStore::Memory)
            },
        ],
        ..Default::default()
    }
}

/// Writes `nlb` blocks from the start of `b` (PRP2: none, the second page, or a list).
fn write(h: &mut H, q: &mut Queue, slba: u64, nlb: u32, b: &DmaBuf) -> Cqe {
    let prp2 = match nlb {
        1 => 0,
        2 => b.iova() + 4096,
        _ => prp_list_for(h, b),
    };
    h.io(q, Sqe::write(2, slba, nlb, b.iova(), prp2))
}

fn send(h: &mut H, q: &mut Queue, zslba: u64, action: u8, all: bool) -> Cqe {
    h.io(q, Sqe::zone_mgmt_send(2, zslba, action, all))
}

/// Report Zones from `slba` into a `bytes` buffer: the header's count and descriptors.
fn report(
    h: &mut H,
    q: &mut Queue,
    slba: u64,
    bytes: usize,
    zras: u8,
    partial: bool,
) -> (u64, Vec<ZoneDescriptor>) {
    let b = h.buf(bytes.next_multiple_of(4096));
    let prp2 = prp_list_for(h, &b);
    let s = Sqe::report_zones(2, slba, bytes as u32, zras, partial, b.iova(), prp2);
    assert_ok(&h.io(q, s));
    let v = b.to_vec();
    let nz = ReportZonesHeader::from_bytes(v[..64].try_into().unwrap()).nz;
    let n = (bytes / ZONE_DESCRIPTOR_SIZE - 1).min(nz as usize);
    let descs = (0..n)
        .map(|i| {
            let o = 64 * (i + 1);
            ZoneDescriptor::from_bytes(v[o..o + 64].try_into().unwrap())
        })
        .collect();
    (nz, descs)
}

fn zone_of(h: &mut H, q: &mut Queue, z: u64) -> (ZoneState, u64) {
    let (_, d) = report(h, q, z * ZONE, 128, zra::ALL, true);
    (d[0].state().unwrap(), d[0].wp)
}

#[test]
fn identify_reports_the_zoned_namespace_and_command_sets() {
    let mut h = H::new_all_io(zoned_cfg(4, 6));
    assert_eq!(
        h.bar.cap().css(),
        crate::spec::regs::css::CAP_NVM | crate::spec::regs::css::CAP_IO_COMMAND_SETS
    );
    let b = h.buf(4096);
    let c = h.admin(Sqe::identify_csi(
        cns::NAMESPACE_CSI,
        2,
        crate::spec::csi::ZONED,
        b.iova(),
    ));
    assert_ok(&c);
    let lbaf = h.id_ns(2).lba_format_index();
    let z = IdentifyNsZoned::parse(b.to_vec()[..].try_into().unwrap(), lbaf);
    assert_eq!((z.zsze, z.mar, z.mor, z.zdes), (ZONE, 5, 3, 0));
    assert_eq!(z.ozcs & 1, 1, "reads may cross zone boundaries");
    // Not zoned: no zoned structure.
    let c = h.admin(Sqe::identify_csi(cns::NAMESPACE_CSI, 1, 2, b.iova()));
    assert_status(&c, Status::INVALID_FIELD);
    let c = h.admin(Sqe::identify_csi(cns::CONTROLLER_CSI, 0, 2, b.iova()));
    assert_ok(&c);
    assert_eq!(b.to_vec()[0], 5, "ZASL = MDTS");
    let c = h.admin(Sqe::identify(cns::IO_COMMAND_SETS, 0, b.iova()));
    assert_ok(&c);
    assert_eq!(&b.to_vec()[..8], &0b101u64.to_le_bytes(), "NVM and zoned");
    // The I/O Command Set Profile: index 0 only.
    assert_ok(&h.admin(Sqe::set_features(fid::IO_COMMAND_SET_PROFILE, 0)));
    let c = h.admin(Sqe::set_features(fid::IO_COMMAND_SET_PROFILE, 1));
    assert_status(&c, Status::IO_COMMAND_SET_COMBINATION_REJECTED);
}

#[test]
fn cc_css_selects_the_zoned_commands() {
    // CC.CSS = NVM: the zoned namespace keeps its write-pointer rule, but the zoned
    // commands are not available.
    let mut h = H::new(zoned_cfg(0, 0));
    let mut q = h.pair(1, 16);
    let b = h.buf(4096);
    assert_ok(&write(&mut h, &mut q, 0, 1, &b));
    assert_status(&write(&mut h, &mut q, 5, 1, &b), Status::ZONE_INVALID_WRITE);
    let c = h.io(&mut q, Sqe::zone_append(2, 0, 1, b.iova(), 0));
    assert_status(&c, Status::INVALID_OPCODE);
    let c = send(&mut h, &mut q, 0, zsa::RESET, false);
    assert_status(&c, Status::INVALID_OPCODE);
    // CC.CSS = 111b (Admin only) is not offered: the enable fails.
    let mut h = H::start(zoned_cfg(0, 0));
    h.enable_with(h.cc().with_css(crate::spec::regs::css::CC_ADMIN_ONLY));
    assert!(h.wait_csts(|c| c.rdy() || c.cfs()).cfs());
}

#[test]
fn write_pointer_rule_and_zone_states() {
    let mut h = H::new_all_io(zoned_cfg(0, 0));
    let mut q = h.pair(1, 16);
    let mut b = h.buf(32 << 10);
    b.write_at(0, &pattern(32 << 10, 1)).unwrap();
    assert_eq!(zone_of(&mut h, &mut q, 1), (ZoneState::Empty, ZONE));
    // Sequential writes at the write pointer open the zone implicitly.
    assert_ok(&write(&mut h, &mut q, ZONE, 8, &b));
    assert_ok(&write(&mut h, &mut q, ZONE + 8, 2, &b));
    assert_eq!(
        zone_of(&mut h, &mut q, 1),
        (ZoneState::ImplicitlyOpened, ZONE + 10)
    );
    // Not at the write pointer, behind or ahead.
    for slba in [ZONE, ZONE + 11, ZONE + 100] {
        let c = write(&mut h, &mut q, slba, 1, &b);
        assert_status(&c, Status::ZONE_INVALID_WRITE);
    }
    // Across the end of the zone.
    assert_ok(&send(&mut h, &mut q, 2 * ZONE, zsa::OPEN, false));
    let mut z2 = 2 * ZONE;
    while z2 < 3 * ZONE - 8 {
        assert_ok(&write(&mut h, &mut q, z2, 8, &b));
        z2 += 8;
    }
    let c = write(&mut h, &mut q, z2, 8 + 1, &b);
    assert_status(&c, Status::ZONE_BOUNDARY_ERROR);
    assert_eq!(
        zone_of(&mut h, &mut q, 2),
        (ZoneState::ExplicitlyOpened, 3 * ZONE - 8)
    );
    // Filling it makes it Full; any write to it is Zone Is Full.
    assert_ok(&write(&mut h, &mut q, z2, 8, &b));
    assert_eq!(zone_of(&mut h, &mut q, 2).0, ZoneState::Full);
    let c = write(&mut h, &mut q, 2 * ZONE, 1, &b);
    assert_status(&c, Status::ZONE_IS_FULL);
    // Reads are free, across zones and beyond the write pointer (zeroes).
    let r = h.buf(4 * 4096);
    let s = Sqe::read(2, ZONE + 8, 4, r.iova(), prp_list_for(&h, &r));
    assert_ok(&h.io(&mut q, s));
    let v = r.to_vec();
    assert!(
        v[..2 * 4096] == pattern(32 << 10, 1)[..2 * 4096],
        "written blocks"
    );
    assert!(
        v[2 * 4096..].iter().all(|&x| x == 0),
        "beyond the write pointer"
    );
    // Close, finish and reset.
    assert_ok(&send(&mut h, &mut q, ZONE, zsa::CLOSE, false));
    assert_eq!(zone_of(&mut h, &mut q, 1), (ZoneState::Closed, ZONE + 10));
    assert_ok(&write(&mut h, &mut q, ZONE + 10, 1, &b));
    assert_eq!(zone_of(&mut h, &mut q, 1).0, ZoneState::ImplicitlyOpened);
    assert_ok(&send(&mut h, &mut q, ZONE, zsa::FINISH, false));
    assert_eq!(zone_of(&mut h, &mut q, 1), (ZoneState::Full, 2 * ZONE));
    let c = send(&mut h, &mut q, ZONE, zsa::CLOSE, false);
    assert_status(&c, Status::INVALID_ZONE_STATE_TRANSITION);
    let c = send(&mut h, &mut q, ZONE, zsa::OPEN, false);
    assert_status(&c, Status::INVALID_ZONE_STATE_TRANSITION);
    let c = send(&mut h, &mut q, ZONE + 1, zsa::RESET, false);
    assert_status(&c, Status::INVALID_FIELD);
    assert_ok(&send(&mut h, &mut q, ZONE, zsa::RESET, false));
    assert_eq!(zone_of(&mut h, &mut q, 1), (ZoneState::Empty, ZONE));
    let s = Sqe::read(2, ZONE, 1, r.iova(), 0);
    assert_ok(&h.io(&mut q, s));
    assert!(
        r.to_vec()[..4096].iter().all(|&x| x == 0),
        "reset zone reads zeroes"
    );
    assert_ok(&write(&mut h, &mut q, ZONE, 1, &b));
    // Select All reset empties every zone.
    assert_ok(&send(&mut h, &mut q, 0, zsa::RESET, true));
    let (nz, d) = report(&mut h, &mut q, 0, 4096, zra::ALL, false);
    assert_eq!(nz, 16);
    assert!(d.iter().all(|z| z.state() == Some(ZoneState::Empty)));
    let wz = Sqe::write_zeroes(2, 3 * ZONE, 4, false);
    assert_ok(&h.io(&mut q, wz));
    assert_eq!(
        zone_of(&mut h, &mut q, 3).1,
        3 * ZONE + 4,
        "write zeroes writes"
    );
}

#[test]
fn open_and_active_limits() {
    let mut h = H::new_all_io(zoned_cfg(2, 3));
    let mut q = h.pair(1, 16);
    let b = h.buf(4096);
    // Two explicitly opened zones use every open resource.
    assert_ok(&send(&mut h, &mut q, 0, zsa::OPEN, false));
    assert_ok(&send(&mut h, &mut q, ZONE, zsa::OPEN, false));
    let c = write(&mut h, &mut q, 2 * ZONE, 1, &b);
    assert_status(&c, Status::TOO_MANY_OPEN_ZONES);
    let c = send(&mut h, &mut q, 2 * ZONE, zsa::OPEN, false);
    assert_status(&c, Status::TOO_MANY_OPEN_ZONES);
    // A closed zone stays active: the third active zone opens, a fourth cannot.
    assert_ok(&send(&mut h, &mut q, ZONE, zsa::CLOSE, false));
    assert_ok(&write(&mut h, &mut q, 2 * ZONE, 1, &b));
    let c = write(&mut h, &mut q, 3 * ZONE, 1, &b);
    assert_status(&c, Status::TOO_MANY_ACTIVE_ZONES);
    // An implicitly opened zone is closed to make room for another open.
    assert_ok(&send(&mut h, &mut q, ZONE, zsa::OPEN, false));
    assert_eq!(zone_of(&mut h, &mut q, 2).0, ZoneState::Closed);
    // Finishing releases resources; Select All close, then open (all closed zones).
    assert_ok(&send(&mut h, &mut q, 0, zsa::FINISH, false));
    assert_ok(&write(&mut h, &mut q, 3 * ZONE, 1, &b));
    assert_ok(&send(&mut h, &mut q, 0, zsa::CLOSE, true));
    let (nz, _) = report(&mut h, &mut q, 0, 4096, 0x04, false);
    assert_eq!(nz, 3, "zones 1, 2 and 3 closed");
    let c = send(&mut h, &mut q, 0, zsa::OPEN, true);
    assert_status(&c, Status::TOO_MANY_OPEN_ZONES);
    assert_ok(&send(&mut h, &mut q, 0, zsa::FINISH, true));
    let (nz, _) = report(&mut h, &mut q, 0, 4096, 0x05, false);
    assert_eq!(nz, 4, "zones 0 to 3 full");
}

#[test]
fn zone_append_returns_the_lba_it_wrote() {
    let mut h = H::new_all_io(zoned_cfg(0, 0));
    let mut q = h.pair(1, 16);
    let mut b = h.buf(8192);
    b.write_at(0, &pattern(8192, 2)).unwrap();
    let z = 5 * ZONE;
    let mut next = z;
    for nlb in [1u32, 2, 1] {
        let c = h.io(
            &mut q,
            Sqe::zone_append(2, z, nlb, b.iova(), b.iova() + 4096),
        );
        assert_ok(&c);
        assert_eq!(c.dw0 as u64 | (c.dw1 as u64) << 32, next);
        next += nlb as u64;
    }
    assert_eq!(
        zone_of(&mut h, &mut q, 5),
        (ZoneState::ImplicitlyOpened, z + 4)
    );
    let r = h.buf(8192);
    let s = Sqe::read(2, z + 1, 2, r.iova(), r.iova() + 4096);
    assert_ok(&h.io(&mut q, s));
    assert_eq!(r.to_vec(), pattern(8192, 2));
    // The SLBA must be the zone start; past the zone's capacity is a boundary error; a
    // Full zone is Zone Is Full (its state is checked first, as QEMU does).
    let c = h.io(&mut q, Sqe::zone_append(2, z + 1, 1, b.iova(), 0));
    assert_status(&c, Status::INVALID_FIELD);
    // The write pointer is at z + 4: seven writes of 32 blocks take it to z + 228, and
    // an append of 32 more would cross the zone's end at z + 256.
    let big = h.buf(32 * 4096);
    let list = super::prp_list_for(&h, &big);
    for k in 0..7 {
        let s = Sqe::write(2, z + 4 + 32 * k, 32, big.iova(), list);
        assert_ok(&h.io(&mut q, s));
    }
    let c = h.io(&mut q, Sqe::zone_append(2, z, 32, big.iova(), list));
    assert_status(&c, Status::ZONE_BOUNDARY_ERROR);
    assert_ok(&send(&mut h, &mut q, z, zsa::FINISH, false));
    let c = h.io(&mut q, Sqe::zone_append(2, z, 1, b.iova(), 0));
    assert_status(&c, Status::ZONE_IS_FULL);
    // Not zoned: the opcode is not one of the namespace's.
    let c = h.io(&mut q, Sqe::zone_append(1, 0, 1, b.iova(), 0));
    assert_status(&c, Status::INVALID_OPCODE);
    assert_eq!(h.emu.stats().zone_appends, 7);
}

#[test]
fn report_zones_layout_filters_and_partial_bit() {
    let mut h = H::new_all_io(zoned_cfg(0, 0));
    let mut q = h.pair(1, 16);
    let b = h.buf(3 * 4096);
    assert_ok(&write(&mut h, &mut q, 2 * ZONE, 3, &b));
    assert_ok(&send(&mut h, &mut q, 4 * ZONE, zsa::FINISH, false));
    // From the zone holding LBA 2*ZONE + 7, room for 4 descriptors: all 14 zones counted
    // without Partial Report, 4 with it.
    let (nz, d) = report(&mut h, &mut q, 2 * ZONE + 7, 5 * 64, zra::ALL, false);
    assert_eq!((nz, d.len()), (14, 4));
    assert_eq!(
        d[0],
        ZoneDescriptor::new(ZoneState::ImplicitlyOpened, 2 * ZONE, ZONE, 2 * ZONE + 3)
    );
    assert_eq!(d[0].zt, 2, "sequential write required");
    assert_eq!(
        d[1],
        ZoneDescriptor::new(ZoneState::Empty, 3 * ZONE, ZONE, 3 * ZONE)
    );
    assert_eq!(d[2].state(), Some(ZoneState::Full));
    let (nz, _) = report(&mut h, &mut q, 2 * ZONE, 5 * 64, zra::ALL, true);
    assert_eq!(nz, 4);
    // Reporting options: empty zones only.
    let (nz, d) = report(&mut h, &mut q, 0, 4096, 0x01, false);
    assert_eq!(nz, 14);
    assert_eq!(d[2].zslba, 3 * ZONE);
    // The extended report needs descriptor extensions (there are none); bad options and
    // LBAs are refused.
    let mut s = Sqe::report_zones(2, 0, 4096, 0, false, b.iova(), 0);
    s.cdw13 |= zra::EXTENDED_REPORT_ZONES as u32;
    assert_status(&h.io(&mut q, s), Status::INVALID_FIELD);
    let s = Sqe::report_zones(2, 0, 4096, 0x09, false, b.iova(), 0);
    assert_status(&h.io(&mut q, s), Status::INVALID_FIELD);
    let s = Sqe::report_zones(2, 16 * ZONE, 4096, 0, false, b.iova(), 0);
    assert_status(&h.io(&mut q, s), Status::LBA_OUT_OF_RANGE);
}

#[test]
fn zoned_namespace_with_protection_information() {
    let mut cfg = zoned_cfg(0, 0);
    cfg.namespaces[1].format.ms = 8;
    cfg.namespaces[1].format.pi_type = 1;
    let mut h = H::new_all_io(cfg);
    let mut q = h.pair(1, 16);
    let b = h.buf(4096);
    let m = h.buf(4096);
    // Type 1: EILBRT must be the SLBA's low 32 bits when the reference tag is checked.
    let mut s = Sqe::write(2, 0, 1, b.iova(), 0);
    s.mptr = m.iova();
    s.cdw12 |= crate::spec::pi::Prinfo(crate::spec::pi::Prinfo::PRACT).to_cdw12();
    assert_ok(&h.io(&mut q, s));
    let mut r = Sqe::read(2, 0, 1, b.iova(), 0);
    r.mptr = m.iova();
    r.cdw12 |= crate::spec::pi::Prinfo(0x7).to_cdw12();
    assert_ok(&h.io(&mut q, r));
    assert_eq!(zone_of(&mut h, &mut q, 0).1, 1);
}

#[test]
fn shutdown_closes_open_zones() {
    let mut h = H::new_all_io(zoned_cfg(0, 0));
    let mut q = h.pair(1, 16);
    let b = h.buf(4096);
    assert_ok(&write(&mut h, &mut q, 0, 1, &b));
    assert_ok(&send(&mut h, &mut q, ZONE, zsa::OPEN, false));
    h.bar.set_cc(
        h.cc()
            .with_en(true)
            .with_shn(crate::spec::regs::shutdown::SHN_NORMAL),
    );
    h.wait_csts(|c| c.shst() == crate::spec::regs::shutdown::SHST_COMPLETE);
    h.disable();
    h.enable_with(h.cc().with_css(crate::spec::regs::css::CC_ALL_IO));
    assert!(h.wait_csts(|c| c.rdy() || c.cfs()).rdy());
    let mut q = h.pair(1, 16);
    assert_eq!(zone_of(&mut h, &mut q, 0), (ZoneState::Closed, 1));
    assert_eq!(zone_of(&mut h, &mut q, 1), (ZoneState::Empty, ZONE));
}

#[test]
fn garbage_io_on_every_format_never_panics() {
    let mut cfg = zoned_cfg(2, 3);
    cfg.namespaces[1].format.ms = 8;
    cfg.namespaces[1].format.pi_type = 2;
    for (lba, ms, ext, pi, first) in [(512, 8, true, 1, false), (4096, 16, false, 3, true)] {
        cfg.namespaces.push(EmuNamespace {
            format: EmuFormat {
                ms,
                extended: ext,
                pi_type: pi,
                pi_first: first,
                ..Default::default()
            },
            ..EmuNamespace::new(8 << 20, lba, EmuStore::Memory)
        });
    }
    let mut h = H::new_all_io(cfg);
    let mut q = h.pair(1, 64);
    let b = h.buf(64 << 10);
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let opcodes = [0x00, 0x01, 0x02, 0x08, 0x09, 0x79, 0x7A, 0x7D, 0x7E];
    for _ in 0..2000 {
        let mut raw = [0u8; 64];
        for c in raw.chunks_mut(8) {
            c.copy_from_slice(&next().to_le_bytes());
        }
        let mut s = Sqe::from_bytes(&raw);
        let r = next();
        s.cdw0 = opcodes[(r % 9) as usize] as u32;
        s.nsid = 1 + (r >> 8) as u32 % 4;
        s.prp1 = (b.iova() + (next() % (64 << 10))) & !3;
        s.prp2 = (b.iova() + (next() % (64 << 10))) & !0xFFF;
        s.mptr = b.iova() + (next() % (64 << 10));
        // Small transfers at small LBAs, so most commands get past the range checks.
        s.cdw10 = (next() % 4096) as u32 & !(r as u32 & 0xFF);
        s.cdw11 = 0;
        s.cdw12 = (s.cdw12 & 0xFFFF_0000) | (next() % 8) as u32;
        let _ = h.io(&mut q, s);
    }
    assert_ok(&h.io(&mut q, Sqe::read(1, 0, 1, b.iova(), 0)));
    assert!(!h.csts().cfs());
    let st = h.emu.stats();
    assert!(
        st.zone_mgmt_sends > 0 && st.zone_appends > 0 && st.pi_errors > 0,
        "{st:?}"
    );
}

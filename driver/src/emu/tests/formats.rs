//! Namespace formats: separate and extended metadata, end-to-end protection information
//! (checks, PRACT insert and strip, escapes), several namespaces of different formats, and
//! corrupted PI from fault injection.

use super::*;
use crate::emu::testkit::meta_format as fmt;
use crate::spec::pi::{crc16_t10dif, PiTuple, Prinfo, APP_TAG_ESCAPE, REF_TAG_ESCAPE};

const ALL_CHECKS: u8 = Prinfo::PRCHK_GUARD | Prinfo::PRCHK_APP | Prinfo::PRCHK_REF;

fn ns(lba: u32, format: EmuFormat) -> EmuNamespace {
    EmuNamespace {
        format,
        ..EmuNamespace::new(8 << 20, lba, EmuStore::Memory)
    }
}

/// The PI fields of a command: PRINFO, EILBRT, ELBAT and ELBATM.
#[derive(Clone, Copy, Default)]
struct Pi {
    prinfo: u8,
    ilbrt: u32,
    app: u16,
    mask: u16,
}

/// A Read or Write of `nlb` blocks with the data in `data` (PRPs over all of it) and the
/// metadata pointer `mptr`.
#[allow(clippy::too_many_arguments)]
fn io(
    h: &mut H,
    q: &mut Queue,
    write: bool,
    nsid: u32,
    slba: u64,
    nlb: u32,
    data: &DmaBuf,
    mptr: u64,
    pi: Pi,
) -> Cqe {
    let prp2 = prp_list_for(h, data);
    let mut s = if write {
        Sqe::write(nsid, slba, nlb, data.iova(), prp2)
    } else {
        Sqe::read(nsid, slba, nlb, data.iova(), prp2)
    };
    s.mptr = mptr;
    s.cdw12 |= Prinfo(pi.prinfo).to_cdw12();
    s.cdw14 = pi.ilbrt;
    s.cdw15 = pi.app as u32 | (pi.mask as u32) << 16;
    h.io(q, s)
}

/// A buffer holding `bytes`.
fn buf_with(h: &H, bytes: &[u8]) -> DmaBuf {
    let mut b = h.buf(bytes.len().next_multiple_of(4096));
    b.write_at(0, bytes).unwrap();
    b
}

/// 8 bytes of valid PI for `data` with application tag `app` and reference tag `rt`.
fn pi_for(data: &[u8], app: u16, rt: u32) -> [u8; 8] {
    PiTuple {
        guard: crc16_t10dif(data),
        app_tag: app,
        ref_tag: rt,
    }
    .to_bytes()
}

#[test]
fn separate_metadata_round_trip_and_mptr_rules() {
    let mut h = H::new(EmuConfig {
        namespaces: vec![ns(4096, fmt(16, false, 0, false))],
        ..Default::default()
    });
    let mut q = h.pair(1, 16);
    let data = pattern(3 * 4096, 1);
    let meta = pattern(3 * 16, 2);
    let (d, m) = (buf_with(&h, &data), buf_with(&h, &meta));
    let ok = io(&mut h, &mut q, true, 1, 5, 3, &d, m.iova(), Pi::default());
    assert_ok(&ok);
    let (rd, mut rm) = (h.buf(3 * 4096), h.buf(4096));
    rm.fill(0xEE);
    // The metadata buffer may start at any dword.
    let c = io(
        &mut h,
        &mut q,
        false,
        1,
        5,
        3,
        &rd,
        rm.iova() + 12,
        Pi::default(),
    );
    assert_ok(&c);
    assert_eq!(rd.to_vec(), data);
    let got = rm.to_vec();
    assert_eq!(&got[12..12 + 48], &meta[..]);
    assert!(got[..12].iter().chain(&got[60..]).all(|&x| x == 0xEE));
    // Unwritten blocks: data and metadata read as zeroes.
    let c = io(
        &mut h,
        &mut q,
        false,
        1,
        100,
        1,
        &rd,
        rm.iova(),
        Pi::default(),
    );
    assert_ok(&c);
    assert!(rm.to_vec()[..16].iter().all(|&x| x == 0));
    // MPTR outside registered memory is an IOMMU fault; a misaligned one is invalid.
    for (mptr, want) in [
        (0, Status::DATA_TRANSFER_ERROR),
        (IOVA_BASE - 64, Status::DATA_TRANSFER_ERROR),
        (m.iova() + 2, Status::INVALID_FIELD),
    ] {
        let c = io(&mut h, &mut q, true, 1, 5, 3, &d, mptr, Pi::default());
        assert_status(&c, want);
    }
    assert_eq!(h.emu.stats().bytes_written, 3 * 4096);
}

#[test]
fn extended_lbas_interleave_metadata_and_count_it_in_the_transfer() {
    let mut h = H::new(EmuConfig {
        namespaces: vec![ns(512, fmt(8, true, 0, false))],
        ..Default::default()
    });
    let mut q = h.pair(1, 16);
    // 20 blocks of 520 bytes: 10 400 bytes over three pages, through a PRP list.
    let wire = pattern(20 * 520, 3);
    let w = buf_with(&h, &wire);
    assert_ok(&io(&mut h, &mut q, true, 1, 7, 20, &w, 0, Pi::default()));
    let r = h.buf(3 * 4096);
    assert_ok(&io(&mut h, &mut q, false, 1, 7, 20, &r, 0, Pi::default()));
    assert_eq!(&r.to_vec()[..wire.len()], &wire[..]);
    // Reading block 8 alone returns its data and metadata.
    let r1 = h.buf(4096);
    assert_ok(&io(&mut h, &mut q, false, 1, 8, 1, &r1, 0, Pi::default()));
    assert_eq!(&r1.to_vec()[..520], &wire[520..1040]);
    // The data pointer must cover data and metadata: one page is too short for 8 blocks.
    let mut s = Sqe::write(1, 0, 8, r1.iova(), 0);
    s.prp2 = 0;
    let c = h.io(&mut q, s);
    assert_status(&c, Status::DATA_TRANSFER_ERROR);
}

#[test]
fn pi_type1_checks_on_write_fail_with_the_spec_status_and_store_nothing() {
    let mut h = H::new(EmuConfig {
        namespaces: vec![ns(4096, fmt(8, false, 1, false))],
        ..Default::default()
    });
    let mut q = h.pair(1, 16);
    let data = pattern(2 * 4096, 4);
    let d = buf_with(&h, &data);
    let good = |app: u16| -> Vec<u8> {
        let mut m = pi_for(&data[..4096], app, 40).to_vec();
        m.extend(pi_for(&data[4096..], app, 41));
        m
    };
    let chk = Pi {
        prinfo: ALL_CHECKS,
        ilbrt: 40,
        app: 0x1200,
        mask: 0xFF00,
    };
    let m = buf_with(&h, &good(0x12AB));
    assert_ok(&io(&mut h, &mut q, true, 1, 40, 2, &d, m.iova(), chk));
    // Each check fails alone, with its status; the blocks keep their old contents.
    let mut bad_guard = good(0x12AB);
    bad_guard[8] ^= 0x80;
    let mut bad_app = good(0x12AB);
    bad_app[10] = 0x13;
    let mut bad_ref = good(0x12AB);
    bad_ref[15] ^= 1;
    let other = buf_with(&h, &pattern(2 * 4096, 5));
    for (meta, want) in [
        (bad_guard, Status::E2E_GUARD_CHECK_ERROR),
        (bad_app, Status::E2E_APPLICATION_TAG_CHECK_ERROR),
        (bad_ref, Status::E2E_REFERENCE_TAG_CHECK_ERROR),
    ] {
        let mb = buf_with(&h, &meta);
        let c = io(&mut h, &mut q, true, 1, 40, 2, &d, mb.iova(), chk);
        assert_status(&c, want);
        assert!(c.status().dnr);
    }
    let c = io(&mut h, &mut q, true, 1, 40, 2, &other, m.iova(), chk);
    assert_status(&c, Status::E2E_GUARD_CHECK_ERROR);
    let r = h.buf(2 * 4096);
    let rm = h.buf(4096);
    assert_ok(&io(&mut h, &mut q, false, 1, 40, 2, &r, rm.iova(), chk));
    assert_eq!(r.to_vec(), data, "failed writes stored nothing");
    assert_eq!(&rm.to_vec()[..16], &good(0x12AB)[..]);
    // Type 1: the initial reference tag must be the SLBA's low 32 bits.
    let c = io(
        &mut h,
        &mut q,
        true,
        1,
        40,
        2,
        &d,
        m.iova(),
        Pi { ilbrt: 7, ..chk },
    );
    assert_status(&c, Status::INVALID_PROTECTION_INFORMATION);
    // Without PRCHK nothing is checked; app tag FFFFh disables checking of a block.
    let junk = buf_with(&h, &[0x5A; 16]);
    let none = Pi { prinfo: 0, ..chk };
    assert_ok(&io(
        &mut h,
        &mut q,
        true,
        1,
        40,
        2,
        &other,
        junk.iova(),
        none,
    ));
    let mut esc = [0u8; 16];
    esc[2..4].copy_from_slice(&APP_TAG_ESCAPE.to_be_bytes());
    esc[10..12].copy_from_slice(&APP_TAG_ESCAPE.to_be_bytes());
    let e = buf_with(&h, &esc);
    assert_ok(&io(&mut h, &mut q, true, 1, 40, 2, &other, e.iova(), chk));
    assert_eq!(h.emu.stats().pi_errors, 4);
}

#[test]
fn pi_checks_on_read_and_unwritten_blocks_escape() {
    let mut h = H::new(EmuConfig {
        namespaces: vec![ns(512, fmt(8, true, 1, false))],
        ..Default::default()
    });
    let mut q = h.pair(1, 16);
    let chk = Pi {
        prinfo: ALL_CHECKS,
        ilbrt: 9,
        app: 0,
        mask: 0xFFFF,
    };
    // Never written: all-ones PI (tags FFFFh / FFFFFFFFh) passes every check.
    let r = h.buf(4096);
    assert_ok(&io(&mut h, &mut q, false, 1, 9, 2, &r, 0, chk));
    let v = r.to_vec();
    assert!(v[..512].iter().all(|&x| x == 0));
    assert_eq!(&v[512..520], &[0xFF; 8]);
    // Stored with a wrong reference tag (no checks on write): a checking read fails.
    let data = pattern(512, 6);
    let mut wire = data.clone();
    wire.extend(pi_for(&data, 0, 1234));
    let w = buf_with(&h, &wire);
    let none = Pi { prinfo: 0, ..chk };
    assert_ok(&io(&mut h, &mut q, true, 1, 9, 1, &w, 0, none));
    let c = io(&mut h, &mut q, false, 1, 9, 1, &r, 0, chk);
    assert_status(&c, Status::E2E_REFERENCE_TAG_CHECK_ERROR);
    // Only the guard checked: passes, and the host gets the PI as stored.
    let guard_only = Pi {
        prinfo: Prinfo::PRCHK_GUARD,
        ..chk
    };
    assert_ok(&io(&mut h, &mut q, false, 1, 9, 1, &r, 0, guard_only));
    assert_eq!(&r.to_vec()[..520], &wire[..]);
}

#[test]
fn with_zeroed_pi_an_unwritten_block_fails_the_reference_tag_check() {
    let mut h = H::new(EmuConfig {
        namespaces: vec![ns(
            512,
            EmuFormat {
                zeroed_pi: true,
                ..fmt(8, true, 1, false)
            },
        )],
        ..Default::default()
    });
    let mut q = h.pair(1, 16);
    let chk = Pi {
        prinfo: ALL_CHECKS,
        ilbrt: 9,
        app: 0,
        mask: 0,
    };
    // Never written: all-zero PI (the guard of zeroes is 0, the reference tag 0, not 9).
    let r = h.buf(4096);
    let c = io(&mut h, &mut q, false, 1, 9, 1, &r, 0, chk);
    assert_status(&c, Status::E2E_REFERENCE_TAG_CHECK_ERROR);
    let guard_only = Pi {
        prinfo: Prinfo::PRCHK_GUARD,
        ..chk
    };
    assert_ok(&io(&mut h, &mut q, false, 1, 9, 1, &r, 0, guard_only));
    assert_eq!(&r.to_vec()[..520], &[0u8; 520][..]);
    // Written with its PI: read back with every check.
    let data = pattern(512, 8);
    let mut wire = data.clone();
    wire.extend(pi_for(&data, 0, 9));
    let w = buf_with(&h, &wire);
    assert_ok(&io(&mut h, &mut q, true, 1, 9, 1, &w, 0, chk));
    assert_ok(&io(&mut h, &mut q, false, 1, 9, 1, &r, 0, chk));
    assert_eq!(&r.to_vec()[..520], &wire[..]);
}

#[test]
fn pract_inserts_on_write_and_checks_then_strips_on_read() {
    let mut h = H::new(EmuConfig {
        namespaces: vec![
            ns(512, fmt(8, true, 2, false)),
            ns(4096, fmt(16, false, 3, true)),
        ],
        ..Default::default()
    });
    let mut q = h.pair(1, 16);
    // Type 2, 8-byte metadata, extended: with PRACT only data crosses the wire.
    let data = pattern(4 * 512, 7);
    let w = buf_with(&h, &data);
    let gen = Pi {
        prinfo: Prinfo::PRACT | ALL_CHECKS,
        ilbrt: 0xABCD_0000,
        app: 0x4242,
        mask: 0xFFFF,
    };
    assert_ok(&io(&mut h, &mut q, true, 1, 100, 4, &w, 0, gen));
    let r = h.buf(4096);
    let plain = Pi { prinfo: 0, ..gen };
    assert_ok(&io(&mut h, &mut q, false, 1, 100, 4, &r, 0, plain));
    let v = r.to_vec();
    for b in 0..4 {
        let blk = &data[b * 512..(b + 1) * 512];
        assert_eq!(&v[b * 520..b * 520 + 512], blk);
        let want = pi_for(blk, 0x4242, 0xABCD_0000 + b as u32);
        assert_eq!(&v[b * 520 + 512..b * 520 + 520], &want, "block {b}");
    }
    let mut s = h.buf(4096);
    s.fill(0xEE);
    assert_ok(&io(&mut h, &mut q, false, 1, 100, 4, &s, 0, gen));
    let sv = s.to_vec();
    assert_eq!(&sv[..4 * 512], &data[..], "PI stripped: data only");
    assert!(sv[4 * 512..].iter().all(|&x| x == 0xEE));
    // A stripping read still checks: a wrong initial reference tag fails.
    let c = io(
        &mut h,
        &mut q,
        false,
        1,
        100,
        4,
        &s,
        0,
        Pi { ilbrt: 1, ..gen },
    );
    assert_status(&c, Status::E2E_REFERENCE_TAG_CHECK_ERROR);

    // Type 3, 16 bytes with the PI first, separate: PRACT overwrites the PI and keeps the
    // rest of the host's metadata; the reference tag is the initial one, not checked.
    let d = buf_with(&h, &pattern(4096, 8));
    let m = buf_with(&h, &pattern(16, 9));
    let t3 = Pi {
        prinfo: Prinfo::PRACT,
        ilbrt: 77,
        app: 0x0001,
        mask: 0xFFFF,
    };
    assert_ok(&io(&mut h, &mut q, true, 2, 3, 1, &d, m.iova(), t3));
    let (rd, rm) = (h.buf(4096), h.buf(4096));
    let chk3 = Pi {
        prinfo: ALL_CHECKS,
        ilbrt: 5,
        ..t3
    };
    assert_ok(&io(&mut h, &mut q, false, 2, 3, 1, &rd, rm.iova(), chk3));
    let mv = rm.to_vec();
    assert_eq!(&mv[..8], &pi_for(&pattern(4096, 8), 1, 77));
    assert_eq!(&mv[8..16], &pattern(16, 9)[8..]);
    // Type 3 still checks the application tag.
    let c = io(
        &mut h,
        &mut q,
        false,
        2,
        3,
        1,
        &rd,
        rm.iova(),
        Pi { app: 2, ..chk3 },
    );
    assert_status(&c, Status::E2E_APPLICATION_TAG_CHECK_ERROR);
}

#[test]
fn type3_escape_needs_both_tags_and_write_zeroes_generates_or_clears_pi() {
    let mut h = H::new(EmuConfig {
        namespaces: vec![ns(512, fmt(8, false, 3, false))],
        ..Default::default()
    });
    let mut q = h.pair(1, 16);
    let chk = Pi {
        prinfo: ALL_CHECKS,
        ilbrt: 0,
        app: 0x10,
        mask: 0xFFFF,
    };
    let d = buf_with(&h, &pattern(512, 10));
    let mut tags = [0u8; 8];
    tags[2..4].copy_from_slice(&APP_TAG_ESCAPE.to_be_bytes());
    let m = buf_with(&h, &tags);
    let c = io(&mut h, &mut q, true, 1, 0, 1, &d, m.iova(), chk);
    assert_status(&c, Status::E2E_GUARD_CHECK_ERROR);
    tags[4..].copy_from_slice(&REF_TAG_ESCAPE.to_be_bytes());
    let m = buf_with(&h, &tags);
    assert_ok(&io(&mut h, &mut q, true, 1, 0, 1, &d, m.iova(), chk));

    // Write Zeroes with PRACT: zero data with generated PI; without: PI reads all ones.
    let mut wz = Sqe::write_zeroes(1, 20, 2, false);
    wz.cdw12 |= Prinfo(Prinfo::PRACT).to_cdw12();
    wz.cdw14 = 0x99;
    wz.cdw15 = 0x10;
    assert_ok(&h.io(&mut q, wz));
    // Checks on a Write Zeroes: nothing to check, refused (as QEMU refuses them).
    let mut bad = wz;
    bad.cdw12 |= Prinfo(Prinfo::PRCHK_GUARD).to_cdw12();
    assert_status(&h.io(&mut q, bad), Status::INVALID_PROTECTION_INFORMATION);
    assert_ok(&h.io(&mut q, Sqe::write_zeroes(1, 22, 1, false)));
    let (r, rm) = (h.buf(4096), h.buf(4096));
    assert_ok(&io(&mut h, &mut q, false, 1, 20, 3, &r, rm.iova(), chk));
    let mv = rm.to_vec();
    assert_eq!(&mv[..8], &pi_for(&[0; 512], 0x10, 0x99));
    assert_eq!(
        &mv[8..16],
        &pi_for(&[0; 512], 0x10, 0x99),
        "type 3 keeps the tag"
    );
    assert_eq!(&mv[16..24], &[0xFF; 8]);
}

#[test]
fn several_namespaces_of_different_formats_on_one_controller() {
    let mut h = H::new(EmuConfig {
        namespaces: vec![
            EmuNamespace::new(8 << 20, 4096, EmuStore::Memory),
            ns(4096, fmt(8, false, 1, false)),
            ns(512, fmt(8, true, 0, false)),
            ns(512, fmt(64, false, 2, true)),
            ns(
                4096,
                EmuFormat {
                    csi: crate::spec::csi::KEY_VALUE,
                    ..Default::default()
                },
            ),
        ],
        ..Default::default()
    });
    for (nsid, (lbaf, ms, flbas, dps)) in [
        (1, (1, 0, 0x01, 0)),
        (2, (2, 8, 0x02, 0x01)),
        (3, (2, 8, 0x12, 0)),
        (4, (2, 64, 0x02, 0x0A)),
    ] {
        let id = h.id_ns(nsid);
        let f = crate::spec::NsFormat::of(&id, 0);
        assert_eq!(
            (f.lbaf_index, f.ms, id.flbas, id.dps),
            (lbaf, ms, flbas, dps),
            "nsid {nsid}"
        );
    }
    let mut q = h.pair(1, 16);
    let d = buf_with(&h, &pattern(4096, 11));
    let m = buf_with(&h, &pattern(512, 12));
    let gen = Pi {
        prinfo: Prinfo::PRACT,
        ilbrt: 3,
        ..Default::default()
    };
    assert_ok(&io(&mut h, &mut q, true, 1, 3, 1, &d, 0, Pi::default()));
    assert_ok(&io(&mut h, &mut q, true, 2, 3, 1, &d, 0, gen));
    assert_ok(&io(&mut h, &mut q, true, 3, 3, 7, &d, 0, Pi::default()));
    assert_ok(&io(&mut h, &mut q, true, 4, 3, 4, &d, m.iova(), gen));
    let chk = Pi {
        prinfo: ALL_CHECKS,
        ..gen
    };
    let (r, rm) = (h.buf(4096), h.buf(4096));
    assert_ok(&io(&mut h, &mut q, false, 1, 3, 1, &r, 0, Pi::default()));
    assert_eq!(r.to_vec(), pattern(4096, 11));
    assert_ok(&io(&mut h, &mut q, false, 2, 3, 1, &r, rm.iova(), chk));
    assert_eq!(r.to_vec(), pattern(4096, 11));
    assert_ok(&io(&mut h, &mut q, false, 3, 3, 7, &r, 0, Pi::default()));
    assert_eq!(&r.to_vec()[..7 * 520], &pattern(4096, 11)[..7 * 520]);
    assert_ok(&io(&mut h, &mut q, false, 4, 3, 4, &r, rm.iova(), chk));
    // nsid 4: 64 bytes of metadata with the PI first; the other 56 as written.
    let mv = rm.to_vec();
    assert_eq!(&mv[8..64], &pattern(512, 12)[8..64]);
    // A Key Value namespace is reported but takes no NVM I/O.
    let c = io(&mut h, &mut q, true, 5, 0, 1, &d, 0, Pi::default());
    assert_status(&c, Status::INVALID_NAMESPACE_OR_FORMAT);
    let (c, b) = h.identify(cns::NS_ID_DESCRIPTORS, 5);
    assert_ok(&c);
    let desc = crate::spec::NsIdDescriptors::parse(b[..].try_into().unwrap());
    assert_eq!(desc.csi, Some(crate::spec::csi::KEY_VALUE));
}

#[test]
fn injected_pi_corruption_fails_checking_reads_and_reaches_the_host_otherwise() {
    let mut h = H::new(EmuConfig {
        namespaces: vec![ns(4096, fmt(8, false, 1, false))],
        ..Default::default()
    });
    let mut q = h.pair(1, 16);
    let d = buf_with(&h, &pattern(4096, 13));
    let gen = Pi {
        prinfo: Prinfo::PRACT,
        ilbrt: 1,
        app: 0x77,
        mask: 0xFFFF,
    };
    assert_ok(&io(&mut h, &mut q, true, 1, 1, 1, &d, 0, gen));
    let chk = Pi {
        prinfo: ALL_CHECKS,
        ..gen
    };
    let (r, rm) = (h.buf(4096), h.buf(4096));
    for (spec, want) in [
        ("pi-guard/read", Status::E2E_GUARD_CHECK_ERROR),
        ("pi-app/read", Status::E2E_APPLICATION_TAG_CHECK_ERROR),
        ("pi-ref/read", Status::E2E_REFERENCE_TAG_CHECK_ERROR),
    ] {
        h.emu.faults().set_spec(spec).unwrap();
        let c = io(&mut h, &mut q, false, 1, 1, 1, &r, rm.iova(), chk);
        assert_status(&c, want);
    }
    // Not checked by the controller: the host receives the corrupted reference tag.
    let c = io(&mut h, &mut q, false, 1, 1, 1, &r, rm.iova(), Pi::default());
    assert_ok(&c);
    let good = pi_for(&pattern(4096, 13), 0x77, 1);
    let mut want = good;
    want[7] ^= 1;
    assert_eq!(&rm.to_vec()[..8], &want);
    // The stored copy is intact.
    h.emu.faults().clear();
    assert_ok(&io(&mut h, &mut q, false, 1, 1, 1, &r, rm.iova(), chk));
    assert_eq!(&rm.to_vec()[..8], &good);
    let st = h.emu.stats();
    assert_eq!(st.pi_errors, 3);
    assert_eq!(st.faults_injected, 4);
}

#[test]
fn file_store_keeps_metadata_beside_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ns1");
    let cfg = || EmuConfig {
        namespaces: vec![EmuNamespace {
            format: fmt(8, false, 1, false),
            ..EmuNamespace::new(4 << 20, 512, EmuStore::File(path.clone()))
        }],
        ..Default::default()
    };
    let gen = Pi {
        prinfo: Prinfo::PRACT,
        ilbrt: 6,
        app: 5,
        mask: 0xFFFF,
    };
    let data = pattern(512, 14);
    {
        let mut h = H::new(cfg());
        let mut q = h.pair(1, 16);
        let d = buf_with(&h, &data);
        assert_ok(&io(&mut h, &mut q, true, 1, 6, 1, &d, 0, gen));
    }
    let mut h = H::new(cfg());
    let mut q = h.pair(1, 16);
    let (r, rm) = (h.buf(4096), h.buf(4096));
    let chk = Pi {
        prinfo: ALL_CHECKS,
        ..gen
    };
    assert_ok(&io(&mut h, &mut q, false, 1, 6, 1, &r, rm.iova(), chk));
    assert_eq!(&r.to_vec()[..512], &data[..]);
    assert_eq!(&rm.to_vec()[..8], &pi_for(&data, 5, 6));
}

#[test]
fn invalid_formats_are_refused_at_start() {
    for (f, lba, field) in [
        (fmt(4, false, 1, false), 512, "ms"),
        (fmt(0, true, 0, false), 512, "extended"),
        (fmt(8, false, 4, false), 512, "pi_type"),
        (fmt(512, false, 0, false), 512, "ms"),
    ] {
        let e = EmuController::start(EmuConfig {
            namespaces: vec![ns(lba, f)],
            ..Default::default()
        })
        .unwrap_err();
        assert!(
            matches!(e, EmuError::Config { field: got, .. } if got == field),
            "{f:?}: {e}"
        );
    }
}

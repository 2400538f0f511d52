//! NVM commands: PRP forms, negative cases, Write Zeroes and deallocation, the stores.

use super::*;

/// Writes `data` at `slba` with the given PRPs, reads it back through `rbuf` PRPs and
/// compares.
fn round_trip(h: &mut H, q: &mut Queue, slba: u64, nlb: u32, w: (u64, u64), r: (u64, u64)) {
    assert_ok(&h.io(q, Sqe::write(1, slba, nlb, w.0, w.1)));
    assert_ok(&h.io(q, Sqe::read(1, slba, nlb, r.0, r.1)));
}

#[test]
fn read_write_prp_forms() {
    let mut h = H::new(small_cfg());
    let mut q = h.pair(1, 32);

    // PRP1 only.
    let mut w = h.buf(4096);
    let data = pattern(4096, 1);
    w.write_at(0, &data).unwrap();
    let r = h.buf(4096);
    round_trip(&mut h, &mut q, 10, 1, (w.iova(), 0), (r.iova(), 0));
    assert_eq!(r.to_vec(), data);

    // PRP1 + PRP2 (two pages).
    let mut w = h.buf(8192);
    let data = pattern(8192, 2);
    w.write_at(0, &data).unwrap();
    let r = h.buf(8192);
    round_trip(
        &mut h,
        &mut q,
        20,
        2,
        (w.iova(), w.iova() + 4096),
        (r.iova(), r.iova() + 4096),
    );
    assert_eq!(r.to_vec(), data);

    // PRP list (8 pages).
    let mut w = h.buf(32 << 10);
    let data = pattern(32 << 10, 3);
    w.write_at(0, &data).unwrap();
    let r = h.buf(32 << 10);
    let wl = prp_list_for(&h, &w);
    let rl = prp_list_for(&h, &r);
    round_trip(&mut h, &mut q, 30, 8, (w.iova(), wl), (r.iova(), rl));
    assert_eq!(r.to_vec(), data);

    // PRP1 with a dword-aligned offset: a 4 KiB block over two pages.
    let mut w = h.buf(8192);
    let data = pattern(4096, 4);
    w.write_at(1028, &data).unwrap();
    let mut r = h.buf(8192);
    r.fill(0xEE);
    round_trip(
        &mut h,
        &mut q,
        40,
        1,
        (w.iova() + 1028, w.iova() + 4096),
        (r.iova() + 1028, r.iova() + 4096),
    );
    let v = r.to_vec();
    assert_eq!(&v[1028..1028 + 4096], &data[..]);
    assert!(
        v[..1028].iter().all(|&x| x == 0xEE),
        "bytes before the transfer untouched"
    );
    assert!(
        v[1028 + 4096..].iter().all(|&x| x == 0xEE),
        "bytes after untouched"
    );

    // Offset PRP1 and a PRP list: 3 blocks over 4 pages.
    let mut w = h.buf(16 << 10);
    let data = pattern(3 * 4096, 5);
    w.write_at(512, &data).unwrap();
    let r = h.buf(16 << 10);
    let wl = prp_list_for(&h, &w);
    let rl = prp_list_for(&h, &r);
    round_trip(
        &mut h,
        &mut q,
        50,
        3,
        (w.iova() + 512, wl),
        (r.iova() + 512, rl),
    );
    assert_eq!(&r.to_vec()[512..512 + 3 * 4096], &data[..]);

    // A chained PRP list: the list pointer sits 24 bytes before the end of its page, so
    // the first list page holds two entries and a pointer to the next list page.
    let mut w = h.buf(6 * 4096);
    let data = pattern(6 * 4096, 6);
    w.write_at(0, &data).unwrap();
    let r = h.buf(6 * 4096);
    let chain = |h: &H, b: &DmaBuf| -> u64 {
        let mut l1 = h.buf(4096);
        let mut l2 = h.buf(4096);
        let p = |i: u64| (b.iova() + i * 4096).to_le_bytes();
        l1.write_at(4072, &p(1)).unwrap();
        l1.write_at(4080, &p(2)).unwrap();
        l1.write_at(4088, &l2.iova().to_le_bytes()).unwrap();
        for (k, i) in (3..6).enumerate() {
            l2.write_at(k * 8, &p(i)).unwrap();
        }
        let iova = l1.iova() + 4072;
        std::mem::forget(l1);
        std::mem::forget(l2);
        iova
    };
    let wl = chain(&h, &w);
    let rl = chain(&h, &r);
    round_trip(&mut h, &mut q, 60, 6, (w.iova(), wl), (r.iova(), rl));
    assert_eq!(r.to_vec(), data);

    // Unwritten blocks read as zeroes.
    let mut r = h.buf(4096);
    r.fill(0xFF);
    assert_ok(&h.io(&mut q, Sqe::read(1, 1000, 1, r.iova(), 0)));
    assert!(r.to_vec().iter().all(|&x| x == 0));

    let st = h.emu.stats();
    assert_eq!(st.writes, 6);
    assert_eq!(st.reads, 7);
    assert_eq!(st.bytes_written, (1 + 2 + 8 + 1 + 3 + 6) * 4096);
}

#[test]
fn nvm_negative_cases() {
    let mut h = H::new(small_cfg());
    let mut q = h.pair(1, 32);
    let b = h.buf(256 << 10);
    let l = prp_list_for(&h, &b);
    let nsze = (64u64 << 20) / 4096;
    let cases: Vec<(Sqe, Status)> = vec![
        // MDTS: 33 blocks of 4 KiB > 128 KiB.
        (Sqe::read(1, 0, 33, b.iova(), l), Status::INVALID_FIELD),
        (Sqe::write(1, 0, 33, b.iova(), l), Status::INVALID_FIELD),
        // LBA range.
        (Sqe::read(1, nsze, 1, b.iova(), 0), Status::LBA_OUT_OF_RANGE),
        (
            Sqe::write(1, nsze - 1, 2, b.iova(), b.iova() + 4096),
            Status::LBA_OUT_OF_RANGE,
        ),
        (
            Sqe::read(1, u64::MAX, 1, b.iova(), 0),
            Status::LBA_OUT_OF_RANGE,
        ),
        (
            Sqe::write_zeroes(1, nsze, 1, false),
            Status::LBA_OUT_OF_RANGE,
        ),
        // NSID.
        (
            Sqe::read(0, 0, 1, b.iova(), 0),
            Status::INVALID_NAMESPACE_OR_FORMAT,
        ),
        (
            Sqe::read(2, 0, 1, b.iova(), 0),
            Status::INVALID_NAMESPACE_OR_FORMAT,
        ),
        (
            Sqe::read(NSID_ALL, 0, 1, b.iova(), 0),
            Status::INVALID_NAMESPACE_OR_FORMAT,
        ),
        (Sqe::flush(0), Status::INVALID_NAMESPACE_OR_FORMAT),
        (Sqe::flush(9), Status::INVALID_NAMESPACE_OR_FORMAT),
        (
            Sqe::write_zeroes(3, 0, 1, false),
            Status::INVALID_NAMESPACE_OR_FORMAT,
        ),
        // PRP offsets.
        (
            Sqe::read(1, 0, 1, b.iova() + 2, 0),
            Status::PRP_OFFSET_INVALID,
        ),
        (
            Sqe::read(1, 0, 2, b.iova(), b.iova() + 4096 + 8),
            Status::PRP_OFFSET_INVALID,
        ),
        (
            Sqe::read(1, 0, 4, b.iova(), l + 1),
            Status::PRP_OFFSET_INVALID,
        ),
        // IOVAs outside the mappings: a virtual address, an unmapped IOVA, the guard page.
        (
            Sqe::read(1, 0, 1, b.as_ptr() as u64, 0),
            Status::DATA_TRANSFER_ERROR,
        ),
        (
            Sqe::write(1, 0, 1, 0x10_0000, 0),
            Status::DATA_TRANSFER_ERROR,
        ),
        (
            Sqe::read(1, 0, 2, b.iova(), 0x7000_0000_0000),
            Status::DATA_TRANSFER_ERROR,
        ),
        (
            Sqe::read(1, 0, 4, b.iova(), b.as_ptr() as u64),
            Status::DATA_TRANSFER_ERROR,
        ),
        // SGL requested.
        (
            Sqe::read(1, 0, 1, b.iova(), 0).tap(|s| s.cdw0 |= 1 << 14),
            Status::INVALID_FIELD,
        ),
        // Unsupported opcodes.
        (
            Sqe::new(nvm_opc::COMPARE).tap(|s| s.nsid = 1),
            Status::INVALID_OPCODE,
        ),
        (Sqe::new(0x7F).tap(|s| s.nsid = 1), Status::INVALID_OPCODE),
    ];
    for (sqe, want) in cases {
        let c = h.io(&mut q, sqe);
        assert_status(&c, want);
        assert!(c.status().dnr, "{want} should carry DNR");
    }
    // A PRP list entry that is not page aligned.
    let mut list = h.buf(4096);
    list.write_at(0, &(b.iova() + 4096).to_le_bytes()).unwrap();
    list.write_at(8, &(b.iova() + 8192 + 512).to_le_bytes())
        .unwrap();
    let c = h.io(&mut q, Sqe::read(1, 0, 3, b.iova(), list.iova()));
    assert_status(&c, Status::PRP_OFFSET_INVALID);
    // A list entry outside the mappings.
    list.write_at(8, &0x2000u64.to_le_bytes()).unwrap();
    let c = h.io(&mut q, Sqe::read(1, 0, 3, b.iova(), list.iova()));
    assert_status(&c, Status::DATA_TRANSFER_ERROR);
    // A list chaining to itself is bounded.
    let mut selfl = h.buf(4096);
    let p = selfl.iova() + 4088;
    selfl.write_at(4088, &p.to_le_bytes()).unwrap();
    let c = h.io(&mut q, Sqe::read(1, 0, 8, b.iova(), p));
    assert_status(&c, Status::PRP_OFFSET_INVALID);
    // A failed write did not write: the blocks still read as zeroes.
    let r = h.buf(4096);
    assert_ok(&h.io(&mut q, Sqe::read(1, 0, 1, r.iova(), 0)));
    assert!(r.to_vec().iter().all(|&x| x == 0));
    // An I/O SQ does not take admin opcodes.
    let c = h.io(
        &mut q,
        Sqe::identify(cns::CONTROLLER, 0, b.iova()).tap(|s| s.cdw0 = (s.cdw0 & !0xFF) | 0x18),
    );
    assert!(!c.status().is_success());
}

#[test]
fn unlimited_mdts_and_512_byte_blocks() {
    let mut h = H::new(EmuConfig {
        mdts: 0,
        namespaces: vec![EmuNamespace::new(16 << 20, 512, EmuStore::Memory)],
        ..Default::default()
    });
    assert_eq!(h.id_ctrl().mdts, 0);
    let mut q = h.pair(1, 8);
    // 1 MiB in one command (2048 blocks of 512 bytes), offset start.
    let mut w = h.buf((1 << 20) + 4096);
    let data = pattern(1 << 20, 7);
    w.write_at(2048, &data).unwrap();
    let wl = prp_list_for(&h, &w);
    let r = h.buf((1 << 20) + 4096);
    let rl = prp_list_for(&h, &r);
    round_trip(
        &mut h,
        &mut q,
        3,
        2048,
        (w.iova() + 2048, wl),
        (r.iova() + 2048, rl),
    );
    assert_eq!(&r.to_vec()[2048..2048 + (1 << 20)], &data[..]);
    // A single 512-byte block in the middle of a page.
    let mut w = h.buf(4096);
    w.write_at(1536, &[0xAB; 512]).unwrap();
    let r = h.buf(4096);
    round_trip(
        &mut h,
        &mut q,
        7777,
        1,
        (w.iova() + 1536, 0),
        (r.iova() + 1536, 0),
    );
    assert_eq!(&r.to_vec()[1536..2048], &[0xAB; 512]);
}

#[test]
fn write_zeroes_and_deallocate() {
    let mut h = H::new(small_cfg());
    let mut q = h.pair(1, 32);
    let mut w = h.buf(128 << 10);
    w.fill(0x77);
    let wl = prp_list_for(&h, &w);
    // Fill blocks 0..64 (256 KiB: four 64 KiB chunks).
    assert_ok(&h.io(&mut q, Sqe::write(1, 0, 32, w.iova(), wl)));
    assert_ok(&h.io(&mut q, Sqe::write(1, 32, 32, w.iova(), wl)));
    let nuse0 = h.id_ns(1).nuse;
    assert_eq!(nuse0, 64);
    let read = |h: &mut H, q: &mut Queue, lba: u64| -> u8 {
        let r = h.buf(4096);
        assert_ok(&h.io(q, Sqe::read(1, lba, 1, r.iova(), 0)));
        let v = r.to_vec();
        assert!(v.iter().all(|&x| x == v[0]), "block {lba} not uniform");
        v[0]
    };
    // Write Zeroes without DEAC over a whole chunk: zeroes, still allocated.
    assert_ok(&h.io(&mut q, Sqe::write_zeroes(1, 0, 16, false)));
    assert_eq!(read(&mut h, &mut q, 0), 0);
    assert_eq!(read(&mut h, &mut q, 15), 0);
    assert_eq!(read(&mut h, &mut q, 16), 0x77);
    assert_eq!(h.id_ns(1).nuse, 64);
    // With DEAC: zeroes and deallocated.
    assert_ok(&h.io(&mut q, Sqe::write_zeroes(1, 16, 16, true)));
    assert_eq!(read(&mut h, &mut q, 20), 0);
    assert_eq!(h.id_ns(1).nuse, 48);
    // Partial chunk with DEAC: zeroed, chunk kept.
    assert_ok(&h.io(&mut q, Sqe::write_zeroes(1, 33, 2, true)));
    assert_eq!(read(&mut h, &mut q, 32), 0x77);
    assert_eq!(read(&mut h, &mut q, 33), 0);
    assert_eq!(read(&mut h, &mut q, 34), 0);
    assert_eq!(read(&mut h, &mut q, 35), 0x77);

    // Dataset Management, deallocate two ranges.
    let mut rb = h.buf(4096);
    let ranges = [
        DsmRange {
            cattr: 0,
            nlb: 16,
            slba: 48,
        },
        DsmRange {
            cattr: 0,
            nlb: 1,
            slba: 40,
        },
    ];
    for (i, r) in ranges.iter().enumerate() {
        rb.write_at(i * 16, &r.to_bytes()).unwrap();
    }
    assert_ok(&h.io(&mut q, Sqe::deallocate(1, 2, rb.iova())));
    assert_eq!(read(&mut h, &mut q, 40), 0);
    assert_eq!(read(&mut h, &mut q, 41), 0x77);
    assert_eq!(read(&mut h, &mut q, 48), 0);
    assert_eq!(read(&mut h, &mut q, 63), 0);
    assert_eq!(h.id_ns(1).nuse, 32);
    // Without AD nothing happens.
    let mut noad = Sqe::deallocate(1, 1, rb.iova());
    noad.cdw11 = 0;
    rb.write_at(
        0,
        &DsmRange {
            cattr: 0,
            nlb: 1,
            slba: 41,
        }
        .to_bytes(),
    )
    .unwrap();
    assert_ok(&h.io(&mut q, noad));
    assert_eq!(read(&mut h, &mut q, 41), 0x77);
    // A range past the end fails the whole command before any range is applied.
    rb.write_at(
        16,
        &DsmRange {
            cattr: 0,
            nlb: 2,
            slba: (64 << 20) / 4096 - 1,
        }
        .to_bytes(),
    )
    .unwrap();
    assert_status(
        &h.io(&mut q, Sqe::deallocate(1, 2, rb.iova())),
        Status::LBA_OUT_OF_RANGE,
    );
    assert_eq!(read(&mut h, &mut q, 41), 0x77);
    // DSM ranges outside the mappings.
    assert_status(
        &h.io(&mut q, Sqe::deallocate(1, 1, 0x4000)),
        Status::DATA_TRANSFER_ERROR,
    );
    // Flush, one namespace and all.
    assert_ok(&h.io(&mut q, Sqe::flush(1)));
    assert_ok(&h.io(&mut q, Sqe::flush(NSID_ALL)));
}

#[test]
fn null_store_moves_no_data() {
    let mut h = H::new(EmuConfig {
        namespaces: vec![EmuNamespace::new(1 << 40, 4096, EmuStore::Null)],
        ..Default::default()
    });
    let mut q = h.pair(1, 8);
    let mut b = h.buf(8192);
    b.fill(0x3C);
    assert_ok(&h.io(&mut q, Sqe::write(1, 5, 2, b.iova(), b.iova() + 4096)));
    let mut r = h.buf(8192);
    r.fill(0xC3);
    assert_ok(&h.io(&mut q, Sqe::read(1, 5, 2, r.iova(), r.iova() + 4096)));
    assert!(
        r.to_vec().iter().all(|&x| x == 0xC3),
        "null reads leave the buffer untouched"
    );
    // PRPs are still checked.
    assert_status(
        &h.io(&mut q, Sqe::read(1, 0, 1, r.as_ptr() as u64, 0)),
        Status::DATA_TRANSFER_ERROR,
    );
    assert_eq!(h.id_ns(1).nsze, 1 << 28);
}

#[test]
fn file_store_persists_across_instances() {
    let dir = std::env::temp_dir().join(format!("kestrel-emu-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("ns1.img");
    let _ = std::fs::remove_file(&path);
    let cfg = || EmuConfig {
        namespaces: vec![EmuNamespace::new(
            32 << 20,
            512,
            EmuStore::File(path.clone()),
        )],
        ..Default::default()
    };
    let data = pattern(64 << 10, 9);
    {
        let mut h = H::new(cfg());
        let mut q = h.pair(1, 8);
        let mut w = h.buf(64 << 10);
        w.write_at(0, &data).unwrap();
        let wl = prp_list_for(&h, &w);
        assert_ok(&h.io(&mut q, Sqe::write(1, 1000, 128, w.iova(), wl)));
        // FUA write of one block.
        let mut one = h.buf(4096);
        one.fill(0x11);
        assert_ok(&h.io(
            &mut q,
            Sqe::write(1, 5, 1, one.iova(), 0).tap(|s| s.cdw12 |= 1 << 30),
        ));
        // Deallocate a range (hole punch) inside the data.
        assert_ok(&h.io(&mut q, Sqe::write_zeroes(1, 1000 + 64, 8, true)));
        assert_ok(&h.io(&mut q, Sqe::flush(1)));
    }
    assert_eq!(
        std::fs::metadata(&path).unwrap().len(),
        32 << 20,
        "created at the namespace size"
    );
    {
        let mut h = H::new(cfg());
        let mut q = h.pair(1, 8);
        let r = h.buf(64 << 10);
        let rl = prp_list_for(&h, &r);
        assert_ok(&h.io(&mut q, Sqe::read(1, 1000, 128, r.iova(), rl)));
        let mut want = data.clone();
        want[64 * 512..72 * 512].fill(0);
        assert_eq!(r.to_vec(), want);
        let one = h.buf(4096);
        assert_ok(&h.io(&mut q, Sqe::read(1, 5, 1, one.iova(), 0)));
        assert_eq!(&one.to_vec()[..512], &[0x11; 512]);
    }
    // A path that cannot be created is a clear error.
    let bad = EmuConfig {
        namespaces: vec![EmuNamespace::new(
            1 << 20,
            512,
            EmuStore::File(dir.join("no/such/dir/x")),
        )],
        ..Default::default()
    };
    let e = EmuController::start(bad).unwrap_err();
    assert!(matches!(e, EmuError::StoreFile { nsid: 1, .. }), "{e}");
    assert!(e.to_string().contains("no/such/dir"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn config_is_validated() {
    let cases = [
        EmuConfig {
            mqes: 0,
            ..Default::default()
        },
        EmuConfig {
            dstrd: 9,
            ..Default::default()
        },
        EmuConfig {
            max_io_queues: 0,
            ..Default::default()
        },
        EmuConfig {
            namespaces: vec![],
            ..Default::default()
        },
        EmuConfig {
            namespaces: vec![EmuNamespace::new(4096, 1024, EmuStore::Null)],
            ..Default::default()
        },
        EmuConfig {
            namespaces: vec![EmuNamespace::new(4097, 512, EmuStore::Null)],
            ..Default::default()
        },
        EmuConfig {
            serial: "x".repeat(21),
            ..Default::default()
        },
    ];
    for cfg in cases {
        let e = EmuController::start(cfg).unwrap_err();
        assert!(matches!(e, EmuError::Config { .. }), "{e}");
    }
}

use super::*;

#[test]
fn controller_round_trip() {
    let c = IdentifyController {
        vid: 0x1b36,
        sn: "kestrel0".into(),
        mn: "QEMU NVMe Ctrl".into(),
        fr: "8.0.0".into(),
        mdts: 7,
        ver: 0x0001_0400,
        oacs: oacs::DOORBELL_BUFFER_CONFIG,
        sqes: 0x66,
        cqes: 0x44,
        nn: 256,
        oncs: oncs::WRITE_ZEROES | oncs::DATASET_MANAGEMENT,
        vwc: 1,
        subnqn: "nqn.2019-08.org.qemu:kestrel0".into(),
        ..Default::default()
    };
    let b = c.to_bytes();
    assert_eq!(&b[24..38], b"QEMU NVMe Ctrl");
    assert_eq!(b[38], b' ');
    let p = IdentifyController::parse(&b);
    assert_eq!(p, c);
    assert_eq!(p.max_transfer_bytes(0), Some(512 * 1024));
    assert!(p.supports_shadow_doorbells());
}

#[test]
fn namespace_round_trip_and_lba_size() {
    let mut ns = IdentifyNamespace {
        nsze: 1 << 18,
        ncap: 1 << 18,
        nlbaf: 1,
        flbas: 1,
        dlfeat: 0x9,
        ..Default::default()
    };
    ns.lbaf[0] = LbaFormat {
        ms: 0,
        lbads: 9,
        rp: 0,
    };
    ns.lbaf[1] = LbaFormat {
        ms: 0,
        lbads: 12,
        rp: 0,
    };
    let p = IdentifyNamespace::parse(&ns.to_bytes());
    assert_eq!(p, ns);
    assert_eq!(p.lba_size(), Some(4096));
    assert!(p.deallocated_reads_zeroes());
    assert!(p.write_zeroes_deallocates());
    // FLBAS pointing past NLBAF is invalid.
    let bad = IdentifyNamespace {
        flbas: 5,
        ..ns.clone()
    };
    assert_eq!(bad.lba_size(), None);
}

#[test]
fn ns_id_descriptors_round_trip_and_hostile_input() {
    let d = NsIdDescriptors {
        eui64: Some([1, 2, 3, 4, 5, 6, 7, 8]),
        nguid: Some([9; 16]),
        uuid: None,
        csi: Some(crate::spec::csi::ZONED),
    };
    assert_eq!(NsIdDescriptors::parse(&d.to_bytes()), d);
    // A wrong length for a known type is skipped, the walk goes on.
    let mut b = [0u8; IDENTIFY_SIZE];
    b[0] = nidt::CSI;
    b[1] = 2;
    b[6] = nidt::CSI;
    b[7] = 1;
    b[10] = 2;
    assert_eq!(NsIdDescriptors::parse(&b).csi, Some(2));
    // A descriptor running past the page ends the list.
    let mut b = [0u8; IDENTIFY_SIZE];
    b[IDENTIFY_SIZE - 4] = nidt::NGUID;
    b[IDENTIFY_SIZE - 3] = 16;
    assert_eq!(NsIdDescriptors::parse(&b), NsIdDescriptors::default());
}

#[test]
fn ns_format_decodes_flbas_and_dps() {
    let mut ns = IdentifyNamespace {
        nsze: 8,
        nlbaf: 2,
        flbas: 0x12,
        dps: 0x09,
        ..Default::default()
    };
    ns.lbaf[2] = LbaFormat {
        ms: 8,
        lbads: 12,
        rp: 0,
    };
    let f = NsFormat::of(&ns, 0);
    assert_eq!((f.lbaf_index, f.ms, f.extended), (2, 8, true));
    assert_eq!(
        (f.pi_type, f.pi_first, f.data_size()),
        (1, true, Some(4096))
    );
    let s = f.to_string();
    for want in [
        "lba format 2",
        "4096 B",
        "ms 8 B extended",
        "flbas 0x12",
        "dps 0x09",
        "type 1 in the first",
        "NVM Command Set",
    ] {
        assert!(s.contains(want), "{s:?} lacks {want:?}");
    }
    ns.flbas = 3; // past NLBAF
    assert_eq!(NsFormat::of(&ns, 0).data_size(), None);
    assert!(NsFormat::of(&ns, 0).to_string().contains("past nlbaf 2"));
}

#[test]
fn parsers_take_any_bytes() {
    let mut b = [0u8; IDENTIFY_SIZE];
    for seed in 0..64u32 {
        let mut x = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        for v in b.iter_mut() {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            *v = x as u8;
        }
        let _ = IdentifyController::parse(&b);
        let ns = IdentifyNamespace::parse(&b);
        let _ = ns.lba_size();
        let _ = NsFormat::of(&ns, b[0]).to_string();
        let _ = NsIdDescriptors::parse(&b);
        let list = parse_active_ns_list(&b);
        assert!(list.windows(2).all(|w| w[0] < w[1]));
        let mut s = [0u8; SMART_LOG_SIZE];
        s.copy_from_slice(&b[..SMART_LOG_SIZE]);
        let _ = SmartLog::parse(&s);
        let _ = ErrorLogEntry::parse_page(&b);
    }
    let ones = [0xFFu8; IDENTIFY_SIZE];
    assert!(IdentifyNamespace::parse(&ones).lba_size().is_none());
    assert!(parse_active_ns_list(&ones).is_empty());
}

#[test]
fn smart_and_error_log_round_trip() {
    let s = SmartLog {
        composite_temperature_k: 310,
        available_spare_pct: 100,
        data_units_written: 12345,
        power_on_hours: 42,
        ..Default::default()
    };
    let p = SmartLog::parse(&s.to_bytes());
    assert_eq!(p, s);
    assert_eq!(p.temperature_celsius(), 37);
    let e = ErrorLogEntry {
        error_count: 3,
        sqid: 1,
        cid: 7,
        status: crate::spec::Status::LBA_OUT_OF_RANGE.to_cqe_status(),
        lba: 99,
        nsid: 1,
        ..Default::default()
    };
    let mut page = vec![0u8; 4 * ERROR_LOG_ENTRY_SIZE];
    page[..64].copy_from_slice(&e.to_bytes());
    let entries = ErrorLogEntry::parse_page(&page);
    assert_eq!(entries, vec![e]);
    assert!(entries[0]
        .status()
        .same_code(crate::spec::Status::LBA_OUT_OF_RANGE));
}

//! Identify and log page parsing (`kestrel::spec::identify`) on arbitrary device bytes.
//!
//! The input is padded with zeroes (or cut) to each structure's fixed size: 4096 bytes for
//! Identify Controller, Identify Namespace and the Active Namespace ID list, 512 for the
//! SMART / Health log, 64 for an Error Information entry; the whole input is also parsed as
//! an Error Information log page of any length.
//!
//! Invariants: no parser panics, nor do the accessors over parsed values; parsing what
//! `to_bytes` wrote gives the parsed value back (`parse(to_bytes(parse(x))) == parse(x)`)
//! exactly for the namespace, the logs and the NSID list, and for Identify Controller in
//! every field but a string whose lossy UTF-8 decoding outgrew its field (a non-ASCII
//! byte becomes the three bytes of U+FFFD), which must instead be stable from the second
//! round on; an NSID list is strictly increasing, without 0 or FFFFFFFFh.
#![no_main]

use kestrel::spec::identify::{
    encode_active_ns_list, parse_active_ns_list, ErrorLogEntry, IdentifyController,
    IdentifyNamespace, SmartLog, ERROR_LOG_ENTRY_SIZE, MAX_LBA_FORMATS, SMART_LOG_SIZE,
};
use kestrel::spec::{IDENTIFY_SIZE, NSID_ALL};
use libfuzzer_sys::fuzz_target;

fn fixed<const N: usize>(data: &[u8]) -> Box<[u8; N]> {
    let mut b = Box::new([0u8; N]);
    let n = data.len().min(N);
    b[..n].copy_from_slice(&data[..n]);
    b
}

/// Identify Controller with the string fields that cannot round trip blanked.
fn comparable(c: &IdentifyController, orig: &IdentifyController) -> IdentifyController {
    let mut c = c.clone();
    for (s, o, len) in [
        (&mut c.sn, &orig.sn, 20),
        (&mut c.mn, &orig.mn, 40),
        (&mut c.fr, &orig.fr, 8),
        (&mut c.subnqn, &orig.subnqn, 256),
    ] {
        if o.len() > len {
            s.clear();
        }
    }
    c
}

fn controller(b: &[u8; IDENTIFY_SIZE]) {
    let c = IdentifyController::parse(b);
    for mpsmin in [0u8, 4, 15, 255] {
        if let Some(m) = c.max_transfer_bytes(mpsmin) {
            assert!(m >= 4096, "MDTS {} gives {m} bytes", c.mdts);
        } else {
            assert_eq!(c.mdts, 0);
        }
    }
    let _ = (
        c.supports_shadow_doorbells(),
        c.supports_write_zeroes(),
        c.supports_dsm(),
        c.has_volatile_write_cache(),
    );
    for s in [&c.sn, &c.mn, &c.fr, &c.subnqn] {
        assert!(!s.ends_with([' ', '\0']), "strings are trimmed: {s:?}");
    }
    let c2 = IdentifyController::parse(&c.to_bytes());
    assert_eq!(comparable(&c2, &c), comparable(&c, &c));
    // Strings that were cut by the encoder: stable from the second round on.
    let c3 = IdentifyController::parse(&c2.to_bytes());
    assert_eq!(c3, c2, "second round trip");
}

fn namespace(b: &[u8; IDENTIFY_SIZE]) {
    let ns = IdentifyNamespace::parse(b);
    assert!(ns.lba_format_index() < MAX_LBA_FORMATS);
    let f = ns.lba_format();
    if let Some(sz) = ns.lba_size() {
        assert!(sz.is_power_of_two() && sz >= 512, "LBA size {sz}");
        assert_eq!(Some(sz), f.data_size());
        assert!(ns.lba_format_index() <= ns.nlbaf as usize);
    }
    let _ = (ns.deallocated_reads_zeroes(), ns.write_zeroes_deallocates());
    for l in &ns.lbaf {
        assert_eq!(kestrel::spec::LbaFormat::from_raw(l.to_raw()), *l);
    }
    assert_eq!(IdentifyNamespace::parse(&ns.to_bytes()), ns);
}

fn ns_list(b: &[u8; IDENTIFY_SIZE]) {
    let ids = parse_active_ns_list(b);
    assert!(ids.len() <= IDENTIFY_SIZE / 4);
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
    assert!(ids.iter().all(|&id| id != 0 && id != NSID_ALL));
    assert_eq!(parse_active_ns_list(&encode_active_ns_list(&ids)), ids);
}

fn smart(b: &[u8; SMART_LOG_SIZE]) {
    let s = SmartLog::parse(b);
    let _ = s.temperature_celsius();
    assert_eq!(SmartLog::parse(&s.to_bytes()), s);
}

fn error_log(entry: &[u8; ERROR_LOG_ENTRY_SIZE], page: &[u8]) {
    let e = ErrorLogEntry::parse(entry);
    let _ = e.status().to_string();
    assert_eq!(ErrorLogEntry::parse(&e.to_bytes()), e);
    let entries = ErrorLogEntry::parse_page(page);
    let valid = page
        .chunks_exact(ERROR_LOG_ENTRY_SIZE)
        .filter(|c| c[..8] != [0u8; 8])
        .count();
    assert_eq!(entries.len(), valid);
    for e in &entries {
        assert_ne!(e.error_count, 0);
        assert_eq!(ErrorLogEntry::parse(&e.to_bytes()), *e);
    }
}

fuzz_target!(|data: &[u8]| {
    let id = fixed::<IDENTIFY_SIZE>(data);
    controller(&id);
    namespace(&id);
    ns_list(&id);
    smart(&fixed::<SMART_LOG_SIZE>(data));
    error_log(&fixed::<ERROR_LOG_ENTRY_SIZE>(data), data);
});

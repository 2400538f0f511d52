//! `spec::Status`: decoding any CQE status halfword, `Display`, and the encode/decode
//! round trip.
//!
//! Invariants: decoding never panics; `to_cqe_status(from_cqe_status(raw)) == raw & !1`
//! (the phase bit is not status); a status built from any field values encodes and decodes
//! back to itself once its fields are in range (SCT 3 bits, CRD 2 bits); `Display` names
//! the status when the spec does, and shows SCT, SC, DNR, M and CRD as they are.
#![no_main]

use arbitrary::Arbitrary;
use kestrel::spec::{Sct, Status};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    raw: u16,
    sct: u8,
    sc: u8,
    crd: u8,
    more: bool,
    dnr: bool,
}

fn check_display(s: Status) {
    let text = s.to_string();
    assert_eq!(format!("{s:?}"), text, "Debug and Display agree");
    match s.name() {
        Some(n) => assert!(text.starts_with(n), "{text:?} does not start with {n:?}"),
        None if matches!(s.sct, Sct::VendorSpecific) => {
            assert!(text.starts_with("Vendor Specific"), "{text:?}")
        }
        None => assert!(text.starts_with("Unknown Status"), "{text:?}"),
    }
    let codes = format!("(sct {:#x}, sc {:#04x}", s.sct.code(), s.sc);
    assert!(text.contains(&codes), "{text:?} lacks {codes:?}");
    assert_eq!(text.contains(", dnr"), s.dnr, "{text:?}");
    assert_eq!(text.contains(", more"), s.more, "{text:?}");
    assert_eq!(text.contains(", crd "), s.crd != 0, "{text:?}");
    assert!(text.ends_with(')'), "{text:?}");
}

fn check_predicates(s: Status) {
    assert!(s.same_code(s));
    assert_eq!(
        s.is_success(),
        s.sct.code() == 0 && s.sc == 0,
        "success is SCT 0 / SC 0 only: {s}"
    );
    assert_eq!(
        s.is_retryable(),
        !s.is_success() && !s.dnr && s.sct.code() != 7,
        "{s}"
    );
    // DNR, M and CRD never change which status it is.
    assert!(s.same_code(s.with_dnr(!s.dnr).with_crd(s.crd.wrapping_add(1))));
}

fuzz_target!(|input: Input| {
    // Every halfword a device may post.
    let s = Status::from_cqe_status(input.raw);
    assert_eq!(s.to_cqe_status(), input.raw & !1, "raw {:#06x}", input.raw);
    assert_eq!(
        Status::from_cqe_status(input.raw | 1),
        s,
        "phase is not status"
    );
    assert_eq!(Sct::from_code(s.sct.code()), s.sct);
    assert!(s.crd <= 3);
    check_display(s);
    check_predicates(s);

    // Any field values: in range, they round trip exactly.
    let built = Status {
        sct: Sct::from_code(input.sct),
        sc: input.sc,
        crd: input.crd & 3,
        more: input.more,
        dnr: input.dnr,
    };
    assert_eq!(Status::from_cqe_status(built.to_cqe_status()), built);
    assert_eq!(
        built.to_cqe_status() & 1,
        0,
        "encoding leaves the phase bit clear"
    );
    check_display(built);
    check_predicates(built);
    assert_eq!(
        Status::new(built.sct, built.sc)
            .with_dnr(built.dnr)
            .with_crd(built.crd),
        Status {
            more: false,
            ..built
        }
    );

    // Out-of-range fields (a Reserved SCT holding any byte, CRD above 3) are masked by
    // the encoder and still display without panicking.
    let odd = Status {
        sct: Sct::Reserved(input.sct),
        sc: input.sc,
        crd: input.crd,
        more: input.more,
        dnr: input.dnr,
    };
    let _ = odd.to_string();
    let back = Status::from_cqe_status(odd.to_cqe_status());
    assert_eq!(back.sct.code(), input.sct & 7);
    assert_eq!(back.crd, input.crd & 3);
    assert_eq!((back.sc, back.more, back.dnr), (odd.sc, odd.more, odd.dnr));
});

//! `kestrel_nvmf::pdu`: the NVMe/TCP PDU parser as each end receives, on arbitrary bytes
//! and arbitrary negotiated settings.
//!
//! Invariants: parsing never panics; an accepted PDU's parts fit inside the input and
//! PLEN bytes; its data length is within the allowed maximum; re-encoding the decoded
//! header with the same digests, flags and data length and parsing it again gives the same
//! PDU and data; a parse of a prefix of an accepted PDU asks for more or fails, never
//! succeeds.
#![no_main]

use arbitrary::Arbitrary;
use kestrel_nvmf::pdu::{self, flags, Receiver, Rules};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Input {
    to_host: bool,
    initialized: bool,
    hdgst: bool,
    ddgst: bool,
    max_data: u16,
    bytes: Vec<u8>,
}

fuzz_target!(|inp: Input| {
    let rules = Rules {
        receiver: if inp.to_host {
            Receiver::Host
        } else {
            Receiver::Controller
        },
        initialized: inp.initialized,
        hdgst: inp.hdgst,
        ddgst: inp.ddgst,
        max_data: inp.max_data as u32,
    };
    let Ok(Some((p, used))) = pdu::parse(&inp.bytes, &rules) else {
        return;
    };
    assert!(used <= inp.bytes.len());
    assert_eq!(used, p.frame.ch.plen as usize);
    assert!(p.data.len() <= rules.max_data as usize || p.frame.ch.pdu_type <= 3);
    let hdr_end = p.frame.header_len() + p.frame.pad;
    assert!(hdr_end + p.data.len() <= used);
    // Re-encode (reserved bytes of the input are not kept) and parse again.
    let mut out = vec![0u8; 256];
    let extra = p.frame.ch.flags & (flags::LAST_PDU | flags::SUCCESS);
    let pda = 0;
    if p.frame.pad == 0 {
        let n = p.pdu.encode(
            &mut out,
            p.frame.hdgst,
            p.frame.ddgst,
            extra,
            p.data.len() as u32,
            pda,
        );
        let tail = vec![0u8; used - hdr_end - p.data.len()];
        let whole = [&out[..n], p.data, &tail[..]].concat();
        let again = pdu::parse(&whole, &rules);
        let Ok(Some((q, _))) = again else {
            panic!("re-encoded pdu does not parse: {again:?}");
        };
        assert_eq!(q.pdu, p.pdu);
        assert_eq!(q.data, p.data);
    }
    for cut in [used / 2, used.saturating_sub(1)] {
        if cut < used {
            if let Ok(Some(_)) = pdu::parse(&inp.bytes[..cut], &rules) {
                panic!("a prefix of {cut} of a {used}-byte pdu parsed");
            }
        }
    }
});

//! What the target refuses: a malformed PDU (closing only its own connection), unknown
//! hosts and subsystems, queues beyond the configured limits, and namespace formats it
//! cannot export (at start).

use std::io::{Read, Write};

use kestrel::spec::Sct;
use kestrel_nvmf::fabrics;
use kestrel_nvmf::pdu::Pdu;
use kestrel_nvmf::Limits;

use crate::common::{config, identify, pattern, rw, server, server_with, HOSTNQN, NQN};
use crate::host::Host;

#[test]
fn malformed_pdu_closes_only_its_connection() {
    let srv = server();
    let addr = srv.local_addr();
    let mut a = Host::connect(addr, false, false);
    let cntlid = a.admin_up(NQN, 0);
    let mut good = Host::connect(addr, false, false);
    assert!(good
        .fabric_connect(1, 31, cntlid, 0, 0, NQN, HOSTNQN)
        .status
        .is_success());
    let mut bad = Host::connect(addr, false, false);
    assert!(bad
        .fabric_connect(2, 31, cntlid, 0, 0, NQN, HOSTNQN)
        .status
        .is_success());
    // A CapsuleCmd whose HLEN is wrong.
    bad.s.write_all(&[4, 0, 70, 0, 70, 0, 0, 0]).unwrap();
    bad.s.write_all(&[0u8; 62]).unwrap();
    let (p, _, d) = bad.recv().expect("C2HTermReq");
    let Pdu::C2HTermReq(t) = p else {
        panic!("{p:?}")
    };
    assert_eq!((t.fes, t.fei), (1, 2), "invalid header field at HLEN");
    assert_eq!(&d[..4], &[4, 0, 70, 0], "the header in error is echoed");
    let mut rest = Vec::new();
    let n = bad.s.read_to_end(&mut rest).unwrap_or(0);
    assert_eq!(n, 0, "then the connection closes");
    // The other queue and the admin queue keep working.
    let data = pattern(8192, 9);
    let (c, _) = good.cmd(rw(0x01, 50, 2), &data, true, 0);
    assert!(c.status.is_success());
    let (c, d) = good.cmd(rw(0x02, 50, 2), &[], false, 8192);
    assert!(c.status.is_success());
    assert!(d == data);
    assert_eq!(identify(&mut a, 1, 0).len(), 4096);
    // A PDU type the controller never receives (CapsuleResp) on a fresh connection.
    let mut bad2 = Host::connect(addr, false, false);
    bad2.s.write_all(&[5, 0, 24, 0, 24, 0, 0, 0]).unwrap();
    bad2.s.write_all(&[0u8; 16]).unwrap();
    let (p, _, _) = bad2.recv().expect("C2HTermReq");
    assert!(matches!(p, Pdu::C2HTermReq(t) if t.fes == 1 && t.fei == 0));
    let (c, _) = good.cmd(rw(0x02, 50, 2), &[], false, 8192);
    assert!(c.status.is_success());
    srv.shutdown();
}

#[test]
fn unknown_hosts_are_refused_and_listed_hosts_admitted() {
    let srv = server_with(vec![HOSTNQN.to_string()], false, Limits::default());
    let addr = srv.local_addr();
    let mut h = Host::connect(addr, false, false);
    let c = h.fabric_connect(
        0,
        31,
        0xffff,
        0,
        0,
        NQN,
        "nqn.2014-08.org.nvmexpress:uuid:99999999-0000-0000-0000-000000000000",
    );
    assert_eq!(
        (c.status.sct, c.status.sc, c.status.dnr),
        (Sct::CommandSpecific, 0x84, true)
    );
    let c = h.fabric_connect(0, 31, 0xffff, 0, 0, "nqn.2026-12.io.kestrel:nope", HOSTNQN);
    assert_eq!((c.status.sct, c.status.sc), (Sct::CommandSpecific, 0x82));
    assert_eq!(c.dw0, 256 | (1 << 16), "IPO: SUBNQN in the data");
    let mut ok = Host::connect(addr, false, false);
    ok.admin_up(NQN, 0);
    // An I/O queue for a controller that does not exist.
    let mut io = Host::connect(addr, false, false);
    let c = io.fabric_connect(1, 31, 0x1234, 0, 0, NQN, HOSTNQN);
    assert_eq!((c.status.sct, c.status.sc), (Sct::CommandSpecific, 0x82));
    srv.shutdown();
}

#[test]
fn limits_are_enforced_at_connect() {
    let srv = server_with(
        Vec::new(),
        true,
        Limits {
            max_queue_size: 32,
            max_io_queues: 2,
            ..Limits::default()
        },
    );
    let addr = srv.local_addr();
    let mut a = Host::connect(addr, false, false);
    let c = a.fabric_connect(0, 64, 0xffff, 0, 0, NQN, HOSTNQN);
    assert_eq!((c.status.sct, c.status.sc), (Sct::CommandSpecific, 0x82));
    assert_eq!(c.dw0, 44, "IPO: SQSIZE in the command");
    let c = a.fabric_connect(0, 31, 0xffff, 0, 0, NQN, HOSTNQN);
    assert!(c.status.is_success());
    let cntlid = c.dw0 as u16;
    a.prop_set(fabrics::prop::CC, 1 | (6 << 16) | (4 << 20));
    let mut io = Host::connect(addr, false, false);
    let c = io.fabric_connect(3, 31, cntlid, 0, 0, NQN, HOSTNQN);
    assert_eq!(
        (c.status.sct, c.status.sc),
        (Sct::CommandSpecific, 0x82),
        "qid above the limit"
    );
    srv.shutdown();
}

/// A server of one subsystem exporting `spec` (an emulated controller).
fn start_one(spec: &str) -> Result<kestrel_nvmf::Server, String> {
    let target = kestrel::target_spec::open(spec).expect("emulator");
    let cfg = config(vec![target], 1, Vec::new(), true, Limits::default());
    kestrel_nvmf::Server::start(cfg).map_err(|e| e.to_string())
}

/// Every namespace is exported as an NVM namespace without metadata: a zoned namespace
/// (whose writes must follow the write pointers) and a format whose metadata every I/O
/// must carry are refused when the server starts, naming the namespace and why, rather
/// than failing the host's I/O later. Protection information that is the whole metadata
/// is exported: the controller inserts and strips it, and the host's data round-trips.
#[test]
fn formats_that_cannot_be_exported_are_refused_at_start() {
    for (spec, want) in [
        ("emu:ns=16M+zoned,core=none", "it is a zoned namespace"),
        (
            "emu:ns=16M+4096+md8,core=none",
            "8 bytes of metadata per block (separate buffer)",
        ),
        (
            "emu:ns=16M+512+md16+ext+pi1,core=none",
            "16 bytes of metadata per block (extended lba)",
        ),
    ] {
        let e = start_one(spec)
            .err()
            .unwrap_or_else(|| panic!("{spec}: served"));
        assert!(
            e.contains(want) && e.contains(&format!("nsid 1 of {NQN}")),
            "{spec}: {e}"
        );
    }
    let srv = start_one("emu:ns=16M+4096+md8+pi1,core=none").expect("pi as the whole metadata");
    // The admin queue's connection stays open: losing it ends the controller.
    let mut a = Host::connect(srv.local_addr(), false, false);
    let cntlid = a.admin_up(NQN, 0);
    let mut io = Host::connect(srv.local_addr(), false, false);
    assert!(io
        .fabric_connect(1, 31, cntlid, 0, 0, NQN, HOSTNQN)
        .status
        .is_success());
    let data = pattern(8192, 5);
    let (c, _) = io.cmd(rw(0x01, 10, 2), &data, true, 0);
    assert!(c.status.is_success(), "{c:?}");
    let (c, d) = io.cmd(rw(0x02, 10, 2), &[], false, 8192);
    assert!(c.status.is_success() && d == data, "{c:?}");
    srv.shutdown();
}

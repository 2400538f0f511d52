//! SQ flow control disabled at Connect (NVMe over Fabrics, Connect command CATTR bit 2):
//! the controller answers SQHD FFFFh in the Connect response and in every response after
//! it on that queue, and may end a successful read with its last C2HData carrying SUCCESS
//! and send no response capsule (NVMe/TCP transport, C2HData PDU). A queue that keeps SQ
//! flow control gets response capsules with a real SQHD and never SUCCESS.

use crate::client::{Client, Data};
use crate::fabric::*;
use crate::wire::*;
use crate::{server, NQN};

/// An I/O queue 1 connected with `cattr` (digests on); its Connect's completion.
fn io_queue(cattr: u8) -> (kestrel_nvmf::Server, Client, Client, Completion) {
    let srv = server(true, &[]);
    let addr = srv.local_addr();
    let (mut a, cntlid) = admin_up(addr, NQN, hostnqn(), 10_000);
    assert!(set_queues(&mut a, Style::Linux, 1) >= 1);
    let mut q = Client::connect(addr, true, true);
    let c = connect_cattr(&mut q, 1, cntlid, NQN, hostnqn(), 0, cattr)
        .unwrap_or_else(|c| panic!("i/o queue connect: {c:?}"));
    (srv, a, q, c)
}

#[test]
fn sq_flow_control_disabled_reads_end_with_success() {
    let (srv, a, mut q, c) = io_queue(CATTR_DISABLE_SQFLOW);
    assert_eq!(c.sqhd, 0xffff, "connect response: {c:?}");
    let data = pattern(8192, 7);
    let r = q.exec(rw(WRITE, 20, 2), Data::InCapsule(&data));
    assert!(r.cqe.ok() && r.cqe.sqhd == 0xffff, "write: {:?}", r.cqe);
    let resps = q.resp_capsules;
    let r = q.exec(rw(READ, 20, 2), Data::Read(8192));
    assert!(r.cqe.ok() && r.data == data, "read back: {:?}", r.cqe);
    assert_eq!(
        (q.success_flags, q.resp_capsules),
        (1, resps),
        "a successful read ends with C2HData SUCCESS and no response capsule"
    );
    // A read that fails (beyond the 16 MiB namespace) is answered by a response capsule.
    let r = q.exec(rw(READ, 1 << 20, 1), Data::Read(4096));
    assert!(!r.cqe.ok() && r.cqe.sqhd == 0xffff, "{:?}", r.cqe);
    assert_eq!((q.success_flags, q.resp_capsules), (1, resps + 1));
    assert!(q.violations.is_empty(), "{:?}", q.violations);
    assert!(a.violations.is_empty(), "{:?}", a.violations);
    srv.shutdown();
}

#[test]
fn sq_flow_control_kept_reads_get_a_response() {
    let (srv, _a, mut q, c) = io_queue(0);
    assert_ne!(c.sqhd, 0xffff, "connect response: {c:?}");
    let data = pattern(8192, 9);
    let r = q.exec(rw(WRITE, 30, 2), Data::InCapsule(&data));
    assert!(r.cqe.ok() && r.cqe.sqhd != 0xffff, "write: {:?}", r.cqe);
    let resps = q.resp_capsules;
    let r = q.exec(rw(READ, 30, 2), Data::Read(8192));
    assert!(r.cqe.ok() && r.data == data && r.cqe.sqhd != 0xffff);
    assert_eq!((q.success_flags, q.resp_capsules), (0, resps + 1));
    assert!(q.violations.is_empty(), "{:?}", q.violations);
    srv.shutdown();
}

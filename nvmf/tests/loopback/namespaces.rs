//! Two namespaces of one subsystem: Identify per NSID, I/O routed by NSID, inactive NSIDs
//! refused; namespaces of one controller (one DMA pool) each with their own buffers.

use kestrel::spec::Status;
use kestrel_nvmf::{Limits, Server};

use crate::common::{config, identify, pattern, rw, sqe, HOSTNQN, NQN};
use crate::host::Host;

fn rw_ns(opc: u8, nsid: u32, slba: u64, nlb: u32) -> [u8; 64] {
    let mut s = rw(opc, slba, nlb);
    s[4..8].copy_from_slice(&nsid.to_le_bytes());
    s
}

#[test]
fn several_namespaces_of_one_subsystem_are_identified_and_routed_by_nsid() {
    let srv = two_namespaces();
    let addr = srv.local_addr();
    let mut a = Host::connect(addr, false, false);
    let cntlid = a.admin_up(NQN, 0);
    identify_each_namespace(&mut a);
    identify_refuses_inactive_nsids(&mut a);

    let mut io = Host::connect(addr, false, false);
    assert!(io
        .fabric_connect(1, 63, cntlid, 0, 0, NQN, HOSTNQN)
        .status
        .is_success());
    let p1 = io_routed_by_nsid(&mut io);
    ranges_and_flush_per_namespace(&mut io);
    io_refuses_inactive_nsids(&mut io, &p1);
    drop(io);
    drop(a);
    srv.shutdown();
}

/// Two namespaces of one controller (4 KiB and 512-byte blocks, as in `two_namespaces`)
/// share its DMA pool but not a target queue: an I/O queue's buffers are lent per
/// namespace, so data in capsule and through R2T reaches each namespace, and reads of each
/// come back.
#[test]
fn namespaces_of_one_controller_each_have_their_own_lent_buffers() {
    let spec = kestrel::target_spec::parse("emu:ns=16M,ns=8M+512,core=none").unwrap();
    let opened = kestrel::target_spec::open_with(&spec, &Default::default()).expect("emulator");
    let targets = opened.block_targets().expect("two namespaces");
    assert_eq!(targets.len(), 2);
    assert!(
        targets[0].dma_pool().same_pool(targets[1].dma_pool()),
        "one controller, one pool"
    );
    let pool = targets[0].dma_pool().clone();
    let cfg = config(targets, 1, Vec::new(), true, Limits::default());
    let srv = Server::start(cfg).expect("server starts");
    let addr = srv.local_addr();
    let mut a = Host::connect(addr, false, false);
    let cntlid = a.admin_up(NQN, 0);
    let before = pool.used_bytes();
    let mut io = Host::connect(addr, false, false);
    assert!(io
        .fabric_connect(1, 63, cntlid, 0, 0, NQN, HOSTNQN)
        .status
        .is_success());
    let lim = Limits::default();
    let per_ns = lim.queue_buffer as usize + 32 * lim.in_capsule_data as usize;
    assert!(
        pool.used_bytes() - before >= 2 * per_ns,
        "a set of buffers per namespace: {} bytes",
        pool.used_bytes() - before
    );
    let p1 = io_routed_by_nsid(&mut io);
    ranges_and_flush_per_namespace(&mut io);
    io_refuses_inactive_nsids(&mut io, &p1);
    drop(io);
    drop(a);
    srv.shutdown();
}

/// A server whose one subsystem has two namespaces: two emulated controllers (so two DMA
/// pools), 4 KiB and 512-byte blocks, as namespaces 1 and 2.
fn two_namespaces() -> Server {
    let t1 = kestrel::target_spec::open("emu:size=16M,core=none").expect("emulator 1");
    let t2 = kestrel::target_spec::open("emu:size=8M,lba=512,core=none").expect("emulator 2");
    let cfg = config(vec![t1, t2], 1, Vec::new(), true, Limits::default());
    Server::start(cfg).expect("server starts")
}

/// NN, the active namespace lists, each namespace's data and identification descriptors.
fn identify_each_namespace(a: &mut Host) {
    let idc = identify(a, 1, 0);
    assert_eq!(
        u32::from_le_bytes(idc[516..520].try_into().unwrap()),
        2,
        "NN"
    );
    // Active namespace lists: all, then those above 1, then none above 2.
    let list = identify(a, 2, 0);
    assert_eq!(&list[..12], &[1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0]);
    let list = identify(a, 2, 1);
    assert_eq!(&list[..8], &[2, 0, 0, 0, 0, 0, 0, 0]);
    let list = identify(a, 2, 2);
    assert!(list.iter().all(|&b| b == 0));
    let n1 = identify(a, 0, 1);
    let n2 = identify(a, 0, 2);
    assert_eq!(u64::from_le_bytes(n1[0..8].try_into().unwrap()), 4096);
    assert_eq!(n1[128 + 2], 12, "LBADS of nsid 1");
    assert_eq!(u64::from_le_bytes(n2[0..8].try_into().unwrap()), 16384);
    assert_eq!(n2[128 + 2], 9, "LBADS of nsid 2");
    assert_ne!(n1[104..120], n2[104..120], "distinct NGUIDs");
    let d1 = kestrel::spec::NsIdDescriptors::parse(&identify(a, 3, 1).try_into().unwrap());
    let d2 = kestrel::spec::NsIdDescriptors::parse(&identify(a, 3, 2).try_into().unwrap());
    assert_eq!(d2.nguid.unwrap(), n2[104..120]);
    assert_ne!(d1.uuid, d2.uuid, "distinct UUIDs");
}

/// NSIDs that are not active: Invalid Namespace or Format.
fn identify_refuses_inactive_nsids(a: &mut Host) {
    for (cns, nsid) in [(0u8, 3u32), (3, 3), (3, 0), (0, 0), (2, 0xffff_fffe)] {
        let mut s = sqe(0x06, nsid);
        s[40] = cns;
        let (c, _) = a.cmd(s, &[], false, 4096);
        assert!(
            c.status.same_code(Status::INVALID_NAMESPACE_OR_FORMAT) && c.status.dnr,
            "identify cns {cns} nsid {nsid:#x}: {:?}",
            c.status
        );
    }
}

/// The same LBAs of each namespace hold their own data: in capsule and through R2T.
/// Returns the 4 KiB written at LBA 0 of namespace 1.
fn io_routed_by_nsid(io: &mut Host) -> Vec<u8> {
    let p1 = pattern(4096, 11);
    let p2 = pattern(4096, 22);
    let q1 = pattern(64 << 10, 33);
    let q2 = pattern(64 << 10, 44);
    assert!(io
        .cmd(rw_ns(0x01, 1, 0, 1), &p1, true, 0)
        .0
        .status
        .is_success());
    assert!(io
        .cmd(rw_ns(0x01, 2, 0, 8), &p2, true, 0)
        .0
        .status
        .is_success());
    assert!(io
        .cmd(rw_ns(0x01, 1, 16, 16), &q1, false, 0)
        .0
        .status
        .is_success());
    assert!(io
        .cmd(rw_ns(0x01, 2, 16, 128), &q2, false, 0)
        .0
        .status
        .is_success());
    let (c, d) = io.cmd(rw_ns(0x02, 1, 0, 1), &[], false, 4096);
    assert!(c.status.is_success() && d == p1, "nsid 1 lba 0");
    let (c, d) = io.cmd(rw_ns(0x02, 2, 0, 8), &[], false, 4096);
    assert!(c.status.is_success() && d == p2, "nsid 2 lba 0");
    let (c, d) = io.cmd(rw_ns(0x02, 1, 16, 16), &[], false, 64 << 10);
    assert!(c.status.is_success() && d == q1, "nsid 1 lba 16");
    let (c, d) = io.cmd(rw_ns(0x02, 2, 16, 128), &[], false, 64 << 10);
    assert!(c.status.is_success() && d == q2, "nsid 2 lba 16");
    p1
}

/// Ranges are each namespace's own; Flush of one namespace and of all of them.
fn ranges_and_flush_per_namespace(io: &mut Host) {
    // Ranges are each namespace's own: LBA 5000 exists only in nsid 2.
    let (c, _) = io.cmd(rw_ns(0x02, 1, 5000, 1), &[], false, 4096);
    assert!(
        c.status.same_code(Status::LBA_OUT_OF_RANGE),
        "{:?}",
        c.status
    );
    let (c, _) = io.cmd(rw_ns(0x02, 2, 5000, 8), &[], false, 4096);
    assert!(c.status.is_success(), "{:?}", c.status);
    // Flush of one namespace and of all of them.
    assert!(io.cmd(sqe(0x00, 2), &[], false, 0).0.status.is_success());
    assert!(io
        .cmd(sqe(0x00, 0xffff_ffff), &[], false, 0)
        .0
        .status
        .is_success());
}

/// Inactive NSIDs on the I/O queue are refused, and the data written at LBA 0 of namespace
/// 1 (`p1`) is still there.
fn io_refuses_inactive_nsids(io: &mut Host, p1: &[u8]) {
    // Inactive NSIDs on the I/O queue, with and without data.
    for nsid in [0u32, 3, 0xffff_ffff] {
        let (c, _) = io.cmd(rw_ns(0x02, nsid, 0, 1), &[], false, 4096);
        assert!(
            c.status.same_code(Status::INVALID_NAMESPACE_OR_FORMAT) && c.status.dnr,
            "read nsid {nsid:#x}: {:?}",
            c.status
        );
        let (c, _) = io.cmd(rw_ns(0x01, nsid, 0, 1), p1, true, 0);
        assert!(
            c.status.same_code(Status::INVALID_NAMESPACE_OR_FORMAT),
            "write nsid {nsid:#x}: {:?}",
            c.status
        );
    }
    let (c, _) = io.cmd(sqe(0x00, 3), &[], false, 0);
    assert!(c.status.same_code(Status::INVALID_NAMESPACE_OR_FORMAT));
    // The data is still where it was written.
    let (c, d) = io.cmd(rw_ns(0x02, 1, 0, 1), &[], false, 4096);
    assert!(c.status.is_success() && d == p1);
}

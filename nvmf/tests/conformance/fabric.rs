//! Fabrics steps of a host's life, as the NVMe over Fabrics specification orders them:
//! Connect (admin queue: a controller; I/O queue: bound to it), properties, enabling,
//! Set Features Number of Queues, shutdown, Disconnect.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::client::{Client, Data, NoData, HOSTID, HOSTNQN};
use crate::wire::*;

/// Set Features, Get Features, Keep Alive, Asynchronous Event Request opcodes.
pub const SET_FEATURES: u8 = 0x09;
pub const KEEP_ALIVE: u8 = 0x18;
pub const AER: u8 = 0x0c;
pub const IDENTIFY: u8 = 0x06;
pub const WRITE: u8 = 0x01;
pub const READ: u8 = 0x02;
pub const FLUSH: u8 = 0x00;
/// Feature identifiers.
pub const FID_NUMBER_OF_QUEUES: u8 = 0x07;
pub const FID_ASYNC_EVENT_CONFIG: u8 = 0x0b;
pub const FID_KEEP_ALIVE_TIMER: u8 = 0x0f;

/// How a host encodes its commands.
#[derive(Clone, Copy, Debug)]
pub enum Style {
    /// SPDK's initiator: in-capsule (Offset) SGL of length 0 for a data-less command whose
    /// direction is host to controller (Set Features), Transport SGL otherwise.
    Spdk,
    /// The Linux initiator: a Transport SGL of length 0 for every data-less command.
    Linux,
}

impl Style {
    /// The data-less encoding of a command of opcode `opc` (Fabrics: of FCTYPE `opc`).
    pub fn no_data(self, opc: u8) -> Data<'static> {
        match self {
            Style::Spdk if opc & 3 == 1 => Data::None(NoData::InCapsule),
            _ => Data::None(NoData::Transport),
        }
    }
}

/// A Connect on `c`: `Err` is the refusal's completion.
pub fn connect(
    c: &mut Client,
    qid: u16,
    cntlid: u16,
    subnqn: &str,
    hostnqn: &[u8],
    kato_ms: u32,
) -> Result<u16, Completion> {
    connect_cattr(c, qid, cntlid, subnqn, hostnqn, kato_ms, 0).map(|r| r.dw0 as u16)
}

/// A Connect with Connect attributes `cattr` (bit 2: disable SQ flow control); returns
/// its response. A controller that disables SQ flow control answers SQHD FFFFh, and the
/// client then expects FFFFh in every response on that queue.
pub fn connect_cattr(
    c: &mut Client,
    qid: u16,
    cntlid: u16,
    subnqn: &str,
    hostnqn: &[u8],
    kato_ms: u32,
    cattr: u8,
) -> Result<Completion, Completion> {
    let d = connect_data(HOSTID, cntlid, subnqn, hostnqn);
    c.qid = qid;
    let r = c.exec(connect_sqe(qid, 31, cattr, kato_ms), Data::InCapsule(&d));
    if r.cqe.ok() {
        c.sqflow_disabled = cattr & CATTR_DISABLE_SQFLOW != 0 && r.cqe.sqhd == 0xffff;
        Ok(r.cqe)
    } else {
        Err(r.cqe)
    }
}

pub fn prop_get(c: &mut Client, ofst: u32, size8: bool) -> u64 {
    let r = c.exec(
        property(fctype::PROPERTY_GET, ofst, size8, 0),
        Data::None(NoData::Transport),
    );
    assert!(r.cqe.ok(), "property get {ofst:#x}: {:?}", r.cqe);
    r.cqe.dw0 as u64 | ((r.cqe.dw1 as u64) << 32)
}

pub fn prop_set(c: &mut Client, ofst: u32, value: u32) {
    let r = c.exec(
        property(fctype::PROPERTY_SET, ofst, false, value as u64),
        Data::None(NoData::Transport),
    );
    assert!(
        r.cqe.ok(),
        "property set {ofst:#x} = {value:#x}: {:?}",
        r.cqe
    );
}

/// CC.EN with IOSQES 6 and IOCQES 4, then CSTS.RDY polled.
pub fn enable(c: &mut Client) {
    let cap = prop_get(c, prop::CAP, true);
    assert!(cap & 0xffff >= 31, "CAP.MQES");
    prop_set(c, prop::CC, 1 | (6 << 16) | (4 << 20));
    poll_csts(c, |csts| csts & 1 == 1, "CSTS.RDY = 1");
}

/// Polls CSTS until `done` holds (at most 5 s, as a host bounded by CAP.TO would).
pub fn poll_csts(c: &mut Client, done: impl Fn(u32) -> bool, what: &str) -> u32 {
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let csts = prop_get(c, prop::CSTS, false) as u32;
        if done(csts) {
            return csts;
        }
        assert!(Instant::now() < end, "{what}: CSTS {csts:#x}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Set Features Number of Queues (NSQR = NCQR = n - 1); returns the queues granted.
pub fn set_queues(c: &mut Client, style: Style, n: u16) -> u16 {
    let v = (n - 1) as u32;
    let s = sqe(SET_FEATURES, 0, FID_NUMBER_OF_QUEUES as u32, v | (v << 16));
    let r = c.exec(s, style.no_data(SET_FEATURES));
    assert!(
        r.cqe.ok(),
        "set features number of queues ({style:?}): {:?}",
        r.cqe
    );
    (r.cqe.dw0 & 0xffff) as u16 + 1
}

/// An admin queue up to an enabled controller; returns the client and the CNTLID.
pub fn admin_up(addr: SocketAddr, subnqn: &str, hostnqn: &[u8], kato_ms: u32) -> (Client, u16) {
    let mut a = Client::connect(addr, false, false);
    let cntlid = connect(&mut a, 0, 0xffff, subnqn, hostnqn, kato_ms)
        .unwrap_or_else(|c| panic!("admin connect: {c:?}"));
    enable(&mut a);
    let id = a.exec(sqe(IDENTIFY, 0, 1, 0), Data::Read(4096));
    assert!(id.cqe.ok(), "identify controller: {:?}", id.cqe);
    assert_eq!(get16(&id.data, 78), cntlid, "CNTLID in Identify");
    (a, cntlid)
}

/// An I/O queue `qid` of controller `cntlid`.
pub fn io_up(addr: SocketAddr, cntlid: u16, qid: u16, subnqn: &str, hostnqn: &[u8]) -> Client {
    let mut q = Client::connect(addr, false, false);
    connect(&mut q, qid, cntlid, subnqn, hostnqn, 0)
        .unwrap_or_else(|c| panic!("i/o queue {qid} connect: {c:?}"));
    q
}

/// The default host NQN.
pub fn hostnqn() -> &'static [u8] {
    HOSTNQN.as_bytes()
}

/// Read or Write of `nlb` 4 KiB blocks at `slba` of namespace 1.
pub fn rw(opc: u8, slba: u64, nlb: u16) -> [u8; 64] {
    let mut s = sqe(opc, 1, slba as u32, (slba >> 32) as u32);
    put32(&mut s, 48, nlb as u32 - 1);
    s
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(29) ^ seed ^ (i >> 8) as u8)
        .collect()
}

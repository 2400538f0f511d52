//! What the budget tests share: one test at a time, resident memory, a server with one
//! listed host, that host's verified I/O, a stranger's discovery queue, commands posted
//! without waiting for their answers.

use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kestrel::spec::{Sct, Status};
use kestrel_nvmf::budget::{Class, MemoryReport};
use kestrel_nvmf::fabrics::{self, Sgl, DISCOVERY_NQN};
use kestrel_nvmf::pdu::Pdu;
use kestrel_nvmf::{Limits, Server};

use crate::common::{config, pattern, rw, HOSTNQN, NQN};
use crate::host::{Cqe, Host};

/// A host no allow-list names.
pub const STRANGER: &str = "nqn.2014-08.org.nvmexpress:uuid:99999999-0000-0000-0000-00000000beef";
/// Resident memory the process may gain beyond the budget's bounds during a test
/// (allocator and thread noise); the sequences tested held 128 MiB and more before the
/// budget.
pub const SLACK: u64 = 24 << 20;
/// For "never happens" and "eventually happens" waits on a loaded machine.
pub const PATIENCE: Duration = Duration::from_secs(60);

static SERIAL: Mutex<()> = Mutex::new(());

/// Runs the calling test alone.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|p| p.into_inner())
}

/// The process's resident memory, bytes.
pub fn rss() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kb: u64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS");
    kb << 10
}

/// A server on loopback exporting an emulated namespace to `HOSTNQN` only.
pub fn budget_server(limits: Limits) -> Server {
    let target = kestrel::target_spec::open("emu:size=8M,core=none").expect("emulator");
    let cfg = config(vec![target], 2, vec![HOSTNQN.to_string()], false, limits);
    Server::start(cfg).expect("server starts")
}

/// The listed host: an admin queue (keep-alive off, held open: its controller lives
/// while it does) and an I/O queue.
pub struct Allowed {
    _admin: Host,
    pub io: Host,
    pub cntlid: u16,
    round: u8,
}

impl Allowed {
    pub fn up(addr: SocketAddr) -> Allowed {
        let mut admin = Host::connect(addr, false, false);
        let cntlid = admin.admin_up(NQN, 0);
        let mut io = Host::connect(addr, false, false);
        let c = io.fabric_connect(1, 31, cntlid, 0, 0, NQN, HOSTNQN);
        assert!(c.status.is_success(), "i/o queue connect: {c:?}");
        Allowed {
            _admin: admin,
            io,
            cntlid,
            round: 0,
        }
    }

    /// Writes (in capsule and through R2T) and reads back, compared.
    pub fn verify(&mut self) {
        self.round = self.round.wrapping_add(1);
        for (slba, blocks, in_capsule) in [(16u64, 1u32, true), (64, 16, false)] {
            let data = pattern(blocks as usize * 4096, self.round);
            let (c, _) = self.io.cmd(rw(0x01, slba, blocks), &data, in_capsule, 0);
            assert!(c.status.is_success(), "write: {c:?}");
            let (c, d) = self
                .io
                .cmd(rw(0x02, slba, blocks), &[], false, data.len() as u32);
            assert!(c.status.is_success(), "read: {c:?}");
            assert!(
                d == data,
                "read back what was written (round {})",
                self.round
            );
        }
    }
}

/// A discovery admin queue (`sqsize`, keep-alive off, header and data digests if
/// `digests`) of a host no allow-list names.
pub fn stranger_discovery(addr: SocketAddr, sqsize: u16, digests: bool) -> Host {
    let mut d = Host::connect(addr, digests, digests);
    let c = d.fabric_connect(0, sqsize, 0xffff, 0, 0, DISCOVERY_NQN, STRANGER);
    assert!(c.status.is_success(), "discovery connect: {c:?}");
    d.prop_set(fabrics::prop::CC, 1 | (6 << 16) | (4 << 20));
    d
}

/// Sends command `sqe` with `cid` and `sgl` (and `data` in the capsule) without waiting.
pub fn post(h: &mut Host, mut sqe: [u8; 64], cid: u16, sgl: Sgl, data: &[u8]) {
    sqe[1] = 0x40;
    sqe[2..4].copy_from_slice(&cid.to_le_bytes());
    sgl.encode(&mut sqe);
    h.send(Pdu::CapsuleCmd(sqe), 0, data);
}

/// The status of a response capsule, `None` for any other PDU.
pub fn status_of(p: &Pdu) -> Option<Status> {
    match p {
        Pdu::CapsuleResp(c) => Some(Cqe::parse(c).status),
        _ => None,
    }
}

/// Whether `p` answers with generic status `sc`.
pub fn is_generic(p: &Pdu, sc: u8) -> bool {
    status_of(p).is_some_and(|s| s.sct == Sct::Generic && s.sc == sc)
}

/// Waits for `f` (polled every 10 ms) for up to `PATIENCE`; whether it came.
pub fn wait_until(mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + PATIENCE;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    f()
}

/// Whether the server closes `s` within `PATIENCE` (what it sends before is skipped): the
/// end of the stream, or any error but the read timing out (a reset).
pub fn closed_by_server(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(PATIENCE)).unwrap();
    let mut b = [0u8; 4096];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => {
                let timed_out = matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                );
                eprintln!("reading until the server closes: {e}");
                return !timed_out;
            }
        }
    }
}

/// Checks the memory held against the budget: the process gained at most `bound` (plus
/// `SLACK`) over `rss0`, and no connection of a class ever held more than its bound.
pub fn assert_within(srv: &Server, rss0: u64, bound: u64, what: &str) {
    let (now, m) = (rss(), srv.memory());
    let gained = now.saturating_sub(rss0);
    eprintln!(
        "{what}: resident {} KiB -> {} KiB (+{} KiB, bound {} KiB + slack); server: {m:?}",
        rss0 >> 10,
        now >> 10,
        gained >> 10,
        bound >> 10
    );
    assert!(
        gained <= bound + SLACK,
        "{what}: resident memory grew by {} KiB, more than the budget's {} KiB (+{} KiB)",
        gained >> 10,
        bound >> 10,
        SLACK >> 10
    );
    assert_classes_within(srv, &m, what);
}

fn assert_classes_within(srv: &Server, m: &MemoryReport, what: &str) {
    for (class, r) in [
        (Class::PreConnect, m.pre_connect),
        (Class::Unauth, m.unauth),
        (Class::Admin, m.admin),
    ] {
        let b = srv.connection_bound(class).expect("a bound");
        assert!(
            r.peak_per_connection <= b,
            "{what}: a {class:?} connection held {} bytes, over its bound {b}",
            r.peak_per_connection
        );
        assert!(
            r.bytes <= b * r.connections as u64,
            "{what}: {class:?} connections hold {} bytes, {} of them bounded by {b} each",
            r.bytes,
            r.connections
        );
    }
}

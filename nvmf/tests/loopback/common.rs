//! What the modules share: the names, servers on an ephemeral loopback port over an
//! emulated controller, and command builders.

use std::sync::Arc;

use kestrel::Target;
use kestrel_nvmf::{Limits, Server, ServerConfig, SubsystemConfig};

use crate::host::Host;

pub const HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
pub const HOSTID: [u8; 16] = [0x42; 16];
pub const NQN: &str = "nqn.2026-12.io.kestrel:test";

/// A server on an ephemeral loopback port with `reactors` unpinned reactors and one
/// subsystem, `NQN`, of `namespaces` (NSID 1, 2, ...).
pub fn config(
    namespaces: Vec<Arc<dyn Target>>,
    reactors: usize,
    hosts: Vec<String>,
    any: bool,
    limits: Limits,
) -> ServerConfig {
    ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        discovery_listen: None,
        reactors: vec![None; reactors],
        subsystems: vec![SubsystemConfig {
            nqn: NQN.into(),
            namespaces,
            allowed_hosts: hosts,
            allow_any_host: any,
        }],
        limits,
    }
}

pub fn server_with(hosts: Vec<String>, any: bool, limits: Limits) -> Server {
    let target = kestrel::target_spec::open("emu:size=16M,core=none").expect("emulator");
    Server::start(config(vec![target], 2, hosts, any, limits)).expect("server starts")
}

pub fn server() -> Server {
    server_with(Vec::new(), true, Limits::default())
}

/// A host's admin queue (KATO 10 s) and I/O queue 1 (127 entries) on the server at `addr`,
/// without digests.
pub fn io_queue(addr: std::net::SocketAddr) -> (Host, Host) {
    let mut admin = Host::connect(addr, false, false);
    let cntlid = admin.admin_up(NQN, 10_000);
    let mut io = Host::connect(addr, false, false);
    let c = io.fabric_connect(1, 127, cntlid, 0, 0, NQN, HOSTNQN);
    assert!(c.status.is_success(), "io connect: {:?}", c.status);
    (admin, io)
}

pub fn sqe(opc: u8, nsid: u32) -> [u8; 64] {
    let mut s = [0u8; 64];
    s[0] = opc;
    s[4..8].copy_from_slice(&nsid.to_le_bytes());
    s
}

pub fn rw(opc: u8, slba: u64, nlb: u32) -> [u8; 64] {
    let mut s = sqe(opc, 1);
    s[40..48].copy_from_slice(&slba.to_le_bytes());
    s[48..52].copy_from_slice(&(nlb - 1).to_le_bytes());
    s
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed ^ (i >> 9) as u8)
        .collect()
}

pub fn identify(h: &mut Host, cns: u8, nsid: u32) -> Vec<u8> {
    let mut s = sqe(0x06, nsid);
    s[40] = cns;
    let (c, d) = h.cmd(s, &[], false, 4096);
    assert!(c.status.is_success(), "identify cns {cns}: {:?}", c.status);
    d
}

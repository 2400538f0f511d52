//! A conformance client for the target, written from the NVMe/TCP Transport and NVMe over
//! Fabrics specifications and independent of the target's code: its PDUs are built and
//! read byte by byte at the specifications' offsets ([`wire`]), with its own CRC-32C. A
//! second host implementation beside the loopback tests' one, it plays the stock
//! initiators' encodings and life cycles and checks what the specifications require:
//!
//! - encodings: SPDK's (a zero-length in-capsule SGL for data-less Set Features) and
//!   Linux's (Transport SGL of length 0), zero-length descriptors of every type, empty
//!   and non-NQN host NQNs where any host is allowed ([`encodings`]);
//! - shutdown: SPDK's (AERs given up by the host, CC.SHN, CSTS.SHST polled) and Linux's
//!   (AER kept), with every CID answered exactly once and no response for a CID the host
//!   has nothing outstanding for; Disconnect of an I/O queue ([`shutdown`]);
//! - keep-alive, reconnection, AERs at shutdown and reset ([`lifecycle`]);
//! - error paths: bad SGL descriptors (error status, the queue goes on) and bad PDUs
//!   (C2HTermReq with the specification's FES and FEI, then the connection ends)
//!   ([`errors`]);
//! - SQ flow control disabled at Connect: SQHD FFFFh and reads ended by C2HData SUCCESS
//!   without a response capsule, and the same queue with it kept ([`sqflow`]).

mod client;
mod fabric;
mod wire;

mod encodings;
mod errors;
mod lifecycle;
mod shutdown;
mod sqflow;

use kestrel_nvmf::{Limits, Server, ServerConfig, SubsystemConfig};

pub const NQN: &str = "nqn.2026-12.io.kestrel:conformance";
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// A server on an ephemeral loopback port, one subsystem `NQN` over a 16 MiB emulated
/// namespace: open to any host, or to `hosts` only.
pub fn server(any: bool, hosts: &[&str]) -> Server {
    server_on("emu:size=16M,core=none", any, hosts)
}

/// As [`server`], the namespace the target `spec` names.
pub fn server_on(spec: &str, any: bool, hosts: &[&str]) -> Server {
    let target = kestrel::target_spec::open(spec).expect("emulator");
    Server::start(ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        discovery_listen: None,
        reactors: vec![None; 2],
        subsystems: vec![SubsystemConfig {
            nqn: NQN.into(),
            namespaces: vec![target],
            allowed_hosts: hosts.iter().map(|h| h.to_string()).collect(),
            allow_any_host: any,
        }],
        limits: Limits::default(),
    })
    .expect("server starts")
}

/// Waits until `f` holds (at most 5 s).
pub fn eventually(what: &str, f: impl Fn() -> bool) {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !f() {
        assert!(std::time::Instant::now() < end, "{what}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

//! Peers that never connect, and hosts no allow-list names, against the room kept for
//! listed hosts: the memory of connections before Connect, the discovery controllers, the
//! connection table.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use kestrel::spec::Sct;
use kestrel_nvmf::budget::{Class, Limit};
use kestrel_nvmf::fabrics::{self, Sgl, DISCOVERY_NQN};
use kestrel_nvmf::pdu::{IcReq, Pdu};
use kestrel_nvmf::Limits;

use crate::common::{sqe, HOSTNQN, NQN};
use crate::host::Host;
use crate::support::*;

/// Before the budget a peer that had sent no NQN could have four 1 MiB R2T buffers (4 MiB)
/// until the Connect deadline. Now before Connect only a Connect is served, with its 1024
/// bytes: the others are refused with Command Sequence Error and nothing is kept.
#[test]
fn connections_before_connect_hold_little() {
    let _one = serial();
    let srv = budget_server(Limits::default());
    let addr = srv.local_addr();
    let mut ok = Allowed::up(addr);
    ok.verify();
    let rss0 = rss();
    let mut peers: Vec<Host> = (0..48).map(|_| Host::connect(addr, false, false)).collect();
    for h in &mut peers {
        for cid in 0..4u16 {
            let mut s = sqe(0x09, 0);
            s[40] = 0x0f;
            post(h, s, cid, Sgl::Transport { len: 1 << 20 }, &[]);
        }
    }
    let mut answers = Vec::new();
    for h in &mut peers {
        for _ in 0..4 {
            answers.push(h.recv().expect("an answer").0);
        }
    }
    ok.verify();
    let bound = 48 * srv.connection_bound(Class::PreConnect).unwrap();
    assert_within(
        &srv,
        rss0,
        bound,
        "48 connections with four 1 MiB R2Ts each before connect",
    );
    let refused = answers.iter().filter(|p| is_generic(p, 0x0c)).count();
    assert_eq!(refused, 4 * 48, "command sequence error: {:?}", answers[0]);
    srv.shutdown();
}

/// Before the budget hosts no allow-list names could take all 16 discovery controllers,
/// and the listed host got Controller Busy. Now they have at most
/// `max_unauth_controllers`; the rest is kept for listed hosts.
#[test]
fn strangers_cannot_take_every_discovery_controller() {
    let _one = serial();
    let srv = budget_server(Limits::default());
    let addr = srv.local_addr();
    let mut ok = Allowed::up(addr);
    let mut taken = Vec::new();
    for _ in 0..16 {
        let mut h = Host::connect(addr, false, false);
        let c = h.fabric_connect(0, 31, 0xffff, 0, 0, DISCOVERY_NQN, STRANGER);
        if c.status.is_success() {
            taken.push(h);
        } else {
            assert_eq!((c.status.sct, c.status.sc), (Sct::CommandSpecific, 0x81));
        }
    }
    let mut d = Host::connect(addr, false, false);
    let c = d.fabric_connect(0, 31, 0xffff, 0, 0, DISCOVERY_NQN, HOSTNQN);
    assert!(
        c.status.is_success(),
        "the listed host's discovery connect: {c:?}"
    );
    d.prop_set(fabrics::prop::CC, 1 | (6 << 16) | (4 << 20));
    let mut s = sqe(0x02, 0);
    s[40..44].copy_from_slice(&(0x70u32 | ((4096 / 4 - 1) << 16)).to_le_bytes());
    let (c, page) = d.cmd(s, &[], false, 4096);
    assert!(c.status.is_success());
    let (_, _, entries) = fabrics::parse_discovery_log(&page).unwrap();
    assert_eq!(entries[0].subnqn, NQN, "the listed host sees its subsystem");
    assert_eq!(
        taken.len(),
        Limits::default().max_unauth_controllers as usize
    );
    assert!(srv.limit_hits(Limit::UnauthControllers) > 0);
    ok.verify();
    srv.shutdown();
}

/// Before the budget a full connection table refused every new connection, the listed
/// host's too. Now connections that have not connected are at most `max_pending` (a new
/// one closes the oldest), so peers that never connect cannot fill the table.
#[test]
fn a_full_table_still_admits_a_listed_host() {
    let _one = serial();
    let limits = Limits {
        max_connections: 32,
        max_pending: 8,
        ..Limits::default()
    };
    let srv = budget_server(limits);
    let addr = srv.local_addr();
    let mut peers = Vec::new();
    for _ in 0..64 {
        // Each waits for its ICResp: accepted (or refused) before the next.
        let mut s = TcpStream::connect(addr).expect("tcp connect");
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        let mut b = [0u8; 128];
        Pdu::IcReq(IcReq {
            pfv: 0,
            hpda: 0,
            dgst: 0,
            maxr2t: 0,
        })
        .encode(&mut b, false, false, 0, 0, 0);
        let _ = s.write_all(&b);
        if s.read_exact(&mut b).is_ok() {
            peers.push(s);
        }
    }
    let mut ok = Allowed::up(addr);
    ok.verify();
    assert!(srv.limit_hits(Limit::PendingEvicted) > 0);
    assert!(srv.connections() <= 32, "{} connections", srv.connections());
    srv.shutdown();
}

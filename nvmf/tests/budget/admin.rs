//! A discovery admin queue (127 entries, keep-alive off) of a host no allow-list names:
//! Set Features asking 1 MiB through R2T whose data never comes, Get Log Page of 1 MiB
//! whose answers are never read.

use kestrel_nvmf::budget::{Class, Limit};
use kestrel_nvmf::fabrics::{self, Sgl};
use kestrel_nvmf::pdu::Pdu;
use kestrel_nvmf::Limits;

use crate::common::sqe;
use crate::support::*;

const MIB: u32 = 1 << 20;

/// Before the budget each Set Features got an R2T and a zero-filled 1 MiB buffer that was
/// held as long as the connection (256 MiB for two connections). Now a Set Features carries
/// no more than its feature's data (none for those served): refused with Data SGL Length
/// Invalid, nothing kept.
#[test]
fn never_answered_r2ts_hold_nothing() {
    let _one = serial();
    let srv = budget_server(Limits::default());
    let addr = srv.local_addr();
    let mut ok = Allowed::up(addr);
    ok.verify();
    let rss0 = rss();
    let mut strangers: Vec<_> = (0..2)
        .map(|i| stranger_discovery(addr, 127, i == 1))
        .collect();
    for d in &mut strangers {
        for cid in 0..128u16 {
            let mut s = sqe(0x09, 0);
            s[40] = 0x0f; // Keep Alive Timer
            post(d, s, cid, Sgl::Transport { len: MIB }, &[]);
        }
    }
    // Every command has been answered (with an R2T before the budget).
    let mut answers = Vec::new();
    for d in &mut strangers {
        for _ in 0..128 {
            answers.push(d.recv().expect("an answer").0);
        }
    }
    ok.verify();
    let bound = 2 * srv.connection_bound(Class::Unauth).unwrap();
    assert_within(
        &srv,
        rss0,
        bound,
        "128 unanswered 1 MiB R2Ts on two connections",
    );
    let refused = answers.iter().filter(|p| is_generic(p, 0x0f)).count();
    assert_eq!(
        refused, 256,
        "each refused with Data SGL Length Invalid: {:?}",
        answers[0]
    );
    assert!(srv.limit_hits(Limit::DataTooLong) >= 256);
    ok.verify();
    srv.shutdown();
}

/// Before the budget each log page was padded to the 1 MiB asked and held until sent:
/// 127 MiB for a host that does not read. Now a log is held at its real length (the rest
/// of the transfer is zeroes from static memory), and once the answers not read fill the
/// connection's budget the server stops reading its commands until they go out.
#[test]
fn unread_log_pages_hold_the_budget_only() {
    let _one = serial();
    let srv = budget_server(Limits::default());
    let addr = srv.local_addr();
    let mut ok = Allowed::up(addr);
    ok.verify();
    let rss0 = rss();
    let mut strangers: Vec<_> = (0..2)
        .map(|i| stranger_discovery(addr, 127, i == 1))
        .collect();
    let numd = MIB / 4 - 1;
    for d in &mut strangers {
        for cid in 0..127u16 {
            let mut s = sqe(0x02, 0);
            s[40..44].copy_from_slice(&(0x70 | ((numd & 0xffff) << 16)).to_le_bytes());
            s[44..48].copy_from_slice(&(numd >> 16).to_le_bytes());
            post(d, s, cid, Sgl::Transport { len: MIB }, &[]);
        }
    }
    let paused =
        wait_until(|| srv.limit_hits(Limit::Backpressure) >= 2 || rss() > rss0 + 2 * SLACK);
    ok.verify();
    let bound = 2 * srv.connection_bound(Class::Unauth).unwrap();
    assert_within(
        &srv,
        rss0,
        bound,
        "127 unread 1 MiB log pages on two connections",
    );
    assert!(paused, "reading paused on both connections");
    // Read at last: every answer is the discovery log, then zeroes to 1 MiB.
    for d in &mut strangers {
        for _ in 0..127 {
            read_log_answer(d);
        }
    }
    ok.verify();
    srv.shutdown();
}

/// One Get Log Page answer: 1 MiB of data (the discovery log, zeroes after it), success.
fn read_log_answer(d: &mut crate::host::Host) {
    let (p, _, data) = d.recv().expect("c2h data");
    assert!(matches!(p, Pdu::C2HData(_)), "{p:?}");
    assert_eq!(data.len(), MIB as usize);
    let (_, numrec, _) = fabrics::parse_discovery_log(&data).expect("a discovery log");
    let end = fabrics::DISC_RECORD_LEN * (1 + numrec as usize);
    assert!(data[end..].iter().all(|&b| b == 0), "zeroes past the log");
    let (p, _, _) = d.recv().expect("response");
    assert!(status_of(&p).is_some_and(|s| s.is_success()), "{p:?}");
}

//! What the server may hold, and the accounting that shows it holds no more.
//!
//! Every connection belongs to a class: before Connect (any peer), the discovery admin
//! queue of a host no allow-list names (unauthenticated), the admin queue of a listed host,
//! an I/O queue. Each class has a data budget (slot buffers of responses, in-capsule and
//! R2T data; an I/O queue's DMA sets, allocated once at Connect) that the connection
//! enforces itself: a command that could go beyond it is not read from the socket until
//! responses have gone out (backpressure), an R2T buffer beyond its share waits for room,
//! and a command carrying more data than it needs is refused (Data SGL Length Invalid)
//! without its data being kept. The connections report what they hold here (their
//! structures and buffers), per class, with the largest one connection of each class ever
//! held; limits hit are counted and logged at most every 10 s each. See
//! `docs/nvme-tcp.md`, "Memory and time budget".

use std::fmt;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

use kestrel::spec::admin_opc;

use crate::fabrics::{self, fctype, CONNECT_DATA_LEN, FABRICS_OPC};

/// Command slots of a connection before Connect.
pub const PRE_CONNECT_SLOTS: usize = 4;
/// The data a connection holds at most before Connect: one Connect's data per slot.
pub const PRE_CONNECT_DATA: usize = PRE_CONNECT_SLOTS * CONNECT_DATA_LEN;
/// A limit hit is logged at most this often (per limit), with the number left unlogged.
const LOG_EVERY_MS: u64 = 10_000;

/// The class of a connection.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Class {
    /// No successful Connect yet.
    PreConnect,
    /// A discovery admin queue of a host no allow-list names.
    Unauth,
    /// The admin queue of a listed host (or of any host with `--allow-any-host`).
    Admin,
    /// An I/O queue.
    Io,
}

impl Class {
    fn idx(self) -> usize {
        self as usize
    }
}

/// A limit a host ran into.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Limit {
    /// The oldest connection that had not connected was closed to make room for a new one.
    PendingEvicted,
    /// A connection was refused: the table is full of connected queues.
    ConnectionTable,
    /// A discovery Connect of a host no allow-list names was refused (Controller Busy):
    /// the rest of the discovery controllers are kept for listed hosts.
    UnauthControllers,
    /// A command described more data than it carries (refused, its data not kept).
    DataTooLong,
    /// Reading new commands paused: the responses the host has not read fill the
    /// connection's buffer.
    Backpressure,
    /// No successful Connect in time.
    ConnectTimeout,
    /// A PDU begun and not received whole in time.
    PduTimeout,
    /// An R2T's data not all received in time.
    R2tTimeout,
}

const N_LIMITS: usize = 8;

impl Limit {
    fn idx(self) -> usize {
        self as usize
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Limit::PendingEvicted => "too many connections before connect: the oldest closed",
            Limit::ConnectionTable => "connection table full",
            Limit::UnauthControllers => {
                "discovery controllers of hosts on no allow-list at their limit"
            }
            Limit::DataTooLong => "command data longer than the command carries",
            Limit::Backpressure => "responses not read by the host: reading paused",
            Limit::ConnectTimeout => "no connect within the time allowed",
            Limit::PduTimeout => "a pdu begun was not received whole in time",
            Limit::R2tTimeout => "the data of an r2t did not arrive in time",
        })
    }
}

/// What the connections of one class hold.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassReport {
    /// Connections of the class.
    pub connections: u32,
    /// Bytes they hold now (structures, data buffers, DMA sets).
    pub bytes: u64,
    /// The most one connection of the class has held (since the server started).
    pub peak_per_connection: u64,
}

/// What the server holds for its connections, per class.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemoryReport {
    /// Before Connect.
    pub pre_connect: ClassReport,
    /// Discovery admin queues of hosts on no allow-list.
    pub unauth: ClassReport,
    /// Admin queues of listed hosts.
    pub admin: ClassReport,
    /// I/O queues.
    pub io: ClassReport,
}

impl MemoryReport {
    /// Bytes held by every connection.
    pub fn total_bytes(&self) -> u64 {
        self.pre_connect.bytes + self.unauth.bytes + self.admin.bytes + self.io.bytes
    }
}

/// The server's accounting: bytes and connections per class, limits hit.
#[derive(Debug, Default)]
pub struct Accounting {
    bytes: [AtomicU64; 4],
    conns: [AtomicU32; 4],
    peak: [AtomicU64; 4],
    hits: [AtomicU64; N_LIMITS],
    /// When each limit was last logged (ms since start, plus one; 0: never).
    logged: [AtomicU64; N_LIMITS],
    unlogged: [AtomicU64; N_LIMITS],
}

impl Accounting {
    /// A connection's entry changes from `from` to `to` (class, bytes; `None`: none),
    /// having held at most `peak` bytes.
    pub fn moved(&self, from: Option<(Class, u64)>, to: Option<(Class, u64)>, peak: u64) {
        if let Some((c, b)) = from {
            self.bytes[c.idx()].fetch_sub(b, Ordering::Relaxed);
            self.conns[c.idx()].fetch_sub(1, Ordering::Relaxed);
        }
        if let Some((c, b)) = to {
            self.bytes[c.idx()].fetch_add(b, Ordering::Relaxed);
            self.conns[c.idx()].fetch_add(1, Ordering::Relaxed);
            self.peak[c.idx()].fetch_max(peak.max(b), Ordering::Relaxed);
        }
    }

    /// Counts a limit hit at `now_ms` and logs it (`detail`: the peer and the numbers),
    /// unless that limit was logged less than 10 s ago.
    pub fn hit(&self, limit: Limit, now_ms: u64, detail: fmt::Arguments<'_>) {
        let i = limit.idx();
        self.hits[i].fetch_add(1, Ordering::Relaxed);
        let last = self.logged[i].load(Ordering::Relaxed);
        let due = last == 0 || now_ms + 1 >= last + LOG_EVERY_MS;
        if due
            && self.logged[i]
                .compare_exchange(last, now_ms + 1, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            let skipped = self.unlogged[i].swap(0, Ordering::Relaxed);
            tracing::warn!(
                "limit: {limit} ({detail}){}",
                if skipped > 0 {
                    format!("; {skipped} more since the last such line")
                } else {
                    String::new()
                }
            );
        } else {
            self.unlogged[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Times `limit` was hit.
    pub fn hits(&self, limit: Limit) -> u64 {
        self.hits[limit.idx()].load(Ordering::Relaxed)
    }

    /// What the connections hold now.
    pub fn report(&self) -> MemoryReport {
        let class = |c: Class| ClassReport {
            connections: self.conns[c.idx()].load(Ordering::Relaxed),
            bytes: self.bytes[c.idx()].load(Ordering::Relaxed),
            peak_per_connection: self.peak[c.idx()].load(Ordering::Relaxed),
        };
        MemoryReport {
            pre_connect: class(Class::PreConnect),
            unauth: class(Class::Unauth),
            admin: class(Class::Admin),
            io: class(Class::Io),
        }
    }
}

/// Host-to-controller data an admin (or pre-Connect) command may carry: a Connect's 1024
/// bytes, a Set Features the data of its feature; nothing for every other command. More
/// is refused with Data SGL Length Invalid (SGLS bit 18, longer SGLs, is not offered).
pub fn h2c_need(sqe: &[u8; 64]) -> u32 {
    match sqe[0] {
        FABRICS_OPC if fabrics::fctype_of(sqe) == fctype::CONNECT => CONNECT_DATA_LEN as u32,
        admin_opc::SET_FEATURES => feature_data_len(sqe[40]),
        _ => 0,
    }
}

/// The data of a Set Features of feature `fid`: none of the features served takes any
/// (Number of Queues, Keep Alive Timer, Asynchronous Event Configuration, Arbitration,
/// Power Management are all in command dword 11). A feature served with data (Host
/// Behavior Support: 512 bytes, Timestamp: 8) names its size here.
pub fn feature_data_len(fid: u8) -> u32 {
    let _ = fid;
    0
}

/// Whether a new admin controller of `sub` for `hostnqn` is one of an unauthenticated
/// host (a discovery controller of a host no allow-list names): `Ok(true)` if so and
/// there is room for it, refused with Controller Busy when `live` already has
/// `max_unauth_controllers` of them, so that they cannot take the discovery controllers
/// listed hosts need.
pub fn unauth_controller_refusal(
    shared: &crate::ctrl::Shared,
    sub: &crate::ctrl::Subsystem,
    live: &[std::sync::Arc<crate::ctrl::Controller>],
    hostnqn: &str,
) -> Result<bool, crate::ctrl::ConnectRefusal> {
    if !sub.is_discovery() || shared.host_listed(hostnqn) {
        return Ok(false);
    }
    let max = shared.limits.max_unauth_controllers as usize;
    let n = live.iter().filter(|c| c.unauth).count();
    if n < max {
        return Ok(true);
    }
    shared.acct.hit(
        Limit::UnauthControllers,
        shared.now_ms(),
        format_args!("host {hostnqn:?}: {n} of {max}"),
    );
    Err(crate::ctrl::ConnectRefusal {
        status: kestrel::spec::Status::new(
            kestrel::spec::Sct::CommandSpecific,
            fabrics::connect_sc::CONTROLLER_BUSY,
        ),
        dw0: 0,
        why: format!(
            "host {hostnqn} is on no allow-list and {n} discovery controllers of such hosts \
             are live (the limit; the others are kept for listed hosts)"
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hits_are_counted_and_logged_at_most_every_10_s() {
        let a = Accounting::default();
        let unlogged = |a: &Accounting| a.unlogged[Limit::PduTimeout.idx()].load(Ordering::Relaxed);
        a.hit(Limit::PduTimeout, 5, format_args!("first"));
        assert_eq!(unlogged(&a), 0, "the first is logged");
        for t in [6, 5000, 10_003] {
            a.hit(Limit::PduTimeout, t, format_args!("again"));
        }
        assert_eq!(unlogged(&a), 3, "within 10 s of the first: not logged");
        a.hit(Limit::PduTimeout, 10_005, format_args!("10 s later"));
        assert_eq!(
            unlogged(&a),
            0,
            "logged, with the count of those that were not"
        );
        a.hit(Limit::R2tTimeout, 10_006, format_args!("another limit"));
        assert_eq!(
            a.unlogged[Limit::R2tTimeout.idx()].load(Ordering::Relaxed),
            0
        );
        assert_eq!(a.hits(Limit::PduTimeout), 5);
        assert_eq!(a.hits(Limit::R2tTimeout), 1);
    }

    #[test]
    fn connections_move_between_classes() {
        let a = Accounting::default();
        a.moved(None, Some((Class::PreConnect, 2000)), 2500);
        a.moved(
            Some((Class::PreConnect, 2000)),
            Some((Class::Unauth, 50_000)),
            60_000,
        );
        let r = a.report();
        assert_eq!((r.pre_connect.connections, r.pre_connect.bytes), (0, 0));
        assert_eq!(r.pre_connect.peak_per_connection, 2500);
        assert_eq!((r.unauth.connections, r.unauth.bytes), (1, 50_000));
        assert_eq!(r.unauth.peak_per_connection, 60_000);
        a.moved(Some((Class::Unauth, 50_000)), None, 0);
        assert_eq!(a.report().total_bytes(), 0);
    }
}

//! NVMe over TCP, the host side: a remote NVM subsystem's namespaces as [`Target`]s, so
//! every Kestrel surface that takes a target reaches an SSD on another machine. The wire
//! formats are the driver's ([`crate::spec::tcp`], [`crate::spec::fabrics`]), shared with
//! the NVMe/TCP target of `kestrel serve`.
//!
//! - [`ctrl`]: the controller: the admin connection, bring-up over properties (CAP, VS,
//!   CC.EN, CSTS.RDY), Identify, Number of Queues, Keep Alive at KATO/2 from a thread of its
//!   own, CC.SHN shutdown at drop; [`discover`]: a discovery controller's log.
//! - [`queue`]: an I/O queue: one TCP connection, owned by one poller, polled without
//!   blocking, with command slots indexed by CID allocated when it connects.
//! - [`link`]: one connection driven a command at a time (the admin queue, and every
//!   queue while it connects); [`sock`]: the socket calls on data buffers (the `unsafe`).
//! - [`hostnqn`]: the host NQN and ID a machine presents by default.
//!
//! Lives in `target/`: it imports `spec`, `parse`, `hw::dma` (the pool requests' buffers
//! come from) and `io`, never a hardware transport.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use crate::hw::dma::DmaPool;
use crate::spec::Status;

use super::{QueueOptions, Target, TargetError, TargetInfo, TargetQueue};

pub mod ctrl;
pub mod discover;
pub mod hostnqn;
pub mod link;
pub mod queue;
pub mod sock;

pub use ctrl::{TcpController, TcpOpenOptions};
pub use discover::{discover, DiscoveryLog};
pub use hostnqn::{default_identity, HostIdentity};

/// Where a controller listens, with the limits of reaching it.
#[derive(Clone, Debug)]
pub struct Endpoint {
    /// Host name or address.
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// One TCP connection attempt's limit.
    pub connect_timeout: Duration,
    /// An admin command's (and a queue's Connect's) limit.
    pub admin_timeout: Duration,
}

impl fmt::Display for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.contains(':') {
            write!(f, "[{}]:{}", self.host, self.port)
        } else {
            write!(f, "{}:{}", self.host, self.port)
        }
    }
}

/// Errors of the NVMe/TCP host. Each names the controller's address.
#[derive(Debug, thiserror::Error)]
pub enum TcpError {
    /// The host name does not resolve.
    #[error("nvme/tcp {addr}: cannot resolve the address: {source}")]
    Resolve {
        /// `host:port`.
        addr: String,
        /// The error.
        source: std::io::Error,
    },
    /// No TCP connection could be made.
    #[error("nvme/tcp {addr}: cannot connect: {source} (is a target listening there? `kestrel serve` listens on 127.0.0.1:4420 by default)")]
    Connect {
        /// `host:port`.
        addr: String,
        /// The error.
        source: std::io::Error,
    },
    /// A socket call failed.
    #[error("nvme/tcp {addr}: {what}: {source}")]
    Io {
        /// `host:port`.
        addr: String,
        /// What was being done.
        what: &'static str,
        /// The error.
        source: std::io::Error,
    },
    /// The controller closed the connection.
    #[error("nvme/tcp {addr}: the controller closed the connection")]
    Closed {
        /// `host:port`.
        addr: String,
    },
    /// Nothing came back in time.
    #[error("nvme/tcp {addr}: {what}: no answer within {after:?}")]
    Timeout {
        /// `host:port`.
        addr: String,
        /// What was awaited.
        what: &'static str,
        /// The limit.
        after: Duration,
    },
    /// A PDU broke the transport's rules.
    #[error("nvme/tcp {addr}: a malformed pdu from the controller: {source}")]
    Pdu {
        /// `host:port`.
        addr: String,
        /// What is wrong.
        source: crate::spec::tcp::PduError,
    },
    /// The controller did something the protocol does not allow.
    #[error("nvme/tcp {addr}: protocol error: {why}")]
    Protocol {
        /// `host:port`.
        addr: String,
        /// What happened.
        why: String,
    },
    /// The controller ended the connection with a C2HTermReq.
    #[error("nvme/tcp {addr}: the controller terminated the connection (C2HTermReq, fes {fes:#x}, fei {fei:#x})")]
    Terminated {
        /// `host:port`.
        addr: String,
        /// Fatal Error Status.
        fes: u16,
        /// Fatal Error Information.
        fei: u32,
    },
    /// Fabrics Connect was refused.
    #[error("nvme/tcp {addr}: connect of queue {qid} to {subnqn} as {hostnqn} refused: {status}{}", connect_hint(*status, *dw0))]
    ConnectRefused {
        /// `host:port`.
        addr: String,
        /// The queue.
        qid: u16,
        /// The subsystem.
        subnqn: String,
        /// This host's NQN.
        hostnqn: String,
        /// The status.
        status: Status,
        /// Dword 0 of the response (the offending parameter for Invalid Parameters).
        dw0: u32,
    },
    /// An admin command failed.
    #[error("nvme/tcp {addr}: {what} failed: {status}")]
    Status {
        /// `host:port`.
        addr: String,
        /// The command.
        what: &'static str,
        /// Its status.
        status: Status,
    },
    /// The controller does not offer what is needed.
    #[error("nvme/tcp {addr}: {why}")]
    Unsupported {
        /// `host:port`.
        addr: String,
        /// What is missing.
        why: String,
    },
    /// Every I/O queue the controller granted is in use.
    #[error("nvme/tcp {addr}: all {granted} i/o queues the controller granted are in use (ask for more with queues=N; the controller may grant fewer)")]
    NoQueue {
        /// `host:port`.
        addr: String,
        /// Queues granted.
        granted: u16,
    },
}

impl TcpError {
    /// The target refused an I/O queue's Connect for its QID (Connect Invalid Parameters
    /// at the command's QID offset): the ID is in use there, or above what it granted.
    pub(crate) fn qid_in_use(&self) -> bool {
        use crate::spec::fabrics::{connect_off, connect_sc};
        match self {
            TcpError::ConnectRefused {
                qid, status, dw0, ..
            } => {
                *qid != 0
                    && status.sct.code() == 1
                    && status.sc == connect_sc::INVALID_PARAMETERS
                    && dw0 & (1 << 16) == 0
                    && (dw0 & 0xffff) as usize == connect_off::QID
            }
            _ => false,
        }
    }
}

fn connect_hint(status: Status, dw0: u32) -> String {
    use crate::spec::fabrics::connect_sc as sc;
    if status.sct.code() != 1 {
        return String::new();
    }
    match status.sc {
        sc::INVALID_HOST => {
            "; the target does not allow this host: add its nqn to the target's allowed hosts (kestrel serve --allow-host), or give hostnqn=".into()
        }
        sc::INVALID_PARAMETERS => format!(
            "; invalid parameter at byte {} of the {} (is the subsystem nqn right? `kestrel list --target tcp:HOST` lists them)",
            dw0 & 0xffff,
            if dw0 & (1 << 16) != 0 { "connect data" } else { "command" }
        ),
        sc::CONTROLLER_BUSY => "; the controller is busy (too many controllers or queues)".into(),
        _ => String::new(),
    }
}

/// One namespace of a remote controller as a [`Target`]: each queue is an NVMe/TCP I/O
/// queue (a connection of its own).
pub struct TcpNamespace {
    ctrl: TcpController,
    info: TargetInfo,
}

impl TcpNamespace {
    /// The controller.
    pub fn controller(&self) -> &TcpController {
        &self.ctrl
    }
}

impl Target for TcpNamespace {
    fn info(&self) -> &TargetInfo {
        &self.info
    }
    fn dma_pool(&self) -> &DmaPool {
        self.ctrl.dma_pool()
    }
    fn create_queue(&self, opts: &QueueOptions) -> Result<Box<dyn TargetQueue>, TargetError> {
        Ok(Box::new(queue::TcpQueue::connect(
            &self.ctrl, &self.info, opts,
        )?))
    }
}

impl TcpController {
    /// The namespaces the driver does I/O to (formats without metadata), as targets; the
    /// one selected when `nsid` is given.
    pub fn targets(&self, nsid: Option<u32>) -> Result<Vec<Arc<dyn Target>>, TcpError> {
        let mut v: Vec<Arc<dyn Target>> = Vec::new();
        for ns in self.namespaces() {
            if nsid.is_some_and(|n| n != ns.info.nsid) {
                continue;
            }
            if let Some(why) = &ns.unsupported {
                if nsid.is_some() {
                    return Err(TcpError::Unsupported {
                        addr: self.endpoint().to_string(),
                        why: format!("nsid {}: {why}", ns.info.nsid),
                    });
                }
                continue;
            }
            v.push(Arc::new(TcpNamespace {
                ctrl: self.clone(),
                info: ns.info.clone(),
            }));
        }
        if v.is_empty() {
            return Err(TcpError::Unsupported {
                addr: self.endpoint().to_string(),
                why: match nsid {
                    Some(n) => format!("nsid {n} is not an active namespace of {}", self.subnqn()),
                    None => format!("{} has no namespace kestrel does i/o to", self.subnqn()),
                },
            });
        }
        Ok(v)
    }
}

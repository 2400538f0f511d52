//! An NVMe over TCP target for Kestrel targets.
//!
//! Stock initiators (the Linux kernel's `nvme-tcp`) connect to it unchanged: it speaks the
//! NVMe/TCP transport (NVM Express TCP Transport Specification 1.0) and the fabrics
//! commands of NVMe over Fabrics, and exports each Kestrel target (an NVMe namespace
//! through VFIO, a file, the emulator) as a namespace of an NVM subsystem (one or more
//! namespaces each), with a discovery subsystem beside them. See `docs/nvme-tcp.md`.
//!
//! - [`pdu`]: PDU encoding and decoding, header and data digests.
//! - [`fabrics`]: Connect, properties, SGLs, NQNs, the discovery log.
//! - [`config`]: what a server exports and its limits.
//! - [`budget`]: what connections may hold (per class), the server's accounting of it and
//!   the limits hit.
//! - [`ctrl`]: subsystems and controllers (admin commands, properties, keep-alive).
//! - [`conn`]: one connection (queue): PDUs, slots, R2T, I/O to the target.
//! - [`reactor`]: pinned per-core threads owning connections and target queues.
//! - [`cli`]: `kestrel serve`.
#![deny(missing_docs)]
// `SubmitError::Busy` (the library's) carries the refused request by value.
#![allow(clippy::result_large_err)]

pub mod buddy;
pub mod budget;
pub mod cli;
pub mod config;
pub mod conn;
pub mod ctrl;
/// The NVMe over Fabrics definitions, shared with the driver's NVMe/TCP host.
pub use kestrel::spec::fabrics;
/// The NVMe/TCP PDUs, shared with the driver's NVMe/TCP host.
pub use kestrel::spec::tcp as pdu;
pub mod reactor;
pub mod sys;

use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

pub use config::{subsystem_nqn, ConfigError, Limits, PollMode, ServerConfig, SubsystemConfig};

/// Errors of starting or running a server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The configuration is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A listener could not be bound.
    #[error("cannot listen on {addr}: {source} (is another target using the port? pick another with --listen)")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The error.
        source: std::io::Error,
    },
    /// An operating system call failed.
    #[error("{context}: {source}")]
    Os {
        /// What was being done.
        context: String,
        /// The error.
        source: std::io::Error,
    },
}

/// A running NVMe/TCP target. Dropping it stops it.
pub struct Server {
    shared: Arc<ctrl::Shared>,
    threads: Vec<JoinHandle<()>>,
    mailboxes: Vec<Arc<reactor::Mailbox>>,
    addr: SocketAddr,
    discovery: Option<SocketAddr>,
}

impl Server {
    /// Binds the listeners and starts the reactors.
    pub fn start(cfg: ServerConfig) -> Result<Server, ServeError> {
        cfg.validate()?;
        let shared = ctrl::Shared::new(&cfg);
        let bind = |a: SocketAddr| {
            TcpListener::bind(a).map_err(|source| ServeError::Bind { addr: a, source })
        };
        let main = bind(cfg.listen)?;
        let addr = main.local_addr().map_err(|source| ServeError::Os {
            context: "getsockname of the listener".into(),
            source,
        })?;
        let mut listeners = vec![main];
        let mut discovery = None;
        if let Some(d) = cfg.discovery_listen {
            let l = bind(d)?;
            discovery = l.local_addr().ok();
            listeners.push(l);
        }
        *ctrl::lock(&shared.listeners, "the listener list") =
            std::iter::once(addr).chain(discovery).collect();
        let mailboxes: Vec<Arc<reactor::Mailbox>> = cfg
            .reactors
            .iter()
            .map(|_| {
                Ok(Arc::new(reactor::Mailbox {
                    inbox: Mutex::new(Vec::new()),
                    wake: sys::EventFd::new().map_err(|source| ServeError::Os {
                        context: "eventfd".into(),
                        source,
                    })?,
                }))
            })
            .collect::<Result<_, ServeError>>()?;
        let mut threads = Vec::new();
        let mut listeners = Some(listeners);
        for (i, core) in cfg.reactors.iter().enumerate() {
            let r = reactor::Reactor::new(
                i,
                Arc::clone(&shared),
                Arc::clone(&mailboxes[i]),
                mailboxes.clone(),
                if i == 0 {
                    listeners.take().unwrap_or_default()
                } else {
                    Vec::new()
                },
            )
            .map_err(|source| ServeError::Os {
                context: "creating a reactor".into(),
                source,
            })?;
            let core = *core;
            let t = std::thread::Builder::new()
                .name(format!("nvmf-reactor-{i}"))
                .spawn(move || {
                    if let Some(c) = core {
                        if !core_affinity::set_for_current(core_affinity::CoreId { id: c }) {
                            tracing::warn!("cannot pin reactor {i} to core {c}");
                        }
                    }
                    r.run()
                })
                .map_err(|source| ServeError::Os {
                    context: "spawning a reactor thread".into(),
                    source,
                })?;
            threads.push(t);
        }
        tracing::info!(%addr, ?discovery, reactors = cfg.reactors.len(), "nvme/tcp target listening");
        Ok(Server {
            shared,
            threads,
            mailboxes,
            addr,
            discovery,
        })
    }

    /// The address of the main listener (the port is known after binding port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// The address of the discovery-only listener, if any.
    pub fn discovery_addr(&self) -> Option<SocketAddr> {
        self.discovery
    }

    /// The NQNs served, the discovery NQN last.
    pub fn nqns(&self) -> Vec<String> {
        self.shared
            .subsystems
            .iter()
            .map(|s| s.nqn.clone())
            .collect()
    }

    /// Live controllers of subsystem `nqn`.
    pub fn controllers(&self, nqn: &str) -> usize {
        self.shared
            .subsystem(nqn)
            .map(|s| s.controllers())
            .unwrap_or(0)
    }

    /// Connections open (closing ones included until their requests finish).
    pub fn connections(&self) -> u32 {
        self.shared.connections.load(Ordering::Acquire)
    }

    /// What the connections hold now, per class, and the most one connection of each
    /// class has held (the server's own accounting, `budget`).
    pub fn memory(&self) -> budget::MemoryReport {
        self.shared.acct.report()
    }

    /// The most one connection of `class` may hold (`None`: an I/O queue, whose DMA sets
    /// are allocated once at Connect).
    pub fn connection_bound(&self, class: budget::Class) -> Option<u64> {
        conn::connection_bound(class, &self.shared.limits, self.shared.max_admin_data)
    }

    /// Times a limit of the budget was hit.
    pub fn limit_hits(&self, limit: budget::Limit) -> u64 {
        self.shared.acct.hits(limit)
    }

    /// Per reactor, the nanoseconds its passes spent busy and idle so far
    /// ([`reactor::PassTime`]; both 0 where the loop's clock is not the TSC).
    pub fn pass_time(&self) -> Vec<(u64, u64)> {
        self.shared
            .pass_time
            .iter()
            .map(|t| {
                (
                    t.busy_ns.load(Ordering::Relaxed),
                    t.idle_ns.load(Ordering::Relaxed),
                )
            })
            .collect()
    }

    /// Connections dropped because a panic in their handling was caught.
    pub fn connection_panics(&self) -> u64 {
        self.shared.panics.load(Ordering::Relaxed)
    }

    /// Stops: connections close, requests at the targets finish, threads end.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        for m in &self.mailboxes {
            m.wake.signal();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

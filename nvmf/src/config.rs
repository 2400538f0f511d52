//! What a server exports and the limits it keeps.

use std::net::SocketAddr;
use std::sync::Arc;

use kestrel::Target;

use crate::fabrics::{valid_nqn, DISCOVERY_NQN};

/// The NQN prefix of subsystems named on the command line: `<prefix>:<name>`.
pub const NQN_PREFIX: &str = "nqn.2026-12.io.kestrel";

/// The NQN of the subsystem called `name`.
pub fn subsystem_nqn(name: &str) -> String {
    format!("{NQN_PREFIX}:{name}")
}

/// Limits on what hosts may ask for. Every buffer is sized from these when a queue
/// connects; nothing grows after that.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// I/O queues per controller (Set Features Number of Queues is clamped to it).
    pub max_io_queues: u16,
    /// Entries of an I/O or admin queue (CAP.MQES + 1; Connect SQSIZE + 1 above it is
    /// refused).
    pub max_queue_size: u16,
    /// In-capsule data of I/O commands (IOCCSZ is 64 bytes more); a multiple of 16.
    pub in_capsule_data: u32,
    /// In-capsule data buffers per I/O queue (a capsule waits in the socket when all hold
    /// data still at the target).
    pub in_capsule_buffers: u32,
    /// The largest transfer of one command (MDTS), a power of two from 4 KiB.
    pub max_io_size: u32,
    /// Data buffer per I/O queue for reads and R2T writes (a command waits for room).
    pub queue_buffer: u32,
    /// MAXH2CDATA: the most data one H2CData PDU may carry.
    pub max_h2c_data: u32,
    /// Controllers alive at once per subsystem.
    pub max_controllers: u16,
    /// Connections alive at once on the whole server.
    pub max_connections: u32,
    /// Entries of each reactor's queue on each target.
    pub target_queue_depth: u32,
    /// Data buffers (responses, in-capsule and R2T data) of one admin queue of a host an
    /// allow-list names; a command that would go beyond it waits in the socket.
    pub admin_buffer: u32,
    /// The same for a discovery admin queue of a host no allow-list names.
    pub unauth_buffer: u32,
    /// Connections that have not connected yet (ICReq, Connect), server wide; a new one
    /// beyond it closes the oldest of them.
    pub max_pending: u32,
    /// Discovery controllers of hosts no allow-list names, at once; the rest of
    /// `max_controllers` is kept for listed hosts.
    pub max_unauth_controllers: u16,
    /// Time from accept to a successful Connect, ms.
    pub connect_timeout_ms: u32,
    /// Time to receive a PDU whole once its first byte came, ms, whatever KATO says.
    pub pdu_timeout_ms: u32,
    /// Time for all the data an R2T asked for to arrive, ms.
    pub r2t_timeout_ms: u32,
    /// How a reactor waits when its connections are quiet.
    pub poll: PollMode,
}

/// How a reactor waits when its connections are quiet (`kestrel serve --poll`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PollMode {
    /// Polls without a pause while requests are in flight or connections readable; after
    /// a run of passes that found nothing it waits on its sockets for up to 1 ms between
    /// polls, and with nothing in flight it sleeps until a socket has something. Gives a
    /// core shared with other work (a host's initiator, a device model, a VM's vCPU) back
    /// when the load pauses, at the price of a wake-up (a few microseconds) on the first
    /// command after a pause.
    #[default]
    Hybrid,
    /// Never sleeps: every pass looks at the sockets without waiting (`epoll_wait` with a
    /// zero timeout) and polls the targets, like SPDK's reactors on their dedicated
    /// cores. No wake-up latency and no context switches, but the core is 100 % busy
    /// even when no host sends anything: for a core given to the target alone.
    Busy,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_io_queues: 16,
            max_queue_size: 128,
            in_capsule_data: 8192,
            in_capsule_buffers: 32,
            max_io_size: 128 << 10,
            queue_buffer: 2 << 20,
            max_h2c_data: 128 << 10,
            max_controllers: 16,
            max_connections: 256,
            target_queue_depth: 256,
            admin_buffer: 128 << 10,
            unauth_buffer: 32 << 10,
            max_pending: 64,
            max_unauth_controllers: 4,
            connect_timeout_ms: 10_000,
            pdu_timeout_ms: 10_000,
            r2t_timeout_ms: 30_000,
            poll: PollMode::Hybrid,
        }
    }
}

/// The most namespaces one subsystem exports.
pub const MAX_NAMESPACES: usize = 64;

/// One NVM subsystem: its targets are its namespaces, in order (NSID 1, 2, ...).
#[derive(Clone)]
pub struct SubsystemConfig {
    /// The subsystem NQN.
    pub nqn: String,
    /// The targets behind namespaces 1, 2, ... (at least one).
    pub namespaces: Vec<Arc<dyn Target>>,
    /// Host NQNs allowed to connect.
    pub allowed_hosts: Vec<String>,
    /// Any host may connect (only with loopback listeners).
    pub allow_any_host: bool,
}

impl std::fmt::Debug for SubsystemConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SubsystemConfig")
            .field("nqn", &self.nqn)
            .field(
                "namespaces",
                &self
                    .namespaces
                    .iter()
                    .map(|t| t.info().name.clone())
                    .collect::<Vec<_>>(),
            )
            .field("allowed_hosts", &self.allowed_hosts)
            .field("allow_any_host", &self.allow_any_host)
            .finish()
    }
}

/// A server: where it listens, what it exports, on which cores.
#[derive(Clone, Debug)]
pub struct ServerConfig {
    /// The NVMe/TCP listener (subsystems and discovery).
    pub listen: SocketAddr,
    /// A second listener for discovery only (8009 by convention), if any.
    pub discovery_listen: Option<SocketAddr>,
    /// One reactor thread per entry; `Some(core)` pins it.
    pub reactors: Vec<Option<usize>>,
    /// The exported subsystems.
    pub subsystems: Vec<SubsystemConfig>,
    /// Limits.
    pub limits: Limits,
}

/// A configuration that cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A field is out of range or inconsistent.
    #[error("invalid server configuration: {0}")]
    Invalid(String),
}

impl ServerConfig {
    /// Checks the configuration: NQNs valid and distinct, open access only on loopback,
    /// limits in range.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |s: String| Err(ConfigError::Invalid(s));
        if self.reactors.is_empty() {
            return bad("at least one reactor (core) is needed".into());
        }
        if self.subsystems.is_empty() {
            return bad("nothing to export: give at least one target".into());
        }
        let mut seen = std::collections::HashSet::new();
        for s in &self.subsystems {
            self.validate_subsystem(s, &mut seen)?;
        }
        self.limits.validate()
    }

    /// Checks one subsystem: its NQN (valid, not seen before), namespaces and hosts.
    fn validate_subsystem(
        &self,
        s: &SubsystemConfig,
        seen: &mut std::collections::HashSet<String>,
    ) -> Result<(), ConfigError> {
        let bad = |s: String| Err(ConfigError::Invalid(s));
        if !valid_nqn(&s.nqn) || s.nqn == DISCOVERY_NQN {
            return bad(format!(
                "{:?} is not a usable subsystem nqn (nqn.<date>.<domain>:<name>, printable, at most 223 bytes, not the discovery nqn)",
                s.nqn
            ));
        }
        if s.namespaces.is_empty() || s.namespaces.len() > MAX_NAMESPACES {
            return bad(format!(
                "subsystem {} has {} namespaces: give 1 to {MAX_NAMESPACES} targets",
                s.nqn,
                s.namespaces.len()
            ));
        }
        if !seen.insert(s.nqn.clone()) {
            return bad(format!("subsystem nqn {} is given twice", s.nqn));
        }
        for (k, t) in s.namespaces.iter().enumerate() {
            exportable(t.info()).map_err(|why| {
                ConfigError::Invalid(format!(
                    "nsid {} of {} ({}) cannot be exported: {why}",
                    k + 1,
                    s.nqn,
                    t.info().name
                ))
            })?;
        }
        for h in &s.allowed_hosts {
            if !valid_nqn(h) {
                return bad(format!("allowed host {h:?} is not an nqn"));
            }
        }
        if s.allow_any_host {
            let listeners = std::iter::once(self.listen).chain(self.discovery_listen);
            for l in listeners {
                if !l.ip().is_loopback() {
                    return bad(format!(
                        "open access (any host) to {} is allowed only on loopback, and {} is not: list the hosts instead",
                        s.nqn, l
                    ));
                }
            }
        }
        if s.allowed_hosts.is_empty() && !s.allow_any_host {
            tracing::warn!(
                nqn = %s.nqn,
                "no host is allowed to connect to this subsystem (give allowed hosts)"
            );
        }
        Ok(())
    }
}

/// Whether a target can be a namespace of this server, which exports every namespace as
/// one of the NVM Command Set without metadata (LBA format 0: the target's block size,
/// MS 0) and sends its reads and writes to the target without metadata. A zoned namespace
/// would look conventional to the host, whose writes away from the write pointers would
/// fail; a format whose metadata every read and write must carry would fail every I/O.
/// Protection information that is exactly the metadata (MS 8) is fine: the controller
/// inserts and strips it.
pub fn exportable(info: &kestrel::target::TargetInfo) -> Result<(), String> {
    if info.zones.is_some() {
        return Err(
            "it is a zoned namespace, and kestrel serve exports namespaces of the \
             NVM Command Set only (zoned namespaces over fabrics are not implemented): \
             export a conventional namespace (a pci or emu target ending in /ns=N selects one)"
                .into(),
        );
    }
    if let Some(m) = info.metadata.filter(|m| m.required()) {
        return Err(format!(
            "its format has {} bytes of metadata per block ({}) that every read and write \
             must carry, and kestrel serve exports namespaces without metadata: export a \
             namespace formatted without metadata (or with exactly the 8 bytes of protection \
             information, which the controller inserts and strips)",
            m.ms,
            if m.extended {
                "extended lba"
            } else {
                "separate buffer"
            }
        ));
    }
    Ok(())
}

impl Limits {
    /// Checks that the limits are in range.
    fn validate(&self) -> Result<(), ConfigError> {
        let bad = |s: String| Err(ConfigError::Invalid(s));
        let l = self;
        if !(2..=4096).contains(&l.max_queue_size) {
            return bad(format!(
                "queue size {} is outside 2..=4096",
                l.max_queue_size
            ));
        }
        if !(1..=1024).contains(&l.max_io_queues) {
            return bad(format!(
                "I/O queues per controller {} is outside 1..=1024",
                l.max_io_queues
            ));
        }
        if !l.max_io_size.is_power_of_two() || !(4096..=(1 << 20)).contains(&l.max_io_size) {
            return bad(format!(
                "maximum I/O size {} is not a power of two from 4 KiB to 1 MiB",
                l.max_io_size
            ));
        }
        if l.in_capsule_data % 16 != 0 || l.in_capsule_data > (1 << 20) {
            return bad(format!(
                "in-capsule data size {} is not a multiple of 16 up to 1 MiB",
                l.in_capsule_data
            ));
        }
        if l.in_capsule_data > 0 && l.in_capsule_buffers == 0 {
            return bad("in-capsule data needs at least one in-capsule buffer".into());
        }
        if l.queue_buffer < l.max_io_size || l.queue_buffer > (64 << 20) {
            return bad(format!(
                "queue buffer {} must hold one maximum I/O ({}) and be at most 64 MiB",
                l.queue_buffer, l.max_io_size
            ));
        }
        if l.max_h2c_data < 4096 || l.max_h2c_data % 4 != 0 {
            return bad(format!(
                "MAXH2CDATA {} is below 4096 or not a multiple of 4",
                l.max_h2c_data
            ));
        }
        if l.max_controllers == 0 || l.max_connections == 0 || l.target_queue_depth < 2 {
            return bad("controller, connection and target queue limits must be positive".into());
        }
        self.validate_budget()
    }

    /// Checks the memory and time limits.
    fn validate_budget(&self) -> Result<(), ConfigError> {
        let bad = |s: String| Err(ConfigError::Invalid(s));
        let l = self;
        for (what, v) in [
            ("admin", l.admin_buffer),
            ("unauthenticated", l.unauth_buffer),
        ] {
            if !(16 << 10..=16 << 20).contains(&v) {
                return bad(format!(
                    "the {what} queue buffer {v} is outside 16 KiB..=16 MiB (--{}-buffer)",
                    if what == "admin" { "admin" } else { "unauth" }
                ));
            }
        }
        if l.max_pending == 0 || l.max_pending >= l.max_connections {
            return bad(format!(
                "connections before connect ({}, --max-pending) must be 1 to fewer than the connections ({}, --max-connections)",
                l.max_pending, l.max_connections
            ));
        }
        if l.max_unauth_controllers >= l.max_controllers
            || l.max_unauth_controllers as u32 + l.max_pending >= l.max_connections
        {
            return bad(format!(
                "unauthenticated discovery controllers ({}, --max-unauth-controllers) must leave \
                 room to listed hosts (fewer than {} controllers and, with {} pending, {} \
                 connections)",
                l.max_unauth_controllers, l.max_controllers, l.max_pending, l.max_connections
            ));
        }
        for (what, v) in [
            ("connect", l.connect_timeout_ms),
            ("pdu", l.pdu_timeout_ms),
            ("r2t", l.r2t_timeout_ms),
        ] {
            if v < 100 {
                return bad(format!(
                    "the {what} timeout {v} ms is below 100 ms (--{what}-timeout-ms)"
                ));
            }
        }
        Ok(())
    }
}

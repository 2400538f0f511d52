//! Subsystems and controllers (dynamic controller model): Connect's admission rules, the
//! controller properties (CAP, VS, CC, CSTS), Identify, Get Log Page, Set/Get Features,
//! Keep Alive, and the discovery log. Shared by the reactors; admin commands take the
//! controller's lock, I/O never does.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use kestrel::spec::identify::{encode_active_ns_list, IdentifyController, IdentifyNamespace};
use kestrel::spec::{admin_opc, cns, LbaFormat, NsIdDescriptors, Sct, Status, IDENTIFY_SIZE};
use kestrel::{Target, TargetInfo};

use crate::config::{Limits, ServerConfig};
use crate::fabrics::{
    self, cntrltype, connect_sc, prop, ConnectCmd, ConnectData, DiscEntry, InvalidParam,
    PropertyCmd, CNTLID_DYNAMIC, CNTLID_MAX, DISCOVERY_NQN,
};

mod admin;
mod connect;

pub use admin::identify_namespace;
pub use connect::{connect, ConnectRefusal, Connected};

/// Locks `m`, a mutex the reactors share (`what` names it for the log). A panic in one
/// connection's handling while it held the lock (the reactor catches it and drops that
/// connection) poisoned it: the lock is taken anyway, the poison cleared and the
/// recovery logged, so the other connections go on. What these locks guard is left
/// consistent by every panic point: each critical section makes its change in one step
/// (a push, a retain, a field store) after its checks.
pub(crate) fn lock<'a, T>(m: &'a Mutex<T>, what: &str) -> MutexGuard<'a, T> {
    m.lock().unwrap_or_else(|poisoned| {
        tracing::error!(
            "recovered {what}, poisoned by a panic in a connection's handling (that connection \
             was dropped); serving on"
        );
        m.clear_poison();
        poisoned.into_inner()
    })
}

/// The host NQN whose Keep Alive panics, holding its subsystem's controller table lock,
/// with the `panic-hook` feature (tests of the target surviving a panic in one
/// connection's handling; not in a production build).
#[cfg(feature = "panic-hook")]
pub const PANIC_HOOK_HOSTNQN: &str =
    "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-0000-0000-0000000da1c0";

/// Log page identifiers served.
pub mod lid {
    /// Error Information.
    pub const ERROR: u8 = 0x01;
    /// SMART / Health Information.
    pub const SMART: u8 = 0x02;
    /// Firmware Slot Information.
    pub const FIRMWARE_SLOT: u8 = 0x03;
    /// Changed Namespace List.
    pub const CHANGED_NS: u8 = 0x04;
    /// Discovery.
    pub const DISCOVERY: u8 = crate::fabrics::LID_DISCOVERY;
}

/// Feature identifiers served.
pub mod fid {
    /// Arbitration.
    pub const ARBITRATION: u8 = 0x01;
    /// Power Management.
    pub const POWER_MANAGEMENT: u8 = 0x02;
    /// Temperature Threshold.
    pub const TEMPERATURE_THRESHOLD: u8 = 0x04;
    /// Error Recovery.
    pub const ERROR_RECOVERY: u8 = 0x05;
    /// Volatile Write Cache.
    pub const VOLATILE_WRITE_CACHE: u8 = 0x06;
    /// Write Atomicity Normal.
    pub const WRITE_ATOMICITY: u8 = 0x0A;
    /// Number of Queues.
    pub const NUMBER_OF_QUEUES: u8 = 0x07;
    /// Asynchronous Event Configuration.
    pub const ASYNC_EVENT_CONFIG: u8 = 0x0B;
    /// Keep Alive Timer.
    pub const KEEP_ALIVE_TIMER: u8 = 0x0F;
}

/// The NVMe version reported (VS and Identify VER): 1.4.0.
pub const NVME_VERSION: u32 = 0x0001_0400;
/// CAP.TO in 500 ms units: readiness is immediate, this is the host's patience.
const CAP_TO: u64 = 15;
/// KAS: Keep Alive granularity in 100 ms units.
const KAS: u16 = 10;
/// AERL + 1: Asynchronous Event Requests held per controller.
pub const MAX_AERS: usize = 4;

/// A namespace of an NVM subsystem.
pub struct Namespace {
    /// Its NSID in the subsystem (1, 2, ...).
    pub nsid: u32,
    /// Index of the reactors' queue on its target (server wide).
    pub qidx: usize,
    /// Index of its DMA pool among the subsystem's pools (namespaces of one controller
    /// share one; an I/O queue has buffers from each).
    pub group: usize,
    /// The target.
    pub target: Arc<dyn Target>,
    /// Its description.
    pub info: TargetInfo,
    /// NGUID (derived from the subsystem NQN).
    pub nguid: [u8; 16],
    /// EUI-64.
    pub eui64: [u8; 8],
    /// UUID.
    pub uuid: [u8; 16],
}

/// A subsystem: NVM (one or more namespaces) or the discovery subsystem.
pub struct Subsystem {
    /// Index in the server's list.
    pub index: usize,
    /// NQN.
    pub nqn: String,
    /// Namespaces 1, 2, ...; none for the discovery subsystem.
    pub namespaces: Vec<Namespace>,
    /// The DMA pools of the namespaces' targets, distinct (see [`Namespace::group`]).
    pub pools: Vec<kestrel::DmaPool>,
    /// MDTS in 4 KiB pages (the smallest of the namespaces' largest transfers).
    pub mdts: u8,
    /// The largest transfer of one command, bytes.
    pub max_io: u32,
    /// Host NQNs allowed.
    pub hosts: Vec<String>,
    /// Any host allowed.
    pub allow_any_host: bool,
    /// SN of its controllers.
    pub serial: String,
    table: Mutex<CtrlTable>,
}

struct CtrlTable {
    next_cntlid: u16,
    live: Vec<Arc<Controller>>,
}

fn fnv64(data: &[u8], seed: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for &b in data {
        h ^= b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl Subsystem {
    fn new(
        index: usize,
        nqn: &str,
        namespaces: Vec<Namespace>,
        max_io: u32,
        hosts: Vec<String>,
        any: bool,
    ) -> Self {
        let mut pools: Vec<kestrel::DmaPool> = Vec::new();
        let mut namespaces = namespaces;
        for ns in &mut namespaces {
            let p = ns.target.dma_pool();
            ns.group = match pools.iter().position(|q| q.same_pool(p)) {
                Some(g) => g,
                None => {
                    pools.push(p.clone());
                    pools.len() - 1
                }
            };
        }
        Subsystem {
            index,
            nqn: nqn.to_string(),
            namespaces,
            pools,
            mdts: (max_io / 4096).max(1).trailing_zeros() as u8,
            max_io,
            hosts,
            allow_any_host: any,
            serial: format!("{:016x}", fnv64(nqn.as_bytes(), 1)),
            table: Mutex::new(CtrlTable {
                next_cntlid: 1,
                live: Vec::new(),
            }),
        }
    }

    /// Whether this is the discovery subsystem.
    pub fn is_discovery(&self) -> bool {
        self.namespaces.is_empty()
    }

    /// The active namespace `nsid`.
    pub fn namespace(&self, nsid: u32) -> Option<&Namespace> {
        (nsid as usize)
            .checked_sub(1)
            .and_then(|i| self.namespaces.get(i))
    }

    /// Whether `hostnqn` may connect.
    pub fn host_allowed(&self, hostnqn: &str) -> bool {
        self.is_discovery() || self.allow_any_host || self.hosts.iter().any(|h| h == hostnqn)
    }

    /// The live controller `cntlid`.
    pub fn controller(&self, cntlid: u16) -> Option<Arc<Controller>> {
        let t = lock(&self.table, "the controller table");
        t.live.iter().find(|c| c.cntlid == cntlid).cloned()
    }

    /// Controllers alive.
    pub fn controllers(&self) -> usize {
        lock(&self.table, "the controller table").live.len()
    }

    /// Removes a controller that ended.
    pub fn remove(&self, cntlid: u16) {
        let mut t = lock(&self.table, "the controller table");
        t.live.retain(|c| c.cntlid != cntlid);
    }
}

/// Server-wide state the reactors share.
pub struct Shared {
    /// NVM subsystems, then the discovery subsystem last.
    pub subsystems: Vec<Arc<Subsystem>>,
    /// Namespaces of every subsystem: the number of target queues a reactor may have.
    pub target_queues: usize,
    /// Limits.
    pub limits: Limits,
    /// When the server started (keep-alive clock).
    pub start: Instant,
    /// The listeners' addresses (for discovery log entries).
    pub listeners: Mutex<Vec<SocketAddr>>,
    /// Connections alive.
    pub connections: AtomicU32,
    /// Connections dropped because their handling panicked.
    pub panics: AtomicU64,
    /// Stop flag.
    pub stop: AtomicBool,
    /// What the connections hold, limits hit.
    pub acct: crate::budget::Accounting,
    /// Per reactor, its connections that have not connected yet.
    pub pending: Vec<AtomicU32>,
    /// Per reactor, the time its passes took, busy and idle (`reactor::PassTime`).
    pub pass_time: Vec<crate::reactor::PassTime>,
    /// The most data one admin command answers with (Identify, the longest log page:
    /// the discovery log of every subsystem on every listener).
    pub max_admin_data: usize,
}

impl Shared {
    /// Builds the subsystems of a validated configuration.
    pub fn new(cfg: &ServerConfig) -> Arc<Shared> {
        let mut subs = Vec::new();
        let mut qidx = 0;
        for (i, s) in cfg.subsystems.iter().enumerate() {
            let mut max_io = cfg.limits.max_io_size;
            let mut namespaces = Vec::new();
            for (k, t) in s.namespaces.iter().enumerate() {
                let nsid = k as u32 + 1;
                let info = t.info().clone();
                // Identifiers derived from the NQN and the NSID: stable across restarts,
                // distinct between namespaces (NSID 1 keeps the single-namespace values).
                let mut key = s.nqn.clone().into_bytes();
                if nsid > 1 {
                    key.extend_from_slice(format!("/{nsid}").as_bytes());
                }
                let h1 = fnv64(&key, 2);
                let h2 = fnv64(&key, 3);
                let mut nguid = [0u8; 16];
                nguid[..8].copy_from_slice(&h1.to_be_bytes());
                nguid[8..].copy_from_slice(&h2.to_be_bytes());
                let mut uuid = nguid;
                uuid[6] = (uuid[6] & 0x0f) | 0x40;
                uuid[8] = (uuid[8] & 0x3f) | 0x80;
                let mut eui64 = [0u8; 8];
                eui64.copy_from_slice(&fnv64(&key, 4).to_be_bytes());
                let target_max = info.max_transfer_bytes.clamp(4096, u32::MAX as u64) as u32;
                max_io = max_io.min(prev_power_of_two(target_max));
                namespaces.push(Namespace {
                    nsid,
                    qidx,
                    group: 0,
                    target: Arc::clone(t),
                    info,
                    nguid,
                    eui64,
                    uuid,
                });
                qidx += 1;
            }
            subs.push(Arc::new(Subsystem::new(
                i,
                &s.nqn,
                namespaces,
                max_io,
                s.allowed_hosts.clone(),
                s.allow_any_host,
            )));
        }
        let n = subs.len();
        // Discovery log: a header and a record per subsystem on the main listener, and one
        // per listener (at most two) for the discovery subsystem.
        let max_admin_data = (fabrics::DISC_RECORD_LEN * (n + 3)).max(IDENTIFY_SIZE);
        subs.push(Arc::new(Subsystem::new(
            n,
            DISCOVERY_NQN,
            Vec::new(),
            4096,
            Vec::new(),
            true,
        )));
        Arc::new(Shared {
            subsystems: subs,
            target_queues: qidx,
            limits: cfg.limits.clone(),
            start: Instant::now(),
            listeners: Mutex::new(Vec::new()),
            connections: AtomicU32::new(0),
            panics: AtomicU64::new(0),
            stop: AtomicBool::new(false),
            acct: Default::default(),
            pending: cfg.reactors.iter().map(|_| AtomicU32::new(0)).collect(),
            pass_time: cfg.reactors.iter().map(|_| Default::default()).collect(),
            max_admin_data,
        })
    }

    /// Whether an allow-list names `hostnqn` (or a subsystem admits any host): a host
    /// that is not gets the discovery service only, within the unauthenticated budget.
    pub fn host_listed(&self, hostnqn: &str) -> bool {
        self.subsystems.iter().any(|s| {
            !s.is_discovery() && (s.allow_any_host || s.hosts.iter().any(|h| h == hostnqn))
        })
    }

    /// Milliseconds since the server started.
    pub fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// The subsystem named `nqn`.
    pub fn subsystem(&self, nqn: &str) -> Option<&Arc<Subsystem>> {
        self.subsystems.iter().find(|s| s.nqn == nqn)
    }
}

fn prev_power_of_two(v: u32) -> u32 {
    if v == 0 {
        0
    } else {
        1 << (31 - v.leading_zeros())
    }
}

/// Controller registers as properties.
#[derive(Clone, Copy, Debug, Default)]
struct Regs {
    cc: u32,
    csts: u32,
}

struct CtrlState {
    regs: Regs,
    /// I/O queues granted by Set Features Number of Queues (0: not set yet).
    nq_granted: u16,
    aec: u32,
    /// Which I/O QIDs have a live connection.
    io_qids: Vec<bool>,
}

/// One controller: made by an admin queue Connect, ended with its admin connection.
pub struct Controller {
    /// CNTLID.
    pub cntlid: u16,
    /// The subsystem.
    pub subsys: Arc<Subsystem>,
    /// The host's NQN.
    pub hostnqn: String,
    /// The host's identifier.
    pub hostid: [u8; 16],
    /// Ended (keep-alive timeout, admin connection gone): I/O connections close.
    pub dead: AtomicBool,
    /// Bumped by a controller reset (CC.EN to 0): I/O connections of an older epoch close.
    pub epoch: AtomicU32,
    /// KATO in ms (0: no keep-alive).
    pub kato_ms: AtomicU32,
    /// When the last Keep Alive came (ms since the server started).
    pub last_keep_alive: AtomicU64,
    /// A discovery controller of a host no allow-list names.
    pub unauth: bool,
    st: Mutex<CtrlState>,
}

/// What an admin command came to.
#[derive(Debug, PartialEq, Eq)]
pub enum AdminOutcome {
    /// Complete now with this status and dwords 0 and 1; data (controller to host) is in
    /// the output buffer.
    Done {
        /// Status.
        status: Status,
        /// Dword 0.
        dw0: u32,
        /// Dword 1.
        dw1: u32,
    },
    /// An Asynchronous Event Request: held until an event (or the end of the controller).
    Hold,
}

fn done(status: Status) -> AdminOutcome {
    AdminOutcome::Done {
        status,
        dw0: 0,
        dw1: 0,
    }
}

fn ok(dw0: u32) -> AdminOutcome {
    AdminOutcome::Done {
        status: Status::SUCCESS,
        dw0,
        dw1: 0,
    }
}

fn invalid_field() -> AdminOutcome {
    done(Status::INVALID_FIELD.with_dnr(true))
}

impl Controller {
    /// The I/O queue `qid` went away.
    pub fn release_qid(&self, qid: u16) {
        if let Some(q) = lock(&self.st, "a controller's state")
            .io_qids
            .get_mut(qid as usize)
        {
            *q = false;
        }
    }

    /// Ends the controller: its I/O connections close at their next check.
    pub fn end(&self) {
        self.dead.store(true, Ordering::Release);
        self.subsys.remove(self.cntlid);
    }

    /// Whether the keep-alive timer has expired at `now_ms`.
    pub fn keep_alive_expired(&self, now_ms: u64) -> bool {
        let kato = self.kato_ms.load(Ordering::Relaxed) as u64;
        kato != 0 && now_ms.saturating_sub(self.last_keep_alive.load(Ordering::Relaxed)) > kato
    }

    fn is_discovery(&self) -> bool {
        self.subsys.is_discovery()
    }

    fn cap(&self, lim: &Limits) -> u64 {
        let mqes = (lim.max_queue_size - 1) as u64;
        // MQES, CQR (contiguous queues required), TO, CSS bit 0 (NVM command set);
        // MPSMIN = MPSMAX = 0 (4 KiB).
        mqes | (1 << 16) | (CAP_TO << 24) | (1u64 << 37)
    }

    /// Property Get.
    pub fn property_get(&self, p: &PropertyCmd, lim: &Limits) -> AdminOutcome {
        let st = lock(&self.st, "a controller's state");
        let v: u64 = match (p.ofst, p.size8) {
            (prop::CAP, _) => self.cap(lim),
            (prop::VS, false) => NVME_VERSION as u64,
            (prop::CC, false) => st.regs.cc as u64,
            (prop::CSTS, false) => st.regs.csts as u64,
            (prop::NSSR, false) => 0,
            _ => return invalid_field(),
        };
        let v = if p.size8 { v } else { v & 0xffff_ffff };
        AdminOutcome::Done {
            status: Status::SUCCESS,
            dw0: v as u32,
            dw1: (v >> 32) as u32,
        }
    }

    /// The CC property as last set.
    pub fn cc(&self) -> u32 {
        lock(&self.st, "a controller's state").regs.cc
    }

    /// Property Set: CC (enable, shutdown) is the one writable property.
    pub fn property_set(&self, p: &PropertyCmd) -> AdminOutcome {
        if p.ofst != prop::CC || p.size8 {
            return invalid_field();
        }
        let cc = p.value as u32;
        let mut st = lock(&self.st, "a controller's state");
        let was_en = st.regs.cc & 1 != 0;
        let en = cc & 1 != 0;
        let shn = (cc >> 14) & 3;
        st.regs.cc = cc;
        if en && !was_en {
            // IOSQES and IOCQES must be 6 (64 bytes) and 4 (16 bytes) for NVM.
            let iosqes = (cc >> 16) & 0xf;
            let iocqes = (cc >> 20) & 0xf;
            if !self.is_discovery() && (iosqes != 6 || iocqes != 4) {
                st.regs.csts |= 1 << 1; // CFS
                tracing::warn!(cntlid = self.cntlid, cc, "enable with bad IOSQES/IOCQES");
            } else {
                st.regs.csts |= 1; // RDY
            }
        }
        if !en && was_en {
            // Controller reset: I/O queues end, state returns to defaults.
            st.regs.csts &= !1;
            st.regs.csts &= !(3 << 2);
            st.nq_granted = 0;
            st.aec = 0;
            self.epoch.fetch_add(1, Ordering::AcqRel);
            tracing::info!(cntlid = self.cntlid, nqn = %self.subsys.nqn, "controller reset by the host");
        }
        if shn != 0 {
            // Nothing is cached here: shutdown is complete at once (SHST = 2).
            st.regs.csts = (st.regs.csts & !(3 << 2)) | (2 << 2);
        } else {
            st.regs.csts &= !(3 << 2);
        }
        ok(0)
    }

    /// Executes an admin command (not a Fabrics one). `out` receives data for the host.
    pub fn admin(
        &self,
        sqe: &[u8; 64],
        data_in: &[u8],
        out: &mut Vec<u8>,
        shared: &Shared,
        local: Option<SocketAddr>,
    ) -> AdminOutcome {
        let _ = data_in;
        let opc = sqe[0];
        let nsid = rd32(sqe, 4);
        let cdw10 = rd32(sqe, 40);
        let cdw11 = rd32(sqe, 44);
        out.clear();
        match opc {
            admin_opc::IDENTIFY => {
                self.identify(cdw10 as u8, (cdw11 >> 24) as u8, nsid, out, &shared.limits)
            }
            admin_opc::GET_LOG_PAGE => {
                let numd = ((cdw10 >> 16) | ((cdw11 & 0xffff) << 16)) as u64 + 1;
                let off = rd32(sqe, 48) as u64 | ((rd32(sqe, 52) as u64) << 32);
                self.get_log_page(cdw10 as u8, off, numd * 4, out, shared, local)
            }
            admin_opc::SET_FEATURES => self.set_features(cdw10, cdw11, &shared.limits),
            admin_opc::GET_FEATURES => self.get_features(cdw10, cdw11),
            #[cfg(feature = "panic-hook")]
            admin_opc::KEEP_ALIVE if self.hostnqn == PANIC_HOOK_HOSTNQN => {
                // Poisons a lock every connection of the subsystem takes.
                let _held = lock(&self.subsys.table, "the controller table");
                panic!(
                    "panic-hook: keep alive of host {} (cntlid {})",
                    self.hostnqn, self.cntlid
                );
            }
            admin_opc::KEEP_ALIVE => {
                self.last_keep_alive
                    .store(shared.now_ms(), Ordering::Relaxed);
                ok(0)
            }
            admin_opc::ASYNC_EVENT_REQUEST => AdminOutcome::Hold,
            // Abort: nothing can be aborted here (dword 0 bit 0: not aborted).
            admin_opc::ABORT => ok(1),
            _ => done(Status::INVALID_OPCODE.with_dnr(true)),
        }
    }
}

fn rd32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

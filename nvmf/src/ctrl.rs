//! Subsystems and controllers (dynamic controller model): Connect's admission rules, the
//! controller properties (CAP, VS, CC, CSTS), Identify, Get Log Page, Set/Get Features,
//! Keep Alive, and the discovery log. Shared by the reactors; admin commands take the
//! controller's lock, I/O never does.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use kestrel::spec::identify::{encode_active_ns_list, IdentifyController, IdentifyNamespace};
use kestrel::spec::{admin_opc, cns, LbaFormat, NsIdDescriptors, Sct, Status, IDENTIFY_SIZE};
use kestrel::{Target, TargetInfo};

use crate::config::{Limits, ServerConfig};
use crate::fabrics::{
    self, cntrltype, connect_sc, prop, ConnectCmd, ConnectData, DiscEntry, InvalidParam,
    PropertyCmd, CNTLID_DYNAMIC, CNTLID_MAX, DISCOVERY_NQN,
};

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
    /// Volatile Write Cache.
    pub const VOLATILE_WRITE_CACHE: u8 = 0x06;
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
        let t = self.table.lock().unwrap();
        t.live.iter().find(|c| c.cntlid == cntlid).cloned()
    }

    /// Controllers alive.
    pub fn controllers(&self) -> usize {
        self.table.lock().unwrap().live.len()
    }

    /// Removes a controller that ended.
    pub fn remove(&self, cntlid: u16) {
        let mut t = self.table.lock().unwrap();
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
    /// Stop flag.
    pub stop: AtomicBool,
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
            stop: AtomicBool::new(false),
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

/// Why a Connect is refused: its status, dword 0 and a log line.
#[derive(Debug)]
pub struct ConnectRefusal {
    /// Status.
    pub status: Status,
    /// Dword 0 (IPO/IATTR for Invalid Parameters).
    pub dw0: u32,
    /// For the log.
    pub why: String,
}

fn refuse_param(p: InvalidParam, extra: &str) -> ConnectRefusal {
    ConnectRefusal {
        status: Status::new(Sct::CommandSpecific, connect_sc::INVALID_PARAMETERS).with_dnr(true),
        dw0: p.dw0(),
        why: format!("{}{extra}", p.why),
    }
}

/// What a successful Connect made.
pub enum Connected {
    /// An admin queue: a new controller.
    Admin(Arc<Controller>),
    /// An I/O queue of an existing controller.
    Io(Arc<Controller>, u16),
}

/// Admits a Connect: finds the subsystem, checks the host, makes the controller (admin
/// queue) or binds the I/O queue to its controller.
pub fn connect(
    shared: &Shared,
    cmd: &ConnectCmd,
    data: &[u8],
) -> Result<(Connected, ConnectData), ConnectRefusal> {
    let d = ConnectData::parse(data).map_err(|p| refuse_param(p, ""))?;
    if cmd.recfmt != 0 {
        return Err(ConnectRefusal {
            status: Status::new(Sct::CommandSpecific, connect_sc::INCOMPATIBLE_FORMAT)
                .with_dnr(true),
            dw0: 0,
            why: format!("record format {} is not 0", cmd.recfmt),
        });
    }
    let Some(sub) = shared.subsystem(&d.subnqn) else {
        return Err(refuse_param(
            InvalidParam {
                offset: fabrics::connect_data_off::SUBNQN as u16,
                in_data: true,
                why: "no such subsystem",
            },
            &format!(" ({})", d.subnqn),
        ));
    };
    if !sub.host_allowed(&d.hostnqn) {
        return Err(ConnectRefusal {
            status: Status::new(Sct::CommandSpecific, connect_sc::INVALID_HOST).with_dnr(true),
            dw0: 0,
            why: format!(
                "host {} is not allowed to connect to {}",
                d.hostnqn, sub.nqn
            ),
        });
    }
    let lim = &shared.limits;
    let sq_param = |why| InvalidParam {
        offset: fabrics::connect_off::SQSIZE as u16,
        in_data: false,
        why,
    };
    if cmd.sqsize == 0 || cmd.sqsize >= lim.max_queue_size {
        return Err(refuse_param(
            sq_param("sqsize is 0 or above the maximum queue entries"),
            &format!(
                " (sqsize {}, at most {})",
                cmd.sqsize,
                lim.max_queue_size - 1
            ),
        ));
    }
    if cmd.qid == 0 {
        if d.cntlid != CNTLID_DYNAMIC {
            return Err(refuse_param(
                InvalidParam {
                    offset: fabrics::connect_data_off::CNTLID as u16,
                    in_data: true,
                    why: "the dynamic controller model needs cntlid ffffh on the admin queue",
                },
                "",
            ));
        }
        let mut t = sub.table.lock().unwrap();
        if t.live.len() >= lim.max_controllers as usize {
            return Err(ConnectRefusal {
                status: Status::new(Sct::CommandSpecific, connect_sc::CONTROLLER_BUSY),
                dw0: 0,
                why: format!(
                    "{} already has {} controllers (the limit)",
                    sub.nqn,
                    t.live.len()
                ),
            });
        }
        // Next free CNTLID in 1..=FFEFh, distinct from every live one.
        let mut id = t.next_cntlid;
        while t.live.iter().any(|c| c.cntlid == id) {
            id = if id >= CNTLID_MAX { 1 } else { id + 1 };
        }
        t.next_cntlid = if id >= CNTLID_MAX { 1 } else { id + 1 };
        let ctrl = Arc::new(Controller {
            cntlid: id,
            subsys: Arc::clone(sub),
            hostnqn: d.hostnqn.clone(),
            hostid: d.hostid,
            dead: AtomicBool::new(false),
            epoch: AtomicU32::new(0),
            kato_ms: AtomicU32::new(cmd.kato_ms),
            last_keep_alive: AtomicU64::new(shared.now_ms()),
            st: Mutex::new(CtrlState {
                regs: Regs::default(),
                nq_granted: 0,
                aec: 0,
                io_qids: vec![false; lim.max_io_queues as usize + 1],
            }),
        });
        t.live.push(Arc::clone(&ctrl));
        return Ok((Connected::Admin(ctrl), d));
    }
    let cntlid_param = InvalidParam {
        offset: fabrics::connect_data_off::CNTLID as u16,
        in_data: true,
        why: "no live controller with this cntlid for this host",
    };
    let Some(ctrl) = sub.controller(d.cntlid) else {
        return Err(refuse_param(cntlid_param, &format!(" ({})", d.cntlid)));
    };
    if ctrl.hostnqn != d.hostnqn || ctrl.hostid != d.hostid || sub.is_discovery() {
        return Err(refuse_param(cntlid_param, &format!(" ({})", d.cntlid)));
    }
    let mut st = ctrl.st.lock().unwrap();
    let qid_param = InvalidParam {
        offset: fabrics::connect_off::QID as u16,
        in_data: false,
        why: "qid above the queues granted, or already connected",
    };
    let allowed = if st.nq_granted > 0 {
        st.nq_granted
    } else {
        lim.max_io_queues
    };
    if cmd.qid > allowed || st.io_qids.get(cmd.qid as usize).copied().unwrap_or(true) {
        return Err(refuse_param(qid_param, &format!(" (qid {})", cmd.qid)));
    }
    if st.regs.csts & 1 == 0 {
        return Err(ConnectRefusal {
            status: Status::COMMAND_SEQUENCE_ERROR.with_dnr(true),
            dw0: 0,
            why: format!(
                "i/o queue {} connect before the controller {} is enabled",
                cmd.qid, ctrl.cntlid
            ),
        });
    }
    st.io_qids[cmd.qid as usize] = true;
    drop(st);
    Ok((Connected::Io(ctrl, cmd.qid), d))
}

impl Controller {
    /// The I/O queue `qid` went away.
    pub fn release_qid(&self, qid: u16) {
        if let Some(q) = self.st.lock().unwrap().io_qids.get_mut(qid as usize) {
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
        let st = self.st.lock().unwrap();
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
        self.st.lock().unwrap().regs.cc
    }

    /// Property Set: CC (enable, shutdown) is the one writable property.
    pub fn property_set(&self, p: &PropertyCmd) -> AdminOutcome {
        if p.ofst != prop::CC || p.size8 {
            return invalid_field();
        }
        let cc = p.value as u32;
        let mut st = self.st.lock().unwrap();
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
            admin_opc::IDENTIFY => self.identify(cdw10 as u8, nsid, out, &shared.limits),
            admin_opc::GET_LOG_PAGE => {
                let numd = ((cdw10 >> 16) | ((cdw11 & 0xffff) << 16)) as u64 + 1;
                let off = rd32(sqe, 48) as u64 | ((rd32(sqe, 52) as u64) << 32);
                self.get_log_page(cdw10 as u8, off, numd * 4, out, shared, local)
            }
            admin_opc::SET_FEATURES => self.set_features(cdw10, cdw11, &shared.limits),
            admin_opc::GET_FEATURES => self.get_features(cdw10),
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

    fn identify(&self, cns_v: u8, nsid: u32, out: &mut Vec<u8>, lim: &Limits) -> AdminOutcome {
        let sub = &self.subsys;
        match cns_v {
            cns::CONTROLLER => {
                out.extend_from_slice(&self.identify_controller(lim)[..]);
                ok(0)
            }
            cns::NAMESPACE | cns::NS_ID_DESCRIPTORS => {
                if sub.is_discovery() {
                    return invalid_field();
                }
                if cns_v == cns::NAMESPACE && nsid == 0xffff_ffff {
                    // The capabilities common to every namespace: the format of the
                    // first, no size.
                    let mut b = identify_namespace(&sub.namespaces[0]);
                    b[..24].fill(0);
                    out.extend_from_slice(&b[..]);
                    return ok(0);
                }
                // Every NSID from 1 to NN is active: any other is invalid.
                let Some(ns) = sub.namespace(nsid) else {
                    return done(Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true));
                };
                if cns_v == cns::NAMESPACE {
                    out.extend_from_slice(&identify_namespace(ns)[..]);
                } else {
                    let d = NsIdDescriptors {
                        eui64: Some(ns.eui64),
                        nguid: Some(ns.nguid),
                        uuid: Some(ns.uuid),
                        csi: Some(0),
                    };
                    out.extend_from_slice(&d.to_bytes()[..]);
                }
                ok(0)
            }
            cns::ACTIVE_NAMESPACES => {
                if nsid >= 0xffff_fffe {
                    return done(Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true));
                }
                let ids: Vec<u32> = sub
                    .namespaces
                    .iter()
                    .map(|n| n.nsid)
                    .filter(|&n| n > nsid)
                    .collect();
                out.extend_from_slice(&encode_active_ns_list(&ids)[..]);
                ok(0)
            }
            _ => invalid_field(),
        }
    }

    /// Identify Controller data.
    pub fn identify_controller(&self, lim: &Limits) -> Box<[u8; IDENTIFY_SIZE]> {
        let sub = &self.subsys;
        let (mdts, oncs, vwc, nn) = if sub.is_discovery() {
            (0, 0, 0, 0)
        } else {
            // ONCS is controller wide: Dataset Management when any namespace can
            // deallocate (it is advisory on the others), Write Zeroes only when every
            // namespace has it; a volatile write cache when any namespace caches.
            let nss = &sub.namespaces;
            let mut oncs = 0u16;
            if nss.iter().any(|n| n.info.deallocate) {
                oncs |= kestrel::spec::identify::oncs::DATASET_MANAGEMENT;
            }
            if nss.iter().all(|n| n.info.write_zeroes) {
                oncs |= kestrel::spec::identify::oncs::WRITE_ZEROES;
            }
            let vwc = nss.iter().any(|n| n.info.flush) as u8;
            (sub.mdts, oncs, vwc, nss.len() as u32)
        };
        let id = IdentifyController {
            sn: sub.serial.clone(),
            mn: "Kestrel NVMe/TCP".into(),
            fr: env!("CARGO_PKG_VERSION").chars().take(8).collect(),
            rab: 6,
            // CMIC bit 1: the subsystem may have several controllers (one per host
            // connection), so its namespace is shared (NMIC bit 0).
            cmic: if sub.is_discovery() { 0 } else { 0x02 },
            mdts,
            cntlid: self.cntlid,
            ver: NVME_VERSION,
            acl: 3,
            aerl: (MAX_AERS - 1) as u8,
            frmw: 0x03,
            // LPA bit 2: extended data for Get Log Page (offsets).
            lpa: 0x04,
            elpe: 0,
            sqes: 0x66,
            cqes: 0x44,
            maxcmd: lim.max_queue_size,
            nn,
            oncs,
            vwc,
            // SGLS: SGLs supported (bits 1:0 = 01b); bit 20: SGL Data Block offsets
            // (in-capsule data).
            sgls: 1 | (1 << 20),
            subnqn: sub.nqn.clone(),
            ..Default::default()
        };
        let mut b = id.to_bytes();
        b[fabrics::ctrl_off::CNTRLTYPE] = if sub.is_discovery() {
            cntrltype::DISCOVERY
        } else {
            cntrltype::IO
        };
        b[fabrics::ctrl_off::KAS..fabrics::ctrl_off::KAS + 2].copy_from_slice(&KAS.to_le_bytes());
        let ioccsz = (64 + lim.in_capsule_data) / 16;
        b[fabrics::ctrl_off::IOCCSZ..fabrics::ctrl_off::IOCCSZ + 4]
            .copy_from_slice(&ioccsz.to_le_bytes());
        b[fabrics::ctrl_off::IORCSZ..fabrics::ctrl_off::IORCSZ + 4]
            .copy_from_slice(&1u32.to_le_bytes());
        // ICDOFF 0, FCATT 0 (dynamic model), MSDBD 1, OFCS bit 0: Disconnect.
        b[fabrics::ctrl_off::MSDBD] = 1;
        b[fabrics::ctrl_off::OFCS] = 1;
        b
    }

    fn get_log_page(
        &self,
        lid_v: u8,
        off: u64,
        len: u64,
        out: &mut Vec<u8>,
        shared: &Shared,
        local: Option<SocketAddr>,
    ) -> AdminOutcome {
        if len > (1 << 20) || off % 4 != 0 {
            return invalid_field();
        }
        let page: Vec<u8> = match (lid_v, self.is_discovery()) {
            (lid::DISCOVERY, true) => self.discovery_log(shared, local),
            (lid::ERROR, false) => vec![0u8; 64],
            (lid::SMART, false) => vec![0u8; 512],
            (lid::FIRMWARE_SLOT, false) => {
                let mut p = vec![0u8; 512];
                p[0] = 1; // AFI: slot 1 active.
                let fr = env!("CARGO_PKG_VERSION").as_bytes();
                let mut f = [b' '; 8];
                let n = fr.len().min(8);
                f[..n].copy_from_slice(&fr[..n]);
                p[8..16].copy_from_slice(&f);
                p
            }
            (lid::CHANGED_NS, false) => vec![0u8; 4096],
            _ => {
                return done(
                    Status::new(Sct::CommandSpecific, 0x09).with_dnr(true), // Invalid Log Page
                );
            }
        };
        if off > page.len() as u64 {
            return invalid_field();
        }
        let start = off as usize;
        let end = (start + len as usize).min(page.len());
        out.extend_from_slice(&page[start..end]);
        out.resize(len as usize, 0);
        ok(0)
    }

    /// The discovery log page: the subsystems this host may reach, on every listener, and
    /// the discovery subsystem itself.
    pub fn discovery_log(&self, shared: &Shared, local: Option<SocketAddr>) -> Vec<u8> {
        let listeners = shared.listeners.lock().unwrap().clone();
        let mut entries = Vec::new();
        let addr_of = |l: &SocketAddr| -> SocketAddr {
            match local {
                Some(loc) if l.ip().is_unspecified() => SocketAddr::new(loc.ip(), l.port()),
                _ => *l,
            }
        };
        let entry = |l: &SocketAddr, nqn: &str, st: u8, portid: u16| {
            let a = addr_of(l);
            DiscEntry {
                trtype: fabrics::TRTYPE_TCP,
                adrfam: if a.is_ipv4() {
                    fabrics::ADRFAM_IPV4
                } else {
                    fabrics::ADRFAM_IPV6
                },
                subtype: st,
                treq: fabrics::TREQ_DISABLE_SQFLOW,
                portid,
                cntlid: CNTLID_DYNAMIC,
                asqsz: 32,
                trsvcid: a.port().to_string(),
                subnqn: nqn.to_string(),
                traddr: a.ip().to_string(),
                sectype: 0,
            }
        };
        let main = listeners.first().copied();
        if let Some(l) = &main {
            for s in &shared.subsystems {
                if !s.is_discovery() && (s.allow_any_host || s.hosts.contains(&self.hostnqn)) {
                    entries.push(entry(l, &s.nqn, fabrics::subtype::NVM, 1));
                }
            }
        }
        for (i, l) in listeners.iter().enumerate() {
            entries.push(entry(
                l,
                DISCOVERY_NQN,
                fabrics::subtype::CURRENT_DISCOVERY,
                i as u16 + 1,
            ));
        }
        fabrics::encode_discovery_log(1, &entries)
    }

    fn set_features(&self, cdw10: u32, cdw11: u32, lim: &Limits) -> AdminOutcome {
        if cdw10 & (1 << 31) != 0 {
            return done(Status::new(Sct::CommandSpecific, 0x0D).with_dnr(true));
            // not saveable
        }
        let mut st = self.st.lock().unwrap();
        match cdw10 as u8 {
            fid::NUMBER_OF_QUEUES => {
                let nsqr = cdw11 & 0xffff;
                let ncqr = cdw11 >> 16;
                if nsqr == 0xffff || ncqr == 0xffff || self.is_discovery() {
                    return invalid_field();
                }
                let want = nsqr.max(ncqr) + 1;
                let n = want.min(lim.max_io_queues as u32) as u16;
                st.nq_granted = n;
                let v = (n - 1) as u32;
                ok(v | (v << 16))
            }
            fid::KEEP_ALIVE_TIMER => {
                self.kato_ms.store(cdw11, Ordering::Relaxed);
                ok(0)
            }
            fid::ASYNC_EVENT_CONFIG => {
                st.aec = cdw11;
                ok(0)
            }
            fid::ARBITRATION | fid::POWER_MANAGEMENT if cdw11 == 0 => ok(0),
            _ => done(Status::new(Sct::CommandSpecific, 0x0E).with_dnr(true)), // not changeable
        }
    }

    fn get_features(&self, cdw10: u32) -> AdminOutcome {
        let st = self.st.lock().unwrap();
        let sel = (cdw10 >> 8) & 7;
        if sel == 3 {
            // Capabilities: nothing saveable, nothing namespace specific; changeable.
            return ok(1 << 2);
        }
        match cdw10 as u8 {
            fid::NUMBER_OF_QUEUES => {
                let v = st.nq_granted.max(1) as u32 - 1;
                ok(v | (v << 16))
            }
            fid::KEEP_ALIVE_TIMER => ok(self.kato_ms.load(Ordering::Relaxed)),
            fid::ASYNC_EVENT_CONFIG => ok(st.aec),
            fid::VOLATILE_WRITE_CACHE => {
                ok(self.subsys.namespaces.iter().any(|n| n.info.flush) as u32)
            }
            fid::ARBITRATION | fid::POWER_MANAGEMENT => ok(0),
            _ => invalid_field(),
        }
    }
}

/// Identify Namespace data of a namespace.
pub fn identify_namespace(ns: &Namespace) -> Box<[u8; IDENTIFY_SIZE]> {
    let mut id = IdentifyNamespace {
        nsze: ns.info.num_blocks,
        ncap: ns.info.num_blocks,
        nuse: ns.info.num_blocks,
        // NMIC bit 0: the namespace may be attached to several controllers.
        nmic: 1,
        dlfeat: if ns.info.deallocate && ns.info.deallocate_reads_zeroes {
            0x01
        } else {
            0
        },
        nguid: ns.nguid,
        eui64: ns.eui64,
        ..Default::default()
    };
    id.lbaf[0] = LbaFormat {
        ms: 0,
        lbads: ns.info.block_size.trailing_zeros() as u8,
        rp: 0,
    };
    id.to_bytes()
}

fn rd32(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

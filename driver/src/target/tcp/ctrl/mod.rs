//! A remote controller: the admin connection, its bring-up, Keep Alive and shutdown.
//!
//! Bring-up, in order: TCP connect, ICReq/ICResp (digests as asked), Fabrics Connect of
//! the admin queue (CNTLID FFFFh, KATO), Property Get CAP and VS, Property Set CC (EN with
//! the 64/16-byte entry sizes) and Property Get CSTS until RDY (bounded by CAP.TO),
//! Identify Controller (MDTS, IOCCSZ, ICDOFF, NN, ONCS, VWC), the active namespace list and
//! each namespace, Set Features Number of Queues, Set Features Asynchronous Event
//! Configuration (the notices OAES offers: namespace attribute, firmware activation,
//! discovery log change) and one Asynchronous Event Request. Keep Alive then goes out
//! every KATO/2 from a thread of its own, which also looks for the Asynchronous Event
//! Request's completion every 100 ms (and takes one that comes during any other admin
//! command): the event is logged and kept ([`TcpController::async_events`]), its log page
//! read with Retain Asynchronous Event cleared so the controller reports that type again,
//! and a new request sent. A request the controller completes with an error is not sent
//! again. Dropping the last handle (every queue holds one) stops the thread, sets CC.SHN to
//! normal shutdown and waits (bounded) for CSTS.SHST to say complete.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::hw::dma::{DmaPool, DmaPoolOptions, IdentityMapper};
use crate::parse::TcpSpec;
use crate::spec::fabrics::{ctrl_off, prop, PropertyCmd, DISCOVERY_NQN};
use crate::spec::identify::{parse_active_ns_list, IDENTIFY_SIZE};
use crate::spec::{
    cns, fid, AsyncEvent, Cap, Cc, Csts, IdentifyController, IdentifyNamespace, Sqe, Vs,
};
use crate::target::TargetInfo;

use super::hostnqn::{default_identity, HostIdentity};

mod keepalive;
use super::link::Link;
use super::{Endpoint, TcpError};
pub(super) use keepalive::{FIRST_BACKOFF, MAX_BACKOFF};

/// Keep Alive Timeout when `kato=` is not given (as Linux's initiator).
pub const DEFAULT_KATO: Duration = Duration::from_secs(5);
/// Controller loss timeout when `ctrl_loss_tmo=` is not given.
pub const DEFAULT_CTRL_LOSS_TMO: Duration = Duration::from_secs(30);
/// One connection attempt's limit when `connect_timeout=` is not given.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Entries of the admin queue (as Linux's initiator).
pub const ADMIN_QUEUE_ENTRIES: u16 = 32;
/// Entries per I/O queue when `queue_size=` is not given (clamped to CAP.MQES + 1).
pub const DEFAULT_QUEUE_SIZE: u32 = 128;

/// How to open a `tcp:` target: the spec with every default filled in.
#[derive(Clone, Debug)]
pub struct TcpOpenOptions {
    /// Where.
    pub endpoint: Endpoint,
    /// The subsystem NQN (the discovery NQN for a discovery controller).
    pub subnqn: String,
    /// Who this host is.
    pub host: HostIdentity,
    /// Ask for header digests.
    pub hdgst: bool,
    /// Ask for data digests.
    pub ddgst: bool,
    /// I/O queues to ask for.
    pub queues: u16,
    /// Entries per I/O queue to ask for.
    pub queue_size: u32,
    /// Keep Alive Timeout (zero: none).
    pub kato: Duration,
    /// How long a lost connection is tried again.
    pub ctrl_loss_tmo: Duration,
    /// Per-command I/O timeout.
    pub io_timeout: Duration,
    /// Keep SQ flow control on the I/O queues (`sqflow=on`, the default); `false`
    /// (`sqflow=off`): each I/O queue's Connect asks for it disabled (CATTR bit 2).
    pub sqflow: bool,
}

impl TcpOpenOptions {
    /// The options a spec asks for, with `queues`, `admin_timeout` and `io_timeout` where
    /// it says nothing (the opener's controller options).
    pub fn from_spec(
        spec: &TcpSpec,
        queues: u16,
        admin_timeout: Duration,
        io_timeout: Duration,
    ) -> Self {
        let mut host = default_identity();
        if let Some(n) = &spec.hostnqn {
            host.nqn = n.clone();
        }
        if let Some(id) = spec.hostid {
            host.id = id;
        }
        TcpOpenOptions {
            endpoint: Endpoint {
                host: spec.host.clone(),
                port: spec.port,
                connect_timeout: spec.connect_timeout.unwrap_or(DEFAULT_CONNECT_TIMEOUT),
                admin_timeout,
            },
            subnqn: spec
                .subnqn
                .clone()
                .unwrap_or_else(|| DISCOVERY_NQN.to_string()),
            host,
            hdgst: spec.digests.header,
            ddgst: spec.digests.data,
            queues: spec.queues.unwrap_or(queues).max(1),
            queue_size: spec.queue_size.unwrap_or(DEFAULT_QUEUE_SIZE),
            kato: spec.kato.unwrap_or(DEFAULT_KATO),
            ctrl_loss_tmo: spec.ctrl_loss_tmo.unwrap_or(DEFAULT_CTRL_LOSS_TMO),
            io_timeout,
            sqflow: spec.sqflow.unwrap_or(true),
        }
    }
}

/// A namespace as Identify described it.
#[derive(Clone, Debug)]
pub struct TcpNsInfo {
    /// What a target on it reports.
    pub info: TargetInfo,
    /// Identify Namespace.
    pub identify: IdentifyNamespace,
    /// Why the driver does no I/O to it (a format with metadata), if it does none.
    pub unsupported: Option<String>,
}

/// The admin connection and the Keep Alive thread's controls.
pub(super) struct Admin {
    link: Mutex<Link>,
    /// What the Keep Alive thread is asked: stop, or look at the controller now.
    state: Mutex<keepalive::Asked>,
    wake: Condvar,
    /// The controller could not be reached again within the controller loss timeout.
    pub(super) lost: AtomicBool,
    /// The CNTLID of the controller now (a new one after a reconnect).
    cntlid: AtomicU32,
    /// How to connect again.
    opts: TcpOpenOptions,
    /// Identify Controller's OAES (which notices the controller can report), for the
    /// Asynchronous Event Configuration of each new admin connection; `None` on a
    /// discovery controller, which gets no Asynchronous Event Request.
    oaes: Option<u32>,
    /// The most recent asynchronous events, oldest first (at most [`MAX_EVENTS`]).
    events: Mutex<VecDeque<AsyncEvent>>,
    /// Asynchronous events reported since the controller was opened.
    events_seen: AtomicU64,
}

/// Asynchronous events a controller keeps for [`TcpController::async_events`].
pub const MAX_EVENTS: usize = 64;

impl Admin {
    pub(super) fn link(&self) -> MutexGuard<'_, Link> {
        self.link.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Notes an asynchronous event the controller reported.
    pub(super) fn note_event(&self, e: AsyncEvent) {
        let mut q = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if q.len() == MAX_EVENTS {
            q.pop_front();
        }
        q.push_back(e);
        self.events_seen.fetch_add(1, Ordering::Relaxed);
    }
}

/// Notices a host asks for in the Asynchronous Event Configuration when the controller
/// reports them in OAES: Namespace Attribute (bit 8), Firmware Activation (bit 9) and
/// Discovery Log Page Change (bit 31), as Linux's initiator.
const AEC_NOTICES: u32 = (1 << 8) | (1 << 9) | (1 << 31);

/// Turns on the notices the controller offers (Set Features Asynchronous Event
/// Configuration; a refusal is logged, not fatal) and sends an Asynchronous Event Request.
pub(super) fn enable_events(link: &mut Link, oaes: u32) -> Result<(), TcpError> {
    let aec = oaes & AEC_NOTICES;
    if aec != 0 {
        let sqe = Sqe::set_features(fid::ASYNC_EVENT_CONFIG, aec).to_bytes();
        let (cqe, _) = link.command(sqe, &[], 0)?;
        if let Err(e) = link.check(&cqe, "set features (asynchronous event configuration)") {
            tracing::debug!(error = %e, "nvme/tcp: asynchronous notices stay off");
        }
    }
    link.arm_event()
}

/// What Identify and the properties said, fixed at bring-up.
#[derive(Clone, Debug)]
pub struct CtrlFacts {
    /// CNTLID the controller gave this host.
    pub cntlid: u16,
    /// CAP.
    pub cap: Cap,
    /// VS.
    pub vs: Vs,
    /// Identify Controller.
    pub identify: IdentifyController,
    /// In-capsule data an I/O command may carry: IOCCSZ × 16 − 64 bytes.
    pub in_capsule: u32,
    /// ICDOFF in bytes.
    pub icdoff: u32,
    /// The largest transfer of one command (MDTS); `u64::MAX`: no limit.
    pub max_transfer: u64,
    /// I/O queues granted (Number of Queues).
    pub granted: u16,
    /// CNTRLTYPE (1 I/O, 2 discovery; 0 not reported).
    pub cntrltype: u8,
}

pub(super) struct Shared {
    pub(super) opts: TcpOpenOptions,
    pub(super) admin: Arc<Admin>,
    pub(super) facts: CtrlFacts,
    pub(super) ns: Vec<TcpNsInfo>,
    pub(super) pool: DmaPool,
    /// `qids[i]`: I/O queue `i + 1` is in use.
    qids: Mutex<Vec<bool>>,
    /// I/O queue Connects the target refused because it still held the queue ID.
    qid_refusals: AtomicU64,
    ka: Mutex<Option<JoinHandle<()>>>,
}

/// A remote controller, up. Clones share it; the last one dropped shuts it down.
#[derive(Clone)]
pub struct TcpController {
    pub(super) sh: Arc<Shared>,
}

fn u32_at(b: &[u8], o: usize) -> u32 {
    u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]])
}

impl TcpController {
    /// Connects and brings the controller up (see the module documentation).
    pub fn open(opts: &TcpOpenOptions) -> Result<TcpController, TcpError> {
        let (mut link, cntlid, cap, vs) = connect_admin(opts)?;
        let raw = identify(&mut link, cns::CONTROLLER, 0)?;
        let id = IdentifyController::parse(&raw);
        let discovery = opts.subnqn == DISCOVERY_NQN;
        let ioccsz = u32_at(&raw[..], ctrl_off::IOCCSZ);
        let mut facts = CtrlFacts {
            cntlid,
            cap,
            vs,
            max_transfer: id.max_transfer_bytes(cap.mpsmin()).unwrap_or(u64::MAX),
            in_capsule: (ioccsz * 16).saturating_sub(64),
            icdoff: u32::from(u16::from_le_bytes([
                raw[ctrl_off::ICDOFF],
                raw[ctrl_off::ICDOFF + 1],
            ])) * 16,
            granted: 0,
            cntrltype: raw[ctrl_off::CNTRLTYPE],
            identify: id,
        };
        let ns = if discovery {
            Vec::new()
        } else {
            facts.granted = set_queues(&mut link, opts.queues)?;
            let ns = namespaces(&mut link, opts, &facts)?;
            enable_events(&mut link, facts.identify.oaes)?;
            ns
        };
        let admin = Arc::new(Admin {
            link: Mutex::new(link),
            state: Mutex::new(keepalive::Asked::default()),
            wake: Condvar::new(),
            lost: AtomicBool::new(false),
            cntlid: AtomicU32::new(u32::from(cntlid)),
            opts: opts.clone(),
            oaes: (!discovery).then_some(facts.identify.oaes),
            events: Mutex::new(VecDeque::with_capacity(MAX_EVENTS)),
            events_seen: AtomicU64::new(0),
        });
        let ka = keepalive::start(&admin);
        Ok(TcpController {
            sh: Arc::new(Shared {
                opts: opts.clone(),
                admin,
                qids: Mutex::new(vec![false; facts.granted as usize]),
                qid_refusals: AtomicU64::new(0),
                facts,
                ns,
                pool: DmaPool::new(Arc::new(IdentityMapper), DmaPoolOptions::default()),
                ka: Mutex::new(ka),
            }),
        })
    }

    /// Where it is.
    pub fn endpoint(&self) -> &Endpoint {
        &self.sh.opts.endpoint
    }
    /// The subsystem NQN.
    pub fn subnqn(&self) -> &str {
        &self.sh.opts.subnqn
    }
    /// What bring-up learnt.
    pub fn facts(&self) -> &CtrlFacts {
        &self.sh.facts
    }
    /// The options it was opened with.
    pub fn options(&self) -> &TcpOpenOptions {
        &self.sh.opts
    }
    /// Every active namespace.
    pub fn namespaces(&self) -> &[TcpNsInfo] {
        &self.sh.ns
    }
    /// `nvme/tcp HOST:PORT NQN`, for reports.
    pub fn describe(&self) -> String {
        format!("nvme/tcp {} {}", self.sh.opts.endpoint, self.sh.opts.subnqn)
    }
    /// The pool queue buffers come from (ordinary memory: the kernel's socket copies).
    pub fn dma_pool(&self) -> &DmaPool {
        &self.sh.pool
    }
    /// Whether the controller is lost: it could not be reached again within the
    /// controller loss timeout.
    pub fn is_lost(&self) -> bool {
        self.sh.admin.lost.load(Ordering::Acquire)
    }
    /// The most recent asynchronous events the controller reported (at most
    /// [`MAX_EVENTS`], oldest first). Each was cleared by reading its log page and another
    /// Asynchronous Event Request sent (see the module documentation).
    pub fn async_events(&self) -> Vec<AsyncEvent> {
        let q = self
            .sh
            .admin
            .events
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        q.iter().copied().collect()
    }
    /// How many asynchronous events the controller reported since it was opened.
    pub fn async_event_count(&self) -> u64 {
        self.sh.admin.events_seen.load(Ordering::Relaxed)
    }
    /// The controller's CNTLID now (I/O queues connect with it; a reconnect changes it).
    pub fn cntlid(&self) -> u16 {
        self.sh.admin.cntlid.load(Ordering::Acquire) as u16
    }
    /// Asks the Keep Alive thread to look at the admin connection now (an I/O queue lost
    /// its connection: the controller may be gone too).
    pub(super) fn kick(&self) {
        self.sh.admin.kick();
    }
    /// Runs one admin command (data out in-capsule, at most `data_in` bytes back).
    pub fn admin_command(
        &self,
        sqe: [u8; 64],
        data_out: &[u8],
        data_in: usize,
    ) -> Result<(crate::spec::Cqe, Vec<u8>), TcpError> {
        self.sh.admin.link().command(sqe, data_out, data_in)
    }

    /// Takes a free I/O queue ID.
    pub(super) fn take_qid(&self) -> Result<u16, TcpError> {
        let mut q = self.sh.qids.lock().unwrap_or_else(|p| p.into_inner());
        match q.iter().position(|u| !u) {
            Some(i) => {
                q[i] = true;
                Ok(i as u16 + 1)
            }
            None => Err(TcpError::NoQueue {
                addr: self.sh.opts.endpoint.to_string(),
                granted: self.sh.facts.granted,
            }),
        }
    }
    /// How many I/O queue Connects the target refused because it still held the queue ID
    /// (each retried; see `TcpQueue::connect`). A queue closed by this host waits for its
    /// Disconnect's answer before giving its ID back, so against a target that deletes the
    /// queue on Disconnect (kestrel serve) this stays 0; one that frees the ID only when
    /// it sees the connection close (Linux's nvmet) can make it count.
    pub fn qid_refusals(&self) -> u64 {
        self.sh.qid_refusals.load(Ordering::Relaxed)
    }
    pub(super) fn count_qid_refusal(&self) {
        self.sh.qid_refusals.fetch_add(1, Ordering::Relaxed);
    }
    /// Gives an I/O queue ID back.
    pub(super) fn put_qid(&self, qid: u16) {
        let mut q = self.sh.qids.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(u) = q.get_mut(qid as usize - 1) {
            *u = false;
        }
    }
}

/// Property Get of a 4- or 8-byte property.
pub(super) fn prop_get(link: &mut Link, ofst: u32, size8: bool) -> Result<u64, TcpError> {
    let sqe = PropertyCmd {
        size8,
        ofst,
        value: 0,
    }
    .encode(0, false);
    let (cqe, _) = link.command(sqe, &[], 0)?;
    link.check(&cqe, "property get")?;
    Ok(u64::from(cqe.dw0) | (u64::from(cqe.dw1) << 32))
}

/// Property Set of a 4-byte property.
pub(super) fn prop_set(link: &mut Link, ofst: u32, value: u32) -> Result<(), TcpError> {
    let sqe = PropertyCmd {
        size8: false,
        ofst,
        value: u64::from(value),
    }
    .encode(0, true);
    let (cqe, _) = link.command(sqe, &[], 0)?;
    link.check(&cqe, "property set")
}

/// Waits until `done(CSTS)` within `limit`, polling every millisecond or so.
fn wait_csts(
    link: &mut Link,
    limit: Duration,
    what: &'static str,
    done: impl Fn(Csts) -> bool,
) -> Result<Csts, TcpError> {
    let deadline = Instant::now() + limit;
    loop {
        let csts = Csts(prop_get(link, prop::CSTS, false)? as u32);
        if done(csts) {
            return Ok(csts);
        }
        if csts.cfs() {
            return Err(TcpError::Unsupported {
                addr: link.addr.clone(),
                why: format!("the controller reports a fatal status (CSTS.CFS) while {what}"),
            });
        }
        if Instant::now() > deadline {
            return Err(TcpError::Timeout {
                addr: link.addr.clone(),
                what,
                after: limit,
            });
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// CAP, VS, then CC.EN and CSTS.RDY.
fn enable(link: &mut Link) -> Result<(Cap, Vs), TcpError> {
    let cap = Cap(prop_get(link, prop::CAP, true)?);
    let vs = Vs(prop_get(link, prop::VS, false)? as u32);
    let limit = Duration::from_millis(cap.timeout_ms().max(500));
    let cc = Cc(prop_get(link, prop::CC, false)? as u32);
    if cc.en() {
        prop_set(link, prop::CC, cc.with_en(false).0)?;
        wait_csts(link, limit, "waiting for CSTS.RDY to clear", |c| !c.rdy())?;
    }
    let cc = Cc(0)
        .with_iosqes(6)
        .with_iocqes(4)
        .with_mps(0)
        .with_css(0)
        .with_en(true);
    prop_set(link, prop::CC, cc.0)?;
    wait_csts(link, limit, "waiting for CSTS.RDY after CC.EN", |c| c.rdy())?;
    Ok((cap, vs))
}

/// Identify (CNS, NSID) into 4 KiB.
pub(super) fn identify(
    link: &mut Link,
    cns_v: u8,
    nsid: u32,
) -> Result<Box<[u8; IDENTIFY_SIZE]>, TcpError> {
    let sqe = Sqe::identify(cns_v, nsid, 0).to_bytes();
    let (cqe, data) = link.command(sqe, &[], IDENTIFY_SIZE)?;
    link.check(&cqe, "identify")?;
    let mut b = Box::new([0u8; IDENTIFY_SIZE]);
    b.copy_from_slice(&data);
    Ok(b)
}

/// Set Features Number of Queues; returns the I/O queues granted (the fewer of SQs, CQs).
fn set_queues(link: &mut Link, want: u16) -> Result<u16, TcpError> {
    let sqe = Sqe::set_number_of_queues(want, want).to_bytes();
    let (cqe, _) = link.command(sqe, &[], 0)?;
    link.check(&cqe, "set features (number of queues)")?;
    let nsq = (cqe.dw0 & 0xffff) as u16 + 1;
    let ncq = (cqe.dw0 >> 16) as u16 + 1;
    Ok(nsq.min(ncq).min(want))
}

/// Every active namespace, with what a target on it reports.
fn namespaces(
    link: &mut Link,
    opts: &TcpOpenOptions,
    f: &CtrlFacts,
) -> Result<Vec<TcpNsInfo>, TcpError> {
    let list = parse_active_ns_list(&*identify(link, cns::ACTIVE_NAMESPACES, 0)?);
    let id = &f.identify;
    let mut out = Vec::with_capacity(list.len());
    for nsid in list {
        let ns = IdentifyNamespace::parse(&*identify(link, cns::NAMESPACE, nsid)?);
        let lbaf = ns.lba_format();
        let unsupported = match (lbaf.data_size(), lbaf.ms) {
            (None, _) => Some(format!("lba format with lbads {}", lbaf.lbads)),
            (_, 0) => None,
            (_, ms) => Some(format!("{ms} bytes of metadata per block (kestrel's nvme/tcp host does no i/o with metadata)")),
        };
        let info = TargetInfo {
            name: format!("nvme/tcp {} {} ns{nsid}", opts.endpoint, opts.subnqn),
            nsid,
            block_size: lbaf.data_size().unwrap_or(512),
            num_blocks: ns.nsze,
            max_transfer_bytes: f.max_transfer,
            write_zeroes: id.supports_write_zeroes(),
            deallocate: id.supports_dsm(),
            deallocate_reads_zeroes: ns.deallocated_reads_zeroes(),
            flush: id.has_volatile_write_cache(),
            read_only: false,
            metadata: None,
            zones: None,
        };
        out.push(TcpNsInfo {
            info,
            identify: ns,
            unsupported,
        });
    }
    Ok(out)
}

/// A new admin connection: TCP, ICReq/ICResp, Fabrics Connect of the admin queue with
/// KATO, CAP and VS, then CC.EN and CSTS.RDY. Returns it with its CNTLID.
fn connect_admin(opts: &TcpOpenOptions) -> Result<(Link, u16, Cap, Vs), TcpError> {
    let mut link = Link::open(&opts.endpoint, opts.hdgst, opts.ddgst)?;
    let kato_ms = opts.kato.as_millis().min(u32::MAX as u128) as u32;
    // The admin queue keeps SQ flow control (CATTR 0): it carries one command at a time.
    let (cntlid, _) = link.fabrics_connect(
        0,
        ADMIN_QUEUE_ENTRIES - 1,
        0,
        kato_ms,
        None,
        &opts.subnqn,
        &opts.host,
    )?;
    let (cap, vs) = enable(&mut link)?;
    Ok((link, cntlid, cap, vs))
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.admin.stop();
        if let Some(t) = self.ka.lock().unwrap_or_else(|p| p.into_inner()).take() {
            let _ = t.join();
        }
        if self.admin.lost.load(Ordering::Acquire) {
            return;
        }
        let mut link = self.admin.link();
        let limit = Duration::from_millis(self.facts.cap.timeout_ms().clamp(500, 10_000));
        let r = prop_get(&mut link, prop::CC, false)
            .and_then(|cc| prop_set(&mut link, prop::CC, Cc(cc as u32).with_shn(1).0))
            .and_then(|_| {
                wait_csts(
                    &mut link,
                    limit,
                    "waiting for CSTS.SHST after CC.SHN",
                    |c| c.shst() == 2,
                )
            });
        if let Err(e) = r {
            tracing::warn!(addr = %self.opts.endpoint, error = %e, "nvme/tcp shutdown did not complete");
        }
    }
}

//! Controller bring-up, the admin queue, and I/O queue pair creation.
//!
//! Bring-up is an explicit state machine ([`InitState`]), as in SPDK's `nvme_ctrlr.c`
//! and the spec's section 3.5.1 ("Memory-based Controller Initialization"):
//! read CAP/VS → disable (CC.EN = 0, wait CSTS.RDY = 0) → program AQA/ASQ/ACQ → write CC
//! (IOSQES = 6, IOCQES = 4, MPS = 4 KiB, CSS = NVM) → enable → wait CSTS.RDY = 1 within
//! CAP.TO × 500 ms → Identify Controller → Set Features (Number of Queues) → identify the
//! active namespaces → Doorbell Buffer Config when offered. A timeout or CSTS.CFS stops
//! bring-up with an error naming the state.
//!
//! The admin queue is driven synchronously (one command at a time) under a mutex: it is
//! used for setup and for rare recovery actions, never on the I/O path.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::dma::{DmaBuf, DmaPool, DmaPoolOptions};
use crate::format::UnsupportedFormat;
use crate::mmio::{Bar, Doorbell};
use crate::prp;
use crate::qpair::{IoQpair, QpairOptions, QpairParts};
use crate::ring::{CqRing, ShadowPages, ShadowSlot, SqRing};
use crate::spec::identify::{parse_active_ns_list, IDENTIFY_SIZE, SMART_LOG_SIZE};
use crate::spec::regs::{shadow_doorbell_index, shutdown};
use crate::spec::{
    admin_opc, cns, csi, lid, Aqa, Cap, Cc, Cqe, DoorbellKind, ErrorLogEntry, IdentifyController,
    IdentifyNamespace, NsFormat, NsIdDescriptors, SmartLog, Sqe, Status, Vs, NSID_ALL, PAGE_SIZE,
};
use crate::transport::Transport;

/// The states of controller bring-up, in order.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum InitState {
    /// Reading CAP and VS.
    ReadCapabilities,
    /// Clearing CC.EN and waiting for CSTS.RDY = 0.
    Disable,
    /// Programming AQA, ASQ and ACQ.
    ConfigureAdminQueue,
    /// Setting CC.EN = 1 and waiting for CSTS.RDY = 1.
    Enable,
    /// Identify Controller.
    IdentifyController,
    /// Set Features, Number of Queues.
    SetNumberOfQueues,
    /// Identify of the active namespaces.
    IdentifyNamespaces,
    /// Doorbell Buffer Config.
    ConfigureShadowDoorbells,
    /// Up and running.
    Ready,
}

impl std::fmt::Display for InitState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            InitState::ReadCapabilities => "reading CAP/VS",
            InitState::Disable => "disabling (waiting for CSTS.RDY=0 after CC.EN=0)",
            InitState::ConfigureAdminQueue => "configuring the admin queue (AQA/ASQ/ACQ)",
            InitState::Enable => "enabling (waiting for CSTS.RDY=1 after CC.EN=1)",
            InitState::IdentifyController => "identify controller",
            InitState::SetNumberOfQueues => "set features: number of queues",
            InitState::IdentifyNamespaces => "identify namespaces",
            InitState::ConfigureShadowDoorbells => "doorbell buffer config",
            InitState::Ready => "ready",
        })
    }
}

/// Errors of the controller layer.
#[derive(Debug, thiserror::Error)]
pub enum CtrlrError {
    /// A wait for CSTS.RDY ran past CAP.TO.
    #[error("{transport}: timed out after {waited_ms} ms {state} (CAP.TO allows {limit_ms} ms); check the device is healthy, or reset it with `scripts/setup.sh reset`")]
    Timeout {
        /// Where bring-up stopped.
        state: InitState,
        /// Milliseconds waited.
        waited_ms: u64,
        /// The bound from CAP.TO.
        limit_ms: u64,
        /// The controller.
        transport: String,
    },
    /// CSTS.CFS was set.
    #[error("{transport}: controller fatal status (CSTS.CFS) while {state}; the controller needs a reset")]
    Fatal {
        /// Where it happened.
        state: InitState,
        /// The controller.
        transport: String,
    },
    /// Registers read all ones.
    #[error("{transport}: device removed (registers read all ones) while {state}")]
    DeviceRemoved {
        /// Where it happened.
        state: InitState,
        /// The controller.
        transport: String,
    },
    /// The controller lacks something the driver requires.
    #[error("{transport}: unsupported controller: {why}")]
    Unsupported {
        /// The controller.
        transport: String,
        /// What is missing.
        why: String,
    },
    /// An admin command failed.
    #[error("{transport}: admin command {opcode} failed: {status}")]
    AdminCommand {
        /// The controller.
        transport: String,
        /// Command name.
        opcode: &'static str,
        /// The status.
        status: Status,
    },
    /// An admin command did not complete in time.
    #[error(
        "{transport}: admin command {opcode} (cid {cid}) did not complete within {timeout_ms} ms"
    )]
    AdminTimeout {
        /// The controller.
        transport: String,
        /// Command name.
        opcode: &'static str,
        /// Its CID.
        cid: u16,
        /// The timeout.
        timeout_ms: u64,
    },
    /// No I/O queue identifier is free.
    #[error("{transport}: all {granted} i/o queues granted by the controller are in use; drop a qpair or ask for more with ControllerOptions::io_queues")]
    NoFreeQueue {
        /// The controller.
        transport: String,
        /// Queues granted.
        granted: u16,
    },
    /// A namespace that is not active.
    #[error("{transport}: nsid {nsid} is not an active namespace (active: {active:?})")]
    NoSuchNamespace {
        /// The controller.
        transport: String,
        /// The NSID asked for.
        nsid: u32,
        /// The active ones.
        active: Vec<u32>,
    },
    /// A namespace whose format the driver does not implement (nothing was sent to it).
    #[error("{transport}: {source}")]
    UnsupportedFormat {
        /// The controller.
        transport: String,
        /// The namespace and its format.
        source: UnsupportedFormat,
    },
    /// An option outside the range the driver accepts.
    #[error("{option} = {value}: {why}")]
    BadOption {
        /// The option, as `ControllerOptions::admin_timeout`.
        option: &'static str,
        /// Its value.
        value: String,
        /// What is accepted.
        why: String,
    },
    /// DMA memory.
    #[error(transparent)]
    Dma(#[from] crate::dma::DmaError),
    /// MMIO.
    #[error(transparent)]
    Mmio(#[from] crate::mmio::MmioError),
}

/// Options for [`Controller::new`].
#[derive(Clone, Debug)]
pub struct ControllerOptions {
    /// Admin queue entries (2..=4096, clamped to CAP.MQES + 1).
    pub admin_queue_entries: u16,
    /// I/O queues to request with Set Features (Number of Queues).
    pub io_queues: u16,
    /// Configure shadow doorbells when the controller offers Doorbell Buffer Config.
    pub shadow_doorbells: bool,
    /// Timeout of an admin command (bring-up, queue creation, reset), at least
    /// [`crate::qpair::MIN_TIMEOUT`].
    pub admin_timeout: Duration,
    /// The I/O command timeout of queue pairs made through [`NvmeNamespace`]'s
    /// [`crate::target::Target::create_queue`] when [`crate::target::QueueOptions::timeout`]
    /// does not say (see [`QpairOptions::timeout`]); at least
    /// [`crate::qpair::MIN_TIMEOUT`].
    pub io_timeout: Duration,
    /// Upper bound on DMA memory the controller's pool maps.
    pub dma_max_bytes: usize,
    /// Override of the CAP.TO bound for the ready waits (testing).
    pub ready_timeout: Option<Duration>,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        ControllerOptions {
            admin_queue_entries: 32,
            io_queues: 64,
            shadow_doorbells: true,
            admin_timeout: Duration::from_secs(60),
            io_timeout: Duration::from_secs(30),
            dma_max_bytes: 8 << 30,
            ready_timeout: None,
        }
    }
}

/// What the driver knows of one active namespace.
#[derive(Clone, Debug)]
pub struct NsInfo {
    /// Namespace ID.
    pub nsid: u32,
    /// Logical block size in bytes (the LBA data size; 0 when the format in use is
    /// invalid).
    pub block_size: u32,
    /// Capacity in blocks (NSZE).
    pub num_blocks: u64,
    /// Write Zeroes supported (ONCS).
    pub write_zeroes: bool,
    /// Deallocate supported (ONCS DSM).
    pub deallocate: bool,
    /// Identify Namespace as reported.
    pub identify: IdentifyNamespace,
    /// The format in use: LBA format, metadata, protection, command set.
    pub format: NsFormat,
    /// Why the driver does no I/O to this namespace, when it does not implement its
    /// format (see [`crate::format`]); `None` for a namespace it serves.
    pub unsupported: Option<UnsupportedFormat>,
    /// What each Read, Write and Write Zeroes carries for the protection information
    /// (PRACT, checks, reference tag; none without PI). See [`crate::format`].
    pub protection: crate::format::IoProtection,
}

impl NsInfo {
    /// Capacity in bytes.
    pub fn size_bytes(&self) -> u64 {
        self.num_blocks * self.block_size as u64
    }
    /// Whether the driver does I/O to this namespace.
    pub fn supported(&self) -> bool {
        self.unsupported.is_none()
    }
}

struct AdminQueue {
    sq: SqRing,
    cq: CqRing,
    sq_db: Doorbell,
    cq_db: Doorbell,
    sq_tail: u16,
    cq_head: u16,
    phase: bool,
    next_cid: u16,
    scratch: DmaBuf,
}

fn opcode_name(opc: u8) -> &'static str {
    match opc {
        admin_opc::DELETE_IO_SQ => "delete i/o sq",
        admin_opc::CREATE_IO_SQ => "create i/o sq",
        admin_opc::GET_LOG_PAGE => "get log page",
        admin_opc::DELETE_IO_CQ => "delete i/o cq",
        admin_opc::CREATE_IO_CQ => "create i/o cq",
        admin_opc::IDENTIFY => "identify",
        admin_opc::ABORT => "abort",
        admin_opc::SET_FEATURES => "set features",
        admin_opc::GET_FEATURES => "get features",
        admin_opc::ASYNC_EVENT_REQUEST => "asynchronous event request",
        admin_opc::KEEP_ALIVE => "keep alive",
        admin_opc::DOORBELL_BUFFER_CONFIG => "doorbell buffer config",
        admin_opc::FORMAT_NVM => "format nvm",
        _ => "admin command",
    }
}

/// Refuses a timeout shorter than [`crate::qpair::MIN_TIMEOUT`].
fn check_timeout(option: &'static str, d: Duration) -> Result<(), CtrlrError> {
    if d < crate::qpair::MIN_TIMEOUT {
        return Err(CtrlrError::BadOption {
            option,
            value: format!("{d:?}"),
            why: format!("a timeout must be at least {:?}", crate::qpair::MIN_TIMEOUT),
        });
    }
    Ok(())
}

/// Waits with a bounded backoff: spin, then yield, then sleep up to 1 ms.
fn backoff(round: &mut u32) {
    *round += 1;
    if *round < 200 {
        std::hint::spin_loop();
    } else if *round < 400 {
        std::thread::yield_now();
    } else {
        std::thread::sleep(Duration::from_micros(
            ((*round - 400) as u64 * 10).min(1000),
        ));
    }
}

/// Where a controller is in its life, as qpairs see it.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[repr(u8)]
pub enum CtrlrState {
    /// Up: qpairs may use their queues.
    Ready = 0,
    /// A reset is under way: qpairs hold their doorbells and queue new requests.
    Resetting = 1,
    /// A reset failed: qpairs fail their I/O.
    Failed = 2,
    /// The device is gone.
    Removed = 3,
}

impl CtrlrState {
    pub(crate) fn from_epoch(e: u64) -> Self {
        match e & 0xFF {
            0 => CtrlrState::Ready,
            1 => CtrlrState::Resetting,
            2 => CtrlrState::Failed,
            _ => CtrlrState::Removed,
        }
    }
}

/// Brings a controller from any state to enabled with the admin queue `admin` (zeroed
/// and rewound here): CC.EN=0, wait !RDY, AQA/ASQ/ACQ, CC, CC.EN=1, wait RDY.
fn enable_controller(bar: &Bar, admin: &mut AdminQueue, init: &Init<'_>) -> Result<(), CtrlrError> {
    let cc = bar.cc();
    if cc.en() {
        bar.set_cc(cc.with_en(false));
    }
    init.wait_ready(InitState::Disable, false)?;
    admin.cq.clear();
    admin.sq_tail = 0;
    admin.cq_head = 0;
    admin.phase = true;
    let entries = admin.sq.entries();
    bar.set_aqa(Aqa::new(entries, entries));
    bar.set_asq(admin.sq.iova());
    bar.set_acq(admin.cq.iova());
    let cc = Cc::default()
        .with_iosqes(6)
        .with_iocqes(4)
        .with_mps(0)
        .with_css(0)
        .with_ams(0)
        .with_shn(0);
    bar.set_cc(cc);
    bar.set_cc(cc.with_en(true));
    init.wait_ready(InitState::Enable, true)
}

/// The controller state shared by [`Controller`] handles and its qpairs.
pub struct CtrlrShared {
    bar: Arc<Bar>,
    cap: Cap,
    vs: Vs,
    pool: DmaPool,
    admin: Mutex<AdminQueue>,
    identify: IdentifyController,
    namespaces: Vec<NsInfo>,
    free_qids: Mutex<Vec<u16>>,
    queues_granted: u16,
    shadow: Option<Arc<ShadowPages>>,
    max_command_bytes: u64,
    removed: AtomicBool,
    /// Reset generation (bits 63:8) and [`CtrlrState`] (bits 7:0), read by qpairs once per
    /// poll and per doorbell batch.
    epoch: AtomicU64,
    reset_lock: Mutex<()>,
    /// Resets started (see [`Controller::resets`]).
    resets: AtomicU64,
    ready_limit: Duration,
    opts: ControllerOptions,
    describe: String,
    // Dropped last: the pool's regions are unmapped through it.
    transport: Arc<dyn Transport>,
}

impl CtrlrShared {
    /// The namespace with this NSID.
    pub(crate) fn ns_info(&self, nsid: u32) -> Option<&NsInfo> {
        let i = (nsid as usize).wrapping_sub(1);
        match self.namespaces.get(i) {
            Some(n) if n.nsid == nsid => Some(n),
            _ => self.namespaces.iter().find(|n| n.nsid == nsid),
        }
    }

    fn admin(&self, sqe: Sqe) -> Result<Cqe, CtrlrError> {
        let mut q = self.admin.lock().unwrap_or_else(|p| p.into_inner());
        self.admin_locked(&mut q, sqe)
    }

    fn admin_locked(&self, q: &mut AdminQueue, sqe: Sqe) -> Result<Cqe, CtrlrError> {
        self.admin_locked_timeout(q, sqe, self.opts.admin_timeout)
    }

    fn admin_locked_timeout(
        &self,
        q: &mut AdminQueue,
        mut sqe: Sqe,
        timeout: Duration,
    ) -> Result<Cqe, CtrlrError> {
        let opcode = opcode_name(sqe.opc());
        let cid = q.next_cid;
        q.next_cid = q.next_cid.wrapping_add(1) & 0x7FFF;
        sqe.set_cid(cid);
        q.sq.write(q.sq_tail, &sqe);
        q.sq_tail = (q.sq_tail + 1) % q.sq.entries();
        q.sq_db.ring(q.sq_tail as u32);
        let start = Instant::now();
        let mut round = 0;
        loop {
            let dw3 = q.cq.dw3(q.cq_head);
            if ((dw3 >> 16) & 1 != 0) == q.phase {
                let (dw0, dw2) = q.cq.dw0_dw2(q.cq_head);
                q.cq_head += 1;
                if q.cq_head == q.cq.entries() {
                    q.cq_head = 0;
                    q.phase = !q.phase;
                }
                q.cq_db.ring(q.cq_head as u32);
                let cqe = Cqe::from_dwords(dw0, 0, dw2, dw3);
                if cqe.cid != cid {
                    tracing::warn!(
                        cid = cqe.cid,
                        expected = cid,
                        "{}: ignoring admin completion for cid {} while waiting for cid {cid}",
                        self.describe,
                        cqe.cid
                    );
                    continue;
                }
                let status = cqe.status();
                if !status.is_success() {
                    return Err(CtrlrError::AdminCommand {
                        transport: self.describe.clone(),
                        opcode,
                        status,
                    });
                }
                return Ok(cqe);
            }
            if start.elapsed() > timeout {
                let csts = self.bar.csts();
                if csts.is_all_ones() {
                    self.mark_removed();
                    return Err(CtrlrError::DeviceRemoved {
                        state: InitState::Ready,
                        transport: self.describe.clone(),
                    });
                }
                if csts.cfs() {
                    return Err(CtrlrError::Fatal {
                        state: InitState::Ready,
                        transport: self.describe.clone(),
                    });
                }
                return Err(CtrlrError::AdminTimeout {
                    transport: self.describe.clone(),
                    opcode,
                    cid,
                    timeout_ms: timeout.as_millis() as u64,
                });
            }
            backoff(&mut round);
        }
    }

    /// Runs an admin command whose data (at most 4 KiB) lands in the scratch page, and
    /// copies it out.
    fn admin_read(&self, mut sqe: Sqe, out: &mut [u8]) -> Result<Cqe, CtrlrError> {
        let mut q = self.admin.lock().unwrap_or_else(|p| p.into_inner());
        assert!(out.len() <= PAGE_SIZE);
        q.scratch.fill(0);
        sqe.prp1 = q.scratch.iova();
        let cqe = self.admin_locked(&mut q, sqe)?;
        q.scratch.read_at(0, out)?;
        Ok(cqe)
    }

    /// The reset epoch: generation and state (see [`CtrlrState`]).
    #[inline]
    pub(crate) fn epoch(&self) -> u64 {
        // Acquire: a qpair that sees a new Ready epoch must also see the re-enabled
        // controller's state (admin queue usable, shadow pages cleared) written before it.
        self.epoch.load(Ordering::Acquire)
    }

    /// The epoch without ordering, for the per-poll "did anything change" check; a
    /// change is then re-read with [`CtrlrShared::epoch`].
    #[inline]
    pub(crate) fn epoch_relaxed(&self) -> u64 {
        self.epoch.load(Ordering::Relaxed)
    }

    fn set_state(&self, st: CtrlrState, bump: bool) {
        let e = self.epoch.load(Ordering::Relaxed);
        let gen = (e >> 8) + bump as u64;
        // Release: pairs with the acquire in `epoch`.
        self.epoch.store((gen << 8) | st as u64, Ordering::Release);
    }

    /// Marks the device as removed (registers read all ones): every qpair fails its I/O.
    pub(crate) fn mark_removed(&self) {
        if !self.removed.swap(true, Ordering::Relaxed) {
            tracing::error!(
                "{}: device removed (registers read all ones)",
                self.describe
            );
        }
        self.set_state(CtrlrState::Removed, false);
    }

    /// Resets the controller: disable, re-enable with the admin queue, Set Features
    /// (Number of Queues) and Doorbell Buffer Config again. I/O queues are recreated by
    /// each qpair on its own thread when it sees the new epoch. `seen_epoch` is the epoch
    /// the caller saw: if another thread reset the controller since, this returns at once.
    /// Returns whether this call reset the controller (false: another thread had).
    pub(crate) fn reset_from(&self, seen_epoch: Option<u64>) -> Result<bool, CtrlrError> {
        let _g = self.reset_lock.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(seen) = seen_epoch {
            let now = self.epoch();
            if now >> 8 != seen >> 8 && CtrlrState::from_epoch(now) == CtrlrState::Ready {
                return Ok(false);
            }
        }
        if self.removed.load(Ordering::Relaxed) || self.bar.csts().is_all_ones() {
            self.mark_removed();
            return Err(CtrlrError::DeviceRemoved {
                state: InitState::Disable,
                transport: self.describe.clone(),
            });
        }
        tracing::warn!("{}: resetting the controller", self.describe);
        self.resets.fetch_add(1, Ordering::Relaxed);
        self.set_state(CtrlrState::Resetting, true);
        let r = self.reinit().map(|()| true);
        match &r {
            Ok(_) => {
                self.set_state(CtrlrState::Ready, false);
                tracing::info!("{}: reset complete", self.describe);
            }
            Err(e) => {
                tracing::error!("{}: reset failed: {e}", self.describe);
                if matches!(e, CtrlrError::DeviceRemoved { .. }) {
                    self.mark_removed();
                } else {
                    self.set_state(CtrlrState::Failed, false);
                }
            }
        }
        r
    }

    fn reinit(&self) -> Result<(), CtrlrError> {
        let init = Init {
            bar: &self.bar,
            describe: self.describe.clone(),
            ready_limit: self.ready_limit,
        };
        let mut q = self.admin.lock().unwrap_or_else(|p| p.into_inner());
        enable_controller(&self.bar, &mut q, &init)?;
        let want = self.queues_granted.max(1);
        self.admin_locked(&mut q, Sqe::set_number_of_queues(want, want))?;
        if let Some(pages) = &self.shadow {
            pages.clear();
            self.admin_locked(
                &mut q,
                Sqe::doorbell_buffer_config(pages.db_iova(), pages.ei_iova()),
            )?;
        }
        Ok(())
    }

    /// Recreates the CQ and SQ of `qid` after a reset.
    pub(crate) fn recreate_io_queue(
        &self,
        qid: u16,
        depth: u16,
        sq_iova: u64,
        cq_iova: u64,
    ) -> Result<(), CtrlrError> {
        self.admin(Sqe::create_io_cq(qid, depth, cq_iova))?;
        if let Err(e) = self.admin(Sqe::create_io_sq(qid, depth, qid, sq_iova)) {
            let _ = self.admin(Sqe::delete_io_cq(qid));
            return Err(e);
        }
        Ok(())
    }

    /// CSTS right now.
    pub(crate) fn csts(&self) -> crate::spec::Csts {
        self.bar.csts()
    }

    /// The command retry delay for a completion's CRD field (0: none).
    pub(crate) fn retry_delay(&self, crd: u8) -> Duration {
        match crd {
            1..=3 => Duration::from_millis(self.identify.crdt[crd as usize - 1] as u64 * 100),
            _ => Duration::ZERO,
        }
    }

    /// Sends Abort for `cid` on `sqid` with a short timeout (the controller may be the
    /// reason the command is stuck).
    pub(crate) fn abort_with_timeout(
        &self,
        sqid: u16,
        cid: u16,
        timeout: Duration,
    ) -> Result<bool, CtrlrError> {
        let mut q = self.admin.lock().unwrap_or_else(|p| p.into_inner());
        let cqe = self.admin_locked_timeout(&mut q, Sqe::abort(sqid, cid), timeout)?;
        Ok(cqe.dw0 & 1 == 0)
    }

    /// Deletes the SQ and CQ of `qid` and returns the identifier to the free list.
    pub(crate) fn release_io_queue(&self, qid: u16, device_gone: bool) {
        if !device_gone && !self.removed.load(Ordering::Relaxed) {
            for sqe in [Sqe::delete_io_sq(qid), Sqe::delete_io_cq(qid)] {
                if let Err(e) = self.admin(sqe) {
                    tracing::warn!("{}: deleting qid {qid}: {e}", self.describe);
                }
            }
        }
        self.free_qids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(qid);
    }

    /// Sends Abort for `cid` on `sqid`. Returns whether the controller says it aborted it
    /// (CQE dword 0 bit 0 clear).
    pub(crate) fn abort(&self, sqid: u16, cid: u16) -> Result<bool, CtrlrError> {
        let cqe = self.admin(Sqe::abort(sqid, cid))?;
        Ok(cqe.dw0 & 1 == 0)
    }

    fn shutdown(&self) {
        if self.removed.load(Ordering::Relaxed) || self.bar.csts().is_all_ones() {
            return;
        }
        let cc = self.bar.cc();
        if !cc.en() {
            return;
        }
        self.bar.set_cc(cc.with_shn(shutdown::SHN_NORMAL));
        let limit = Duration::from_millis(self.cap.timeout_ms().clamp(500, 10_000));
        let start = Instant::now();
        let mut round = 0;
        while self.bar.csts().shst() != shutdown::SHST_COMPLETE {
            if start.elapsed() > limit {
                tracing::warn!(
                    "{}: shutdown did not complete within {} ms",
                    self.describe,
                    limit.as_millis()
                );
                break;
            }
            backoff(&mut round);
        }
        // Disable, so nothing the controller does can touch DMA memory once we unmap it.
        self.bar
            .set_cc(Cc(self.bar.cc().0).with_shn(0).with_en(false));
        let start = Instant::now();
        while self.bar.csts().rdy() && start.elapsed() < limit {
            backoff(&mut round);
        }
    }
}

impl Drop for CtrlrShared {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// An NVMe controller, brought up and ready to create I/O queue pairs. Cheap to clone.
#[derive(Clone)]
pub struct Controller {
    shared: Arc<CtrlrShared>,
}

impl std::fmt::Debug for Controller {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Controller")
            .field("transport", &self.shared.describe)
            .field("vs", &self.shared.vs.to_string())
            .finish()
    }
}

struct Init<'a> {
    bar: &'a Bar,
    describe: String,
    ready_limit: Duration,
}

impl Init<'_> {
    fn check_csts(&self, state: InitState) -> Result<(), CtrlrError> {
        let csts = self.bar.csts();
        if csts.is_all_ones() {
            return Err(CtrlrError::DeviceRemoved {
                state,
                transport: self.describe.clone(),
            });
        }
        if csts.cfs() {
            return Err(CtrlrError::Fatal {
                state,
                transport: self.describe.clone(),
            });
        }
        Ok(())
    }

    fn wait_ready(&self, state: InitState, want: bool) -> Result<(), CtrlrError> {
        let start = Instant::now();
        let mut round = 0;
        loop {
            let csts = self.bar.csts();
            if csts.is_all_ones() {
                return Err(CtrlrError::DeviceRemoved {
                    state,
                    transport: self.describe.clone(),
                });
            }
            if csts.rdy() == want {
                return Ok(());
            }
            // CFS while enabling is fatal; while disabling, a fatal controller still
            // clears RDY, so keep waiting for that.
            if want && csts.cfs() {
                return self.check_csts(state);
            }
            let waited = start.elapsed();
            if waited > self.ready_limit {
                return Err(CtrlrError::Timeout {
                    state,
                    waited_ms: waited.as_millis() as u64,
                    limit_ms: self.ready_limit.as_millis() as u64,
                    transport: self.describe.clone(),
                });
            }
            backoff(&mut round);
        }
    }
}

impl Controller {
    /// Brings up the controller behind `transport`.
    pub fn new(transport: Arc<dyn Transport>, opts: ControllerOptions) -> Result<Self, CtrlrError> {
        check_timeout("ControllerOptions::admin_timeout", opts.admin_timeout)?;
        check_timeout("ControllerOptions::io_timeout", opts.io_timeout)?;
        let describe = transport.describe();
        let bar = transport.bar();
        let mut state = InitState::ReadCapabilities;
        tracing::debug!("{describe}: {state}");
        let cap = bar.cap();
        let vs = bar.vs();
        if bar.csts().is_all_ones() {
            return Err(CtrlrError::DeviceRemoved {
                state,
                transport: describe,
            });
        }
        if cap.css() & 1 == 0 {
            return Err(CtrlrError::Unsupported {
                transport: describe,
                why: format!("CAP.CSS {:#x} lacks the NVM command set", cap.css()),
            });
        }
        if cap.mpsmin() > 0 {
            return Err(CtrlrError::Unsupported {
                transport: describe,
                why: format!(
                    "CAP.MPSMIN is {} KiB; the driver uses 4 KiB pages",
                    4u32 << cap.mpsmin()
                ),
            });
        }
        let ready_limit = opts
            .ready_timeout
            .unwrap_or(Duration::from_millis(cap.timeout_ms().max(500)));
        let init = Init {
            bar: &bar,
            describe: describe.clone(),
            ready_limit,
        };

        state = InitState::ConfigureAdminQueue;
        tracing::debug!("{describe}: {state}");
        let pool = DmaPool::new(
            transport.mapper(),
            DmaPoolOptions {
                page_kind: transport.page_kind(),
                region_len: 2 << 20,
                max_bytes: opts.dma_max_bytes,
            },
        );
        let entries = opts
            .admin_queue_entries
            .clamp(2, 4096)
            .min(cap.max_queue_entries().min(4096) as u16);
        let bar_arc = Arc::clone(&bar);
        let mut admin = AdminQueue {
            sq_db: bar_arc.doorbell(0, DoorbellKind::SqTail)?,
            cq_db: bar_arc.doorbell(0, DoorbellKind::CqHead)?,
            sq: SqRing::new(&pool, entries)?,
            cq: CqRing::new(&pool, entries)?,
            sq_tail: 0,
            cq_head: 0,
            phase: true,
            next_cid: 0,
            scratch: pool.alloc(PAGE_SIZE)?,
        };
        // Disable, program the admin queue, enable: the states are named in the errors.
        enable_controller(&bar, &mut admin, &init)?;

        let mut shared = CtrlrShared {
            bar: Arc::clone(&bar),
            cap,
            vs,
            pool,
            admin: Mutex::new(admin),
            identify: IdentifyController::default(),
            namespaces: Vec::new(),
            free_qids: Mutex::new(Vec::new()),
            queues_granted: 0,
            shadow: None,
            max_command_bytes: 0,
            removed: AtomicBool::new(false),
            epoch: AtomicU64::new(CtrlrState::Ready as u64),
            reset_lock: Mutex::new(()),
            resets: AtomicU64::new(0),
            ready_limit,
            opts: opts.clone(),
            describe: describe.clone(),
            transport,
        };

        state = InitState::IdentifyController;
        tracing::debug!("{describe}: {state}");
        let mut buf = vec![0u8; IDENTIFY_SIZE];
        shared.admin_read(Sqe::identify(cns::CONTROLLER, 0, 0), &mut buf)?;
        let ident = IdentifyController::parse(buf.as_slice().try_into().expect("4096 bytes"));
        if ident.sqes & 0xF > 6 || ident.cqes & 0xF > 4 {
            return Err(CtrlrError::Unsupported {
                transport: describe,
                why: format!(
                    "SQES {:#x} / CQES {:#x}: the driver uses 64-byte SQEs and 16-byte CQEs",
                    ident.sqes, ident.cqes
                ),
            });
        }
        let mdts_bytes = ident.max_transfer_bytes(cap.mpsmin()).unwrap_or(u64::MAX);

        state = InitState::SetNumberOfQueues;
        tracing::debug!("{describe}: {state}");
        let want = opts.io_queues.clamp(1, 0xFFFE);
        let cqe = shared.admin(Sqe::set_number_of_queues(want, want))?;
        let nsqa = (cqe.dw0 & 0xFFFF) as u16;
        let ncqa = (cqe.dw0 >> 16) as u16;
        let granted = nsqa.min(ncqa).saturating_add(1).min(want);

        state = InitState::IdentifyNamespaces;
        tracing::debug!("{describe}: {state}");
        let ids = match shared.admin_read(Sqe::identify(cns::ACTIVE_NAMESPACES, 0, 0), &mut buf) {
            Ok(_) => parse_active_ns_list(buf.as_slice().try_into().expect("4096 bytes")),
            // Before NVMe 1.1 there is no active list: every NSID up to NN is a candidate.
            Err(CtrlrError::AdminCommand { .. }) => (1..=ident.nn.min(1024)).collect(),
            Err(e) => return Err(e),
        };
        let mut namespaces = Vec::new();
        for nsid in ids {
            shared.admin_read(Sqe::identify(cns::NAMESPACE, nsid, 0), &mut buf)?;
            let ns = IdentifyNamespace::parse(buf.as_slice().try_into().expect("4096 bytes"));
            if ns.nsze == 0 {
                continue;
            }
            // The command set: from the Namespace Identification Descriptor list (NVMe
            // 1.3+; the CSI descriptor since 2.0). A controller that has no such list, or
            // lists no CSI, predates other command sets: NVM.
            let csi =
                match shared.admin_read(Sqe::identify(cns::NS_ID_DESCRIPTORS, nsid, 0), &mut buf) {
                    Ok(_) => NsIdDescriptors::parse(buf.as_slice().try_into().expect("4096 bytes"))
                        .csi
                        .unwrap_or(csi::NVM),
                    Err(CtrlrError::AdminCommand { .. }) => csi::NVM,
                    Err(e) => return Err(e),
                };
            let format = NsFormat::of(&ns, csi);
            let unsupported = crate::format::check(nsid, &format).err();
            let protection = match unsupported {
                None => crate::format::IoProtection::of(&format),
                Some(_) => crate::format::IoProtection::NONE,
            };
            if let Some(u) = &unsupported {
                tracing::warn!("{describe}: no i/o to {u}");
            }
            namespaces.push(NsInfo {
                nsid,
                block_size: format.data_size().unwrap_or(0),
                num_blocks: ns.nsze,
                write_zeroes: ident.supports_write_zeroes(),
                deallocate: ident.supports_dsm(),
                identify: ns,
                format,
                unsupported,
                protection,
            });
        }

        if opts.shadow_doorbells && ident.supports_shadow_doorbells() {
            state = InitState::ConfigureShadowDoorbells;
            tracing::debug!("{describe}: {state}");
            let pages = Arc::new(ShadowPages::new(&shared.pool)?);
            match shared.admin(Sqe::doorbell_buffer_config(
                pages.db_iova(),
                pages.ei_iova(),
            )) {
                Ok(_) => shared.shadow = Some(pages),
                Err(CtrlrError::AdminCommand { status, .. }) => {
                    tracing::info!("{describe}: doorbell buffer config refused ({status}); using mmio doorbells only");
                }
                Err(e) => return Err(e),
            }
        }

        shared.identify = ident;
        shared.namespaces = namespaces;
        shared.queues_granted = granted;
        shared.max_command_bytes = mdts_bytes;
        *shared.free_qids.get_mut().unwrap() = (1..=granted).rev().collect();
        tracing::info!(
            "{describe}: ready: {} {} fw {} vs {vs}, {granted} i/o queues, {} namespaces",
            shared.identify.mn,
            shared.identify.sn,
            shared.identify.fr,
            shared.namespaces.len()
        );
        Ok(Controller {
            shared: Arc::new(shared),
        })
    }

    /// CAP as read at bring-up.
    pub fn cap(&self) -> Cap {
        self.shared.cap
    }
    /// VS.
    pub fn version(&self) -> Vs {
        self.shared.vs
    }
    /// Identify Controller.
    pub fn identify(&self) -> &IdentifyController {
        &self.shared.identify
    }
    /// Active namespaces, by NSID, including those whose format the driver does not
    /// implement ([`NsInfo::unsupported`] says why; no I/O is sent to them).
    pub fn namespaces(&self) -> &[NsInfo] {
        &self.shared.namespaces
    }
    /// The active namespaces the driver does I/O to.
    pub fn io_namespaces(&self) -> impl Iterator<Item = &NsInfo> + '_ {
        self.shared.namespaces.iter().filter(|n| n.supported())
    }
    /// One namespace.
    pub fn namespace(&self, nsid: u32) -> Result<&NsInfo, CtrlrError> {
        self.shared
            .ns_info(nsid)
            .ok_or_else(|| CtrlrError::NoSuchNamespace {
                transport: self.shared.describe.clone(),
                nsid,
                active: self.shared.namespaces.iter().map(|n| n.nsid).collect(),
            })
    }
    /// I/O queues granted by Set Features (Number of Queues).
    pub fn io_queues_granted(&self) -> u16 {
        self.shared.queues_granted
    }
    /// MDTS in bytes (`u64::MAX` when the controller sets no limit).
    pub fn max_transfer_bytes(&self) -> u64 {
        self.shared.max_command_bytes
    }
    /// Whether shadow doorbells were configured.
    pub fn shadow_doorbells(&self) -> bool {
        self.shared.shadow.is_some()
    }
    /// The DMA pool I/O buffers for this controller come from.
    pub fn dma_pool(&self) -> &DmaPool {
        &self.shared.pool
    }
    /// The transport the controller is reached through.
    pub fn transport(&self) -> &Arc<dyn Transport> {
        &self.shared.transport
    }
    /// The transport's description.
    pub fn describe(&self) -> &str {
        &self.shared.describe
    }
    /// Register writes made so far on BAR0 (doorbells are counted per queue).
    pub fn register_writes(&self) -> u64 {
        self.shared.bar.register_writes()
    }
    /// The controller's CSTS right now.
    pub fn csts(&self) -> crate::spec::Csts {
        self.shared.bar.csts()
    }

    /// Runs an admin command with no data (or data the caller's `buf` supplies and
    /// receives: up to 4 KiB read back). Returns the completion entry.
    pub fn admin_command(&self, sqe: Sqe, buf: Option<&mut [u8]>) -> Result<Cqe, CtrlrError> {
        match buf {
            Some(b) if b.len() <= PAGE_SIZE => self.shared.admin_read(sqe, b),
            Some(_) => Err(CtrlrError::Unsupported {
                transport: self.shared.describe.clone(),
                why: "admin passthrough data is limited to 4 KiB".into(),
            }),
            None => self.shared.admin(sqe),
        }
    }

    /// Reads `len` bytes of log page `lid` for `nsid` (any length; several commands of
    /// at most 4 KiB).
    pub fn get_log_page(&self, lid: u8, nsid: u32, len: usize) -> Result<Vec<u8>, CtrlrError> {
        let mut out = vec![0u8; len];
        let mut off = 0usize;
        while off < len {
            let n = (len - off).min(PAGE_SIZE);
            let sqe = Sqe::get_log_page(lid, nsid, (n / 4) as u32, off as u64, 0, 0);
            self.shared.admin_read(sqe, &mut out[off..off + n])?;
            off += n;
        }
        Ok(out)
    }

    /// The SMART / Health Information log (controller-wide).
    pub fn smart_log(&self) -> Result<SmartLog, CtrlrError> {
        let b = self.get_log_page(lid::SMART_HEALTH, NSID_ALL, SMART_LOG_SIZE)?;
        Ok(SmartLog::parse(b.as_slice().try_into().expect("512 bytes")))
    }

    /// The Error Information log (ELPE + 1 entries), valid entries only.
    pub fn error_log(&self) -> Result<Vec<ErrorLogEntry>, CtrlrError> {
        let n = self.shared.identify.elpe as usize + 1;
        let b = self.get_log_page(lid::ERROR_INFORMATION, NSID_ALL, n.min(256) * 64)?;
        Ok(ErrorLogEntry::parse_page(&b))
    }

    /// Sends Abort for `cid` on `sqid`; true if the controller aborted it.
    pub fn abort(&self, sqid: u16, cid: u16) -> Result<bool, CtrlrError> {
        self.shared.abort(sqid, cid)
    }

    /// Resets the controller (CC.EN 1 → 0 → 1) and re-initialises it. Every qpair
    /// recreates its queues on its own thread at its next poll and resubmits the commands
    /// that were in flight, under its retry policy; requests submitted meanwhile wait in
    /// its software queue.
    pub fn reset(&self) -> Result<(), CtrlrError> {
        self.shared.reset_from(None).map(drop)
    }

    /// Resets started since bring-up, by [`Controller::reset`] or by a qpair recovering
    /// from a timeout or a controller fatal status (failed ones included).
    pub fn resets(&self) -> u64 {
        self.shared.resets.load(Ordering::Relaxed)
    }

    /// The admin command timeout ([`ControllerOptions::admin_timeout`]).
    pub fn admin_timeout(&self) -> Duration {
        self.shared.opts.admin_timeout
    }

    /// The default I/O command timeout of its namespaces' queues
    /// ([`ControllerOptions::io_timeout`]).
    pub fn io_timeout(&self) -> Duration {
        self.shared.opts.io_timeout
    }

    /// Where the controller is: ready, resetting, failed or removed.
    pub fn state(&self) -> CtrlrState {
        CtrlrState::from_epoch(self.shared.epoch())
    }

    /// Creates an I/O queue pair: a CQ and an SQ with the same QID, their rings and the
    /// trackers with their PRP lists, all allocated now.
    pub fn create_io_qpair(&self, opts: &QpairOptions) -> Result<IoQpair, CtrlrError> {
        check_timeout("QpairOptions::timeout", opts.timeout)?;
        let sh = &self.shared;
        let qid = sh
            .free_qids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .pop()
            .ok_or_else(|| CtrlrError::NoFreeQueue {
                transport: sh.describe.clone(),
                granted: sh.queues_granted,
            })?;
        let give_back = |sh: &CtrlrShared| {
            sh.free_qids
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(qid)
        };
        let result = self.build_qpair(qid, opts);
        if result.is_err() {
            give_back(sh);
        }
        result
    }

    fn build_qpair(&self, qid: u16, opts: &QpairOptions) -> Result<IoQpair, CtrlrError> {
        let sh = &self.shared;
        let depth = opts.depth.clamp(
            2,
            sh.cap
                .max_queue_entries()
                .min(crate::qpair::MAX_TRACKERS + 1),
        ) as u16;
        let max_cmd = opts
            .max_command_bytes
            .min(sh.max_command_bytes)
            .max(PAGE_SIZE as u64);
        // Worst case a command starts mid-page: one PRP entry per page plus one.
        let list_entries = (max_cmd as usize).div_ceil(PAGE_SIZE).max(1);
        let ppt = prp::list_pages_for(list_entries);
        let trackers = depth as usize - 1;
        let prp_mem = sh.pool.alloc(trackers.max(1) * ppt * PAGE_SIZE)?;
        let sq = SqRing::new(&sh.pool, depth)?;
        let cq = CqRing::new(&sh.pool, depth)?;
        let sq_db = sh.bar.doorbell(qid, DoorbellKind::SqTail)?;
        let cq_db = sh.bar.doorbell(qid, DoorbellKind::CqHead)?;
        let dstrd = sh.cap.dstrd();
        let shadow = sh.shadow.as_ref().and_then(|pages| {
            let s = ShadowSlot::new(
                pages,
                shadow_doorbell_index(dstrd, qid, DoorbellKind::SqTail),
            )?;
            let c = ShadowSlot::new(
                pages,
                shadow_doorbell_index(dstrd, qid, DoorbellKind::CqHead),
            )?;
            // A queue with this QID may have lived and died before: its last tail, head
            // and EventIdx are still there, and the controller reads them as current
            // (QEMU does), so a new queue starting at 0 must zero them first.
            s.reset();
            c.reset();
            Some((s, c))
        });
        sh.admin(Sqe::create_io_cq(qid, depth, cq.iova()))?;
        if let Err(e) = sh.admin(Sqe::create_io_sq(qid, depth, qid, sq.iova())) {
            let _ = sh.admin(Sqe::delete_io_cq(qid));
            return Err(e);
        }
        Ok(IoQpair::new(
            Arc::clone(sh),
            QpairParts {
                qid,
                sq,
                cq,
                sq_db,
                cq_db,
                shadow,
                prp_mem,
                prp_pages_per_tracker: ppt,
                max_command_bytes: max_cmd,
            },
            opts,
        ))
    }
}

/// An NVMe namespace as a [`crate::target::Target`].
pub struct NvmeNamespace {
    ctrlr: Controller,
    info: crate::target::TargetInfo,
    qpair_defaults: QpairOptions,
}

impl NvmeNamespace {
    /// The namespace `nsid` of `ctrlr`.
    /// Fails with [`CtrlrError::UnsupportedFormat`] when the driver does not implement the
    /// namespace's format.
    pub fn new(ctrlr: Controller, nsid: u32) -> Result<Self, CtrlrError> {
        let ns = ctrlr.namespace(nsid)?.clone();
        if let Some(u) = ns.unsupported {
            return Err(CtrlrError::UnsupportedFormat {
                transport: ctrlr.describe().to_string(),
                source: u,
            });
        }
        let id = ctrlr.identify();
        let info = crate::target::TargetInfo {
            name: format!("{} ns{nsid}", ctrlr.describe()),
            nsid,
            block_size: ns.block_size,
            num_blocks: ns.num_blocks,
            max_transfer_bytes: ctrlr.max_transfer_bytes(),
            write_zeroes: ns.write_zeroes,
            deallocate: ns.deallocate,
            deallocate_reads_zeroes: ns.identify.deallocated_reads_zeroes(),
            flush: id.has_volatile_write_cache(),
            read_only: false,
        };
        let qpair_defaults = QpairOptions {
            timeout: ctrlr.io_timeout(),
            ..QpairOptions::default()
        };
        Ok(NvmeNamespace {
            ctrlr,
            info,
            qpair_defaults,
        })
    }
    /// The controller.
    pub fn controller(&self) -> &Controller {
        &self.ctrlr
    }
    /// Sets the qpair options used by [`crate::target::Target::create_queue`] for what
    /// [`crate::target::QueueOptions`] does not say.
    pub fn set_qpair_defaults(&mut self, opts: QpairOptions) {
        self.qpair_defaults = opts;
    }
}

impl crate::target::Target for NvmeNamespace {
    fn info(&self) -> &crate::target::TargetInfo {
        &self.info
    }
    fn dma_pool(&self) -> &DmaPool {
        self.ctrlr.dma_pool()
    }
    fn create_queue(
        &self,
        opts: &crate::target::QueueOptions,
    ) -> Result<Box<dyn crate::target::TargetQueue>, crate::Error> {
        let q = QpairOptions {
            depth: opts.depth,
            sw_queue_depth: opts.sw_queue_depth,
            doorbell: if opts.immediate_doorbell {
                crate::qpair::DoorbellMode::Immediate
            } else {
                crate::qpair::DoorbellMode::Batched
            },
            shadow_doorbells: opts.shadow_doorbells,
            timeout: opts.timeout.unwrap_or(self.qpair_defaults.timeout),
            ..self.qpair_defaults.clone()
        };
        Ok(Box::new(self.ctrlr.create_io_qpair(&q)?))
    }
}

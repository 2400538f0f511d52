//! The controller handle: bring-up, identity, admin commands, reset, and the creation of
//! I/O queue pairs.
//!
//! Bring-up is the state machine of `init` ([`InitState`] names each state in errors);
//! the state a controller shares with its qpairs lives in `shared`; the admin queue in
//! `admin`. This module is their public face: [`Controller`] and the types its methods
//! take and return.

use std::sync::Arc;
use std::time::Duration;

use crate::hw::dma::{DmaPool, DmaPoolOptions};
use crate::hw::transport::Transport;
use crate::spec::identify::SMART_LOG_SIZE;
use crate::spec::regs::shadow_doorbell_index;
use crate::spec::{
    lid, Cap, Cqe, Csts, DoorbellKind, ErrorLogEntry, IdentifyController, SmartLog, Sqe, Vs,
    NSID_ALL, PAGE_SIZE,
};

use super::init::Bringup;
use super::prp;
use super::qpair::{IoQpair, QpairOptions, QpairParts, MAX_TRACKERS, MIN_TIMEOUT};
use super::ring::{RingPair, ShadowSlot};
use super::shared::CtrlrShared;

pub use super::init::{ControllerOptions, NsInfo};
pub use super::shared::CtrlrState;
pub use super::{CtrlrError, InitState};

/// Refuses a timeout shorter than [`MIN_TIMEOUT`].
fn check_timeout(option: &'static str, d: Duration) -> Result<(), CtrlrError> {
    if d < MIN_TIMEOUT {
        return Err(CtrlrError::BadOption {
            option,
            value: format!("{d:?}"),
            why: format!("a timeout must be at least {MIN_TIMEOUT:?}"),
        });
    }
    Ok(())
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

impl Controller {
    /// Brings up the controller behind `transport` (every [`InitState`] in turn).
    pub fn new(transport: Arc<dyn Transport>, opts: ControllerOptions) -> Result<Self, CtrlrError> {
        check_timeout("ControllerOptions::admin_timeout", opts.admin_timeout)?;
        check_timeout("ControllerOptions::io_timeout", opts.io_timeout)?;
        let describe = transport.describe();
        let bar = transport.bar();
        let pool = DmaPool::new(
            transport.mapper(),
            DmaPoolOptions {
                page_kind: transport.page_kind(),
                region_len: 2 << 20,
                max_bytes: opts.dma_max_bytes,
            },
        );
        let (learned, admin) = Bringup::first(&bar, &pool, &opts, &describe).run()?;
        let admin = admin.expect("a first bring-up makes the admin queue");
        let shared = CtrlrShared::new(transport, bar, pool, admin, learned, opts, describe);
        tracing::info!(
            "{}: ready: {} {} fw {} vs {}, {} i/o queues, {} namespaces",
            shared.describe,
            shared.identify.mn,
            shared.identify.sn,
            shared.identify.fr,
            shared.vs,
            shared.queues_granted,
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
    pub fn csts(&self) -> Csts {
        self.shared.bar.csts()
    }

    /// Runs an admin command with no data (or data the caller's `buf` supplies and
    /// receives: up to 4 KiB read back). Returns the completion entry.
    ///
    /// # Safety
    /// The SQE goes to the controller as given (but for its CID and, with `buf`, PRP1),
    /// and an admin command can make the controller read or write any address it names
    /// (PRPs, MPTR, the base of a queue it creates). Every such address must be memory
    /// that stays allocated and used by nothing else until the controller is done with it
    /// (the command's completion; for a queue it creates, until that queue is deleted), or
    /// the command must be one the controller refuses before any transfer. With `buf`, the
    /// transfer the command describes must fit in 4 KiB (one page, PRP2 unused).
    pub unsafe fn admin_command(
        &self,
        sqe: Sqe,
        buf: Option<&mut [u8]>,
    ) -> Result<Cqe, CtrlrError> {
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
        self.shared.resets()
    }

    /// The admin command timeout ([`ControllerOptions::admin_timeout`]).
    pub fn admin_timeout(&self) -> Duration {
        self.shared.opts().admin_timeout
    }

    /// The default I/O command timeout of its namespaces' queues
    /// ([`ControllerOptions::io_timeout`]).
    pub fn io_timeout(&self) -> Duration {
        self.shared.opts().io_timeout
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
        let depth = opts
            .depth
            .clamp(2, sh.cap.max_queue_entries().min(MAX_TRACKERS + 1)) as u16;
        let max_cmd = opts
            .max_command_bytes
            .min(sh.max_command_bytes)
            .max(PAGE_SIZE as u64);
        // Worst case a command starts mid-page: one PRP entry per page plus one.
        let list_entries = (max_cmd as usize).div_ceil(PAGE_SIZE).max(1);
        let ppt = prp::list_pages_for(list_entries);
        let trackers = (depth as usize - 1).max(1);
        // The trackers' PRP list pages, in as few buffers as the mapper allows: each buffer
        // must be IOVA-contiguous, which in noiommu mode means one hugepage (2 MiB, 512
        // pages), less than a deep queue's trackers need (2047 x 4 KiB for QEMU's 2048).
        let per_tracker = ppt * PAGE_SIZE;
        let per_chunk = (sh.pool.max_contiguous() / per_tracker).clamp(1, trackers);
        let prp_mem = (0..trackers.div_ceil(per_chunk))
            .map(|c| {
                let n = per_chunk.min(trackers - c * per_chunk);
                sh.pool.alloc(n * per_tracker)
            })
            .collect::<Result<Vec<_>, _>>()?;
        let rings = RingPair::new(&sh.pool, depth)?;
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
        let irq = if opts.interrupts {
            self.interrupt_for(qid)
        } else {
            None
        };
        sh.create_io_queue(
            qid,
            depth,
            rings.sq_iova(),
            rings.cq_iova(),
            irq.as_ref().map(|(v, _)| *v),
        )?;
        Ok(IoQpair::new(
            Arc::clone(sh),
            QpairParts {
                qid,
                rings,
                sq_db,
                cq_db,
                shadow,
                prp_mem,
                prp_trackers_per_buf: per_chunk,
                prp_pages_per_tracker: ppt,
                max_command_bytes: max_cmd,
                irq,
            },
            opts,
        ))
    }

    /// The interrupt vector for queue `qid` (the vector with its number: each queue has
    /// its own, so one eventfd never wakes two pollers) and its eventfd, or `None` with a
    /// warning when the transport cannot give it.
    fn interrupt_for(&self, qid: u16) -> Option<(u16, Arc<std::os::fd::OwnedFd>)> {
        let sh = &self.shared;
        let n = sh.transport.interrupt_vectors();
        if qid >= n {
            tracing::warn!(
                "{}: no interrupt vector for qid {qid} ({n} vectors); the queue is polled only",
                sh.describe
            );
            return None;
        }
        match sh.transport.interrupt(qid) {
            Ok(fd) => Some((qid, fd)),
            Err(e) => {
                tracing::warn!(
                    "{}: routing interrupt vector {qid} failed ({e}); the queue is polled only",
                    sh.describe
                );
                None
            }
        }
    }
}

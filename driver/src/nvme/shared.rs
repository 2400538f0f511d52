//! The controller state that the [`Controller`](super::ctrlr::Controller) handles and the
//! I/O queue pairs share: what bring-up learnt, the admin queue, the free queue
//! identifiers, and the reset epoch qpairs watch. Both sides import it; it imports
//! neither, which is what keeps the controller and its qpairs free of a cycle.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::hw::dma::DmaPool;
use crate::hw::mmio::Bar;
use crate::hw::transport::Transport;
use crate::spec::{Cap, Cqe, Csts, IdentifyController, Sqe, Vs};

use super::admin::{AdminQueue, AdminWait};
use super::init::{shut_down, Bringup, ControllerOptions, Learned, NsInfo};
use super::ring::ShadowPages;
use super::{CtrlrError, InitState};

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

/// The controller state shared by `Controller` handles and its qpairs.
pub(crate) struct CtrlrShared {
    pub(super) bar: Arc<Bar>,
    pub(super) cap: Cap,
    pub(super) vs: Vs,
    pub(super) pool: DmaPool,
    admin: Mutex<AdminQueue>,
    pub(super) identify: IdentifyController,
    pub(super) namespaces: Vec<NsInfo>,
    pub(super) free_qids: Mutex<Vec<u16>>,
    pub(super) queues_granted: u16,
    pub(super) shadow: Option<Arc<ShadowPages>>,
    pub(super) max_command_bytes: u64,
    removed: AtomicBool,
    /// Reset generation (bits 63:8) and [`CtrlrState`] (bits 7:0), read by qpairs once per
    /// poll and per doorbell batch.
    epoch: AtomicU64,
    reset_lock: Mutex<()>,
    /// Resets started (see `Controller::resets`).
    resets: AtomicU64,
    ready_limit: Duration,
    opts: ControllerOptions,
    pub(super) describe: String,
    // Dropped last: the pool's regions are unmapped through it.
    pub(super) transport: Arc<dyn Transport>,
}

impl CtrlrShared {
    /// The state of a controller that bring-up left ready.
    pub(super) fn new(
        transport: Arc<dyn Transport>,
        bar: Arc<Bar>,
        pool: DmaPool,
        admin: AdminQueue,
        learned: Learned,
        opts: ControllerOptions,
        describe: String,
    ) -> Self {
        let granted = learned.queues_granted;
        CtrlrShared {
            bar,
            cap: learned.cap,
            vs: learned.vs,
            pool,
            admin: Mutex::new(admin),
            identify: learned.identify,
            namespaces: learned.namespaces,
            free_qids: Mutex::new((1..=granted).rev().collect()),
            queues_granted: granted,
            shadow: learned.shadow,
            max_command_bytes: learned.max_command_bytes,
            removed: AtomicBool::new(false),
            epoch: AtomicU64::new(CtrlrState::Ready as u64),
            reset_lock: Mutex::new(()),
            resets: AtomicU64::new(0),
            ready_limit: learned.ready_limit,
            opts,
            describe,
            transport,
        }
    }

    /// The namespace with this NSID.
    pub(crate) fn ns_info(&self, nsid: u32) -> Option<&NsInfo> {
        let i = (nsid as usize).wrapping_sub(1);
        match self.namespaces.get(i) {
            Some(n) if n.nsid == nsid => Some(n),
            _ => self.namespaces.iter().find(|n| n.nsid == nsid),
        }
    }

    fn lock_admin(&self) -> MutexGuard<'_, AdminQueue> {
        self.admin.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs one admin command (with its data copied into `out`, at most 4 KiB) within
    /// `timeout`. A device found gone marks the controller removed.
    fn admin_with(
        &self,
        sqe: Sqe,
        out: Option<&mut [u8]>,
        timeout: Duration,
    ) -> Result<Cqe, CtrlrError> {
        let wait = AdminWait {
            bar: &self.bar,
            describe: &self.describe,
            timeout,
        };
        let mut q = self.lock_admin();
        let r = match out {
            Some(out) => q.execute_read(sqe, out, &wait),
            None => q.execute(sqe, &wait),
        };
        if let Err(CtrlrError::DeviceRemoved { .. }) = r {
            self.mark_removed();
        }
        r
    }

    /// Runs an admin command with no data.
    pub(super) fn admin(&self, sqe: Sqe) -> Result<Cqe, CtrlrError> {
        self.admin_with(sqe, None, self.opts.admin_timeout)
    }

    /// Runs an admin command whose data (at most 4 KiB) is copied into `out`.
    pub(super) fn admin_read(&self, sqe: Sqe, out: &mut [u8]) -> Result<Cqe, CtrlrError> {
        self.admin_with(sqe, Some(out), self.opts.admin_timeout)
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

    /// Resets started since bring-up.
    pub(super) fn resets(&self) -> u64 {
        self.resets.load(Ordering::Relaxed)
    }

    /// The options the controller was brought up with.
    pub(super) fn opts(&self) -> &ControllerOptions {
        &self.opts
    }

    /// Whether the device was found gone.
    pub(super) fn is_removed(&self) -> bool {
        self.removed.load(Ordering::Relaxed)
    }

    /// Resets the controller: bring-up again from [`InitState::Disable`] (disable,
    /// re-enable with the admin queue, Set Features (Number of Queues) and Doorbell
    /// Buffer Config again). I/O queues are recreated by each qpair on its own thread when
    /// it sees the new epoch. `seen_epoch` is the epoch the caller saw: if another thread
    /// reset the controller since, this returns at once. Returns whether this call reset
    /// the controller (false: another thread had).
    pub(crate) fn reset_from(&self, seen_epoch: Option<u64>) -> Result<bool, CtrlrError> {
        let _g = self.reset_lock.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(seen) = seen_epoch {
            let now = self.epoch();
            if now >> 8 != seen >> 8 && CtrlrState::from_epoch(now) == CtrlrState::Ready {
                return Ok(false);
            }
        }
        if self.is_removed() || self.bar.csts().is_all_ones() {
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

    /// Bring-up after a reset, with what the first one learnt.
    fn reinit(&self) -> Result<(), CtrlrError> {
        let mut q = self.lock_admin();
        let learned = Learned {
            cap: self.cap,
            vs: self.vs,
            ready_limit: self.ready_limit,
            queues_granted: self.queues_granted,
            shadow: self.shadow.clone(),
            ..Learned::default()
        };
        Bringup::reset(
            &self.bar,
            &self.pool,
            &self.opts,
            &self.describe,
            &mut q,
            learned,
        )
        .run()?;
        Ok(())
    }

    /// Creates the CQ and SQ of `qid` (the CQ is deleted again if the SQ fails); the CQ
    /// with interrupts enabled on `vector` when there is one.
    pub(crate) fn create_io_queue(
        &self,
        qid: u16,
        depth: u16,
        sq_iova: u64,
        cq_iova: u64,
        vector: Option<u16>,
    ) -> Result<(), CtrlrError> {
        let cq = match vector {
            Some(iv) => Sqe::create_io_cq_interrupts(qid, depth, cq_iova, iv),
            None => Sqe::create_io_cq(qid, depth, cq_iova),
        };
        self.admin(cq)?;
        if let Err(e) = self.admin(Sqe::create_io_sq(qid, depth, qid, sq_iova)) {
            let _ = self.admin(Sqe::delete_io_cq(qid));
            return Err(e);
        }
        Ok(())
    }

    /// CSTS right now.
    pub(crate) fn csts(&self) -> Csts {
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
        let cqe = self.admin_with(Sqe::abort(sqid, cid), None, timeout)?;
        Ok(cqe.dw0 & 1 == 0)
    }

    /// Deletes the SQ and CQ of `qid` and returns the identifier to the free list. Returns
    /// whether the controller is known to be done with the queue's commands (both deletes
    /// succeeded: Delete I/O SQ completes or aborts every command of the queue; or the
    /// device is gone); false when a delete failed with the device still there, and its
    /// memory must not be reused.
    pub(crate) fn release_io_queue(&self, qid: u16, device_gone: bool) -> bool {
        let mut quiesced = true;
        if !device_gone && !self.is_removed() {
            for sqe in [Sqe::delete_io_sq(qid), Sqe::delete_io_cq(qid)] {
                if let Err(e) = self.admin(sqe) {
                    tracing::warn!("{}: deleting qid {qid}: {e}", self.describe);
                    // A device that was removed meanwhile does no more DMA.
                    quiesced &= self.is_removed();
                }
            }
        }
        self.free_qids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(qid);
        quiesced
    }

    /// Sends Abort for `cid` on `sqid`. Returns whether the controller says it aborted it
    /// (CQE dword 0 bit 0 clear).
    pub(crate) fn abort(&self, sqid: u16, cid: u16) -> Result<bool, CtrlrError> {
        let cqe = self.admin(Sqe::abort(sqid, cid))?;
        Ok(cqe.dw0 & 1 == 0)
    }

    fn shutdown(&self) {
        if self.is_removed() {
            return;
        }
        shut_down(&self.bar, self.cap, &self.describe);
    }
}

impl Drop for CtrlrShared {
    fn drop(&mut self) {
        self.shutdown();
    }
}

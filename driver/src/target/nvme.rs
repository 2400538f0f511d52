//! An NVMe namespace as a [`Target`]: each queue is an I/O queue pair of its controller.

use crate::hw::dma::{DmaBuf, DmaPool, DmaSlice, LeaseError, Leases, LeasesMut};
use crate::io::{AbortOutcome, Completion, IoRequest, QueueStats, SubmitError};
use crate::nvme::ctrlr::{Controller, CtrlrError};
use crate::nvme::qpair::{DoorbellMode, IoQpair, QpairOptions};

use super::{QueueInUse, QueueOptions, Target, TargetError, TargetInfo, TargetQueue};

/// An NVMe namespace as a [`Target`].
pub struct NvmeNamespace {
    ctrlr: Controller,
    info: TargetInfo,
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
        let info = TargetInfo {
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
            metadata: ns.protection.layout(),
            zones: ns.zones,
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
    /// Sets the qpair options used by [`Target::create_queue`] for what
    /// [`QueueOptions`] does not say.
    pub fn set_qpair_defaults(&mut self, opts: QpairOptions) {
        self.qpair_defaults = opts;
    }
}

impl Target for NvmeNamespace {
    fn info(&self) -> &TargetInfo {
        &self.info
    }
    fn dma_pool(&self) -> &DmaPool {
        self.ctrlr.dma_pool()
    }
    fn create_queue(&self, opts: &QueueOptions) -> Result<Box<dyn TargetQueue>, TargetError> {
        let q = QpairOptions {
            depth: opts.depth,
            sw_queue_depth: opts.sw_queue_depth,
            doorbell: if opts.immediate_doorbell {
                DoorbellMode::Immediate
            } else {
                DoorbellMode::Batched
            },
            shadow_doorbells: opts.shadow_doorbells,
            timeout: opts.timeout.unwrap_or(self.qpair_defaults.timeout),
            interrupts: opts.interrupts || self.qpair_defaults.interrupts,
            ..self.qpair_defaults.clone()
        };
        Ok(Box::new(self.ctrlr.create_io_qpair(&q)?))
    }
}

impl TargetQueue for IoQpair {
    fn submit(&mut self, req: IoRequest) -> Result<(), SubmitError> {
        IoQpair::submit_ref(self, &req)
    }
    fn submit_ref(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        IoQpair::submit_ref(self, req)
    }
    unsafe fn submit_unchecked(&mut self, req: &IoRequest) -> Result<(), SubmitError> {
        // SAFETY: the caller keeps the memory of `req` as this trait method's contract
        // says, which is IoQpair::submit_unchecked's contract word for word (the target's
        // pool is the controller's pool).
        unsafe { IoQpair::submit_unchecked(self, req) }
    }
    fn leases(&self) -> &Leases {
        IoQpair::leases(self)
    }
    fn leases_mut(&mut self) -> LeasesMut<'_> {
        IoQpair::leases_mut(self)
    }
    fn reclaim(&mut self, s: &DmaSlice) -> Result<DmaBuf, LeaseError> {
        IoQpair::reclaim(self, s)
    }
    fn release(&mut self, s: &DmaSlice) -> Result<(), LeaseError> {
        IoQpair::release(self, s)
    }
    fn flush(&mut self) {
        IoQpair::flush(self)
    }
    fn poll(&mut self, max: u32, done: &mut dyn FnMut(Completion)) -> u32 {
        let max = if max == 0 {
            self.default_max_completions()
        } else {
            max
        };
        self.process_completions(max, done)
    }
    fn outstanding(&self) -> u32 {
        IoQpair::outstanding(self)
    }
    fn stats(&self) -> QueueStats {
        IoQpair::stats(self)
    }
    fn in_use(&self) -> Option<QueueInUse> {
        Some(QueueInUse {
            depth: self.depth() as u32,
            slots: self.slots() as u32,
            shadow_doorbells: self.uses_shadow_doorbells(),
            timeout: Some(self.timeout()),
            interrupts: self.interrupt_fd().is_some(),
        })
    }
    fn interrupt_fd(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        IoQpair::interrupt_fd(self)
    }
    fn arm_interrupt(&mut self) -> bool {
        IoQpair::arm_interrupt(self)
    }
    fn cancel_queued(&mut self, token: u64) -> bool {
        IoQpair::cancel_queued(self, token)
    }
    fn abort(&mut self, token: u64) -> AbortOutcome {
        IoQpair::abort(self, token)
    }
}

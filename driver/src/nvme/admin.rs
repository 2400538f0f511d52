//! The admin queue: one command at a time, submitted and waited for synchronously.
//!
//! It is used for bring-up and for rare recovery actions (Abort, queue creation after a
//! reset), never on the I/O path; its owner keeps it under a mutex.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::hw::dma::{DmaBuf, DmaPool};
use crate::hw::mmio::{Bar, Doorbell};
use crate::spec::{admin_opc, Cqe, DoorbellKind, Sqe, PAGE_SIZE};

use super::ring::RingPair;
use super::{CtrlrError, InitState};

/// The admin submission and completion queues (QID 0), with a scratch page for the data
/// of commands that return some (Identify, Get Log Page).
pub(super) struct AdminQueue {
    rings: RingPair,
    sq_db: Doorbell,
    cq_db: Doorbell,
    next_cid: u16,
    scratch: DmaBuf,
}

/// What an admin command waits with: the controller's registers (CSTS, when a command
/// does not complete), its name for messages, and the bound on the wait.
pub(super) struct AdminWait<'a> {
    pub bar: &'a Bar,
    pub describe: &'a str,
    pub timeout: Duration,
}

/// A short name of an admin opcode, for messages.
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

/// Waits with a bounded backoff: spin, then yield, then sleep up to 1 ms.
pub(super) fn backoff(round: &mut u32) {
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

impl AdminQueue {
    /// Allocates the admin rings of `entries` slots each and the scratch page.
    pub(super) fn new(bar: &Arc<Bar>, pool: &DmaPool, entries: u16) -> Result<Self, CtrlrError> {
        Ok(AdminQueue {
            sq_db: bar.doorbell(0, DoorbellKind::SqTail)?,
            cq_db: bar.doorbell(0, DoorbellKind::CqHead)?,
            rings: RingPair::new(pool, entries)?,
            next_cid: 0,
            scratch: pool.alloc(PAGE_SIZE)?,
        })
    }

    /// Slots in each ring.
    pub(super) fn entries(&self) -> u16 {
        self.rings.depth()
    }
    /// IOVA of the submission ring (ASQ).
    pub(super) fn sq_iova(&self) -> u64 {
        self.rings.sq_iova()
    }
    /// IOVA of the completion ring (ACQ).
    pub(super) fn cq_iova(&self) -> u64 {
        self.rings.cq_iova()
    }

    /// Zeroes the completion ring and rewinds both rings to slot 0, as a controller that
    /// was just disabled expects them. Only while the controller is disabled.
    pub(super) fn rewind(&mut self) {
        self.rings.rewind();
    }

    /// Submits `sqe` and waits for its completion, at most `wait.timeout`. A failed status
    /// is [`CtrlrError::AdminCommand`]; no completion in time is
    /// [`CtrlrError::DeviceRemoved`] (registers read all ones), [`CtrlrError::Fatal`]
    /// (CSTS.CFS) or [`CtrlrError::AdminTimeout`].
    pub(super) fn execute(
        &mut self,
        mut sqe: Sqe,
        wait: &AdminWait<'_>,
    ) -> Result<Cqe, CtrlrError> {
        let opcode = opcode_name(sqe.opc());
        let cid = self.next_cid;
        self.next_cid = self.next_cid.wrapping_add(1) & 0x7FFF;
        sqe.set_cid(cid);
        self.rings.push(&sqe);
        self.sq_db.ring(self.rings.sq_tail() as u32);
        let start = Instant::now();
        let mut round = 0;
        loop {
            if let Some(reaped) = self.rings.pop() {
                self.cq_db.ring(self.rings.cq_head() as u32);
                let cqe = reaped.to_cqe();
                if cqe.cid != cid {
                    tracing::warn!(
                        cid = cqe.cid,
                        expected = cid,
                        "{}: ignoring admin completion for cid {} while waiting for cid {cid}",
                        wait.describe,
                        cqe.cid
                    );
                    continue;
                }
                let status = cqe.status();
                if !status.is_success() {
                    return Err(CtrlrError::AdminCommand {
                        transport: wait.describe.to_string(),
                        opcode,
                        status,
                    });
                }
                return Ok(cqe);
            }
            if start.elapsed() > wait.timeout {
                return Err(Self::no_completion(opcode, cid, wait));
            }
            backoff(&mut round);
        }
    }

    /// Why a command got no completion in time: the device is gone, fatal, or slow.
    fn no_completion(opcode: &'static str, cid: u16, wait: &AdminWait<'_>) -> CtrlrError {
        let csts = wait.bar.csts();
        let transport = wait.describe.to_string();
        if csts.is_all_ones() {
            return CtrlrError::DeviceRemoved {
                state: InitState::Ready,
                transport,
            };
        }
        if csts.cfs() {
            return CtrlrError::Fatal {
                state: InitState::Ready,
                transport,
            };
        }
        CtrlrError::AdminTimeout {
            transport,
            opcode,
            cid,
            timeout_ms: wait.timeout.as_millis() as u64,
        }
    }

    /// Runs a command whose data (at most 4 KiB) lands in the scratch page, and copies it
    /// into `out`.
    pub(super) fn execute_read(
        &mut self,
        mut sqe: Sqe,
        out: &mut [u8],
        wait: &AdminWait<'_>,
    ) -> Result<Cqe, CtrlrError> {
        assert!(out.len() <= PAGE_SIZE);
        self.scratch.fill(0);
        sqe.prp1 = self.scratch.iova();
        let cqe = self.execute(sqe, wait)?;
        self.scratch.read_at(0, out)?;
        Ok(cqe)
    }
}

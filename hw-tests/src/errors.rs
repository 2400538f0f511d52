//! The error cases: the statuses the device reports (and the driver's own refusals) for
//! an invalid namespace, an LBA out of range, an invalid opcode, bad queue creation.

use kestrel::io::{InvalidRequest, IoRequest, SubmitError};
use kestrel::nvme::ctrlr::CtrlrError;
use kestrel::spec::{Sqe, Status};

use crate::blocks::Blocks;
use crate::support::{alloc, expect_nvme, qpair, raw_status, raw_status_with};
use crate::{CaseResult, Ctx, Outcome};

pub(crate) fn error_invalid_nsid(t: &mut Ctx) -> CaseResult {
    let c = t.open()?;
    let buf = alloc(c, 4096)?;
    let bad = c.identify().nn.saturating_add(1).max(2);
    let (r, buf) = raw_status_with(c, Sqe::read(bad, 0, 1, 0, 0), buf, 4096, 0)?;
    expect_nvme(r, Status::INVALID_NAMESPACE_OR_FORMAT, "read of nsid NN+1")?;
    // And the driver refuses it before the device when asked through the checked path.
    let mut qp = qpair(c, 8)?;
    let buf = qp.lend(buf).map_err(|e| e.to_string())?;
    match qp.submit(IoRequest::read(bad, 0, 1, buf, 1)) {
        Err(SubmitError::Invalid {
            reason: InvalidRequest::InactiveNamespace { .. },
            ..
        }) => {}
        other => return Err(format!("driver accepted an inactive nsid: {other:?}").into()),
    }
    Ok(Outcome::Pass)
}

pub(crate) fn error_lba_range(t: &mut Ctx) -> CaseResult {
    let ns = t.ns()?;
    let c = t.open()?;
    let (nsid, nsze, hb, md) = (ns.nsid, ns.num_blocks, ns.host_block(), ns.md_block());
    // One buffer (data, and the metadata at the page after it), lent to each queue in turn (each
    // raw command gets a fresh qpair). The metadata pointer is given where the format has
    // separate metadata, so a controller that moved data before checking the range would
    // not write through address 0.
    // Two blocks across the end, where they fit one command (a controller may check MDTS
    // first); else one block past it.
    let buf = alloc(c, 16384 + 2 * md)?;
    let (slba, n, what) = if 2 * hb as u64 <= ns.max_command_bytes {
        (nsze - 1, 2, "read across the end")
    } else {
        (nsze, 1, "read past the end")
    };
    let sqe = Sqe::read(nsid, slba, n, 0, 0);
    let (r, buf) = raw_status_with(c, sqe, buf, n as usize * hb, n as usize * md)?;
    expect_nvme(r, Status::LBA_OUT_OF_RANGE, what)?;
    let (r, _buf) = raw_status_with(c, Sqe::write(nsid, nsze, 1, 0, 0), buf, hb, md)?;
    expect_nvme(r, Status::LBA_OUT_OF_RANGE, "write past the end")?;
    let mut qp = qpair(c, 8)?;
    let b = Blocks::lend(c.dma_pool(), &mut qp, ns, 1)?;
    match qp.submit(ns.read_req(nsze, &b, true, 1)) {
        Err(SubmitError::Invalid {
            reason: InvalidRequest::OutOfRange { .. },
            ..
        }) => {}
        other => return Err(format!("driver accepted an out-of-range lba: {other:?}").into()),
    }
    Ok(Outcome::Pass)
}

pub(crate) fn error_invalid_opcode(t: &mut Ctx) -> CaseResult {
    let ns = t.ns()?;
    let c = t.open()?;
    let mut sqe = Sqe::new(0x7E);
    sqe.nsid = ns.nsid;
    expect_nvme(
        raw_status(c, sqe)?,
        Status::INVALID_OPCODE,
        "nvm opcode 7Eh",
    )?;
    // SAFETY: opcode 7Fh names no memory (all its address fields are zero), so whatever
    // the controller makes of it, it transfers nothing.
    match unsafe { c.admin_command(Sqe::new(0x7F), None) } {
        Err(CtrlrError::AdminCommand { status, .. })
            if status.same_code(Status::INVALID_OPCODE) => {}
        other => {
            return Err(
                format!("admin opcode 7Fh: expected Invalid Command Opcode, got {other:?}").into(),
            )
        }
    }
    Ok(Outcome::Pass)
}

pub(crate) fn error_queue_creation(t: &mut Ctx) -> CaseResult {
    let c = t.open_with(|o| o.io_queues = 2)?;
    let mut mem = alloc(c, 1 << 20)?;
    let base = mem.iova();
    let mut created = false;
    let mut check = |sqe: Sqe, want: Status, what: &str| -> Result<(), String> {
        // SAFETY: every queue these commands could create lies in `mem` (1 MiB of the
        // controller's pool, used by nothing else), and if the controller creates one
        // against the spec, `mem` is leaked below instead of freed, so its queue memory
        // stays allocated for as long as the controller might use it.
        match unsafe { c.admin_command(sqe, None) } {
            Err(CtrlrError::AdminCommand { status, .. }) if status.same_code(want) => Ok(()),
            other => {
                created |= other.is_ok();
                Err(format!("{what}: expected {want}, got {other:?}"))
            }
        }
    };
    let mut r = check(
        Sqe::create_io_cq(0, 16, base),
        Status::INVALID_QUEUE_IDENTIFIER,
        "cq qid 0",
    );
    let mqes = c.cap().max_queue_entries();
    if r.is_ok() && mqes < 65536 {
        r = check(
            Sqe::create_io_cq(1, (mqes + 1) as u16, base),
            Status::INVALID_QUEUE_SIZE,
            "cq above MQES",
        );
    }
    if r.is_ok() {
        r = check(
            Sqe::create_io_sq(1, 16, 1, base),
            Status::COMPLETION_QUEUE_INVALID,
            "sq for a missing cq",
        );
    }
    if created {
        mem.leak();
    }
    r?;
    Ok(Outcome::Pass)
}

//! The controller cases: bring-up and shutdown, Identify, the SMART and error log pages,
//! reset and reinitialisation, Abort.

use kestrel::io::IoRequest;
use kestrel::nvme::ctrlr::CtrlrError;
use kestrel::spec::Sqe;

use crate::blocks::{Blocks, Space};
use crate::support::{alloc, must, pattern, qpair, raw_status_with};
use crate::verify::read_compare;
use crate::{CaseResult, Ctx, Outcome};

pub(crate) fn bring_up_and_shutdown(t: &mut Ctx) -> CaseResult {
    let c = t.open()?;
    ensure!(c.csts().rdy(), "CSTS.RDY clear after bring-up");
    ensure!(!c.csts().cfs(), "CSTS.CFS set after bring-up");
    // Shut down and closed; a second bring-up, on the device opened again, must work too.
    t.close();
    let c = t.open()?;
    ensure!(c.csts().rdy(), "CSTS.RDY clear after second bring-up");
    Ok(Outcome::Pass)
}

pub(crate) fn identify_controller(t: &mut Ctx) -> CaseResult {
    let c = t.open()?;
    let id = c.identify();
    ensure!(!id.mn.trim().is_empty(), "empty model number");
    ensure!(!id.sn.trim().is_empty(), "empty serial number");
    ensure!(
        id.sqes & 0xF == 6 && id.sqes >> 4 >= 6,
        "SQES {:#x}",
        id.sqes
    );
    ensure!(
        id.cqes & 0xF == 4 && id.cqes >> 4 >= 4,
        "CQES {:#x}",
        id.cqes
    );
    ensure!(id.nn >= 1, "NN {}", id.nn);
    let vs = c.version();
    ensure!(vs.mjr() >= 1, "VS {vs}");
    ensure!(c.cap().mqes() >= 1, "MQES {}", c.cap().mqes());
    if let Some(m) = id.max_transfer_bytes(c.cap().mpsmin()) {
        ensure!(m >= 4096, "MDTS {} bytes", m);
    }
    Ok(Outcome::Pass)
}

pub(crate) fn identify_namespaces(t: &mut Ctx) -> CaseResult {
    let c = t.open()?;
    let nss = c.namespaces();
    ensure!(!nss.is_empty(), "no active namespaces");
    for ns in nss {
        let id = &ns.identify;
        ensure!(id.nsze > 0, "nsid {} NSZE 0", ns.nsid);
        ensure!(
            id.ncap <= id.nsze,
            "nsid {} NCAP {} > NSZE {}",
            ns.nsid,
            id.ncap,
            id.nsze
        );
        ensure!(
            id.nuse <= id.ncap,
            "nsid {} NUSE {} > NCAP {}",
            ns.nsid,
            id.nuse,
            id.ncap
        );
        ensure!(
            id.lba_format_index() <= id.nlbaf as usize,
            "nsid {} FLBAS {:#x} beyond NLBAF {}",
            ns.nsid,
            id.flbas,
            id.nlbaf
        );
        for (i, f) in id.lbaf.iter().enumerate().take(id.nlbaf as usize + 1) {
            ensure!(
                f.data_size().is_some(),
                "nsid {} LBAF{i} LBADS {}",
                ns.nsid,
                f.lbads
            );
        }
        if ns.supported() {
            ensure!(
                ns.block_size.is_power_of_two() && ns.block_size >= 512,
                "nsid {} block size {}",
                ns.nsid,
                ns.block_size
            );
        }
    }
    Ok(Outcome::Pass)
}

pub(crate) fn reset_and_reinit(t: &mut Ctx) -> CaseResult {
    // One transport, two controllers: the second bring-up shuts the first controller down
    // and disables it (CC.SHN, then CC.EN=0), then reinitialises the same device.
    let ns = t.ns()?;
    let (lba, data) = {
        let c = t.open()?;
        let mut qp = qpair(c, 16)?;
        let w = Blocks::lend(c.dma_pool(), &mut qp, ns, 16)?;
        let lba = Space::at(ns, 9000).take(c.dma_pool(), &mut qp, 16)?;
        let data = pattern(16 * ns.block_size, 1234);
        ns.write(&mut qp, &w, lba, &data)
            .map_err(|e| format!("before the reset: {e}"))?;
        must(&mut qp, IoRequest::flush(ns.nsid, 2), "flush before reset")?;
        (lba, data)
    };
    let c = t.open_with(|_| {})?;
    ensure!(c.csts().rdy(), "not ready after reinitialisation");
    let mut qp = qpair(c, 16)?;
    let r = Blocks::lend(c.dma_pool(), &mut qp, ns, 16)?;
    read_compare(
        &mut qp,
        ns,
        &r,
        lba,
        &data,
        "data written before the reset, read after it",
    )?;
    Ok(Outcome::Pass)
}

pub(crate) fn smart_log(t: &mut Ctx) -> CaseResult {
    let ns = t.ns()?;
    let c = t.open()?;
    let before = c.smart_log().map_err(|e| e.to_string())?;
    let mut qp = qpair(c, 16)?;
    let w = Blocks::lend(c.dma_pool(), &mut qp, ns, 1)?;
    // Eight write commands, one after the other (a zoned namespace's write pointer
    // follows them).
    let mut space = Space::at(ns, 11_000);
    for i in 0..8u64 {
        let lba = space.take(c.dma_pool(), &mut qp, 1)?;
        ns.write(&mut qp, &w, lba, &pattern(ns.block_size, i))?;
    }
    let after = c.smart_log().map_err(|e| e.to_string())?;
    ensure!(
        after.host_write_commands >= before.host_write_commands + 8,
        "host write commands {} -> {}",
        before.host_write_commands,
        after.host_write_commands
    );
    let t = after.temperature_celsius();
    ensure!((-40..150).contains(&t), "composite temperature {t} C");
    ensure!(
        after.available_spare_pct <= 100,
        "available spare {}%",
        after.available_spare_pct
    );
    Ok(Outcome::Pass)
}

pub(crate) fn error_log(t: &mut Ctx) -> CaseResult {
    let ns = t.ns()?;
    let c = t.open()?;
    let buf = alloc(c, 8192 + ns.md_block())?;
    let nsze = ns.num_blocks;
    let _ = raw_status_with(
        c,
        Sqe::read(ns.nsid, nsze + 10, 1, 0, 0),
        buf,
        ns.host_block(),
        ns.md_block(),
    )?;
    let log = c.error_log().map_err(|e| e.to_string())?;
    // Controllers may or may not log command errors; the page must parse either way.
    if log.is_empty() {
        return Ok(Outcome::Skip(
            "error log has no valid entries after a failed command (logging is optional)".into(),
        ));
    }
    let mut counts: Vec<u64> = log.iter().map(|e| e.error_count).collect();
    counts.sort();
    counts.dedup();
    ensure!(
        counts.len() == log.len(),
        "duplicate error counts in the log"
    );
    Ok(Outcome::Pass)
}

pub(crate) fn abort_unknown_command(t: &mut Ctx) -> CaseResult {
    let c = t.open()?;
    let qp = qpair(c, 16)?;
    // Abort of a CID that is not outstanding: the controller completes the Abort and says
    // the command was not aborted (dword 0 bit 0 set), or refuses with a status.
    match c.abort(qp.qid(), 0x1234) {
        Ok(false) => Ok(Outcome::Pass),
        Ok(true) => Err("controller claims to have aborted a command that does not exist".into()),
        Err(CtrlrError::AdminCommand { status, .. }) => {
            Ok(Outcome::Skip(format!("abort refused with {status}")))
        }
        Err(e) => Err(e.to_string().into()),
    }
}

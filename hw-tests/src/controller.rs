//! The controller cases: bring-up and shutdown, Identify, the SMART and error log pages,
//! reset and reinitialisation, Abort.

use std::sync::Arc;

use kestrel::io::IoRequest;
use kestrel::nvme::ctrlr::CtrlrError;
use kestrel::spec::Sqe;
use kestrel::{Controller, ControllerOptions};

use crate::support::{
    all_ok, alloc, lent, ns_of, pattern, put, qpair, raw_status_with, reap, run_one,
};
use crate::verify::read_compare;
use crate::{CaseResult, Device, Outcome};

pub(crate) fn bring_up_and_shutdown(d: &Device, _nsid: u32) -> CaseResult {
    let c = d.open()?;
    ensure!(c.csts().rdy(), "CSTS.RDY clear after bring-up");
    ensure!(!c.csts().cfs(), "CSTS.CFS set after bring-up");
    drop(c);
    // A second bring-up after the shutdown must work too.
    let c = d.open()?;
    ensure!(c.csts().rdy(), "CSTS.RDY clear after second bring-up");
    Ok(Outcome::Pass)
}

pub(crate) fn identify_controller(d: &Device, _nsid: u32) -> CaseResult {
    let c = d.open()?;
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

pub(crate) fn identify_namespaces(d: &Device, _nsid: u32) -> CaseResult {
    let c = d.open()?;
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
        ensure!(
            ns.block_size.is_power_of_two() && ns.block_size >= 512,
            "block size {}",
            ns.block_size
        );
    }
    Ok(Outcome::Pass)
}

pub(crate) fn reset_and_reinit(d: &Device, nsid: u32) -> CaseResult {
    // One transport, two controllers: dropping the first shuts the controller down and
    // disables it (CC.SHN, then CC.EN=0); the second is a full reinitialisation of the
    // same device.
    let t = d.transport()?;
    let data = {
        let c = Controller::new(Arc::clone(&t), ControllerOptions::default())
            .map_err(|e| e.to_string())?;
        let ns = ns_of(&c, nsid)?;
        let mut qp = qpair(&c, 16)?;
        let w = lent(&c, &mut qp, 16 * ns.bs)?;
        let data = pattern(16 * ns.bs, 1234);
        put(&mut qp, &w, 0, &data)?;
        let r = run_one(&mut qp, IoRequest::write(nsid, 9000, 16, w, 1))?;
        ensure!(r.is_ok(), "write before reset: {r:?}");
        let r = run_one(&mut qp, IoRequest::flush(nsid, 2))?;
        ensure!(r.is_ok(), "flush before reset: {r:?}");
        data
    };
    let c = Controller::new(t, ControllerOptions::default()).map_err(|e| e.to_string())?;
    ensure!(c.csts().rdy(), "not ready after reinitialisation");
    let ns = ns_of(&c, nsid)?;
    let mut qp = qpair(&c, 16)?;
    let r_buf = lent(&c, &mut qp, 16 * ns.bs)?;
    read_compare(
        &mut qp,
        nsid,
        &r_buf,
        9000,
        ns.bs,
        &data,
        "data written before the reset, read after it",
    )?;
    Ok(Outcome::Pass)
}

pub(crate) fn smart_log(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    ns_of(&c, nsid)?;
    let before = c.smart_log().map_err(|e| e.to_string())?;
    let mut qp = qpair(&c, 16)?;
    let buf = lent(&c, &mut qp, 4096)?;
    for i in 0..8 {
        qp.submit(IoRequest::write(nsid, 11_000 + i, 1, buf, i))
            .map_err(|e| e.to_string())?;
    }
    qp.flush();
    all_ok(&reap(&mut qp, 8)?)?;
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

pub(crate) fn error_log(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    let buf = alloc(&c, 4096)?;
    let nsze = ns_of(&c, nsid)?.nsze;
    let _ = raw_status_with(&c, Sqe::read(nsid, nsze + 10, 1, 0, 0), buf, 4096)?;
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

pub(crate) fn abort_unknown_command(d: &Device, _nsid: u32) -> CaseResult {
    let c = d.open()?;
    let qp = qpair(&c, 16)?;
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

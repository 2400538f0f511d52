//! Kestrel's conformance suite: one set of cases, run against the built-in emulated
//! controller, against QEMU's NVMe model through VFIO inside a VM, or against a real
//! controller. Every case uses only the library's public API, opens its own controller
//! (so each is independent), and reports pass, fail or skip (with the reason).

pub mod targets;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kestrel::io::{Completion, InvalidRequest, IoError, IoOp, IoRequest, SubmitError};
use kestrel::nvme::ctrlr::CtrlrError;
use kestrel::spec::{Sqe, Status};
use kestrel::{Controller, ControllerOptions, DmaBuf, DoorbellMode, IoQpair, QpairOptions};

/// Where the suite runs.
#[derive(Clone, Debug)]
pub enum Device {
    /// The built-in emulated controller (a fresh one per case).
    Emulator,
    /// The built-in emulated controller configured so (a fresh one per case): several
    /// namespaces, formats the driver refuses.
    EmulatorWith(Box<kestrel::emu::EmuConfig>),
    /// A controller bound to vfio-pci.
    Pci {
        /// PCI address.
        bdf: String,
        /// Use the noiommu VFIO path.
        noiommu: bool,
    },
}

impl Device {
    /// A short name for the results table.
    pub fn name(&self) -> String {
        match self {
            Device::Emulator => "emu".into(),
            Device::EmulatorWith(c) => format!("emu({} namespaces)", c.namespaces.len()),
            Device::Pci { bdf, noiommu } => {
                format!("pci:{bdf}{}", if *noiommu { "(noiommu)" } else { "" })
            }
        }
    }

    /// The transport for this device: a new emulator, or the VFIO device opened.
    pub fn transport(&self) -> Result<Arc<dyn kestrel::hw::transport::Transport>, String> {
        match self {
            Device::Emulator => {
                let emu = kestrel::emu::EmuController::start(kestrel::emu::EmuConfig::default())
                    .map_err(|e| e.to_string())?;
                Ok(emu)
            }
            Device::EmulatorWith(cfg) => {
                let emu = kestrel::emu::EmuController::start((**cfg).clone())
                    .map_err(|e| e.to_string())?;
                Ok(emu)
            }
            Device::Pci { bdf, noiommu } => {
                let t = kestrel::hw::vfio::VfioTransport::open(
                    bdf,
                    &kestrel::hw::vfio::VfioOptions {
                        noiommu: *noiommu,
                        ..Default::default()
                    },
                )
                .map_err(|e| e.to_string())?;
                Ok(t)
            }
        }
    }

    /// Brings up a controller on this device.
    pub fn open(&self) -> Result<Controller, String> {
        self.open_with(ControllerOptions::default())
    }

    /// Brings up a controller with options.
    pub fn open_with(&self, mut opts: ControllerOptions) -> Result<Controller, String> {
        if std::env::var("KESTREL_NO_SHADOW_DOORBELLS").as_deref() == Ok("1") {
            opts.shadow_doorbells = false;
        }
        Controller::new(self.transport()?, opts).map_err(|e| e.to_string())
    }
}

/// The outcome of one case.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every check held.
    Pass,
    /// A check failed: what and why.
    Fail(String),
    /// Not applicable to this device: why.
    Skip(String),
}

/// Why a case did not pass: a failed check, or a device the case does not apply to found
/// only once the case was under way (e.g. a namespace whose format the driver refuses).
#[derive(Debug)]
enum CaseError {
    Fail(String),
    Skip(String),
}

impl From<String> for CaseError {
    fn from(s: String) -> Self {
        CaseError::Fail(s)
    }
}

impl From<&str> for CaseError {
    fn from(s: &str) -> Self {
        CaseError::Fail(s.to_string())
    }
}

type CaseResult = Result<Outcome, CaseError>;

/// One conformance case.
pub struct Case {
    /// Its name.
    pub name: &'static str,
    /// What it checks.
    pub about: &'static str,
    /// Runs once per active namespace (the data path), not once per controller.
    pub per_namespace: bool,
    run: fn(&Device, u32) -> CaseResult,
}

/// The cases that run on every active namespace: the data path, where the format matters.
/// The others run once per controller, their I/O on the first namespace the driver serves.
const PER_NAMESPACE: &[&str] = &[
    "rw_sizes",
    "rw_offsets",
    "rw_queue_depths",
    "vectored_io",
    "flush",
    "write_zeroes",
    "deallocate",
    "overflow_beyond_depth",
    "large_io_split",
    "error_lba_range",
    "cross_qpair_visibility",
    "mixed_workload_verify",
    "zoned_report_zones",
    "zoned_write_pointer",
    "zoned_append",
    "zoned_reset",
];

/// A case's row in the results.
#[derive(Clone, Debug)]
pub struct CaseReport {
    /// Case name.
    pub name: &'static str,
    /// Device name.
    pub target: String,
    /// Outcome.
    pub outcome: Outcome,
    /// How long it took.
    pub elapsed: Duration,
}

macro_rules! ensure {
    ($cond:expr, $($fmt:tt)+) => {
        if !$cond {
            return Err(format!($($fmt)+).into());
        }
    };
}

mod zoned;
use zoned::{zoned_append, zoned_report_zones, zoned_reset, zoned_write_pointer};

const WAIT: Duration = Duration::from_secs(30);
/// LBAs the suite may overwrite on a real device: the first 64 MiB of each namespace it
/// does I/O to.
const SCRATCH_BYTES: u64 = 64 << 20;

fn qpair(c: &Controller, depth: u32) -> Result<IoQpair, String> {
    c.create_io_qpair(&QpairOptions {
        depth,
        ..Default::default()
    })
    .map_err(|e| e.to_string())
}

fn reap(qp: &mut IoQpair, n: usize) -> Result<Vec<Completion>, String> {
    let mut out = Vec::with_capacity(n);
    let deadline = Instant::now() + WAIT;
    let mut idle = 0u32;
    while out.len() < n {
        if qp.process_completions(128, &mut |c| out.push(c)) == 0 {
            idle += 1;
            if idle > 256 {
                std::thread::yield_now();
            }
        } else {
            idle = 0;
        }
        if Instant::now() > deadline {
            return Err(format!(
                "only {} of {n} completions within {WAIT:?} (qid {}, {} in flight, {}, stats {:?})",
                out.len(),
                qp.qid(),
                qp.in_flight(),
                qp.doorbell_state(),
                qp.stats()
            ));
        }
    }
    Ok(out)
}

fn quiet(qp: &mut IoQpair) -> Result<(), String> {
    let mut extra = Vec::new();
    let deadline = Instant::now() + Duration::from_millis(50);
    while Instant::now() < deadline {
        qp.process_completions(128, &mut |c| extra.push(c));
        std::thread::yield_now();
    }
    ensure!(extra.is_empty(), "completions nobody asked for: {extra:?}");
    Ok(())
}

fn all_ok(done: &[Completion]) -> Result<(), String> {
    for c in done {
        ensure!(c.result.is_ok(), "token {} failed: {:?}", c.token, c.result);
    }
    Ok(())
}

fn run_one(qp: &mut IoQpair, req: IoRequest) -> Result<Result<(), IoError>, String> {
    qp.submit(req).map_err(|e| e.to_string())?;
    qp.flush();
    Ok(reap(qp, 1)?[0].result)
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

struct Ns {
    bs: usize,
    blocks: u64,
    nsze: u64,
    deallocated_reads_zeroes: bool,
}

/// The namespace a case does its I/O on: a namespace whose format the driver refuses
/// (or none at all: nsid 0) makes the case a skip with the refusal as the reason.
fn ns_of(c: &Controller, nsid: u32) -> Result<Ns, CaseError> {
    if nsid == 0 {
        return Err(CaseError::Skip(no_io_namespace(c)));
    }
    let ns = c.namespace(nsid).map_err(|e| e.to_string())?;
    if let Some(u) = &ns.unsupported {
        return Err(CaseError::Skip(u.to_string()));
    }
    if ns.protection.required() {
        return Err(CaseError::Skip(format!(
            "nsid {nsid}: the format needs metadata with every read and write ({}); the \
             suite's data path cases send none (kestrel perf --verify and driver/tests/\
             formats.rs cover this format)",
            ns.protection.describe()
        )));
    }
    if ns.zones.is_some() {
        return Err(CaseError::Skip(format!(
            "nsid {nsid} is a zoned namespace: writes go at the zones' write pointers (the zoned_* cases cover it)"
        )));
    }
    Ok(Ns {
        bs: ns.block_size as usize,
        blocks: ns.num_blocks.min(SCRATCH_BYTES / ns.block_size as u64),
        nsze: ns.num_blocks,
        deallocated_reads_zeroes: ns.identify.deallocated_reads_zeroes(),
    })
}

/// Why a controller has no namespace for the I/O cases.
fn no_io_namespace(c: &Controller) -> String {
    if c.namespaces().is_empty() {
        return "the controller has no active namespace".into();
    }
    let why: Vec<String> = c
        .namespaces()
        .iter()
        .filter_map(|n| n.unsupported.as_ref().map(|u| u.to_string()))
        .collect();
    format!(
        "kestrel does i/o to none of the active namespaces: {}",
        why.join(" | ")
    )
}

fn mdts(c: &Controller) -> u64 {
    c.max_transfer_bytes()
        .min(kestrel::nvme::qpair::DEFAULT_MAX_COMMAND_BYTES)
}

fn alloc(c: &Controller, len: usize) -> Result<DmaBuf, String> {
    c.dma_pool().alloc(len).map_err(|e| e.to_string())
}

/// Writes `data` at `lba` through `wbuf[off..]` and reads it back through `rbuf[off..]`.
#[allow(clippy::too_many_arguments)]
fn write_read(
    qp: &mut IoQpair,
    nsid: u32,
    wbuf: &mut DmaBuf,
    rbuf: &mut DmaBuf,
    lba: u64,
    bs: usize,
    off: usize,
    data: &[u8],
) -> Result<(), String> {
    let nlb = (data.len() / bs) as u32;
    wbuf.write_at(off, data).map_err(|e| e.to_string())?;
    rbuf.fill(0);
    let w = wbuf.slice(off, data.len()).map_err(|e| e.to_string())?;
    let r = rbuf.slice(off, data.len()).map_err(|e| e.to_string())?;
    let res = run_one(qp, IoRequest::write(nsid, lba, nlb, w, 1))?;
    ensure!(res.is_ok(), "write of {nlb} blocks at lba {lba}: {res:?}");
    let res = run_one(qp, IoRequest::read(nsid, lba, nlb, r, 2))?;
    ensure!(res.is_ok(), "read of {nlb} blocks at lba {lba}: {res:?}");
    let mut got = vec![0u8; data.len()];
    rbuf.read_at(off, &mut got).map_err(|e| e.to_string())?;
    if got != data {
        let first = got.iter().zip(data).position(|(a, b)| a != b).unwrap_or(0);
        return Err(format!(
            "data mismatch: {nlb} blocks at lba {lba}, buffer offset {off}: first bad byte {first} (block {}): got {:#04x} want {:#04x}",
            first / bs,
            got[first],
            data[first]
        ));
    }
    Ok(())
}

fn expect_nvme(r: Result<(), IoError>, want: Status, what: &str) -> Result<(), String> {
    match r {
        Err(IoError::Nvme(s)) if s.same_code(want) => Ok(()),
        other => Err(format!("{what}: expected {want}, got {other:?}")),
    }
}

// ---------------------------------------------------------------------------------------
// The cases.

fn bring_up_and_shutdown(d: &Device, _nsid: u32) -> CaseResult {
    let c = d.open()?;
    ensure!(c.csts().rdy(), "CSTS.RDY clear after bring-up");
    ensure!(!c.csts().cfs(), "CSTS.CFS set after bring-up");
    drop(c);
    // A second bring-up after the shutdown must work too.
    let c = d.open()?;
    ensure!(c.csts().rdy(), "CSTS.RDY clear after second bring-up");
    Ok(Outcome::Pass)
}

fn identify_controller(d: &Device, _nsid: u32) -> CaseResult {
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

fn identify_namespaces(d: &Device, _nsid: u32) -> CaseResult {
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

fn queues_granted(d: &Device, _nsid: u32) -> CaseResult {
    let c = d.open_with(ControllerOptions {
        io_queues: 4,
        ..Default::default()
    })?;
    let g = c.io_queues_granted();
    ensure!((1..=4).contains(&g), "asked for 4 queues, granted {g}");
    Ok(Outcome::Pass)
}

fn max_qpairs(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open_with(ControllerOptions {
        io_queues: 16,
        ..Default::default()
    })?;
    ns_of(&c, nsid)?;
    let n = c.io_queues_granted() as usize;
    let mut qps = Vec::new();
    for _ in 0..n {
        qps.push(qpair(&c, 16)?);
    }
    let mut qids: Vec<u16> = qps.iter().map(|q| q.qid()).collect();
    qids.sort();
    qids.dedup();
    ensure!(qids.len() == n, "qids not distinct: {qids:?}");
    match c.create_io_qpair(&QpairOptions::default()) {
        Err(CtrlrError::NoFreeQueue { .. }) => {}
        Err(e) => return Err(format!("qpair {} failed with the wrong error: {e}", n + 1).into()),
        Ok(q) => {
            return Err(format!(
                "qpair {} created (qid {}) beyond the {n} granted",
                n + 1,
                q.qid()
            )
            .into())
        }
    }
    // Every one of them does I/O.
    let buf = alloc(&c, 4096)?;
    for (i, qp) in qps.iter_mut().enumerate() {
        let r = run_one(qp, IoRequest::read_buf(nsid, i as u64, 1, &buf, i as u64))?;
        ensure!(r.is_ok(), "read on qid {}: {r:?}", qp.qid());
    }
    Ok(Outcome::Pass)
}

fn rw_sizes(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    let ns = ns_of(&c, nsid)?;
    let max = (4 * mdts(&c)) as usize;
    let mut qp = qpair(&c, 32)?;
    let mut w = alloc(&c, max)?;
    let mut r = alloc(&c, max)?;
    let mdts_blocks = mdts(&c) as usize / ns.bs;
    let mut sizes = vec![
        1usize,
        2,
        3,
        8,
        mdts_blocks.saturating_sub(1).max(1),
        mdts_blocks,
        mdts_blocks + 1,
        2 * mdts_blocks,
        4 * mdts_blocks,
    ];
    sizes.dedup();
    let mut lba = 0u64;
    for nlb in sizes {
        let len = nlb * ns.bs;
        ensure!(lba + nlb as u64 <= ns.blocks, "scratch area too small");
        write_read(
            &mut qp,
            nsid,
            &mut w,
            &mut r,
            lba,
            ns.bs,
            0,
            &pattern(len, lba + 1),
        )?;
        lba += nlb as u64;
    }
    ensure!(
        qp.stats().split > 0,
        "no request was split: {:?}",
        qp.stats()
    );
    Ok(Outcome::Pass)
}

fn rw_offsets(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    let ns = ns_of(&c, nsid)?;
    let mut qp = qpair(&c, 32)?;
    let mut w = alloc(&c, 64 * 1024)?;
    let mut r = alloc(&c, 64 * 1024)?;
    let mut lba = 1000u64;
    for off in [0usize, 4, 64, 512, 2048, 4092] {
        for blocks in [1usize, 2, 5] {
            let len = blocks * ns.bs;
            write_read(
                &mut qp,
                nsid,
                &mut w,
                &mut r,
                lba,
                ns.bs,
                off,
                &pattern(len, lba * 7 + off as u64),
            )?;
            lba += blocks as u64;
        }
    }
    Ok(Outcome::Pass)
}

fn rw_queue_depths(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    let ns = ns_of(&c, nsid)?;
    let depth = c.cap().max_queue_entries().min(256);
    let mut qp = qpair(&c, depth)?;
    let slots = qp.slots();
    let mut lba = 2000u64;
    for qd in [1usize, 2, 16, slots] {
        let mut w = alloc(&c, qd * ns.bs)?;
        let r = alloc(&c, qd * ns.bs)?;
        let data = pattern(qd * ns.bs, qd as u64);
        w.write_at(0, &data).map_err(|e| e.to_string())?;
        for i in 0..qd {
            let s = w.slice(i * ns.bs, ns.bs).map_err(|e| e.to_string())?;
            qp.submit(IoRequest::write(nsid, lba + i as u64, 1, s, i as u64))
                .map_err(|e| e.to_string())?;
        }
        qp.flush();
        all_ok(&reap(&mut qp, qd)?)?;
        for i in 0..qd {
            let s = r.slice(i * ns.bs, ns.bs).map_err(|e| e.to_string())?;
            qp.submit(IoRequest::read(nsid, lba + i as u64, 1, s, i as u64))
                .map_err(|e| e.to_string())?;
        }
        qp.flush();
        all_ok(&reap(&mut qp, qd)?)?;
        ensure!(r.to_vec() == data, "data mismatch at queue depth {qd}");
        lba += qd as u64;
    }
    Ok(Outcome::Pass)
}

fn vectored_io(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    let ns = ns_of(&c, nsid)?;
    let mut qp = qpair(&c, 16)?;
    let lens = [8192usize, 4096, 12288];
    let mut bufs = Vec::new();
    for l in lens {
        bufs.push(alloc(&c, l)?);
    }
    let total: usize = lens.iter().sum();
    let data = pattern(total, 3);
    let mut off = 0;
    for (b, l) in bufs.iter_mut().zip(lens) {
        b.write_at(0, &data[off..off + l])
            .map_err(|e| e.to_string())?;
        off += l;
    }
    let segs: Vec<_> = bufs.iter().map(|b| b.slice_all()).collect();
    let nlb = (total / ns.bs) as u32;
    let req =
        IoRequest::vectored(IoOp::Write, nsid, 3000, nlb, &segs, 1).ok_or("too many segments")?;
    let res = run_one(&mut qp, req)?;
    ensure!(res.is_ok(), "vectored write: {res:?}");
    let r = alloc(&c, total)?;
    let res = run_one(&mut qp, IoRequest::read_buf(nsid, 3000, nlb, &r, 2))?;
    ensure!(res.is_ok(), "read: {res:?}");
    ensure!(r.to_vec() == data, "vectored write did not read back");
    // And a vectored read into the three buffers.
    for b in bufs.iter_mut() {
        b.fill(0);
    }
    let req =
        IoRequest::vectored(IoOp::Read, nsid, 3000, nlb, &segs, 3).ok_or("too many segments")?;
    let res = run_one(&mut qp, req)?;
    ensure!(res.is_ok(), "vectored read: {res:?}");
    let mut got = Vec::new();
    for b in &bufs {
        got.extend(b.to_vec());
    }
    ensure!(got == data, "vectored read mismatch");
    Ok(Outcome::Pass)
}

fn flush(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    ns_of(&c, nsid)?;
    let mut qp = qpair(&c, 16)?;
    let buf = alloc(&c, 4096)?;
    qp.submit(IoRequest::write_buf(nsid, 4000, 1, &buf, 1))
        .map_err(|e| e.to_string())?;
    qp.submit(IoRequest::flush(nsid, 2))
        .map_err(|e| e.to_string())?;
    qp.flush();
    all_ok(&reap(&mut qp, 2)?)?;
    Ok(Outcome::Pass)
}

fn write_zeroes(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    if !c.identify().supports_write_zeroes() {
        return Ok(Outcome::Skip("ONCS: write zeroes not supported".into()));
    }
    let ns = ns_of(&c, nsid)?;
    let mut qp = qpair(&c, 16)?;
    let mut buf = alloc(&c, 8 * ns.bs)?;
    buf.fill(0x5A);
    let r = run_one(&mut qp, IoRequest::write_buf(nsid, 5000, 8, &buf, 1))?;
    ensure!(r.is_ok(), "write: {r:?}");
    let r = run_one(&mut qp, IoRequest::write_zeroes(nsid, 5002, 4, 2))?;
    ensure!(r.is_ok(), "write zeroes: {r:?}");
    buf.fill(0xFF);
    let r = run_one(&mut qp, IoRequest::read_buf(nsid, 5000, 8, &buf, 3))?;
    ensure!(r.is_ok(), "read: {r:?}");
    let v = buf.to_vec();
    for (i, blk) in v.chunks(ns.bs).enumerate() {
        let want = if (2..6).contains(&i) { 0 } else { 0x5A };
        ensure!(
            blk.iter().all(|&b| b == want),
            "block {i} after write zeroes: want {want:#x}"
        );
    }
    Ok(Outcome::Pass)
}

fn deallocate(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    if !c.identify().supports_dsm() {
        return Ok(Outcome::Skip(
            "ONCS: dataset management not supported".into(),
        ));
    }
    let ns = ns_of(&c, nsid)?;
    let zeroes = ns.deallocated_reads_zeroes;
    let mut qp = qpair(&c, 16)?;
    let mut buf = alloc(&c, 8 * ns.bs)?;
    buf.fill(0xC3);
    let r = run_one(&mut qp, IoRequest::write_buf(nsid, 6000, 8, &buf, 1))?;
    ensure!(r.is_ok(), "write: {r:?}");
    let r = run_one(&mut qp, IoRequest::deallocate(nsid, 6000, 8, 2))?;
    ensure!(r.is_ok(), "deallocate: {r:?}");
    let r = run_one(&mut qp, IoRequest::read_buf(nsid, 6000, 8, &buf, 3))?;
    ensure!(r.is_ok(), "read after deallocate: {r:?}");
    // Dataset Management's Deallocate is advisory (the controller "may" deallocate), so
    // each block reads back either as it was or, deallocated, as DLFEAT says.
    let v = buf.to_vec();
    let mut deallocated = 0;
    for (i, blk) in v.chunks(ns.bs).enumerate() {
        if blk.iter().all(|&b| b == 0xC3) {
            continue;
        }
        ensure!(
            zeroes,
            "block {i} changed after deallocate and DLFEAT promises nothing: {:#04x}",
            blk[0]
        );
        ensure!(
            blk.iter().all(|&b| b == 0),
            "block {i} after deallocate is neither its old data nor zeroes, as DLFEAT promises"
        );
        deallocated += 1;
    }
    if deallocated == 0 {
        return Ok(Outcome::Skip(
            "the controller kept every block (deallocate is advisory); contents unchanged".into(),
        ));
    }
    Ok(Outcome::Pass)
}

fn overflow_beyond_depth(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    ns_of(&c, nsid)?;
    let sw = 64u32;
    let mut qp = c
        .create_io_qpair(&QpairOptions {
            depth: 16,
            sw_queue_depth: sw,
            ..Default::default()
        })
        .map_err(|e| e.to_string())?;
    let slots = qp.slots() as u32;
    let buf = alloc(&c, 4096)?;
    let total = slots + sw;
    for i in 0..total {
        qp.submit(IoRequest::read_buf(nsid, i as u64, 1, &buf, i as u64))
            .map_err(|e| format!("submit {i}: {e}"))?;
    }
    let extra = IoRequest::read_buf(nsid, 0, 1, &buf, 1 << 40);
    match qp.submit(extra) {
        Err(SubmitError::Busy(b)) => {
            ensure!(b.request == extra, "busy did not hand the request back")
        }
        other => return Err(format!("expected Busy with everything full, got {other:?}").into()),
    }
    qp.flush();
    let done = reap(&mut qp, total as usize)?;
    all_ok(&done)?;
    // Exactly once each. The order of completions is the device's business (QEMU's model
    // completes out of order); the driver's own tests check submission order against the
    // in-order emulator.
    let mut tokens: Vec<u64> = done.iter().map(|c| c.token).collect();
    tokens.sort_unstable();
    ensure!(
        tokens == (0..total as u64).collect::<Vec<_>>(),
        "completions missing or repeated"
    );
    quiet(&mut qp)?;
    ensure!(
        qp.outstanding() == 0 && qp.free_slots() as u32 == slots,
        "trackers leaked"
    );
    Ok(Outcome::Pass)
}

fn doorbell_counts(
    d: &Device,
    nsid: u32,
    mode: DoorbellMode,
) -> Result<kestrel::QueueStats, String> {
    let c = d.open_with(ControllerOptions {
        shadow_doorbells: false,
        ..Default::default()
    })?;
    let mut qp = c
        .create_io_qpair(&QpairOptions {
            depth: 64,
            doorbell: mode,
            shadow_doorbells: false,
            ..Default::default()
        })
        .map_err(|e| e.to_string())?;
    let buf = alloc(&c, 4096)?;
    let mut nonempty = 0u64;
    for b in 0..20u64 {
        let reqs: Vec<_> = (0..32)
            .map(|i| IoRequest::read_buf(nsid, i, 1, &buf, b * 32 + i))
            .collect();
        let n = qp.submit_batch(&reqs).map_err(|e| e.to_string())?;
        ensure!(n == 32, "batch took {n} of 32");
        let mut got = 0;
        let deadline = Instant::now() + WAIT;
        while got < 32 {
            if qp.process_completions(128, &mut |_| got += 1) > 0 {
                nonempty += 1;
            }
            ensure!(Instant::now() < deadline, "batch {b} did not complete");
        }
    }
    let st = qp.stats();
    ensure!(
        st.cq_doorbell_writes <= nonempty,
        "cq doorbell writes {} > non-empty passes {nonempty}",
        st.cq_doorbell_writes
    );
    ensure!(st.cq_doorbell_writes > 0, "no cq doorbell writes at all");
    Ok(st)
}

fn doorbells_batched(d: &Device, nsid: u32) -> CaseResult {
    if nsid == 0 {
        return Err(CaseError::Skip(
            "no active namespace kestrel does i/o to (see the per-namespace rows)".into(),
        ));
    }
    let st = doorbell_counts(d, nsid, DoorbellMode::Batched)?;
    ensure!(
        st.sq_doorbell_writes == 20,
        "batched: {} sq doorbell writes for 20 batches",
        st.sq_doorbell_writes
    );
    Ok(Outcome::Pass)
}

fn doorbells_immediate(d: &Device, nsid: u32) -> CaseResult {
    if nsid == 0 {
        return Err(CaseError::Skip(
            "no active namespace kestrel does i/o to (see the per-namespace rows)".into(),
        ));
    }
    let st = doorbell_counts(d, nsid, DoorbellMode::Immediate)?;
    ensure!(
        st.sq_doorbell_writes == 640,
        "immediate: {} sq doorbell writes for 640 commands",
        st.sq_doorbell_writes
    );
    Ok(Outcome::Pass)
}

fn shadow_doorbells(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    if !c.identify().supports_shadow_doorbells() {
        return Ok(Outcome::Skip(
            "controller does not offer Doorbell Buffer Config (OACS bit 8)".into(),
        ));
    }
    ensure!(c.shadow_doorbells(), "offered but not configured");
    let mut qp = qpair(&c, 64)?;
    ensure!(
        qp.uses_shadow_doorbells(),
        "qpair not using shadow doorbells"
    );
    let ns = ns_of(&c, nsid)?;
    let mut w = alloc(&c, 32 * ns.bs)?;
    let r = alloc(&c, 32 * ns.bs)?;
    let data = pattern(32 * ns.bs, 11);
    w.write_at(0, &data).map_err(|e| e.to_string())?;
    for round in 0..10u64 {
        let reqs: Vec<_> = (0..32)
            .map(|i| {
                IoRequest::write(
                    nsid,
                    7000 + i,
                    1,
                    w.slice(i as usize * ns.bs, ns.bs).unwrap(),
                    round * 64 + i,
                )
            })
            .collect();
        qp.submit_batch(&reqs).map_err(|e| e.to_string())?;
        all_ok(&reap(&mut qp, 32)?)?;
    }
    let res = run_one(&mut qp, IoRequest::read_buf(nsid, 7000, 32, &r, 1))?;
    ensure!(res.is_ok(), "read: {res:?}");
    ensure!(r.to_vec() == data, "data mismatch with shadow doorbells");
    let st = qp.stats();
    ensure!(
        st.shadow_doorbell_updates + st.sq_doorbell_writes > 0,
        "no doorbell updates recorded"
    );
    Ok(Outcome::Pass)
}

fn large_io_split(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    let ns = ns_of(&c, nsid)?;
    let m = mdts(&c) as usize;
    let len = 3 * m + 2 * ns.bs;
    let mut qp = c
        .create_io_qpair(&QpairOptions {
            depth: 4,
            ..Default::default()
        })
        .map_err(|e| e.to_string())?;
    let mut w = alloc(&c, len)?;
    let mut r = alloc(&c, len)?;
    write_read(
        &mut qp,
        nsid,
        &mut w,
        &mut r,
        8000,
        ns.bs,
        0,
        &pattern(len, 99),
    )?;
    let st = qp.stats();
    ensure!(st.split == 2, "expected 2 split requests, stats {st:?}");
    ensure!(
        st.completed == 2,
        "parents completed {} times",
        st.completed
    );
    quiet(&mut qp)?;
    Ok(Outcome::Pass)
}

fn raw_status(
    c: &Controller,
    sqe: Sqe,
    data: Option<kestrel::DmaSlice>,
) -> Result<Result<(), IoError>, String> {
    let mut qp = qpair(c, 8)?;
    let before = qp.doorbell_state();
    qp.submit_raw(sqe, data, 5).map_err(|e| e.to_string())?;
    let mid = qp.doorbell_state();
    qp.flush();
    let after = qp.doorbell_state();
    Ok(reap(&mut qp, 1)
        .map_err(|e| format!("{e}; before: {before}; submitted: {mid}; flushed: {after}"))?[0]
        .result)
}

fn error_invalid_nsid(d: &Device, _nsid: u32) -> CaseResult {
    let c = d.open()?;
    let buf = alloc(&c, 4096)?;
    let bad = c.identify().nn.saturating_add(1).max(2);
    expect_nvme(
        raw_status(&c, Sqe::read(bad, 0, 1, 0, 0), Some(buf.slice_all()))?,
        Status::INVALID_NAMESPACE_OR_FORMAT,
        "read of nsid NN+1",
    )?;
    // And the driver refuses it before the device when asked through the checked path.
    let mut qp = qpair(&c, 8)?;
    match qp.submit(IoRequest::read_buf(bad, 0, 1, &buf, 1)) {
        Err(SubmitError::Invalid {
            reason: InvalidRequest::InactiveNamespace { .. },
            ..
        }) => {}
        other => return Err(format!("driver accepted an inactive nsid: {other:?}").into()),
    }
    Ok(Outcome::Pass)
}

fn error_lba_range(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    let nsze = ns_of(&c, nsid)?.nsze;
    let buf = alloc(&c, 8192)?;
    expect_nvme(
        raw_status(
            &c,
            Sqe::read(nsid, nsze - 1, 2, 0, 0),
            Some(buf.slice_all()),
        )?,
        Status::LBA_OUT_OF_RANGE,
        "read across the end",
    )?;
    expect_nvme(
        raw_status(
            &c,
            Sqe::write(nsid, nsze, 1, 0, 0),
            Some(buf.slice(0, 4096).unwrap()),
        )?,
        Status::LBA_OUT_OF_RANGE,
        "write past the end",
    )?;
    let mut qp = qpair(&c, 8)?;
    match qp.submit(IoRequest::read_buf(nsid, nsze, 1, &buf, 1)) {
        Err(SubmitError::Invalid {
            reason: InvalidRequest::OutOfRange { .. },
            ..
        }) => {}
        other => return Err(format!("driver accepted an out-of-range lba: {other:?}").into()),
    }
    Ok(Outcome::Pass)
}

fn error_invalid_opcode(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    ns_of(&c, nsid)?;
    let mut sqe = Sqe::new(0x7E);
    sqe.nsid = nsid;
    expect_nvme(
        raw_status(&c, sqe, None)?,
        Status::INVALID_OPCODE,
        "nvm opcode 7Eh",
    )?;
    match c.admin_command(Sqe::new(0x7F), None) {
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

fn error_queue_creation(d: &Device, _nsid: u32) -> CaseResult {
    let c = d.open_with(ControllerOptions {
        io_queues: 2,
        ..Default::default()
    })?;
    let mem = alloc(&c, 1 << 20)?;
    let check = |sqe: Sqe, want: Status, what: &str| -> Result<(), String> {
        match c.admin_command(sqe, None) {
            Err(CtrlrError::AdminCommand { status, .. }) if status.same_code(want) => Ok(()),
            other => Err(format!("{what}: expected {want}, got {other:?}")),
        }
    };
    let granted = c.io_queues_granted();
    check(
        Sqe::create_io_cq(0, 16, mem.iova()),
        Status::INVALID_QUEUE_IDENTIFIER,
        "cq qid 0",
    )?;
    let mqes = c.cap().max_queue_entries();
    if mqes < 65536 {
        check(
            Sqe::create_io_cq(1, (mqes + 1) as u16, mem.iova()),
            Status::INVALID_QUEUE_SIZE,
            "cq above MQES",
        )?;
    }
    check(
        Sqe::create_io_sq(1, 16, 1, mem.iova()),
        Status::COMPLETION_QUEUE_INVALID,
        "sq for a missing cq",
    )?;
    let _ = granted;
    Ok(Outcome::Pass)
}

fn reset_and_reinit(d: &Device, nsid: u32) -> CaseResult {
    // One transport, two controllers: dropping the first shuts the controller down and
    // disables it (CC.SHN, then CC.EN=0); the second is a full reinitialisation of the
    // same device.
    let t = d.transport()?;
    let data = {
        let c = Controller::new(Arc::clone(&t), ControllerOptions::default())
            .map_err(|e| e.to_string())?;
        let ns = ns_of(&c, nsid)?;
        let mut qp = qpair(&c, 16)?;
        let mut w = alloc(&c, 16 * ns.bs)?;
        let data = pattern(16 * ns.bs, 1234);
        w.write_at(0, &data).map_err(|e| e.to_string())?;
        let r = run_one(&mut qp, IoRequest::write_buf(nsid, 9000, 16, &w, 1))?;
        ensure!(r.is_ok(), "write before reset: {r:?}");
        let r = run_one(&mut qp, IoRequest::flush(nsid, 2))?;
        ensure!(r.is_ok(), "flush before reset: {r:?}");
        data
    };
    let c = Controller::new(t, ControllerOptions::default()).map_err(|e| e.to_string())?;
    ensure!(c.csts().rdy(), "not ready after reinitialisation");
    let ns = ns_of(&c, nsid)?;
    let mut qp = qpair(&c, 16)?;
    let r_buf = alloc(&c, 16 * ns.bs)?;
    let r = run_one(&mut qp, IoRequest::read_buf(nsid, 9000, 16, &r_buf, 1))?;
    ensure!(r.is_ok(), "read after reset: {r:?}");
    ensure!(
        r_buf.to_vec() == data,
        "data written before the reset did not read back after it"
    );
    Ok(Outcome::Pass)
}

fn concurrent_pinned_qpairs(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    let ns = ns_of(&c, nsid)?;
    let cores = core_affinity::get_core_ids().unwrap_or_default();
    let threads = cores.len().clamp(1, 4).max(2);
    let c = Arc::new(c);
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let c = Arc::clone(&c);
            let core = cores.get(t % cores.len().max(1)).copied();
            let bs = ns.bs;
            std::thread::spawn(move || -> Result<(), String> {
                if let Some(core) = core {
                    if !core_affinity::set_for_current(core) {
                        return Err(format!("could not pin thread {t} to core {}", core.id));
                    }
                }
                let mut qp = qpair(&c, 32)?;
                let mut w = alloc(&c, 32 * bs)?;
                let mut r = alloc(&c, 32 * bs)?;
                let base = 10_000 + t as u64 * 1000;
                for round in 0..20u64 {
                    let lba = base + (round % 10) * 32;
                    write_read(
                        &mut qp,
                        nsid,
                        &mut w,
                        &mut r,
                        lba,
                        bs,
                        0,
                        &pattern(32 * bs, t as u64 * 100 + round),
                    )?;
                }
                Ok(())
            })
        })
        .collect();
    for (t, h) in handles.into_iter().enumerate() {
        h.join().map_err(|_| format!("thread {t} panicked"))??;
    }
    Ok(Outcome::Pass)
}

fn smart_log(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    ns_of(&c, nsid)?;
    let before = c.smart_log().map_err(|e| e.to_string())?;
    let mut qp = qpair(&c, 16)?;
    let buf = alloc(&c, 4096)?;
    for i in 0..8 {
        qp.submit(IoRequest::write_buf(nsid, 11_000 + i, 1, &buf, i))
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

fn error_log(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    let buf = alloc(&c, 4096)?;
    let nsze = ns_of(&c, nsid)?.nsze;
    let _ = raw_status(
        &c,
        Sqe::read(nsid, nsze + 10, 1, 0, 0),
        Some(buf.slice_all()),
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

fn abort_unknown_command(d: &Device, _nsid: u32) -> CaseResult {
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

fn cross_qpair_visibility(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    let ns = ns_of(&c, nsid)?;
    let mut a = qpair(&c, 16)?;
    let mut b = qpair(&c, 16)?;
    let mut w = alloc(&c, 4 * ns.bs)?;
    let r = alloc(&c, 4 * ns.bs)?;
    let data = pattern(4 * ns.bs, 4242);
    w.write_at(0, &data).map_err(|e| e.to_string())?;
    let res = run_one(&mut a, IoRequest::write_buf(nsid, 12_000, 4, &w, 1))?;
    ensure!(res.is_ok(), "write on qid {}: {res:?}", a.qid());
    let res = run_one(&mut b, IoRequest::read_buf(nsid, 12_000, 4, &r, 2))?;
    ensure!(res.is_ok(), "read on qid {}: {res:?}", b.qid());
    ensure!(
        r.to_vec() == data,
        "a write on one qpair was not visible to a read on another"
    );
    Ok(Outcome::Pass)
}

fn mixed_workload_verify(d: &Device, nsid: u32) -> CaseResult {
    let c = d.open()?;
    let ns = ns_of(&c, nsid)?;
    let mut qp = qpair(&c, 64)?;
    let blocks = 256u64;
    let mut w = alloc(&c, blocks as usize * ns.bs)?;
    let r = alloc(&c, blocks as usize * ns.bs)?;
    let mut shadow: HashMap<u64, u8> = HashMap::new();
    let mut x = 0x1234_5678u64;
    for round in 0..8u8 {
        // Each round writes a random subset of blocks with the round's byte, QD up to 63.
        let mut n = 0;
        for blk in 0..blocks {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if x % 3 == 0 {
                let off = blk as usize * ns.bs;
                w.write_at(off, &vec![round + 1; ns.bs])
                    .map_err(|e| e.to_string())?;
                qp.submit(IoRequest::write(
                    nsid,
                    13_000 + blk,
                    1,
                    w.slice(off, ns.bs).unwrap(),
                    blk,
                ))
                .map_err(|e| e.to_string())?;
                shadow.insert(blk, round + 1);
                n += 1;
            }
        }
        qp.flush();
        all_ok(&reap(&mut qp, n)?)?;
    }
    let res = run_one(
        &mut qp,
        IoRequest::read_buf(nsid, 13_000, blocks as u32, &r, 1),
    )?;
    ensure!(res.is_ok(), "read: {res:?}");
    let v = r.to_vec();
    for (blk, want) in shadow {
        let b = &v[blk as usize * ns.bs..(blk as usize + 1) * ns.bs];
        ensure!(
            b.iter().all(|&x| x == want),
            "block {blk}: want {want}, got {}",
            b[0]
        );
    }
    Ok(Outcome::Pass)
}

/// Every case, in order.
pub fn cases() -> Vec<Case> {
    macro_rules! case {
        ($f:ident, $about:literal) => {
            Case {
                name: stringify!($f),
                about: $about,
                per_namespace: PER_NAMESPACE.contains(&stringify!($f)),
                run: $f,
            }
        };
    }
    vec![
        case!(
            bring_up_and_shutdown,
            "bring-up, shutdown, and bring-up again"
        ),
        case!(identify_controller, "identify controller fields are sane"),
        case!(
            identify_namespaces,
            "identify namespace fields and lba formats are sane"
        ),
        case!(
            queues_granted,
            "set features number of queues grants what was asked or less"
        ),
        case!(
            max_qpairs,
            "create every granted qpair, one more fails, each does i/o"
        ),
        case!(rw_sizes, "write/read/verify from one block to 4 x mdts"),
        case!(
            rw_offsets,
            "write/read/verify with prp1 offsets within a page"
        ),
        case!(
            rw_queue_depths,
            "write/read/verify at queue depth 1 to the queue size"
        ),
        case!(vectored_io, "vectored write and read over three buffers"),
        case!(flush, "flush completes after writes"),
        case!(write_zeroes, "write zeroes reads back zeroes"),
        case!(
            deallocate,
            "deallocate reads back zeroes where dlfeat says so"
        ),
        case!(
            overflow_beyond_depth,
            "software queue past the depth, busy past that, order kept"
        ),
        case!(doorbells_batched, "one sq doorbell write per batch of 32"),
        case!(doorbells_immediate, "one sq doorbell write per command"),
        case!(
            shadow_doorbells,
            "doorbell buffer config with data integrity"
        ),
        case!(
            large_io_split,
            "i/o larger than mdts is split and completes once"
        ),
        case!(
            error_invalid_nsid,
            "device reports invalid namespace; driver refuses first"
        ),
        case!(
            error_lba_range,
            "device reports lba out of range via passthrough"
        ),
        case!(
            error_invalid_opcode,
            "device reports invalid opcode, admin and nvm"
        ),
        case!(
            error_queue_creation,
            "create queue errors: qid, size, missing cq"
        ),
        case!(
            reset_and_reinit,
            "controller reset and reinitialisation with i/o before and after"
        ),
        case!(
            concurrent_pinned_qpairs,
            "several qpairs driven concurrently from pinned threads"
        ),
        case!(smart_log, "smart log counts host writes, sane temperature"),
        case!(
            error_log,
            "error information log parses and has unique counts"
        ),
        case!(
            abort_unknown_command,
            "abort of a cid not outstanding is not aborted"
        ),
        case!(
            cross_qpair_visibility,
            "a write on one qpair is read on another"
        ),
        case!(
            mixed_workload_verify,
            "random overwrites at queue depth verify against a shadow copy"
        ),
        case!(
            zoned_report_zones,
            "zoned: report zones lists every zone from the one asked"
        ),
        case!(
            zoned_write_pointer,
            "zoned: writes at the write pointer; elsewhere Zone Invalid Write"
        ),
        case!(
            zoned_append,
            "zoned: zone appends return distinct lbas in the zone, holding their data"
        ),
        case!(
            zoned_reset,
            "zoned: finish makes a zone full, reset makes it writable again"
        ),
    ]
}

/// The active namespaces of `device`, why the suite does no I/O to each it does not (the
/// driver refuses its format, or the format needs metadata with every read and write,
/// which the suite's cases do not send) and whether it is zoned. Read from one bring-up
/// (released before the cases run).
fn namespaces_of(device: &Device) -> Result<Vec<(u32, Option<String>, bool)>, String> {
    let c = device.open()?;
    Ok(c.namespaces()
        .iter()
        .map(|n| {
            let why = n.unsupported.as_ref().map(|u| u.to_string()).or_else(|| {
                n.protection.required().then(|| {
                    format!(
                        "nsid {}: the format needs metadata with every read and write ({}); \
                         the suite's cases send none (kestrel perf --verify and \
                         driver/tests/formats.rs cover this format)",
                        n.nsid,
                        n.protection.describe()
                    )
                })
            });
            (n.nsid, why, n.zones.is_some())
        })
        .collect())
}

fn run_case(c: &Case, device: &Device, nsid: u32) -> Outcome {
    match std::panic::catch_unwind(|| (c.run)(device, nsid)) {
        Ok(Ok(o)) => o,
        Ok(Err(CaseError::Fail(why))) => Outcome::Fail(why),
        Ok(Err(CaseError::Skip(why))) => Outcome::Skip(why),
        Err(p) => Outcome::Fail(format!(
            "panicked: {}",
            p.downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| p.downcast_ref::<&str>().copied())
                .unwrap_or("?")
        )),
    }
}

/// Runs the cases whose names contain `filter` (all if empty) against `device`: the
/// controller cases once (their I/O on the first namespace the driver serves), the data
/// path cases on every active namespace (a namespace the driver refuses: skipped, with
/// the refusal as the reason; the target column reads `DEVICE ns=N`).
pub fn run(device: &Device, filter: &str) -> Vec<CaseReport> {
    let target = device.name();
    let selected: Vec<Case> = cases()
        .into_iter()
        .filter(|c| filter.is_empty() || c.name.contains(filter))
        .collect();
    let namespaces = match namespaces_of(device) {
        Ok(n) => n,
        Err(why) => {
            // Every case reports the failed bring-up (the first case checks it anyway).
            return selected
                .iter()
                .map(|c| CaseReport {
                    name: c.name,
                    target: target.clone(),
                    outcome: Outcome::Fail(format!("bring-up to list the namespaces: {why}")),
                    elapsed: Duration::ZERO,
                })
                .collect();
        }
    };
    // The controller cases do conventional writes: the first namespace served that is not
    // zoned, else the first served.
    let first_io = namespaces
        .iter()
        .find(|(_, refused, zoned)| refused.is_none() && !zoned)
        .or_else(|| namespaces.iter().find(|(_, refused, _)| refused.is_none()))
        .map_or(0, |(n, _, _)| *n);
    let mut out = Vec::new();
    for c in selected.iter().filter(|c| !c.per_namespace) {
        let start = Instant::now();
        let outcome = run_case(c, device, first_io);
        out.push(CaseReport {
            name: c.name,
            target: target.clone(),
            outcome,
            elapsed: start.elapsed(),
        });
    }
    for (nsid, refused, _) in &namespaces {
        for c in selected.iter().filter(|c| c.per_namespace) {
            let start = Instant::now();
            let outcome = match refused {
                Some(why) => Outcome::Skip(why.clone()),
                None => run_case(c, device, *nsid),
            };
            out.push(CaseReport {
                name: c.name,
                target: format!("{target} ns={nsid}"),
                outcome,
                elapsed: start.elapsed(),
            });
        }
    }
    out
}

/// The results table, and a summary line in the `N passed, N failed, N skipped` form.
pub fn format_report(reports: &[CaseReport]) -> String {
    let mut s = String::new();
    let w = reports
        .iter()
        .map(|r| r.name.len())
        .max()
        .unwrap_or(4)
        .max(4);
    let _ = writeln!(
        s,
        "{:<w$}  {:<24}  {:<6}  {:>9}  detail",
        "case", "target", "result", "time"
    );
    for r in reports {
        let (res, detail) = match &r.outcome {
            Outcome::Pass => ("pass", String::new()),
            Outcome::Fail(why) => ("FAIL", why.clone()),
            Outcome::Skip(why) => ("skip", why.clone()),
        };
        let _ = writeln!(
            s,
            "{:<w$}  {:<24}  {:<6}  {:>7.1}ms  {}",
            r.name,
            r.target,
            res,
            r.elapsed.as_secs_f64() * 1e3,
            detail
        );
    }
    s
}

/// Counts (passed, failed, skipped).
pub fn tally(reports: &[CaseReport]) -> (usize, usize, usize) {
    let p = reports
        .iter()
        .filter(|r| r.outcome == Outcome::Pass)
        .count();
    let f = reports
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Fail(_)))
        .count();
    (p, f, reports.len() - p - f)
}

/// The machine-readable summary line: `hw-tests-summary {json}`.
pub fn summary_json(reports: &[CaseReport]) -> String {
    let (p, f, s) = tally(reports);
    let target = reports
        .first()
        .map(|r| r.target.clone())
        .unwrap_or_default();
    let failed: Vec<String> = reports
        .iter()
        .filter(|r| matches!(r.outcome, Outcome::Fail(_)))
        .map(|r| format!("\"{}\"", r.name))
        .collect();
    format!(
        "hw-tests-summary {{\"target\":\"{target}\",\"passed\":{p},\"failed\":{f},\"skipped\":{s},\"failed_cases\":[{}]}}",
        failed.join(",")
    )
}

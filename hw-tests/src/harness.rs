//! Running cases: the device opened for a run ([`Dut`]), the context a case gets
//! ([`Ctx`]: the description, its namespace, the controller the harness opens for it), and
//! the release of everything a case opened before the next one starts.
//!
//! A case never owns its controller: [`Ctx::open`] hands out a reference to one the
//! context holds, so nothing the case made from it (queue pairs, threads, which are scoped
//! and so joined) can outlive the case, and the harness drops the context after the case
//! returned, failed or panicked (`catch_unwind`). Then it checks that the device is
//! released (the transport, and for VFIO its DMA mapper, which holds the group open): a
//! case that leaked something that holds it fails, saying so, instead of the next case
//! failing to open the device.
//!
//! The emulated controller is started once per run and opened by one context at a time,
//! as a VFIO group is: an open while an earlier one is still held fails with the reason.
//! After a leak the run goes on with a fresh emulated controller.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::ptr::NonNull;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use kestrel::dma::{DmaError, DmaMapper, PageKind};
use kestrel::emu::{EmuConfig, EmuController};
use kestrel::hw::mmio::Bar;
use kestrel::hw::transport::Transport;
use kestrel::target::Target;
use kestrel::{Controller, ControllerOptions, NvmeNamespace};

use crate::desc::{DeviceDesc, NsDesc, QUEUES_ASKED};
use crate::support::{qpair, with_wait};
use crate::{
    Case, CaseError, CaseReport, CaseResult, Device, Outcome, Report, Run, RunOptions, Scope,
};

/// How long the harness waits for a case's last references to the device to go (a
/// thread of the driver finishing).
const RELEASE_WAIT: Duration = Duration::from_secs(2);

/// The device opened for a run.
pub(crate) struct Dut {
    name: String,
    kind: DutKind,
    /// Whether each thing that holds the device, as the last open handed it out, is still
    /// alive.
    held: Mutex<Vec<Box<dyn Fn() -> bool + Send>>>,
}

enum DutKind {
    Emu {
        config: Box<EmuConfig>,
        emu: Mutex<Arc<EmuController>>,
    },
    Pci {
        bdf: String,
        noiommu: bool,
    },
}

impl Dut {
    /// Opens `device` for a run (starts the emulated controller).
    pub(crate) fn start(device: &Device) -> Result<Dut, String> {
        let kind = match device {
            Device::Emulator { config, .. } => DutKind::Emu {
                config: config.clone(),
                emu: Mutex::new(
                    EmuController::start((**config).clone()).map_err(|e| e.to_string())?,
                ),
            },
            Device::Pci { bdf, noiommu } => DutKind::Pci {
                bdf: bdf.clone(),
                noiommu: *noiommu,
            },
        };
        Ok(Dut {
            name: device.label(),
            kind,
            held: Mutex::new(Vec::new()),
        })
    }

    /// Whether something of an earlier open still holds the device.
    fn busy(&self) -> bool {
        lock(&self.held).iter().any(|alive| alive())
    }

    /// The device's transport, for one context (which must drop it before the next open).
    fn transport(&self) -> Result<Arc<dyn Transport>, String> {
        match &self.kind {
            DutKind::Emu { emu, .. } => {
                if self.busy() {
                    return Err(format!(
                        "{}: the emulated controller is already open in this process: a controller, queue pair, thread or dma memory of an earlier open still holds it (drop them before opening it again)",
                        self.name
                    ));
                }
                let emu = Arc::clone(&lock(emu));
                let hold = Arc::new(());
                let mapper: Arc<dyn DmaMapper> = Arc::new(HeldMapper {
                    inner: emu.mapper(),
                    _hold: Arc::clone(&hold),
                });
                let w = Arc::downgrade(&hold);
                *lock(&self.held) = vec![Box::new(move || w.strong_count() > 0)];
                Ok(Arc::new(HeldEmu {
                    emu,
                    mapper,
                    _hold: hold,
                }))
            }
            DutKind::Pci { bdf, noiommu } => {
                let t = kestrel::vfio::VfioTransport::open(
                    bdf,
                    &kestrel::vfio::VfioOptions {
                        noiommu: *noiommu,
                        ..Default::default()
                    },
                )
                .map_err(|e| e.to_string())?;
                let t: Arc<dyn Transport> = t;
                let wt = Arc::downgrade(&t);
                let wm: Weak<dyn DmaMapper> = Arc::downgrade(&t.mapper());
                *lock(&self.held) = vec![
                    Box::new(move || wt.strong_count() > 0),
                    Box::new(move || wm.strong_count() > 0),
                ];
                Ok(t)
            }
        }
    }

    /// Waits (a bounded time) until nothing holds the device; the error says what still
    /// does. After a leak on the emulator, a fresh emulated controller takes its place.
    fn released(&self) -> Result<(), String> {
        let deadline = Instant::now() + RELEASE_WAIT;
        while self.busy() {
            if Instant::now() >= deadline {
                let mut why = format!(
                    "the case left the device open: {RELEASE_WAIT:?} after it ended, something it made (a controller clone, queue pair, thread or dma memory) still holds it, so the next open would find it busy"
                );
                if let DutKind::Emu { config, emu } = &self.kind {
                    match EmuController::start((**config).clone()) {
                        Ok(fresh) => {
                            *lock(emu) = fresh;
                            lock(&self.held).clear();
                            why += "; the run goes on with a fresh emulated controller";
                        }
                        Err(e) => {
                            why += &format!("; starting a fresh emulated controller failed: {e}")
                        }
                    }
                }
                return Err(why);
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The emulated controller as one open hands it out: while this (or its mapper, which DMA
/// memory holds) lives, the device is open.
struct HeldEmu {
    emu: Arc<EmuController>,
    mapper: Arc<dyn DmaMapper>,
    _hold: Arc<()>,
}

impl Transport for HeldEmu {
    fn bar(&self) -> Arc<Bar> {
        self.emu.bar()
    }
    fn mapper(&self) -> Arc<dyn DmaMapper> {
        Arc::clone(&self.mapper)
    }
    fn page_kind(&self) -> PageKind {
        self.emu.page_kind()
    }
    fn describe(&self) -> String {
        self.emu.describe()
    }
    fn interrupt_vectors(&self) -> u16 {
        self.emu.interrupt_vectors()
    }
    fn interrupt(&self, vector: u16) -> std::io::Result<Arc<std::os::fd::OwnedFd>> {
        self.emu.interrupt(vector)
    }
    fn steer_interrupt(&self, vector: u16, cpu: usize) -> std::io::Result<()> {
        self.emu.steer_interrupt(vector, cpu)
    }
}

struct HeldMapper {
    inner: Arc<dyn DmaMapper>,
    _hold: Arc<()>,
}

impl DmaMapper for HeldMapper {
    fn map(&self, vaddr: NonNull<u8>, len: usize) -> Result<u64, DmaError> {
        self.inner.map(vaddr, len)
    }
    fn unmap(&self, iova: u64, len: usize) {
        self.inner.unmap(iova, len)
    }
    fn name(&self) -> String {
        self.inner.name()
    }
    fn max_region_len(&self) -> usize {
        self.inner.max_region_len()
    }
}

/// What a case gets: the device's description, its namespace, and the controller the
/// harness opens for it and drops after it.
pub struct Ctx<'a> {
    dut: &'a Dut,
    dev: &'a DeviceDesc,
    ns: Option<&'a NsDesc>,
    opts: &'a RunOptions,
    // Dropped in this order (release): the target, the controller, the transport.
    target: Option<NvmeNamespace>,
    ctrl: Option<Controller>,
    transport: Option<Arc<dyn Transport>>,
}

impl<'a> Ctx<'a> {
    /// The device's description.
    pub fn dev(&self) -> &'a DeviceDesc {
        self.dev
    }

    /// The case's namespace: a namespace case's own, a controller case's I/O namespace (a
    /// skip saying why when there is none).
    pub fn ns(&self) -> Result<&'a NsDesc, CaseError> {
        self.ns.ok_or_else(|| {
            CaseError::Skip(
                crate::Need::Io
                    .unmet(self.dev, None)
                    .unwrap_or_else(|| "no namespace".into()),
            )
        })
    }

    /// The controller options every bring-up starts from: the defaults, the run's driver
    /// faults, and no shadow doorbells under `KESTREL_NO_SHADOW_DOORBELLS=1`.
    pub fn options(&self) -> ControllerOptions {
        ControllerOptions {
            io_queues: QUEUES_ASKED,
            shadow_doorbells: std::env::var("KESTREL_NO_SHADOW_DOORBELLS").as_deref() != Ok("1"),
            faults: self.opts.faults,
            ..ControllerOptions::default()
        }
    }

    /// The controller, brought up with [`Ctx::options`] if none is.
    pub fn open(&mut self) -> Result<&Controller, String> {
        if self.ctrl.is_none() {
            let opts = self.options();
            return self.open_with(|o| *o = opts);
        }
        Ok(self.ctrl.as_ref().expect("checked"))
    }

    /// A new bring-up on the same transport with [`Ctx::options`] changed by `f` (the
    /// controller open until now, if any, is shut down first).
    pub fn open_with(
        &mut self,
        f: impl FnOnce(&mut ControllerOptions),
    ) -> Result<&Controller, String> {
        self.target = None;
        self.ctrl = None;
        let mut opts = self.options();
        f(&mut opts);
        let t = match &self.transport {
            Some(t) => Arc::clone(t),
            None => {
                let t = self.dut.transport()?;
                self.transport = Some(Arc::clone(&t));
                t
            }
        };
        let c = Controller::new(t, opts).map_err(|e| e.to_string())?;
        Ok(self.ctrl.insert(c))
    }

    /// Shuts the controller down and closes the device (a later [`Ctx::open`] opens it
    /// again, as a new process would).
    pub fn close(&mut self) {
        self.target = None;
        self.ctrl = None;
        self.transport = None;
    }

    /// The case's namespace opened as a `Target` (on the controller [`Ctx::open`] gives).
    pub fn target(&mut self) -> Result<&dyn Target, CaseError> {
        let nsid = self.ns()?.nsid;
        if self.target.is_none() {
            let c = self.open()?.clone();
            self.target = Some(NvmeNamespace::new(c, nsid).map_err(|e| e.to_string())?);
        }
        Ok(self.target.as_ref().expect("set above"))
    }
}

impl Drop for Ctx<'_> {
    fn drop(&mut self) {
        self.close();
    }
}

/// Runs one case on `ns` (a namespace case's namespace, a controller case's I/O
/// namespace): its needs checked first, then the case under `catch_unwind`, then the
/// release of everything it opened.
fn run_one(
    dut: &Dut,
    dev: &DeviceDesc,
    ns: Option<&NsDesc>,
    c: &Case,
    opts: &RunOptions,
) -> Outcome {
    if let Some(why) = c.needs.iter().find_map(|n| n.unmet(dev, ns)) {
        return Outcome::Skip(why);
    }
    let mut ctx = Ctx {
        dut,
        dev,
        ns,
        opts,
        target: None,
        ctrl: None,
        transport: None,
    };
    let r = catch_unwind(AssertUnwindSafe(|| {
        with_wait(dev.wait, || match c.run {
            Run::Ctx(f) => f(&mut ctx),
            Run::Target(f) => {
                let ns = ctx.ns()?;
                let t = ctx.target()?;
                f(t, ns)
            }
        })
    }));
    drop(ctx);
    let outcome = outcome_of(r);
    match dut.released() {
        Ok(()) => outcome,
        Err(why) => Outcome::Fail(match outcome {
            Outcome::Fail(f) => format!("{f}; and {why}"),
            _ => why,
        }),
    }
}

/// A case's outcome from what it returned, or how it panicked.
pub(crate) fn outcome_of(r: std::thread::Result<CaseResult>) -> Outcome {
    match r {
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

/// The description of the device: one bring-up (released before the cases run), and a
/// Report Zones of the first zone of each zoned namespace for its capacity.
fn describe(dut: &Dut, wait: Duration) -> Result<DeviceDesc, String> {
    let t = dut.transport()?;
    let c = Controller::new(
        t,
        ControllerOptions {
            io_queues: QUEUES_ASKED,
            ..ControllerOptions::default()
        },
    )
    .map_err(|e| format!("bring-up to describe the device: {e}"))?;
    let mut zcap = |nsid: u32| -> Option<u64> {
        use kestrel::io::IoRequest;
        let mut q = qpair(&c, 8).ok()?;
        let buf = q.lend(c.dma_pool().alloc(4096).ok()?).ok()?;
        let r = with_wait(wait, || {
            crate::support::run_one(&mut q, IoRequest::report_zones(nsid, 0, buf, 1))
        })
        .ok()?;
        r.ok()?;
        let bytes = crate::support::contents(&q, &buf).ok()?;
        let zcap = kestrel::spec::zns::parse_report(&bytes)
            .next()
            .map(|d| d.zcap);
        zcap
    };
    let d = DeviceDesc::of(&dut.name, &c, wait, &mut zcap);
    drop(c);
    dut.released()?;
    Ok(d)
}

/// The rows of the namespace cases when `--nsid want` names no active namespace: each
/// fails, naming the active ones.
fn inactive_nsid_rows(
    selected: &[&Case],
    name: &str,
    want: u32,
    dev: &DeviceDesc,
) -> Vec<CaseReport> {
    let active = dev
        .namespaces
        .iter()
        .map(|n| n.nsid.to_string())
        .collect::<Vec<_>>()
        .join(", ");
    selected
        .iter()
        .filter(|c| c.scope == Scope::Namespace)
        .map(|c| CaseReport {
            name: c.name,
            target: format!("{name} ns={want}"),
            nsid: Some(want),
            outcome: Outcome::Fail(format!(
                "nsid {want} is not an active namespace (active: {active})"
            )),
            elapsed: Duration::ZERO,
        })
        .collect()
}

/// Runs `cases` against `device` as `opts` selects (the crate's module doc).
pub(crate) fn run_cases(device: &Device, cases: &[Case], opts: &RunOptions) -> crate::Report {
    let name = device.name();
    let selected: Vec<&Case> = cases
        .iter()
        .filter(|c| opts.filter.is_empty() || c.name.contains(&opts.filter))
        .filter(|c| !(opts.no_target_cases && matches!(c.run, Run::Target(_))))
        .collect();
    let wait = opts.wait.unwrap_or_else(|| device.default_wait());
    let described = Dut::start(device).and_then(|dut| describe(&dut, wait).map(|d| (dut, d)));
    let (dut, dev) = match described {
        Ok(x) => x,
        Err(why) => {
            // Every case reports the failed bring-up.
            let rows = selected
                .iter()
                .map(|c| CaseReport {
                    name: c.name,
                    target: name.clone(),
                    nsid: None,
                    outcome: Outcome::Fail(why.clone()),
                    elapsed: Duration::ZERO,
                })
                .collect();
            return Report {
                device: device.label(),
                desc: None,
                rows,
            };
        }
    };
    let mut rows = Vec::new();
    let io_ns = dev.io_namespace(opts.nsid);
    for c in selected.iter().filter(|c| c.scope == Scope::Controller) {
        let start = Instant::now();
        let outcome = run_one(&dut, &dev, io_ns, c, opts);
        rows.push(CaseReport {
            name: c.name,
            target: name.clone(),
            nsid: None,
            outcome,
            elapsed: start.elapsed(),
        });
    }
    let namespaces: Vec<&NsDesc> = dev
        .namespaces
        .iter()
        .filter(|n| opts.nsid.is_none_or(|want| want == n.nsid))
        .collect();
    if let (Some(want), true) = (opts.nsid, namespaces.is_empty()) {
        rows.extend(inactive_nsid_rows(&selected, &name, want, &dev));
    }
    for ns in namespaces {
        for c in selected.iter().filter(|c| c.scope == Scope::Namespace) {
            let start = Instant::now();
            let outcome = run_one(&dut, &dev, Some(ns), c, opts);
            rows.push(CaseReport {
                name: c.name,
                target: format!("{name} ns={}", ns.nsid),
                nsid: Some(ns.nsid),
                outcome,
                elapsed: start.elapsed(),
            });
        }
    }
    Report {
        device: device.label(),
        desc: Some(dev),
        rows,
    }
}

//! Controller bring-up as an explicit state machine (the states are [`InitState`], beside
//! the layer's error that names them; one step function, [`Bringup::step`]),
//! as in SPDK's `nvme_ctrlr.c` and the spec's section 3.5.1 ("Memory-based Controller
//! Initialization"): read CAP/VS → disable (CC.EN = 0, wait CSTS.RDY = 0) → program
//! AQA/ASQ/ACQ → write CC (IOSQES = 6, IOCQES = 4, MPS = 4 KiB, CSS = all I/O command sets
//! when CAP.CSS offers them, else NVM) → enable → wait CSTS.RDY = 1 within CAP.TO × 500 ms →
//! Identify Controller → Set Features (Number of Queues) → identify the active namespaces
//! (with the Zoned Namespace Identify data for zoned ones) → Doorbell Buffer Config when
//! offered. A timeout
//! or CSTS.CFS stops bring-up with an error naming the state.
//!
//! A controller reset runs the same machine from [`InitState::Disable`] with what the first
//! bring-up learnt: it skips the Identify states and configures the same queue count and
//! shadow doorbell pages again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::hw::dma::DmaPool;
use crate::hw::mmio::Bar;
use crate::io::ZoneGeometry;
use crate::spec::identify::parse_active_ns_list;
use crate::spec::regs::{css, shutdown};
use crate::spec::zns::{IdentifyNsZoned, ID_CTRL_ZONED_ZASL, NO_LIMIT};
use crate::spec::{
    cns, csi, Aqa, Cap, Cc, Cqe, IdentifyController, IdentifyNamespace, NsFormat, NsIdDescriptors,
    Sqe, Vs, IDENTIFY_SIZE,
};

use super::admin::{backoff, AdminQueue, AdminWait};
use super::format::UnsupportedFormat;
use super::ring::ShadowPages;
use super::{CtrlrError, InitState};

/// Options for `Controller::new`.
#[derive(Clone, Debug)]
pub struct ControllerOptions {
    /// Admin queue entries (2..=4096, clamped to CAP.MQES + 1).
    pub admin_queue_entries: u16,
    /// I/O queues to request with Set Features (Number of Queues).
    pub io_queues: u16,
    /// Configure shadow doorbells when the controller offers Doorbell Buffer Config.
    pub shadow_doorbells: bool,
    /// Timeout of an admin command (bring-up, queue creation, reset), at least
    /// [`crate::nvme::qpair::MIN_TIMEOUT`].
    pub admin_timeout: Duration,
    /// The I/O command timeout of queue pairs made through `NvmeNamespace`'s
    /// `Target::create_queue` when `QueueOptions::timeout` does not say (see
    /// [`QpairOptions::timeout`](crate::nvme::qpair::QpairOptions::timeout)); at least
    /// [`crate::nvme::qpair::MIN_TIMEOUT`].
    pub io_timeout: Duration,
    /// Upper bound on DMA memory the controller's pool maps.
    pub dma_max_bytes: usize,
    /// Override of the CAP.TO bound for the ready waits (testing).
    pub ready_timeout: Option<Duration>,
    /// Deliberate faults of the controller's queue pairs, for testing test suites (off).
    #[doc(hidden)]
    pub faults: super::faults::DriverFaults,
}

impl Default for ControllerOptions {
    fn default() -> Self {
        ControllerOptions {
            admin_queue_entries: 32,
            io_queues: 64,
            shadow_doorbells: false,
            admin_timeout: Duration::from_secs(60),
            io_timeout: Duration::from_secs(30),
            dma_max_bytes: 8 << 30,
            ready_timeout: None,
            faults: super::faults::DriverFaults::NONE,
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
    /// format (see [`crate::nvme::format`]); `None` for a namespace it serves.
    pub unsupported: Option<UnsupportedFormat>,
    /// What each Read, Write and Write Zeroes carries for the protection information
    /// (PRACT, checks, reference tag; none without PI). See [`crate::nvme::format`].
    pub protection: super::format::IoProtection,
    /// The zone geometry of a zoned namespace (Zoned Namespace Command Set) the driver
    /// serves; `None` for every other namespace.
    pub zones: Option<ZoneGeometry>,
}

impl NsInfo {
    /// Capacity in bytes; `None` when NSZE x the block size does not fit in 64 bits (such
    /// a namespace is refused at bring-up: [`NsInfo::unsupported`] says so).
    pub fn size_bytes(&self) -> Option<u64> {
        self.num_blocks.checked_mul(u64::from(self.block_size))
    }
    /// Whether the driver does I/O to this namespace.
    pub fn supported(&self) -> bool {
        self.unsupported.is_none()
    }
}

/// Why a namespace of `nsze` blocks of `block_size` bytes is refused: its size in bytes
/// does not fit in 64 bits.
pub(super) fn capacity_overflow(nsze: u64, block_size: u32) -> String {
    format!(
        "its identify namespace data says nsze {nsze} ({nsze:#x}) blocks of {block_size} \
         bytes, more than 2^64 bytes, which no namespace can be"
    )
}

/// Whether a bring-up starts from nothing or re-initialises a controller after a reset.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Start {
    /// The first bring-up: every state.
    First,
    /// After a reset: from [`InitState::Disable`], without the Identify states, with what
    /// the first bring-up learnt.
    Reset,
}

/// What bring-up learns about the controller, state by state.
#[derive(Default)]
pub(super) struct Learned {
    pub cap: Cap,
    pub vs: Vs,
    /// The bound on a CSTS.RDY transition (CAP.TO, or the option overriding it).
    pub ready_limit: Duration,
    pub identify: IdentifyController,
    pub namespaces: Vec<NsInfo>,
    pub queues_granted: u16,
    /// MDTS in bytes (`u64::MAX`: no limit).
    pub max_command_bytes: u64,
    /// The shadow doorbell pages, when Doorbell Buffer Config was accepted.
    pub shadow: Option<Arc<ShadowPages>>,
    /// ZASL of the zoned Identify Controller (CNS 06h, CSI 02h), read with the first zoned
    /// namespace: `Some(Err)` when the controller refused it.
    pub zasl: Option<Result<u8, String>>,
}

/// The admin queue bring-up works with: allocated by the first bring-up, the controller's
/// own on a reset.
enum Admin<'a> {
    NotYet,
    Owned(AdminQueue),
    Borrowed(&'a mut AdminQueue),
}

/// One bring-up of one controller: the current state and what it has learnt so far.
pub(super) struct Bringup<'a> {
    state: InitState,
    start: Start,
    bar: &'a Arc<Bar>,
    pool: &'a DmaPool,
    opts: &'a ControllerOptions,
    describe: &'a str,
    admin: Admin<'a>,
    learned: Learned,
}

impl<'a> Bringup<'a> {
    /// The first bring-up of the controller behind `bar`; DMA memory comes from `pool`.
    pub(super) fn first(
        bar: &'a Arc<Bar>,
        pool: &'a DmaPool,
        opts: &'a ControllerOptions,
        describe: &'a str,
    ) -> Self {
        Bringup {
            state: InitState::ReadCapabilities,
            start: Start::First,
            bar,
            pool,
            opts,
            describe,
            admin: Admin::NotYet,
            learned: Learned::default(),
        }
    }

    /// Re-initialisation after a reset, with the controller's admin queue and what the
    /// first bring-up learnt (CAP, the ready bound, the queue count, the shadow pages).
    pub(super) fn reset(
        bar: &'a Arc<Bar>,
        pool: &'a DmaPool,
        opts: &'a ControllerOptions,
        describe: &'a str,
        admin: &'a mut AdminQueue,
        learned: Learned,
    ) -> Self {
        Bringup {
            state: InitState::Disable,
            start: Start::Reset,
            bar,
            pool,
            opts,
            describe,
            admin: Admin::Borrowed(admin),
            learned,
        }
    }

    /// Steps until [`InitState::Ready`]; returns what was learnt and, for a first
    /// bring-up, the admin queue it made.
    pub(super) fn run(mut self) -> Result<(Learned, Option<AdminQueue>), CtrlrError> {
        while self.state != InitState::Ready {
            if let Err(e) = self.step() {
                // A first bring-up that enabled the controller shuts it down again, so it
                // cannot reach the DMA memory freed with the admin queue.
                if self.start == Start::First && self.enabled() {
                    shut_down(self.bar, self.learned.cap, self.describe);
                }
                return Err(e);
            }
        }
        let admin = match self.admin {
            Admin::Owned(q) => Some(q),
            Admin::NotYet | Admin::Borrowed(_) => None,
        };
        Ok((self.learned, admin))
    }

    /// Does the work of the current state and moves to the next one.
    pub(super) fn step(&mut self) -> Result<(), CtrlrError> {
        tracing::debug!("{}: {}", self.describe, self.state);
        match self.state {
            InitState::ReadCapabilities => self.read_capabilities()?,
            InitState::Disable => self.disable()?,
            InitState::ConfigureAdminQueue => self.configure_admin_queue(),
            InitState::Enable => self.enable()?,
            InitState::IdentifyController => self.identify_controller()?,
            InitState::SetNumberOfQueues => self.set_number_of_queues()?,
            InitState::IdentifyNamespaces => self.identify_namespaces()?,
            InitState::ConfigureShadowDoorbells => self.configure_shadow_doorbells()?,
            InitState::Ready => return Ok(()),
        }
        self.state = self.next();
        Ok(())
    }

    /// Whether the controller was enabled (CSTS.RDY seen) by this bring-up.
    fn enabled(&self) -> bool {
        !matches!(
            self.state,
            InitState::ReadCapabilities
                | InitState::Disable
                | InitState::ConfigureAdminQueue
                | InitState::Enable
        )
    }

    /// The transition table.
    fn next(&self) -> InitState {
        use InitState::*;
        let first = self.start == Start::First;
        match self.state {
            ReadCapabilities => Disable,
            Disable => ConfigureAdminQueue,
            ConfigureAdminQueue => Enable,
            Enable if first => IdentifyController,
            Enable | IdentifyController => SetNumberOfQueues,
            SetNumberOfQueues if first => IdentifyNamespaces,
            SetNumberOfQueues | IdentifyNamespaces if self.wants_shadow_doorbells() => {
                ConfigureShadowDoorbells
            }
            SetNumberOfQueues | IdentifyNamespaces | ConfigureShadowDoorbells | Ready => Ready,
        }
    }

    fn wants_shadow_doorbells(&self) -> bool {
        match self.start {
            Start::First => {
                self.opts.shadow_doorbells && self.learned.identify.supports_shadow_doorbells()
            }
            Start::Reset => self.learned.shadow.is_some(),
        }
    }

    fn read_capabilities(&mut self) -> Result<(), CtrlrError> {
        let (bar, describe) = (self.bar, self.describe);
        let cap = bar.cap();
        self.learned.vs = bar.vs();
        if bar.csts().is_all_ones() {
            return Err(CtrlrError::DeviceRemoved {
                state: self.state,
                transport: describe.to_string(),
            });
        }
        if cap.css() & 1 == 0 {
            return Err(self.unsupported(format!(
                "CAP.CSS {:#x} lacks the NVM command set",
                cap.css()
            )));
        }
        if cap.mpsmin() > 0 {
            return Err(self.unsupported(format!(
                "CAP.MPSMIN is {} KiB; the driver uses 4 KiB pages",
                4u32 << cap.mpsmin()
            )));
        }
        self.learned.cap = cap;
        self.learned.ready_limit = self
            .opts
            .ready_timeout
            .unwrap_or(Duration::from_millis(cap.timeout_ms().max(500)));
        // Allocated now, before the controller is touched: a failure leaves it as it was.
        let entries = self
            .opts
            .admin_queue_entries
            .clamp(2, 4096)
            .min(cap.max_queue_entries().min(4096) as u16);
        self.admin = Admin::Owned(AdminQueue::new(bar, self.pool, entries)?);
        Ok(())
    }

    fn disable(&mut self) -> Result<(), CtrlrError> {
        let cc = self.bar.cc();
        if cc.en() {
            self.bar.set_cc(cc.with_en(false));
        }
        self.wait_ready(false)
    }

    fn configure_admin_queue(&mut self) {
        let bar = self.bar;
        let q = self.admin_queue();
        q.rewind();
        let entries = q.entries();
        bar.set_aqa(Aqa::new(entries, entries));
        bar.set_asq(q.sq_iova());
        bar.set_acq(q.cq_iova());
    }

    fn enable(&mut self) -> Result<(), CtrlrError> {
        // All I/O command sets when the controller offers the choice (CAP.CSS bit 6): the
        // commands of the Zoned Namespace Command Set need it; NVM namespaces behave the same.
        let sets = if self.learned.cap.css() & css::CAP_IO_COMMAND_SETS != 0 {
            css::CC_ALL_IO
        } else {
            css::CC_NVM
        };
        let cc = Cc::default()
            .with_iosqes(6)
            .with_iocqes(4)
            .with_mps(0)
            .with_css(sets)
            .with_ams(0)
            .with_shn(0);
        self.bar.set_cc(cc);
        self.bar.set_cc(cc.with_en(true));
        self.wait_ready(true)
    }

    fn identify_controller(&mut self) -> Result<(), CtrlrError> {
        let mut buf = vec![0u8; IDENTIFY_SIZE];
        self.admin(Sqe::identify(cns::CONTROLLER, 0, 0), Some(&mut buf))?;
        let ident = IdentifyController::parse(buf.as_slice().try_into().expect("4096 bytes"));
        if ident.sqes & 0xF > 6 || ident.cqes & 0xF > 4 {
            return Err(self.unsupported(format!(
                "SQES {:#x} / CQES {:#x}: the driver uses 64-byte SQEs and 16-byte CQEs",
                ident.sqes, ident.cqes
            )));
        }
        self.learned.max_command_bytes = ident
            .max_transfer_bytes(self.learned.cap.mpsmin())
            .unwrap_or(u64::MAX);
        self.learned.identify = ident;
        Ok(())
    }

    /// Asks for the I/O queues; a reset asks for those the first bring-up was granted.
    fn set_number_of_queues(&mut self) -> Result<(), CtrlrError> {
        let want = match self.start {
            Start::First => self.opts.io_queues.clamp(1, 0xFFFE),
            Start::Reset => self.learned.queues_granted.max(1),
        };
        let cqe = self.admin(Sqe::set_number_of_queues(want, want), None)?;
        if self.start == Start::First {
            let nsqa = (cqe.dw0 & 0xFFFF) as u16;
            let ncqa = (cqe.dw0 >> 16) as u16;
            self.learned.queues_granted = nsqa.min(ncqa).saturating_add(1).min(want);
        }
        Ok(())
    }

    fn identify_namespaces(&mut self) -> Result<(), CtrlrError> {
        let mut buf = vec![0u8; IDENTIFY_SIZE];
        let ids = match self.admin(Sqe::identify(cns::ACTIVE_NAMESPACES, 0, 0), Some(&mut buf)) {
            Ok(_) => parse_active_ns_list(buf.as_slice().try_into().expect("4096 bytes")),
            // Before NVMe 1.1 there is no active list: every NSID up to NN is a candidate.
            Err(CtrlrError::AdminCommand { .. }) => {
                (1..=self.learned.identify.nn.min(1024)).collect()
            }
            Err(e) => return Err(e),
        };
        let mut namespaces = Vec::new();
        for nsid in ids {
            if let Some(ns) = self.identify_namespace(nsid, &mut buf)? {
                namespaces.push(ns);
            }
        }
        self.learned.namespaces = namespaces;
        Ok(())
    }

    /// One namespace: its Identify data, command set and format (`None` when NSZE is 0).
    fn identify_namespace(
        &mut self,
        nsid: u32,
        buf: &mut [u8],
    ) -> Result<Option<NsInfo>, CtrlrError> {
        self.admin(Sqe::identify(cns::NAMESPACE, nsid, 0), Some(&mut *buf))?;
        let ns = IdentifyNamespace::parse((&*buf).try_into().expect("4096 bytes"));
        if ns.nsze == 0 {
            return Ok(None);
        }
        // The command set: from the Namespace Identification Descriptor list (NVMe 1.3+;
        // the CSI descriptor since 2.0). A controller that has no such list, or lists no
        // CSI, predates other command sets: NVM.
        let csi = match self.admin(
            Sqe::identify(cns::NS_ID_DESCRIPTORS, nsid, 0),
            Some(&mut *buf),
        ) {
            Ok(_) => NsIdDescriptors::parse((&*buf).try_into().expect("4096 bytes"))
                .csi
                .unwrap_or(csi::NVM),
            Err(CtrlrError::AdminCommand { .. }) => csi::NVM,
            Err(e) => return Err(e),
        };
        let mut format = NsFormat::of(&ns, csi);
        format.pif = self.guard_format(nsid, &format, buf)?;
        let mut unsupported = super::format::check(nsid, &format).err();
        let block_size = format.data_size().unwrap_or(0);
        if unsupported.is_none() && ns.nsze.checked_mul(u64::from(block_size)).is_none() {
            // The Identify data cannot be right (more than 16 EiB); a size computed from
            // it would wrap, so no byte offset or capacity is computed from it at all.
            unsupported = Some(UnsupportedFormat {
                nsid,
                format,
                why: capacity_overflow(ns.nsze, block_size),
                identify_fault: true,
            });
        }
        let mut zones = None;
        if unsupported.is_none() && csi == csi::ZONED {
            match self.zone_geometry(nsid, &ns, &format, buf)? {
                Ok(z) => zones = Some(z),
                Err(why) => {
                    unsupported = Some(UnsupportedFormat {
                        nsid,
                        format,
                        why,
                        identify_fault: false,
                    })
                }
            }
        }
        let protection = match unsupported {
            None => super::format::IoProtection::of(&format),
            Some(_) => super::format::IoProtection::NONE,
        };
        match &unsupported {
            Some(u) if u.identify_fault => tracing::warn!("{}: {u}", self.describe),
            Some(u) => tracing::warn!("{}: no i/o to {u}", self.describe),
            None => {}
        }
        let ident = &self.learned.identify;
        Ok(Some(NsInfo {
            nsid,
            block_size,
            num_blocks: ns.nsze,
            write_zeroes: ident.supports_write_zeroes(),
            deallocate: ident.supports_dsm(),
            identify: ns,
            format,
            unsupported,
            protection,
            zones,
        }))
    }

    /// The guard's size (PIF) of namespace `nsid`'s format: a controller with extended LBA
    /// formats (CTRATT.ELBAS) says in the NVM Command Set Identify Namespace whether the
    /// PI has a 16-, 32- or 64-bit guard; only the first is implemented, so a protected
    /// namespace whose PIF cannot be read is treated as not 16-bit (refused). 0 without PI
    /// or without extended LBA formats.
    fn guard_format(
        &mut self,
        nsid: u32,
        format: &NsFormat,
        buf: &mut [u8],
    ) -> Result<u8, CtrlrError> {
        if format.pi_type == 0
            || format.csi != csi::NVM
            || !self.learned.identify.extended_lba_formats()
        {
            return Ok(format.pif);
        }
        match self.admin(
            Sqe::identify_csi(cns::NAMESPACE_CSI, nsid, csi::NVM, 0),
            Some(&mut *buf),
        ) {
            Ok(_) => Ok(crate::spec::identify::nvm_elbaf_pif(
                (&*buf).try_into().expect("4096 bytes"),
                format.lbaf_index as usize,
            )),
            Err(CtrlrError::AdminCommand { .. }) => Ok(3),
            Err(e) => Err(e),
        }
    }

    /// The zone geometry of zoned namespace `nsid`: its zoned Identify Namespace (CNS 05h)
    /// and the controller's ZASL (CNS 06h, read once). `Ok(Err(why))`: the namespace
    /// cannot be served.
    fn zone_geometry(
        &mut self,
        nsid: u32,
        ns: &IdentifyNamespace,
        format: &NsFormat,
        buf: &mut [u8],
    ) -> Result<Result<ZoneGeometry, String>, CtrlrError> {
        if self.learned.cap.css() & css::CAP_IO_COMMAND_SETS == 0 {
            return Ok(Err(format!(
                "the controller cannot be enabled with all i/o command sets (CAP.CSS {:#x} \
                 lacks bit 6), so the zoned commands are not available",
                self.learned.cap.css()
            )));
        }
        if self.learned.zasl.is_none() {
            let sqe = Sqe::identify_csi(cns::CONTROLLER_CSI, 0, csi::ZONED, 0);
            self.learned.zasl = Some(match self.admin(sqe, Some(&mut *buf)) {
                Ok(_) => Ok(buf[ID_CTRL_ZONED_ZASL]),
                Err(CtrlrError::AdminCommand { status, .. }) => Err(format!(
                    "the zoned identify controller (cns 06h, csi 02h) failed: {status}"
                )),
                Err(e) => return Err(e),
            });
        }
        let zasl = match self.learned.zasl.clone().expect("read above") {
            Ok(z) => z,
            Err(why) => return Ok(Err(why)),
        };
        let sqe = Sqe::identify_csi(cns::NAMESPACE_CSI, nsid, csi::ZONED, 0);
        match self.admin(sqe, Some(&mut *buf)) {
            Ok(_) => {}
            Err(CtrlrError::AdminCommand { status, .. }) => {
                return Ok(Err(format!(
                    "the zoned identify namespace (cns 05h, csi 02h) failed: {status}"
                )))
            }
            Err(e) => return Err(e),
        }
        let z = IdentifyNsZoned::parse(
            (&*buf).try_into().expect("4096 bytes"),
            format.lbaf_index as usize,
        );
        if z.zsze == 0 || z.zsze > ns.nsze {
            return Ok(Err(format!(
                "the zone size (zsze {}) is zero or larger than the namespace ({} blocks)",
                z.zsze, ns.nsze
            )));
        }
        let limit = |v: u32| (v != NO_LIMIT).then(|| v.saturating_add(1));
        let mdts = self.learned.max_command_bytes;
        let zasl_bytes = if zasl == 0 {
            mdts
        } else {
            let shift = 12 + u32::from(self.learned.cap.mpsmin()) + u32::from(zasl);
            if shift >= 63 {
                u64::MAX
            } else {
                1u64 << shift
            }
        };
        Ok(Ok(ZoneGeometry {
            zone_size: z.zsze,
            zones: ns.nsze / z.zsze,
            max_open: limit(z.mor),
            max_active: limit(z.mar),
            zasl_bytes,
            zoc: z.zoc,
        }))
    }

    /// Doorbell Buffer Config: a first bring-up allocates the pages and lives without them
    /// if the controller refuses; a reset clears the pages in use and requires them.
    fn configure_shadow_doorbells(&mut self) -> Result<(), CtrlrError> {
        let pages = match (&self.learned.shadow, self.start) {
            (Some(p), Start::Reset) => {
                p.clear();
                Arc::clone(p)
            }
            _ => Arc::new(ShadowPages::new(self.pool)?),
        };
        let sqe = Sqe::doorbell_buffer_config(pages.db_iova(), pages.ei_iova());
        match self.admin(sqe, None) {
            Ok(_) => self.learned.shadow = Some(pages),
            Err(CtrlrError::AdminCommand { status, .. }) if self.start == Start::First => {
                tracing::info!(
                    "{}: doorbell buffer config refused ({status}); using mmio doorbells only",
                    self.describe
                );
            }
            Err(e) => return Err(e),
        }
        Ok(())
    }

    fn admin_queue(&mut self) -> &mut AdminQueue {
        match &mut self.admin {
            Admin::Owned(q) => q,
            Admin::Borrowed(q) => q,
            Admin::NotYet => unreachable!("the admin queue is allocated in ReadCapabilities"),
        }
    }

    /// Runs an admin command; its data, if `out` is given, is copied there.
    fn admin(&mut self, sqe: Sqe, out: Option<&mut [u8]>) -> Result<Cqe, CtrlrError> {
        let wait = AdminWait {
            bar: self.bar,
            describe: self.describe,
            timeout: self.opts.admin_timeout,
        };
        let q = self.admin_queue();
        match out {
            Some(out) => q.execute_read(sqe, out, &wait),
            None => q.execute(sqe, &wait),
        }
    }

    fn unsupported(&self, why: String) -> CtrlrError {
        CtrlrError::Unsupported {
            transport: self.describe.to_string(),
            why,
        }
    }

    fn check_csts(&self) -> Result<(), CtrlrError> {
        let csts = self.bar.csts();
        let transport = self.describe.to_string();
        if csts.is_all_ones() {
            return Err(CtrlrError::DeviceRemoved {
                state: self.state,
                transport,
            });
        }
        if csts.cfs() {
            return Err(CtrlrError::Fatal {
                state: self.state,
                transport,
            });
        }
        Ok(())
    }

    /// Waits for CSTS.RDY to become `want`, within the ready bound.
    fn wait_ready(&self, want: bool) -> Result<(), CtrlrError> {
        let start = Instant::now();
        let limit = self.learned.ready_limit;
        let mut round = 0;
        loop {
            let csts = self.bar.csts();
            if csts.is_all_ones() {
                return Err(CtrlrError::DeviceRemoved {
                    state: self.state,
                    transport: self.describe.to_string(),
                });
            }
            if csts.rdy() == want {
                return Ok(());
            }
            // CFS while enabling is fatal; while disabling, a fatal controller still
            // clears RDY, so keep waiting for that.
            if want && csts.cfs() {
                return self.check_csts();
            }
            let waited = start.elapsed();
            if waited > limit {
                return Err(CtrlrError::Timeout {
                    state: self.state,
                    waited_ms: waited.as_millis() as u64,
                    limit_ms: limit.as_millis() as u64,
                    transport: self.describe.to_string(),
                });
            }
            backoff(&mut round);
        }
    }
}

/// Shuts the controller down (CC.SHN normal, wait for SHST complete, bounded by CAP.TO),
/// then disables it, so nothing it does can reach DMA memory once that is unmapped. Does
/// nothing to a controller that is gone or not enabled.
pub(super) fn shut_down(bar: &Bar, cap: Cap, describe: &str) {
    if bar.csts().is_all_ones() {
        return;
    }
    let cc = bar.cc();
    if !cc.en() {
        return;
    }
    bar.set_cc(cc.with_shn(shutdown::SHN_NORMAL));
    let limit = Duration::from_millis(cap.timeout_ms().clamp(500, 10_000));
    let start = Instant::now();
    let mut round = 0;
    while bar.csts().shst() != shutdown::SHST_COMPLETE {
        if start.elapsed() > limit {
            tracing::warn!(
                "{describe}: shutdown did not complete within {} ms",
                limit.as_millis()
            );
            break;
        }
        backoff(&mut round);
    }
    // Disable, so nothing the controller does can touch DMA memory once we unmap it.
    bar.set_cc(Cc(bar.cc().0).with_shn(0).with_en(false));
    let start = Instant::now();
    while bar.csts().rdy() && start.elapsed() < limit {
        backoff(&mut round);
    }
}

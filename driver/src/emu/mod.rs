//! A software NVMe controller, faithful to the NVMe Base Specification 1.4 where it
//! implements something, for testing every layer above the seam without hardware.
//!
//! # Shape
//! [`EmuController::start`] creates a register page ([`Bar::anonymous`]), an IOMMU
//! ([`EmuIommu`]) and a controller thread. The driver reaches the controller only through
//! [`Transport`]: it writes registers and doorbells in the page, and registers DMA memory
//! with the IOMMU through [`crate::DmaPool`]. The thread polls the page, fetches commands
//! from the submission queues in host memory, executes them against the namespaces'
//! stores, and posts completions. It owns the registers CAP, VS and CSTS (written with
//! [`Bar::device_write32`]).
//!
//! # Registers
//! CAP: MQES, CQR, DSTRD and TO from [`EmuConfig`]; AMS round robin only; CSS = NVM;
//! MPSMIN 0 (4 KiB), MPSMAX 4 (64 KiB). VS 1.4.0. CC.EN 0→1 validates AQA, ASQ, ACQ
//! (4 KiB aligned, admin queues of 2..=4096 entries inside registered memory), CC.IOSQES
//! = 6, CC.IOCQES = 4, CC.MPS within MPSMIN..=MPSMAX, CC.CSS = NVM and CC.AMS = round
//! robin; an invalid configuration sets CSTS.CFS, a valid one sets CSTS.RDY after
//! [`EmuConfig::ready_delay`] (never, with [`EmuConfig::never_ready`]). CC.EN 1→0 is a
//! controller reset: every I/O queue is deleted, outstanding commands (including held
//! completions and Asynchronous Event Requests) are dropped, shadow doorbells are turned
//! off, features return to their defaults, CSTS is cleared; the Error Information log
//! survives. CC.SHN sets CSTS.SHST to "complete" at once (after flushing file stores), and
//! the controller stops processing commands until it is reset.
//!
//! # Memory ordering with the driver
//! - Doorbells and shadow doorbells are read with Acquire loads; the driver writes them
//!   with Release stores after writing the entries, so every SQE (and the PRP lists and
//!   data it points to) is visible once the tail that covers it is.
//! - A completion queue entry is written as dwords 0–2 (Relaxed), then dword 3 (CID,
//!   status and phase tag) with a Release store: a driver that acquire-loads dword 3 and
//!   sees the new phase sees the whole entry and all data the command moved.
//! - Data is copied with relaxed atomic word accesses (see `emu/mem.rs`); the orderings above
//!   carry it.
//!
//! # Admin commands
//! Identify (CNS 00h, 01h, 02h, 03h with the CSI descriptor), Get Log Page (01h Error Information: a ring of the 64
//! newest entries, newest first; 02h SMART / Health with live counters), Set/Get Features
//! (07h Number of Queues, 06h Volatile Write Cache, and 01h/05h/08h/0Bh kept as plain
//! values), Create/Delete I/O SQ and CQ with the spec's checks, Abort, Asynchronous
//! Event Request (up to AERL + 1 = 4 outstanding), Doorbell Buffer Config (when
//! [`EmuConfig::shadow_doorbells`]) and Keep Alive. Anything else is Invalid Command
//! Opcode. Errors the controller detects carry DNR; each is also entered in the Error
//! Information log, and the CQE's More bit says so.
//!
//! Interrupts: the emulated controller has none (a polled driver needs none). A CQ created
//! with IEN = 1 must name vector 0 (else Invalid Interrupt Vector); the vector is never
//! asserted.
//!
//! # NVM commands
//! Read, Write (FUA flushes a file store), Flush (NSID FFFFFFFFh flushes all), Write
//! Zeroes (DEAC deallocates), Dataset Management (AD deallocates; deallocated blocks read
//! as zeroes, DLFEAT = 09h). PRP1/PRP2/PRP lists, chained lists included, with the
//! offset rules of spec 4.3 (PRP Offset Invalid otherwise). Every IOVA is translated
//! through the IOMMU; one outside the registered mappings fails the command with Data
//! Transfer Error before any data moves. MDTS, NSID and LBA range are checked; SGLs are
//! not supported (PSDT ≠ 0 is Invalid Field); the metadata pointer is ignored.
//!
//! # Doorbell errors
//! A doorbell value out of range (SQ tail ≥ size; CQ head ≥ size or past the last posted
//! entry) is ignored, counted, entered in the Error Information log (SQID = the queue,
//! CID = FFFFh, Command Specific Information = the value) and reported by an Asynchronous
//! Event (type Error, info 01h "Invalid Doorbell Write Value", log page 01h). A write to
//! the doorbell of a queue that does not exist ("Invalid Doorbell Register", info 00h) is
//! noticed by a scan of all doorbell registers, made every 1024 busy passes and before
//! each idle sleep. After an Error event is delivered, further Error events are masked
//! until the host reads log page 01h with RAE = 0 (spec 5.2).
//!
//! # Shadow doorbells (Doorbell Buffer Config)
//! After Doorbell Buffer Config (PRP1: shadow doorbell page, PRP2: EventIdx page, both
//! page aligned), the I/O queues (not the admin queue, as Linux uses it) are driven by the
//! shadow page: the controller reads SQ tails and CQ heads from it every pass, and the
//! shadow value is the doorbell value (as in QEMU). An MMIO doorbell write of an I/O queue
//! is only a notification: the host stores the shadow value first and then writes the same
//! value to MMIO when EventIdx asks, and may store newer shadow values without MMIO, so a
//! pass that read the register before that write and the shadow after a newer value sees
//! the MMIO write only in its next pass, older than what it already took. Honouring it would
//! move the SQ tail (or CQ head) backwards and run a lap of stale entries again; a host
//! must therefore keep the shadow page current for every I/O queue once it configured it.
//! EventIdx policy for a polling controller: while it is actively polling, each
//! queue's EventIdx is kept at (consumed value − 1) modulo the queue size (always a valid
//! index), so the driver's `need_event` check
//! says no MMIO write is needed; before the controller backs off to sleep (see below) it
//! sets EventIdx = consumed value, so the next update also rings the MMIO doorbell. Either
//! way the controller polls the shadow page on every pass, so no update is ever lost; a
//! missed MMIO write only costs latency. Queues existing when the command runs get their
//! shadow entries seeded with the current values; a queue created later takes its shadow
//! entries as the host left them (as QEMU does: the host must zero them before creating the
//! queue, or a stale value from an earlier queue with the same QID is read as new). [`EmuStats`] counts shadow and MMIO doorbell observations separately.
//!
//! # Idle policy
//! Many emulators may share two cores in tests. After the last work the thread spins for
//! 30 µs, then yields until 100 µs, then sleeps (parks) with intervals doubling from
//! 10 µs up to 200 µs (never past a held completion's due time or the CSTS.RDY delay).
//! Any work resets it. When busy, each pass fetches at most 64 commands per I/O SQ (8 for
//! the admin SQ), round robin, and never fetches a command whose completion would not fit
//! in its CQ (the SQ waits until the host frees CQ entries).
//!
//! # Latency
//! With [`EmuConfig::latency`], completions of I/O commands are held until their fetch
//! time plus the latency, in a bounded queue (its bound is the sum of the CQ sizes, since
//! CQ space is reserved at fetch time); admin commands complete at once.
//!
//! # Stores
//! [`EmuStore::Memory`]: sparse 64 KiB chunks allocated on first write, O(1) lookup;
//! unwritten blocks read as zeroes. [`EmuStore::File`]: pread/pwrite on a file created
//! sparse at the namespace size (it persists across runs; deallocation punches holes).
//! [`EmuStore::Null`]: no data movement at all — writes are dropped and reads leave the
//! host buffer untouched (not even zeroed), like QEMU's null-co, so benchmarks measure the
//! driver; the PRPs are still walked and translated.
//!
//! # Fault injection
//! [`EmuFaults`] (from [`EmuController::faults`], or [`EmuConfig::faults`] at start)
//! selects commands by queue kind and opcode, at a rate rolled by a seeded,
//! deterministic RNG, and: completes them with a chosen status without executing them;
//! delays their completion; drops it (a lost command: it executes, nothing is posted);
//! posts it twice; or posts an extra CQE with a CID that is not outstanding. It can also
//! set CSTS.CFS and stop (controller fatal; a reset recovers), or remove the controller
//! (the register page reads all ones, doorbells are ignored, nothing more is processed),
//! now or after a number of I/O commands. A delayed completion can be aborted; a dropped
//! one cannot (Abort says "not aborted"). [`EmuFaults::post_raw_cqe`] posts a completion
//! entry entirely described by the caller (any CID and status, phase tag set by the
//! controller) on a given CQ, for fuzzing a driver's completion path.
//!
//! The spec-string grammar (for `kestrel perf --target emu:faults=...`) avoids `,`, `=`
//! and `:` so it nests in a comma-separated target string. Items are joined by `+`,
//! fields by `/`:
//!
//! ```text
//! spec    = item *( "+" item )
//! item    = "status/" cmd "/" status *( "/" opt )   ; complete with status, not executed
//!         | "delay/"  cmd "/" duration *( "/" opt ) ; post the completion later
//!         | "drop/"   cmd *( "/" opt )              ; never post the completion
//!         | "dup/"    cmd *( "/" opt )              ; post the completion twice
//!         | "spurious/" cmd *( "/" opt )            ; extra CQE with an unknown CID
//!         | "fatal/after/" N                        ; CSTS.CFS after N I/O commands
//!         | "remove/after/" N                       ; surprise removal after N I/O commands
//!         | "seed/" N                               ; RNG seed (default 1)
//! cmd     = "read" | "write" | "flush" | "wz" | "dsm" | "io" (any I/O command)
//!         | "admin" (any admin command but AER) | "0x" HEX (I/O opcode) | "admin0x" HEX
//! status  = HEX "-" HEX (SCT-SC, e.g. 2-81) | "internal" | "dte" | "read-error"
//!         | "write-fault" | "not-ready" | "abort" | "transient"
//! duration= N ("ns" | "us" | "ms" | "s")
//! opt     = "dnr" (status only) | RATE "%" | FRACTION (with a dot: 0.001)
//!         | "max" N (at most N injections) | "cid" N (spurious CID, default 65535)
//! ```
//!
//! Example: `status/read/2-81/dnr/1%+drop/write/0.1%+delay/io/5ms/2%+seed/7`. The first
//! rule that matches a command and wins its roll applies; rules without a rate apply to
//! every matching command.
//!
//! # Test support (hidden from the documentation)
//! [`EmuController::pause`] stops the controller thread between two passes; from then on
//! [`EmuController::step`] runs one pass on the caller's thread, so a test or fuzz target
//! drives the controller deterministically without thread hand-offs. `testkit` has a
//! hand-driven queue pair (`RawQueue`) for playing the host through raw rings, as the
//! emulator's own tests do; the fuzz targets in `fuzz/` use both.
//!
//! # `unsafe`
//! Only in `emu/mem.rs`: the IOMMU and its host-memory views (and one `fallocate` call).

mod ctrl;
mod faults;
mod mem;
mod nvm;
mod store;
#[doc(hidden)]
pub mod testkit;
#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

pub use faults::{EmuFaults, FaultAction, FaultPlan, FaultRule, FaultTarget, MAX_RAW_CQES};
pub use mem::{EmuIommu, IOVA_BASE};

use crate::hw::dma::{DmaMapper, PageKind};
use crate::hw::mmio::{Bar, MmioError};
use crate::hw::transport::Transport;
use crate::spec::regs::offset;

/// Configuration of an emulated controller. `Default` gives a sensible controller with
/// one 1 GiB namespace of 4096-byte blocks in memory.
#[derive(Clone, Debug)]
pub struct EmuConfig {
    /// CAP.MQES, zero-based (1023: queues of up to 1024 entries).
    pub mqes: u16,
    /// CAP.CQR: I/O queues must be physically contiguous.
    pub cqr: bool,
    /// CAP.DSTRD: doorbell stride is `4 << dstrd` bytes (0..=8).
    pub dstrd: u8,
    /// CAP.TO in 500 ms units (at least 1).
    pub timeout_500ms: u8,
    /// Time from CC.EN 0→1 to CSTS.RDY = 1.
    pub ready_delay: Duration,
    /// Never set CSTS.RDY (for bring-up timeout tests).
    pub never_ready: bool,
    /// MDTS as a power of two of 4 KiB pages (5: 128 KiB); 0 = unlimited.
    pub mdts: u8,
    /// I/O queues granted by Set Features Number of Queues, each kind (1..=1024).
    pub max_io_queues: u16,
    /// Namespaces, NSID 1.. in order (1..=64).
    pub namespaces: Vec<EmuNamespace>,
    /// Advertise OACS bit 8 and implement Doorbell Buffer Config.
    pub shadow_doorbells: bool,
    /// A volatile write cache is present (VWC bit 0) and enabled by default.
    pub volatile_write_cache: bool,
    /// Extra delay from fetching an I/O command to posting its completion.
    pub latency: Duration,
    /// Pin the controller thread to this core. `None` leaves it the CPU affinity of the
    /// thread that calls [`EmuController::start`]: start the controller before pinning a
    /// polling thread to a core, or the two share that one core and progress only at
    /// scheduler time slices (the thread warns when it finds itself confined to one core).
    pub pin_core: Option<usize>,
    /// Identify Controller MN (up to 40 ASCII characters).
    pub model: String,
    /// Identify Controller SN (up to 20 ASCII characters).
    pub serial: String,
    /// Identify Controller FR (up to 8 ASCII characters).
    pub firmware: String,
    /// Faults installed at start (more can be set through [`EmuController::faults`]).
    pub faults: FaultPlan,
}

impl Default for EmuConfig {
    fn default() -> Self {
        EmuConfig {
            mqes: 1023,
            cqr: true,
            dstrd: 0,
            timeout_500ms: 4,
            ready_delay: Duration::ZERO,
            never_ready: false,
            mdts: 5,
            max_io_queues: 64,
            namespaces: vec![EmuNamespace::default()],
            shadow_doorbells: true,
            volatile_write_cache: true,
            latency: Duration::ZERO,
            pin_core: None,
            model: "Kestrel Emulated NVMe".into(),
            serial: "KESTREL-EMU-0001".into(),
            firmware: "0.1.0".into(),
            faults: FaultPlan::default(),
        }
    }
}

/// One emulated namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmuNamespace {
    /// Size in bytes (a multiple of `lba_size`).
    pub size_bytes: u64,
    /// Logical block size: 512 or 4096.
    pub lba_size: u32,
    /// Where the data lives.
    pub store: EmuStore,
    /// Metadata, protection and command set the namespace reports.
    pub format: EmuFormat,
}

/// What an emulated namespace reports beyond its block size: metadata, end-to-end
/// protection and its command set. The default is a plain NVM namespace.
///
/// A namespace with metadata (`ms` ≠ 0) is reported with a third LBA format (LBAF2:
/// `lba_size` data + `ms` bytes) in use; `pi_type`/`pi_first` set DPS (and DPC, MC say
/// what the controller could do). The controller does not execute I/O on a namespace
/// with metadata, protection or a command set other than NVM: every I/O command to it
/// completes with Invalid Namespace or Format. It exists so the host's refusal of such
/// formats is tested: a host that sends I/O there is caught by the status and the
/// counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct EmuFormat {
    /// MS: metadata bytes per block (0: none).
    pub ms: u16,
    /// FLBAS bit 4: metadata inline at the end of each block (an extended LBA).
    pub extended: bool,
    /// DPS bits 2:0: protection information type (0: none, 1..=3).
    pub pi_type: u8,
    /// DPS bit 3: protection information in the first bytes of the metadata.
    pub pi_first: bool,
    /// The Command Set Identifier reported in the Namespace Identification Descriptor
    /// list (0: NVM, 2: zoned, anything else: reported as is).
    pub csi: u8,
}

impl EmuFormat {
    /// Whether the controller executes I/O on a namespace of this format.
    pub fn executes_io(&self) -> bool {
        *self == EmuFormat::default()
    }
}

impl Default for EmuNamespace {
    fn default() -> Self {
        EmuNamespace {
            size_bytes: 1 << 30,
            lba_size: 4096,
            store: EmuStore::Memory,
            format: EmuFormat::default(),
        }
    }
}

impl EmuNamespace {
    /// A namespace of `size_bytes` with `lba_size` blocks on `store`.
    pub fn new(size_bytes: u64, lba_size: u32, store: EmuStore) -> Self {
        EmuNamespace {
            size_bytes,
            lba_size,
            store,
            format: EmuFormat::default(),
        }
    }
}

/// The backing store of an emulated namespace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EmuStore {
    /// Sparse memory, allocated on first write; unwritten blocks read as zeroes.
    Memory,
    /// A file (created sparse at the namespace size if shorter), read and written with
    /// pread/pwrite: the data persists across runs.
    File(PathBuf),
    /// No data movement: writes are dropped, reads leave the host buffer untouched.
    Null,
}

/// Errors starting an emulated controller.
#[derive(Debug, thiserror::Error)]
pub enum EmuError {
    /// A configuration value is out of range.
    #[error("invalid emulator configuration: {field} = {value}: {why}")]
    Config {
        /// The field.
        field: &'static str,
        /// Its value, as text.
        value: String,
        /// What is allowed.
        why: &'static str,
    },
    /// The register page could not be created.
    #[error(transparent)]
    Mmio(#[from] MmioError),
    /// A namespace's backing file could not be opened or sized.
    #[error("could not open the backing file {path} of emulated namespace {nsid}: {source}; check that the directory exists and is writable")]
    StoreFile {
        /// Namespace ID.
        nsid: u32,
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
    /// The controller thread could not be started.
    #[error("could not start the emulated controller thread: {0}")]
    Spawn(std::io::Error),
    /// A fault spec could not be parsed.
    #[error("invalid emulator fault `{item}`: {why}; see the fault grammar in the emu module documentation (e.g. status/read/2-81/dnr/1%+drop/write/0.1%)")]
    FaultSpec {
        /// The `+`-separated item that failed.
        item: String,
        /// What is wrong with it.
        why: String,
    },
}

macro_rules! emu_stats {
    ($( $(#[doc = $doc:literal])* $name:ident, )*) => {
        /// Counters of an emulated controller (a snapshot; see [`EmuController::stats`]).
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct EmuStats {
            $( $(#[doc = $doc])* pub $name: u64, )*
        }

        /// The published copy of [`EmuStats`]: written only by the controller thread
        /// (plain stores, no read-modify-write), read by anyone.
        #[derive(Default)]
        struct AtomicStats {
            $( $name: AtomicU64, )*
        }

        impl AtomicStats {
            fn publish(&self, s: &EmuStats) {
                $( self.$name.store(s.$name, Ordering::Relaxed); )*
            }
            fn load(&self) -> EmuStats {
                EmuStats { $( $name: self.$name.load(Ordering::Relaxed), )* }
            }
        }
    };
}

emu_stats! {
    /// Admin commands fetched.
    admin_commands,
    /// Read commands fetched.
    reads,
    /// Write commands fetched.
    writes,
    /// Flush commands fetched.
    flushes,
    /// Write Zeroes commands fetched.
    write_zeroes,
    /// Dataset Management commands fetched.
    dsm,
    /// I/O commands with an opcode the controller does not implement.
    io_invalid,
    /// Completion queue entries posted.
    completions,
    /// Completions with a status other than success.
    error_completions,
    /// Bytes transferred to the host by reads.
    bytes_read,
    /// Bytes transferred from the host by writes.
    bytes_written,
    /// Store failures reported as media errors.
    media_errors,
    /// Invalid doorbell writes (value out of range, or a queue that does not exist).
    doorbell_errors,
    /// Doorbell changes observed in the MMIO registers.
    mmio_doorbell_reads,
    /// Doorbell changes observed in the shadow doorbell page.
    shadow_doorbell_reads,
    /// Queue accesses that faulted in the IOMMU (a ring outside registered memory).
    dma_errors,
    /// Asynchronous Event Requests completed with an event.
    aer_completions,
    /// Controller resets (CC.EN 1→0).
    resets,
    /// Times an SQ could not be fetched from because its CQ was full.
    cq_full_stalls,
    /// Commands completed with Command Abort Requested.
    aborted,
    /// Times the controller thread went to sleep.
    idle_sleeps,
    /// Commands affected by fault rules.
    faults_injected,
    /// Raw completion queue entries posted ([`EmuFaults::post_raw_cqe`]).
    raw_cqes,
    /// Raw completion queue entries dropped: their CQ did not exist, or a reset came first.
    raw_cqes_dropped,
}

/// State shared between the controller thread and its handle.
struct Shared {
    stop: AtomicBool,
    stats: AtomicStats,
    /// Requests for a fresh publication of the counters ([`EmuController::stats`]).
    stats_req: AtomicU64,
    /// The newest request the controller thread has answered.
    stats_done: AtomicU64,
    faults: EmuFaults,
    /// Asks the controller thread to stop and hand its state to `stepper`.
    pause: AtomicBool,
    /// The paused controller's state ([`EmuController::pause`]).
    stepper: Mutex<Option<(ctrl::Ctrl, mem::Snapshot)>>,
}

/// A running emulated NVMe controller. Dropping it stops and joins the controller thread.
pub struct EmuController {
    bar: Arc<Bar>,
    iommu: Arc<EmuIommu>,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    cfg: EmuConfig,
}

impl core::fmt::Debug for EmuController {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("EmuController")
            .field("model", &self.cfg.model)
            .field("serial", &self.cfg.serial)
            .field("namespaces", &self.cfg.namespaces.len())
            .finish()
    }
}

fn check_config(cfg: &EmuConfig) -> Result<(), EmuError> {
    let bad = |field, value: String, why| Err(EmuError::Config { field, value, why });
    if cfg.mqes < 1 {
        return bad(
            "mqes",
            cfg.mqes.to_string(),
            "must be at least 1 (two entries)",
        );
    }
    if cfg.dstrd > 8 {
        return bad("dstrd", cfg.dstrd.to_string(), "must be 0..=8");
    }
    if cfg.timeout_500ms < 1 {
        return bad("timeout_500ms", "0".into(), "must be at least 1");
    }
    if cfg.mdts > 15 {
        return bad("mdts", cfg.mdts.to_string(), "must be 0..=15");
    }
    if !(1..=1024).contains(&cfg.max_io_queues) {
        return bad(
            "max_io_queues",
            cfg.max_io_queues.to_string(),
            "must be 1..=1024",
        );
    }
    if cfg.namespaces.is_empty() || cfg.namespaces.len() > 64 {
        return bad(
            "namespaces",
            cfg.namespaces.len().to_string(),
            "need 1..=64 namespaces",
        );
    }
    for ns in &cfg.namespaces {
        if ns.lba_size != 512 && ns.lba_size != 4096 {
            return bad("lba_size", ns.lba_size.to_string(), "must be 512 or 4096");
        }
        if ns.size_bytes < ns.lba_size as u64 || ns.size_bytes % ns.lba_size as u64 != 0 {
            return bad(
                "size_bytes",
                ns.size_bytes.to_string(),
                "must be a non-zero multiple of lba_size",
            );
        }
        if ns.size_bytes > 1 << 50 {
            return bad(
                "size_bytes",
                ns.size_bytes.to_string(),
                "must be at most 1 PiB",
            );
        }
    }
    for (field, s, max) in [
        ("model", &cfg.model, 40),
        ("serial", &cfg.serial, 20),
        ("firmware", &cfg.firmware, 8),
    ] {
        if s.len() > max || !s.is_ascii() {
            return bad(
                field,
                s.clone(),
                "must be ASCII and fit its Identify field (MN 40, SN 20, FR 8)",
            );
        }
    }
    Ok(())
}

impl EmuController {
    /// Starts an emulated controller with its own thread.
    pub fn start(cfg: EmuConfig) -> Result<Arc<EmuController>, EmuError> {
        check_config(&cfg)?;
        let stride = 4usize << cfg.dstrd;
        let need = offset::DOORBELLS + 2 * (cfg.max_io_queues as usize + 1) * stride;
        let bar = Arc::new(Bar::anonymous(need.max(16 << 10))?);
        let iommu = Arc::new(EmuIommu::new());
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            stats: AtomicStats::default(),
            stats_req: AtomicU64::new(0),
            stats_done: AtomicU64::new(0),
            faults: EmuFaults::new(cfg.faults.clone()),
            pause: AtomicBool::new(false),
            stepper: Mutex::new(None),
        });
        let ctrl = ctrl::Ctrl::new(&cfg, Arc::clone(&bar), Arc::clone(&shared))?;
        let snap = mem::Snapshot::new(Arc::clone(&iommu));
        iommu.set_running(true);
        let pin = cfg.pin_core;
        let iommu2 = Arc::clone(&iommu);
        let shared2 = Arc::clone(&shared);
        let bar2 = Arc::clone(&bar);
        let handle = std::thread::Builder::new()
            .name("kestrel-emu".into())
            .spawn(move || {
                if let Some(core) = pin {
                    if !core_affinity::set_for_current(core_affinity::CoreId { id: core }) {
                        tracing::warn!(core, "could not pin the emulated controller thread");
                    }
                } else if let Some([only]) = core_affinity::get_core_ids().as_deref() {
                    // The affinity inherited from the starting thread (get_core_ids reads
                    // this thread's mask).
                    tracing::warn!(
                        core = only.id,
                        "the emulated controller thread may only run on core {} (CPU affinity inherited from the thread that started it): a driver thread busy-polling on that core leaves it only scheduler time slices; start the controller before pinning that thread, or set pin_core",
                        only.id
                    );
                }
                if let Some(parts) = ctrl::run(ctrl, snap, &shared2, &bar2) {
                    // Before the state is reachable by step(): unmap must then take the
                    // step lock (mem module doc).
                    iommu2.set_stepping();
                    *shared2.stepper.lock().unwrap_or_else(|e| e.into_inner()) = Some(parts);
                }
                iommu2.set_running(false);
            })
            .map_err(|e| {
                iommu.set_running(false);
                EmuError::Spawn(e)
            })?;
        iommu.set_thread(handle.thread().clone());
        Ok(Arc::new(EmuController {
            bar,
            iommu,
            shared,
            thread: Mutex::new(Some(handle)),
            cfg,
        }))
    }

    /// The controller's counters. Exact with respect to completions: every command whose
    /// completion the caller has seen before the call is counted (the controller thread
    /// publishes fresh counters between passes on request; this waits for that, at most
    /// a second, and not at all when the thread has stopped).
    pub fn stats(&self) -> EmuStats {
        // AcqRel: the request is ordered after whatever completions the caller observed.
        let want = self.shared.stats_req.fetch_add(1, Ordering::AcqRel) + 1;
        let start = std::time::Instant::now();
        while self.shared.stats_done.load(Ordering::Acquire) < want
            && self.iommu.is_running()
            && start.elapsed() < Duration::from_secs(1)
        {
            self.iommu.wake();
            std::thread::sleep(Duration::from_micros(20));
        }
        self.shared.stats.load()
    }

    /// Test support (the fuzz targets), not part of the API: stops the controller thread
    /// between two passes; from then on the controller advances only in
    /// [`EmuController::step`] calls, so a test drives it deterministically from one
    /// thread. There is no way back. Returns false when the thread had already ended (a
    /// panic) and the controller cannot be stepped.
    #[doc(hidden)]
    pub fn pause(&self) -> bool {
        self.shared.pause.store(true, Ordering::Release);
        let h = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = h {
            h.thread().unpark();
            if h.join().is_err() {
                tracing::error!("the emulated controller thread panicked");
            }
        }
        self.shared
            .stepper
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
    }

    /// Test support: one pass of a paused controller ([`EmuController::pause`]): adopts
    /// IOMMU changes, checks CC and the doorbells of existing queues (with `scan`, also
    /// every other doorbell register, which the thread does every 1024 busy passes and
    /// before it sleeps), posts due completions, fetches and executes commands (as many
    /// per queue as one pass of the thread does), delivers events, and publishes the
    /// counters. Returns whether the pass did anything. Panics if the controller is not
    /// paused.
    #[doc(hidden)]
    pub fn step(&self, scan: bool) -> bool {
        let mut g = self
            .shared
            .stepper
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let (ctrl, snap) = g
            .as_mut()
            .expect("EmuController::step needs a paused controller (pause() first)");
        ctrl::step(ctrl, snap, &self.iommu, &self.shared, scan)
    }

    /// Fault injection controls (usable while the controller runs).
    pub fn faults(&self) -> &EmuFaults {
        &self.shared.faults
    }

    /// The configuration the controller was started with.
    pub fn config(&self) -> &EmuConfig {
        &self.cfg
    }

    /// The controller's IOMMU.
    pub fn iommu(&self) -> &Arc<EmuIommu> {
        &self.iommu
    }
}

impl Drop for EmuController {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        let h = self
            .thread
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(h) = h {
            h.thread().unpark();
            if h.join().is_err() {
                tracing::error!("the emulated controller thread panicked");
            }
        }
    }
}

impl Transport for EmuController {
    fn bar(&self) -> Arc<Bar> {
        Arc::clone(&self.bar)
    }
    fn mapper(&self) -> Arc<dyn DmaMapper> {
        Arc::clone(&self.iommu) as Arc<dyn DmaMapper>
    }
    fn page_kind(&self) -> PageKind {
        PageKind::Small
    }
    fn describe(&self) -> String {
        "emulator".into()
    }
}

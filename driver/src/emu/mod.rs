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
//! CAP: MQES, CQR, DSTRD and TO from [`EmuConfig`]; AMS round robin only; CSS bits 0
//! (NVM) and 6 (I/O Command Sets); MPSMIN 0 (4 KiB), MPSMAX 4 (64 KiB). VS 1.4.0. CC.EN
//! 0→1 validates AQA, ASQ, ACQ (4 KiB aligned, admin queues of 2..=4096 entries inside
//! registered memory), CC.IOSQES = 6, CC.IOCQES = 4, CC.MPS within MPSMIN..=MPSMAX, CC.CSS
//! = NVM (000b) or All Supported I/O Command Sets (110b, as QEMU accepts it; only then
//! are the zoned commands available) and CC.AMS = round robin; an invalid configuration sets CSTS.CFS, a valid one sets CSTS.RDY after
//! [`EmuConfig::ready_delay`] (never, with [`EmuConfig::never_ready`]). CC.EN 1→0 is a
//! controller reset: every I/O queue is deleted, outstanding commands (including held
//! completions and Asynchronous Event Requests) are dropped, shadow doorbells are turned
//! off, features return to their defaults, CSTS is cleared; the Error Information log
//! survives. CC.SHN sets CSTS.SHST to "complete" at once (after flushing file stores), and
//! the controller stops processing commands until it is reset.
//!
//! # Memory ordering with the driver
//! The controller plays the device with the driver's own primitives (`hw::barrier`), each
//! paired with the driver's:
//! - Doorbell registers are read with [`Bar::read32`], which ends with `dma_rmb`, and
//!   shadow doorbells with a relaxed load then `dma_rmb` (`ctrl/doorbells.rs`); the driver
//!   puts `dma_wmb` between writing the entries and storing the value, so every SQE (and
//!   the PRP lists and data it points to) is visible once the tail that covers it is.
//! - A completion queue entry is written as dwords 0–2 (relaxed), `dma_wmb`, then dword 3
//!   (CID, status and phase tag) (`ctrl/completions.rs`): a driver that reads dword 3,
//!   sees the new phase and issues `dma_rmb` sees the whole entry and all data the command
//!   moved.
//! - Arming EventIdx before a sleep ends with `dma_mb`, pairing with the driver's `dma_mb`
//!   between its shadow store and its EventIdx load.
//! - Data is copied with relaxed atomic word accesses (see `emu/mem.rs`); the orderings
//!   above carry it. The register page is reached only through [`Bar`], whose accesses are
//!   atomic in Rust's model (`hw::barrier::read_once`/`write_once`), as the driver's are.
//!
//! # Admin commands
//! Identify (CNS 00h, 01h, 02h, 03h with the CSI descriptor; 05h and 06h for CSI 00h, all
//! zeroes, and 02h, the zoned structures; 1Ch, one I/O Command Set combination: NVM and
//! zoned), Get Log Page (01h Error Information: a ring of the 64 newest entries, newest
//! first; 02h SMART / Health with live counters), Set/Get Features (07h Number of Queues,
//! 06h Volatile Write Cache, 19h I/O Command Set Profile (index 0 only), and
//! 01h/05h/08h/0Bh kept as plain values), Create/Delete I/O SQ and CQ with the spec's checks, Abort, Asynchronous
//! Event Request (up to AERL + 1 = 4 outstanding), Doorbell Buffer Config (when
//! [`EmuConfig::shadow_doorbells`]) and Keep Alive. Anything else is Invalid Command
//! Opcode. Errors the controller detects carry DNR; each is also entered in the Error
//! Information log, and the CQE's More bit says so.
//!
//! # Interrupts
//! The controller has `max_io_queues + 1` interrupt vectors (one per queue ID, as QEMU's
//! MSI-X table), each routed to an eventfd when the host asks for it
//! ([`Transport::interrupt`]). A CQ created with IEN = 1 names its vector in IV (a vector
//! past the last is Invalid Interrupt Vector); the admin CQ uses vector 0. Posting a CQE to
//! such a CQ makes the vector pending; at the end of the pass each pending vector is
//! signalled once (aggregation: one message however many entries the pass posted), unless
//! Interrupt Coalescing (Set Features 08h) holds it back: then it is signalled once THR + 1
//! entries are pending or TIME × 100 µs has passed since the first of them (the idle sleep
//! wakes for that time; coalescing does not apply to the admin CQ; NVMe 1.4, 5.21.1.8). An
//! unrouted vector's messages go nowhere. As with MSI-X, nothing is signalled again for
//! entries the host has not consumed: a host reads the eventfd to clear it, then looks at
//! the CQ once more before it sleeps. Interrupt Vector Configuration (09h) and the
//! INTMS/INTMC registers (pin-based and MSI only) are not implemented.
//!
//! # NVM commands
//! Read, Write (FUA flushes a file store), Flush (NSID FFFFFFFFh flushes all), Write
//! Zeroes (DEAC deallocates), Dataset Management (AD deallocates; deallocated blocks read
//! as zeroes, DLFEAT = 09h). PRP1/PRP2/PRP lists, chained lists included, with the
//! offset rules of spec 4.3 (PRP Offset Invalid otherwise). Every IOVA is translated
//! through the IOMMU; one outside the registered mappings fails the command with Data
//! Transfer Error before any data moves. MDTS, NSID and LBA range are checked; SGLs are
//! not supported (PSDT ≠ 0 is Invalid Field). The metadata pointer is used only by
//! namespaces with separate metadata (below).
//!
//! # Namespace formats
//! Each namespace has its own [`EmuFormat`], so one controller can hold namespaces of
//! different formats. Identify Namespace reports LBAF0 (512 B), LBAF1 (4 KiB) and, with
//! metadata, LBAF2 (the namespace's data size + MS bytes) in use, with FLBAS bit 4 for
//! extended LBAs, DPS as configured, DPC = 1Fh and MC = 3h.
//!
//! - **Separate metadata** (FLBAS bit 4 = 0): MPTR points to one contiguous buffer of NLB
//!   × MS bytes, dword aligned (else Invalid Field), translated through the IOMMU like
//!   data (outside registered memory: Data Transfer Error). SGL metadata is not offered.
//! - **Extended LBAs**: each block's MS bytes follow its data; the PRPs describe NLB ×
//!   (LBA size + MS) bytes, and MDTS counts the metadata.
//! - **Protection information** (types 1–3, 8 bytes first or last in the metadata, 16-bit
//!   T10-DIF guard over the data and the metadata before the PI, [`crate::spec::pi`]):
//!   PRCHK (CDW12 bits 28:26) selects the guard, application tag (CDW15 ELBAT under
//!   ELBATM) and reference tag (CDW14 EILBRT, + 1 per block; type 3: never checked)
//!   checks, made on writes with PRACT = 0 and on every read; an application tag FFFFh
//!   (type 3: and a reference tag FFFFFFFFh) disables a block's checks. Failures are
//!   End-to-end Guard / Application Tag / Reference Tag Check Error (SCT 2h, SC 82h–84h,
//!   DNR), and the whole command moves nothing: it is checked before anything is stored
//!   or copied to the host. Type 1 with the reference tag checked needs EILBRT = the
//!   SLBA's low 32 bits (else Invalid Protection Information). PRACT = 1 on a write
//!   generates the PI (guard, ELBAT, EILBRT + i); with MS = 8 no metadata crosses the
//!   wire at all, and a read with PRACT = 1 checks and then strips it. With MS > 8 the
//!   rest of the metadata is the host's. Write Zeroes with PRACT generates the zeroed
//!   blocks' PI; without, their PI reads as all ones, like a block never written.
//! - **Zoned namespaces** (CSI 02h, [`EmuZones`]): zones of a fixed size, every one
//!   Sequential Write Required with one capacity (ZCAP: the zone size, or less), MAR/MOR
//!   limits. The write-pointer rule applies to Write, Write Zeroes and Zone Append: Zone
//!   Boundary Error past the zone's capacity, Zone Is Full, Zone Invalid Write off the
//!   write pointer; an Empty or Closed zone opens implicitly (Too Many Active Zones past
//!   MAR; past MOR an implicitly opened zone is closed to make room, else Too Many Open
//!   Zones); a zone whose write pointer reaches the end of its capacity is Full. Zone Append (7Dh) writes at the write
//!   pointer of the zone its SLBA starts and returns the LBA in CQE DW0/DW1. Zone
//!   Management Send (79h): Open, Close, Finish, Reset (deallocates), with Select All;
//!   invalid transitions are Invalid Zone State Transition; Offline and Set Zone
//!   Descriptor Extension are refused. Zone Management Receive (7Ah): Report Zones with
//!   the reporting options and the Partial Report bit (no descriptor extensions: ZDES
//!   0). Reads may cross zones (OZCS RAZB). Read Only and Offline zones never occur. The
//!   zoned commands need CC.CSS = 110b; with CC.CSS = NVM they are Invalid Command
//!   Opcode, while writes still obey the write pointer.
//! - A namespace of any other command set (Key Value, unknown) is reported with its CSI,
//!   and every I/O command to it completes with Invalid Namespace or Format.
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
//! driver; the PRPs (and MPTR) are still walked and translated, but no PI is checked.
//! Metadata is kept in the same store after the data (a memory store's chunks, or the
//! file's bytes past the data); the PI bytes are stored inverted, so blocks never written
//! or deallocated read back with all-ones PI (DLFEAT bit 4 = 0: guard FFFFh), or, with
//! [`EmuFormat::zeroed_pi`], as they are, so blocks never written read back with all-zero
//! PI and fail a reference tag check (as on QEMU's model, for blocks near written ones;
//! deallocated blocks then get all-ones PI stored, as the spec says).
//!
//! # Fault injection
//! [`EmuFaults`] (from [`EmuController::faults`], or [`EmuConfig::faults`] at start)
//! selects commands by queue kind and opcode, at a rate rolled by a seeded,
//! deterministic RNG, and: completes them with a chosen status without executing them;
//! delays their completion; drops it (a lost command: it executes, nothing is posted);
//! posts it twice; or posts an extra CQE with a CID that is not outstanding; or, for a
//! Read of a namespace with protection information, flips one bit of the guard,
//! application tag or reference tag of its first block on the way from the media (the
//! stored copy stays intact), before the controller's PRCHK checks and before the host
//! sees it, so both the controller's and a driver's own PI error paths can be exercised. It can also
//! set CSTS.CFS and stop (controller fatal; a reset recovers), or remove the controller
//! (the register page reads all ones, doorbells are ignored, nothing more is processed),
//! now or after a number of I/O commands. A delayed completion can be aborted; a dropped
//! one cannot (Abort says "not aborted"). And it can make Identify Namespace report an
//! NSZE (and NCAP and NUSE) the namespaces do not have, such as one whose size in bytes
//! does not fit in 64 bits, for a driver's checks of what a device says. [`EmuFaults::post_raw_cqe`] posts a completion
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
//!         | "pi-guard/" cmd *( "/" opt )            ; a Read's PI guard corrupted
//!         | "pi-app/"   cmd *( "/" opt )            ; ... its application tag
//!         | "pi-ref/"   cmd *( "/" opt )            ; ... its reference tag
//!         | "fatal/after/" N                        ; CSTS.CFS after N I/O commands
//!         | "remove/after/" N                       ; surprise removal after N I/O commands
//!         | "seed/" N                               ; RNG seed (default 1)
//!         | "nsze/" N                               ; Identify Namespace reports NSZE N
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

mod config;
mod ctrl;
mod error;
mod faults;
mod irq;
mod mem;
mod ns;
mod nvm;
mod prp;
mod store;
#[doc(hidden)]
pub mod testkit;
#[cfg(test)]
mod tests;
mod zns;

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

pub use config::{EmuConfig, EmuFormat, EmuNamespace, EmuStore, EmuZones, MAX_METADATA};
pub use error::EmuError;
pub use faults::{
    EmuFaults, FaultAction, FaultPlan, FaultRule, FaultTarget, PiField, MAX_RAW_CQES,
};
pub use mem::{EmuIommu, IOVA_BASE};

use crate::hw::dma::{DmaMapper, PageKind};
use crate::hw::mmio::Bar;
use crate::hw::transport::Transport;
use crate::spec::regs::offset;

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
    /// Zone Append commands fetched.
    zone_appends,
    /// Zone Management Send commands fetched.
    zone_mgmt_sends,
    /// Zone Management Receive commands fetched.
    zone_mgmt_receives,
    /// I/O commands with an opcode the controller does not implement.
    io_invalid,
    /// Commands failed by an end-to-end protection check (guard, application or
    /// reference tag).
    pi_errors,
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
    /// Interrupt messages signalled (to routed vectors).
    interrupts,
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
    /// Interrupt vectors and their eventfds.
    irqs: irq::IrqTable,
}

/// A running emulated NVMe controller. Dropping it stops and joins the controller thread.
pub struct EmuController {
    bar: Arc<Bar>,
    iommu: Arc<EmuIommu>,
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    cfg: EmuConfig,
    /// The (vector, CPU) pairs [`Transport::steer_interrupt`] was asked for, oldest first
    /// (the last [`STEER_LOG_LEN`]): the emulator's vectors have no host IRQ to move.
    steered: Mutex<VecDeque<(u16, usize)>>,
}

/// Steering requests [`EmuController::interrupt_steering`] remembers.
pub const STEER_LOG_LEN: usize = 64;

impl core::fmt::Debug for EmuController {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("EmuController")
            .field("model", &self.cfg.model)
            .field("serial", &self.cfg.serial)
            .field("namespaces", &self.cfg.namespaces.len())
            .finish()
    }
}

impl EmuController {
    /// Starts an emulated controller with its own thread.
    pub fn start(cfg: EmuConfig) -> Result<Arc<EmuController>, EmuError> {
        config::check_config(&cfg)?;
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
            irqs: irq::IrqTable::new(cfg.max_io_queues + 1),
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
            steered: Mutex::new(VecDeque::new()),
        }))
    }

    /// The (vector, CPU) pairs the host asked to steer interrupts to, oldest first (the
    /// last [`STEER_LOG_LEN`]). Nothing moves: this records what a driver asked for.
    pub fn interrupt_steering(&self) -> Vec<(u16, usize)> {
        let g = self.steered.lock().unwrap_or_else(|p| p.into_inner());
        g.iter().copied().collect()
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
    fn interrupt_vectors(&self) -> u16 {
        self.shared.irqs.len()
    }
    fn interrupt(&self, vector: u16) -> std::io::Result<Arc<std::os::fd::OwnedFd>> {
        self.shared.irqs.route(vector)
    }
    fn steer_interrupt(&self, vector: u16, cpu: usize) -> std::io::Result<()> {
        let mut g = self.steered.lock().unwrap_or_else(|p| p.into_inner());
        if g.len() == STEER_LOG_LEN {
            g.pop_front();
        }
        g.push_back((vector, cpu));
        Ok(())
    }
}

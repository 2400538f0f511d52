//! Kestrel: a polled-mode, userspace NVMe driver.
//!
//! Layers, bottom up (see `docs/architecture.md`):
//! - [`spec`]: NVMe definitions, pure data.
//! - [`parse`]: the grammars of values people type (sizes, durations, core lists, PCI
//!   addresses, target strings), pure functions every layer may use.
//! - [`mmio`]: register and doorbell access over a mapped BAR.
//! - [`dma`]: device-visible memory with IOVAs.
//! - [`pci`]: sysfs discovery of NVMe controllers, IOMMU groups and hugepages.
//! - [`transport`]: the seam a controller is reached through (VFIO or the emulator).
//! - [`emu`]: a software NVMe controller behind that seam, for tests without hardware.
//! - [`vfio`]: the transport to a controller bound to vfio-pci.
//! - [`io`]: request and completion types shared by all targets.
//! - [`format`]: which namespace formats the driver implements; every other is refused.
//! - [`ctrlr`]: controller bring-up, admin queue, qpair creation.
//! - [`qpair`]: I/O queue pairs, the hot path.
//! - [`target`]: the trait over NVMe namespaces and file targets.
//! - [`file`](mod@file): a file or block device as a target, through io_uring.
//! - [`aio`]: the aio-style API (contexts, iocbs, events), run-to-completion or
//!   cross-thread, and [`reactor`] (also [`aio::reactor`]): pinned per-core pollers
//!   serving cross-thread contexts through lock-free rings ([`aio::spsc`],
//!   [`aio::notify`]).
//! - [`target_spec`]: opening what a target string (`emu:...`, `file:...`, `pci:...`)
//!   names.
//! - [`capi`]: the C ABI (`include/kestrel.h`), over [`aio`] and [`reactor`].
#![deny(missing_docs)]
// `SubmitError::Busy` hands the refused request back by value, so back-pressure costs no
// allocation; the success path returns `Ok(())`, so the large error variant is only
// copied when a queue is full.
#![allow(clippy::result_large_err, clippy::large_enum_variant)]

pub mod aio;
pub mod capi;
pub mod clock;
pub mod ctrlr;
pub mod dma;
pub mod emu;
pub mod file;
pub mod format;
pub mod io;
pub mod limits;
pub mod mmio;
pub mod parse;
pub mod pci;
pub mod prp;
pub mod qpair;
pub mod ring;
pub mod spec;
pub mod target;
pub mod target_spec;
pub mod transport;
pub mod vfio;

/// The reactor, at the top level as well: `kestrel::reactor::Reactor`.
pub use aio::reactor;
pub use aio::{AioError, CancelOutcome, ContextOptions, Event, IoBuf, IoContext, Iocb, Opcode};
pub use ctrlr::{Controller, ControllerOptions, NvmeNamespace};
pub use dma::{DmaBuf, DmaPool, DmaSlice};
pub use io::{Completion, IoError, IoOp, IoRequest, QueueStats, SubmitError};
pub use qpair::{DoorbellMode, IoQpair, QpairOptions};
pub use reactor::{IdlePolicy, Reactor, ReactorBuilder, ReactorError};
pub use target::{QueueOptions, Target, TargetInfo, TargetQueue};

/// Any error of the library, by layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// MMIO layer.
    #[error(transparent)]
    Mmio(#[from] mmio::MmioError),
    /// Controller layer.
    #[error(transparent)]
    Ctrlr(#[from] ctrlr::CtrlrError),
    /// DMA layer.
    #[error(transparent)]
    Dma(#[from] dma::DmaError),
    /// The emulated controller.
    #[error(transparent)]
    Emu(#[from] emu::EmuError),
    /// VFIO transport.
    #[error(transparent)]
    Vfio(#[from] vfio::VfioError),
    /// PCI discovery.
    #[error(transparent)]
    Pci(#[from] pci::PciError),
    /// File target.
    #[error(transparent)]
    File(#[from] file::FileError),
    /// The aio layer.
    #[error(transparent)]
    Aio(#[from] aio::AioError),
    /// The reactor.
    #[error(transparent)]
    Reactor(#[from] reactor::ReactorError),
    /// Target strings.
    #[error(transparent)]
    TargetSpec(#[from] target_spec::TargetSpecError),
    /// The C ABI.
    #[error(transparent)]
    Capi(#[from] capi::CapiError),
    /// An I/O error reported synchronously.
    #[error(transparent)]
    Io(#[from] io::IoError),
    /// An operating system error with context.
    #[error("{context}: {source}")]
    Os {
        /// What was being done.
        context: String,
        /// The error.
        source: std::io::Error,
    },
}

/// Result with the library's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

//! Kestrel: a polled-mode, userspace NVMe driver.
//!
//! The folders are the layers, bottom up; each imports only from those below it
//! (`docs/architecture.md` has the diagram; `tests/layers/` enforces it):
//! - [`spec`]: NVMe definitions, pure data.
//! - [`parse`]: the grammars of values people type (sizes, durations, core lists, PCI
//!   addresses, target strings), pure functions every layer may use.
//! - [`hw`]: the seam a controller is reached through (MMIO, DMA memory, the `Transport`
//!   trait) and the real hardware below it (VFIO, PCI discovery).
//! - [`emu`]: a software NVMe controller behind the same seam, for tests without hardware.
//! - [`io`]: the request and completion types every queue speaks.
//! - [`nvme`]: rings, PRPs, controller bring-up and the admin queue, I/O queue pairs.
//! - [`target`]: the trait over NVMe namespaces and files (io_uring) that everything
//!   above uses.
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

// The ordering between the CPU and a controller is written for x86-64 only
// (`hw/barrier.rs`, whose module doc gives each primitive's aarch64 instructions). On any
// other architecture the build stops here, naming what a port must write, instead of
// building a driver that silently relies on x86's ordering.
#[cfg(not(target_arch = "x86_64"))]
compile_error!(
    "kestrel has not been written for this architecture: driver/src/hw/barrier.rs must \
     provide dma_wmb, dma_rmb, dma_mb, read_once, read_once_at and write_once for it (its \
     module doc says what each orders, and what each is on aarch64), then lift this check \
     in lib.rs"
);

pub mod parse;
pub mod spec;

pub mod hw;

pub mod emu;

pub mod io;

pub mod nvme;

pub mod target;

pub mod aio;

pub mod target_spec;

pub mod capi;

// The module paths of the flat layout (`kestrel::dma`, `kestrel::ctrlr`, ...), kept so code
// written against them keeps building. Nothing in `driver/src` uses them (the layer check
// refuses them there); new code names the layer path.
#[doc(hidden)]
pub use hw::{clock, dma, limits, mmio, pci, transport, vfio};
#[doc(hidden)]
pub use nvme::{ctrlr, format, prp, qpair, ring};
#[doc(hidden)]
pub use target::file;

/// The reactor, at the top level as well: `kestrel::reactor::Reactor`.
pub use aio::reactor;
pub use aio::{AioError, CancelOutcome, ContextOptions, Event, IoBuf, IoContext, Iocb, Opcode};
pub use hw::dma::{DmaBuf, DmaPool, DmaSlice};
pub use io::{
    Completion, IoError, IoOp, IoRequest, QueueStats, SubmitError, ZoneAction, ZoneGeometry,
};
pub use nvme::ctrlr::{Controller, ControllerOptions};
pub use nvme::qpair::{DoorbellMode, IoQpair, QpairOptions};
pub use reactor::{IdlePolicy, Reactor, ReactorBuilder, ReactorError};
pub use target::nvme::NvmeNamespace;
pub use target::{QueueOptions, Target, TargetInfo, TargetQueue};

/// Any error of the library, by layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// MMIO layer.
    #[error(transparent)]
    Mmio(#[from] hw::mmio::MmioError),
    /// Controller layer.
    #[error(transparent)]
    Ctrlr(#[from] nvme::ctrlr::CtrlrError),
    /// DMA layer.
    #[error(transparent)]
    Dma(#[from] hw::dma::DmaError),
    /// The emulated controller.
    #[error(transparent)]
    Emu(#[from] emu::EmuError),
    /// VFIO transport.
    #[error(transparent)]
    Vfio(#[from] hw::vfio::VfioError),
    /// PCI discovery.
    #[error(transparent)]
    Pci(#[from] hw::pci::PciError),
    /// The target layer.
    #[error(transparent)]
    Target(#[from] target::TargetError),
    /// File target.
    #[error(transparent)]
    File(#[from] target::file::FileError),
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

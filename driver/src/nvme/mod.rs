//! The NVMe driver proper: queues in DMA memory, controller bring-up and I/O queue pairs.
//!
//! Lives here, bottom up: the SQ/CQ rings ([`ring`]), PRP lists ([`prp`]), the namespace
//! formats the driver implements ([`format`](mod@format)), the admin queue (`admin`), bring-up as a
//! state machine (`init`), the controller state the controller and its qpairs share
//! (`shared`), the I/O queue pairs ([`qpair`]) and the controller handle ([`ctrlr`]).
//! May import [`crate::spec`], the seam in [`crate::hw`] (`transport`, `mmio`, `dma`;
//! never a concrete transport) and [`crate::io`]. This file holds the layer's error type
//! and the bring-up states it names.

mod admin;
pub mod ctrlr;
#[doc(hidden)]
pub mod faults;
pub mod format;
mod init;
pub mod prp;
pub mod qpair;
pub mod ring;
mod shared;

use crate::spec::Status;

use format::UnsupportedFormat;

/// The states of controller bring-up, in order.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum InitState {
    /// Reading CAP and VS, checking the controller can be driven, allocating the admin
    /// queue (before the controller is touched).
    ReadCapabilities,
    /// Clearing CC.EN and waiting for CSTS.RDY = 0.
    Disable,
    /// Programming AQA, ASQ and ACQ.
    ConfigureAdminQueue,
    /// Setting CC.EN = 1 and waiting for CSTS.RDY = 1.
    Enable,
    /// Identify Controller.
    IdentifyController,
    /// Set Features, Number of Queues.
    SetNumberOfQueues,
    /// Identify of the active namespaces.
    IdentifyNamespaces,
    /// Doorbell Buffer Config.
    ConfigureShadowDoorbells,
    /// Up and running.
    Ready,
}

impl std::fmt::Display for InitState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            InitState::ReadCapabilities => "reading CAP/VS",
            InitState::Disable => "disabling (waiting for CSTS.RDY=0 after CC.EN=0)",
            InitState::ConfigureAdminQueue => "configuring the admin queue (AQA/ASQ/ACQ)",
            InitState::Enable => "enabling (waiting for CSTS.RDY=1 after CC.EN=1)",
            InitState::IdentifyController => "identify controller",
            InitState::SetNumberOfQueues => "set features: number of queues",
            InitState::IdentifyNamespaces => "identify namespaces",
            InitState::ConfigureShadowDoorbells => "doorbell buffer config",
            InitState::Ready => "ready",
        })
    }
}

/// Errors of the controller layer.
#[derive(Debug, thiserror::Error)]
pub enum CtrlrError {
    /// A wait for CSTS.RDY ran past CAP.TO.
    #[error("{transport}: timed out after {waited_ms} ms {state} (CAP.TO allows {limit_ms} ms); check the device is healthy, or reset it with `scripts/setup.sh reset`")]
    Timeout {
        /// Where bring-up stopped.
        state: InitState,
        /// Milliseconds waited.
        waited_ms: u64,
        /// The bound from CAP.TO.
        limit_ms: u64,
        /// The controller.
        transport: String,
    },
    /// CSTS.CFS was set.
    #[error("{transport}: controller fatal status (CSTS.CFS) while {state}; the controller needs a reset")]
    Fatal {
        /// Where it happened.
        state: InitState,
        /// The controller.
        transport: String,
    },
    /// Registers read all ones.
    #[error("{transport}: device removed (registers read all ones) while {state}")]
    DeviceRemoved {
        /// Where it happened.
        state: InitState,
        /// The controller.
        transport: String,
    },
    /// The controller lacks something the driver requires.
    #[error("{transport}: unsupported controller: {why}")]
    Unsupported {
        /// The controller.
        transport: String,
        /// What is missing.
        why: String,
    },
    /// An admin command failed.
    #[error("{transport}: admin command {opcode} failed: {status}")]
    AdminCommand {
        /// The controller.
        transport: String,
        /// Command name.
        opcode: &'static str,
        /// The status.
        status: Status,
    },
    /// An admin command did not complete in time.
    #[error(
        "{transport}: admin command {opcode} (cid {cid}) did not complete within {timeout_ms} ms"
    )]
    AdminTimeout {
        /// The controller.
        transport: String,
        /// Command name.
        opcode: &'static str,
        /// Its CID.
        cid: u16,
        /// The timeout.
        timeout_ms: u64,
    },
    /// No I/O queue identifier is free.
    #[error("{transport}: all {granted} i/o queues granted by the controller are in use; drop a qpair or ask for more with ControllerOptions::io_queues")]
    NoFreeQueue {
        /// The controller.
        transport: String,
        /// Queues granted.
        granted: u16,
    },
    /// A namespace that is not active.
    #[error("{transport}: nsid {nsid} is not an active namespace (active: {active:?})")]
    NoSuchNamespace {
        /// The controller.
        transport: String,
        /// The NSID asked for.
        nsid: u32,
        /// The active ones.
        active: Vec<u32>,
    },
    /// A namespace whose format the driver does not implement (nothing was sent to it).
    #[error("{transport}: {source}")]
    UnsupportedFormat {
        /// The controller.
        transport: String,
        /// The namespace and its format.
        source: UnsupportedFormat,
    },
    /// An option outside the range the driver accepts.
    #[error("{option} = {value}: {why}")]
    BadOption {
        /// The option, as `ControllerOptions::admin_timeout`.
        option: &'static str,
        /// Its value.
        value: String,
        /// What is accepted.
        why: String,
    },
    /// DMA memory.
    #[error(transparent)]
    Dma(#[from] crate::hw::dma::DmaError),
    /// MMIO.
    #[error(transparent)]
    Mmio(#[from] crate::hw::mmio::MmioError),
}

//! The app's errors: one enum, each variant knowing its exit status.

/// Exit status of a usage error (bad option, value or combination), as clap uses.
pub const EXIT_USAGE: u8 = 2;
/// Exit status of a setup failure: the target could not be opened, a device or admin
/// command failed, the run could not start.
pub const EXIT_RUNTIME: u8 = 1;
/// Exit status of a `perf` run that ran but whose I/O failed: errors, timeouts, lost I/O,
/// controller resets, or no I/O succeeded at all.
pub const EXIT_IO_FAILED: u8 = 3;
/// Exit status of a `perf --verify` run that read back data that does not match.
pub const EXIT_VERIFY: u8 = 4;
/// Exit status after Ctrl-C (128 + SIGINT, as shells report it).
pub const EXIT_INTERRUPTED: u8 = 130;

/// Why `kestrel` failed.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    /// The command line asks for something impossible (exit status 2).
    #[error("{0}")]
    Usage(String),
    /// The library failed.
    #[error(transparent)]
    Driver(#[from] kestrel::Error),
    /// A buffer could not be lent to a queue, or its bytes reached through it.
    #[error(transparent)]
    Lease(#[from] kestrel::dma::LeaseError),
    /// Controller bring-up or an admin command failed.
    #[error(transparent)]
    Ctrlr(#[from] kestrel::nvme::ctrlr::CtrlrError),
    /// An operating system call failed.
    #[error("{context}: {source}")]
    Os {
        /// What was being done.
        context: String,
        /// The error.
        source: std::io::Error,
    },
    /// Anything else at run time, with its message.
    #[error("{0}")]
    Runtime(String),
    /// The run ran, but I/O failed (exit status 3).
    #[error("{0}")]
    IoFailed(String),
    /// `--verify` found data that does not match (exit status 4).
    #[error("{0}")]
    VerifyFailed(String),
    /// Stopped by Ctrl-C (after reporting what was measured).
    #[error("{0}")]
    Interrupted(String),
}

impl From<kestrel::target::TargetError> for AppError {
    /// A target could not make a queue: a library error like any other.
    fn from(e: kestrel::target::TargetError) -> Self {
        AppError::Driver(e.into())
    }
}

impl AppError {
    /// The process exit status for this error.
    pub fn exit_code(&self) -> u8 {
        match self {
            AppError::Usage(_) => EXIT_USAGE,
            AppError::Interrupted(_) => EXIT_INTERRUPTED,
            AppError::IoFailed(_) => EXIT_IO_FAILED,
            AppError::VerifyFailed(_) => EXIT_VERIFY,
            _ => EXIT_RUNTIME,
        }
    }
    /// A usage error.
    pub fn usage(msg: impl Into<String>) -> Self {
        AppError::Usage(msg.into())
    }
    /// A runtime error.
    pub fn runtime(msg: impl Into<String>) -> Self {
        AppError::Runtime(msg.into())
    }
}

/// Result with [`AppError`].
pub type Result<T, E = AppError> = std::result::Result<T, E>;

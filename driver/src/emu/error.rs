//! The error of starting an emulated controller.

use std::path::PathBuf;

use crate::hw::mmio::MmioError;

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

//! The grammars of the values people type: sizes, durations, on/off switches, core lists,
//! PCI addresses and target strings. Pure functions over `&str`; this module imports
//! nothing from the crate, so every layer may use it.
//!
//! There is one parser of each kind and every entry point uses it: the `kestrel` command
//! line, the C API (`kestrel_open`, `kestrel_reactor_start`), the reactor's
//! [`crate::reactor::ReactorBuilder::core_list`], [`crate::hw::pci::Bdf`]'s `FromStr` and the
//! emulator's fault specifications. No parser panics on any input (the fuzz target
//! `parse_args` feeds them arbitrary strings), and every error names the text it rejects
//! and lists what is accepted.
//!
//! # Grammars
//! ```text
//! size     = DIGITS [" "] [unit]              ; 512, 4k, 4KiB, 128KiB, 1M, 1GiB, 2T
//! unit     = "b" | "k" | "kb" | "kib" | "m" | "mb" | "mib" | "g" | ... | "tib"
//!                                               ; any case; every unit is a power of 1024
//! duration = NUMBER [" "] tunit | "0"         ; 10us, 1.5ms, 2s, 250ns, 0.001us
//! tunit    = "ns" | "us" | "µs" | "ms" | "s"  ; a plain number is refused, except where
//!                                               ; a caller documents its unit
//!                                               ; ([`parse_duration_or`]: `-t 5` is 5 s)
//! switch   = "on" | "off" | "true" | "false" | "yes" | "no" | "1" | "0"
//! cores    = item *("," item) | "[" item *("," item) "]" | "0x" HEX
//! item     = CORE | CORE "-" CORE             ; cores 0..=4095
//! bdf      = [DOMAIN ":"] BUS ":" DEV "." FN  ; hex: 1-8, 1-2, 1-2 (<= 1f), 1 (<= 7) digits
//! target   = see [`target`]
//! ```

mod bdf;
mod cores;
pub mod target;
mod units;

pub use bdf::{parse_bdf, Bdf};
pub use cores::{available_cores, core_list_text, parse_cores, MAX_CORE};
pub use target::{
    parse_target, CoreSpec, Digests, EmuNsSpec, EmuSpec, FileSpec, NullSpec, StoreSpec, TargetSpec,
    TcpSpec, MAX_EMU_METADATA, MAX_EMU_NAMESPACES, MAX_EMU_QUEUES, MAX_SPEC_LEN, NS_HELP,
    TARGET_HELP,
};
pub use units::{
    parse_duration, parse_duration_or, parse_size, parse_switch, TimeUnit, MAX_DURATION,
};

/// What the size parser accepts, for messages.
pub const SIZE_HELP: &str = "a whole number of bytes with an optional binary unit: 512, 4k, 4K, 4KiB, 128KiB, 1M, 1MiB, 1G, 1GiB, 2T (k/K/KB/KiB all mean 1024, as in fio)";
/// What the duration parser accepts, for messages.
pub const DURATION_HELP: &str =
    "a number with a unit: ns, us (or µs), ms or s, for example 10us, 1.5ms, 2s; or 0";
/// What the core list parser accepts, for messages.
pub const CORES_HELP: &str =
    "a list of cores and ranges like 0,2-3 (optionally in brackets: [0,2-3]) or a hex mask like 0x5";
/// What the PCI address parser accepts, for messages.
pub const BDF_HELP: &str = "a PCI address DDDD:BB:DD.F or BB:DD.F in hex (device 00-1f, function 0-7), such as 0000:01:00.0";
/// What the switch parser accepts, for messages.
pub const SWITCH_HELP: &str = "on or off (also: true/false, yes/no, 1/0)";

/// A value that could not be parsed: which grammar, the text, and what is wrong with it.
/// Each message ends with what the grammar accepts.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// A size.
    #[error("invalid size '{input}': {why}; expected {SIZE_HELP}")]
    Size {
        /// The text given.
        input: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A duration.
    #[error("invalid duration '{input}': {why}; expected {expected}")]
    Duration {
        /// The text given.
        input: String,
        /// What is wrong with it.
        why: &'static str,
        /// What is accepted here ([`DURATION_HELP`], and the unit of a plain number where
        /// one is allowed).
        expected: String,
    },
    /// A core list.
    #[error("invalid core list '{input}': {why}; expected {CORES_HELP}")]
    Cores {
        /// The text given.
        input: String,
        /// What is wrong with it.
        why: String,
    },
    /// A PCI address.
    #[error("invalid PCI address '{input}': expected {BDF_HELP}")]
    Bdf {
        /// The text given.
        input: String,
    },
    /// A target string.
    #[error("invalid target '{input}': {why}; expected {TARGET_HELP}")]
    Target {
        /// The text given.
        input: String,
        /// What is wrong with it.
        why: String,
    },
    /// An on/off switch.
    #[error("invalid switch '{input}': expected {SWITCH_HELP}")]
    Switch {
        /// The text given.
        input: String,
    },
}

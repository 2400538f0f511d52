//! The rules as tables: the layers and their ranks, the modules that may name a concrete
//! transport, the aliases of `lib.rs` refused inside the crate, and the known exceptions.

use crate::tree::{is_ancestor, parse_path, Edge};

/// The top-level modules of `driver/src`, bottom up, with their rank: a module may import
/// only modules of a strictly lower rank. Equal ranks are siblings that must not import
/// each other.
pub const LAYERS: &[(&str, u32, &str)] = &[
    ("spec", 0, "NVMe wire formats: pure data"),
    (
        "parse",
        0,
        "the grammars people type (sizes, durations, core lists, BDFs, target strings): pure functions",
    ),
    (
        "hw",
        1,
        "the seam (mmio, dma, transport) and the real hardware (vfio, pci)",
    ),
    (
        "emu",
        2,
        "the software controller, a sibling of the real hardware below the seam",
    ),
    ("io", 2, "the request/completion types every queue speaks"),
    (
        "nvme",
        3,
        "rings, PRPs, bring-up, the admin queue, I/O queue pairs",
    ),
    (
        "target",
        4,
        "the Target/TargetQueue traits, the NVMe namespace and file targets",
    ),
    (
        "aio",
        5,
        "contexts, iocbs, events; the wire format, SPSC rings, wake-ups and the reactor",
    ),
    ("target_spec", 6, "target strings, parsed and opened"),
    ("capi", 7, "the C ABI"),
];

/// Modules that may name a concrete transport: they turn a target string into one.
pub const OPENERS: &[&str] = &["target_spec", "capi"];

/// Concrete transports (path prefixes): only `hw` itself and the [`OPENERS`] name them.
pub const CONCRETE: &[&[&str]] = &[&["emu"], &["hw", "vfio"], &["hw", "pci"]];

/// The flat paths kept as aliases in `lib.rs` for code outside the crate; inside it they
/// hide the layer, so they are refused with the path to use instead.
pub const ALIASES: &[(&str, &str)] = &[
    ("dma", "hw::dma"),
    ("limits", "hw::limits"),
    ("mmio", "hw::mmio"),
    ("pci", "hw::pci"),
    ("transport", "hw::transport"),
    ("vfio", "hw::vfio"),
    ("ctrlr", "nvme::ctrlr"),
    ("format", "nvme::format"),
    ("prp", "nvme::prp"),
    ("qpair", "nvme::qpair"),
    ("ring", "nvme::ring"),
    ("file", "target::file"),
];

/// Known exceptions: (importing module, imported module, why it is allowed for now).
/// Each is owned by work under way; delete the entry when the import is gone.
pub const ALLOWED: &[(&str, &str, &str)] = &[];

/// A module's rank in [`LAYERS`], if it has one.
pub fn rank(m: &str) -> Option<u32> {
    LAYERS.iter().find(|(n, _, _)| *n == m).map(|(_, r, _)| *r)
}

/// The [`ALLOWED`] entry that lets `e` through, if one does.
pub fn allowed(e: &Edge) -> Option<usize> {
    ALLOWED.iter().position(|(from, to, _)| {
        is_ancestor(&parse_path(from), &e.from) && is_ancestor(&parse_path(to), &e.to)
    })
}

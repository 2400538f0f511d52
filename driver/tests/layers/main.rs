//! The layer check: the folders of `driver/src` are the layers of `docs/architecture.md`,
//! and this test keeps them so. It reads every source file, takes each `crate::` and
//! `super::` path outside test code, and fails on:
//!
//! - an **upward import**: a top-level module naming one of the same or a higher rank in
//!   [`LAYERS`], or the crate root (`crate::Error`, the re-exports in `lib.rs`);
//! - a **crossing of the seam**: a module above `hw` naming a concrete transport (`emu`,
//!   `hw::vfio`, `hw::pci`) without being one of the [`OPENERS`] that turn target strings
//!   into transports; the driver sees a controller only through `hw::{transport,mmio,dma}`;
//! - a **module cycle**: at every level of the tree, the imports between sibling modules
//!   (files and folders of one folder) must form no cycle;
//! - a top-level module missing from [`LAYERS`] (a new folder takes its place in the table).
//!
//! A parent module and its own children may name each other (that is containment, not a
//! dependency between peers). Doc comments and strings are ignored; `#[cfg(test)]` items
//! and `tests.rs` files may import anything. Known exceptions, each owned by work under
//! way, are in [`ALLOWED`]; an entry that no longer matches anything is an error too, so
//! the table says what the tree is.
//!
//! A module per step: the rules as tables (`rules`); reading `driver/src` into modules and
//! imports (`tree`), with the source blanked of comments, literals and test items first
//! (`blank`) and its paths read (`scan`); then the layer rules (`check`) and the cycle
//! rule (`cycles`).
//!
//! Run alone with `cargo test --release -p kestrel --test layers`.

mod blank;
mod check;
mod cycles;
mod rules;
mod scan;
mod tree;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use blank::{drop_test_items, strip};
use check::layer_violations;
use cycles::cycles;
use rules::{ALLOWED, LAYERS};
use scan::named_paths;
use tree::{parse_path, read_crate, Crate, Edge, ModPath};

#[test]
fn layers_import_only_downward_and_without_cycles() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let c = read_crate(&src);
    assert!(
        c.edges.len() > 50,
        "the scan found only {} imports in {}: the parser is broken",
        c.edges.len(),
        src.display()
    );
    let mut used = BTreeSet::new();
    let mut errs = layer_violations(&c, &mut used);
    errs.extend(cycles(&c, &mut used));
    for (k, (from, to, _)) in ALLOWED.iter().enumerate() {
        if !used.contains(&k) {
            errs.push(format!(
                "driver/tests/layers/rules.rs: the ALLOWED entry {from} -> {to} matches no import any \
                 more\n    rule: an exception that no longer applies is deleted, so the table \
                 says what the tree is"
            ));
        }
    }
    let table = LAYERS
        .iter()
        .map(|(n, r, what)| format!("    {r} {n}: {what}"))
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        errs.is_empty(),
        "{} layering error(s) in driver/src (rules in driver/tests/layers/main.rs):\n\n{}\n\n\
         layers by rank (a module imports only lower ranks):\n{table}\n",
        errs.len(),
        errs.join("\n\n")
    );
}

/// The checker itself: it must see the kinds of import it claims to check.
#[test]
fn the_scanner_sees_what_it_checks() {
    let here = parse_path("nvme::qpair::split");
    let code = strip(
        "use crate::{hw::dma::DmaBuf, io::{IoRequest, IoError}};\n\
         // use crate::target::Target;\n\
         let s = \"crate::aio\";\n\
         use super::super::ring::SqRing;\n\
         fn f() -> crate::spec::Sqe { todo!() }\n\
         pub(crate) fn g() {}\n\
         #[cfg(test)]\nmod tests { use crate::capi::X; }\n",
    );
    let code = drop_test_items(&code);
    let got: Vec<(usize, String)> = named_paths(&code, &here)
        .into_iter()
        .map(|(l, p)| (l, p.join("::")))
        .collect();
    assert_eq!(
        got,
        vec![
            (1, "hw::dma::DmaBuf".to_string()),
            (1, "io::IoRequest".to_string()),
            (1, "io::IoError".to_string()),
            (4, "nvme::ring::SqRing".to_string()),
            (5, "spec::Sqe".to_string()),
        ]
    );
    // An upward import and a cycle, on a made-up crate.
    let modules: BTreeSet<ModPath> = [
        "", "spec", "nvme", "nvme::a", "nvme::b", "target", "aio", "capi",
    ]
    .iter()
    .map(|s| {
        if s.is_empty() {
            Vec::new()
        } else {
            parse_path(s)
        }
    })
    .collect();
    let edge = |from: &str, to: &str| Edge {
        from: parse_path(from),
        to: parse_path(to),
        file: PathBuf::from("x.rs"),
        line: 1,
        named: parse_path(to),
        text: format!("use crate::{to};"),
    };
    let c = Crate {
        modules,
        edges: vec![
            edge("nvme::a", "target"),
            edge("nvme::a", "nvme::b"),
            edge("nvme::b", "nvme::a"),
            edge("nvme::a", "spec"),
            edge("capi", "aio"),
        ],
    };
    let mut used = BTreeSet::new();
    let up = layer_violations(&c, &mut used);
    assert_eq!(up.len(), 1, "{up:#?}");
    assert!(
        up[0].contains("`nvme` (rank 3) may not import `target`"),
        "{}",
        up[0]
    );
    let cyc = cycles(&c, &mut used);
    assert_eq!(cyc.len(), 1, "{cyc:#?}");
    assert!(
        cyc[0].contains("module cycle: nvme::a -> nvme::b -> nvme::a")
            || cyc[0].contains("module cycle: nvme::b -> nvme::a -> nvme::b"),
        "{}",
        cyc[0]
    );
}

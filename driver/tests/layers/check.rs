//! The layer rules: no upward import, no crossing of the seam, no module missing from the
//! layer table.

use std::collections::BTreeSet;

use crate::rules::{allowed, rank, ALIASES, CONCRETE, OPENERS};
use crate::tree::{is_ancestor, show, where_, Crate};

/// Upward imports, crossings of the seam, modules missing from the table.
pub fn layer_violations(c: &Crate, used: &mut BTreeSet<usize>) -> Vec<String> {
    let mut errs = Vec::new();
    for m in &c.modules {
        if m.len() == 1 && rank(&m[0]).is_none() {
            errs.push(format!(
                "driver/src: module `{}` is not in the layer table; give it a rank in LAYERS \
                 (driver/tests/layers/rules.rs), or move it into the layer it belongs to",
                m[0]
            ));
        }
    }
    for e in &c.edges {
        if is_ancestor(&e.from, &e.to) || is_ancestor(&e.to, &e.from) && !e.to.is_empty() {
            continue;
        }
        if e.from.is_empty() {
            continue; // lib.rs is the top: it may name every layer.
        }
        if let Some(k) = allowed(e) {
            used.insert(k);
            continue;
        }
        if e.to.is_empty() {
            let hint = path_hint(&e.named).unwrap_or_else(|| {
                "the root (`crate::Error`, the re-exports) is above every layer; name the item \
                 by its module path, and use this layer's own error type"
                    .to_string()
            });
            errs.push(format!(
                "{}\n    rule: `{}` names the crate root: {hint}",
                where_(e),
                show(&e.from)
            ));
            continue;
        }
        let (f, t) = (&e.from[0], &e.to[0]);
        if f != t {
            match (rank(f), rank(t)) {
                (Some(rf), Some(rt)) if rt >= rf => errs.push(format!(
                    "{}\n    rule: a layer imports only layers below it; `{f}` (rank {rf}) may not \
                     import `{}` (`{t}`, rank {rt}). Move the shared item down, or invert the \
                     dependency (the ranks are listed below)",
                    where_(e),
                    show(&e.to)
                )),
                _ => {}
            }
        }
        let concrete = CONCRETE.iter().any(|c| {
            let c: Vec<String> = c.iter().map(|s| s.to_string()).collect();
            is_ancestor(&c, &e.to) && !is_ancestor(&c[..1], &e.from)
        });
        let above_hw = rank(f).is_some_and(|r| r > rank("hw").unwrap_or(0));
        if concrete && above_hw && !OPENERS.contains(&f.as_str()) {
            errs.push(format!(
                "{}\n    rule: the seam: above `hw`, only {OPENERS:?} name a concrete transport \
                 (`emu`, `hw::vfio`, `hw::pci`); `{}` must reach a controller through \
                 `hw::transport`, `hw::mmio` and `hw::dma`",
                where_(e),
                show(&e.from)
            ));
        }
    }
    errs
}

/// For a path through an alias of `lib.rs`, the path to write instead.
fn path_hint(named: &[String]) -> Option<String> {
    let first = named.first()?;
    ALIASES.iter().find(|(alias, _)| alias == first).map(|(alias, real)| {
        format!("`crate::{alias}` is an alias kept for code outside the crate; write `crate::{real}`")
    })
}

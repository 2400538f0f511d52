//! The checker itself: each rule finds what it claims to find, and accepts the usual
//! forms, on small sources written here.

use super::*;

fn src(path: &str, text: &str) -> Source {
    Source::new(path, text)
}

#[test]
fn rule_1_finds_a_block_or_impl_without_a_comment_and_accepts_the_usual_places() {
    let bad = src(
        "x/src/a.rs",
        "fn f() {\n    let a = 1;\n    let p = unsafe { g() };\n}\nunsafe impl Send for X {}\n",
    );
    let errs = undocumented_unsafe(&bad);
    assert_eq!(errs.len(), 2, "{errs:?}");
    assert!(errs[0].starts_with("x/src/a.rs:3:"), "{errs:?}");
    assert!(errs[1].starts_with("x/src/a.rs:5:"), "{errs:?}");
    let good = src(
        "x/src/a.rs",
        r#"
// SAFETY: the pointer is live: `new` made it from a Box.
unsafe impl Send for X {}
fn f() {
    // SAFETY: p is valid for 8 bytes: checked just before.
    #[allow(unused)]
    let a = unsafe { p.read() };
    let b = foo(
        1,
        // SAFETY: q is valid for reads: established by `init`.
        unsafe { q.read() },
    );
    // SAFETY: the statement starts here; the block is on its second line.
    let c =
        unsafe { r.read() };
    let d = unsafe {
        // SAFETY: inside the block start: r is aligned (asserted in `new`).
        r.read()
    };
    let s = "unsafe { in a string }"; // unsafe { in a comment }
    unsafe fn g() {}
}
"#,
    );
    assert_eq!(undocumented_unsafe(&good), Vec::<String>::new());
    // A comment separated by code is not "directly above".
    let far = src(
        "x/src/a.rs",
        "fn f() {\n    // SAFETY: the pointer is live, checked above.\n    let a = 1;\n    let p = unsafe { g() };\n}\n",
    );
    assert_eq!(undocumented_unsafe(&far).len(), 1);
}

#[test]
fn rule_2_finds_unsafe_outside_the_list_and_ignores_tests_and_prose() {
    let doc: String = UNSAFE_MODULES
        .iter()
        .map(|(m, _)| format!("| `{m}` |\n"))
        .collect();
    let mut sources: Vec<Source> = UNSAFE_MODULES
        .iter()
        .map(|(m, _)| {
            let path = if m.ends_with('/') {
                format!("{m}x.rs")
            } else {
                m.to_string()
            };
            src(
                &path,
                "// SAFETY: a test of the checker, nothing more.\nunsafe impl Send for X {}\n",
            )
        })
        .collect();
    assert_eq!(
        unsafe_outside_the_list(&sources, &doc),
        Vec::<String>::new()
    );
    sources.push(src(
        "driver/src/spec/cmd.rs",
        "//! No `unsafe` here.\nfn f() { let s = \"unsafe\"; }\n",
    ));
    sources.push(src(
        "driver/src/io.rs",
        "fn f() {}\n#[cfg(test)]\nmod tests {\n    fn g() { unsafe { h() } }\n}\n",
    ));
    sources.push(src(
        "driver/src/emu/tests/x.rs",
        "fn g() { unsafe { h() } }\n",
    ));
    sources.push(src("driver/tests/x.rs", "fn g() { unsafe { h() } }\n"));
    assert_eq!(
        unsafe_outside_the_list(&sources, &doc),
        Vec::<String>::new()
    );
    sources.push(src(
        "driver/src/nvme/admin.rs",
        "fn g() {\n    unsafe { h() }\n}\n",
    ));
    let errs = unsafe_outside_the_list(&sources, &doc);
    assert_eq!(errs.len(), 1, "{errs:?}");
    assert!(
        errs[0].starts_with("driver/src/nvme/admin.rs:2:"),
        "{errs:?}"
    );
    // An entry with no unsafe left, and one the document does not name.
    sources.retain(|s| s.path != UNSAFE_MODULES[0].0);
    let doc = doc.replace(&format!("`{}`", UNSAFE_MODULES[1].0), "");
    let errs = unsafe_outside_the_list(&sources, &doc);
    assert!(
        errs.iter()
            .any(|e| e.contains("holds no `unsafe` any more")),
        "{errs:?}"
    );
    assert!(errs.iter().any(|e| e.contains("does not name")), "{errs:?}");
}

#[test]
fn rule_3_refuses_comments_that_only_point_elsewhere() {
    let bad = src(
        "x/src/a.rs",
        r#"
fn f() {
    // SAFETY: the caller's contract.
    unsafe { g() };
    let a = 1;
    let b = 2;
    // SAFETY: see above.
    unsafe { g() };
    // SAFETY: as in `nowhere`.
    unsafe { g() };
    // SAFETY: the caller's contract covers it.
    unsafe { g() };
}
"#,
    );
    let errs = vague_safety_comments(&bad, &mut [false]);
    // Four without substance, and two that rely on a caller outside an unsafe fn.
    assert_eq!(
        errs.iter()
            .filter(|e| e.contains("names no invariant"))
            .count(),
        4,
        "{errs:#?}"
    );
    assert_eq!(
        errs.iter()
            .filter(|e| e.contains("relies on its caller"))
            .count(),
        2,
        "{errs:#?}"
    );
    let good = src(
        "x/src/a.rs",
        r#"
// SAFETY: the ring owns its slots; one side touches each at a time.
unsafe impl Send for R {}
// SAFETY: as above.
unsafe impl Sync for R {}

/// Reads it.
///
/// # Safety
/// `p` is valid for reads of 8 bytes.
#[inline]
unsafe fn publish(p: *const u64) -> u64 {
    // SAFETY: the caller guarantees `p` is readable for 8 bytes (this fn's contract).
    unsafe { p.read() }
}

fn other(p: *const u64) {
    // SAFETY: as in `publish`.
    unsafe { p.read() };
}
"#,
    );
    assert_eq!(
        vague_safety_comments(&good, &mut [false]),
        Vec::<String>::new()
    );
    // "As above" far from the comment it means is refused.
    let far = src(
        "x/src/a.rs",
        "// SAFETY: the ring owns its slots; one at a time.\nunsafe impl Send for R {}\n\nfn a() {}\n\n// SAFETY: as above.\nunsafe impl Sync for R {}\n",
    );
    assert_eq!(vague_safety_comments(&far, &mut [false]).len(), 1);
}

#[test]
fn rules_4_and_5_find_unchecked_indexing_and_device_references() {
    let s = src(
        "driver/src/nvme/qpair/split.rs",
        "fn f() {\n    // SAFETY: cid < depth, checked.\n    unsafe { *t.get_unchecked_mut(cid) = x };\n}\n",
    );
    assert_eq!(unchecked_indexing(&s).len(), 1);
    let s = src(
        "driver/src/hw/mmio.rs",
        "fn f() {\n    let r = unsafe { AtomicU32::from_ptr(p) };\n    let q = unsafe { self.ptr.as_ref() };\n    let v = unsafe { p.read_volatile() };\n}\n#[cfg(test)]\nmod tests {\n    fn t() { x.as_ref(); }\n}\n",
    );
    let errs = device_memory_references(&s);
    assert_eq!(errs.len(), 2, "{errs:?}");
    let elsewhere = src("driver/src/io.rs", "fn f() { x.as_ref(); }\n");
    assert!(device_memory_references(&elsewhere).is_empty());
}

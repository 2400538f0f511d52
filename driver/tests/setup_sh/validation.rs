//! Bad values and arguments refused before anything is done; `help`.

use std::fs;
use std::process::Command;

use crate::fakesys::FakeSys;
use crate::fixture::{
    run, run_working, script, script_env, snapshot, state_file, stubs, system_path, validation_tree,
};

#[test]
fn help_and_unknown_commands() {
    need_bash!();
    let f = FakeSys::new();
    let r = run(&f, &["help"], &[]);
    assert_eq!(r.code(), 0);
    for w in [
        "config",
        "reset",
        "status",
        "PCI_ALLOWED",
        "PCI_BLOCKED",
        "HUGEMEM",
        "TARGET_USER",
        "NOIOMMU",
    ] {
        assert!(r.stdout().contains(w), "help lacks {w}");
    }
    let r = run(&f, &["frobnicate"], &[]);
    assert_eq!(r.code(), 2);
    assert!(
        r.stderr().contains("unknown subcommand 'frobnicate'"),
        "{}",
        r.stderr()
    );
    let r = run(&f, &["status", "extra"], &[]);
    assert_eq!(r.code(), 2);
    // help works whatever the variables say.
    let r = run(&f, &["help"], &[("HUGEMEM", "-1")]);
    assert_eq!(r.code(), 0);
}

/// Bad values, each with what the refusal says: a variable set to something the script
/// must not act on (alone, or with the variable it conflicts with).
const BAD_VALUES: &[(&[(&str, &str)], &str)] = &[
    (&[("HUGEMEM", "-1")], "HUGEMEM='-1' is negative"),
    (&[("HUGEMEM", "-0")], "HUGEMEM='-0' is negative"),
    (&[("HUGEMEM", "0100")], "HUGEMEM='0100' has a leading zero"),
    (&[("HUGEMEM", "00")], "HUGEMEM='00' has a leading zero"),
    (
        &[("HUGEMEM", "0")],
        "HUGEMEM=0: the pool needs at least one page",
    ),
    (
        &[("HUGEMEM", "99999999999999999999")],
        "HUGEMEM='99999999999999999999' is absurdly large",
    ),
    (&[("HUGEMEM", "9223372036854775808")], "is absurdly large"),
    (
        &[("HUGEMEM", "1e3")],
        "HUGEMEM='1e3' is not a whole decimal number",
    ),
    (
        &[("HUGEMEM", "2G")],
        "HUGEMEM='2G' is not a whole decimal number",
    ),
    (
        &[("HUGEMEM", " 12")],
        "HUGEMEM=' 12' is not a whole decimal number",
    ),
    (
        &[("HUGEMEM", "0x10")],
        "HUGEMEM='0x10' is not a whole decimal number",
    ),
    (
        &[("HUGEMEM", "5000")],
        "HUGEMEM=5000 MiB is more than this machine's memory (3906 MiB",
    ),
    (
        &[("HUGEPGSZ", "3000")],
        "HUGEPGSZ=3000 kB is not a hugepage size",
    ),
    (
        &[("HUGEPGSZ", "2M")],
        "HUGEPGSZ='2M' is not a whole decimal number",
    ),
    (
        &[("HUGEPGSZ", "1048576")],
        "HUGEPGSZ=1048576: this kernel has no 1048576 kB hugepages",
    ),
    (
        &[("PCI_ALLOWED", "1:00.0")],
        "PCI_ALLOWED: '1:00.0' is not a PCI address",
    ),
    (
        &[("PCI_ALLOWED", "001:00.0")],
        "'001:00.0' is not a PCI address",
    ),
    (&[("PCI_ALLOWED", "01:00")], "'01:00' is not a PCI address"),
    (
        &[("PCI_ALLOWED", "01:20.0")],
        "'01:20.0' is not a PCI address",
    ),
    (
        &[("PCI_ALLOWED", "01:00.8")],
        "'01:00.8' is not a PCI address",
    ),
    (
        &[("PCI_ALLOWED", "0:01:00.0")],
        "'0:01:00.0' is not a PCI address",
    ),
    (
        &[("PCI_ALLOWED", "1:2:3:4")],
        "'1:2:3:4' is not a PCI address",
    ),
    (
        &[("PCI_ALLOWED", "0000:01:00.0,0000:02:00.0")],
        "several separated by spaces",
    ),
    (
        &[("PCI_BLOCKED", "nope")],
        "PCI_BLOCKED: 'nope' is not a PCI address",
    ),
    (
        &[("PCI_ALLOWED", "01:00.0"), ("PCI_BLOCKED", "0000:01:00.0")],
        "0000:01:00.0 is in both PCI_ALLOWED and PCI_BLOCKED",
    ),
    (
        &[("PCI_ALLOWED", "0000:09:00.0")],
        "PCI_ALLOWED: no PCI device 0000:09:00.0",
    ),
    (
        &[("PCI_ALLOWED", "00:03.0")],
        "PCI_ALLOWED: 0000:00:03.0 is not an NVMe controller (class 0x020000)",
    ),
    (
        &[("TARGET_USER", "no-such-user-kestrel")],
        "TARGET_USER: no user 'no-such-user-kestrel' on this machine",
    ),
    (
        &[("TARGET_USER", "a;b")],
        "TARGET_USER='a;b' is not a user name",
    ),
    (
        &[("TARGET_USER", "-r")],
        "TARGET_USER='-r' is not a user name",
    ),
    (
        &[("TARGET_USER", "root"), ("NOIOMMU", "1")],
        "TARGET_USER with NOIOMMU=1",
    ),
    (&[("NOIOMMU", "yes")], "NOIOMMU='yes': give 1"),
    (&[("NOIOMMU", "2")], "NOIOMMU='2': give 1"),
    (
        &[("DRIVER_OVERRIDE", "uio_pci_generic")],
        "Kestrel drives controllers only through vfio-pci",
    ),
    (&[("BIND_WAIT_S", "-1")], "BIND_WAIT_S='-1' is negative"),
    (
        &[("BIND_WAIT_S", "08")],
        "BIND_WAIT_S='08' has a leading zero",
    ),
    (
        &[("BIND_WAIT_S", "601")],
        "BIND_WAIT_S=601: at most 600 seconds",
    ),
    (
        &[("BIND_WAIT_S", "5s")],
        "BIND_WAIT_S='5s' is not a whole decimal number",
    ),
    (
        &[("PCI_WHITELIST", "01:00.0")],
        "PCI_WHITELIST is not read here: use PCI_ALLOWED",
    ),
    (
        &[("PCI_BLACKLIST", "")],
        "PCI_BLACKLIST is not read here: use PCI_BLOCKED",
    ),
    (&[("NRHUGE", "8")], "NRHUGE is not read here"),
    (&[("HUGENODE", "0")], "HUGENODE is not supported"),
    (
        &[("STATE_DIR", "run/kestrel")],
        "STATE_DIR='run/kestrel' is not an absolute path",
    ),
    (
        &[("SYSFS_ROOT", "sys")],
        "SYSFS_ROOT='sys' is not an absolute path",
    ),
];

#[test]
fn every_bad_value_is_refused_before_anything_is_done() {
    need_bash!();
    let f = validation_tree();
    // What only config needs (the pool's size against the machine) is checked by
    // config only.
    let config_only = ["HUGEPGSZ=1048576: this", "HUGEMEM=5000 MiB"];
    let before = snapshot(&f);
    for (env, msg) in BAD_VALUES {
        for cmd in ["config", "reset"] {
            if cmd == "reset" && config_only.iter().any(|c| msg.starts_with(c)) {
                continue;
            }
            // Working stubs: a module load or mount would show in the tree, not only in
            // the log.
            let r = run_working(&f, &[cmd], env);
            assert_eq!(r.code(), 2, "{cmd} {env:?}: {}{}", r.stdout(), r.stderr());
            assert!(r.stderr().contains(msg), "{cmd} {env:?}: {}", r.stderr());
            assert!(r.calls.is_empty(), "{cmd} {env:?} ran {}", r.calls);
            assert_eq!(snapshot(&f), before, "{cmd} {env:?} changed the tree");
            assert_eq!(state_file(&f), None, "{cmd} {env:?}");
        }
    }
    // Bad arguments, likewise.
    for args in [&["frobnicate"][..], &["config", "reset"], &["--config"]] {
        let r = run_working(&f, args, &[]);
        assert_eq!(r.code(), 2, "{args:?}");
        assert!(r.calls.is_empty());
        assert_eq!(snapshot(&f), before);
    }
    // The same tree with good values acts (so the refusals above were about the values).
    let r = run_working(
        &f,
        &["config"],
        &[("HUGEMEM", "64"), ("PCI_ALLOWED", "01:00.0")],
    );
    assert_eq!(r.code(), 1, "no kernel to bind: {}", r.stderr());
    assert_ne!(snapshot(&f), before);
}

/// Runs `config` with PCI_ALLOWED or PCI_BLOCKED holding a wildcard, from a directory
/// holding a file named like the controller (an unquoted `*` would expand to it).
#[test]
fn wildcards_are_refused() {
    need_bash!();
    let f = validation_tree();
    let cwd = tempfile::tempdir().unwrap();
    fs::write(cwd.path().join("0000:01:00.0"), "").unwrap();
    let before = snapshot(&f);
    for (var, v) in [
        ("PCI_ALLOWED", "*"),
        ("PCI_ALLOWED", "0000:01:00.*"),
        ("PCI_ALLOWED", "01:00.?"),
        ("PCI_ALLOWED", "0000:0[0-9]:00.0"),
        ("PCI_ALLOWED", "01:00.0 *"),
        ("PCI_ALLOWED", "all"),
        ("PCI_ALLOWED", "ANY"),
        ("PCI_BLOCKED", "*"),
    ] {
        let st = stubs(true);
        let mut c = Command::new("bash");
        c.current_dir(cwd.path()).arg(script()).arg("config");
        let path = format!("{}:{}", st.path().display(), system_path());
        let out = script_env(&mut c, &f, &path).env(var, v).output().unwrap();
        let e = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{var}={v}: {e}");
        assert!(e.contains("wildcards are refused"), "{var}={v}: {e}");
        assert!(e.contains(&format!("{var}='{v}'")), "{e}");
        assert!(!st.path().join("calls").exists(), "{var}={v}");
        assert_eq!(snapshot(&f), before, "{var}={v}");
    }
}

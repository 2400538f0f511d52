//! `status`, `config` and `reset` with the tools of the VM guest only: busybox applets
//! and bash, with a bare `/dev` when that can be arranged.

use std::fs;
use std::path::Path;
use std::process::Command;

use crate::fake_kernel::FakeKernel;
use crate::fakesys::FakeSys;
use crate::fixture::{
    config_tree, fresh_tree, run_full, snapshot, state_file, table, without_overrides,
};

/// A directory holding every busybox applet and bash, nothing else: the tools of the
/// initramfs guest the VM tests boot.
fn busybox_path() -> Option<(tempfile::TempDir, String)> {
    let which = |name: &str| {
        std::env::var("PATH")
            .ok()?
            .split(':')
            .map(|d| Path::new(d).join(name))
            .find(|p| p.is_file())
    };
    let bb = which("busybox")?;
    let bash = which("bash")?;
    let list = Command::new(&bb).arg("--list").output().ok()?;
    let d = tempfile::tempdir().ok()?;
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        std::os::unix::fs::symlink(&bb, d.path().join(applet)).ok()?;
    }
    let b = d.path().join("bash");
    let _ = fs::remove_file(&b);
    std::os::unix::fs::symlink(bash, &b).ok()?;
    let p = d.path().display().to_string();
    Some((d, p))
}

/// A `bash` for the busybox test that runs in a private mount namespace whose `/dev` is
/// a bare tmpfs holding only `null`, as in the guest (no `/dev/fd`, no `/dev/stdin`). The
/// script gets the PATH it was given (the stubs and the busybox applets).
/// `None` when that cannot be arranged (not root, no `unshare`).
fn guest_dev_bash(bb_dir: &str) -> Option<String> {
    let unshare = ["/usr/bin/unshare", "/bin/unshare"]
        .into_iter()
        .find(|p| Path::new(p).exists())?;
    let probe = Command::new(unshare)
        .args(["-m", "/bin/sh", "-c", "mount -t tmpfs tmpfs /dev"])
        .output()
        .ok()?;
    if !probe.status.success() {
        return None;
    }
    let w = Path::new(bb_dir).join("guest-bash");
    fs::write(
        &w,
        format!(
            "#!/bin/sh\nexec {unshare} -m /bin/sh -c 'P=$PATH; PATH=/usr/sbin:/usr/bin:/sbin:/bin; mount -t tmpfs -o mode=755 tmpfs /dev && mknod -m 666 /dev/null c 1 3 && PATH=$P exec \"$@\"' sh {bb_dir}/bash \"$@\"\n"
        ),
    )
    .ok()?;
    fs::set_permissions(&w, std::os::unix::fs::PermissionsExt::from_mode(0o755)).ok()?;
    Some(w.display().to_string())
}

#[test]
fn runs_with_busybox_tools_only() {
    let Some((_keep, bb)) = busybox_path() else {
        eprintln!("skipped: busybox not installed (apt-get install busybox-static)");
        return;
    };
    let bash = match guest_dev_bash(&bb) {
        Some(b) => b,
        None => {
            eprintln!("note: /dev left as is (needs root and unshare to hide /dev/fd)");
            format!("{bb}/bash")
        }
    };
    on_a_tree_with_two_controllers(&bb, &bash);
    config_then_reset_to_the_same_tree(&bb, &bash);
}

/// `status`, a refused `config`, a `config` with nothing to bind and a `reset` whose
/// rebinding no kernel does, with the shell `bash` and the tools in `bb` only.
fn on_a_tree_with_two_controllers(bb: &str, bash: &str) {
    let f = config_tree();
    let (a, b) = (FakeSys::ON_NVME, FakeSys::ON_VFIO);
    f.two_controllers()
        .holder(a, "nvme0/nvme0n1", "dm-1", Some("vg-x"))
        .mount("/dev/nvme0n1p1", "/boot")
        .dev_vfio("4")
        .hugepages(Some(0), 2048, 1, 2);
    let r = run_full(&f, &["status"], &[], bb, bash, false);
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert_eq!(r.stdout(), table(&f));
    let r = run_full(&f, &["config"], &[("PCI_ALLOWED", a)], bb, bash, false);
    assert_eq!(r.code(), 1);
    assert!(
        r.stderr().contains("refusing to unbind 0000:01:00.0 from nvme: nvme0n1 held by dm-1 (vg-x), nvme0n1p1 mounted on /boot"),
        "{}",
        r.stderr()
    );
    let r = run_full(
        &f,
        &["config"],
        &[("PCI_ALLOWED", b), ("HUGEMEM", "8")],
        bb,
        bash,
        false,
    );
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert!(
        r.stdout()
            .contains("0000:02:00.0: already bound to vfio-pci"),
        "{}",
        r.stdout()
    );
    // The refused run above changed nothing, so the pool was still empty.
    assert!(
        r.stdout()
            .contains("hugepages: 4 x 2048 kB (8 MiB; there were 0)"),
        "{}",
        r.stdout()
    );
    let r = run_full(&f, &["reset"], &[("PCI_ALLOWED", b)], bb, bash, false);
    assert!(
        r.stderr().contains("0000:02:00.0 did not bind to nvme"),
        "{}",
        r.stderr()
    );
    assert!(r.calls.is_empty(), "{}", r.calls);
}

/// `config`, then `reset` back to the very same tree, with the busybox tools.
fn config_then_reset_to_the_same_tree(bb: &str, bash: &str) {
    let g = fresh_tree();
    let before = snapshot(&g);
    let _k = FakeKernel::start(&g);
    let env = [
        ("HUGEMEM", "64"),
        ("BIND_WAIT_S", "5"),
        ("TARGET_USER", "root"),
    ];
    let r = run_full(&g, &["config"], &env, bb, bash, true);
    assert_eq!(r.code(), 0, "{}{}", r.stdout(), r.stderr());
    assert!(r
        .stdout()
        .contains("0000:01:00.0: bound to vfio-pci (was nvme)"));
    assert!(
        r.stdout().contains("now belongs to root (uid 0, gid 0)"),
        "{}",
        r.stdout()
    );
    let r = run_full(&g, &["reset"], &env, bb, bash, true);
    assert_eq!(r.code(), 0, "{}{}", r.stdout(), r.stderr());
    assert_eq!(state_file(&g), None);
    assert_eq!(without_overrides(snapshot(&g)), without_overrides(before));
}

//! `scripts/setup.sh` against fake sysfs/procfs/dev trees, and `status` on this machine.
//!
//! `modprobe` and `mount` are replaced by stubs that log their arguments and fail, so no
//! test can load a module or mount anything on the machine running it.

#[path = "support/fakesys.rs"]
mod fakesys;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use fakesys::FakeSys;
use kestrel::hw::pci::{format_table, hugepage_status, list_nvme_controllers, SysRoots};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/setup.sh")
}

fn have_bash() -> bool {
    Command::new("bash").arg("--version").output().is_ok()
}

/// Stub `modprobe` and `mount` that record their arguments in `<dir>/calls` and fail.
fn stubs() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for name in ["modprobe", "mount"] {
        let p = d.path().join(name);
        fs::write(
            &p,
            format!(
                "#!/bin/sh\necho \"{name} $*\" >> \"{}/calls\"\nexit 1\n",
                d.path().display()
            ),
        )
        .unwrap();
        fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    d
}

struct Run {
    out: Output,
    calls: String,
}

impl Run {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }
    fn code(&self) -> i32 {
        self.out.status.code().unwrap_or(-1)
    }
}

/// Runs the script over the fake tree with `env` on top of a clean setup environment.
fn run(f: &FakeSys, args: &[&str], env: &[(&str, &str)]) -> Run {
    run_with_path(
        f,
        args,
        env,
        &std::env::var("PATH").unwrap_or_default(),
        "bash",
    )
}

/// As [`run`], with `path` after the stubs as PATH and `bash` as the shell, in an
/// environment holding nothing else.
fn run_with_path(f: &FakeSys, args: &[&str], env: &[(&str, &str)], path: &str, bash: &str) -> Run {
    let st = stubs();
    let path = format!("{}:{path}", st.path().display());
    let mut c = Command::new(bash);
    c.env_clear().arg(script()).args(args);
    for v in [
        "PCI_ALLOWED",
        "PCI_BLOCKED",
        "HUGEMEM",
        "TARGET_USER",
        "NOIOMMU",
    ] {
        c.env_remove(v);
    }
    c.env("SYSFS_ROOT", f.sys())
        .env("PROC_ROOT", f.proc())
        .env("DEV_ROOT", f.dev())
        .env("BIND_WAIT_S", "0")
        .env("PATH", path);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("run bash scripts/setup.sh");
    let calls = fs::read_to_string(st.path().join("calls")).unwrap_or_default();
    Run { out, calls }
}

fn table(f: &FakeSys) -> String {
    let roots = SysRoots::new(f.sys(), f.proc());
    format_table(
        &list_nvme_controllers(&roots).unwrap(),
        &hugepage_status(&f.sys()).unwrap(),
    )
}

/// A tree on which `config` needs no module loading or mounting: vfio-pci and type1
/// present, a 2 MiB hugepage pool, hugetlbfs mounted.
fn config_tree() -> FakeSys {
    let f = FakeSys::new();
    fs::create_dir_all(f.sys().join("bus/pci/drivers/vfio-pci")).unwrap();
    fs::create_dir_all(f.sys().join("bus/pci/drivers/nvme")).unwrap();
    fs::create_dir_all(f.sys().join("module/vfio_iommu_type1")).unwrap();
    f.hugepages(None, 2048, 0, 0);
    f.mount("nodev", "/dev/hugepages");
    // FakeSys::mount writes ext4; make that line hugetlbfs.
    let m = f.proc().join("mounts");
    let s = fs::read_to_string(&m).unwrap().replace(
        "nodev /dev/hugepages ext4",
        "nodev /dev/hugepages hugetlbfs",
    );
    fs::write(m, s).unwrap();
    f
}

fn read(p: impl AsRef<Path>) -> Option<String> {
    fs::read_to_string(p).ok()
}

fn dev_dir(f: &FakeSys, bdf: &str) -> PathBuf {
    f.sys().join("devices/pci0000:00").join(bdf)
}

macro_rules! need_bash {
    () => {
        if !have_bash() {
            eprintln!("skipped: no bash on this machine");
            return;
        }
    };
}

#[test]
fn status_prints_the_library_table_over_a_fake_tree() {
    need_bash!();
    let f = FakeSys::new();
    let a = "0000:01:00.0";
    f.nvme(a)
        .bind(a, "nvme")
        .group(a, 3)
        .numa(a, 0)
        .namespace(a, "nvme0", "nvme0n1", "259:0")
        .namespace(a, "nvme0", "nvme0n10", "259:9")
        .namespace(a, "nvme0", "nvme0n2", "259:1")
        .partition(a, "nvme0", "nvme0n1", "nvme0n1p1")
        .partition(a, "nvme0", "nvme0n1", "nvme0n1p2")
        .partition(a, "nvme0", "nvme0n1", "nvme0n1p3")
        .holder(a, "nvme0/nvme0n1/nvme0n1p3", "dm-0", Some("vg0-root"))
        .holder(a, "nvme0/nvme0n2", "md127", None)
        .mount("/dev/nvme0n1p1", "/boot")
        .mount("/dev/nvme0n1p1", "/mnt/again")
        .mount("/dev/sda1", "/")
        .swap("/dev/nvme0n1p2");
    f.nvme("0000:02:00.0")
        .bind("0000:02:00.0", "vfio-pci")
        .group("0000:02:00.0", 4);
    f.nvme("0000:00:0a.0").numa("0000:00:0a.0", 1);
    f.pci("0000:00:03.0", 0x020000, 0x8086, 0x100e)
        .bind("0000:00:03.0", "e1000");
    f.hugepages(Some(0), 2048, 60, 64)
        .hugepages(Some(0), 1048576, 0, 1)
        .hugepages(Some(1), 2048, 3, 4);
    let r = run(&f, &["status"], &[]);
    assert_eq!(r.code(), 0, "{}", r.stderr());
    let want = table(&f);
    assert!(
        want.contains("nvme0n1p1 mounted on /boot, nvme0n1p1 mounted on /mnt/again"),
        "{want}"
    );
    assert!(want.contains("nvme0n1p3 held by dm-0 (vg0-root)"), "{want}");
    assert!(want.contains("nvme0n1,nvme0n10,nvme0n2"), "{want}");
    assert_eq!(r.stdout(), want);
    assert!(r.calls.is_empty(), "status ran {}", r.calls);
}

#[test]
fn status_on_an_empty_tree_and_without_numa() {
    need_bash!();
    let f = FakeSys::new();
    let r = run(&f, &["status"], &[]);
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert_eq!(r.stdout(), table(&f));
    assert!(r
        .stdout()
        .contains("no NVMe controllers (PCI class 0x010802) found"));
    f.hugepages(None, 2048, 5, 8).nvme("0000:05:00.0");
    let r = run(&f, &["status"], &[]);
    assert_eq!(r.stdout(), table(&f));
    assert!(
        r.stdout().contains("-       2048kB           5       8"),
        "{}",
        r.stdout()
    );
}

#[test]
fn status_on_this_machine() {
    need_bash!();
    let roots = SysRoots::default();
    if !roots.sysfs.join("bus/pci/devices").is_dir() {
        eprintln!("skipped: no /sys/bus/pci/devices on this machine");
        return;
    }
    let out = Command::new("bash")
        .arg(script())
        .arg("status")
        .env_remove("SYSFS_ROOT")
        .env_remove("PROC_ROOT")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ctrls = list_nvme_controllers(&roots).unwrap();
    let want = format_table(&ctrls, &hugepage_status(&roots.sysfs).unwrap());
    assert_eq!(stdout, want);
    assert_eq!(stdout, kestrel::hw::pci::status_table(&roots).unwrap());
    if ctrls.is_empty() {
        assert!(
            stdout.contains("no NVMe controllers (PCI class 0x010802) found"),
            "{stdout}"
        );
    }
}

#[test]
fn config_refuses_a_mounted_controller_named_in_pci_allowed() {
    need_bash!();
    let f = config_tree();
    let a = "0000:01:00.0";
    f.nvme(a)
        .bind(a, "nvme")
        .group(a, 3)
        .namespace(a, "nvme0", "nvme0n1", "259:0")
        .partition(a, "nvme0", "nvme0n1", "nvme0n1p1")
        .mount("/dev/nvme0n1p1", "/boot");
    let r = run(&f, &["config"], &[("PCI_ALLOWED", "01:00.0")]);
    assert_eq!(r.code(), 1, "{}", r.stdout());
    assert!(
        r.stderr()
            .contains("refusing to unbind 0000:01:00.0 from nvme: nvme0n1p1 mounted on /boot"),
        "{}",
        r.stderr()
    );
    assert_eq!(
        read(dev_dir(&f, a).join("driver_override")),
        None,
        "nothing written"
    );
    assert_eq!(read(f.sys().join("bus/pci/drivers_probe")), None);
    assert!(r.calls.is_empty(), "{}", r.calls);
}

#[test]
fn config_refuses_swap_and_holders_and_skips_them_when_not_named() {
    need_bash!();
    let f = config_tree();
    let (s, h) = ("0000:01:00.0", "0000:02:00.0");
    f.nvme(s)
        .bind(s, "nvme")
        .group(s, 3)
        .namespace(s, "nvme0", "nvme0n1", "259:0")
        .swap("/dev/nvme0n1");
    f.nvme(h)
        .bind(h, "nvme")
        .group(h, 4)
        .namespace(h, "nvme1", "nvme1n1", "259:1")
        .partition(h, "nvme1", "nvme1n1", "nvme1n1p1")
        .holder(h, "nvme1/nvme1n1/nvme1n1p1", "dm-3", Some("vg1-data"))
        .holder(h, "nvme1/nvme1n1", "md0", None);
    let r = run(
        &f,
        &["config"],
        &[("PCI_ALLOWED", "0000:01:00.0 0000:02:00.0")],
    );
    assert_eq!(r.code(), 1);
    let e = r.stderr();
    assert!(
        e.contains("refusing to unbind 0000:01:00.0 from nvme: nvme0n1 used as swap"),
        "{e}"
    );
    assert!(
        e.contains("refusing to unbind 0000:02:00.0 from nvme: nvme1n1 held by md0, nvme1n1p1 held by dm-3 (vg1-data)"),
        "{e}"
    );
    // Not named: skipped with the reason, not a failure.
    let r = run(&f, &["config"], &[]);
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert!(
        r.stdout()
            .contains("0000:01:00.0: skipped, in use: nvme0n1 used as swap"),
        "{}",
        r.stdout()
    );
    assert!(
        r.stdout()
            .contains("0000:02:00.0: skipped, in use: nvme1n1 held by md0"),
        "{}",
        r.stdout()
    );
    assert_eq!(read(dev_dir(&f, s).join("driver_override")), None);
    assert_eq!(read(dev_dir(&f, h).join("driver_override")), None);
}

#[test]
fn config_binds_through_driver_override_and_drivers_probe() {
    need_bash!();
    let f = config_tree();
    let a = "0000:03:00.0";
    f.nvme(a)
        .bind(a, "nvme")
        .group(a, 9)
        .namespace(a, "nvme2", "nvme2n1", "259:2");
    let r = run(&f, &["config"], &[("PCI_ALLOWED", a), ("HUGEMEM", "64")]);
    // The fake kernel does not rebind, so the script sees it still on nvme and fails.
    assert_eq!(r.code(), 1, "{}", r.stdout());
    assert!(
        r.stderr()
            .contains("0000:03:00.0 did not bind to vfio-pci within 0 s (driver now: nvme)"),
        "{}",
        r.stderr()
    );
    assert_eq!(
        read(dev_dir(&f, a).join("driver_override")).as_deref(),
        Some("vfio-pci")
    );
    assert_eq!(
        read(f.sys().join("bus/pci/drivers/nvme/unbind")).as_deref(),
        Some("0000:03:00.0")
    );
    assert_eq!(
        read(f.sys().join("bus/pci/drivers_probe")).as_deref(),
        Some("0000:03:00.0")
    );
    assert_eq!(
        read(
            f.sys()
                .join("kernel/mm/hugepages/hugepages-2048kB/nr_hugepages")
        )
        .as_deref(),
        Some("32"),
        "HUGEMEM=64 MiB is 32 pages of 2 MiB"
    );
    assert!(r.calls.is_empty(), "{}", r.calls);
}

#[test]
fn config_is_idempotent_for_bound_controllers_and_chowns_the_group() {
    need_bash!();
    let f = config_tree();
    let a = "0000:04:00.0";
    f.nvme(a)
        .bind(a, "vfio-pci")
        .group(a, 12)
        .dev_vfio("12")
        .dev_vfio("vfio");
    f.hugepages(None, 2048, 1024, 1024);
    let uid = Command::new("id").args(["-u", "nobody"]).output();
    let me = Command::new("id").arg("-u").output().unwrap();
    let root = String::from_utf8_lossy(&me.stdout).trim() == "0";
    let nobody = uid.ok().filter(|o| o.status.success()).map(|o| {
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse::<u32>()
            .unwrap()
    });
    let env: Vec<(&str, &str)> = if root && nobody.is_some() {
        vec![("TARGET_USER", "nobody")]
    } else {
        eprintln!("chown part skipped: needs root and a `nobody` user");
        vec![]
    };
    for _ in 0..2 {
        let r = run(&f, &["config"], &env);
        assert_eq!(r.code(), 0, "{}", r.stderr());
        assert!(
            r.stdout()
                .contains("0000:04:00.0: already bound to vfio-pci"),
            "{}",
            r.stdout()
        );
        assert!(
            r.stdout().contains("hugepages: 1024 x 2 MiB already"),
            "{}",
            r.stdout()
        );
        assert_eq!(read(f.sys().join("bus/pci/drivers_probe")), None);
        assert!(r.calls.is_empty(), "{}", r.calls);
    }
    if let (true, Some(n)) = (root, nobody) {
        assert_eq!(fs::metadata(f.dev().join("vfio/12")).unwrap().uid(), n);
    }
}

#[test]
fn config_refuses_a_controller_without_iommu_group_unless_noiommu() {
    need_bash!();
    let f = config_tree();
    let a = "0000:05:00.0";
    f.nvme(a).bind(a, "nvme");
    let r = run(&f, &["config"], &[]);
    assert_eq!(r.code(), 1);
    let e = r.stderr();
    assert!(e.contains("0000:05:00.0 has no IOMMU group"), "{e}");
    assert!(
        e.contains("intel_iommu=on") && e.contains("NOIOMMU=1"),
        "{e}"
    );
    assert_eq!(read(dev_dir(&f, a).join("driver_override")), None);

    // noiommu: the parameter is switched on, loudly, and binding is attempted.
    f.write("module/vfio/parameters/enable_unsafe_noiommu_mode", "N\n");
    let r = run(&f, &["config"], &[("NOIOMMU", "1")]);
    assert!(r.stderr().contains("UNSAFE noiommu mode"), "{}", r.stderr());
    assert!(
        r.stderr().contains("can read and write ALL memory"),
        "{}",
        r.stderr()
    );
    assert_eq!(
        read(
            f.sys()
                .join("module/vfio/parameters/enable_unsafe_noiommu_mode")
        )
        .as_deref(),
        Some("1")
    );
    assert_eq!(
        read(dev_dir(&f, a).join("driver_override")).as_deref(),
        Some("vfio-pci")
    );
}

#[test]
fn noiommu_on_a_kernel_without_it() {
    need_bash!();
    let f = config_tree();
    fs::create_dir_all(f.sys().join("module/vfio/parameters")).unwrap();
    let r = run(&f, &["config"], &[("NOIOMMU", "1")]);
    assert_eq!(r.code(), 1);
    assert!(r.stderr().contains("CONFIG_VFIO_NOIOMMU"), "{}", r.stderr());
    // vfio not loaded at all: the script asks modprobe for it with the parameter.
    let g = config_tree();
    let r = run(&g, &["config"], &[("NOIOMMU", "1")]);
    assert_eq!(r.code(), 1);
    assert_eq!(r.calls, "modprobe vfio enable_unsafe_noiommu_mode=1\n");
    assert!(
        r.stderr()
            .contains("modprobe vfio enable_unsafe_noiommu_mode=1 failed"),
        "{}",
        r.stderr()
    );
}

#[test]
fn config_loads_modules_and_mounts_hugetlbfs_when_missing() {
    need_bash!();
    let f = FakeSys::new();
    f.hugepages(None, 2048, 0, 0);
    let r = run(&f, &["config"], &[]);
    assert_eq!(r.code(), 1);
    assert_eq!(r.calls, "modprobe vfio-pci\n");
    fs::create_dir_all(f.sys().join("bus/pci/drivers/vfio-pci")).unwrap();
    let r = run(&f, &["config"], &[]);
    assert_eq!(r.calls, "modprobe vfio_iommu_type1\n");
    fs::create_dir_all(f.sys().join("module/vfio_iommu_type1")).unwrap();
    let r = run(&f, &["config"], &[]);
    assert_eq!(r.code(), 1);
    assert_eq!(
        r.calls,
        format!("mount -t hugetlbfs nodev {}/hugepages\n", f.dev().display())
    );
    assert!(
        r.stderr().contains("cannot mount hugetlbfs"),
        "{}",
        r.stderr()
    );
}

#[test]
fn config_rejects_bad_settings() {
    need_bash!();
    let f = config_tree();
    f.nvme("0000:01:00.0")
        .bind("0000:01:00.0", "nvme")
        .group("0000:01:00.0", 1);
    f.pci("0000:00:03.0", 0x020000, 0x8086, 0x100e);
    for (env, msg) in [
        (
            ("HUGEMEM", "lots"),
            "HUGEMEM='lots' is not a positive number of MiB",
        ),
        (
            ("PCI_ALLOWED", "1:2:3:4"),
            "PCI_ALLOWED: '1:2:3:4' is not a PCI address",
        ),
        (
            ("PCI_BLOCKED", "nope"),
            "PCI_BLOCKED: 'nope' is not a PCI address",
        ),
        (
            ("PCI_ALLOWED", "0000:09:00.0"),
            "PCI_ALLOWED: no PCI device 0000:09:00.0",
        ),
        (
            ("PCI_ALLOWED", "00:03.0"),
            "PCI_ALLOWED: 0000:00:03.0 is not an NVMe controller (class 0x020000)",
        ),
    ] {
        let r = run(&f, &["config"], &[env]);
        assert_eq!(r.code(), 1, "{env:?}");
        assert!(r.stderr().contains(msg), "{env:?}: {}", r.stderr());
        assert_eq!(
            read(dev_dir(&f, "0000:01:00.0").join("driver_override")),
            None
        );
    }
    // PCI_BLOCKED keeps the only controller out.
    let r = run(&f, &["config"], &[("PCI_BLOCKED", "01:00.0")]);
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert!(
        r.stdout().contains("0000:01:00.0: skipped (PCI_BLOCKED)"),
        "{}",
        r.stdout()
    );
    assert_eq!(
        read(dev_dir(&f, "0000:01:00.0").join("driver_override")),
        None
    );
}

#[test]
fn reset_refuses_a_group_in_use_and_rebinds_otherwise() {
    need_bash!();
    let f = config_tree();
    let a = "0000:06:00.0";
    f.nvme(a).bind(a, "vfio-pci").group(a, 5).dev_vfio("5");
    let fd = f.proc().join("4242/fd");
    fs::create_dir_all(&fd).unwrap();
    std::os::unix::fs::symlink(f.dev().join("vfio/5"), fd.join("7")).unwrap();
    fs::write(f.proc().join("4242/comm"), "kestrel\n").unwrap();
    let r = run(&f, &["reset"], &[]);
    assert_eq!(r.code(), 1);
    assert!(
        r.stderr().contains("0000:06:00.0 is in use through"),
        "{}",
        r.stderr()
    );
    assert!(
        r.stderr().contains("by pid 4242 (kestrel)"),
        "{}",
        r.stderr()
    );
    assert_eq!(read(dev_dir(&f, a).join("driver_override")), None);

    fs::remove_dir_all(f.proc().join("4242")).unwrap();
    let r = run(&f, &["reset"], &[]);
    assert_eq!(r.code(), 1, "fake kernel does not rebind");
    assert!(
        r.stderr().contains("0000:06:00.0 did not bind to nvme"),
        "{}",
        r.stderr()
    );
    assert_eq!(
        read(dev_dir(&f, a).join("driver_override")).as_deref(),
        Some("\n")
    );
    assert_eq!(
        read(f.sys().join("bus/pci/drivers/vfio-pci/unbind")).as_deref(),
        Some("0000:06:00.0")
    );
    assert_eq!(
        read(f.sys().join("bus/pci/drivers_probe")).as_deref(),
        Some("0000:06:00.0")
    );
}

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
    assert_eq!(r.code(), 1);
    assert!(
        r.stderr().contains("unknown subcommand 'frobnicate'"),
        "{}",
        r.stderr()
    );
    let r = run(&f, &["status", "extra"], &[]);
    assert_eq!(r.code(), 1);
}

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
/// a bare tmpfs holding only `null`, as in the guest (no `/dev/fd`, no `/dev/stdin`).
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
            "#!/bin/sh\nexec {unshare} -m /bin/sh -c 'PATH=/usr/sbin:/usr/bin:/sbin:/bin; mount -t tmpfs -o mode=755 tmpfs /dev && mknod -m 666 /dev/null c 1 3 && exec \"$@\"' sh {bb_dir}/bash \"$@\"\n"
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
    let f = config_tree();
    let a = "0000:01:00.0";
    f.nvme(a)
        .bind(a, "nvme")
        .group(a, 3)
        .numa(a, 0)
        .namespace(a, "nvme0", "nvme0n1", "259:0")
        .partition(a, "nvme0", "nvme0n1", "nvme0n1p1")
        .holder(a, "nvme0/nvme0n1", "dm-1", Some("vg-x"))
        .mount("/dev/nvme0n1p1", "/boot");
    let b = "0000:02:00.0";
    f.nvme(b).bind(b, "vfio-pci").group(b, 4).dev_vfio("4");
    f.hugepages(Some(0), 2048, 1, 2);
    let r = run_with_path(&f, &["status"], &[], &bb, &bash);
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert_eq!(r.stdout(), table(&f));
    let r = run_with_path(&f, &["config"], &[("PCI_ALLOWED", a)], &bb, &bash);
    assert_eq!(r.code(), 1);
    assert!(
        r.stderr().contains("refusing to unbind 0000:01:00.0 from nvme: nvme0n1 held by dm-1 (vg-x), nvme0n1p1 mounted on /boot"),
        "{}",
        r.stderr()
    );
    let r = run_with_path(
        &f,
        &["config"],
        &[("PCI_ALLOWED", b), ("HUGEMEM", "8")],
        &bb,
        &bash,
    );
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert!(
        r.stdout()
            .contains("0000:02:00.0: already bound to vfio-pci"),
        "{}",
        r.stdout()
    );
    // The refused run above already made the default 1024 pages; a smaller HUGEMEM
    // leaves the pool alone.
    assert!(
        r.stdout()
            .contains("hugepages: 1024 x 2 MiB already (HUGEMEM=8 MiB needs 4)"),
        "{}",
        r.stdout()
    );
    let r = run_with_path(&f, &["reset"], &[("PCI_ALLOWED", b)], &bb, &bash);
    assert!(
        r.stderr().contains("0000:02:00.0 did not bind to nvme"),
        "{}",
        r.stderr()
    );
    assert!(r.calls.is_empty(), "{}", r.calls);
}

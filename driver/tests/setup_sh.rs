//! `scripts/setup.sh` against fake sysfs/procfs/dev trees, and `status` on this machine.
//!
//! `modprobe`, `mount` and `umount` are replaced by stubs that log their arguments. The
//! failing stubs ([`run`]) change nothing; the working ones ([`run_working`]) act on the
//! fake tree only (a module directory, a line of the fake mounts file). No test can load
//! a module or mount anything on the machine running it. [`FakeKernel`] plays the
//! kernel's part in binding (driver_override, unbind, drivers_probe) on the fake tree.

#[path = "support/fakesys.rs"]
mod fakesys;

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use fakesys::{kernel_bind, kernel_unbind, FakeSys};
use kestrel::hw::pci::{format_table, hugepage_status, list_nvme_controllers, SysRoots};

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/setup.sh")
}

fn have_bash() -> bool {
    Command::new("bash").arg("--version").output().is_ok()
}

fn write_exe(p: &Path, text: &str) {
    fs::write(p, text).unwrap();
    fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
}

/// Stub `modprobe`, `mount` and `umount` that record their arguments in `<dir>/calls`.
/// Failing ones change nothing; working ones act on the fake tree the script is given
/// (through SYSFS_ROOT and PROC_ROOT in their environment) as the real ones would.
fn stubs(working: bool) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let log = |name: &str| {
        format!(
            "#!/bin/sh\necho \"{name} $*\" >> \"{}/calls\"\n",
            d.path().display()
        )
    };
    if !working {
        for name in ["modprobe", "mount", "umount"] {
            write_exe(&d.path().join(name), &format!("{}exit 1\n", log(name)));
        }
        return d;
    }
    write_exe(
        &d.path().join("modprobe"),
        &format!(
            r#"{}
m=$1
if [ "$m" = -r ]; then
    m=$2
    case $m in
    vfio-pci) rm -rf "$SYSFS_ROOT/bus/pci/drivers/vfio-pci" ;;
    nvme) rm -rf "$SYSFS_ROOT/bus/pci/drivers/nvme" ;;
    *) rm -rf "$SYSFS_ROOT/module/$m" ;;
    esac
    exit 0
fi
case $m in
vfio-pci) mkdir -p "$SYSFS_ROOT/bus/pci/drivers/vfio-pci" ;;
nvme) mkdir -p "$SYSFS_ROOT/bus/pci/drivers/nvme" ;;
vfio)
    mkdir -p "$SYSFS_ROOT/module/vfio/parameters"
    if [ "$2" = enable_unsafe_noiommu_mode=1 ]; then v=Y; else v=N; fi
    echo $v > "$SYSFS_ROOT/module/vfio/parameters/enable_unsafe_noiommu_mode"
    ;;
*) mkdir -p "$SYSFS_ROOT/module/$m" ;;
esac
"#,
            log("modprobe")
        ),
    );
    write_exe(
        &d.path().join("mount"),
        &format!(
            r#"{}
opts=rw
while [ $# -gt 2 ]; do
    if [ "$1" = -o ]; then opts=$2; shift; fi
    shift
done
echo "$1 $2 hugetlbfs $opts 0 0" >> "$PROC_ROOT/mounts"
"#,
            log("mount")
        ),
    );
    write_exe(
        &d.path().join("umount"),
        &format!(
            r#"{}
grep -v " $1 hugetlbfs " "$PROC_ROOT/mounts" > "$PROC_ROOT/mounts.new"
mv "$PROC_ROOT/mounts.new" "$PROC_ROOT/mounts"
"#,
            log("umount")
        ),
    );
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

/// Runs the script over the fake tree with `env` on top of a clean setup environment,
/// with failing stubs.
fn run(f: &FakeSys, args: &[&str], env: &[(&str, &str)]) -> Run {
    run_full(f, args, env, &system_path(), "bash", false)
}

/// As [`run`] with working stubs.
fn run_working(f: &FakeSys, args: &[&str], env: &[(&str, &str)]) -> Run {
    run_full(f, args, env, &system_path(), "bash", true)
}

fn system_path() -> String {
    std::env::var("PATH").unwrap_or_default()
}

/// Where the script keeps its state file in these tests.
fn state_dir(f: &FakeSys) -> PathBuf {
    f.dir.path().join("run/kestrel")
}

fn state_file(f: &FakeSys) -> Option<String> {
    read(state_dir(f).join("setup.state"))
}

/// Runs the script with `path` after the stubs as PATH and `bash` as the shell, in an
/// environment holding nothing else, under a 60 s `timeout` when there is one.
fn run_full(
    f: &FakeSys,
    args: &[&str],
    env: &[(&str, &str)],
    path: &str,
    bash: &str,
    working: bool,
) -> Run {
    let st = stubs(working);
    let path = format!("{}:{path}", st.path().display());
    let mut c = Command::new(bash);
    c.env_clear().arg(script()).args(args);
    c.env("SYSFS_ROOT", f.sys())
        .env("PROC_ROOT", f.proc())
        .env("DEV_ROOT", f.dev())
        .env("STATE_DIR", state_dir(f))
        .env("BIND_WAIT_S", "0")
        .env("PATH", path);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("run bash scripts/setup.sh");
    let calls = fs::read_to_string(st.path().join("calls")).unwrap_or_default();
    Run { out, calls }
}

/// Every directory, file (with its content) and link (with its target) below the fake
/// sys/, proc/ and dev/, for "nothing was changed" checks.
fn snapshot(f: &FakeSys) -> BTreeMap<PathBuf, String> {
    fn walk(root: &Path, d: &Path, out: &mut BTreeMap<PathBuf, String>) {
        let mut ents: Vec<_> = fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        ents.sort();
        for p in ents {
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            let md = fs::symlink_metadata(&p).unwrap();
            if md.file_type().is_symlink() {
                out.insert(rel, format!("-> {}", fs::read_link(&p).unwrap().display()));
            } else if md.file_type().is_fifo() {
                out.insert(rel, "fifo".into());
            } else if md.is_dir() {
                out.insert(rel, format!("dir {:o}", md.mode()));
                walk(root, &p, out);
            } else {
                let text = fs::read_to_string(&p).unwrap_or_else(|_| "<fifo or binary>".into());
                // Trimmed: the kernel ends what it reads back with a newline, the script
                // writes without one.
                let text = text.trim_end();
                out.insert(
                    rel,
                    format!("{:o} {}:{} {text}", md.mode(), md.uid(), md.gid()),
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    for top in ["sys", "proc", "dev"] {
        walk(f.dir.path(), &f.dir.path().join(top), &mut out);
    }
    out
}

/// Plays the kernel's part in binding on a fake tree, polled every 2 ms until dropped:
/// a BDF written to `bus/pci/drivers/<drv>/unbind` unbinds the device; a BDF written to
/// `bus/pci/drivers_probe` binds an unbound device to its `driver_override` or, with
/// none, to `nvme` when that driver is there (NVMe class only). Binding to vfio-pci makes
/// `/dev/vfio/<group>`; unbinding from it removes the node. Each file is consumed.
struct FakeKernel {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeKernel {
    fn start(f: &FakeSys) -> Self {
        let (sys, dev) = (f.sys(), f.dev());
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                Self::step(&sys, &dev);
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        FakeKernel {
            stop,
            thread: Some(thread),
        }
    }

    /// A BDF from a file the script wrote, consuming the file; `None` while it is empty
    /// (written a moment later).
    fn take(p: &Path) -> Option<String> {
        let s = fs::read_to_string(p).ok()?;
        let b = s.trim().to_string();
        if b.is_empty() {
            return None;
        }
        fs::remove_file(p).unwrap();
        Some(b)
    }

    fn group(sys: &Path, bdf: &str) -> Option<String> {
        let l = fs::read_link(sys.join("devices/pci0000:00").join(bdf).join("iommu_group")).ok()?;
        Some(l.file_name()?.to_string_lossy().into_owned())
    }

    fn step(sys: &Path, dev: &Path) {
        let drivers = sys.join("bus/pci/drivers");
        for d in fs::read_dir(&drivers).into_iter().flatten().flatten() {
            if let Some(b) = Self::take(&d.path().join("unbind")) {
                if kernel_unbind(sys, &b).as_deref() == Some("vfio-pci") {
                    if let Some(g) = Self::group(sys, &b) {
                        let _ = fs::remove_file(dev.join("vfio").join(g));
                    }
                }
            }
        }
        let Some(b) = Self::take(&sys.join("bus/pci/drivers_probe")) else {
            return;
        };
        let d = sys.join("devices/pci0000:00").join(&b);
        if fs::symlink_metadata(d.join("driver")).is_ok() {
            return;
        }
        let ov = read(d.join("driver_override")).unwrap_or_default();
        let ov = ov.trim();
        let target = if !ov.is_empty() && ov != "(null)" {
            ov.to_string()
        } else if read(d.join("class")).as_deref() == Some("0x010802\n")
            && drivers.join("nvme").is_dir()
        {
            "nvme".to_string()
        } else {
            return;
        };
        if !drivers.join(&target).is_dir() {
            return;
        }
        kernel_bind(sys, &b, &target);
        if target == "vfio-pci" {
            if let Some(g) = Self::group(sys, &b) {
                fs::write(dev.join("vfio").join(g), "").unwrap();
            }
        }
    }
}

impl Drop for FakeKernel {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
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
    let before = snapshot(&f);
    let r = run_working(&f, &["config"], &[("PCI_ALLOWED", "01:00.0")]);
    assert_eq!(r.code(), 1, "{}", r.stdout());
    assert!(r.stderr().contains("nothing was changed"), "{}", r.stderr());
    assert_eq!(snapshot(&f), before, "the refusal came before any action");
    assert_eq!(state_file(&f), None);
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
    // What config found, for reset.
    let st = state_file(&f).unwrap();
    assert!(st.contains("\nhugepages 2048 0\n"), "{st}");
    assert!(st.contains("\ndriver 0000:03:00.0 nvme\n"), "{st}");
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
            r.stdout()
                .contains("hugepages: 1024 x 2048 kB already (HUGEMEM=2048 MiB needs 1024)"),
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
    assert_eq!(
        r.calls,
        format!(
            "mount -t hugetlbfs -o pagesize=2048K nodev {}/hugepages\n",
            f.dev().display()
        )
    );
    assert!(
        r.stderr().contains("cannot mount hugetlbfs"),
        "{}",
        r.stderr()
    );
    fs::write(
        f.proc().join("mounts"),
        "nodev /dev/hugepages hugetlbfs rw 0 0\n",
    )
    .unwrap();
    let r = run(&f, &["config"], &[]);
    assert_eq!(r.calls, "modprobe vfio-pci\n");
    assert!(
        r.stderr().contains("modprobe vfio-pci  failed"),
        "{}",
        r.stderr()
    );
    fs::create_dir_all(f.sys().join("bus/pci/drivers/vfio-pci")).unwrap();
    let r = run(&f, &["config"], &[]);
    assert_eq!(r.code(), 1);
    assert_eq!(r.calls, "modprobe vfio_iommu_type1\n");
}

#[test]
fn pci_blocked_keeps_a_controller_out() {
    need_bash!();
    let f = config_tree();
    f.nvme("0000:01:00.0")
        .bind("0000:01:00.0", "nvme")
        .group("0000:01:00.0", 1);
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
    let r = run_full(&f, &["status"], &[], &bb, &bash, false);
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert_eq!(r.stdout(), table(&f));
    let r = run_full(&f, &["config"], &[("PCI_ALLOWED", a)], &bb, &bash, false);
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
        &bb,
        &bash,
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
    let r = run_full(&f, &["reset"], &[("PCI_ALLOWED", b)], &bb, &bash, false);
    assert!(
        r.stderr().contains("0000:02:00.0 did not bind to nvme"),
        "{}",
        r.stderr()
    );
    assert!(r.calls.is_empty(), "{}", r.calls);

    // config, then reset back to the same tree, with the busybox tools.
    let g = fresh_tree();
    let before = snapshot(&g);
    let _k = FakeKernel::start(&g);
    let env = [
        ("HUGEMEM", "64"),
        ("BIND_WAIT_S", "5"),
        ("TARGET_USER", "root"),
    ];
    let r = run_full(&g, &["config"], &env, &bb, &bash, true);
    assert_eq!(r.code(), 0, "{}{}", r.stdout(), r.stderr());
    assert!(r
        .stdout()
        .contains("0000:01:00.0: bound to vfio-pci (was nvme)"));
    assert!(
        r.stdout().contains("now belongs to root (uid 0, gid 0)"),
        "{}",
        r.stdout()
    );
    let r = run_full(&g, &["reset"], &env, &bb, &bash, true);
    assert_eq!(r.code(), 0, "{}{}", r.stdout(), r.stderr());
    assert_eq!(state_file(&g), None);
    assert_eq!(without_overrides(snapshot(&g)), without_overrides(before));
}

/// A tree with one NVMe controller on nvme (group 1, a namespace, nothing mounted), a
/// network card, 4 GB of memory, and what config needs already there.
fn validation_tree() -> FakeSys {
    let f = config_tree();
    let a = "0000:01:00.0";
    f.nvme(a)
        .bind(a, "nvme")
        .group(a, 1)
        .namespace(a, "nvme0", "nvme0n1", "259:0");
    f.pci("0000:00:03.0", 0x020000, 0x8086, 0x100e);
    fs::write(f.proc().join("meminfo"), "MemTotal:        4000000 kB\n").unwrap();
    f
}

#[test]
fn every_bad_value_is_refused_before_anything_is_done() {
    need_bash!();
    let f = validation_tree();
    let nobody = "no-such-user-kestrel";
    let cases: &[(&[(&str, &str)], &str)] = &[
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
            &[("TARGET_USER", nobody)],
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
    // What only config needs (the pool's size against the machine) is checked by
    // config only.
    let config_only = ["HUGEPGSZ=1048576: this", "HUGEMEM=5000 MiB"];
    let before = snapshot(&f);
    for (env, msg) in cases {
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
        let out = Command::new("bash")
            .env_clear()
            .current_dir(cwd.path())
            .arg(script())
            .arg("config")
            .env("SYSFS_ROOT", f.sys())
            .env("PROC_ROOT", f.proc())
            .env("DEV_ROOT", f.dev())
            .env("STATE_DIR", state_dir(&f))
            .env("BIND_WAIT_S", "0")
            .env("PATH", format!("{}:{}", st.path().display(), system_path()))
            .env(var, v)
            .output()
            .unwrap();
        let e = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{var}={v}: {e}");
        assert!(e.contains("wildcards are refused"), "{var}={v}: {e}");
        assert!(e.contains(&format!("{var}='{v}'")), "{e}");
        assert!(!st.path().join("calls").exists(), "{var}={v}");
        assert_eq!(snapshot(&f), before, "{var}={v}");
    }
}

#[test]
fn a_controller_holding_the_root_filesystem_is_never_bound() {
    need_bash!();
    let f = config_tree();
    let a = "0000:01:00.0";
    // Root mounted from /dev/root: only mountinfo's device number says where it is.
    f.nvme(a)
        .bind(a, "nvme")
        .group(a, 2)
        .namespace(a, "nvme0", "nvme0n1", "259:0")
        .partition(a, "nvme0", "nvme0n1", "nvme0n1p2")
        .devno(a, "nvme0/nvme0n1/nvme0n1p2", "259:2")
        .mount_devno("259:2", "/dev/root", "/");
    fs::write(
        f.proc().join("mounts"),
        "/dev/root / ext4 rw 0 0\nnodev /dev/hugepages hugetlbfs rw 0 0\n",
    )
    .unwrap();
    let before = snapshot(&f);
    let r = run_working(&f, &["config"], &[("PCI_ALLOWED", a)]);
    assert_eq!(r.code(), 1);
    assert!(
        r.stderr()
            .contains("refusing to unbind 0000:01:00.0 from nvme: nvme0n1p2 mounted on /;"),
        "{}",
        r.stderr()
    );
    assert_eq!(snapshot(&f), before);
    assert!(r.calls.is_empty(), "{}", r.calls);
    // Not named: skipped, and the rest of config goes on.
    let _k = FakeKernel::start(&f);
    let r = run_working(&f, &["config"], &[("HUGEMEM", "4")]);
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert!(
        r.stdout()
            .contains("0000:01:00.0: skipped, in use: nvme0n1p2 mounted on /"),
        "{}",
        r.stdout()
    );
    assert_eq!(read(dev_dir(&f, a).join("driver_override")), None);
    assert!(dev_dir(&f, a).join("driver").exists());
    // The library's table says the same.
    assert!(
        table(&f).contains("nvme0n1p2 mounted on /\n"),
        "{}",
        table(&f)
    );
}

/// Serves `path` as a FIFO the way the kernel serves `nr_hugepages` when memory is
/// short: a read gives the pool size, a write asks for a size and gets at most `cap`.
/// `ops` is the sequence of opens expected from the script (`r`: it reads, `w`: it
/// writes). Returns what the script wrote, or why the sequence broke.
fn short_memory_nr_hugepages(
    path: &Path,
    mut pool: u64,
    cap: u64,
    ops: &'static str,
) -> JoinHandle<Result<Vec<String>, String>> {
    use std::io::{ErrorKind, Read, Write};
    use std::os::unix::fs::OpenOptionsExt;
    let path = path.to_path_buf();
    let _ = fs::remove_file(&path);
    let st = Command::new("mkfifo").arg(&path).status().unwrap();
    assert!(st.success());
    std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut written = Vec::new();
        for op in ops.chars() {
            if op == 'r' {
                // Opening for writing without blocking works once the script has the
                // FIFO open for reading.
                let mut w = loop {
                    match fs::OpenOptions::new()
                        .write(true)
                        .custom_flags(libc::O_NONBLOCK)
                        .open(&path)
                    {
                        Ok(w) => break w,
                        Err(_) if Instant::now() < deadline => {
                            std::thread::sleep(Duration::from_millis(2))
                        }
                        Err(e) => return Err(format!("no read came ({e}); wrote {written:?}")),
                    }
                };
                w.write_all(format!("{pool}\n").as_bytes())
                    .map_err(|e| e.to_string())?;
                // Close only once the script has read it all: a reader opened for the
                // next write would otherwise take what is left in the pipe.
                while rustix::io::ioctl_fionread(&w).map_err(|e| e.to_string())? > 0 {
                    if Instant::now() > deadline {
                        return Err(format!("the script did not read; wrote {written:?}"));
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            } else {
                let mut r = fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_NONBLOCK)
                    .open(&path)
                    .map_err(|e| e.to_string())?;
                let mut got = Vec::new();
                let mut buf = [0u8; 64];
                loop {
                    match r.read(&mut buf) {
                        Ok(0) if !got.is_empty() => break,
                        Ok(n) if n > 0 => got.extend_from_slice(&buf[..n]),
                        Ok(_) => {}
                        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
                        Err(e) => return Err(e.to_string()),
                    }
                    if Instant::now() > deadline {
                        return Err(format!("no write came; wrote {written:?}"));
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                let v = String::from_utf8_lossy(&got).trim().to_string();
                pool = v.parse::<u64>().map_err(|e| format!("{v}: {e}"))?.min(cap);
                written.push(v);
            }
        }
        Ok(written)
    })
}

#[test]
fn hugepages_granted_fewer_are_reported_and_given_back() {
    need_bash!();
    if Command::new("mkfifo").arg("--version").output().is_err() {
        eprintln!("skipped: no mkfifo");
        return;
    }
    let f = config_tree();
    let a = "0000:01:00.0";
    f.nvme(a).bind(a, "nvme").group(a, 1);
    let nr = f
        .sys()
        .join("kernel/mm/hugepages/hugepages-2048kB/nr_hugepages");
    // The script reads the pool (16), asks for 512, reads what it got (100), puts the
    // pool back (16) and reads it again.
    let kernel = short_memory_nr_hugepages(&nr, 16, 100, "rwrwr");
    let st = stubs(true);
    let out = Command::new("timeout")
        .args(["30", "bash"])
        .arg(script())
        .arg("config")
        .env_clear()
        .env("SYSFS_ROOT", f.sys())
        .env("PROC_ROOT", f.proc())
        .env("DEV_ROOT", f.dev())
        .env("STATE_DIR", state_dir(&f))
        .env("BIND_WAIT_S", "0")
        .env("PATH", format!("{}:{}", st.path().display(), system_path()))
        .env("HUGEMEM", "1024")
        .output()
        .unwrap();
    let written = kernel
        .join()
        .unwrap()
        .expect("the script's reads and writes");
    let e = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{e}");
    assert_eq!(written, ["512", "16"], "asked for 512, then gave back");
    assert!(
        e.contains("asked for 512 hugepages of 2048 kB (HUGEMEM=1024 MiB), the kernel granted 100"),
        "{e}"
    );
    assert!(
        e.contains("The pool put back to 16; no controller was bound"),
        "{e}"
    );
    assert!(
        !st.path().join("calls").exists(),
        "nothing after the shortfall"
    );
    assert_eq!(read(dev_dir(&f, a).join("driver_override")), None);
    assert_eq!(
        state_file(&f),
        None,
        "nothing recorded: nothing stayed changed"
    );
}

/// One NVMe controller on nvme in group 9, a 2 MiB pool of 16 pages, no hugetlbfs
/// mount, no vfio module: what config finds on a fresh machine.
fn fresh_tree() -> FakeSys {
    let f = FakeSys::new();
    let a = "0000:01:00.0";
    fs::create_dir_all(f.sys().join("bus/pci/drivers/nvme")).unwrap();
    fs::create_dir_all(f.sys().join("module")).unwrap();
    f.nvme(a)
        .bind(a, "nvme")
        .group(a, 9)
        .namespace(a, "nvme0", "nvme0n1", "259:0");
    f.hugepages(None, 2048, 16, 16);
    fs::write(f.proc().join("mounts"), "/dev/sda1 / ext4 rw 0 0\n").unwrap();
    f
}

/// The snapshot without `driver_override` files, which stay behind cleared (the kernel
/// reads them back as "(null)").
fn without_overrides(s: BTreeMap<PathBuf, String>) -> BTreeMap<PathBuf, String> {
    s.into_iter()
        .filter(|(p, _)| !p.ends_with("driver_override"))
        .collect()
}

#[test]
fn reset_restores_what_config_found() {
    need_bash!();
    let f = fresh_tree();
    let a = "0000:01:00.0";
    let before = snapshot(&f);
    let _k = FakeKernel::start(&f);
    let env = [("HUGEMEM", "64"), ("BIND_WAIT_S", "5")];
    let r = run_working(&f, &["config"], &env);
    assert_eq!(r.code(), 0, "{}{}", r.stdout(), r.stderr());
    assert!(
        r.stdout()
            .contains("0000:01:00.0: bound to vfio-pci (was nvme)"),
        "{}",
        r.stdout()
    );
    assert_eq!(
        r.calls,
        format!(
            "mount -t hugetlbfs -o pagesize=2048K nodev {}/hugepages\nmodprobe vfio-pci\nmodprobe vfio_iommu_type1\n",
            f.dev().display()
        )
    );
    assert!(f.dev().join("vfio/9").exists());
    assert_eq!(
        state_file(&f).unwrap(),
        format!(
            "# kestrel setup.sh: what config found, for reset to restore\nhugepages 2048 16\nmkdir {0}/hugepages\nmount {0}/hugepages\nmodule vfio-pci\nmodule vfio_iommu_type1\ndriver 0000:01:00.0 nvme\n",
            f.dev().display()
        )
    );
    // A second config, with a bigger pool: nothing to bind, the pool grows, the record
    // keeps what the first config found.
    let st = state_file(&f);
    let r = run_working(&f, &["config"], &[("HUGEMEM", "128")]);
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert!(r
        .stdout()
        .contains("0000:01:00.0: already bound to vfio-pci"));
    assert!(r.calls.is_empty(), "{}", r.calls);
    assert_eq!(state_file(&f), st);

    let r = run_working(&f, &["reset"], &[("BIND_WAIT_S", "5")]);
    assert_eq!(r.code(), 0, "{}{}", r.stdout(), r.stderr());
    assert!(
        r.stdout()
            .contains("0000:01:00.0: bound to nvme (was vfio-pci)"),
        "{}",
        r.stdout()
    );
    assert!(r.stdout().contains("hugepages: 2048 kB pool back to 16"));
    assert_eq!(
        r.calls,
        format!(
            "umount {}/hugepages\nmodprobe -r vfio_iommu_type1\nmodprobe -r vfio-pci\n",
            f.dev().display()
        )
    );
    assert_eq!(state_file(&f), None, "every record restored");
    assert_eq!(
        read(dev_dir(&f, a).join("driver_override")).as_deref(),
        Some("\n")
    );
    assert_eq!(without_overrides(snapshot(&f)), without_overrides(before));
    // Nothing left to restore: a second reset changes nothing.
    let after = snapshot(&f);
    let r = run_working(&f, &["reset"], &[]);
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert!(r.stdout().contains("0000:01:00.0: already bound to nvme"));
    assert_eq!(snapshot(&f), after);
}

#[test]
fn reset_gives_an_unbound_controller_back_to_no_driver_and_a_partial_reset_keeps_the_pool() {
    need_bash!();
    let f = fresh_tree();
    let b = "0000:02:00.0";
    f.nvme(b).group(b, 10);
    let _k = FakeKernel::start(&f);
    let r = run_working(&f, &["config"], &[("HUGEMEM", "64"), ("BIND_WAIT_S", "5")]);
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert!(r
        .stdout()
        .contains("0000:02:00.0: bound to vfio-pci (was no driver)"));
    assert!(state_file(&f)
        .unwrap()
        .contains("\ndriver 0000:02:00.0 none\n"));
    // Only the unbound one: it goes back to no driver, the pool and modules stay.
    let r = run_working(&f, &["reset"], &[("PCI_ALLOWED", b), ("BIND_WAIT_S", "5")]);
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert!(
        r.stdout()
            .contains("0000:02:00.0: bound to no driver (was vfio-pci)"),
        "{}",
        r.stdout()
    );
    assert!(r
        .stdout()
        .contains("stay until a reset without PCI_ALLOWED"));
    assert!(r.calls.is_empty(), "{}", r.calls);
    assert!(!dev_dir(&f, b).join("driver").exists());
    let st = state_file(&f).unwrap();
    assert!(!st.contains("0000:02:00.0"), "{st}");
    assert!(st.contains("\nhugepages 2048 16\n"), "{st}");
    assert_eq!(
        read(
            f.sys()
                .join("kernel/mm/hugepages/hugepages-2048kB/nr_hugepages")
        )
        .as_deref(),
        Some("32")
    );
    // A full reset: modules are unloaded only once nothing is bound to vfio-pci.
    kernel_bind(&f.sys(), b, "vfio-pci");
    let r = run_working(&f, &["reset"], &[("PCI_BLOCKED", b), ("BIND_WAIT_S", "5")]);
    assert_eq!(r.code(), 0, "{}", r.stderr());
    assert!(r.calls.is_empty(), "partial: {}", r.calls);
    let r = run_working(&f, &["reset"], &[("BIND_WAIT_S", "5")]);
    assert_eq!(r.code(), 0, "{}", r.stderr());
    // 02:00.0 has no record now, so it goes to nvme like any controller on vfio-pci.
    assert!(r
        .stdout()
        .contains("0000:02:00.0: bound to nvme (was vfio-pci)"));
    assert!(r.calls.contains("modprobe -r vfio-pci"), "{}", r.calls);
    assert_eq!(state_file(&f), None);
}

#[test]
fn reset_refuses_before_acting_when_a_group_is_in_use_or_the_state_is_damaged() {
    need_bash!();
    let f = fresh_tree();
    let b = "0000:02:00.0";
    f.nvme(b).bind(b, "vfio-pci").group(b, 10).dev_vfio("10");
    kernel_bind(&f.sys(), "0000:01:00.0", "vfio-pci");
    let fd = f.proc().join("77/fd");
    fs::create_dir_all(&fd).unwrap();
    std::os::unix::fs::symlink(f.dev().join("vfio/10"), fd.join("3")).unwrap();
    let before = snapshot(&f);
    let r = run_working(&f, &["reset"], &[]);
    assert_eq!(r.code(), 1);
    assert!(
        r.stderr().contains("0000:02:00.0 is in use through"),
        "{}",
        r.stderr()
    );
    assert!(r.stderr().contains("nothing was changed"), "{}", r.stderr());
    assert_eq!(snapshot(&f), before, "01:00.0 was not reset either");
    fs::remove_dir_all(f.proc().join("77")).unwrap();

    fs::create_dir_all(state_dir(&f)).unwrap();
    fs::write(
        state_dir(&f).join("setup.state"),
        "driver 0000:01:00.0 nvme\nhugepages 2048 -3\n",
    )
    .unwrap();
    let before = snapshot(&f);
    let r = run_working(&f, &["reset"], &[]);
    assert_eq!(r.code(), 1);
    assert!(
        r.stderr()
            .contains("setup.state line 2 is not a record of this script: 'hugepages 2048 -3'"),
        "{}",
        r.stderr()
    );
    assert_eq!(snapshot(&f), before);
}

#[test]
fn target_user_gets_the_group_node_a_hugetlbfs_group_and_memlock_advice() {
    need_bash!();
    let f = fresh_tree();
    let me = |flag: &str| {
        let o = Command::new("id").arg(flag).output().unwrap();
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    // As root, hand the device to `nobody`; otherwise to oneself (a chown to one's own
    // uid and gid is allowed), which still checks the whole path.
    let nobody = Command::new("id").args(["-u", "nobody"]).output().ok();
    let user = if me("-u") == "0" && nobody.is_some_and(|o| o.status.success()) {
        "nobody".to_string()
    } else {
        me("-un")
    };
    let id = |flag: &str| {
        let o = Command::new("id").args([flag, &user]).output().unwrap();
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse::<u32>()
            .unwrap()
    };
    let (uid, gid) = (id("-u"), id("-g"));
    let _k = FakeKernel::start(&f);
    let r = run_working(
        &f,
        &["config"],
        &[
            ("TARGET_USER", &user),
            ("HUGEMEM", "64"),
            ("BIND_WAIT_S", "5"),
        ],
    );
    assert_eq!(r.code(), 0, "{}{}", r.stdout(), r.stderr());
    let node = f.dev().join("vfio/9");
    let md = fs::metadata(&node).unwrap();
    assert_eq!((md.uid(), md.gid()), (uid, gid));
    assert!(
        r.stdout().contains(&format!(
            "0000:01:00.0: {} now belongs to {user} (uid {uid}, gid {gid})",
            node.display()
        )),
        "{}",
        r.stdout()
    );
    assert!(
        r.calls.contains(&format!(
            "mount -t hugetlbfs -o pagesize=2048K,gid={gid},mode=1770 nodev"
        )),
        "{}",
        r.calls
    );
    let out = r.stdout();
    assert!(
        out.contains(&format!("a line '{user} - memlock 65536'")),
        "{out}"
    );
    assert!(out.contains("LimitMEMLOCK=67108864"), "{out}");
    assert!(out.contains("kestrel doctor"), "{out}");
}

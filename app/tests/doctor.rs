//! `kestrel doctor` over fake sysfs/procfs/dev trees (the same builder the setup.sh tests
//! use), and on this machine.

mod common;
#[path = "../../driver/tests/support/fakesys.rs"]
mod fakesys;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::process::Output;

use common::{assert_fails_with, kestrel_cmd, stderr, stdout, stdout_json};
use fakesys::FakeSys;
use serde_json::Value;

const A: &str = "0000:01:00.0";

/// Runs `kestrel doctor --root <fake tree> args`.
fn doctor(f: &FakeSys, args: &[&str]) -> Output {
    kestrel_cmd()
        .arg("doctor")
        .arg("--root")
        .arg(f.dir.path())
        .args(args)
        .env_remove("KESTREL_SYSROOT")
        .output()
        .expect("run kestrel doctor")
}

fn report(f: &FakeSys) -> (Value, i32) {
    let o = doctor(f, &["--json"]);
    (stdout_json(&o), o.status.code().unwrap_or(-1))
}

/// The checks with `id` (and, for controllers, `bdf`).
fn checks<'a>(v: &'a Value, id: &str) -> Vec<&'a Value> {
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["id"] == id)
        .collect()
}

fn one<'a>(v: &'a Value, id: &str) -> &'a Value {
    let c = checks(v, id);
    assert_eq!(c.len(), 1, "{id}: {c:?}");
    c[0]
}

fn status(v: &Value, id: &str) -> String {
    one(v, id)["status"].as_str().unwrap().to_string()
}

/// The ids of every check marked `fail`.
fn fails(v: &Value) -> Vec<String> {
    v["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["status"] == "fail")
        .map(|c| match c["bdf"].as_str() {
            Some(b) => format!("{}:{b}", c["id"].as_str().unwrap()),
            None => c["id"].as_str().unwrap().to_string(),
        })
        .collect()
}

fn chmod(p: impl AsRef<std::path::Path>, mode: u32) {
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

/// `proc/self/status` and `proc/self/limits` of a process of `uid` with capability set
/// `cap_eff` and a memlock limit (`None`: unlimited).
fn process(f: &FakeSys, uid: u32, cap_eff: u64, memlock: Option<u64>) {
    fs::create_dir_all(f.proc().join("self")).unwrap();
    fs::write(
        f.proc().join("self/status"),
        format!(
            "Name:\tkestrel\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nGid:\t{uid}\t{uid}\t{uid}\t{uid}\nGroups:\t{uid} \nCapEff:\t{cap_eff:016x}\n"
        ),
    )
    .unwrap();
    let l = memlock.map_or_else(|| "unlimited".to_string(), |b| b.to_string());
    fs::write(
        f.proc().join("self/limits"),
        format!(
            "Limit                     Soft Limit           Hard Limit           Units     \nMax open files            1024                 524288               files     \nMax locked memory         {l:<20} {l:<20} bytes     \n"
        ),
    )
    .unwrap();
}

/// A machine ready for `kestrel perf --target pci:0000:01:00.0`: Intel IOMMU on, the vfio
/// modules, the controller alone in group 3 on vfio-pci, its node and the container open
/// to everyone (mode 0666), 512 free 2 MiB pages on its NUMA node, run by root with every
/// capability, four CPUs of which two isolated, an invariant TSC.
fn ready_tree() -> FakeSys {
    let f = FakeSys::new();
    f.write("class/iommu/dmar0/uevent", "");
    f.write("module/vfio/parameters/enable_unsafe_noiommu_mode", "N\n");
    f.write("module/vfio_iommu_type1/uevent", "");
    f.nvme(A).bind(A, "vfio-pci").group(A, 3).numa(A, 0);
    f.dev_vfio("3").dev_vfio("vfio");
    chmod(f.dev().join("vfio/3"), 0o666);
    chmod(f.dev().join("vfio/vfio"), 0o666);
    f.hugepages(Some(0), 2048, 512, 512)
        .hugepages(Some(0), 1048576, 0, 0);
    f.write("devices/system/cpu/online", "0-3\n");
    f.write("devices/system/cpu/isolated", "2-3\n");
    f.write("devices/system/cpu/nohz_full", "2-3\n");
    fs::write(
        f.proc().join("cmdline"),
        "BOOT_IMAGE=/vmlinuz root=/dev/sda1 intel_iommu=on isolcpus=2-3 nohz_full=2-3\n",
    )
    .unwrap();
    fs::create_dir_all(f.proc().join("sys/kernel")).unwrap();
    fs::write(f.proc().join("sys/kernel/osrelease"), "6.1.0-test\n").unwrap();
    let cpu = "processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: fpu tsc constant_tsc nonstop_tsc\n\n";
    fs::write(f.proc().join("cpuinfo"), cpu.repeat(4)).unwrap();
    process(&f, 0, 0x1ff_ffff_ffff, Some(8 << 20));
    fs::create_dir_all(f.dir.path().join("etc")).unwrap();
    fs::write(
        f.dir.path().join("etc/passwd"),
        "root:x:0:0:root:/root:/bin/bash\nalice:x:1000:1000::/home/alice:/bin/bash\n",
    )
    .unwrap();
    f
}

#[test]
fn ready() {
    let f = ready_tree();
    let (v, code) = report(&f);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(v["ready"], true);
    assert_eq!(v["exit_status"], 0);
    assert_eq!(v["ready_controllers"], serde_json::json!([A]));
    assert_eq!(v["perf_command"], "kestrel perf --target pci:0000:01:00.0");
    assert!(fails(&v).is_empty(), "{:?}", fails(&v));
    check_ready_report(&v);
    // The text form: a ✓ line per check, the verdict last; no error on stderr.
    let o = doctor(&f, &[]);
    assert_eq!(o.status.code(), Some(0));
    let t = stdout(&o);
    assert!(t.contains("✓ iommu: on (dmar0"), "{t}");
    assert!(
        t.contains("✓ controller 0000:01:00.0: ready: on vfio-pci"),
        "{t}"
    );
    assert!(
        t.contains("✓ perf: ready: kestrel perf --target pci:0000:01:00.0"),
        "{t}"
    );
    assert!(
        t.ends_with("ready for an NVMe device (0 ✗, 0 ⚠); exit status 0\n"),
        "{t}"
    );
    assert!(o.stderr.is_empty(), "{}", stderr(&o));
    // The same through the environment variable.
    let o = kestrel_cmd()
        .args(["doctor", "--json"])
        .env("KESTREL_SYSROOT", f.dir.path())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
    let w = stdout_json(&o);
    assert_eq!(w["perf_command"], v["perf_command"]);
}

/// Every check of a ready machine's JSON report: ok or info, each present, and what
/// the fake tree holds in their summaries and details.
fn check_ready_report(v: &Value) {
    for c in v["checks"].as_array().unwrap() {
        assert!(
            c["status"] == "ok" || c["status"] == "info",
            "nothing to warn about: {c:#}"
        );
    }
    for id in [
        "kernel",
        "iommu",
        "vfio",
        "vfio_pci",
        "vfio_iommu_type1",
        "noiommu",
        "vfio_container",
        "controller",
        "hugepages",
        "hugetlbfs",
        "memlock",
        "user",
        "cpus",
        "tsc",
        "perf",
    ] {
        assert!(!checks(v, id).is_empty(), "no {id} check: {v:#}");
    }
    assert!(one(v, "iommu")["summary"]
        .as_str()
        .unwrap()
        .starts_with("on (dmar0; IOMMU groups: 1)"));
    let ctrl = one(v, "controller");
    assert_eq!(ctrl["bdf"], A);
    assert!(ctrl["details"][1] == "alone in its IOMMU group", "{ctrl:#}");
    assert!(one(v, "hugepages")["details"]
        .as_array()
        .unwrap()
        .contains(&Value::from("node0 2048 kB: 512 free of 512")));
    assert!(one(v, "cpus")["summary"]
        .as_str()
        .unwrap()
        .starts_with("4 online; isolated: 2,3 (isolcpus=2-3)"));
    assert!(one(v, "memlock")["summary"]
        .as_str()
        .unwrap()
        .contains("CAP_IPC_LOCK"));
    let node = one(v, "vfio_container")["details"][0]
        .as_str()
        .unwrap()
        .to_string();
    assert!(node.starts_with("/dev/vfio/3: owner "), "{node}");
    assert!(node.ends_with(", mode 666, opens for this user"), "{node}");
}

#[test]
fn no_hugepages() {
    let f = ready_tree();
    f.hugepages(Some(0), 2048, 0, 0);
    let (v, code) = report(&f);
    assert_eq!(code, 1);
    assert_eq!(v["ready"], false);
    assert_eq!(fails(&v), ["hugepages", "perf"]);
    let h = one(&v, "hugepages");
    assert!(
        h["summary"]
            .as_str()
            .unwrap()
            .starts_with("no 2 MiB hugepages: kestrel perf on a device needs at least 8 free"),
        "{h:#}"
    );
    assert_eq!(
        h["fix"],
        "sudo HUGEMEM=2048 scripts/setup.sh config (or: echo 1024 | sudo tee /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages)"
    );
    assert_eq!(
        status(&v, "controller"),
        "ok",
        "the controller itself is fine"
    );
    assert!(one(&v, "perf")["summary"]
        .as_str()
        .unwrap()
        .ends_with("still needs: hugepages"));
    // Some, but too few free.
    f.hugepages(Some(0), 2048, 3, 600);
    let (v, code) = report(&f);
    assert_eq!(code, 1);
    assert!(one(&v, "hugepages")["summary"]
        .as_str()
        .unwrap()
        .starts_with("3 of 600 2 MiB hugepages free"));
    assert!(one(&v, "hugepages")["fix"]
        .as_str()
        .unwrap()
        .contains("echo 1024 |"));
    // On another NUMA node than the controller: works, with a warning.
    f.hugepages(Some(0), 2048, 0, 0)
        .hugepages(Some(1), 2048, 512, 512);
    let (v, code) = report(&f);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(status(&v, "hugepages"), "warn");
    assert!(one(&v, "hugepages")["details"]
        .as_array()
        .unwrap()
        .iter()
        .any(|d| d
            .as_str()
            .unwrap()
            .contains("its DMA memory will be remote")));
}

#[test]
fn iommu_group_shared_with_a_nic() {
    let f = ready_tree();
    f.pci("0000:01:00.1", 0x020000, 0x8086, 0x10d3)
        .bind("0000:01:00.1", "e1000e")
        .group("0000:01:00.1", 3);
    // A bridge in the group is tolerated.
    f.pci("0000:00:1c.0", 0x060400, 0x8086, 0x1234)
        .bind("0000:00:1c.0", "pcieport")
        .group("0000:00:1c.0", 3);
    let (v, code) = report(&f);
    assert_eq!(code, 1);
    assert_eq!(fails(&v), [format!("controller:{A}"), "perf".into()]);
    let c = one(&v, "controller");
    assert_eq!(
        c["summary"],
        "IOMMU group 3 is not viable: it also holds 0000:01:00.1 (e1000e, network controller), on a host driver; VFIO hands out whole groups"
    );
    assert_eq!(
        c["details"][1],
        "shares its IOMMU group with: 0000:00:1c.0 (driver pcieport), bridge; 0000:01:00.1 (driver e1000e), network controller"
    );
    let fix = c["fix"].as_str().unwrap();
    assert!(
        fix.contains(
            "echo 0000:01:00.1 | sudo tee /sys/bus/pci/devices/0000:01:00.1/driver/unbind"
        ),
        "{fix}"
    );
    assert!(!fix.contains("0000:00:1c.0"), "the bridge stays: {fix}");
    assert!(fix.contains("its own IOMMU group"), "{fix}");
    // --target of another, unknown controller: still not ready, and says so.
    let o = doctor(&f, &["--target", "pci:0000:05:00.0"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stdout(&o).contains("✗ controller 0000:05:00.0: no NVMe controller at 0000:05:00.0"));
}

#[test]
fn device_has_a_mounted_filesystem() {
    let f = ready_tree();
    // The only controller is the system disk, on nvme.
    let b = "0000:02:00.0";
    fs::remove_file(f.sys().join("bus/pci/devices").join(A)).unwrap();
    f.nvme(b)
        .bind(b, "nvme")
        .group(b, 4)
        .namespace(b, "nvme0", "nvme0n1", "259:0")
        .partition(b, "nvme0", "nvme0n1", "nvme0n1p1")
        .partition(b, "nvme0", "nvme0n1", "nvme0n1p2")
        .devno(b, "nvme0/nvme0n1/nvme0n1p2", "259:2")
        .mount("/dev/nvme0n1p1", "/boot")
        .mount_devno("259:2", "/dev/root", "/");
    let (v, code) = report(&f);
    assert_eq!(code, 1, "{v:#}");
    assert_eq!(v["ready"], false);
    let c = one(&v, "controller");
    assert_eq!(c["bdf"], b);
    assert_eq!(c["status"], "warn", "not a problem to fix: a disk in use");
    assert_eq!(
        c["summary"],
        "holds the root filesystem: nvme0n1p1 mounted on /boot, nvme0n1p2 mounted on /; Kestrel must not take it"
    );
    assert!(c["fix"]
        .as_str()
        .unwrap()
        .contains("use another controller"));
    assert_eq!(fails(&v), ["perf"]);
    assert!(one(&v, "perf")["summary"]
        .as_str()
        .unwrap()
        .ends_with("still needs: a controller Kestrel may take (see the controller lines)"));
    // A second, free controller on nvme: the fix is to bind that one.
    f.nvme("0000:03:00.0")
        .bind("0000:03:00.0", "nvme")
        .group("0000:03:00.0", 5);
    let (v, code) = report(&f);
    assert_eq!(code, 1);
    let c = checks(&v, "controller");
    assert_eq!(c[1]["summary"], "on nvme, not on vfio-pci");
    assert_eq!(
        c[1]["fix"],
        "sudo PCI_ALLOWED=0000:03:00.0 scripts/setup.sh config"
    );
}

#[test]
fn non_root_without_memlock() {
    let f = ready_tree();
    // alice, no capabilities, the usual 64 KiB limit.
    process(&f, 1000, 0, Some(65536));
    let (v, code) = report(&f);
    assert_eq!(code, 1, "{v:#}");
    assert_eq!(fails(&v), ["memlock", "perf"]);
    let m = one(&v, "memlock");
    assert_eq!(
        m["summary"],
        "RLIMIT_MEMLOCK 64.0 KiB (hard 64.0 KiB): kestrel perf locks and pins about 16.0 MiB of DMA memory on a device, more than the limit"
    );
    assert_eq!(
        m["fix"],
        "as root, a line 'alice - memlock 16384' (or unlimited) in /etc/security/limits.conf and log in again; or LimitMEMLOCK=16777216 in the service's systemd unit; or run as root"
    );
    assert!(one(&v, "user")["summary"]
        .as_str()
        .unwrap()
        .starts_with("alice (uid 1000, gid 1000), not root"));
    // A hard limit that allows it: ulimit is enough.
    fs::write(
        f.proc().join("self/limits"),
        "Max locked memory         65536                unlimited            bytes\n",
    )
    .unwrap();
    let (v, _) = report(&f);
    assert_eq!(
        one(&v, "memlock")["fix"],
        "raise the soft limit in this shell: ulimit -l 16384 (the hard limit allows it)"
    );
    // Enough memlock, but the group node is root's: TARGET_USER is the fix.
    process(&f, 1000, 0, None);
    chmod(f.dev().join("vfio/3"), 0o600);
    let (v, code) = report(&f);
    assert_eq!(code, 1);
    assert_eq!(fails(&v), [format!("controller:{A}"), "perf".into()]);
    let c = one(&v, "controller");
    assert!(c["summary"]
        .as_str()
        .unwrap()
        .contains("cannot be opened by uid 1000"));
    assert!(one(&v, "vfio_container")["details"][0]
        .as_str()
        .unwrap()
        .ends_with(", mode 600, does not open for this user"));
    assert!(c["fix"]
        .as_str()
        .unwrap()
        .starts_with("sudo TARGET_USER=alice PCI_ALLOWED=0000:01:00.0 scripts/setup.sh config"));
    // Given the node, alice is ready without root.
    chmod(f.dev().join("vfio/3"), 0o666);
    let (v, code) = report(&f);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(status(&v, "memlock"), "ok");
}

#[test]
fn no_iommu_and_noiommu_mode() {
    let f = ready_tree();
    fs::remove_dir_all(f.sys().join("class/iommu")).unwrap();
    fs::remove_dir_all(f.sys().join("module/vfio_iommu_type1")).unwrap();
    fs::write(f.proc().join("cmdline"), "root=/dev/sda1 intel_iommu=off\n").unwrap();
    let (v, code) = report(&f);
    assert_eq!(code, 1);
    let i = one(&v, "iommu");
    assert_eq!(i["status"], "fail");
    assert_eq!(
        i["details"][0],
        "the kernel command line turns it off: intel_iommu=off"
    );
    assert!(i["fix"]
        .as_str()
        .unwrap()
        .contains("add intel_iommu=on to GRUB_CMDLINE_LINUX"));
    assert_eq!(status(&v, "vfio_iommu_type1"), "info");
    // vfio in noiommu mode, group noiommu-3, root: ready, with warnings and --noiommu.
    f.write("module/vfio/parameters/enable_unsafe_noiommu_mode", "Y\n");
    fs::rename(f.dev().join("vfio/3"), f.dev().join("vfio/noiommu-3")).unwrap();
    let (v, code) = report(&f);
    assert_eq!(code, 0, "{v:#}");
    assert_eq!(status(&v, "iommu"), "warn");
    assert_eq!(status(&v, "noiommu"), "warn");
    assert_eq!(
        v["perf_command"],
        "sudo kestrel perf --target pci:0000:01:00.0 --noiommu"
    );
    // Not root: a noiommu group cannot be opened.
    process(&f, 1000, 0, None);
    let (v, code) = report(&f);
    assert_eq!(code, 1);
    assert!(one(&v, "controller")["summary"]
        .as_str()
        .unwrap()
        .contains("needs CAP_SYS_RAWIO and CAP_SYS_ADMIN"));
}

#[test]
fn usage_errors_exit_2() {
    let f = ready_tree();
    let o = doctor(&f, &["--target", "nope"]);
    assert_fails_with(&o, 2, "--target: invalid pci address `nope`");
    let o = kestrel_cmd()
        .args(["doctor", "--root", "/nonexistent/kestrel-root"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let o = kestrel_cmd()
        .args(["doctor", "--frobnicate"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
}

/// Every `✗` and `⚠` line of a text report is followed (after its details) by a `fix:`.
fn assert_every_problem_has_a_fix(t: &str) {
    let lines: Vec<&str> = t.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        if l.starts_with('✗') || l.starts_with('⚠') {
            let fix = lines[i + 1..]
                .iter()
                .take_while(|x| x.starts_with("    "))
                .any(|x| x.starts_with("    fix: "));
            assert!(fix, "no fix for: {l}\n{t}");
        }
    }
}

#[test]
fn every_problem_in_the_fake_trees_has_a_fix() {
    let f = ready_tree();
    process(&f, 1000, 0, Some(65536));
    f.hugepages(Some(0), 2048, 0, 0);
    f.write("devices/system/cpu/isolated", "\n");
    fs::write(
        f.proc().join("cpuinfo"),
        "processor\t: 0\nflags\t\t: fpu tsc\n",
    )
    .unwrap();
    let t = stdout(&doctor(&f, &[]));
    assert!(t.contains("⚠ cpus:"), "{t}");
    assert!(
        t.contains("⚠ tsc: not invariant (no constant_tsc, nonstop_tsc)"),
        "{t}"
    );
    assert_every_problem_has_a_fix(&t);
}

#[test]
fn on_this_machine() {
    // Whatever this machine has, doctor runs without root and prints every check; a
    // machine without IOMMU or NVMe (CI) is not ready and gets a fix for each problem.
    let o = kestrel_cmd()
        .arg("doctor")
        .env_remove("KESTREL_SYSROOT")
        .output()
        .unwrap();
    let t = stdout(&o);
    for id in [
        "kernel:",
        "iommu:",
        "vfio:",
        "vfio-pci:",
        "vfio-iommu-type1:",
        "noiommu:",
        "vfio-container:",
        "controller",
        "hugepages:",
        "hugetlbfs:",
        "memlock:",
        "user:",
        "cpus:",
        "tsc:",
        "perf:",
    ] {
        assert!(t.contains(&format!(" {id}")), "no {id} line:\n{t}");
    }
    assert_every_problem_has_a_fix(&t);
    let j = kestrel_cmd()
        .args(["doctor", "--json"])
        .env_remove("KESTREL_SYSROOT")
        .output()
        .unwrap();
    let v = stdout_json(&j);
    let code = o.status.code().unwrap();
    assert_eq!(j.status.code().unwrap(), code);
    assert_eq!(v["exit_status"].as_i64().unwrap(), code as i64);
    if v["ready"] == false {
        assert_eq!(code, 1);
        assert!(t.contains("not ready for an NVMe device"));
        assert!(stderr(&o).contains("kestrel: error: not ready"));
    }
    let no_iommu = fs::read_dir("/sys/class/iommu").map_or(true, |mut d| d.next().is_none());
    if no_iommu {
        assert_eq!(code, 1);
        assert!(t.contains("✗ iommu: off"), "{t}");
    }
}

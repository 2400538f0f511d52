//! The harness: `setup.sh` run over a fake tree with stub `modprobe`, `mount` and
//! `umount`, what it left behind (snapshots, the state file, the library's table), and
//! the trees the tests start from.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use kestrel::hw::pci::{format_table, hugepage_status, list_nvme_controllers, SysRoots};

use crate::fakesys::FakeSys;

/// Returns from the test, saying why, when there is no bash to run the script with.
macro_rules! need_bash {
    () => {
        if !$crate::fixture::have_bash() {
            eprintln!("skipped: no bash on this machine");
            return;
        }
    };
}

pub fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/setup.sh")
}

pub fn have_bash() -> bool {
    Command::new("bash").arg("--version").output().is_ok()
}

pub fn write_exe(p: &Path, text: &str) {
    fs::write(p, text).unwrap();
    fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
}

/// Stub `modprobe`, `mount` and `umount` that record their arguments in `<dir>/calls`.
/// Failing ones change nothing; working ones act on the fake tree the script is given
/// (through SYSFS_ROOT and PROC_ROOT in their environment) as the real ones would.
pub fn stubs(working: bool) -> tempfile::TempDir {
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

pub struct Run {
    pub out: Output,
    /// What the stubs were asked to do, a line per call.
    pub calls: String,
}

impl Run {
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }
    pub fn code(&self) -> i32 {
        self.out.status.code().unwrap_or(-1)
    }
}

/// Runs the script over the fake tree with `env` on top of a clean setup environment,
/// with failing stubs.
pub fn run(f: &FakeSys, args: &[&str], env: &[(&str, &str)]) -> Run {
    run_full(f, args, env, &system_path(), "bash", false)
}

/// As [`run`] with working stubs.
pub fn run_working(f: &FakeSys, args: &[&str], env: &[(&str, &str)]) -> Run {
    run_full(f, args, env, &system_path(), "bash", true)
}

pub fn system_path() -> String {
    std::env::var("PATH").unwrap_or_default()
}

/// Where the script keeps its state file in these tests.
pub fn state_dir(f: &FakeSys) -> PathBuf {
    f.dir.path().join("run/kestrel")
}

pub fn state_file(f: &FakeSys) -> Option<String> {
    read(state_dir(f).join("setup.state"))
}

/// Runs the script with `path` after the stubs as PATH and `bash` as the shell, in an
/// environment holding nothing else, under a 60 s `timeout` when /usr/bin/timeout exists.
pub fn run_full(
    f: &FakeSys,
    args: &[&str],
    env: &[(&str, &str)],
    path: &str,
    bash: &str,
    working: bool,
) -> Run {
    let st = stubs(working);
    let path = format!("{}:{path}", st.path().display());
    // Bounded: a script that hangs (a wait that never ends) fails its test with status
    // 124 after a minute instead of holding the test run.
    let timeout = Path::new("/usr/bin/timeout");
    let mut c = if timeout.exists() {
        let mut c = Command::new(timeout);
        c.args(["60", bash]);
        c
    } else {
        Command::new(bash)
    };
    c.arg(script()).args(args);
    script_env(&mut c, f, &path);
    for (k, v) in env {
        c.env(k, v);
    }
    let out = c.output().expect("run bash scripts/setup.sh");
    let calls = fs::read_to_string(st.path().join("calls")).unwrap_or_default();
    Run { out, calls }
}

/// Clears `c`'s environment and gives it what every run of the script here has: the
/// fake tree's roots, the state directory in it, no wait for binding, `path` as PATH.
pub fn script_env<'c>(c: &'c mut Command, f: &FakeSys, path: &str) -> &'c mut Command {
    c.env_clear()
        .env("SYSFS_ROOT", f.sys())
        .env("PROC_ROOT", f.proc())
        .env("DEV_ROOT", f.dev())
        .env("STATE_DIR", state_dir(f))
        .env("BIND_WAIT_S", "0")
        .env("PATH", path)
}

/// Every directory, file (with its content) and link (with its target) below the fake
/// sys/, proc/ and dev/, for "nothing was changed" checks.
pub fn snapshot(f: &FakeSys) -> BTreeMap<PathBuf, String> {
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

pub fn table(f: &FakeSys) -> String {
    let roots = SysRoots::new(f.sys(), f.proc());
    format_table(
        &list_nvme_controllers(&roots).unwrap(),
        &hugepage_status(&f.sys()).unwrap(),
    )
}

/// A tree on which `config` needs no module loading or mounting: vfio-pci and type1
/// present, a 2 MiB hugepage pool, hugetlbfs mounted.
pub fn config_tree() -> FakeSys {
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

pub fn read(p: impl AsRef<Path>) -> Option<String> {
    fs::read_to_string(p).ok()
}

pub fn dev_dir(f: &FakeSys, bdf: &str) -> PathBuf {
    f.sys().join("devices/pci0000:00").join(bdf)
}

/// A tree with one NVMe controller on nvme (group 1, a namespace, nothing mounted), a
/// network card, 4 GB of memory, and what config needs already there.
pub fn validation_tree() -> FakeSys {
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

/// One NVMe controller on nvme in group 9, a 2 MiB pool of 16 pages, no hugetlbfs
/// mount, no vfio module: what config finds on a fresh machine.
pub fn fresh_tree() -> FakeSys {
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
pub fn without_overrides(s: BTreeMap<PathBuf, String>) -> BTreeMap<PathBuf, String> {
    s.into_iter()
        .filter(|(p, _)| !p.ends_with("driver_override"))
        .collect()
}

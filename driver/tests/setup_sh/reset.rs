//! `reset`: refusals while a group is in use or the state is damaged, and giving back
//! what `config` found.

use std::fs;

use crate::fake_kernel::FakeKernel;
use crate::fakesys::kernel_bind;
use crate::fixture::{
    config_tree, dev_dir, fresh_tree, read, run, run_working, snapshot, state_dir, state_file,
    without_overrides,
};

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

use super::machine::{cmdline_param, cpu_list};

#[test]
fn cpu_lists() {
    assert_eq!(cpu_list("0-3,8,10-11\n"), [0, 1, 2, 3, 8, 10, 11]);
    assert_eq!(cpu_list(""), Vec::<u32>::new());
    assert_eq!(cpu_list("2-7:2/8"), [2, 3, 4, 5, 6, 7]);
    assert_eq!(cpu_list("junk,5"), [5]);
    assert_eq!(cpu_list("9-2"), Vec::<u32>::new());
}

#[test]
fn cmdline_params() {
    let c = "BOOT_IMAGE=/vmlinuz root=/dev/sda1 intel_iommu=on isolcpus=2-3 intel_iommu=off";
    assert_eq!(
        cmdline_param(c, "intel_iommu"),
        Some("off"),
        "the last one wins"
    );
    assert_eq!(cmdline_param(c, "isolcpus"), Some("2-3"));
    assert_eq!(cmdline_param(c, "nohz_full"), None);
}

//! The VFIO transport's errors, each saying what to do, and the text helpers their
//! messages use.

use super::*;

fn driver_text(d: &Option<String>) -> &str {
    d.as_deref().unwrap_or("no driver")
}

fn members_text(others: &[GroupMember]) -> String {
    if others.is_empty() {
        return "the kernel reports the group unviable".into();
    }
    let list: Vec<String> = others.iter().map(|m| m.to_string()).collect();
    format!("it also holds {}", list.join(", "))
}

fn others_bdfs(others: &[GroupMember]) -> String {
    others
        .iter()
        .map(|m| m.bdf.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Errors of the VFIO transport. Each says what to do.
#[derive(Debug, thiserror::Error)]
pub enum VfioError {
    /// Reading sysfs failed, or the PCI address does not parse.
    #[error(transparent)]
    Pci(#[from] PciError),
    /// No PCI device at that address.
    #[error("no pci device {bdf}: {path} does not exist; nvme controllers on this machine: {present} (`scripts/setup.sh status` shows them)")]
    NoSuchDevice {
        /// The address asked for.
        bdf: Bdf,
        /// The sysfs directory looked for.
        path: PathBuf,
        /// The NVMe controllers that exist, or "none".
        present: String,
    },
    /// The device is not an NVMe controller.
    #[error("{bdf} is not an nvme controller: its pci class is {class:#08x}, nvme is 0x010802")]
    NotNvme {
        /// The device.
        bdf: Bdf,
        /// Its class code.
        class: u32,
    },
    /// The device is bound to another driver, or none.
    #[error("{bdf} is bound to {}, not vfio-pci; bind it with `PCI_ALLOWED={bdf} scripts/setup.sh config` (as root)", driver_text(.driver))]
    NotBoundToVfio {
        /// The device.
        bdf: Bdf,
        /// The driver it is bound to.
        driver: Option<String>,
    },
    /// No IOMMU group: the IOMMU is off.
    #[error("{bdf} has no iommu group ({path} is missing): the iommu is off or absent. boot with intel_iommu=on (intel) or amd_iommu=on (amd) and enable vt-d/amd-vi in the firmware; or, knowing that the device can then read and write all memory, use noiommu mode (`NOIOMMU=1 PCI_ALLOWED={bdf} scripts/setup.sh config`, then open with noiommu)")]
    NoIommuGroup {
        /// The device.
        bdf: Bdf,
        /// The `iommu_group` link looked for.
        path: PathBuf,
    },
    /// Another device in the group is bound to a host driver.
    #[error("iommu group {group} of {bdf} is not viable: {}; every device in the group must be bound to vfio-pci or to no driver: bind them too with `PCI_ALLOWED=\"{bdf} {}\" scripts/setup.sh config`, or move the controller to a slot with its own group", members_text(.others), others_bdfs(.others))]
    GroupNotViable {
        /// The device.
        bdf: Bdf,
        /// Its group.
        group: u32,
        /// The members that stop it.
        others: Vec<GroupMember>,
    },
    /// `/dev/vfio/vfio` is missing.
    #[error("{path} does not exist: the vfio modules are not loaded; run `modprobe vfio-pci` (or `scripts/setup.sh config`)")]
    VfioNotLoaded {
        /// The container node looked for.
        path: PathBuf,
    },
    /// The group node is missing although the device is bound to vfio-pci.
    #[error("{path} (iommu group {group} of {bdf}) does not exist although the device is bound to vfio-pci; is devtmpfs mounted at {dev_root}?")]
    GroupNodeMissing {
        /// The device.
        bdf: Bdf,
        /// Its group.
        group: u32,
        /// The node looked for.
        path: PathBuf,
        /// The device root.
        dev_root: PathBuf,
    },
    /// The group is a noiommu group but noiommu was not asked for.
    #[error("{bdf} is in a noiommu group ({path}): vfio runs in unsafe noiommu mode because there is no iommu; open it with noiommu to accept that its dma is unconfined, or enable the iommu (intel_iommu=on / amd_iommu=on) and rebind")]
    GroupIsNoiommu {
        /// The device.
        bdf: Bdf,
        /// The noiommu node found.
        path: PathBuf,
    },
    /// noiommu was asked for but the group is a real IOMMU group.
    #[error("noiommu mode was asked for, but {bdf} is in a real iommu group ({path}); open it without noiommu")]
    GroupHasIommu {
        /// The device.
        bdf: Bdf,
        /// The IOMMU group node found.
        path: PathBuf,
    },
    /// The VFIO node cannot be opened by this user.
    #[error("permission denied opening {path} (for {bdf}) as {user}: it is owned by {owner} with mode {mode:o}; give it to your user with `TARGET_USER={user} PCI_ALLOWED={bdf} scripts/setup.sh config` (as root), or run as root")]
    PermissionDenied {
        /// The device.
        bdf: Bdf,
        /// The node.
        path: PathBuf,
        /// Who we are.
        user: String,
        /// Its owner, as `uid N`.
        owner: String,
        /// Its permission bits.
        mode: u32,
    },
    /// Opening a noiommu group needs CAP_SYS_RAWIO.
    #[error(
        "{path} (for {bdf}) can be opened only with CAP_SYS_RAWIO in noiommu mode: run as root"
    )]
    NoiommuNeedsRawio {
        /// The device.
        bdf: Bdf,
        /// The node.
        path: PathBuf,
    },
    /// The group is open already (vfio allows one opener at a time), in another process
    /// or in this one.
    #[error("{path} (for {bdf}) is already open (vfio allows one opener at a time): {holders}")]
    GroupBusy {
        /// The device.
        bdf: Bdf,
        /// The node.
        path: PathBuf,
        /// Who has it open (pid and command, or this process), or why nobody could be
        /// named.
        holders: String,
    },
    /// Opening a VFIO node hit the open-file limit (EMFILE, ENFILE).
    #[error("cannot open {path} (for {bdf}): {why}")]
    TooManyOpenFiles {
        /// The device.
        bdf: Bdf,
        /// The node.
        path: PathBuf,
        /// Which limit, its value and how to raise it.
        why: String,
    },
    /// Another error opening a VFIO node.
    #[error("cannot open {path} (for {bdf}): {source}")]
    Open {
        /// The device.
        bdf: Bdf,
        /// The node.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// A VFIO ioctl failed.
    #[error("{op} on {path} for {bdf} failed: {source}{}", ioctl_hint(.source))]
    Ioctl {
        /// The device.
        bdf: Bdf,
        /// The ioctl.
        op: &'static str,
        /// The node it was made on.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// An unknown VFIO API version.
    #[error("{path} speaks vfio api version {got}; this driver knows version 0")]
    ApiVersion {
        /// The container node.
        path: PathBuf,
        /// What it said.
        got: i32,
    },
    /// The type1 IOMMU driver is not loaded.
    #[error("the kernel's vfio offers no type1v2 iommu (needed for {bdf}): load it with `modprobe vfio_iommu_type1`")]
    NoType1 {
        /// The device.
        bdf: Bdf,
    },
    /// The kernel's vfio cannot do noiommu mode.
    #[error("the kernel's vfio offers no noiommu mode (needed for {bdf}): load vfio with `modprobe vfio enable_unsafe_noiommu_mode=1` (or `NOIOMMU=1 scripts/setup.sh config`); a kernel built without CONFIG_VFIO_NOIOMMU cannot do it")]
    NoiommuUnsupported {
        /// The device.
        bdf: Bdf,
    },
    /// noiommu mode needs hugepages.
    #[error("noiommu mode for {bdf} needs hugepage dma memory (a small page's physical address can change); use page kind Huge2M or Huge1G")]
    NoiommuNeedsHugepages {
        /// The device.
        bdf: Bdf,
    },
    /// The VFIO device is not a PCI device with the usual regions.
    #[error("{bdf} is not a vfio pci device (device flags {flags:#x}, {regions} regions)")]
    NotPciDevice {
        /// The device.
        bdf: Bdf,
        /// `vfio_device_info.flags`.
        flags: u32,
        /// `vfio_device_info.num_regions`.
        regions: u32,
    },
    /// BAR0 is too small for the NVMe registers.
    #[error("bar0 of {bdf} is {size} bytes, smaller than the {need} bytes the nvme registers and admin doorbells need; is it really an nvme controller?")]
    Bar0TooSmall {
        /// The device.
        bdf: Bdf,
        /// BAR0 size.
        size: u64,
        /// Bytes needed.
        need: usize,
    },
    /// BAR0 cannot be mmapped.
    #[error("bar0 of {bdf} cannot be mmapped (region flags {flags:#x}; read, write and mmap are needed): vfio-pci does not allow mapping it on this kernel, see dmesg")]
    Bar0NotMappable {
        /// The device.
        bdf: Bdf,
        /// `vfio_region_info.flags`.
        flags: u32,
    },
    /// mmap of BAR0 failed.
    #[error("mmap of bar0 of {bdf} ({size} bytes at device offset {offset:#x}) failed: {source}")]
    Bar0Mmap {
        /// The device.
        bdf: Bdf,
        /// Bytes.
        size: u64,
        /// Region offset in the device fd.
        offset: u64,
        /// The OS error.
        source: io::Error,
    },
    /// Config space access failed.
    #[error("pci config space access of {bdf} at offset {offset:#x} failed: {source}")]
    Config {
        /// The device.
        bdf: Bdf,
        /// Config space offset.
        offset: u64,
        /// The OS error.
        source: io::Error,
    },
    /// The command register did not take the enable bits.
    #[error("{bdf} did not take memory space and bus master enable: wrote pci command {wrote:#06x}, read back {read:#06x}")]
    CommandRegister {
        /// The device.
        bdf: Bdf,
        /// Value written.
        wrote: u16,
        /// Value read back.
        read: u16,
    },
}

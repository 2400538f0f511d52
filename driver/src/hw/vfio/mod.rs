//! The VFIO transport: an NVMe controller bound to `vfio-pci`, its BAR0 mapped into the
//! process, DMA through the IOMMU (or, when asked for explicitly, without one).
//!
//! [`VfioTransport::open`] does, in order:
//! 1. parse the PCI address (`01:00.0` means `0000:01:00.0`);
//! 2. sysfs checks (below [`VfioOptions::sysfs_root`]): the device exists, is an NVMe
//!    controller, is bound to `vfio-pci`, has an IOMMU group, and every other device in
//!    the group is on vfio-pci or no driver (or is a bridge);
//! 3. open the group node (`/dev/vfio/N`, or `/dev/vfio/noiommu-N` in noiommu mode) and
//!    the container (`/dev/vfio/vfio`), below [`VfioOptions::dev_root`];
//! 4. `VFIO_GET_API_VERSION`, `VFIO_CHECK_EXTENSION` (type1v2, or noiommu),
//!    `VFIO_GROUP_GET_STATUS` (viable), `VFIO_GROUP_SET_CONTAINER`, `VFIO_SET_IOMMU`,
//!    `VFIO_IOMMU_GET_INFO` (page sizes, IOVA ranges);
//! 5. `VFIO_GROUP_GET_DEVICE_FD`, `VFIO_DEVICE_GET_INFO`, `VFIO_DEVICE_GET_REGION_INFO`
//!    for BAR0 and the config space; mmap BAR0;
//! 6. set Memory Space Enable and Bus Master Enable in the PCI command register
//!    (read-modify-write of config offset 4).
//!
//! # Interrupts
//! `VFIO_DEVICE_GET_IRQ_INFO` at open says how many MSI-X vectors the device has. The
//! first [`Transport::interrupt`] call enables vectors `0..n` at once (n = the device's
//! count, at most [`MAX_MSIX_VECTORS`]) with `VFIO_DEVICE_SET_IRQS` (eventfd trigger, one
//! new eventfd per vector): kernels before 6.5 cannot add vectors to an enabled MSI-X
//! table, so they are not enabled one by one. MSI-X works the same in noiommu mode
//! (vfio-pci programs the vectors; the IOMMU is not involved). Closing the device fd
//! disables them.
//!
//! [`Transport::steer_interrupt`] moves a vector's host IRQ (`vfio-msix[V](BDF)` in
//! `/proc/interrupts`, below [`VfioOptions::proc_root`]) to a CPU by writing its
//! `smp_affinity_list` ([`affinity`]): a queue pair asks for it when a thread first
//! sleeps on the vector, so the interrupt is taken on the sleeper's CPU.
//!
//! Every step that fails returns a [`VfioError`] saying what to do; what was opened so
//! far is closed in reverse order (device fd, then group, then container).
//!
//! # Teardown
//! The BAR mapping holds the device, the device holds the group, the group holds the
//! container, and the [`DmaMapper`] of the transport holds the group too. So DMA
//! pools (which hold the mapper) keep the IOMMU domain alive after the transport is
//! dropped, and their regions are unmapped only when the pools go, which the controller
//! layer does after disabling the controller. Dropping the device clears Bus Master
//! Enable before the fd is closed (the kernel then resets the function).
//!
//! # Why not the `vfio-ioctls` crate
//! It opens fixed paths (`/dev/vfio/vfio`, `/dev/vfio/N`), so the steps before the
//! ioctls could not be tested over a fake tree; it knows only the type1 IOMMU (no
//! noiommu groups or `VFIO_NOIOMMU_IOMMU`), does not report the IOMMU page sizes or IOVA
//! ranges, and its errors carry no errno for the messages below. The dozen ioctls are
//! in the private `sys` module, each with its safety argument.

pub mod affinity;
mod holders;
mod iova;
mod mapper;
mod sys;

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use vfio_bindings::bindings::vfio::vfio_region_info;
use vfio_bindings::bindings::vfio::{
    VFIO_TYPE1v2_IOMMU, VFIO_API_VERSION, VFIO_DEVICE_FLAGS_PCI, VFIO_GROUP_FLAGS_VIABLE,
    VFIO_NOIOMMU_IOMMU, VFIO_PCI_BAR0_REGION_INDEX, VFIO_PCI_CONFIG_REGION_INDEX,
    VFIO_REGION_INFO_FLAG_MMAP, VFIO_REGION_INFO_FLAG_READ, VFIO_REGION_INFO_FLAG_WRITE,
};

use crate::hw::dma::{DmaMapper, PageKind};
use crate::hw::mmio::{Bar, MIN_BAR_LEN};
use crate::hw::pci::{self, Bdf, GroupMember, PciError, SysRoots};
use crate::hw::transport::Transport;

mod error;

pub use error::VfioError;

/// Offset of the PCI command register in configuration space.
pub const PCI_COMMAND: u64 = 0x04;
/// Command register: Memory Space Enable.
pub const PCI_COMMAND_MEMORY: u16 = 1 << 1;
/// Command register: Bus Master Enable.
pub const PCI_COMMAND_MASTER: u16 = 1 << 2;

/// How to open a controller.
#[derive(Clone, Debug)]
pub struct VfioOptions {
    /// Use unsafe noiommu mode: no IOMMU, DMA to physical addresses, the device can
    /// reach all memory. Only when there is no IOMMU and you accept that.
    pub noiommu: bool,
    /// Pages DMA memory is made of; hugepages (2 MiB by default).
    pub page_kind: PageKind,
    /// The sysfs root (`/sys`).
    pub sysfs_root: PathBuf,
    /// The device root (`/dev`); the VFIO nodes are in `vfio/` below it.
    pub dev_root: PathBuf,
    /// The procfs root (`/proc`): `interrupts` and `irq/N/smp_affinity_list` below it
    /// steer the MSI-X vectors' host IRQs ([`Transport::steer_interrupt`]).
    pub proc_root: PathBuf,
}

impl Default for VfioOptions {
    fn default() -> Self {
        VfioOptions {
            noiommu: false,
            page_kind: PageKind::Huge2M,
            sysfs_root: PathBuf::from("/sys"),
            dev_root: PathBuf::from("/dev"),
            proc_root: PathBuf::from("/proc"),
        }
    }
}

/// Who this process runs as, for messages: `$USER`, else `uid N`.
fn user_text() -> String {
    match std::env::var("USER") {
        Ok(u) if !u.is_empty() => u,
        _ => format!("uid {}", sys::euid()),
    }
}

/// What to add to a failed ioctl's message: the ioctls that return a new fd
/// (`VFIO_GROUP_GET_DEVICE_FD`) can hit the open-file limit.
fn ioctl_hint(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ENOTTY) => " (not a vfio node?)".into(),
        errno => match crate::hw::limits::open_files_text(errno) {
            Some(t) => format!(" ({t})"),
            None => String::new(),
        },
    }
}

/// Maps an error opening a VFIO node to the message for it.
///
/// A busy node (EBUSY: open elsewhere) is looked up among the processes below
/// `proc_root`, so the message names who holds it, this process included.
fn open_error(
    bdf: Bdf,
    path: &Path,
    e: io::Error,
    noiommu_group: bool,
    proc_root: &Path,
) -> VfioError {
    let errno = e.raw_os_error();
    if noiommu_group && errno == Some(libc::EPERM) {
        return VfioError::NoiommuNeedsRawio {
            bdf,
            path: path.to_path_buf(),
        };
    }
    match errno {
        Some(libc::EACCES) | Some(libc::EPERM) => {
            let (owner, mode) = std::fs::metadata(path)
                .map(|m| (format!("uid {}", m.uid()), m.mode() & 0o7777))
                .unwrap_or_else(|_| ("an unknown owner".into(), 0));
            VfioError::PermissionDenied {
                bdf,
                path: path.to_path_buf(),
                user: user_text(),
                owner,
                mode,
            }
        }
        Some(libc::EBUSY) => {
            let (found, complete) = holders::holders(proc_root, path);
            VfioError::GroupBusy {
                bdf,
                path: path.to_path_buf(),
                holders: holders::holders_text(path, &found, complete, std::process::id()),
            }
        }
        Some(libc::EMFILE) | Some(libc::ENFILE) => VfioError::TooManyOpenFiles {
            bdf,
            path: path.to_path_buf(),
            why: crate::hw::limits::open_files_text(errno).unwrap_or_default(),
        },
        _ => VfioError::Open {
            bdf,
            path: path.to_path_buf(),
            source: e,
        },
    }
}

/// What the sysfs checks found.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Preflight {
    bdf: Bdf,
    group: u32,
}

/// The sysfs checks of step 2. Pure file reads.
fn preflight(bdf: Bdf, opts: &VfioOptions) -> Result<Preflight, VfioError> {
    let roots = SysRoots::new(&opts.sysfs_root, "/proc");
    let dir = roots.pci_device_dir(&bdf);
    if !dir.exists() {
        let present = match pci::nvme_bdfs(&opts.sysfs_root) {
            Ok(v) if v.is_empty() => "none".to_string(),
            Ok(v) => v
                .iter()
                .map(|b| b.to_string())
                .collect::<Vec<_>>()
                .join(", "),
            Err(e) => format!("unknown ({e})"),
        };
        return Err(VfioError::NoSuchDevice {
            bdf,
            path: dir,
            present,
        });
    }
    if let Some(class) = pci::class(&roots, &bdf)? {
        if class != pci::NVME_CLASS {
            return Err(VfioError::NotNvme { bdf, class });
        }
    }
    let driver = pci::bound_driver(&roots, &bdf)?;
    if driver.as_deref() != Some("vfio-pci") {
        return Err(VfioError::NotBoundToVfio { bdf, driver });
    }
    let Some(group) = pci::iommu_group(&roots, &bdf)? else {
        return Err(VfioError::NoIommuGroup {
            bdf,
            path: dir.join("iommu_group"),
        });
    };
    let others = blocking_members(&roots, bdf, group)?;
    if !others.is_empty() {
        return Err(VfioError::GroupNotViable { bdf, group, others });
    }
    if opts.noiommu && opts.page_kind == PageKind::Small {
        return Err(VfioError::NoiommuNeedsHugepages { bdf });
    }
    Ok(Preflight { bdf, group })
}

/// Members of `group` other than `bdf` that keep VFIO from using it.
fn blocking_members(roots: &SysRoots, bdf: Bdf, group: u32) -> Result<Vec<GroupMember>, VfioError> {
    Ok(pci::group_members(roots, group)?
        .into_iter()
        .filter(|m| m.bdf != bdf && !m.allows_vfio())
        .collect())
}

/// Opens the group node of step 3, telling IOMMU and noiommu groups apart.
fn open_group(pf: &Preflight, opts: &VfioOptions) -> Result<(sys::Group, PathBuf), VfioError> {
    let vdir = opts.dev_root.join("vfio");
    let iommu_path = vdir.join(pf.group.to_string());
    let noiommu_path = vdir.join(format!("noiommu-{}", pf.group));
    let (want, other) = if opts.noiommu {
        (&noiommu_path, &iommu_path)
    } else {
        (&iommu_path, &noiommu_path)
    };
    match sys::Group::open(want) {
        Ok(g) => Ok((g, want.clone())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let bdf = pf.bdf;
            Err(if other.exists() {
                if opts.noiommu {
                    VfioError::GroupHasIommu {
                        bdf,
                        path: other.clone(),
                    }
                } else {
                    VfioError::GroupIsNoiommu {
                        bdf,
                        path: other.clone(),
                    }
                }
            } else if !vdir.join("vfio").exists() {
                VfioError::VfioNotLoaded {
                    path: vdir.join("vfio"),
                }
            } else {
                VfioError::GroupNodeMissing {
                    bdf,
                    group: pf.group,
                    path: want.clone(),
                    dev_root: opts.dev_root.clone(),
                }
            })
        }
        Err(e) => Err(open_error(pf.bdf, want, e, opts.noiommu, &opts.proc_root)),
    }
}

/// The opened device: its fd, where its config space is, and the group it came from.
/// Dropping it clears Bus Master Enable, closes the fd, then lets go of the group.
struct Device {
    // Field order is drop order: the fd closes before the group reference goes.
    file: File,
    bdf: Bdf,
    config_offset: u64,
    _group: Arc<sys::Group>,
}

impl Device {
    fn read_config16(&self, off: u64) -> Result<u16, VfioError> {
        let mut b = [0u8; 2];
        self.file
            .read_exact_at(&mut b, self.config_offset + off)
            .map_err(|source| VfioError::Config {
                bdf: self.bdf,
                offset: off,
                source,
            })?;
        // PCI configuration space is little-endian.
        Ok(u16::from_le_bytes(b))
    }

    fn write_config16(&self, off: u64, v: u16) -> Result<(), VfioError> {
        self.file
            .write_all_at(&v.to_le_bytes(), self.config_offset + off)
            .map_err(|source| VfioError::Config {
                bdf: self.bdf,
                offset: off,
                source,
            })
    }

    /// Sets Memory Space Enable and Bus Master Enable, keeping the other bits.
    fn enable(&self) -> Result<u16, VfioError> {
        let cmd = self.read_config16(PCI_COMMAND)?;
        let wrote = cmd | PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER;
        if wrote != cmd {
            self.write_config16(PCI_COMMAND, wrote)?;
        }
        let read = self.read_config16(PCI_COMMAND)?;
        if read & (PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER)
            != PCI_COMMAND_MEMORY | PCI_COMMAND_MASTER
        {
            return Err(VfioError::CommandRegister {
                bdf: self.bdf,
                wrote,
                read,
            });
        }
        Ok(read)
    }
}

impl Drop for Device {
    fn drop(&mut self) {
        // Stop the device's DMA before its memory can go away, whatever state the
        // controller was left in. Best effort: the kernel resets the function on close.
        if let Ok(cmd) = self.read_config16(PCI_COMMAND) {
            if cmd & PCI_COMMAND_MASTER != 0 {
                let _ = self.write_config16(PCI_COMMAND, cmd & !PCI_COMMAND_MASTER);
            }
        }
        tracing::debug!(bdf = %self.bdf, "vfio device closed");
    }
}

/// The most MSI-X vectors enabled (one per I/O queue plus the admin queue's).
pub const MAX_MSIX_VECTORS: u16 = 129;

/// A controller reached through VFIO.
pub struct VfioTransport {
    bar: Arc<Bar>,
    mapper: Arc<dyn DmaMapper>,
    /// MSI-X vectors the device has (capped at [`MAX_MSIX_VECTORS`]; 0 when unknown).
    msix: u16,
    /// The eventfds of the enabled vectors, once enabled.
    irqs: std::sync::Mutex<Vec<Arc<std::os::fd::OwnedFd>>>,
    _device: Arc<Device>,
    bdf: Bdf,
    group: u32,
    noiommu: bool,
    page_kind: PageKind,
    proc_root: PathBuf,
    /// The host IRQ numbers of the vectors steered so far: (vector, IRQ).
    irq_numbers: std::sync::Mutex<Vec<(u16, u32)>>,
}

impl core::fmt::Debug for VfioTransport {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("VfioTransport")
            .field("bdf", &self.bdf)
            .field("group", &self.group)
            .field("noiommu", &self.noiommu)
            .field("bar0_len", &self.bar.len())
            .finish()
    }
}

/// The error of a failed VFIO ioctl `op` on `path`.
fn ioctl_err(bdf: Bdf, op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> VfioError {
    let path = path.to_path_buf();
    move |source| VfioError::Ioctl {
        bdf,
        op,
        path,
        source,
    }
}

/// Opens the VFIO container, checks its API and IOMMU type, checks the group is viable,
/// and puts the group in the container with that IOMMU. Returns the container and its path.
fn attach_container(
    bdf: Bdf,
    pf: &Preflight,
    group: &mut sys::Group,
    group_path: &Path,
    opts: &VfioOptions,
) -> Result<(Arc<sys::Container>, PathBuf), VfioError> {
    let cpath = opts.dev_root.join("vfio/vfio");
    let container = match sys::Container::open(&cpath) {
        Ok(c) => Arc::new(c),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(VfioError::VfioNotLoaded { path: cpath })
        }
        Err(e) => return Err(open_error(bdf, &cpath, e, false, &opts.proc_root)),
    };
    let version =
        container
            .api_version()
            .map_err(ioctl_err(bdf, "VFIO_GET_API_VERSION", &cpath))?;
    if version != VFIO_API_VERSION as i32 {
        return Err(VfioError::ApiVersion {
            path: cpath,
            got: version,
        });
    }
    let iommu_type = if opts.noiommu {
        VFIO_NOIOMMU_IOMMU
    } else {
        VFIO_TYPE1v2_IOMMU
    };
    if !container.check_extension(iommu_type).map_err(ioctl_err(
        bdf,
        "VFIO_CHECK_EXTENSION",
        &cpath,
    ))? {
        return Err(if opts.noiommu {
            VfioError::NoiommuUnsupported { bdf }
        } else {
            VfioError::NoType1 { bdf }
        });
    }
    let flags = group
        .status()
        .map_err(ioctl_err(bdf, "VFIO_GROUP_GET_STATUS", group_path))?;
    if flags & VFIO_GROUP_FLAGS_VIABLE == 0 {
        // The kernel knows better than the sysfs check; show every other member.
        let roots = SysRoots::new(&opts.sysfs_root, "/proc");
        let others = pci::group_members(&roots, pf.group)?
            .into_iter()
            .filter(|m| m.bdf != bdf)
            .collect();
        return Err(VfioError::GroupNotViable {
            bdf,
            group: pf.group,
            others,
        });
    }
    group.set_container(&container).map_err(ioctl_err(
        bdf,
        "VFIO_GROUP_SET_CONTAINER",
        group_path,
    ))?;
    container
        .set_iommu(iommu_type)
        .map_err(ioctl_err(bdf, "VFIO_SET_IOMMU", &cpath))?;
    Ok((container, cpath))
}

/// The DMA mapper: type1 IOMMU mappings, or physical addresses in noiommu mode.
fn make_mapper(
    bdf: Bdf,
    opts: &VfioOptions,
    container: &sys::Container,
    cpath: &Path,
    group: &Arc<sys::Group>,
) -> Result<Arc<dyn DmaMapper>, VfioError> {
    let mapper: Arc<dyn DmaMapper> = if opts.noiommu {
        tracing::warn!(
            %bdf,
            "vfio noiommu mode: dma of {bdf} is NOT confined by an iommu; the device can read and write all physical memory"
        );
        Arc::new(mapper::NoIommuMapper::new(
            Some(Arc::clone(group)),
            format!("vfio noiommu {bdf}"),
            opts.page_kind.size(),
        ))
    } else {
        let info = container
            .iommu_info()
            .map_err(ioctl_err(bdf, "VFIO_IOMMU_GET_INFO", cpath))?;
        let pgsizes = info.pgsizes.unwrap_or(4096);
        let ranges = info
            .iova_ranges
            .clone()
            .unwrap_or_else(|| iova::DEFAULT_RANGES.to_vec());
        tracing::info!(%bdf, iova_pgsizes = format_args!("{pgsizes:#x}"), ?ranges, "vfio type1 iommu");
        Arc::new(mapper::Type1Mapper::new(
            Arc::clone(group),
            format!("vfio type1 {bdf}"),
            pgsizes,
            &ranges,
        ))
    };
    Ok(mapper)
}

/// The device's info (a PCI device with a config region) and its BAR0 and config
/// regions.
fn device_regions(
    bdf: Bdf,
    file: &File,
) -> Result<(vfio_region_info, vfio_region_info), VfioError> {
    let devpath = PathBuf::from(format!("vfio device fd of {bdf}"));
    let dinfo = sys::device_info(file).map_err(ioctl_err(bdf, "VFIO_DEVICE_GET_INFO", &devpath))?;
    if dinfo.flags & VFIO_DEVICE_FLAGS_PCI == 0 || dinfo.num_regions <= VFIO_PCI_CONFIG_REGION_INDEX
    {
        return Err(VfioError::NotPciDevice {
            bdf,
            flags: dinfo.flags,
            regions: dinfo.num_regions,
        });
    }
    let bar0 = sys::region_info(file, VFIO_PCI_BAR0_REGION_INDEX).map_err(ioctl_err(
        bdf,
        "VFIO_DEVICE_GET_REGION_INFO (bar0)",
        &devpath,
    ))?;
    let cfg = sys::region_info(file, VFIO_PCI_CONFIG_REGION_INDEX).map_err(ioctl_err(
        bdf,
        "VFIO_DEVICE_GET_REGION_INFO (config)",
        &devpath,
    ))?;
    Ok((bar0, cfg))
}

impl VfioTransport {
    /// Opens the controller at `bdf` (`0000:01:00.0` or `01:00.0`), which must be bound to
    /// vfio-pci (`scripts/setup.sh config`). See the module documentation for the steps.
    pub fn open(bdf: &str, opts: &VfioOptions) -> Result<Arc<VfioTransport>, VfioError> {
        let bdf: Bdf = bdf.parse()?;
        let pf = preflight(bdf, opts)?;
        let (mut group, group_path) = open_group(&pf, opts)?;

        let (container, cpath) = attach_container(bdf, &pf, &mut group, &group_path, opts)?;
        let group = Arc::new(group);

        let mapper = make_mapper(bdf, opts, &container, &cpath, &group)?;

        let file = group.device_fd(&bdf.to_string()).map_err(ioctl_err(
            bdf,
            "VFIO_GROUP_GET_DEVICE_FD",
            &group_path,
        ))?;
        let (bar0, cfg) = device_regions(bdf, &file)?;
        let bar0_len = check_bar0(bdf, bar0.size, bar0.flags)?;
        let device = Arc::new(Device {
            file,
            bdf,
            config_offset: cfg.offset,
            _group: Arc::clone(&group),
        });
        drop(group);

        let map = sys::RegionMap::new(
            &device.file,
            bar0.offset,
            bar0_len,
            Arc::clone(&device) as Arc<dyn Send + Sync>,
        )
        .map_err(|source| VfioError::Bar0Mmap {
            bdf,
            size: bar0.size,
            offset: bar0.offset,
            source,
        })?;
        let (ptr, len) = (map.ptr(), map.len());
        // SAFETY: ptr..ptr+len is the shared mapping of BAR0 just made, page aligned,
        // readable and writable; `map` keeps it mapped and is moved into the Bar.
        let bar = unsafe { Bar::from_raw(ptr, len, Box::new(map)) }.map_err(|_| {
            VfioError::Bar0TooSmall {
                bdf,
                size: bar0.size,
                need: MIN_BAR_LEN,
            }
        })?;
        let cmd = device.enable()?;
        let msix = sys::msix_count(&device.file).unwrap_or(0);
        tracing::info!(%bdf, group = pf.group, noiommu = opts.noiommu, bar0_len, pci_command = format_args!("{cmd:#06x}"), msix, "vfio device open");
        Ok(Arc::new(VfioTransport {
            bar: Arc::new(bar),
            mapper,
            msix: msix.min(MAX_MSIX_VECTORS as u32) as u16,
            irqs: std::sync::Mutex::new(Vec::new()),
            _device: device,
            bdf,
            group: pf.group,
            noiommu: opts.noiommu,
            page_kind: opts.page_kind,
            proc_root: opts.proc_root.clone(),
            irq_numbers: std::sync::Mutex::new(Vec::new()),
        }))
    }

    /// The controller's PCI address.
    pub fn bdf(&self) -> Bdf {
        self.bdf
    }

    /// Its IOMMU group.
    pub fn iommu_group(&self) -> u32 {
        self.group
    }

    /// Whether it was opened in noiommu mode.
    pub fn is_noiommu(&self) -> bool {
        self.noiommu
    }
}

/// Checks BAR0's region info and returns the length to map.
fn check_bar0(bdf: Bdf, size: u64, flags: u32) -> Result<usize, VfioError> {
    if size < MIN_BAR_LEN as u64 {
        return Err(VfioError::Bar0TooSmall {
            bdf,
            size,
            need: MIN_BAR_LEN,
        });
    }
    let need =
        VFIO_REGION_INFO_FLAG_READ | VFIO_REGION_INFO_FLAG_WRITE | VFIO_REGION_INFO_FLAG_MMAP;
    if flags & need != need {
        return Err(VfioError::Bar0NotMappable { bdf, flags });
    }
    usize::try_from(size).map_err(|_| VfioError::Bar0NotMappable { bdf, flags })
}

impl Transport for VfioTransport {
    fn bar(&self) -> Arc<Bar> {
        Arc::clone(&self.bar)
    }
    fn mapper(&self) -> Arc<dyn DmaMapper> {
        Arc::clone(&self.mapper)
    }
    fn page_kind(&self) -> PageKind {
        self.page_kind
    }
    fn describe(&self) -> String {
        if self.noiommu {
            format!("pci {} (noiommu)", self.bdf)
        } else {
            format!("pci {}", self.bdf)
        }
    }
    fn interrupt_vectors(&self) -> u16 {
        self.msix
    }
    fn interrupt(&self, vector: u16) -> io::Result<Arc<std::os::fd::OwnedFd>> {
        use std::os::fd::AsFd;
        if vector >= self.msix {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} has MSI-X vectors 0..{}, not {vector}",
                    self.bdf, self.msix
                ),
            ));
        }
        let mut irqs = self.irqs.lock().unwrap_or_else(|p| p.into_inner());
        if irqs.is_empty() {
            let fds = (0..self.msix)
                .map(|_| crate::hw::transport::interrupt_eventfd().map(Arc::new))
                .collect::<io::Result<Vec<_>>>()?;
            let borrowed: Vec<_> = fds.iter().map(|f| f.as_fd()).collect();
            sys::enable_msix(&self._device.file, &borrowed).map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "VFIO_DEVICE_SET_IRQS enabling {} MSI-X vectors of {}: {e}",
                        self.msix, self.bdf
                    ),
                )
            })?;
            tracing::info!(bdf = %self.bdf, vectors = self.msix, "msi-x vectors routed to eventfds");
            *irqs = fds;
        }
        Ok(Arc::clone(&irqs[vector as usize]))
    }
    fn steer_interrupt(&self, vector: u16, cpu: usize) -> io::Result<()> {
        // The IRQ numbers stay while the vectors are enabled (until the device closes):
        // `/proc/interrupts`, long on a machine with many CPUs, is read once per vector.
        let irq = {
            let mut known = self.irq_numbers.lock().unwrap_or_else(|p| p.into_inner());
            match known.iter().find(|(v, _)| *v == vector) {
                Some(&(_, irq)) => irq,
                None => {
                    let irq = affinity::msix_irq(&self.proc_root, &self.bdf, vector)?;
                    known.push((vector, irq));
                    irq
                }
            }
        };
        affinity::set_irq_cpu(&self.proc_root, irq, cpu)?;
        tracing::debug!(bdf = %self.bdf, vector, irq, cpu, "msi-x vector steered");
        Ok(())
    }
}

#[cfg(test)]
mod tests;

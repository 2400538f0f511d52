//! The VFIO system calls: every `ioctl` and `mmap` of the VFIO backend, and nothing else.
//!
//! Written against the kernel UAPI `linux/vfio.h` (structures from `vfio-bindings`).
//! Each request number is `_IO(VFIO_TYPE, VFIO_BASE + n)`; VFIO encodes no size or
//! direction in it, and the `argsz` field of each structure carries the size instead.
//!
//! Ownership gives the teardown order: a [`Group`] holds the [`Container`] it was
//! attached to, and whatever holds the device fd holds the group, so the device fd is
//! closed before the group fd, and the group fd before the container fd, whichever of
//! them is dropped first by the caller.

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::path::Path;
use std::ptr::NonNull;
use std::sync::Arc;

use vfio_bindings::bindings::vfio::{
    vfio_device_info, vfio_group_status, vfio_iommu_type1_dma_map, vfio_iommu_type1_dma_unmap,
    vfio_iommu_type1_info, vfio_irq_info, vfio_irq_set, vfio_region_info, VFIO_BASE,
    VFIO_DMA_MAP_FLAG_READ, VFIO_DMA_MAP_FLAG_WRITE, VFIO_IRQ_SET_ACTION_TRIGGER,
    VFIO_IRQ_SET_DATA_EVENTFD, VFIO_PCI_MSIX_IRQ_INDEX, VFIO_TYPE,
};

/// `_IO(VFIO_TYPE, VFIO_BASE + n)`.
const fn vfio_io(n: u32) -> libc::Ioctl {
    (((VFIO_TYPE as u32) << 8) | (VFIO_BASE + n)) as libc::Ioctl
}

/// `VFIO_GET_API_VERSION`: returns `VFIO_API_VERSION` (0).
const GET_API_VERSION: libc::Ioctl = vfio_io(0);
/// `VFIO_CHECK_EXTENSION`: arg is an IOMMU type; returns > 0 if supported.
const CHECK_EXTENSION: libc::Ioctl = vfio_io(1);
/// `VFIO_SET_IOMMU`: arg is the IOMMU type.
const SET_IOMMU: libc::Ioctl = vfio_io(2);
/// `VFIO_GROUP_GET_STATUS`: arg is `*mut vfio_group_status`.
const GROUP_GET_STATUS: libc::Ioctl = vfio_io(3);
/// `VFIO_GROUP_SET_CONTAINER`: arg is `*const i32` (the container fd).
const GROUP_SET_CONTAINER: libc::Ioctl = vfio_io(4);
/// `VFIO_GROUP_GET_DEVICE_FD`: arg is the device name (`*const c_char`); returns an fd.
const GROUP_GET_DEVICE_FD: libc::Ioctl = vfio_io(6);
/// `VFIO_DEVICE_GET_INFO`: arg is `*mut vfio_device_info`.
const DEVICE_GET_INFO: libc::Ioctl = vfio_io(7);
/// `VFIO_DEVICE_GET_REGION_INFO`: arg is `*mut vfio_region_info`.
const DEVICE_GET_REGION_INFO: libc::Ioctl = vfio_io(8);
/// `VFIO_DEVICE_GET_IRQ_INFO`: arg is `*mut vfio_irq_info`.
const DEVICE_GET_IRQ_INFO: libc::Ioctl = vfio_io(9);
/// `VFIO_DEVICE_SET_IRQS`: arg is `*const vfio_irq_set` followed by its data.
const DEVICE_SET_IRQS: libc::Ioctl = vfio_io(10);
/// `VFIO_IOMMU_GET_INFO`: arg is `*mut vfio_iommu_type1_info` (+ capability chain).
const IOMMU_GET_INFO: libc::Ioctl = vfio_io(12);
/// `VFIO_IOMMU_MAP_DMA`: arg is `*const vfio_iommu_type1_dma_map`.
const IOMMU_MAP_DMA: libc::Ioctl = vfio_io(13);
/// `VFIO_IOMMU_UNMAP_DMA`: arg is `*mut vfio_iommu_type1_dma_unmap`.
const IOMMU_UNMAP_DMA: libc::Ioctl = vfio_io(14);

// The numbers linux/vfio.h gives on every architecture (';' is 0x3b).
const _: () = assert!(GET_API_VERSION == 0x3b64);
const _: () = assert!(GROUP_GET_DEVICE_FD == 0x3b6a);
const _: () = assert!(IOMMU_UNMAP_DMA == 0x3b72);
// The structure sizes the kernel checks argsz against.
const _: () = assert!(std::mem::size_of::<vfio_group_status>() == 8);
const _: () = assert!(std::mem::size_of::<vfio_device_info>() == 24);
const _: () = assert!(std::mem::size_of::<vfio_region_info>() == 32);
const _: () = assert!(std::mem::size_of::<vfio_iommu_type1_info>() == 24);
const _: () = assert!(std::mem::size_of::<vfio_iommu_type1_dma_map>() == 32);
const _: () = assert!(std::mem::size_of::<vfio_iommu_type1_dma_unmap>() == 24);
const _: () = assert!(DEVICE_SET_IRQS == 0x3b6e);
const _: () = assert!(std::mem::size_of::<vfio_irq_info>() == 16);
const _: () = assert!(std::mem::size_of::<vfio_irq_set>() == 20);

/// The largest `VFIO_IOMMU_GET_INFO` answer (with capabilities) we accept.
const IOMMU_INFO_MAX_BYTES: u32 = 64 * 1024;

fn cvt(rc: libc::c_int) -> io::Result<libc::c_int> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(rc)
    }
}

fn open_rw(path: &Path) -> io::Result<OwnedFd> {
    let f = File::options().read(true).write(true).open(path)?;
    Ok(OwnedFd::from(f))
}

/// The effective user ID of this process.
pub(crate) fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// A VFIO container (`/dev/vfio/vfio`): one IOMMU address space.
#[derive(Debug)]
pub(crate) struct Container {
    fd: OwnedFd,
}

/// What `VFIO_IOMMU_GET_INFO` says about a type1 IOMMU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct IommuInfo {
    /// Bitmap of supported IOMMU page sizes, when reported.
    pub pgsizes: Option<u64>,
    /// Usable IOVA ranges (inclusive ends), when the kernel reports them (5.4+).
    pub iova_ranges: Option<Vec<(u64, u64)>>,
}

impl Container {
    /// Opens the container node.
    pub fn open(path: &Path) -> io::Result<Container> {
        Ok(Container { fd: open_rw(path)? })
    }

    /// `VFIO_GET_API_VERSION`.
    pub fn api_version(&self) -> io::Result<i32> {
        // SAFETY: this request takes no argument; the fd is a valid open file.
        cvt(unsafe { libc::ioctl(self.fd.as_raw_fd(), GET_API_VERSION) })
    }

    /// `VFIO_CHECK_EXTENSION`: whether an IOMMU type (or extension) is offered.
    pub fn check_extension(&self, ext: u32) -> io::Result<bool> {
        // SAFETY: the argument is passed by value; no memory is shared with the kernel.
        let rc = cvt(unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                CHECK_EXTENSION,
                libc::c_ulong::from(ext),
            )
        })?;
        Ok(rc > 0)
    }

    /// `VFIO_SET_IOMMU`. Needs at least one group attached.
    pub fn set_iommu(&self, kind: u32) -> io::Result<()> {
        // SAFETY: the argument is passed by value; no memory is shared with the kernel.
        cvt(unsafe { libc::ioctl(self.fd.as_raw_fd(), SET_IOMMU, libc::c_ulong::from(kind)) })?;
        Ok(())
    }

    /// `VFIO_IOMMU_GET_INFO`, with the capability chain when the kernel has one.
    pub fn iommu_info(&self) -> io::Result<IommuInfo> {
        let mut info = vfio_iommu_type1_info {
            argsz: std::mem::size_of::<vfio_iommu_type1_info>() as u32,
            ..Default::default()
        };
        // SAFETY: `info` is a valid, writable vfio_iommu_type1_info of the size in argsz;
        // the kernel writes at most argsz bytes into it.
        cvt(unsafe { libc::ioctl(self.fd.as_raw_fd(), IOMMU_GET_INFO, &mut info as *mut _) })?;
        let pgsizes = (info.flags & vfio_bindings::bindings::vfio::VFIO_IOMMU_INFO_PGSIZES != 0)
            .then_some(info.iova_pgsizes);
        let has_caps = info.flags & vfio_bindings::bindings::vfio::VFIO_IOMMU_INFO_CAPS != 0;
        let base = std::mem::size_of::<vfio_iommu_type1_info>() as u32;
        if !has_caps || info.argsz <= base || info.argsz > IOMMU_INFO_MAX_BYTES {
            return Ok(IommuInfo {
                pgsizes,
                iova_ranges: None,
            });
        }
        // A second call with room for the capabilities. u64 words keep it 8-aligned.
        let argsz = info.argsz;
        let mut buf = vec![0u64; (argsz as usize).div_ceil(8)];
        buf[0] = u64::from_ne_bytes(concat_u32(argsz, 0));
        // SAFETY: buf is writable, 8-aligned and at least argsz bytes long, starts with a
        // vfio_iommu_type1_info header whose argsz is its size; the kernel writes at
        // most argsz bytes.
        cvt(unsafe { libc::ioctl(self.fd.as_raw_fd(), IOMMU_GET_INFO, buf.as_mut_ptr()) })?;
        let bytes: Vec<u8> = buf.iter().flat_map(|w| w.to_ne_bytes()).collect();
        Ok(IommuInfo {
            pgsizes,
            iova_ranges: super::iova::parse_iova_range_cap(&bytes[..argsz as usize]),
        })
    }

    /// `VFIO_IOMMU_MAP_DMA`: makes `len` bytes at `vaddr` visible to the device at `iova`,
    /// readable and writable. The kernel pins the pages.
    ///
    /// # Safety
    /// `vaddr..vaddr + len` must be memory this process owns and keeps mapped until
    /// [`Container::unmap_dma`] of the same range has returned; from now on the device may
    /// read and write it at any time, so no Rust reference to it may exist.
    pub unsafe fn map_dma(&self, vaddr: usize, iova: u64, len: u64) -> io::Result<()> {
        let m = vfio_iommu_type1_dma_map {
            argsz: std::mem::size_of::<vfio_iommu_type1_dma_map>() as u32,
            flags: VFIO_DMA_MAP_FLAG_READ | VFIO_DMA_MAP_FLAG_WRITE,
            vaddr: vaddr as u64,
            iova,
            size: len,
        };
        // SAFETY: `m` is a valid vfio_iommu_type1_dma_map the kernel only reads; the
        // caller guarantees the memory it names.
        cvt(unsafe { libc::ioctl(self.fd.as_raw_fd(), IOMMU_MAP_DMA, &m as *const _) })?;
        Ok(())
    }

    /// `VFIO_IOMMU_UNMAP_DMA`; returns the number of bytes the kernel unmapped.
    pub fn unmap_dma(&self, iova: u64, len: u64) -> io::Result<u64> {
        let mut u = vfio_iommu_type1_dma_unmap {
            argsz: std::mem::size_of::<vfio_iommu_type1_dma_unmap>() as u32,
            flags: 0,
            iova,
            size: len,
            ..Default::default()
        };
        // SAFETY: `u` is a valid vfio_iommu_type1_dma_unmap of argsz bytes (no bitmap
        // flag, so the kernel reads and writes only the fixed part).
        cvt(unsafe { libc::ioctl(self.fd.as_raw_fd(), IOMMU_UNMAP_DMA, &mut u as *mut _) })?;
        Ok(u.size)
    }
}

fn concat_u32(lo_field: u32, hi_field: u32) -> [u8; 8] {
    let mut b = [0u8; 8];
    b[..4].copy_from_slice(&lo_field.to_ne_bytes());
    b[4..].copy_from_slice(&hi_field.to_ne_bytes());
    b
}

/// A VFIO group (`/dev/vfio/N` or `/dev/vfio/noiommu-N`). Once attached, it keeps its
/// container alive; it is closed (and so detached) before the container.
#[derive(Debug)]
pub(crate) struct Group {
    // Field order is drop order: the group fd closes before the container's.
    fd: OwnedFd,
    container: Option<Arc<Container>>,
}

impl Group {
    /// Opens the group node. The kernel allows one opener at a time (EBUSY otherwise).
    pub fn open(path: &Path) -> io::Result<Group> {
        Ok(Group {
            fd: open_rw(path)?,
            container: None,
        })
    }

    /// `VFIO_GROUP_GET_STATUS`: the `VFIO_GROUP_FLAGS_*` bits.
    pub fn status(&self) -> io::Result<u32> {
        let mut st = vfio_group_status {
            argsz: std::mem::size_of::<vfio_group_status>() as u32,
            flags: 0,
        };
        // SAFETY: `st` is a valid, writable vfio_group_status of argsz bytes.
        cvt(unsafe { libc::ioctl(self.fd.as_raw_fd(), GROUP_GET_STATUS, &mut st as *mut _) })?;
        Ok(st.flags)
    }

    /// `VFIO_GROUP_SET_CONTAINER`; the group then holds the container.
    pub fn set_container(&mut self, c: &Arc<Container>) -> io::Result<()> {
        let cfd: libc::c_int = c.fd.as_raw_fd();
        // SAFETY: the kernel reads one int (the container fd) through the pointer, which
        // points at a live local.
        cvt(unsafe {
            libc::ioctl(
                self.fd.as_raw_fd(),
                GROUP_SET_CONTAINER,
                &cfd as *const libc::c_int,
            )
        })?;
        self.container = Some(Arc::clone(c));
        Ok(())
    }

    /// The container this group was attached to.
    pub fn container(&self) -> Option<&Arc<Container>> {
        self.container.as_ref()
    }

    /// `VFIO_GROUP_GET_DEVICE_FD` for the device named `name` (its PCI address).
    pub fn device_fd(&self, name: &str) -> io::Result<File> {
        let cname = CString::new(name).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?;
        // SAFETY: the kernel reads a NUL-terminated string through the pointer, which
        // points at `cname`, alive for the call.
        let fd =
            cvt(unsafe { libc::ioctl(self.fd.as_raw_fd(), GROUP_GET_DEVICE_FD, cname.as_ptr()) })?;
        // SAFETY: the ioctl returned a new file descriptor that nothing else owns.
        Ok(unsafe { File::from_raw_fd(fd) })
    }
}

/// `VFIO_DEVICE_GET_INFO`.
pub(crate) fn device_info(dev: &File) -> io::Result<vfio_device_info> {
    let mut info = vfio_device_info {
        argsz: std::mem::size_of::<vfio_device_info>() as u32,
        ..Default::default()
    };
    // SAFETY: `info` is a valid, writable vfio_device_info of argsz bytes.
    cvt(unsafe { libc::ioctl(dev.as_raw_fd(), DEVICE_GET_INFO, &mut info as *mut _) })?;
    Ok(info)
}

/// `VFIO_DEVICE_GET_IRQ_INFO` for the MSI-X index: how many vectors the device has.
pub(crate) fn msix_count(dev: &File) -> io::Result<u32> {
    let mut info = vfio_irq_info {
        argsz: std::mem::size_of::<vfio_irq_info>() as u32,
        index: VFIO_PCI_MSIX_IRQ_INDEX,
        ..Default::default()
    };
    // SAFETY: `info` is a valid, writable vfio_irq_info of argsz bytes.
    cvt(unsafe { libc::ioctl(dev.as_raw_fd(), DEVICE_GET_IRQ_INFO, &mut info as *mut _) })?;
    Ok(info.count)
}

/// `VFIO_DEVICE_SET_IRQS`: enables MSI-X vectors `0..fds.len()`, each triggering the
/// eventfd at its position (the kernel takes its own reference to each).
pub(crate) fn enable_msix(dev: &File, fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    // vfio_irq_set (five u32 fields) followed by one i32 per vector, built as u32 words
    // so the buffer has the structure's alignment.
    const HEADER: usize = std::mem::size_of::<vfio_irq_set>() / 4;
    let mut buf = vec![0u32; HEADER + fds.len()];
    buf[0] = (buf.len() * 4) as u32; // argsz
    buf[1] = VFIO_IRQ_SET_DATA_EVENTFD | VFIO_IRQ_SET_ACTION_TRIGGER; // flags
    buf[2] = VFIO_PCI_MSIX_IRQ_INDEX; // index
    buf[3] = 0; // start
    buf[4] = fds.len() as u32; // count
    for (w, fd) in buf[HEADER..].iter_mut().zip(fds) {
        *w = fd.as_raw_fd() as u32;
    }
    // SAFETY: `buf` holds a vfio_irq_set header whose argsz covers the header and `count`
    // descriptors after it; the kernel only reads it, and the descriptors stay open for
    // the call (borrowed).
    cvt(unsafe { libc::ioctl(dev.as_raw_fd(), DEVICE_SET_IRQS, buf.as_ptr()) })?;
    Ok(())
}

/// `VFIO_DEVICE_GET_REGION_INFO` for region `index` (without its capability chain).
pub(crate) fn region_info(dev: &File, index: u32) -> io::Result<vfio_region_info> {
    let mut info = vfio_region_info {
        argsz: std::mem::size_of::<vfio_region_info>() as u32,
        index,
        ..Default::default()
    };
    // SAFETY: `info` is a valid, writable vfio_region_info of argsz bytes; with argsz at
    // the base size the kernel writes no capabilities.
    cvt(unsafe { libc::ioctl(dev.as_raw_fd(), DEVICE_GET_REGION_INFO, &mut info as *mut _) })?;
    Ok(info)
}

/// A shared mapping of a device region (BAR0), unmapped on drop. It holds `owner` (the
/// device) so the device fd is closed only after the mapping is gone.
pub(crate) struct RegionMap {
    ptr: NonNull<u8>,
    len: usize,
    _owner: Arc<dyn Send + Sync>,
}

// SAFETY: the mapping is MMIO space reached only through atomics by `mmio::Bar`; the
// pointer itself may move between threads.
unsafe impl Send for RegionMap {}
// SAFETY: as above; RegionMap has no interior state besides the pointer.
unsafe impl Sync for RegionMap {}

impl crate::hw::mmio::BarBacking for RegionMap {}

impl RegionMap {
    /// Maps `len` bytes of the region at file offset `offset` of `dev`, read/write, shared.
    pub fn new(
        dev: &File,
        offset: u64,
        len: usize,
        owner: Arc<dyn Send + Sync>,
    ) -> io::Result<RegionMap> {
        let off = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
        // SAFETY: no address hint; the kernel validates fd, offset and length, and the
        // result is checked before use.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                dev.as_raw_fd(),
                off,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned 0"))?;
        Ok(RegionMap {
            ptr,
            len,
            _owner: owner,
        })
    }

    /// Start of the mapping (page aligned).
    pub fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// Length of the mapping.
    pub fn len(&self) -> usize {
        self.len
    }
}

impl Drop for RegionMap {
    fn drop(&mut self) {
        // SAFETY: ptr/len is the mapping made in `new`; its only user (the Bar owning this
        // backing, and every Doorbell holding that Bar) is gone.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

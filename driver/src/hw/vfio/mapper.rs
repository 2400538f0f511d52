//! The two ways a VFIO container makes memory visible to the device.
//!
//! - [`Type1Mapper`]: the IOMMU translates; regions are mapped with `VFIO_IOMMU_MAP_DMA`
//!   at IOVAs chosen here, aligned to the largest IOMMU page size that fits the region,
//!   so a hugepage region becomes one IOMMU hugepage entry.
//! - [`NoIommuMapper`]: no translation; the IOVA is the physical address, read from
//!   `/proc/self/pagemap` (root only), and a region must be one physically contiguous,
//!   locked hugepage.
//!
//! Both hold the group (and through it the container), so the IOMMU domain lives as
//! long as any pool that has regions in it.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use super::iova::IovaAllocator;
use super::sys::Group;
use crate::hw::dma::{DmaError, DmaMapper};

/// The error of mapper `mapper` failing to map `[vaddr, vaddr + len)`.
fn fail(mapper: &str, vaddr: usize, len: usize, reason: String) -> DmaError {
    DmaError::MapperFailed {
        mapper: mapper.to_string(),
        vaddr,
        len,
        reason,
    }
}

/// The smallest IOMMU page size in a `iova_pgsizes` bitmap (4 KiB if none reported).
fn min_pgsize(pgsizes: u64) -> u64 {
    if pgsizes == 0 {
        4096
    } else {
        1 << pgsizes.trailing_zeros()
    }
}

/// The IOVA alignment for a region: the largest IOMMU page size that is no larger than
/// the region and divides its virtual address, so the IOMMU can use its largest pages.
fn iova_align(pgsizes: u64, vaddr: usize, len: u64) -> u64 {
    let mut best = min_pgsize(pgsizes);
    for bit in 0..64 {
        let p = 1u64 << bit;
        if pgsizes & p != 0 && p <= len && (vaddr as u64) % p == 0 {
            best = best.max(p);
        }
    }
    best
}

/// DMA through the IOMMU (type1 v2).
pub(crate) struct Type1Mapper {
    group: Arc<Group>,
    name: String,
    pgsizes: u64,
    iova: Mutex<IovaAllocator>,
}

impl Type1Mapper {
    pub fn new(group: Arc<Group>, name: String, pgsizes: u64, ranges: &[(u64, u64)]) -> Self {
        Type1Mapper {
            group,
            name,
            pgsizes,
            iova: Mutex::new(IovaAllocator::new(ranges, super::iova::PREFERRED_FLOOR)),
        }
    }
}

impl DmaMapper for Type1Mapper {
    fn map(&self, vaddr: NonNull<u8>, len: usize) -> Result<u64, DmaError> {
        let va = vaddr.as_ptr() as usize;
        let min = min_pgsize(self.pgsizes);
        if len == 0 || (va as u64) % min != 0 || (len as u64) % min != 0 {
            return Err(fail(
                &self.name,
                va,
                len,
                format!("address and length must be multiples of the iommu page size {min}"),
            ));
        }
        let Some(container) = self.group.container() else {
            return Err(fail(
                &self.name,
                va,
                len,
                "the group has no container".into(),
            ));
        };
        let align = iova_align(self.pgsizes, va, len as u64);
        let iova = self
            .iova
            .lock()
            .unwrap()
            .alloc(len as u64, align)
            .ok_or_else(|| {
                fail(
                    &self.name,
                    va,
                    len,
                    format!("no free iova range of {len} bytes aligned to {align:#x} is left"),
                )
            })?;
        // SAFETY: the region is memory the dma layer mapped, owns and keeps mapped until
        // it calls `unmap` (Region::drop unmaps before munmap); by the dma module's rules
        // no reference to it exists.
        match unsafe { container.map_dma(va, iova, len as u64) } {
            Ok(()) => {
                tracing::debug!(mapper = %self.name, iova, len, "dma map");
                Ok(iova)
            }
            Err(e) => {
                self.iova.lock().unwrap().free(iova, len as u64);
                match e.raw_os_error() {
                    // type1 pins the pages and counts them against RLIMIT_MEMLOCK.
                    Some(libc::ENOMEM) => Err(DmaError::MemlockLimit {
                        len,
                        limit: crate::hw::dma::memlock_limit_text(),
                    }),
                    Some(libc::ENOSPC) => Err(fail(
                        &self.name,
                        va,
                        len,
                        "too many dma mappings (vfio_iommu_type1 dma_entry_limit); use larger regions"
                            .into(),
                    )),
                    _ => Err(fail(
                        &self.name,
                        va,
                        len,
                        format!("VFIO_IOMMU_MAP_DMA at iova {iova:#x} failed: {e}"),
                    )),
                }
            }
        }
    }

    fn unmap(&self, iova: u64, len: usize) {
        let Some(container) = self.group.container() else {
            return;
        };
        match container.unmap_dma(iova, len as u64) {
            Ok(n) if n == len as u64 => self.iova.lock().unwrap().free(iova, n),
            // The IOVA range is not reused: what the kernel still maps there is unknown.
            Ok(n) => tracing::error!(
                mapper = %self.name,
                "VFIO_IOMMU_UNMAP_DMA at iova {iova:#x} unmapped {n} of {len} bytes"
            ),
            Err(e) => tracing::error!(
                mapper = %self.name,
                "VFIO_IOMMU_UNMAP_DMA at iova {iova:#x} ({len} bytes) failed: {e}"
            ),
        }
    }

    fn name(&self) -> String {
        self.name.clone()
    }
}

/// `/proc/self/pagemap` entry bits (Documentation/admin-guide/mm/pagemap.rst).
const PM_PRESENT: u64 = 1 << 63;
const PM_SWAPPED: u64 = 1 << 62;
const PM_PFN_MASK: u64 = (1 << 55) - 1;
/// pagemap has one entry per base page.
const BASE_PAGE: usize = 4096;

/// Checks pagemap entries of consecutive base pages: all present, not swapped, with
/// consecutive frame numbers. Returns the physical address of the first page.
pub(crate) fn contiguous_phys(entries: &[u64]) -> Result<u64, String> {
    let first = *entries.first().ok_or("empty range")?;
    let pfn0 = first & PM_PFN_MASK;
    for (i, &e) in entries.iter().enumerate() {
        if e & PM_PRESENT == 0 || e & PM_SWAPPED != 0 {
            return Err(format!(
                "page {i} is not resident (pagemap entry {e:#x}); dma memory must be locked"
            ));
        }
        let pfn = e & PM_PFN_MASK;
        if pfn == 0 {
            return Err(
                "/proc/self/pagemap shows no frame numbers: reading physical \
                        addresses needs CAP_SYS_ADMIN; run as root"
                    .into(),
            );
        }
        if pfn != pfn0 + i as u64 {
            return Err(format!(
                "not physically contiguous: page {i} is at frame {pfn:#x}, expected {:#x}",
                pfn0 + i as u64
            ));
        }
    }
    Ok(pfn0 * BASE_PAGE as u64)
}

/// DMA without an IOMMU: IOVA = physical address.
pub(crate) struct NoIommuMapper {
    _group: Option<Arc<Group>>,
    name: String,
    page_size: usize,
    pagemap: Mutex<Option<File>>,
}

impl NoIommuMapper {
    /// A mapper for regions of single hugepages of `page_size` bytes.
    pub fn new(group: Option<Arc<Group>>, name: String, page_size: usize) -> Self {
        NoIommuMapper {
            _group: group,
            name,
            page_size,
            pagemap: Mutex::new(None),
        }
    }

    /// Reads the pagemap entries of `[vaddr, vaddr + len)`.
    fn entries(&self, vaddr: usize, len: usize) -> Result<Vec<u64>, String> {
        let mut pm = self.pagemap.lock().unwrap();
        if pm.is_none() {
            *pm = Some(
                File::open("/proc/self/pagemap")
                    .map_err(|e| format!("cannot open /proc/self/pagemap: {e}"))?,
            );
        }
        let f = pm.as_ref().expect("opened above");
        let n = len / BASE_PAGE;
        let mut bytes = vec![0u8; n * 8];
        f.read_exact_at(&mut bytes, (vaddr / BASE_PAGE * 8) as u64)
            .map_err(|e| format!("cannot read /proc/self/pagemap: {e}"))?;
        Ok(bytes
            .chunks_exact(8)
            .map(|c| u64::from_ne_bytes(c.try_into().expect("8-byte chunk")))
            .collect())
    }
}

impl DmaMapper for NoIommuMapper {
    fn map(&self, vaddr: NonNull<u8>, len: usize) -> Result<u64, DmaError> {
        let va = vaddr.as_ptr() as usize;
        if len == 0 || len > self.page_size || va % self.page_size != 0 {
            return Err(fail(
                &self.name,
                va,
                len,
                format!(
                    "noiommu dma regions must be one {}-byte hugepage, aligned",
                    self.page_size
                ),
            ));
        }
        let entries = self
            .entries(va, len.next_multiple_of(BASE_PAGE))
            .map_err(|r| fail(&self.name, va, len, r))?;
        let phys = contiguous_phys(&entries).map_err(|r| fail(&self.name, va, len, r))?;
        tracing::debug!(mapper = %self.name, phys, len, "noiommu dma region");
        Ok(phys)
    }

    fn unmap(&self, _iova: u64, _len: usize) {}

    fn name(&self) -> String {
        self.name.clone()
    }

    fn max_region_len(&self) -> usize {
        self.page_size
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::hw::dma::{DmaPool, DmaPoolOptions, PageKind};

    #[test]
    fn alignment_follows_region() {
        let pg = 0x4020_1000; // 4K | 2M | 1G, as QEMU's intel-iommu reports
        assert_eq!(min_pgsize(pg), 4096);
        assert_eq!(min_pgsize(0), 4096);
        assert_eq!(iova_align(pg, 0x7f00_0020_0000, 2 << 20), 2 << 20);
        assert_eq!(iova_align(pg, 0x7f00_0020_0000, 8 << 20), 2 << 20);
        assert_eq!(iova_align(pg, 0x7f00_4000_0000, 1 << 30), 1 << 30);
        assert_eq!(
            iova_align(pg, 0x7f00_0000_1000, 2 << 20),
            4096,
            "vaddr not 2M aligned"
        );
        assert_eq!(iova_align(pg, 0x7f00_0020_0000, 64 << 10), 4096);
        assert_eq!(iova_align(0x1000, 0x7f00_4000_0000, 1 << 30), 4096);
    }

    #[test]
    fn pagemap_contiguity() {
        let e = |pfn: u64| PM_PRESENT | pfn;
        assert_eq!(
            contiguous_phys(&[e(0x100), e(0x101), e(0x102)]),
            Ok(0x10_0000)
        );
        let gap = contiguous_phys(&[e(0x100), e(0x101), e(0x200)]).unwrap_err();
        assert!(
            gap.contains("page 2 is at frame 0x200, expected 0x102"),
            "{gap}"
        );
        let absent = contiguous_phys(&[e(0x100), 0x101]).unwrap_err();
        assert!(absent.contains("page 1 is not resident"), "{absent}");
        let unpriv = contiguous_phys(&[PM_PRESENT]).unwrap_err();
        assert!(unpriv.contains("CAP_SYS_ADMIN"), "{unpriv}");
        assert!(contiguous_phys(&[]).is_err());
    }

    #[test]
    fn noiommu_refuses_regions_larger_than_a_hugepage() {
        let m = NoIommuMapper::new(None, "vfio noiommu test".into(), 2 << 20);
        assert_eq!(m.max_region_len(), 2 << 20);
        let e = m
            .map(NonNull::new(0x4000_0000 as *mut u8).unwrap(), 4 << 20)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("vfio noiommu test") && e.contains("2097152-byte hugepage"),
            "{e}"
        );
    }

    #[test]
    fn noiommu_reads_physical_addresses_of_a_real_hugepage() {
        // Needs root (pagemap frame numbers) and a free 2 MiB hugepage; uses one if there,
        // never changes the pool.
        if crate::hw::vfio::sys::euid() != 0 {
            eprintln!("skipped: reading physical addresses needs root");
            return;
        }
        let free =
            std::fs::read_to_string("/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages")
                .ok()
                .and_then(|s| s.trim().parse::<u64>().ok())
                .unwrap_or(0);
        if free == 0 {
            eprintln!("skipped: no free 2 MiB hugepage (echo 1 > /proc/sys/vm/nr_hugepages)");
            return;
        }
        let mapper = Arc::new(NoIommuMapper::new(
            None,
            "vfio noiommu test".into(),
            2 << 20,
        ));
        let pool = DmaPool::new(
            mapper,
            DmaPoolOptions {
                page_kind: PageKind::Huge2M,
                region_len: 2 << 20,
                max_bytes: 2 << 20,
            },
        );
        let buf = match pool.alloc(2 << 20) {
            Ok(b) => b,
            Err(e) => {
                eprintln!("skipped: hugepage allocation failed: {e}");
                return;
            }
        };
        assert_ne!(buf.iova(), 0);
        assert_eq!(
            buf.iova() % (2 << 20),
            0,
            "a 2 MiB hugepage is 2 MiB aligned physically"
        );
        assert_ne!(
            buf.iova(),
            buf.as_ptr() as u64,
            "iova is physical, not virtual"
        );
    }
}

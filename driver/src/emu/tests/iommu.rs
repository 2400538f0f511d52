//! The IOMMU: IOVAs, unmapped buffers, memory mapped late.

use super::*;

/// A second DMA pool on the controller's mapper (its own 64 KiB IOMMU mapping).
fn second_pool(h: &H) -> DmaPool {
    DmaPool::new(
        h.emu.mapper(),
        DmaPoolOptions {
            region_len: 64 << 10,
            ..Default::default()
        },
    )
}

#[test]
fn iommu_hands_out_iovas_apart_from_vaddrs_and_unmaps() {
    let h = H::new(small_cfg());
    let b = h.buf(4096);
    assert!(b.iova() >= IOVA_BASE);
    assert_ne!(b.iova(), b.as_ptr() as u64);
    let iommu = h.emu.iommu();
    assert_eq!(iommu.lookup(b.iova(), 4096), Some(b.as_ptr() as usize));
    assert_eq!(iommu.lookup(b.as_ptr() as u64, 1), None);
    let n = iommu.mappings();
    // A second pool grows a new mapping; dropping it unmaps (waiting for the controller).
    let p2 = second_pool(&h);
    let x = p2.alloc(4096).unwrap();
    let xi = x.iova();
    assert_eq!(iommu.mappings(), n + 1);
    drop(x);
    drop(p2);
    assert_eq!(iommu.mappings(), n);
    assert_eq!(iommu.lookup(xi, 1), None);
}

#[test]
fn unmapped_buffer_is_a_data_transfer_error() {
    let mut h = H::new(small_cfg());
    let mut q = h.pair(1, 8);
    let p2 = second_pool(&h);
    let x = p2.alloc(4096).unwrap();
    let xi = x.iova();
    assert_ok(&h.io(&mut q, Sqe::write(1, 0, 1, xi, 0)));
    drop(x);
    drop(p2);
    assert_status(
        &h.io(&mut q, Sqe::write(1, 0, 1, xi, 0)),
        Status::DATA_TRANSFER_ERROR,
    );
}

#[test]
fn memory_mapped_after_enable_is_usable_at_once() {
    // A buffer mapped just before its doorbell must translate even if the controller's
    // snapshot is older (slow path).
    let mut h = H::new(small_cfg());
    let mut q = h.pair(1, 64);
    for i in 0..50u64 {
        let p = DmaPool::new(
            h.emu.mapper(),
            DmaPoolOptions {
                region_len: 4096,
                ..Default::default()
            },
        );
        let b = p.alloc(4096).unwrap();
        assert_ok(&h.io(&mut q, Sqe::read(1, i, 1, b.iova(), 0)));
    }
}

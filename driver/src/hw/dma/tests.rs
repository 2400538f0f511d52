use super::*;

fn pool(max: usize) -> DmaPool {
    DmaPool::new(
        Arc::new(IdentityMapper),
        DmaPoolOptions {
            page_kind: PageKind::Small,
            region_len: 64 * 1024,
            max_bytes: max,
        },
    )
}

#[test]
fn alloc_copy_free_and_coalesce() {
    let p = pool(1 << 20);
    let mut a = p.alloc(4096).unwrap();
    let b = p.alloc(8192).unwrap();
    assert_eq!(a.iova() % 4096, 0);
    assert_ne!(a.iova(), b.iova());
    a.write_at(10, b"kestrel").unwrap();
    let mut out = [0u8; 7];
    a.read_at(10, &mut out).unwrap();
    assert_eq!(&out, b"kestrel");
    assert!(a.write_at(4090, b"too long").is_err());
    assert!(a.read_at(usize::MAX, &mut out).is_err());
    assert_eq!(p.used_bytes(), 12288);
    drop(a);
    drop(b);
    assert_eq!(p.used_bytes(), 0);
    // After coalescing, the whole region is one run again.
    let c = p.alloc(64 * 1024).unwrap();
    assert_eq!(p.regions().len(), 1);
    assert!(p.contains(c.as_ptr() as usize, 64 * 1024));
    assert!(!p.contains(c.as_ptr() as usize, 64 * 1024 + 1));
}

#[test]
fn new_buffers_are_zeroed_and_limit_holds() {
    let p = pool(128 * 1024);
    let mut a = p.alloc(4096).unwrap();
    a.fill(0xAB);
    drop(a);
    let a = p.alloc(4096).unwrap();
    assert!(a.to_vec().iter().all(|&x| x == 0));
    let _big = p.alloc(64 * 1024).unwrap();
    assert!(matches!(
        p.alloc(64 * 1024),
        Err(DmaError::PoolExhausted { .. })
    ));
    assert!(matches!(p.alloc(0), Err(DmaError::InvalidLength { .. })));
}

#[test]
fn hugepage_and_memlock_messages_say_what_to_do() {
    let e = DmaError::NoHugepages {
        page_kib: 2048,
        len: 8 << 20,
        pages: 4,
        free: 1,
        total: 10,
        suggest: 13,
    }
    .to_string();
    assert!(
        e.contains("no free 2048 KiB hugepages for a 8388608-byte dma region"),
        "{e}"
    );
    assert!(e.contains("it needs 4, and 1 of 10 are free"), "{e}");
    assert!(
        e.contains("`echo 13 > /sys/kernel/mm/hugepages/hugepages-2048kB/nr_hugepages`"),
        "{e}"
    );
    assert!(e.contains("`HUGEMEM=26 scripts/setup.sh config`"), "{e}");
    // `vm.nr_hugepages` counts pages of the default size only.
    assert_eq!(
        e.contains("`sysctl -w vm.nr_hugepages=13`"),
        crate::hw::limits::default_hugepage_kib() == Some(2048),
        "{e}"
    );
    let e = DmaError::NoHugepages {
        page_kib: 1 << 20,
        len: 1 << 30,
        pages: 1,
        free: 0,
        total: 0,
        suggest: 1,
    }
    .to_string();
    assert!(
        e.contains("hugepages-1048576kB") && e.contains("hugepagesz=1G"),
        "{e}"
    );
    assert!(!e.contains("HUGEMEM"), "{e}");
    let e = DmaError::MemlockLimit {
        len: 4096,
        limit: "65536 bytes".into(),
    }
    .to_string();
    assert!(e.contains("cannot lock 4096 bytes"), "{e}");
    assert!(
        e.contains("is 65536 bytes") && e.contains("ulimit -l unlimited"),
        "{e}"
    );
    assert!(e.contains("LimitMEMLOCK=infinity"), "{e}");
    assert!(e.contains("/etc/security/limits.conf"), "{e}");
    assert_eq!(
        memlock_limit_text(),
        crate::hw::limits::Limit::Memlock.text()
    );
}

#[test]
fn exhausted_hugepages_are_an_error_naming_the_pool() {
    // Only meaningful where no 2 MiB hugepage is free (the usual case without setup).
    let free = read_hugepage_counter(2048, "free_hugepages");
    if free > 0 {
        eprintln!("skipped: {free} 2 MiB hugepages are free, so the mmap would succeed");
        return;
    }
    let p = DmaPool::new(
        Arc::new(IdentityMapper),
        DmaPoolOptions {
            page_kind: PageKind::Huge2M,
            region_len: 2 << 20,
            max_bytes: 4 << 20,
        },
    );
    let e = p.alloc(4096).unwrap_err();
    assert!(
        matches!(
            e,
            DmaError::NoHugepages {
                page_kib: 2048,
                pages: 1,
                free: 0,
                ..
            }
        ),
        "{e:?}"
    );
    let m = e.to_string();
    assert!(m.contains("hugepages-2048kB/nr_hugepages"), "{m}");
}

#[test]
fn slices() {
    let p = pool(1 << 20);
    let a = p.alloc(16384).unwrap();
    let s = a.slice(4096, 512).unwrap();
    assert_eq!(s.iova, a.iova() + 4096);
    assert_eq!(s.len, 512);
    assert!(a.slice(16000, 512).is_err());
    assert!(s.sub(0, 513).is_none());
}

#[test]
fn a_slice_lies_in_its_own_region_only() {
    let base = 0x10_0000usize;
    let s = |vaddr: usize, len: usize, region_vaddr: usize| DmaSlice {
        region_vaddr,
        ..DmaSlice::unleased(vaddr, 0, len)
    };
    assert!(s(base, 4096, base).lies_in(base, 8192));
    assert!(
        s(base + 4096, 4096, base).lies_in(base, 8192),
        "ends at the end"
    );
    assert!(
        !s(base + 4097, 4096, base).lies_in(base, 8192),
        "runs past the end"
    );
    assert!(!s(base - 1, 16, base).lies_in(base, 8192), "starts before");
    assert!(
        !s(base, 4096, base + 1).lies_in(base, 8192),
        "names another region"
    );
    assert!(
        !s(usize::MAX - 8, 16, base).lies_in(base, 8192),
        "wraps around"
    );
}

//! Namespace formats: metadata, protection information, zoned namespaces.

use super::*;
#[test]
fn reports_formats_it_does_not_execute_and_refuses_their_io() {
    let fmt = EmuFormat {
        ms: 8,
        extended: false,
        pi_type: 1,
        pi_first: false,
        csi: 0,
    };
    let mut h = H::new(EmuConfig {
        namespaces: vec![
            EmuNamespace::new(8 << 20, 4096, EmuStore::Memory),
            EmuNamespace {
                format: fmt,
                ..EmuNamespace::new(8 << 20, 512, EmuStore::Memory)
            },
            EmuNamespace {
                format: EmuFormat {
                    csi: crate::spec::csi::ZONED,
                    ..Default::default()
                },
                ..EmuNamespace::new(8 << 20, 4096, EmuStore::Memory)
            },
        ],
        ..Default::default()
    });
    let id = h.id_ns(2);
    let f = crate::spec::NsFormat::of(&id, 0);
    assert_eq!((f.lbaf_index, f.lbads, f.ms, f.extended), (2, 9, 8, false));
    assert_eq!((f.pi_type, f.pi_first), (1, false));
    for (nsid, want) in [(1, 0u8), (2, 0), (3, crate::spec::csi::ZONED)] {
        let (c, b) = h.identify(cns::NS_ID_DESCRIPTORS, nsid);
        assert_ok(&c);
        let d = crate::spec::NsIdDescriptors::parse(b[..].try_into().unwrap());
        assert_eq!(d.csi, Some(want), "nsid {nsid}");
        assert_eq!(d.nguid, Some(h.id_ns(nsid).nguid));
    }
    let (c, _) = h.identify(cns::NS_ID_DESCRIPTORS, 4);
    assert_status(&c, Status::INVALID_NAMESPACE_OR_FORMAT);
    let mut q = h.pair(1, 16);
    let b = h.buf(4096);
    for nsid in [2, 3] {
        for s in [
            Sqe::read(nsid, 0, 1, b.iova(), 0),
            Sqe::write(nsid, 0, 1, b.iova(), 0),
            Sqe::flush(nsid),
        ] {
            let c = h.io(&mut q, s);
            assert_status(&c, Status::INVALID_NAMESPACE_OR_FORMAT);
        }
    }
    assert_ok(&h.io(&mut q, Sqe::write(1, 0, 1, b.iova(), 0)));
}

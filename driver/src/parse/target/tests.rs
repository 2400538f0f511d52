use super::*;

#[test]
fn targets() {
    assert_eq!(parse_target("emu"), Ok(TargetSpec::Emu(EmuSpec::default())));
    assert_eq!(
        parse_target("emu:"),
        Ok(TargetSpec::Emu(EmuSpec::default()))
    );
    for s in [
        "pci:0000:01:00.0",
        "01:00.0",
        "pci:0:1:0.0",
        " pci:0000:01:00.0 ",
    ] {
        assert_eq!(
            parse_target(s),
            Ok(TargetSpec::Pci {
                bdf: "0000:01:00.0".into(),
                nsid: None
            }),
            "{s}"
        );
    }
    assert_eq!(
        parse_target("file:/tmp/x.img,size=1G,direct=off"),
        Ok(TargetSpec::File(FileSpec {
            path: "/tmp/x.img".into(),
            size: Some(1 << 30),
            direct: Some(false)
        }))
    );
    assert_eq!(
        parse_target("file:/dev/nvme0n1"),
        Ok(TargetSpec::File(FileSpec {
            path: "/dev/nvme0n1".into(),
            size: None,
            direct: None
        }))
    );
    // Options in any order, faults among them (its grammar has no comma).
    let e = parse_target(
        "emu:size=64M,lba=512,namespaces=2,faults=status/read/read-error/1%+seed/7,latency=1.5us,store=null,mdts=5,queues=8,core=1",
    )
    .unwrap();
    assert_eq!(
        e,
        TargetSpec::Emu(EmuSpec {
            size: Some(64 << 20),
            lba: Some(512),
            namespaces: Some(2),
            latency: Some(Duration::from_nanos(1500)),
            store: Some(StoreSpec::Null),
            mdts: Some(5),
            queues: Some(8),
            core: Some(CoreSpec::Core(1)),
            faults: Some("status/read/read-error/1%+seed/7".into()),
            ..Default::default()
        })
    );
    assert_eq!(
        parse_target("emu:store=/tmp/s.img,core=none"),
        Ok(TargetSpec::Emu(EmuSpec {
            store: Some(StoreSpec::File("/tmp/s.img".into())),
            core: Some(CoreSpec::None),
            ..Default::default()
        }))
    );
}

#[test]
fn namespace_definitions_and_selection() {
    let TargetSpec::Emu(e) = parse_target(
        "emu:lba=512,ns=256M+4096+md8+pi1,ns=64M,ns=32M+md16+ext+pi3+pifirst+zeropi,ns=1G+4096+zoned+zone64M+open4+active8,ns=4M+csi1,ns=8M+zone2M+zcap1536K/ns=2",
    )
    .unwrap() else {
        panic!("not emu")
    };
    assert_eq!(e.nsid, Some(2));
    assert_eq!(e.lba, Some(512));
    let base = EmuNsSpec {
        size: 0,
        lba: None,
        ms: 0,
        extended: false,
        pi_type: 0,
        pi_first: false,
        zeroed_pi: false,
        pif: 0,
        zoned: false,
        zone_size: None,
        zone_capacity: None,
        max_open: 0,
        max_active: 0,
        csi: None,
    };
    assert_eq!(
        e.ns,
        vec![
            EmuNsSpec {
                size: 256 << 20,
                lba: Some(4096),
                ms: 8,
                pi_type: 1,
                ..base.clone()
            },
            EmuNsSpec {
                size: 64 << 20,
                ..base.clone()
            },
            EmuNsSpec {
                size: 32 << 20,
                ms: 16,
                extended: true,
                pi_type: 3,
                pi_first: true,
                zeroed_pi: true,
                ..base.clone()
            },
            EmuNsSpec {
                size: 1 << 30,
                lba: Some(4096),
                zoned: true,
                zone_size: Some(64 << 20),
                max_open: 4,
                max_active: 8,
                ..base.clone()
            },
            EmuNsSpec {
                size: 4 << 20,
                csi: Some(1),
                ..base.clone()
            },
            EmuNsSpec {
                size: 8 << 20,
                zoned: true,
                zone_size: Some(2 << 20),
                zone_capacity: Some(1536 << 10),
                ..base.clone()
            },
        ]
    );
    assert_eq!(e.ns[3].csi(), 2);
    assert_eq!(e.ns[4].csi(), 1);
    assert_eq!(e.ns[0].csi(), 0);
    for (s, nsid) in [
        ("pci:0000:01:00.0/ns=3", Some(3)),
        ("01:00.0/ns=1", Some(1)),
        ("pci:0000:01:00.0", None),
    ] {
        let t = parse_target(s).unwrap();
        assert_eq!(
            t,
            TargetSpec::Pci {
                bdf: "0000:01:00.0".into(),
                nsid
            },
            "{s}"
        );
        assert_eq!(t.nsid(), nsid);
    }
    assert_eq!(
        parse_target("pci:01:00.0/ns=7").unwrap().to_string(),
        "pci:0000:01:00.0/ns=7"
    );
    assert_eq!(parse_target("emu/ns=1").unwrap().nsid(), Some(1));
    assert_eq!(
        parse_target("emu:namespaces=3/ns=3").unwrap().to_string(),
        "emu/ns=3"
    );
    // A store path with "/ns=" in it that is not a namespace number stays a path.
    assert_eq!(
        parse_target("emu:store=/tmp/ns=a/x.img").unwrap(),
        TargetSpec::Emu(EmuSpec {
            store: Some(StoreSpec::File("/tmp/ns=a/x.img".into())),
            ..Default::default()
        })
    );
}

#[test]
fn refuses_with_reasons_and_the_grammar() {
    for (s, want) in [
        ("emu:lba=1024", "512 and 4096"),
        ("emu:size=4q", "invalid size"),
        ("emu:size=0", "at least one block"),
        ("emu:size=1000,lba=4096", "whole number of 4096-byte blocks"),
        (
            "emu:size=1000",
            "whole number of 4096-byte blocks (lba= not given",
        ),
        ("emu:size=6K", "whole number of 4096-byte blocks"),
        ("emu:lba=512,size=1000", "whole number of 512-byte blocks"),
        ("emu:namespaces=0", "1 to 64"),
        ("emu:namespaces=65", "1 to 64"),
        ("emu:size=1G,size=2G", "given twice"),
        ("emu:bogus=1", "unknown option 'bogus'"),
        ("emu:size", "has no value"),
        ("emu:size=1G,,lba=512", "empty option"),
        ("emu:latency=10", "a unit is required"),
        ("emu:mdts=16", "0 (no limit) to 15"),
        ("emu:core=4096", "0 to 4095"),
        ("emu:faults=", "faults= is empty"),
        ("emu:ns=", "starts with no size"),
        ("emu:ns=0", "at least one block"),
        ("emu:ns=1M+1024", "unknown attribute '+1024'"),
        ("emu:ns=1M+md0", "at least 1 byte"),
        ("emu:ns=1M+md257", "0 to 256"),
        ("emu:ns=1M+mdx", "unknown attribute '+mdx'"),
        ("emu:ns=1M+open", "open needs a number"),
        ("emu:ns=1M+ext", "needs metadata"),
        ("emu:ns=1M+md4+pi1", "at least 8 bytes of metadata"),
        ("emu:ns=1M+md8+pi4", "0 to 3"),
        ("emu:ns=1M+md8+pi0", "types are 1, 2 and 3"),
        ("emu:ns=1M+pifirst", "needs a protection type"),
        ("emu:ns=1M+md8+zeropi", "+zeropi: needs a protection type"),
        ("emu:ns=1M+md8+pi1+zeropi+zeropi", "zeropi is given twice"),
        ("emu:ns=1M+open2", "only a zoned namespace"),
        ("emu:ns=1M+zoned+open4+active2", "more open zones"),
        ("emu:ns=1M+zone3M", "divide the namespace size"),
        ("emu:ns=1M+zone0", "at least one block"),
        ("emu:ns=1M+zcap0", "at least one block"),
        ("emu:ns=2M+zone1M+zcap2M", "more than the zone size"),
        ("emu:ns=2M+4096+zcap6K", "whole number of 4096-byte blocks"),
        (
            "emu:ns=2M+zcap6K",
            "capacity of 6144 bytes is not a whole number",
        ),
        ("emu:ns=2M+zcap1M+zcap512K", "zcap is given twice"),
        ("emu:ns=1M+md8+md16", "md is given twice"),
        ("emu:ns=1M+512+4096", "lba is given twice"),
        ("emu:ns=1000+512", "whole number of 512-byte blocks"),
        ("emu:ns=6K", "whole number of 4096-byte blocks"),
        ("emu:ns=1M+csi256", "0 to 255"),
        ("emu:ns=1M+bogus", "known: 512, 4096, mdN"),
        ("emu:ns=1M,namespaces=2", "leave out namespaces= and size="),
        ("emu:size=1M,ns=1M", "leave out namespaces= and size="),
        ("emu:ns=1M,ns=1M/ns=3", "given 2 namespaces (nsid 1 to 2)"),
        ("emu/ns=2", "given 1 namespace (nsid 1 to 1)"),
        ("pci:0000:01:00.0/ns=0", "from 1 to 4294967294"),
        ("pci:0000:01:00.0/ns=x", "from 1 to 4294967294"),
        ("emu/ns=", "from 1 to 4294967294"),
        ("file:", "needs a path"),
        ("file:/x,direct=maybe", "on or off"),
        ("file:/x,o_direct=on", "unknown option"),
        ("file:/x,size=0", "at least one block"),
        ("pci:zz", "not a PCI address"),
        ("pci:00:1g.0", "not a PCI address"),
        ("nvme0", "no known kind"),
        ("", "it is empty"),
    ] {
        let e = parse_target(s).unwrap_err().to_string();
        assert!(e.contains(want), "{s}: {e}");
        assert!(e.contains(&format!("'{s}'")), "{s}: {e}");
        assert!(e.contains("expected pci:"), "{s}: {e}");
    }
    let e = parse_target(&"x".repeat(MAX_SPEC_LEN + 1))
        .unwrap_err()
        .to_string();
    assert!(e.contains("longer than 4096 bytes"), "{e}");
}

#[test]
fn parsers_never_panic() {
    // A cheap deterministic sweep over short strings of the interesting characters.
    let alphabet = b"0129aAfkKMGiBx:.,-=[]eumfilpcsz\xc2\xb5";
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..20_000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let len = (x % 12) as usize;
        let bytes: Vec<u8> = (0..len)
            .map(|i| alphabet[((x >> (i * 5)) as usize) % alphabet.len()])
            .collect();
        let s = String::from_utf8_lossy(&bytes);
        let _ = parse_size(&s);
        let _ = parse_duration(&s);
        let _ = super::super::parse_cores(&s);
        let _ = parse_bdf(&s);
        let _ = parse_target(&s);
        let _ = parse_target(&format!("emu:{s}"));
    }
}

#[test]
fn null_targets() {
    let n = |size, lba| {
        Ok(TargetSpec::Null(NullSpec {
            size,
            lba,
            zero_reads: None,
        }))
    };
    assert_eq!(parse_target("null"), n(None, None));
    assert_eq!(parse_target("null:"), n(None, None));
    assert_eq!(parse_target(" null:size=256M "), n(Some(256 << 20), None));
    assert_eq!(
        parse_target("null:lba=512,size=1M"),
        n(Some(1 << 20), Some(512))
    );
    assert_eq!(parse_target("null:lba=4k"), n(None, Some(4096)));
    assert_eq!(parse_target("null:size=1M").unwrap().to_string(), "null");
    for (s, zero) in [("null:fill=zero", true), ("null:size=1M,fill=none", false)] {
        let Ok(TargetSpec::Null(spec)) = parse_target(s) else {
            panic!("{s} is not a null target");
        };
        assert_eq!(spec.zero_reads, Some(zero), "{s}");
    }
    for (s, why) in [
        ("null:size=0", "size=0"),
        ("null:size=1000", "not a whole number of 4096-byte blocks"),
        ("null:size=2048", "not a whole number of 4096-byte blocks"),
        (
            "null:lba=512,size=1000",
            "not a whole number of 512-byte blocks",
        ),
        ("null:lba=1024", "offers 512 and 4096"),
        (
            "null:fill=ones",
            "fill=ones: a null target's reads fill with zero (reads return zeroes) or none",
        ),
        ("null:fill=none,fill=zero", "given twice"),
        ("null:store=memory", "unknown option 'store' for null"),
        ("null:size=1M,size=2M", "given twice"),
        ("null:size", "has no value"),
        ("null/ns=1", "names no known kind"),
        ("nullx", "names no known kind"),
    ] {
        let e = parse_target(s).unwrap_err().to_string();
        assert!(e.contains(why), "{s}: {e}");
    }
}

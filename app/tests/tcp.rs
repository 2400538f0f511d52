//! `tcp:` targets through the command line, against `kestrel serve`'s target started in
//! this process on ephemeral loopback ports (two emulated namespaces in one subsystem, a
//! discovery listener): `perf --verify` with digests and 1 MiB I/Os split at MDTS,
//! `identify`, `list` of the discovery controller in text and JSON, and clear failures.

mod common;

use std::sync::Arc;

use common::{json, kestrel, stderr, stdout};
use kestrel::Target;
use kestrel_nvmf::{Limits, Server, ServerConfig, SubsystemConfig};

const NQN: &str = "nqn.2026-12.io.kestrel:cli";

fn server() -> Server {
    let namespaces: Vec<Arc<dyn Target>> = ["32M", "16M"]
        .iter()
        .map(|s| kestrel::target_spec::open(&format!("emu:size={s},core=none")).unwrap())
        .collect();
    Server::start(ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        discovery_listen: Some("127.0.0.1:0".parse().unwrap()),
        reactors: vec![None; 2],
        subsystems: vec![SubsystemConfig {
            nqn: NQN.into(),
            namespaces,
            allowed_hosts: Vec::new(),
            allow_any_host: true,
        }],
        limits: Limits::default(),
    })
    .unwrap()
}

#[test]
fn perf_verifies_both_namespaces_with_digests_and_1m_ios() {
    let s = server();
    let target = format!("tcp:{}/{NQN},digest=both,queue_size=32", s.local_addr());
    let o = kestrel(&[
        "perf",
        "--target",
        &target,
        "-t",
        "60",
        "--number-ios",
        "300",
        "--warmup",
        "0",
        "-w",
        "randrw",
        "-q",
        "4",
        "--io-size",
        "1M",
        "--cores",
        "0",
        "--verify",
        "--json",
    ]);
    let v = json(&o);
    let targets = v["targets"].as_array().unwrap();
    assert_eq!(targets.len(), 2, "both namespaces: {v}");
    for t in targets {
        assert_eq!(t["kind"], "nvme-tcp");
        assert!(t["outcomes"]["succeeded"].as_u64().unwrap() > 0, "{t}");
        assert_eq!(t["outcomes"]["errors"], 0, "{t}");
    }
    assert_eq!(v["verify"]["mismatches"], 0);
    assert_eq!(v["result"]["ok"], true);
}

#[test]
fn identify_describes_the_remote_controller() {
    let s = server();
    let target = format!("tcp:{}/{NQN}", s.local_addr());
    let v = json(&kestrel(&["identify", "--target", &target, "--json"]));
    assert_eq!(v["kind"], "nvme-tcp");
    assert_eq!(v["mdts_bytes"], 128 << 10);
    let ns = v["namespaces"].as_array().unwrap();
    assert_eq!(ns.len(), 2);
    assert_eq!(ns[0]["size_bytes"], 32 << 20);
    assert_eq!(ns[1]["size_bytes"], 16 << 20);
    let o = kestrel(&["identify", "--target", &format!("{target}/ns=2")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.contains("Namespace 2:") && !text.contains("Namespace 1:"),
        "{text}"
    );
}

#[test]
fn list_prints_what_the_discovery_controller_offers() {
    let s = server();
    let d = s.discovery_addr().unwrap();
    let o = kestrel(&["list", "--target", &format!("tcp:{d}")]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = stdout(&o);
    assert!(
        text.starts_with("Discovery Log Number of Records"),
        "{text}"
    );
    assert!(text.contains(&format!("subnqn   {NQN}")), "{text}");
    let v = json(&kestrel(&[
        "list",
        "--target",
        &format!("tcp:{d}"),
        "--json",
    ]));
    let recs = v["records"].as_array().unwrap();
    let nvm: Vec<_> = recs
        .iter()
        .filter(|r| r["subtype"] == "nvm subsystem")
        .collect();
    assert_eq!(nvm.len(), 1);
    assert_eq!(nvm[0]["target"], format!("tcp:{}/{NQN}", s.local_addr()));
    // The target string it prints opens the subsystem.
    let t = nvm[0]["target"].as_str().unwrap();
    assert!(kestrel(&["identify", "--target", t]).status.success());
}

#[test]
fn a_wrong_nqn_or_a_closed_port_is_a_clear_error() {
    let s = server();
    let o = kestrel(&[
        "identify",
        "--target",
        &format!("tcp:{}/nqn.2026-12.io.kestrel:nope", s.local_addr()),
    ]);
    assert!(!o.status.success());
    let e = stderr(&o);
    assert!(
        e.contains("refused") && e.contains("nqn.2026-12.io.kestrel:nope"),
        "{e}"
    );
    drop(s);
    let o = kestrel(&[
        "identify",
        "--target",
        "tcp:127.0.0.1:1/nqn.2026-12.io.kestrel:x",
    ]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("cannot connect"), "{}", stderr(&o));
    // A subsystem string without /NQN is a discovery controller: list it instead.
    let o = kestrel(&["perf", "--target", "tcp:127.0.0.1", "-t", "1"]);
    assert!(
        stderr(&o).contains("discovery controller"),
        "{}",
        stderr(&o)
    );
}

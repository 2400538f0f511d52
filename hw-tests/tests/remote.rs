//! The target cases over NVMe/TCP: `run_spec` on a `tcp:` subsystem of two emulated
//! namespaces that `kestrel serve`'s target exports on loopback, with digests on.

use std::sync::Arc;

use kestrel::Target;
use kestrel_hw_tests::targets::run_spec;
use kestrel_hw_tests::Outcome;
use kestrel_nvmf::{Limits, Server, ServerConfig, SubsystemConfig};

const NQN: &str = "nqn.2026-12.io.kestrel:suite";

fn server() -> Server {
    let namespaces: Vec<Arc<dyn Target>> = (0..2)
        .map(|_| kestrel::target_spec::open("emu:size=64M,core=none").unwrap())
        .collect();
    Server::start(ServerConfig {
        listen: "127.0.0.1:0".parse().unwrap(),
        discovery_listen: None,
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
fn target_cases_pass_over_nvme_tcp_on_every_namespace() {
    let s = server();
    let spec = format!("tcp:{}/{NQN},digest=both,queues=4", s.local_addr());
    let rows = run_spec(&spec, "");
    assert!(!rows.is_empty());
    let nsids: std::collections::BTreeSet<_> = rows.iter().filter_map(|r| r.nsid).collect();
    assert_eq!(nsids.into_iter().collect::<Vec<_>>(), [1, 2]);
    for r in &rows {
        assert!(
            matches!(r.outcome, Outcome::Pass),
            "{} on {} nsid {:?}: {:?}",
            r.name,
            r.target,
            r.nsid,
            r.outcome
        );
    }
}

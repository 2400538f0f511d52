//! The discovery controller: its Identify and the Discovery Log Page as nvme-cli reads it.

use kestrel_nvmf::fabrics::{self, DISCOVERY_NQN};

use crate::common::{identify, server, sqe, HOSTNQN, NQN};
use crate::host::Host;

#[test]
fn discovery_lists_the_subsystems() {
    let srv = server();
    let addr = srv.local_addr();
    let mut d = Host::connect(addr, false, false);
    let c = d.fabric_connect(0, 31, 0xffff, 0, 0, DISCOVERY_NQN, HOSTNQN);
    assert!(c.status.is_success());
    d.prop_set(fabrics::prop::CC, 1 | (6 << 16) | (4 << 20));
    let idc = identify(&mut d, 1, 0);
    assert_eq!(idc[111], 2, "CNTRLTYPE discovery");
    // The header first, then the whole page, as nvme-cli reads it.
    let mut s = sqe(0x02, 0);
    s[40..44].copy_from_slice(&(0x70u32 | (((1024 / 4) - 1) << 16)).to_le_bytes());
    let (c, hdr) = d.cmd(s, &[], false, 1024);
    assert!(c.status.is_success());
    let numrec = u64::from_le_bytes(hdr[8..16].try_into().unwrap());
    assert_eq!(
        numrec, 2,
        "the subsystem and the discovery subsystem itself"
    );
    let len = 1024 * (1 + numrec as u32);
    s[40..44].copy_from_slice(&(0x70u32 | ((len / 4 - 1) << 16)).to_le_bytes());
    let (c, page) = d.cmd(s, &[], false, len);
    assert!(c.status.is_success());
    let (_, _, entries) = fabrics::parse_discovery_log(&page).unwrap();
    assert_eq!(entries[0].subnqn, NQN);
    assert_eq!(entries[0].trtype, 3);
    assert_eq!(entries[0].traddr, "127.0.0.1");
    assert_eq!(entries[0].trsvcid, addr.port().to_string());
    assert_eq!(entries[1].subnqn, DISCOVERY_NQN);
    srv.shutdown();
}

//! NVMe/TCP in the app: `kestrel identify --target tcp:...` (a remote controller, described
//! as the local ones are) and `kestrel list --target tcp:HOST[:8009]` (what a discovery
//! controller offers, as `nvme discover` prints it, or JSON).

use std::fmt::Write as _;

use kestrel::spec::fabrics::DiscEntry;
use kestrel::spec::NsFormat;
use kestrel::target::tcp::TcpController;
use serde::Serialize;

use crate::error::{AppError, Result};
use crate::identify::{
    dealloc_reads, ControllerJson, FormatJson, Header, NamespaceJson, TargetJson,
};
use crate::parse::TargetSpec;
use crate::units::print_json;

/// A remote controller over NVMe/TCP, described as a local one is (`kind`: `nvme-tcp`).
pub fn describe(spec: &TargetSpec, c: &TcpController) -> TargetJson {
    let f = c.facts();
    let id = &f.identify;
    let selected = spec.nsid();
    let namespaces = c
        .namespaces()
        .iter()
        .filter(|ns| selected.is_none_or(|k| k == ns.info.nsid))
        .map(|ns| NamespaceJson {
            nsid: ns.info.nsid,
            lba_size: ns.info.block_size,
            size_lbas: ns.info.num_blocks,
            size_bytes: ns
                .info
                .num_blocks
                .checked_mul(u64::from(ns.info.block_size)),
            capacity_lbas: ns.identify.ncap,
            utilization_lbas: ns.identify.nuse,
            dlfeat: ns.identify.dlfeat,
            deallocated_reads: dealloc_reads(ns.identify.dlfeat),
            write_zeroes_deallocates: ns.identify.write_zeroes_deallocates(),
            format: FormatJson::of(&NsFormat::of(&ns.identify, 0)),
            io_supported: ns.unsupported.is_none(),
            unsupported_reason: ns.unsupported.clone(),
            io_protection: "none".into(),
            zoned: None,
        })
        .collect();
    TargetJson::Nvme(Box::new(ControllerJson::of(
        Header {
            kind: "nvme-tcp",
            target: spec.to_string(),
            transport: c.describe(),
            vs: f.vs.to_string(),
            cntlid: f.cntlid,
            cap: f.cap,
            max_transfer: f.max_transfer,
            io_queues: f.granted,
        },
        id,
        namespaces,
    )))
}

/// One discovery log entry, for `--json`.
#[derive(Serialize, Debug)]
pub struct DiscEntryJson {
    /// `tcp`, `rdma`, ... (TRTYPE).
    pub trtype: String,
    /// `ipv4` or `ipv6` (ADRFAM).
    pub adrfam: String,
    /// `nvm subsystem`, `discovery subsystem`, `current discovery subsystem` (SUBTYPE).
    pub subtype: String,
    /// PORTID.
    pub portid: u16,
    /// TRSVCID.
    pub trsvcid: String,
    /// SUBNQN.
    pub subnqn: String,
    /// TRADDR.
    pub traddr: String,
    /// CNTLID (65535: dynamic).
    pub cntlid: u16,
    /// ASQSZ.
    pub asqsz: u16,
    /// TSAS SECTYPE (0: none).
    pub sectype: u8,
    /// The target string that reaches it (NVM subsystems over TCP).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
}

/// `kestrel list --target tcp:HOST --json`.
#[derive(Serialize, Debug)]
pub struct DiscoveryJson {
    /// The discovery controller's target string.
    pub discovery: String,
    /// GENCTR.
    pub genctr: u64,
    /// The records.
    pub records: Vec<DiscEntryJson>,
}

fn entry_json(e: &DiscEntry) -> DiscEntryJson {
    use kestrel::spec::fabrics::{subtype, ADRFAM_IPV4, ADRFAM_IPV6, TRTYPE_TCP};
    let tcp = e.trtype == TRTYPE_TCP;
    let host = if e.adrfam == ADRFAM_IPV6 {
        format!("[{}]", e.traddr)
    } else {
        e.traddr.clone()
    };
    DiscEntryJson {
        trtype: match e.trtype {
            1 => "rdma".into(),
            2 => "fc".into(),
            3 => "tcp".into(),
            254 => "loop".into(),
            t => format!("{t}"),
        },
        adrfam: match e.adrfam {
            ADRFAM_IPV4 => "ipv4".into(),
            ADRFAM_IPV6 => "ipv6".into(),
            a => format!("{a}"),
        },
        subtype: match e.subtype {
            subtype::REFERRAL => "discovery subsystem referral".into(),
            subtype::NVM => "nvm subsystem".into(),
            subtype::CURRENT_DISCOVERY => "current discovery subsystem".into(),
            s => format!("{s}"),
        },
        portid: e.portid,
        trsvcid: e.trsvcid.clone(),
        subnqn: e.subnqn.clone(),
        traddr: e.traddr.clone(),
        cntlid: e.cntlid,
        asqsz: e.asqsz,
        sectype: e.sectype,
        target: (tcp && e.subtype == subtype::NVM)
            .then(|| format!("tcp:{host}:{}/{}", e.trsvcid, e.subnqn)),
    }
}

/// The log as `nvme discover` prints it.
pub fn render(d: &DiscoveryJson) -> String {
    let mut s = format!(
        "Discovery Log Number of Records {}, Generation counter {}\n",
        d.records.len(),
        d.genctr
    );
    for (i, r) in d.records.iter().enumerate() {
        let _ = writeln!(s, "=====Discovery Log Entry {i}======");
        for (k, v) in [
            ("trtype", r.trtype.clone()),
            ("adrfam", r.adrfam.clone()),
            ("subtype", r.subtype.clone()),
            ("portid", r.portid.to_string()),
            ("trsvcid", r.trsvcid.clone()),
            ("subnqn", r.subnqn.clone()),
            ("traddr", r.traddr.clone()),
            ("cntlid", r.cntlid.to_string()),
            ("asqsz", r.asqsz.to_string()),
            (
                "sectype",
                if r.sectype == 0 {
                    "none".into()
                } else {
                    r.sectype.to_string()
                },
            ),
        ] {
            let _ = writeln!(s, "{k:<8} {v}");
        }
        if let Some(t) = &r.target {
            let _ = writeln!(s, "{:<8} {t}", "target");
        }
    }
    s
}

/// `kestrel list --target tcp:HOST[:PORT]`: each discovery controller's log.
pub fn list(specs: &[TargetSpec], json: bool) -> Result<()> {
    let mut all = Vec::new();
    for spec in specs {
        let TargetSpec::Tcp(t) = spec else {
            return Err(AppError::usage(format!(
                "invalid value for '--target': kestrel list takes discovery controllers (tcp:HOST[:PORT]), not {spec}"
            )));
        };
        if !t.is_discovery() {
            return Err(AppError::usage(format!(
                "invalid value for '--target': {spec} names a subsystem; list takes its discovery controller: tcp:{}",
                t.address()
            )));
        }
        let opts = kestrel::target_spec::OpenOptions::default();
        let log = kestrel::target_spec::discover(t, &opts)
            .map_err(|e| AppError::runtime(e.to_string()))?;
        all.push(DiscoveryJson {
            discovery: spec.to_string(),
            genctr: log.genctr,
            records: log.entries.iter().map(entry_json).collect(),
        });
    }
    if json {
        return if all.len() == 1 {
            print_json(&all[0])
        } else {
            print_json(&all)
        };
    }
    for (i, d) in all.iter().enumerate() {
        if i > 0 {
            println!();
        }
        print!("{}", render(d));
    }
    Ok(())
}

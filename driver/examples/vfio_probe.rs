//! Smoke test of the VFIO path on a controller bound to vfio-pci: open it, bring it up,
//! print what Identify says, and with `--write` write and read back a few blocks of
//! namespace 1 through an I/O queue pair (destroying what was there).
//!
//! ```text
//! sudo PCI_ALLOWED=0000:01:00.0 scripts/setup.sh config
//! sudo cargo run --example vfio_probe -- 0000:01:00.0 [--noiommu] [--write]
//! ```
//!
//! Exits 0 when everything it tried worked.

use std::time::{Duration, Instant};

use kestrel::hw::transport::Transport;
use kestrel::hw::vfio::{VfioOptions, VfioTransport};
use kestrel::io::IoRequest;
use kestrel::{Controller, ControllerOptions, QpairOptions};

/// Blocks written and read back with `--write`.
const BLOCKS: u32 = 8;
/// How long to wait for one command.
const WAIT: Duration = Duration::from_secs(10);

fn main() {
    let mut bdf = None;
    let (mut noiommu, mut write) = (false, false);
    for a in std::env::args().skip(1) {
        match a.as_str() {
            "--noiommu" => noiommu = true,
            "--write" => write = true,
            _ if bdf.is_none() && !a.starts_with('-') => bdf = Some(a),
            _ => {
                eprintln!("usage: vfio_probe BDF [--noiommu] [--write]");
                std::process::exit(2);
            }
        }
    }
    let Some(bdf) = bdf else {
        eprintln!("usage: vfio_probe BDF [--noiommu] [--write]");
        std::process::exit(2);
    };
    if let Err(e) = run(&bdf, noiommu, write) {
        eprintln!("vfio_probe: {e}");
        std::process::exit(1);
    }
}

fn run(bdf: &str, noiommu: bool, write: bool) -> Result<(), Box<dyn std::error::Error>> {
    let opts = VfioOptions {
        noiommu,
        ..VfioOptions::default()
    };
    let t = VfioTransport::open(bdf, &opts)?;
    let bar = t.bar();
    println!(
        "{}: iommu group {}, bar0 {} bytes, CAP {:#018x}, VS {:#010x}",
        t.describe(),
        t.iommu_group(),
        bar.len(),
        bar.cap().0,
        bar.vs().0
    );
    let c = Controller::new(t.clone(), ControllerOptions::default())?;
    let id = c.identify();
    println!(
        "model {:?}, serial {:?}, firmware {:?}, mdts {}, {} i/o queues granted, shadow doorbells {}",
        id.mn,
        id.sn,
        id.fr,
        id.mdts,
        c.io_queues_granted(),
        c.shadow_doorbells()
    );
    for ns in c.namespaces() {
        println!(
            "namespace {}: {} blocks of {} bytes",
            ns.nsid, ns.num_blocks, ns.block_size
        );
    }
    if !write {
        return Ok(());
    }
    let ns = c.namespace(1)?.clone();
    let len = (BLOCKS * ns.block_size) as usize;
    let mut qp = c.create_io_qpair(&QpairOptions::default())?;
    let wbuf = qp.lend(c.dma_pool().alloc(len)?)?;
    let rbuf = qp.lend(c.dma_pool().alloc(len)?)?;
    let data: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4096) as u8).collect();
    qp.leases_mut().write(&wbuf, 0, &data)?;
    for (what, req) in [
        ("write", IoRequest::write(1, 0, BLOCKS, wbuf, 1)),
        ("read", IoRequest::read(1, 0, BLOCKS, rbuf, 2)),
    ] {
        qp.submit(req)?;
        qp.flush();
        let start = Instant::now();
        let mut done = None;
        while done.is_none() {
            qp.process_completions(1, &mut |cpl| done = Some(cpl.result));
            if start.elapsed() > WAIT {
                return Err(
                    format!("{what} of {BLOCKS} blocks did not complete in {WAIT:?}").into(),
                );
            }
        }
        done.expect("set above")?;
        println!(
            "{what} of {BLOCKS} blocks at lba 0 (iova {:#x}): ok in {:?}",
            if what == "write" {
                wbuf.iova()
            } else {
                rbuf.iova()
            },
            start.elapsed()
        );
    }
    let mut back = vec![0u8; len];
    qp.leases().read(&rbuf, 0, &mut back)?;
    if back != data {
        return Err("data read back differs from what was written".into());
    }
    println!("data read back matches");
    Ok(())
}

//! The description of the device every case receives: computed once per run, from one
//! bring-up (Identify Controller, Identify Namespace of every active namespace, the queues
//! granted, a Report Zones of each zoned namespace's first zone), so that a case asks what
//! the device is instead of finding out by failing. The cases adapt to it through
//! [`crate::blocks`] (the metadata and PI of a format, zone-sequential writes) and the
//! registry's [`crate::Need`]s (what a case cannot do without: a skip naming the reason).

use std::time::Duration;

use kestrel::io::{MetaLayout, ZoneGeometry};
use kestrel::spec::pi::{PiFormat, PiType};
use kestrel::target::TargetInfo;
use kestrel::Controller;

/// The LBAs the suite may overwrite on a real device: the first 64 MiB of each namespace
/// it does I/O to (on a zoned namespace, the zones that start there, at least one).
pub const SCRATCH_BYTES: u64 = 64 << 20;

/// The I/O queues the suite asks for when a case does not say.
pub const QUEUES_ASKED: u16 = 64;

/// A controller, as the suite sees it.
#[derive(Clone, Debug)]
pub struct DeviceDesc {
    /// The device's name in reports (`emu`, `pci:0000:01:00.0`, ...).
    pub name: String,
    /// Identify Controller MN, SN, FR.
    pub model: String,
    /// Serial number.
    pub serial: String,
    /// Firmware revision.
    pub firmware: String,
    /// The NVMe version (VS).
    pub version: String,
    /// MDTS in bytes, as reported (`None`: no limit).
    pub mdts_bytes: Option<u64>,
    /// The most bytes the driver puts in one command: MDTS, at most the queue pairs'
    /// default (`QpairOptions::max_command_bytes`); larger requests are split.
    pub max_command_bytes: u64,
    /// I/O queues granted when [`QUEUES_ASKED`] were asked for.
    pub queues_granted: u16,
    /// CAP.MQES + 1: the largest queue.
    pub max_queue_entries: u32,
    /// ONCS: Write Zeroes.
    pub write_zeroes: bool,
    /// ONCS: Dataset Management.
    pub dsm: bool,
    /// OACS: Doorbell Buffer Config.
    pub shadow_doorbells: bool,
    /// Every active namespace, in nsid order.
    pub namespaces: Vec<NsDesc>,
    /// How long a case waits for a completion before it calls the command lost.
    pub wait: Duration,
}

/// One active namespace, as the suite sees it.
#[derive(Clone, Debug)]
pub struct NsDesc {
    /// Namespace ID.
    pub nsid: u32,
    /// Its format in words.
    pub format: String,
    /// Why the driver does no I/O to it (its format is refused), or `None`.
    pub refused: Option<String>,
    /// LBA data size in bytes.
    pub block_size: usize,
    /// Capacity in blocks (NSZE).
    pub num_blocks: u64,
    /// The blocks the suite may overwrite (the first [`SCRATCH_BYTES`]).
    pub scratch_blocks: u64,
    /// The metadata layout (MS, separate or extended, PI type and place), if any.
    pub meta: Option<MetaLayout>,
    /// Where the PI lies, for generating and checking it in software, if the format has PI.
    pub pi: Option<PiFormat>,
    /// The zones of a zoned namespace.
    pub zones: Option<ZoneDesc>,
    /// ONCS Write Zeroes (for this namespace's target).
    pub write_zeroes: bool,
    /// Deallocate supported.
    pub deallocate: bool,
    /// DLFEAT: deallocated blocks read as zeroes.
    pub deallocated_reads_zeroes: bool,
    /// The most bytes of data in one command (the device's [`DeviceDesc::max_command_bytes`],
    /// or a target's `max_transfer_bytes`).
    pub max_command_bytes: u64,
}

/// A zoned namespace's zones.
#[derive(Clone, Copy, Debug)]
pub struct ZoneDesc {
    /// Zone size, number of zones, limits, ZASL.
    pub geometry: ZoneGeometry,
    /// The writable blocks of the first zone (ZCAP, from Report Zones); `None` when it
    /// could not be read (the cases then read each zone's own).
    pub capacity: Option<u64>,
}

impl DeviceDesc {
    /// The description of the controller `c` (brought up asking for [`QUEUES_ASKED`]
    /// queues), named `name`; zone capacities come from `zcap(nsid, zone_size)`.
    pub fn of(
        name: &str,
        c: &Controller,
        wait: Duration,
        zcap: &mut dyn FnMut(u32) -> Option<u64>,
    ) -> DeviceDesc {
        let id = c.identify();
        let max_command_bytes = c
            .max_transfer_bytes()
            .min(kestrel::nvme::qpair::DEFAULT_MAX_COMMAND_BYTES);
        let namespaces = c
            .namespaces()
            .iter()
            .map(|n| {
                let meta = n.protection.layout();
                let zones = n.zones.map(|geometry| ZoneDesc {
                    geometry,
                    capacity: zcap(n.nsid),
                });
                let mut d = NsDesc {
                    nsid: n.nsid,
                    format: String::new(),
                    refused: n.unsupported.as_ref().map(|u| u.to_string()),
                    block_size: n.block_size as usize,
                    num_blocks: n.num_blocks,
                    scratch_blocks: 0,
                    meta,
                    pi: meta.and_then(|m| pi_format(n.block_size as usize, &m)),
                    zones,
                    write_zeroes: n.write_zeroes,
                    deallocate: n.deallocate,
                    deallocated_reads_zeroes: n.identify.deallocated_reads_zeroes(),
                    max_command_bytes,
                };
                d.scratch_blocks = d.scratch();
                d.format = if d.refused.is_some() {
                    format!("{} (refused by kestrel)", n.format)
                } else {
                    d.describe()
                };
                d
            })
            .collect();
        DeviceDesc {
            name: name.to_string(),
            model: id.mn.trim().to_string(),
            serial: id.sn.trim().to_string(),
            firmware: id.fr.trim().to_string(),
            version: c.version().to_string(),
            mdts_bytes: id.max_transfer_bytes(c.cap().mpsmin()),
            max_command_bytes,
            queues_granted: c.io_queues_granted(),
            max_queue_entries: c.cap().max_queue_entries(),
            write_zeroes: id.supports_write_zeroes(),
            dsm: id.supports_dsm(),
            shadow_doorbells: id.supports_shadow_doorbells(),
            namespaces,
            wait,
        }
    }

    /// Namespace `nsid`.
    pub fn namespace(&self, nsid: u32) -> Option<&NsDesc> {
        self.namespaces.iter().find(|n| n.nsid == nsid)
    }

    /// The namespace the controller cases do their I/O on, among `allowed` (every
    /// namespace when `None`): the first served conventional one without metadata, else
    /// the first served conventional one, else the first served one.
    pub fn io_namespace(&self, allowed: Option<u32>) -> Option<&NsDesc> {
        let served: Vec<&NsDesc> = self
            .namespaces
            .iter()
            .filter(|n| n.refused.is_none() && allowed.is_none_or(|a| a == n.nsid))
            .collect();
        served
            .iter()
            .find(|n| n.zones.is_none() && n.meta.is_none())
            .or_else(|| served.iter().find(|n| n.zones.is_none()))
            .or_else(|| served.first())
            .copied()
    }

    /// One line per fact, for the report's head.
    pub fn lines(&self) -> Vec<String> {
        let mdts = match self.mdts_bytes {
            Some(m) => format!("{} KiB", m >> 10),
            None => "no limit".into(),
        };
        let mut v = vec![
            format!(
                "{}: {} (sn {}, fw {}, nvme {})",
                self.name, self.model, self.serial, self.firmware, self.version
            ),
            format!(
                "mdts {mdts} (commands of up to {} KiB), {} i/o queues granted of {QUEUES_ASKED} asked, queues of up to {} entries, write zeroes {}, dataset management {}, doorbell buffer config {}",
                self.max_command_bytes >> 10,
                self.queues_granted,
                self.max_queue_entries,
                yes(self.write_zeroes),
                yes(self.dsm),
                yes(self.shadow_doorbells)
            ),
        ];
        for n in &self.namespaces {
            v.push(format!("nsid {}: {}", n.nsid, n.format));
        }
        v
    }
}

fn yes(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// The software PI format of a namespace with LBA data size `bs` and layout `m`.
fn pi_format(bs: usize, m: &MetaLayout) -> Option<PiFormat> {
    PiType::from_dps(m.pi_type).map(|t| PiFormat {
        data_size: bs,
        ms: m.ms as usize,
        extended: m.extended,
        pi_first: m.pi_first,
        pi_type: t,
    })
}

impl NsDesc {
    /// The namespace a target describes (a file target, or an NVMe namespace opened as a
    /// target).
    pub fn of_target(info: &TargetInfo) -> NsDesc {
        let meta = info.metadata;
        let mut d = NsDesc {
            nsid: info.nsid,
            format: String::new(),
            refused: None,
            block_size: info.block_size as usize,
            num_blocks: info.num_blocks,
            scratch_blocks: 0,
            meta,
            pi: meta.and_then(|m| pi_format(info.block_size as usize, &m)),
            zones: info.zones.map(|geometry| ZoneDesc {
                geometry,
                capacity: None,
            }),
            write_zeroes: info.write_zeroes,
            deallocate: info.deallocate,
            deallocated_reads_zeroes: info.deallocate_reads_zeroes,
            max_command_bytes: info
                .max_transfer_bytes
                .min(kestrel::nvme::qpair::DEFAULT_MAX_COMMAND_BYTES),
        };
        d.scratch_blocks = d.scratch();
        d.format = d.describe();
        d
    }

    fn scratch(&self) -> u64 {
        let plain = (SCRATCH_BYTES / self.block_size.max(1) as u64).min(self.num_blocks);
        match &self.zones {
            Some(z) => plain.max(z.geometry.zone_size).min(self.num_blocks),
            None => plain,
        }
    }

    /// The format in words.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "{} B blocks, {} blocks ({} MiB)",
            self.block_size,
            self.num_blocks,
            (self.num_blocks * self.block_size as u64) >> 20
        );
        if let Some(m) = &self.meta {
            s += &format!(
                ", {} B metadata {}",
                m.ms,
                if m.extended {
                    "interleaved (extended lba)"
                } else {
                    "in a separate buffer"
                }
            );
            match m.pi_type {
                0 => s += ", no pi",
                t => {
                    s += &format!(
                        ", pi type {t} in its {} 8 bytes{}",
                        if m.pi_first { "first" } else { "last" },
                        if m.required() {
                            ""
                        } else {
                            " (the controller can insert it: PRACT)"
                        }
                    )
                }
            }
        }
        if let Some(z) = &self.zones {
            s += &format!(
                ", zoned: {} zones of {} blocks",
                z.geometry.zones, z.geometry.zone_size
            );
            if let Some(c) = z.capacity {
                s += &format!(", capacity {c}");
            }
        }
        s
    }

    /// Bytes per block in a data buffer that carries the metadata (extended: data and
    /// metadata; otherwise the data).
    pub fn host_block(&self) -> usize {
        match &self.meta {
            Some(m) if m.extended => self.block_size + m.ms as usize,
            _ => self.block_size,
        }
    }

    /// Separate metadata bytes per block (0: none, or interleaved).
    pub fn md_block(&self) -> usize {
        match &self.meta {
            Some(m) if !m.extended => m.ms as usize,
            _ => 0,
        }
    }

    /// The most blocks in one command with the metadata (the driver splits larger
    /// requests): MDTS over the bytes per block in the data buffer.
    pub fn chunk_blocks(&self) -> usize {
        let data = (self.max_command_bytes / self.block_size as u64).min(65536) as usize;
        ((data * self.block_size) / self.host_block()).max(1)
    }

    /// Whether it is zoned.
    pub fn zoned(&self) -> bool {
        self.zones.is_some()
    }

    /// Whether the controller can insert and strip its PI (PRACT): the metadata is the
    /// 8-byte PI alone.
    pub fn pract(&self) -> bool {
        self.meta.is_some_and(|m| m.pi_type != 0 && !m.required())
    }
}

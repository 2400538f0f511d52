//! Identify (CNS 00h, 01h, 02h, 03h): the data structures the controller returns.

use super::{fail, Ctrl, Outcome};
use crate::emu::mem::Mem;
use crate::emu::ns::Ns;
use crate::emu::zns::Zones;
use crate::emu::EmuConfig;
use crate::spec::identify::{
    ctrl_off, encode_active_ns_list, oacs, oncs, IdentifyController, IdentifyNamespace, LbaFormat,
    NsIdDescriptors, IDENTIFY_SIZE,
};
use crate::spec::zns::{IdentifyNsZoned, ID_CTRL_ZONED_ZASL, OZCS_RAZB};
use crate::spec::{cns, Sqe, Status, Vs, NSID_ALL};

/// The Identify Controller data structure of a controller configured by `cfg`.
pub(super) fn controller_data(
    cfg: &EmuConfig,
    acl: u8,
    aerl: u8,
    error_log_len: usize,
) -> Box<[u8; IDENTIFY_SIZE]> {
    IdentifyController {
        vid: 0,
        ssvid: 0,
        sn: cfg.serial.clone(),
        mn: cfg.model.clone(),
        fr: cfg.firmware.clone(),
        rab: 0,
        ieee: [0; 3],
        cmic: 0,
        mdts: cfg.mdts,
        cntlid: 1,
        ver: Vs::V1_4_0.0,
        oaes: 0,
        // Extended LBA formats: the NVM Command Set Identify Namespace reports each format's
        // guard size (EmuFormat::pif).
        ctratt: crate::spec::identify::CTRATT_ELBAS,
        // Command Retry Delay Times for CRD 1..3: 100, 200 and 500 ms.
        crdt: [1, 2, 5],
        oacs: if cfg.shadow_doorbells {
            oacs::DOORBELL_BUFFER_CONFIG
        } else {
            0
        },
        acl,
        aerl,
        frmw: 0x03, // one slot, read only
        lpa: 0x04,  // extended data for Get Log Page (NUMDU, offsets)
        elpe: (error_log_len - 1) as u8,
        npss: 0,
        wctemp: 343,
        cctemp: 373,
        tnvmcap: cfg.namespaces.iter().map(|n| n.size_bytes as u128).sum(),
        unvmcap: 0,
        sqes: 0x66,
        cqes: 0x44,
        maxcmd: 0,
        nn: cfg.namespaces.len() as u32,
        oncs: oncs::WRITE_ZEROES | oncs::DATASET_MANAGEMENT,
        fuses: 0,
        fna: 0,
        // Bit 0: cache present; bits 2:1 = 11b: Flush with NSID FFFFFFFFh supported.
        vwc: if cfg.volatile_write_cache { 0x07 } else { 0x06 },
        awun: 0,
        awupf: 0,
        sgls: 0,
        subnqn: format!("nqn.2024-01.invalid.kestrel:emu:{}", cfg.serial),
    }
    .to_bytes()
}

impl Ctrl {
    pub(super) fn identify_namespace(&self, ns: &Ns) -> Box<[u8; IDENTIFY_SIZE]> {
        let mut id = IdentifyNamespace {
            nsze: ns.nsze,
            ncap: ns.nsze,
            nuse: ns
                .store
                .used_bytes()
                .map_or(ns.nsze, |b| (b >> ns.lba_shift).min(ns.nsze)),
            nsfeat: ns.store.thin() as u8,
            nlbaf: 1,
            flbas: ns.lbaf_index(),
            // Deallocated blocks read as zeroes (001b), Write Zeroes may deallocate (bit
            // 3); bit 4 clear: their guard reads FFFFh (with all-ones tags, ns module doc).
            dlfeat: 0x09,
            ..Default::default()
        };
        if let Some(n) = self.inj.nsze() {
            // A fault: identify data that is wrong (the namespace keeps its real size).
            (id.nsze, id.ncap, id.nuse) = (n, n, n);
        }
        id.lbaf[0] = LbaFormat {
            ms: 0,
            lbads: 9,
            rp: 0,
        };
        id.lbaf[1] = LbaFormat {
            ms: 0,
            lbads: 12,
            rp: 0,
        };
        let f = ns.format;
        if f.ms != 0 {
            // LBAF2: the namespace's data size with its metadata, in use.
            id.nlbaf = 2;
            id.lbaf[2] = LbaFormat {
                ms: f.ms,
                lbads: ns.lba_shift as u8,
                rp: 0,
            };
            id.flbas |= if f.extended { 0x10 } else { 0 };
            // MC: extended and separate metadata both possible.
            id.mc = 0x3;
            // DPC: types 1, 2 and 3, PI first or last.
            id.dpc = 0x1F;
            id.dps = (f.pi_type & 0x7) | if f.pi_first { 0x8 } else { 0 };
        }
        // NGUID/EUI64: stable per (serial, nsid).
        let sn = &self.id_ctrl[4..24];
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for &b in sn.iter().chain(ns.nsid.to_le_bytes().iter()) {
            h = (h ^ b as u64).wrapping_mul(0x0100_0000_01b3);
        }
        id.eui64 = h.to_be_bytes();
        id.nguid[..8].copy_from_slice(&h.to_be_bytes());
        id.nguid[8..].copy_from_slice(&(ns.nsid as u64).to_be_bytes());
        id.to_bytes()
    }

    /// Identify: one function per CNS value.
    pub(super) fn identify(&mut self, mem: &Mem<'_>, sqe: &Sqe) -> Outcome {
        let bytes = match (sqe.cdw10 & 0xFF) as u8 {
            cns::NAMESPACE => self.cns_namespace(sqe.nsid),
            cns::CONTROLLER => Ok(self.id_ctrl.clone()),
            cns::ACTIVE_NAMESPACES => self.cns_active_namespaces(sqe.nsid),
            cns::NS_ID_DESCRIPTORS => self.cns_ns_id_descriptors(sqe.nsid),
            cns::NAMESPACE_CSI => self.cns_namespace_csi(sqe.nsid, csi_of(sqe)),
            cns::CONTROLLER_CSI => self.cns_controller_csi(csi_of(sqe)),
            cns::IO_COMMAND_SETS => Ok(io_command_sets()),
            _ => Err(Status::INVALID_FIELD),
        };
        match bytes {
            Ok(b) => self.transfer_out(mem, sqe, &b[..], IDENTIFY_SIZE),
            Err(s) => fail(s),
        }
    }

    /// The namespace `nsid` names, when it is one (not 0, not FFFFFFFFh, existing).
    fn named_ns(&self, nsid: u32) -> Result<&Ns, Status> {
        match self.nvm.ns.get((nsid as usize).wrapping_sub(1)) {
            Some(ns) if nsid != 0 && nsid != NSID_ALL => Ok(ns),
            _ => Err(Status::INVALID_NAMESPACE_OR_FORMAT),
        }
    }

    /// CNS 00h: Identify Namespace.
    fn cns_namespace(&self, nsid: u32) -> Result<Box<[u8; IDENTIFY_SIZE]>, Status> {
        Ok(self.identify_namespace(self.named_ns(nsid)?))
    }

    /// CNS 02h: the active namespace IDs above `nsid`.
    fn cns_active_namespaces(&self, nsid: u32) -> Result<Box<[u8; IDENTIFY_SIZE]>, Status> {
        if nsid >= NSID_ALL - 1 {
            return Err(Status::INVALID_NAMESPACE_OR_FORMAT);
        }
        let ids: Vec<u32> = self
            .nvm
            .ns
            .iter()
            .map(|n| n.nsid)
            .filter(|&id| id > nsid)
            .collect();
        Ok(encode_active_ns_list(&ids))
    }

    /// CNS 03h: the Namespace Identification Descriptor list (EUI64, NGUID, CSI).
    fn cns_ns_id_descriptors(&self, nsid: u32) -> Result<Box<[u8; IDENTIFY_SIZE]>, Status> {
        let ns = self.named_ns(nsid)?;
        let id = IdentifyNamespace::parse(&self.identify_namespace(ns));
        Ok(NsIdDescriptors {
            eui64: Some(id.eui64),
            nguid: Some(id.nguid),
            uuid: None,
            csi: Some(ns.format.csi),
        }
        .to_bytes())
    }

    /// CNS 05h: the I/O Command Set specific Identify Namespace data structure. For the
    /// NVM Command Set it is all zeroes (16-bit guard formats only); for a zoned
    /// namespace, the zoned one (zone size, MAR/MOR, no descriptor extensions).
    fn cns_namespace_csi(&self, nsid: u32, csi: u8) -> Result<Box<[u8; IDENTIFY_SIZE]>, Status> {
        let ns = self.named_ns(nsid)?;
        match (csi, &ns.zones) {
            (crate::spec::csi::NVM, _) => {
                let mut b = Box::new([0u8; IDENTIFY_SIZE]);
                let off = crate::spec::identify::NVM_ELBAF_OFFSET + 4 * ns.lbaf_index() as usize;
                b[off..off + 4].copy_from_slice(&(u32::from(ns.format.pif & 3) << 7).to_le_bytes());
                Ok(b)
            }
            (crate::spec::csi::ZONED, Some(z)) => Ok(IdentifyNsZoned {
                zoc: 0,
                ozcs: OZCS_RAZB,
                mar: Zones::limit_field(z.max_active),
                mor: Zones::limit_field(z.max_open),
                zsze: z.zsze,
                zdes: 0,
            }
            .to_bytes(ns.lbaf_index() as usize)),
            _ => Err(Status::INVALID_FIELD),
        }
    }

    /// CNS 06h: the I/O Command Set specific Identify Controller data structure: zeroes
    /// for NVM; for zoned namespaces, ZASL = MDTS (Zone Append is limited as writes are).
    fn cns_controller_csi(&self, csi: u8) -> Result<Box<[u8; IDENTIFY_SIZE]>, Status> {
        let mut b = Box::new([0u8; IDENTIFY_SIZE]);
        match csi {
            crate::spec::csi::NVM => {}
            crate::spec::csi::ZONED => b[ID_CTRL_ZONED_ZASL] = self.id_ctrl[ctrl_off::MDTS],
            _ => return Err(Status::INVALID_FIELD),
        }
        Ok(b)
    }
}

/// CSI of an Identify command (CDW11 bits 31:24).
fn csi_of(sqe: &Sqe) -> u8 {
    (sqe.cdw11 >> 24) as u8
}

/// CNS 1Ch: the I/O Command Set combinations; index 0 (the only one): NVM and Zoned
/// Namespace (bits 0 and 2).
fn io_command_sets() -> Box<[u8; IDENTIFY_SIZE]> {
    let mut b = Box::new([0u8; IDENTIFY_SIZE]);
    b[..8].copy_from_slice(&IO_COMMAND_SET_VECTOR.to_le_bytes());
    b
}

/// The one I/O Command Set combination: NVM (bit 0) and Zoned Namespace (bit 2).
pub(super) const IO_COMMAND_SET_VECTOR: u64 =
    1 << crate::spec::csi::NVM | 1 << crate::spec::csi::ZONED;

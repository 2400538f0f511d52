//! Admin commands of a controller: Identify, Get Log Page (the discovery log among
//! them), Set/Get Features.

use super::*;

impl Controller {
    pub(super) fn identify(
        &self,
        cns_v: u8,
        csi_v: u8,
        nsid: u32,
        out: &mut Vec<u8>,
        lim: &Limits,
    ) -> AdminOutcome {
        let sub = &self.subsys;
        match cns_v {
            cns::CONTROLLER => {
                out.extend_from_slice(&self.identify_controller(lim)[..]);
                ok(0)
            }
            // The NVM Command Set's Identify Controller data structure (Linux's initiator
            // asks for it at every connect and logs the error when refused): all zeroes,
            // that is no size limit of its own for Verify, Write Zeroes, Write
            // Uncorrectable or Dataset Management, as Linux's target answers.
            cns::CONTROLLER_CSI if csi_v == kestrel::spec::csi::NVM && !sub.is_discovery() => {
                out.extend_from_slice(&[0u8; IDENTIFY_SIZE]);
                ok(0)
            }
            cns::NAMESPACE | cns::NS_ID_DESCRIPTORS => {
                if sub.is_discovery() {
                    return invalid_field();
                }
                if cns_v == cns::NAMESPACE && nsid == 0xffff_ffff {
                    // The capabilities common to every namespace: the format of the
                    // first, no size.
                    let mut b = identify_namespace(&sub.namespaces[0]);
                    b[..24].fill(0);
                    out.extend_from_slice(&b[..]);
                    return ok(0);
                }
                // Every NSID from 1 to NN is active: any other is invalid.
                let Some(ns) = sub.namespace(nsid) else {
                    return done(Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true));
                };
                if cns_v == cns::NAMESPACE {
                    out.extend_from_slice(&identify_namespace(ns)[..]);
                } else {
                    let d = NsIdDescriptors {
                        eui64: Some(ns.eui64),
                        nguid: Some(ns.nguid),
                        uuid: Some(ns.uuid),
                        csi: Some(0),
                    };
                    out.extend_from_slice(&d.to_bytes()[..]);
                }
                ok(0)
            }
            cns::ACTIVE_NAMESPACES => {
                if nsid >= 0xffff_fffe {
                    return done(Status::INVALID_NAMESPACE_OR_FORMAT.with_dnr(true));
                }
                let ids: Vec<u32> = sub
                    .namespaces
                    .iter()
                    .map(|n| n.nsid)
                    .filter(|&n| n > nsid)
                    .collect();
                out.extend_from_slice(&encode_active_ns_list(&ids)[..]);
                ok(0)
            }
            _ => invalid_field(),
        }
    }

    /// Identify Controller data.
    pub fn identify_controller(&self, lim: &Limits) -> Box<[u8; IDENTIFY_SIZE]> {
        let sub = &self.subsys;
        let (mdts, oncs, vwc, nn) = if sub.is_discovery() {
            (0, 0, 0, 0)
        } else {
            // ONCS is controller wide: Dataset Management when any namespace can
            // deallocate (it is advisory on the others), Write Zeroes only when every
            // namespace has it; a volatile write cache when any namespace caches.
            let nss = &sub.namespaces;
            let mut oncs = 0u16;
            if nss.iter().any(|n| n.info.deallocate) {
                oncs |= kestrel::spec::identify::oncs::DATASET_MANAGEMENT;
            }
            if nss.iter().all(|n| n.info.write_zeroes) {
                oncs |= kestrel::spec::identify::oncs::WRITE_ZEROES;
            }
            let vwc = nss.iter().any(|n| n.info.flush) as u8;
            (sub.mdts, oncs, vwc, nss.len() as u32)
        };
        let id = IdentifyController {
            sn: sub.serial.clone(),
            mn: "Kestrel NVMe/TCP".into(),
            fr: env!("CARGO_PKG_VERSION").chars().take(8).collect(),
            rab: 6,
            // CMIC bit 1: the subsystem may have several controllers (one per host
            // connection), so its namespace is shared (NMIC bit 0).
            cmic: if sub.is_discovery() { 0 } else { 0x02 },
            mdts,
            cntlid: self.cntlid,
            ver: NVME_VERSION,
            acl: 3,
            aerl: (MAX_AERS - 1) as u8,
            frmw: 0x03,
            // LPA bit 2: extended data for Get Log Page (offsets).
            lpa: 0x04,
            elpe: 0,
            sqes: 0x66,
            cqes: 0x44,
            maxcmd: lim.max_queue_size,
            nn,
            oncs,
            vwc,
            // SGLS: SGLs supported (bits 1:0 = 01b); bit 20: SGL Data Block offsets
            // (in-capsule data).
            sgls: 1 | (1 << 20),
            // Traffic-based keep-alive: every command restarts the Keep Alive Timer
            // (`Conn::check_controller`), as Linux's target does; a host that sees it may
            // leave out Keep Alive while commands complete.
            ctratt: kestrel::spec::identify::CTRATT_TBKAS,
            subnqn: sub.nqn.clone(),
            ..Default::default()
        };
        let mut b = id.to_bytes();
        b[fabrics::ctrl_off::CNTRLTYPE] = if sub.is_discovery() {
            cntrltype::DISCOVERY
        } else {
            cntrltype::IO
        };
        b[fabrics::ctrl_off::KAS..fabrics::ctrl_off::KAS + 2].copy_from_slice(&KAS.to_le_bytes());
        let ioccsz = (64 + lim.in_capsule_data) / 16;
        b[fabrics::ctrl_off::IOCCSZ..fabrics::ctrl_off::IOCCSZ + 4]
            .copy_from_slice(&ioccsz.to_le_bytes());
        b[fabrics::ctrl_off::IORCSZ..fabrics::ctrl_off::IORCSZ + 4]
            .copy_from_slice(&1u32.to_le_bytes());
        // ICDOFF 0, FCATT 0 (dynamic model), MSDBD 1, OFCS bit 0: Disconnect.
        b[fabrics::ctrl_off::MSDBD] = 1;
        b[fabrics::ctrl_off::OFCS] = 1;
        b
    }

    pub(super) fn get_log_page(
        &self,
        lid_v: u8,
        off: u64,
        len: u64,
        out: &mut Vec<u8>,
        shared: &Shared,
        local: Option<SocketAddr>,
    ) -> AdminOutcome {
        if len > (1 << 20) || off % 4 != 0 {
            return invalid_field();
        }
        let page: Vec<u8> = match (lid_v, self.is_discovery()) {
            (lid::DISCOVERY, true) => self.discovery_log(shared, local),
            (lid::ERROR, false) => vec![0u8; 64],
            (lid::SMART, false) => vec![0u8; 512],
            (lid::FIRMWARE_SLOT, false) => {
                let mut p = vec![0u8; 512];
                p[0] = 1; // AFI: slot 1 active.
                let fr = env!("CARGO_PKG_VERSION").as_bytes();
                let mut f = [b' '; 8];
                let n = fr.len().min(8);
                f[..n].copy_from_slice(&fr[..n]);
                p[8..16].copy_from_slice(&f);
                p
            }
            (lid::CHANGED_NS, false) => vec![0u8; 4096],
            _ => {
                return done(
                    Status::new(Sct::CommandSpecific, 0x09).with_dnr(true), // Invalid Log Page
                );
            }
        };
        if off > page.len() as u64 {
            return invalid_field();
        }
        let start = off as usize;
        let end = (start + len as usize).min(page.len());
        // The log's own bytes only: the transfer's rest, past the end of the log, is sent
        // as zeroes without being held (`conn`, `TxData::Local`).
        out.extend_from_slice(&page[start..end]);
        ok(0)
    }

    /// The discovery log page: the subsystems this host may reach, on every listener, and
    /// the discovery subsystem itself.
    pub fn discovery_log(&self, shared: &Shared, local: Option<SocketAddr>) -> Vec<u8> {
        let listeners = super::lock(&shared.listeners, "the listener list").clone();
        let mut entries = Vec::new();
        let addr_of = |l: &SocketAddr| -> SocketAddr {
            match local {
                Some(loc) if l.ip().is_unspecified() => SocketAddr::new(loc.ip(), l.port()),
                _ => *l,
            }
        };
        let entry = |l: &SocketAddr, nqn: &str, st: u8, portid: u16| {
            let a = addr_of(l);
            DiscEntry {
                trtype: fabrics::TRTYPE_TCP,
                adrfam: if a.is_ipv4() {
                    fabrics::ADRFAM_IPV4
                } else {
                    fabrics::ADRFAM_IPV6
                },
                subtype: st,
                treq: fabrics::TREQ_DISABLE_SQFLOW,
                portid,
                cntlid: CNTLID_DYNAMIC,
                asqsz: 32,
                trsvcid: a.port().to_string(),
                subnqn: nqn.to_string(),
                traddr: a.ip().to_string(),
                sectype: 0,
            }
        };
        let main = listeners.first().copied();
        if let Some(l) = &main {
            for s in &shared.subsystems {
                if !s.is_discovery() && (s.allow_any_host || s.hosts.contains(&self.hostnqn)) {
                    entries.push(entry(l, &s.nqn, fabrics::subtype::NVM, 1));
                }
            }
        }
        for (i, l) in listeners.iter().enumerate() {
            entries.push(entry(
                l,
                DISCOVERY_NQN,
                fabrics::subtype::CURRENT_DISCOVERY,
                i as u16 + 1,
            ));
        }
        fabrics::encode_discovery_log(1, &entries)
    }

    pub(super) fn set_features(&self, cdw10: u32, cdw11: u32, lim: &Limits) -> AdminOutcome {
        if cdw10 & (1 << 31) != 0 {
            return done(Status::new(Sct::CommandSpecific, 0x0D).with_dnr(true));
            // not saveable
        }
        let mut st = super::lock(&self.st, "a controller's state");
        match cdw10 as u8 {
            fid::NUMBER_OF_QUEUES => {
                let nsqr = cdw11 & 0xffff;
                let ncqr = cdw11 >> 16;
                if nsqr == 0xffff || ncqr == 0xffff || self.is_discovery() {
                    return invalid_field();
                }
                let want = nsqr.max(ncqr) + 1;
                let n = want.min(lim.max_io_queues as u32) as u16;
                st.nq_granted = n;
                let v = (n - 1) as u32;
                ok(v | (v << 16))
            }
            fid::KEEP_ALIVE_TIMER => {
                self.kato_ms.store(cdw11, Ordering::Relaxed);
                ok(0)
            }
            fid::ASYNC_EVENT_CONFIG => {
                st.aec = cdw11;
                ok(0)
            }
            fid::ARBITRATION | fid::POWER_MANAGEMENT if cdw11 == 0 => ok(0),
            // Error Recovery (TLER 0, DULBE 0) and Write Atomicity Normal (DN 0) keep their
            // one value; a Temperature Threshold may be set to the one it has.
            fid::ERROR_RECOVERY | fid::WRITE_ATOMICITY if cdw11 == 0 => ok(0),
            fid::TEMPERATURE_THRESHOLD if temperature_threshold(cdw11) == Some(cdw11) => ok(0),
            _ => done(Status::new(Sct::CommandSpecific, 0x0E).with_dnr(true)), // not changeable
        }
    }

    pub(super) fn get_features(&self, cdw10: u32, cdw11: u32) -> AdminOutcome {
        let st = super::lock(&self.st, "a controller's state");
        let sel = (cdw10 >> 8) & 7;
        if sel == 3 {
            // Capabilities: nothing saveable, nothing namespace specific; changeable.
            return ok(1 << 2);
        }
        match cdw10 as u8 {
            fid::NUMBER_OF_QUEUES => {
                let v = st.nq_granted.max(1) as u32 - 1;
                ok(v | (v << 16))
            }
            fid::KEEP_ALIVE_TIMER => ok(self.kato_ms.load(Ordering::Relaxed)),
            fid::ASYNC_EVENT_CONFIG => ok(st.aec),
            fid::VOLATILE_WRITE_CACHE => {
                ok(self.subsys.namespaces.iter().any(|n| n.info.flush) as u32)
            }
            fid::ARBITRATION | fid::POWER_MANAGEMENT => ok(0),
            fid::ERROR_RECOVERY | fid::WRITE_ATOMICITY => ok(0),
            fid::TEMPERATURE_THRESHOLD => match temperature_threshold(cdw11) {
                Some(v) => ok(v),
                None => invalid_field(),
            },
            _ => invalid_field(),
        }
    }
}

/// The Temperature Threshold feature (mandatory, Get and Set): dword 11's sensor (TMPSEL)
/// and threshold type (THSEL) with the threshold (TMPTH, kelvins) filled in. There is one
/// sensor, the composite temperature (TMPSEL 0), whose over-temperature threshold is
/// 343 K (70 °C) and under-temperature threshold 0 K (none); the SMART log reports a
/// composite temperature of 0, so neither is ever crossed. `None` for another sensor or
/// threshold type.
fn temperature_threshold(cdw11: u32) -> Option<u32> {
    let (tmpsel, thsel) = ((cdw11 >> 16) & 0xf, (cdw11 >> 20) & 3);
    let tmpth = match (tmpsel, thsel) {
        (0, 0) => 343,
        (0, 1) => 0,
        _ => return None,
    };
    Some((cdw11 & 0x003f_0000) | tmpth)
}

/// Identify Namespace data of a namespace.
pub fn identify_namespace(ns: &Namespace) -> Box<[u8; IDENTIFY_SIZE]> {
    let mut id = IdentifyNamespace {
        nsze: ns.info.num_blocks,
        ncap: ns.info.num_blocks,
        nuse: ns.info.num_blocks,
        // NMIC bit 0: the namespace may be attached to several controllers.
        nmic: 1,
        dlfeat: if ns.info.deallocate && ns.info.deallocate_reads_zeroes {
            0x01
        } else {
            0
        },
        nguid: ns.nguid,
        eui64: ns.eui64,
        ..Default::default()
    };
    id.lbaf[0] = LbaFormat {
        ms: 0,
        lbads: ns.info.block_size.trailing_zeros() as u8,
        rp: 0,
    };
    id.to_bytes()
}

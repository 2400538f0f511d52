//! One emulated namespace as the controller holds it: its geometry, format, store and, for
//! a zoned namespace, its zones.
//!
//! The store holds the data of block `i` at `i << lba_shift` and, when the format has
//! metadata, its `ms` metadata bytes at `meta_base + i * ms` (one store, the metadata
//! region after the data). The 8 bytes of protection information inside the metadata are
//! stored inverted (each byte XOR FFh), so a block never written, or deallocated, reads
//! back with all-ones PI: application tag FFFFh and reference tag FFFFFFFFh, which disable
//! checking (and a guard of FFFFh, as DLFEAT bit 4 cleared says). With
//! [`EmuFormat::zeroed_pi`] the PI is stored as it is, so a block never written reads back
//! with all-zero PI, which fails a reference tag check; deallocating stores all-ones PI.

use super::config::{EmuFormat, EmuNamespace, EmuStore};
use super::error::EmuError;
use super::store::{Store, StoreError};
use super::zns::Zones;
use crate::spec::csi;
use crate::spec::pi::{pi_offset, PiType, PI_SIZE};

/// One emulated namespace.
pub(super) struct Ns {
    pub nsid: u32,
    /// log2 of the LBA size.
    pub lba_shift: u32,
    /// NSZE in blocks.
    pub nsze: u64,
    pub store: Store,
    /// Metadata, protection and command set.
    pub format: EmuFormat,
    /// Where block 0's metadata starts in the store.
    pub meta_base: u64,
    /// The zones of a zoned namespace.
    pub zones: Option<Zones>,
}

impl Ns {
    /// Opens namespace `nsid` as configured: creates its store (data and metadata).
    pub(super) fn open(nsid: u32, n: &EmuNamespace) -> Result<Ns, EmuError> {
        let nsze = n.size_bytes / n.lba_size as u64;
        let total = n.size_bytes + nsze * n.format.ms as u64;
        let store = match &n.store {
            EmuStore::Memory => Store::memory(total),
            EmuStore::Null => Store::Null,
            EmuStore::File(path) => {
                Store::file(path, total).map_err(|source| EmuError::StoreFile {
                    nsid,
                    path: path.clone(),
                    source,
                })?
            }
        };
        let zones = (n.format.csi == csi::ZONED).then(|| {
            let z = &n.format.zones;
            let zsze = z.zone_size / n.lba_size as u64;
            let zcap = match z.zone_capacity {
                0 => zsze,
                c => c / n.lba_size as u64,
            };
            Zones::new(nsze, zsze, zcap, z.max_open, z.max_active)
        });
        Ok(Ns {
            nsid,
            lba_shift: n.lba_size.trailing_zeros(),
            nsze,
            store,
            format: n.format,
            meta_base: n.size_bytes,
            zones,
        })
    }

    /// Bytes of data per block.
    pub(super) fn lba_size(&self) -> usize {
        1 << self.lba_shift
    }

    /// Bytes of metadata per block.
    pub(super) fn ms(&self) -> usize {
        self.format.ms as usize
    }

    /// The protection information type, if the namespace is protected.
    pub(super) fn pi_type(&self) -> Option<PiType> {
        PiType::from_dps(self.format.pi_type)
    }

    /// Offset of the PI inside a block's metadata.
    pub(super) fn pi_off(&self) -> usize {
        pi_offset(self.ms().max(PI_SIZE), self.format.pi_first)
    }

    /// Store offset of block `lba`'s metadata.
    pub(super) fn meta_off(&self, lba: u64) -> u64 {
        self.meta_base + lba * self.ms() as u64
    }

    /// Whether the controller executes I/O on this namespace's command set.
    pub(super) fn executes_io(&self) -> bool {
        matches!(self.format.csi, csi::NVM | csi::ZONED)
    }

    /// Index of the LBA format in use (LBAF0: 512 B, LBAF1: 4096 B, LBAF2: the
    /// namespace's data size with its metadata).
    pub(super) fn lbaf_index(&self) -> u8 {
        if self.format.ms != 0 {
            2
        } else if self.lba_shift == 9 {
            0
        } else {
            1
        }
    }

    /// Zeroes blocks `slba..slba + nlb` and their metadata (with `deac`, deallocates
    /// them); their PI then reads as all ones (module doc). With
    /// [`EmuFormat::zeroed_pi`], deallocated blocks get all-ones PI stored (the spec's
    /// values for a deallocated block), zeroed ones all-zero PI.
    pub(super) fn zero_blocks(
        &mut self,
        slba: u64,
        nlb: u32,
        deac: bool,
    ) -> Result<(), StoreError> {
        let shift = self.lba_shift;
        self.store
            .zero(slba << shift, (nlb as u64) << shift, deac)?;
        if self.ms() != 0 {
            let off = self.meta_off(slba);
            self.store.zero(off, nlb as u64 * self.ms() as u64, deac)?;
            if deac && self.format.zeroed_pi && self.pi_type().is_some() {
                self.escape_pi(slba, nlb)?;
            }
        }
        Ok(())
    }

    /// Stores all-ones PI for blocks `slba..slba + nlb` (metadata otherwise zero), a
    /// bounded piece at a time.
    fn escape_pi(&mut self, slba: u64, nlb: u32) -> Result<(), StoreError> {
        const PIECE: u64 = 4096;
        let (ms, off) = (self.ms(), self.pi_off());
        let mut piece = vec![0u8; PIECE.min(nlb as u64) as usize * ms];
        for m in piece.chunks_exact_mut(ms) {
            m[off..off + PI_SIZE].fill(0xFF);
        }
        let mut done = 0u64;
        while done < nlb as u64 {
            let n = PIECE.min(nlb as u64 - done) as usize;
            let at = self.meta_off(slba + done);
            self.store.write_bytes(at, &piece[..n * ms], false)?;
            done += n as u64;
        }
        Ok(())
    }

    /// Inverts the PI bytes of every block in `meta` (the stored form, module doc; none
    /// with [`EmuFormat::zeroed_pi`]).
    pub(super) fn flip_pi(&self, meta: &mut [u8]) {
        if self.pi_type().is_none() || self.format.zeroed_pi {
            return;
        }
        let (ms, off) = (self.ms(), self.pi_off());
        for m in meta.chunks_exact_mut(ms) {
            for b in &mut m[off..off + PI_SIZE] {
                *b ^= 0xFF;
            }
        }
    }
}

//! The zones of an emulated zoned namespace (Zoned Namespace Command Set): zone states,
//! write pointers, open and active resources, the write-pointer rule, the zone actions of
//! Zone Management Send and the Report Zones data. Pure state: the commands that use it
//! are in `nvm/zones.rs`.
//!
//! Every zone is Sequential Write Required, with one capacity for all zones: the zone size,
//! or less (ZCAP in each zone descriptor; the blocks from ZSLBA + ZCAP to the zone's end
//! are never written, and read as deallocated). A write (or Write Zeroes, or Zone Append at
//! the write pointer) to an Empty or Closed zone opens it implicitly; when that needs an
//! open resource and none is free, the controller closes an implicitly opened zone (the
//! lowest-numbered) to make room, and fails with Too Many Open Zones only when every open
//! zone was opened explicitly. A write past the capacity fails with Zone Boundary Error; a
//! zone whose write pointer reaches ZSLBA + ZCAP becomes Full. Read Only and Offline zones
//! are never produced. Reads are not restricted (OZCS bit 0, Read Across Zone Boundaries,
//! is set), the blocks past the capacity included.
//!
//! A controller shutdown closes every open zone (or empties it when nothing was written).
//! Zone states are not kept in a file store: a file-backed zoned namespace starts with
//! every zone Empty, whatever its data.
//!
//! Checks and changes are separate ([`Zones::check_write`], then [`Zones::commit_write`]
//! once the data is stored), so a command that fails after the check changes no zone.

use crate::spec::zns::{zra, zsa, ZoneDescriptor, ZoneState, ZONE_DESCRIPTOR_SIZE};
use crate::spec::Status;

#[derive(Clone, Copy, Debug)]
struct Zone {
    state: ZoneState,
    /// Write pointer (an LBA; the end of the zone's capacity when Full).
    wp: u64,
}

/// The zones of one namespace.
pub(super) struct Zones {
    /// Zone size in blocks.
    pub zsze: u64,
    /// Zone capacity in blocks (1..=zsze): the writable blocks of each zone, from its start.
    zcap: u64,
    /// Maximum open zones (0: no limit).
    pub max_open: u32,
    /// Maximum active zones (0: no limit).
    pub max_active: u32,
    zones: Vec<Zone>,
    open: u32,
    active: u32,
}

/// A write the zones accept: where it lands, and the implicit transitions it implies.
#[derive(Clone, Copy, Debug)]
pub(super) struct ZoneWrite {
    zone: usize,
    /// The LBA the data is written at (the write pointer).
    pub lba: u64,
    /// An implicitly opened zone to close to make room for this one.
    close: Option<usize>,
}

/// Zones to deallocate after a Zone Management Send (Reset Zone).
pub(super) type Resets = Vec<(u64, u64)>;

impl Zones {
    /// `nsze / zsze` empty zones of capacity `zcap` blocks (at most `zsze`).
    pub(super) fn new(nsze: u64, zsze: u64, zcap: u64, max_open: u32, max_active: u32) -> Self {
        let n = (nsze / zsze) as usize;
        Zones {
            zsze,
            zcap: zcap.clamp(1, zsze),
            max_open,
            max_active,
            zones: (0..n)
                .map(|i| Zone {
                    state: ZoneState::Empty,
                    wp: i as u64 * zsze,
                })
                .collect(),
            open: 0,
            active: 0,
        }
    }

    /// Number of zones.
    pub(super) fn count(&self) -> usize {
        self.zones.len()
    }

    /// The zone holding `lba`.
    fn index(&self, lba: u64) -> usize {
        (lba / self.zsze) as usize
    }

    fn start(&self, z: usize) -> u64 {
        z as u64 * self.zsze
    }

    /// The end of zone `z`'s capacity: the write pointer of a Full zone.
    fn end(&self, z: usize) -> u64 {
        self.start(z) + self.zcap
    }

    /// Changes a zone's state, keeping the open and active counts.
    fn set_state(&mut self, z: usize, new: ZoneState) {
        let old = self.zones[z].state;
        self.open = self.open - old.is_open() as u32 + new.is_open() as u32;
        self.active = self.active - old.is_active() as u32 + new.is_active() as u32;
        self.zones[z].state = new;
        if new == ZoneState::Full {
            self.zones[z].wp = self.end(z);
        }
        if new == ZoneState::Empty {
            self.zones[z].wp = self.start(z);
        }
    }

    /// The resources zone `z` needs to be opened: Too Many Active Zones, Too Many Open
    /// Zones, or the implicitly opened zone to close first (None: room enough).
    fn open_room(&self, z: usize) -> Result<Option<usize>, Status> {
        let st = self.zones[z].state;
        if st.is_open() {
            return Ok(None);
        }
        if st == ZoneState::Empty && self.max_active != 0 && self.active >= self.max_active {
            return Err(Status::TOO_MANY_ACTIVE_ZONES.with_dnr(true));
        }
        if self.max_open == 0 || self.open < self.max_open {
            return Ok(None);
        }
        self.zones
            .iter()
            .position(|x| x.state == ZoneState::ImplicitlyOpened)
            .map(Some)
            .ok_or(Status::TOO_MANY_OPEN_ZONES.with_dnr(true))
    }

    /// Checks a write of `nlb` blocks at `slba` (or, with `append`, to the zone starting at
    /// `slba`, at its write pointer): Zone Boundary Error past the zone's capacity, Zone Is
    /// Full, Zone Invalid Write when not at the write pointer, Invalid Field for an append
    /// whose SLBA is not a zone start, and the resources an implicit open needs.
    pub(super) fn check_write(
        &self,
        slba: u64,
        nlb: u32,
        append: bool,
    ) -> Result<ZoneWrite, Status> {
        let z = self.index(slba);
        if append && slba != self.start(z) {
            return Err(Status::INVALID_FIELD.with_dnr(true));
        }
        let zone = self.zones[z];
        let lba = if append { zone.wp } else { slba };
        // The zone's state first, then the write pointer, then the boundary: the order of
        // QEMU's model, so a Zone Append to a Full zone is Zone Is Full.
        match zone.state {
            ZoneState::Full => return Err(Status::ZONE_IS_FULL.with_dnr(true)),
            ZoneState::ReadOnly => return Err(Status::ZONE_IS_READ_ONLY.with_dnr(true)),
            ZoneState::Offline => return Err(Status::ZONE_IS_OFFLINE.with_dnr(true)),
            _ => {}
        }
        if lba != zone.wp {
            return Err(Status::ZONE_INVALID_WRITE.with_dnr(true));
        }
        if lba + nlb as u64 > self.end(z) {
            return Err(Status::ZONE_BOUNDARY_ERROR.with_dnr(true));
        }
        let close = self.open_room(z)?;
        Ok(ZoneWrite {
            zone: z,
            lba,
            close,
        })
    }

    /// Applies a checked write of `nlb` blocks: implicit open (and close), write pointer,
    /// Full at the end.
    pub(super) fn commit_write(&mut self, w: ZoneWrite, nlb: u32) {
        if let Some(c) = w.close {
            self.set_state(c, ZoneState::Closed);
        }
        if !self.zones[w.zone].state.is_open() {
            self.set_state(w.zone, ZoneState::ImplicitlyOpened);
        }
        self.zones[w.zone].wp += nlb as u64;
        if self.zones[w.zone].wp >= self.end(w.zone) {
            self.set_state(w.zone, ZoneState::Full);
        }
    }

    /// Zone Management Send `action` on the zone starting at `zslba`, or with `all` on
    /// every zone it applies to. Returns the block ranges (start, count) to deallocate.
    pub(super) fn send(&mut self, zslba: u64, action: u8, all: bool) -> Result<Resets, Status> {
        if !all && (zslba % self.zsze != 0 || self.index(zslba) >= self.count()) {
            return Err(Status::INVALID_FIELD.with_dnr(true));
        }
        match action {
            zsa::OPEN | zsa::CLOSE | zsa::FINISH | zsa::RESET if all => self.send_all(action),
            zsa::OPEN | zsa::CLOSE | zsa::FINISH | zsa::RESET => {
                self.send_one(self.index(zslba), action)
            }
            // No zone is ever Read Only, which Offline Zone needs.
            zsa::OFFLINE if all => Ok(Vec::new()),
            zsa::OFFLINE => Err(Status::INVALID_ZONE_STATE_TRANSITION.with_dnr(true)),
            // ZDES is 0: there are no zone descriptor extensions to set.
            _ => Err(Status::INVALID_FIELD.with_dnr(true)),
        }
    }

    fn send_one(&mut self, z: usize, action: u8) -> Result<Resets, Status> {
        use ZoneState as S;
        let st = self.zones[z].state;
        let bad = Err(Status::INVALID_ZONE_STATE_TRANSITION.with_dnr(true));
        match (action, st) {
            (zsa::OPEN, S::Empty | S::Closed | S::ImplicitlyOpened) => {
                if let Some(c) = self.open_room(z)? {
                    self.set_state(c, S::Closed);
                }
                self.set_state(z, S::ExplicitlyOpened);
            }
            (zsa::OPEN, S::ExplicitlyOpened) | (zsa::CLOSE, S::Closed) => {}
            (zsa::CLOSE, S::ImplicitlyOpened | S::ExplicitlyOpened) => self.set_state(z, S::Closed),
            (zsa::FINISH, S::Empty | S::ImplicitlyOpened | S::ExplicitlyOpened | S::Closed) => {
                self.set_state(z, S::Full)
            }
            (zsa::FINISH, S::Full) => {}
            (zsa::RESET, S::ReadOnly | S::Offline) => return bad,
            (zsa::RESET, _) => {
                let dealloc = st != S::Empty;
                self.set_state(z, S::Empty);
                return Ok(if dealloc {
                    vec![(self.start(z), self.zsze)]
                } else {
                    Vec::new()
                });
            }
            _ => return bad,
        }
        Ok(Vec::new())
    }

    /// Select All: Open applies to Closed zones (all or none, as resources allow), Close
    /// to open ones, Finish to open and closed ones, Reset to open, closed and full ones.
    fn send_all(&mut self, action: u8) -> Result<Resets, Status> {
        use ZoneState as S;
        let applies = |st: S| match action {
            zsa::OPEN => st == S::Closed,
            zsa::CLOSE => st.is_open(),
            zsa::FINISH => st.is_active(),
            _ => st.is_active() || st == S::Full,
        };
        let picked: Vec<usize> = (0..self.count())
            .filter(|&z| applies(self.zones[z].state))
            .collect();
        if action == zsa::OPEN
            && self.max_open != 0
            && self.open + picked.len() as u32 > self.max_open
        {
            return Err(Status::TOO_MANY_OPEN_ZONES.with_dnr(true));
        }
        let mut resets = Vec::new();
        for z in picked {
            resets.extend(self.send_one(z, action)?);
        }
        Ok(resets)
    }

    /// The Report Zones data for a `len`-byte buffer: header and descriptors of the zones
    /// from the one holding `slba` on that match `zras`; with `partial`, the header counts
    /// the descriptors that fit, else every matching zone.
    pub(super) fn report(
        &self,
        slba: u64,
        zras: u8,
        partial: bool,
        len: usize,
    ) -> Result<Vec<u8>, Status> {
        let want = match zras {
            zra::ALL => None,
            r => Some(zra::state(r).ok_or(Status::INVALID_FIELD.with_dnr(true))?),
        };
        let first = self.index(slba);
        let fit = len.saturating_sub(ZONE_DESCRIPTOR_SIZE) / ZONE_DESCRIPTOR_SIZE;
        let mut out = vec![0u8; len.max(ZONE_DESCRIPTOR_SIZE)];
        let mut matched = 0u64;
        let mut put = 0usize;
        for z in first..self.count() {
            let zone = self.zones[z];
            if want.is_some_and(|w| w != zone.state) {
                continue;
            }
            matched += 1;
            if put < fit {
                let d = ZoneDescriptor::new(zone.state, self.start(z), self.zcap, zone.wp);
                let o = ZONE_DESCRIPTOR_SIZE * (1 + put);
                out[o..o + ZONE_DESCRIPTOR_SIZE].copy_from_slice(&d.to_bytes());
                put += 1;
            }
        }
        let nz = if partial { put as u64 } else { matched };
        out[..8].copy_from_slice(&nz.to_le_bytes());
        out.truncate(len);
        Ok(out)
    }

    /// A controller shutdown (CC.SHN): every open zone becomes Closed, or Empty when
    /// nothing was written to it.
    pub(super) fn shutdown(&mut self) {
        for z in 0..self.count() {
            if self.zones[z].state.is_open() {
                let empty = self.zones[z].wp == self.start(z);
                self.set_state(
                    z,
                    if empty {
                        ZoneState::Empty
                    } else {
                        ZoneState::Closed
                    },
                );
            }
        }
    }

    /// MAR or MOR as Identify reports them: zero-based, FFFFFFFFh for no limit.
    pub(super) fn limit_field(max: u32) -> u32 {
        max.wrapping_sub(1)
    }

    #[cfg(test)]
    pub(super) fn state(&self, z: usize) -> (ZoneState, u64) {
        (self.zones[z].state, self.zones[z].wp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn implicit_open_closes_an_implicit_zone_and_explicit_ones_stay() {
        let mut z = Zones::new(64, 16, 16, 2, 3);
        for zslba in [0, 16] {
            let w = z.check_write(zslba, 1, false).unwrap();
            z.commit_write(w, 1);
        }
        assert_eq!(z.state(0).0, ZoneState::ImplicitlyOpened);
        // A third zone: zone 0 (implicitly opened) is closed to make room.
        let w = z.check_write(32, 1, false).unwrap();
        z.commit_write(w, 1);
        assert_eq!(z.state(0), (ZoneState::Closed, 1));
        assert_eq!((z.open, z.active), (2, 3));
        // A fourth zone would be a fourth active one.
        assert_eq!(
            z.check_write(48, 1, false).unwrap_err(),
            Status::TOO_MANY_ACTIVE_ZONES.with_dnr(true)
        );
        // Filling a zone releases both resources.
        let w = z.check_write(17, 15, false).unwrap();
        z.commit_write(w, 15);
        assert_eq!(z.state(1), (ZoneState::Full, 32));
        assert_eq!((z.open, z.active), (1, 2));
        // Explicitly opened zones are never closed behind the host's back.
        z.send(0, zsa::OPEN, false).unwrap();
        assert_eq!(z.state(0).0, ZoneState::ExplicitlyOpened);
        z.send(32, zsa::OPEN, false).unwrap();
        assert_eq!(
            z.check_write(48, 1, false).unwrap_err(),
            Status::TOO_MANY_OPEN_ZONES.with_dnr(true)
        );
    }

    #[test]
    fn a_zone_is_full_at_its_capacity_and_reports_it() {
        // Zones of 16 blocks with 12 writable: 12..16 of each zone is never written.
        let mut z = Zones::new(64, 16, 12, 0, 0);
        let w = z.check_write(16, 8, false).unwrap();
        z.commit_write(w, 8);
        assert_eq!(z.state(1), (ZoneState::ImplicitlyOpened, 24));
        // Past the capacity, though inside the zone: Zone Boundary Error, nothing changes.
        assert_eq!(
            z.check_write(24, 5, false).unwrap_err(),
            Status::ZONE_BOUNDARY_ERROR.with_dnr(true)
        );
        assert_eq!(
            z.check_write(16, 5, true).unwrap_err(),
            Status::ZONE_BOUNDARY_ERROR.with_dnr(true)
        );
        assert_eq!(z.state(1), (ZoneState::ImplicitlyOpened, 24));
        // Up to the capacity exactly: Full, and nothing more goes in.
        let w = z.check_write(16, 4, true).unwrap();
        assert_eq!(w.lba, 24);
        z.commit_write(w, 4);
        assert_eq!(z.state(1), (ZoneState::Full, 28));
        assert_eq!(
            z.check_write(16, 1, true).unwrap_err(),
            Status::ZONE_IS_FULL.with_dnr(true)
        );
        assert_eq!(
            z.check_write(28, 1, false).unwrap_err(),
            Status::ZONE_IS_FULL.with_dnr(true)
        );
        // Finish puts the write pointer at the end of the capacity too.
        z.send(32, zsa::FINISH, false).unwrap();
        assert_eq!(z.state(2), (ZoneState::Full, 44));
        // Every descriptor reports the capacity, not the size.
        let r = z.report(0, zra::ALL, false, 64 * 5).unwrap();
        let d: Vec<ZoneDescriptor> = crate::spec::zns::parse_report(&r).collect();
        assert_eq!(d.len(), 4);
        assert!(d.iter().all(|d| d.zcap == 12), "{d:?}");
        assert_eq!((d[1].zslba, d[1].wp), (16, 28));
        // A reset empties the zone: its write pointer back at its start.
        z.send(16, zsa::RESET, false).unwrap();
        assert_eq!(z.state(1), (ZoneState::Empty, 16));
    }
}

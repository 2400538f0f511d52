//! One emulated namespace as the controller holds it: its geometry, format and store.

use super::store::Store;
use super::{EmuError, EmuNamespace, EmuStore};

/// One emulated namespace.
pub(super) struct Ns {
    pub nsid: u32,
    /// log2 of the LBA size.
    pub lba_shift: u32,
    /// NSZE in blocks.
    pub nsze: u64,
    pub store: Store,
    /// Metadata, protection and command set as reported.
    pub format: super::EmuFormat,
}

impl Ns {
    /// Opens namespace `nsid` as configured: creates its store.
    pub(super) fn open(nsid: u32, n: &EmuNamespace) -> Result<Ns, EmuError> {
        let store = match &n.store {
            EmuStore::Memory => Store::memory(n.size_bytes),
            EmuStore::Null => Store::Null,
            EmuStore::File(path) => {
                Store::file(path, n.size_bytes).map_err(|source| EmuError::StoreFile {
                    nsid,
                    path: path.clone(),
                    source,
                })?
            }
        };
        Ok(Ns {
            nsid,
            lba_shift: n.lba_size.trailing_zeros(),
            nsze: n.size_bytes / n.lba_size as u64,
            store,
            format: n.format,
        })
    }
}

//! What a discovery controller offers: its Discovery log page (Log Identifier 70h), read
//! whole (header first for NUMREC, then every record) and checked for a stable
//! generation counter.

use crate::spec::fabrics::{parse_discovery_log, DiscEntry, DISC_RECORD_LEN, LID_DISCOVERY};
use crate::spec::{Sqe, NSID_ALL};

use super::ctrl::{TcpController, TcpOpenOptions};
use super::link::MAX_ADMIN_DATA;
use super::TcpError;

/// A discovery log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DiscoveryLog {
    /// GENCTR.
    pub genctr: u64,
    /// The records.
    pub entries: Vec<DiscEntry>,
}

fn get_log(c: &TcpController, offset: u64, len: usize) -> Result<Vec<u8>, TcpError> {
    let sqe = Sqe::get_log_page(LID_DISCOVERY, NSID_ALL, (len / 4) as u32, offset, 0, 0).to_bytes();
    let (cqe, data) = c.admin_command(sqe, &[], len)?;
    if !cqe.status().is_success() {
        return Err(TcpError::Status {
            addr: c.endpoint().to_string(),
            what: "get log page (discovery)",
            status: cqe.status(),
        });
    }
    Ok(data)
}

/// Connects to the discovery controller `opts` names and reads its log.
pub fn discover(opts: &TcpOpenOptions) -> Result<DiscoveryLog, TcpError> {
    let c = TcpController::open(opts)?;
    for _ in 0..4 {
        let head = get_log(&c, 0, DISC_RECORD_LEN)?;
        let numrec = u64::from_le_bytes(head[8..16].try_into().unwrap_or_default());
        let max = (MAX_ADMIN_DATA / DISC_RECORD_LEN - 1) as u64;
        let n = numrec.min(max) as usize;
        let all = get_log(&c, 0, DISC_RECORD_LEN * (1 + n))?;
        let Some((genctr, _, entries)) = parse_discovery_log(&all) else {
            continue;
        };
        if genctr == u64::from_le_bytes(head[0..8].try_into().unwrap_or_default()) {
            return Ok(DiscoveryLog { genctr, entries });
        }
    }
    Err(TcpError::Protocol {
        addr: c.endpoint().to_string(),
        why: "the discovery log kept changing while it was read".into(),
    })
}

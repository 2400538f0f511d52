//! The host's identity on the fabric: its NQN and 16-byte host identifier. As nvme-cli does,
//! `/etc/nvme/hostnqn` and `/etc/nvme/hostid` are used when present; otherwise both are
//! derived from `/etc/machine-id`, so a machine presents the same identity every time (a
//! target's allow-list keeps working across restarts).

use std::path::Path;

use crate::parse::target::tcp::{parse_uuid, uuid_text};

/// The NQN prefix of a host named by its UUID.
pub const UUID_NQN_PREFIX: &str = "nqn.2014-08.org.nvmexpress:uuid:";

/// A host NQN and host identifier.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostIdentity {
    /// The host NQN.
    pub nqn: String,
    /// The host identifier.
    pub id: [u8; 16],
}

/// The machine's identity: from `/etc/nvme`, else from `/etc/machine-id`.
pub fn default_identity() -> HostIdentity {
    identity_from(Path::new("/etc/nvme"), Path::new("/etc/machine-id"))
}

fn read_trimmed(p: &Path) -> Option<String> {
    let s = std::fs::read_to_string(p).ok()?;
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

/// A UUID (version 4 layout: the version and variant bits set) from 16 bytes.
fn as_uuid(mut b: [u8; 16]) -> [u8; 16] {
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    b
}

/// 16 bytes that stand for this machine: `/etc/machine-id` (32 hex digits), else CRC32C
/// over the host name four ways.
fn machine_bytes(machine_id: &Path) -> [u8; 16] {
    if let Some(s) = read_trimmed(machine_id) {
        if s.len() == 32 {
            let mut out = [0u8; 16];
            let ok = out.iter_mut().enumerate().all(|(i, o)| {
                u8::from_str_radix(&s[2 * i..2 * i + 2], 16)
                    .map(|v| *o = v)
                    .is_ok()
            });
            if ok {
                return out;
            }
        }
    }
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let mut out = [0u8; 16];
    for (k, chunk) in out.chunks_exact_mut(4).enumerate() {
        let c = crc32c::crc32c_append(k as u32, name.trim().as_bytes());
        chunk.copy_from_slice(&c.to_le_bytes());
    }
    out
}

/// The identity from the files of `nvme_dir` (`hostnqn`, `hostid`) or `machine_id`.
pub fn identity_from(nvme_dir: &Path, machine_id: &Path) -> HostIdentity {
    let valid = |s: &str| {
        s.len() > 4 && s.len() <= 223 && s.starts_with("nqn.") && !s.contains(char::is_whitespace)
    };
    let nqn = read_trimmed(&nvme_dir.join("hostnqn")).filter(|s| valid(s));
    let id = read_trimmed(&nvme_dir.join("hostid")).and_then(|s| parse_uuid(&s));
    let derived = as_uuid(machine_bytes(machine_id));
    let id = id
        .or_else(|| {
            nqn.as_deref()
                .and_then(|n| n.strip_prefix(UUID_NQN_PREFIX))
                .and_then(parse_uuid)
        })
        .unwrap_or(derived);
    let nqn = nqn.unwrap_or_else(|| format!("{UUID_NQN_PREFIX}{}", uuid_text(&id)));
    HostIdentity { nqn, id }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_first_then_machine_id() {
        let d = tempfile::tempdir().unwrap();
        let nvme = d.path().join("nvme");
        std::fs::create_dir(&nvme).unwrap();
        let mid = d.path().join("machine-id");
        std::fs::write(&mid, "0123456789abcdef0123456789abcdef\n").unwrap();
        // Nothing in /etc/nvme: both from the machine id, stable.
        let a = identity_from(&nvme, &mid);
        assert_eq!(a, identity_from(&nvme, &mid));
        assert_eq!(uuid_text(&a.id), "01234567-89ab-4def-8123-456789abcdef");
        assert_eq!(a.nqn, format!("{UUID_NQN_PREFIX}{}", uuid_text(&a.id)));
        // A hostnqn with a uuid gives the id too.
        let n = "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
        std::fs::write(nvme.join("hostnqn"), format!("{n}\n")).unwrap();
        let b = identity_from(&nvme, &mid);
        assert_eq!(b.nqn, n);
        assert_eq!(uuid_text(&b.id), "11111111-2222-3333-4444-555555555555");
        // hostid wins for the id.
        std::fs::write(nvme.join("hostid"), "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee").unwrap();
        let c = identity_from(&nvme, &mid);
        assert_eq!(uuid_text(&c.id), "aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee");
        // A malformed hostnqn is ignored.
        std::fs::write(nvme.join("hostnqn"), "not an nqn").unwrap();
        assert!(identity_from(&nvme, &mid).nqn.starts_with(UUID_NQN_PREFIX));
    }
}

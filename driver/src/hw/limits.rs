//! Process and system limits, as text for error messages: which limit stopped an
//! operation, its current value, and how to raise it. Every layer that can run into a
//! limit (DMA memory locking, hugepages, open files, file size) words it from here, so the
//! messages agree.

use rustix::process::{getrlimit, Resource};

/// A per-process resource limit that Kestrel can run into.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// `RLIMIT_MEMLOCK`: bytes of memory that may be locked (hugepage DMA memory, VFIO
    /// type1 pinning, io_uring fixed buffers).
    Memlock,
    /// `RLIMIT_NOFILE`: open file descriptors.
    Nofile,
    /// `RLIMIT_FSIZE`: the largest file this process may write.
    Fsize,
}

impl Limit {
    fn resource(self) -> Resource {
        match self {
            Limit::Memlock => Resource::Memlock,
            Limit::Nofile => Resource::Nofile,
            Limit::Fsize => Resource::Fsize,
        }
    }

    /// The soft (current) and hard limits; `None` is unlimited.
    pub fn get(self) -> (Option<u64>, Option<u64>) {
        let r = getrlimit(self.resource());
        (r.current, r.maximum)
    }

    /// The soft limit, `None` when unlimited.
    pub fn soft(self) -> Option<u64> {
        self.get().0
    }

    fn unit(self) -> &'static str {
        match self {
            Limit::Memlock | Limit::Fsize => " bytes",
            Limit::Nofile => "",
        }
    }

    /// `8388608 bytes (hard limit 8388608 bytes)`, `unlimited`, ...
    pub fn text(self) -> String {
        let unit = self.unit();
        match self.get() {
            (None, _) => "unlimited".into(),
            (Some(s), None) => format!("{s}{unit} (hard limit unlimited)"),
            (Some(s), Some(h)) => format!("{s}{unit} (hard limit {h}{unit})"),
        }
    }

    /// How to raise it, as a clause for a message.
    pub fn how_to_raise(self) -> &'static str {
        match self {
            Limit::Memlock => "raise it with `ulimit -l unlimited` in the shell that starts kestrel, `LimitMEMLOCK=infinity` in a systemd unit, or `<user> - memlock unlimited` in /etc/security/limits.conf (root with CAP_IPC_LOCK has no limit)",
            Limit::Nofile => "raise it with `ulimit -n <n>` (up to the hard limit) in the shell that starts kestrel, `LimitNOFILE=<n>` in a systemd unit, or `<user> - nofile <n>` in /etc/security/limits.conf",
            Limit::Fsize => "raise it with `ulimit -f unlimited` in the shell that starts kestrel, `LimitFSIZE=infinity` in a systemd unit, or `<user> - fsize unlimited` in /etc/security/limits.conf",
        }
    }
}

/// Text for "too many open files": `EMFILE` names the process limit, `ENFILE` the
/// system-wide one. `None` for other errors.
pub fn open_files_text(errno: Option<i32>) -> Option<String> {
    match errno {
        Some(libc::EMFILE) => Some(format!(
            "too many open files: the open-file limit (RLIMIT_NOFILE, `ulimit -n`) is {}; {}",
            Limit::Nofile.text(),
            Limit::Nofile.how_to_raise()
        )),
        Some(libc::ENFILE) => Some(format!(
            "too many open files in the system: fs.file-max is {}; raise it as root with `sysctl -w fs.file-max=<n>` (persist it in /etc/sysctl.d/)",
            std::fs::read_to_string("/proc/sys/fs/file-max")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".into())
        )),
        _ => None,
    }
}

/// The default hugepage size in KiB (`Hugepagesize` in /proc/meminfo), the size
/// `vm.nr_hugepages` counts.
pub fn default_hugepage_kib() -> Option<usize> {
    let s = std::fs::read_to_string("/proc/meminfo").ok()?;
    s.lines()
        .find_map(|l| l.strip_prefix("Hugepagesize:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_name_the_limit_and_the_remedy() {
        let t = Limit::Nofile.text();
        let (soft, _) = Limit::Nofile.get();
        match soft {
            Some(n) => assert!(t.starts_with(&n.to_string()), "{t}"),
            None => assert_eq!(t, "unlimited"),
        }
        assert!(Limit::Fsize.how_to_raise().contains("ulimit -f"));
        assert!(Limit::Memlock.how_to_raise().contains("ulimit -l"));
        assert!(Limit::Memlock.how_to_raise().contains("limits.conf"));
        let m = open_files_text(Some(libc::EMFILE)).unwrap();
        assert!(
            m.contains("RLIMIT_NOFILE") && m.contains("ulimit -n"),
            "{m}"
        );
        let m = open_files_text(Some(libc::ENFILE)).unwrap();
        assert!(m.contains("fs.file-max"), "{m}");
        assert!(open_files_text(Some(libc::EIO)).is_none());
    }
}

//! Who holds a VFIO group node open, for the message of a group the kernel says is busy
//! (it allows one opener at a time): the processes with a descriptor linked to the node,
//! found by reading the `fd` links of every process below a proc root (`/proc`, or a fake
//! tree in tests). This process among them is named as such: a controller, queue pair or
//! DMA memory it still holds has the device open, which no other process is to blame for.

use std::path::Path;

/// The most fd links looked at (a busy host has some hundred thousand).
const MAX_FD_READS: usize = 200_000;
/// The most holders named in a message.
const MAX_HOLDERS: usize = 8;

/// A process with a descriptor on the node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Holder {
    /// Its pid.
    pub pid: u32,
    /// Its command name (`PROC/PID/comm`), `?` when unreadable.
    pub comm: String,
}

/// The processes below `proc_root` with a descriptor linked to `node`, and whether every
/// process could be looked at (false when a process's `fd` directory was unreadable, as
/// another user's is, or a bound was reached).
pub(crate) fn holders(proc_root: &Path, node: &Path) -> (Vec<Holder>, bool) {
    let canonical = node.canonicalize().ok();
    let is_node = |target: &Path| target == node || canonical.as_deref() == Some(target);
    let Ok(dir) = std::fs::read_dir(proc_root) else {
        return (Vec::new(), false);
    };
    let mut pids: Vec<u32> = dir
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    let (mut out, mut complete, mut reads) = (Vec::new(), true, 0usize);
    for pid in pids {
        if out.len() >= MAX_HOLDERS || reads >= MAX_FD_READS {
            complete = false;
            break;
        }
        let Ok(fds) = std::fs::read_dir(proc_root.join(pid.to_string()).join("fd")) else {
            complete = false;
            continue;
        };
        let mut found = false;
        for fd in fds.flatten() {
            reads += 1;
            if std::fs::read_link(fd.path()).is_ok_and(|t| is_node(&t)) {
                found = true;
                break;
            }
        }
        if found {
            let comm = std::fs::read_to_string(proc_root.join(pid.to_string()).join("comm"))
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "?".into());
            out.push(Holder { pid, comm });
        }
    }
    (out, complete)
}

/// Who holds `node`, in words (`me`: this process's pid): each holder by pid and name,
/// this process as such; or why nobody could be named.
pub(crate) fn holders_text(node: &Path, holders: &[Holder], complete: bool, me: u32) -> String {
    if holders.is_empty() {
        return if complete {
            "no process with it open was found (it may be in another pid namespace, or was \
             closed a moment ago: try again)"
                .into()
        } else {
            format!(
                "no process this user can see has it open (another user's kestrel, qemu or \
                 spdk?): `fuser -v {}` as root shows it",
                node.display()
            )
        };
    }
    let others = holders.iter().filter(|h| h.pid != me).count();
    let mut list: Vec<String> = holders
        .iter()
        .map(|h| {
            if h.pid == me {
                format!(
                    "this process (pid {}, {}) already has it open: a controller, queue pair \
                     or dma memory of this process still holds the device (drop them before \
                     opening it again; a queue pair whose deletion failed keeps its memory \
                     mapped for good)",
                    h.pid, h.comm
                )
            } else {
                format!("pid {} ({}) has it open", h.pid, h.comm)
            }
        })
        .collect();
    if others > 0 {
        list.push(format!(
            "stop {} first",
            if others == 1 { "it" } else { "them" }
        ));
    }
    list.join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake proc tree: `pid -> (comm, fd links)`.
    fn fake_proc(root: &Path, procs: &[(u32, &str, &[&Path])]) {
        for (pid, comm, links) in procs {
            let dir = root.join(pid.to_string());
            std::fs::create_dir_all(dir.join("fd")).unwrap();
            std::fs::write(dir.join("comm"), format!("{comm}\n")).unwrap();
            for (i, target) in links.iter().enumerate() {
                std::os::unix::fs::symlink(target, dir.join("fd").join(i.to_string())).unwrap();
            }
        }
        // Not a process: skipped.
        std::fs::create_dir_all(root.join("sys")).unwrap();
        std::os::unix::fs::symlink("1", root.join("self")).unwrap();
    }

    #[test]
    fn another_process_holding_the_group_is_named_by_pid_and_command() {
        let tmp = tempfile::tempdir().unwrap();
        let proc_root = tmp.path().join("proc");
        let node = Path::new("/dev/vfio/7");
        let other = Path::new("/dev/vfio/8");
        fake_proc(
            &proc_root,
            &[
                (17, "bash", &[Path::new("/dev/null"), other]),
                (4242, "qemu-system-x86", &[Path::new("/dev/null"), node]),
            ],
        );
        let (h, complete) = holders(&proc_root, node);
        assert!(complete);
        assert_eq!(
            h,
            vec![Holder {
                pid: 4242,
                comm: "qemu-system-x86".into()
            }]
        );
        let text = holders_text(node, &h, complete, 1);
        assert_eq!(
            text,
            "pid 4242 (qemu-system-x86) has it open; stop it first"
        );
    }

    #[test]
    fn this_process_holding_the_group_is_said_to_be_this_one() {
        let tmp = tempfile::tempdir().unwrap();
        let proc_root = tmp.path().join("proc");
        let node = Path::new("/dev/vfio/noiommu-0");
        let me = std::process::id();
        fake_proc(&proc_root, &[(me, "kestrel-hw-test", &[node])]);
        let (h, complete) = holders(&proc_root, node);
        let text = holders_text(node, &h, complete, me);
        assert!(
            text.starts_with(&format!(
                "this process (pid {me}, kestrel-hw-test) already has it open"
            )),
            "{text}"
        );
        assert!(text.contains("drop them before opening it again"), "{text}");
    }

    #[test]
    fn nobody_found_says_why() {
        let tmp = tempfile::tempdir().unwrap();
        let proc_root = tmp.path().join("proc");
        let node = Path::new("/dev/vfio/3");
        fake_proc(&proc_root, &[(5, "sh", &[Path::new("/dev/null")])]);
        let (h, complete) = holders(&proc_root, node);
        assert!(h.is_empty() && complete);
        assert!(holders_text(node, &h, complete, 1).contains("no process with it open"));
        // An unreadable fd directory (another user's process): not complete.
        std::fs::create_dir_all(proc_root.join("6")).unwrap();
        let (h, complete) = holders(&proc_root, node);
        assert!(h.is_empty() && !complete);
        let text = holders_text(node, &h, complete, 1);
        assert!(text.contains("`fuser -v /dev/vfio/3` as root"), "{text}");
        // No proc tree at all.
        let (h, complete) = holders(&tmp.path().join("nothing"), node);
        assert!(h.is_empty() && !complete);
    }
}

//! Counting the system calls a poller makes in the measured window (`perf --count-syscalls`).
//!
//! A polled-mode driver's steady state makes no system call: submissions and completions
//! are memory and MMIO. This module proves it for a real run instead of asserting it. The
//! poller thread installs, on itself only, a seccomp filter whose every verdict is
//! `SECCOMP_RET_USER_NOTIF` (Linux 5.5+ for the `CONTINUE` answer). Each of its system calls
//! then waits until a supervisor thread, started before the filter and so not filtered
//! itself, has looked at it and answered "continue": the call runs unchanged. The
//! supervisor counts the calls made while the poller says it is inside the window.
//!
//! The flag is read by the supervisor while the poller is blocked in the very call being
//! counted, so the poller cannot have moved it in between: the count is exact, not
//! sampled. Calls outside the window (setup, the drain, thread exit) pass uncounted, only
//! slower. The filter stays with the thread until it exits (seccomp filters cannot be
//! removed); the supervisor leaves when the listener reports that no thread is left under
//! the filter.
//!
//! All `unsafe` of the app's syscall counting is here.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// What the poller and its supervisor share.
#[derive(Debug, Default)]
pub struct SyscallCount {
    /// The poller is inside the measured window.
    armed: AtomicBool,
    /// Calls counted while armed.
    in_window: AtomicU64,
    /// The number of the first call counted (-1: none).
    first_nr: AtomicI64,
    /// Calls seen in all (armed or not): shows the supervisor was really in the path.
    seen: AtomicU64,
}

impl SyscallCount {
    /// Marks the start of the window (no system call).
    #[inline]
    pub fn arm(&self) {
        // Release: the supervisor reading the flag while this thread is blocked in a later
        // call sees it set.
        self.armed.store(true, Ordering::Release);
    }

    /// Marks the end of the window (no system call).
    #[inline]
    pub fn disarm(&self) {
        self.armed.store(false, Ordering::Release);
    }

    /// Calls counted in the window, and the first one's number.
    pub fn result(&self) -> (u64, Option<i64>) {
        let nr = self.first_nr.load(Ordering::Acquire);
        (
            self.in_window.load(Ordering::Acquire),
            (nr >= 0).then_some(nr),
        )
    }

    /// Calls the supervisor answered in all.
    pub fn seen(&self) -> u64 {
        self.seen.load(Ordering::Acquire)
    }
}

/// Installs the counting filter on the calling thread and starts its supervisor.
///
/// Errors: the kernel refuses the filter (no seccomp, no user notification before Linux
/// 5.0, or a container that forbids it); the message says so.
pub fn count_this_thread() -> io::Result<Arc<SyscallCount>> {
    let count = Arc::new(SyscallCount {
        first_nr: AtomicI64::new(-1),
        ..Default::default()
    });
    let fd = Arc::new(AtomicI32::new(-1));
    let failed = Arc::new(AtomicBool::new(false));
    // The supervisor is started first: a thread created after the filter would inherit it.
    {
        let (count, fd, failed) = (Arc::clone(&count), Arc::clone(&fd), Arc::clone(&failed));
        std::thread::Builder::new()
            .name("kestrel-syscalls".into())
            .spawn(move || supervise(&count, &fd, &failed))?;
    }
    match install_filter() {
        Ok(listener) => {
            // Release: the supervisor that sees the descriptor may use it.
            fd.store(listener, Ordering::Release);
            Ok(count)
        }
        Err(e) => {
            failed.store(true, Ordering::Release);
            Err(io::Error::new(
                e.kind(),
                format!(
                    "cannot count system calls: seccomp user notification refused ({e}); it needs Linux 5.5 or later and a kernel and container that allow seccomp filters"
                ),
            ))
        }
    }
}

/// The filter: every call of this thread goes to the listener. Returns the listener.
fn install_filter() -> io::Result<i32> {
    let mut prog = [libc::sock_filter {
        code: (libc::BPF_RET | libc::BPF_K) as u16,
        jt: 0,
        jf: 0,
        k: libc::SECCOMP_RET_USER_NOTIF,
    }];
    let fprog = libc::sock_fprog {
        len: prog.len() as u16,
        filter: prog.as_mut_ptr(),
    };
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integer arguments only; it lets an unprivileged
    // thread install a filter and affects this thread (and later children) only.
    if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fprog` points at `prog`, both alive for the call (the kernel copies the
    // program). Without SECCOMP_FILTER_FLAG_TSYNC the filter applies to this thread only.
    let r = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &fprog as *const libc::sock_fprog,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r as i32)
}

/// The supervisor: answers every notification with "continue", counting the armed ones,
/// until no thread is left under the filter.
fn supervise(count: &SyscallCount, fd: &AtomicI32, failed: &AtomicBool) {
    let fd = loop {
        let f = fd.load(Ordering::Acquire);
        if f >= 0 {
            break f;
        }
        if failed.load(Ordering::Acquire) {
            return;
        }
        std::thread::sleep(Duration::from_micros(200));
    };
    loop {
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call.
        let n = unsafe { libc::poll(&mut p, 1, 1000) };
        if n < 0 {
            if io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            break;
        }
        if n == 0 {
            continue;
        }
        if p.revents & libc::POLLIN == 0 {
            // POLLHUP: the filtered thread is gone.
            break;
        }
        // SAFETY: seccomp_notif is plain data; the kernel requires it zeroed before RECV.
        let mut req: libc::seccomp_notif = unsafe { std::mem::zeroed() };
        // SAFETY: `req` is a valid, zeroed seccomp_notif for the kernel to fill.
        if unsafe { libc::ioctl(fd, libc::SECCOMP_IOCTL_NOTIF_RECV, &mut req) } != 0 {
            // ENOENT: the call was interrupted before we took it; nothing to answer.
            continue;
        }
        count.seen.fetch_add(1, Ordering::Relaxed);
        // Acquire: pairs with arm/disarm; the poller is blocked in this call.
        if count.armed.load(Ordering::Acquire) {
            let _ = count.first_nr.compare_exchange(
                -1,
                i64::from(req.data.nr),
                Ordering::AcqRel,
                Ordering::Relaxed,
            );
            count.in_window.fetch_add(1, Ordering::AcqRel);
        }
        let mut resp = libc::seccomp_notif_resp {
            id: req.id,
            val: 0,
            error: 0,
            flags: libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32,
        };
        // SAFETY: `resp` is a valid seccomp_notif_resp for the notification just received.
        // An error (ENOENT: the caller went away) leaves nothing to do.
        let _ = unsafe { libc::ioctl(fd, libc::SECCOMP_IOCTL_NOTIF_SEND, &mut resp) };
    }
    // SAFETY: the listener is ours and nothing else uses it any more.
    unsafe { libc::close(fd) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The counter sees exactly the calls made while armed, and the thread still works.
    #[test]
    fn counts_exactly_the_calls_made_while_armed() {
        let got = std::thread::spawn(|| {
            let c = match count_this_thread() {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("skipped: {e}");
                    return None;
                }
            };
            // Outside the window: passes, uncounted.
            let _ = std::fs::metadata("/");
            c.arm();
            let mut x = 0u64;
            for i in 0..1_000_000u64 {
                x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(i));
            }
            c.disarm();
            let quiet = c.result();
            c.arm();
            // SAFETY: getppid has no preconditions.
            let ppid = unsafe { libc::getppid() };
            // SAFETY: as above.
            let ppid2 = unsafe { libc::getppid() };
            c.disarm();
            let busy = c.result();
            assert_eq!(ppid, ppid2);
            assert!(ppid > 0, "the calls ran and returned their real result");
            Some((quiet, busy, c.seen()))
        })
        .join()
        .unwrap();
        let Some((quiet, busy, seen)) = got else {
            return;
        };
        assert_eq!(quiet, (0, None), "no call in a pure loop");
        assert_eq!(busy, (2, Some(libc::SYS_getppid)));
        assert!(seen >= 3, "{seen}");
    }
}

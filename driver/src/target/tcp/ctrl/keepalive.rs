//! The Keep Alive thread and controller recovery: Keep Alive every KATO/2 on the admin
//! connection; when it fails (or an I/O queue that lost its connection asks), a new admin
//! connection and controller (Connect, CC.EN, Number of Queues) with back-off, until the
//! controller loss timeout; the I/O queues then connect again with the new CNTLID. Past
//! the timeout the controller is lost, and its queues fail what they hold.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::spec::{admin_opc, Sqe};

use super::{connect_admin, set_queues, Admin};

/// The first wait between reconnect attempts; it doubles up to [`MAX_BACKOFF`].
pub(in crate::target::tcp) const FIRST_BACKOFF: Duration = Duration::from_millis(50);
/// The longest wait between reconnect attempts.
pub(in crate::target::tcp) const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// What the thread has been asked.
#[derive(Default)]
pub(super) struct Asked {
    stop: bool,
    kick: bool,
}

/// Why a wait ended.
enum Woke {
    Stop,
    Time,
    Kick,
}

impl Admin {
    /// Waits up to `d`, or until asked to stop or to look now.
    fn wait(&self, d: Duration) -> Woke {
        let g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (mut g, _) = self
            .wake
            .wait_timeout_while(g, d, |a| !a.stop && !a.kick)
            .unwrap_or_else(|p| p.into_inner());
        if g.stop {
            return Woke::Stop;
        }
        if std::mem::take(&mut g.kick) {
            return Woke::Kick;
        }
        Woke::Time
    }

    /// Asks the thread to stop.
    pub(super) fn stop(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).stop = true;
        self.wake.notify_all();
    }

    /// Asks the thread to look at the admin connection now.
    pub(super) fn kick(&self) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).kick = true;
        self.wake.notify_all();
    }

    /// One Keep Alive; `Err` when the admin connection is gone.
    fn keep_alive(&self) -> Result<(), super::TcpError> {
        let sqe = Sqe::new(admin_opc::KEEP_ALIVE).to_bytes();
        let mut link = self.link();
        let (cqe, _) = link.command(sqe, &[], 0)?;
        link.check(&cqe, "keep alive")
    }

    /// A new controller, tried with back-off until the controller loss timeout; false
    /// when it could not be made (or the thread was asked to stop).
    fn recover(&self, why: &super::TcpError) -> bool {
        let addr = self.opts.endpoint.to_string();
        tracing::warn!(%addr, error = %why, "nvme/tcp admin connection lost; reconnecting");
        let start = Instant::now();
        let mut delay = FIRST_BACKOFF;
        loop {
            let made = connect_admin(&self.opts).and_then(|(mut link, cntlid, _, _)| {
                set_queues(&mut link, self.opts.queues)?;
                Ok((link, cntlid))
            });
            match made {
                Ok((link, cntlid)) => {
                    *self.link() = link;
                    self.cntlid.store(u32::from(cntlid), Ordering::Release);
                    tracing::info!(%addr, cntlid, "nvme/tcp controller reconnected");
                    return true;
                }
                Err(e) => tracing::debug!(%addr, error = %e, "nvme/tcp reconnect failed"),
            }
            if start.elapsed() >= self.opts.ctrl_loss_tmo {
                tracing::warn!(%addr, after = ?self.opts.ctrl_loss_tmo, "nvme/tcp controller lost: not reached again within ctrl_loss_tmo");
                return false;
            }
            if let Woke::Stop = self.wait(delay) {
                return false;
            }
            delay = (delay * 2).min(MAX_BACKOFF);
        }
    }
}

/// The thread: Keep Alive every KATO/2 (only when asked when KATO is zero), recovery when
/// it fails.
fn run(a: Arc<Admin>) {
    let every = if a.opts.kato.is_zero() {
        Duration::from_secs(3600)
    } else {
        a.opts.kato / 2
    };
    loop {
        if let Woke::Stop = a.wait(every) {
            return;
        }
        if let Err(e) = a.keep_alive() {
            if !a.recover(&e) {
                a.lost.store(true, Ordering::Release);
                return;
            }
        }
    }
}

/// Starts the thread.
pub(super) fn start(admin: &Arc<Admin>) -> Option<JoinHandle<()>> {
    let a = Arc::clone(admin);
    std::thread::Builder::new()
        .name("kestrel-tcp-ka".into())
        .spawn(move || run(a))
        .map_err(|e| tracing::warn!(error = %e, "cannot start the nvme/tcp keep alive thread"))
        .ok()
}

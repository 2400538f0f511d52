//! The Keep Alive thread and controller recovery: Keep Alive every KATO/2 on the admin
//! connection, asynchronous events looked for every [`EVENT_POLL`]; when the connection
//! fails (or an I/O queue that lost its connection asks), a new admin connection and
//! controller (Connect, CC.EN, Number of Queues, events) with back-off, until the
//! controller loss timeout; the I/O queues then connect again with the new CNTLID. Past
//! the timeout the controller is lost, and its queues fail what they hold.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::spec::{admin_opc, lid, AsyncEvent, Sqe, NSID_ALL};

use super::{connect_admin, enable_events, set_queues, Admin};

/// How often the thread looks for an asynchronous event's completion in the socket.
pub(in crate::target::tcp) const EVENT_POLL: Duration = Duration::from_millis(100);
/// Asynchronous events handled per look at most.
const EVENTS_PER_LOOK: usize = 8;

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

    /// Handles the asynchronous events that came: each is logged and kept, its log page
    /// read (RAE cleared, so the controller reports that type again) and a new request
    /// sent. A request completed with an error is not sent again (the controller refuses
    /// or aborted it). `Err` when the admin connection is gone.
    fn events(&self) -> Result<(), super::TcpError> {
        // Bounded per look: a controller that completes every request at once cannot hold
        // the thread (the rest waits for the next look, EVENT_POLL later).
        for _ in 0..EVENTS_PER_LOOK {
            let mut link = self.link();
            let Some(cqe) = link.take_event()? else {
                return Ok(());
            };
            let status = cqe.status();
            if !status.is_success() {
                tracing::debug!(addr = %self.opts.endpoint, %status, "nvme/tcp: asynchronous event request ended with an error; not sent again");
                return Ok(());
            }
            let e = AsyncEvent::from_dw0(cqe.dw0);
            tracing::info!(addr = %self.opts.endpoint, event = e.name(), kind = e.kind, info = e.info, log_page = e.log_page, "nvme/tcp asynchronous event");
            self.note_event(e);
            let len = e.clear_len();
            let sqe = Sqe::get_log_page(e.log_page, NSID_ALL, (len / 4) as u32, 0, 0, 0).to_bytes();
            let (c, log) = link.command(sqe, &[], len)?;
            match link.check(&c, "get log page (clearing an asynchronous event)") {
                Err(err) => {
                    tracing::debug!(error = %err, "nvme/tcp: the event's log page was not read")
                }
                Ok(()) if e.log_page == lid::CHANGED_NAMESPACES => {
                    // Targets opened on this controller keep the geometry they opened with:
                    // say which namespaces changed, and what to do.
                    let changed = changed_namespaces(&log);
                    tracing::warn!(addr = %self.opts.endpoint, nqn = %self.opts.subnqn, namespaces = ?changed, "nvme/tcp: namespaces changed on the controller; open it again to see them (targets already open keep their size and format)");
                }
                Ok(()) => {}
            }
            link.arm_event()?;
        }
        Ok(())
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
                if let Some(oaes) = self.oaes {
                    enable_events(&mut link, oaes)?;
                }
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

/// The NSIDs a Changed Namespace List names (zero ends the list); `[FFFFFFFFh]` when more
/// than 1024 changed (the log says so in its first entry), as the controller wrote it.
fn changed_namespaces(log: &[u8]) -> Vec<u32> {
    log.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .take_while(|&n| n != 0)
        .take(1024)
        .collect()
}

/// The thread: Keep Alive every KATO/2 (only when asked when KATO is zero), asynchronous
/// events every [`EVENT_POLL`] while a request is outstanding, recovery when either fails.
fn run(a: Arc<Admin>) {
    let every = if a.opts.kato.is_zero() {
        Duration::from_secs(3600)
    } else {
        a.opts.kato / 2
    };
    let mut next = Instant::now() + every;
    loop {
        let mut wait = next.saturating_duration_since(Instant::now());
        if a.link().event_armed() {
            wait = wait.min(EVENT_POLL);
        }
        let r = match a.wait(wait) {
            Woke::Stop => return,
            Woke::Kick => a.keep_alive(),
            Woke::Time if Instant::now() >= next => a.keep_alive(),
            Woke::Time => Ok(()),
        };
        let r = r.and_then(|()| a.events());
        if Instant::now() >= next {
            next = Instant::now() + every;
        }
        if let Err(e) = r {
            if !a.recover(&e) {
                a.lost.store(true, Ordering::Release);
                return;
            }
            next = Instant::now() + every;
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

#[cfg(test)]
mod tests {
    use super::changed_namespaces;

    #[test]
    fn changed_namespace_list() {
        let mut log = vec![0u8; 4096];
        log[0..4].copy_from_slice(&2u32.to_le_bytes());
        log[4..8].copy_from_slice(&7u32.to_le_bytes());
        assert_eq!(changed_namespaces(&log), vec![2, 7]);
        assert!(changed_namespaces(&[0u8; 4096]).is_empty());
        log[0..4].copy_from_slice(&u32::MAX.to_le_bytes());
        log[4..8].fill(0);
        assert_eq!(
            changed_namespaces(&log),
            vec![u32::MAX],
            "more than 1024 changed"
        );
        assert_eq!(changed_namespaces(&[0xffu8; 4096]).len(), 1024, "bounded");
    }
}

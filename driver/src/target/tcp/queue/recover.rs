//! A lost connection: its requests are kept, the connection is made again with back-off
//! (the controller too, by the Keep Alive thread, when it is gone), and the requests are
//! sent again from their start; a write is completed only by a response to it, so none
//! that the controller did not acknowledge is reported done. A request whose command was
//! past its deadline completes with a timeout instead. Past the controller loss timeout
//! (or with none) every request fails.

use std::time::{Duration, Instant};

use crate::io::IoError;

use super::super::ctrl::{FIRST_BACKOFF, MAX_BACKOFF};
use super::{open_conn, TcpQueue};

/// A connection being made again.
#[derive(Clone, Copy, Debug)]
pub(super) struct Recon {
    since: Instant,
    next: Instant,
    delay: Duration,
}

impl TcpQueue {
    /// Frees every command slot; the requests of commands past their deadline are marked
    /// timed out.
    fn drop_commands(&mut self) {
        let now = Instant::now();
        for cid in 0..self.cmds.len() {
            let c = &mut self.cmds[cid];
            if c.live {
                c.live = false;
                if now >= c.deadline {
                    self.reqs[c.req as usize].err = Some(IoError::Timeout);
                }
                self.free_cids.push(cid as u16);
            }
        }
        self.txq.clear();
        self.reset_rx();
    }

    /// Closes the connection for good: every request still at the controller or waiting
    /// fails with `err` (those with a command past its deadline with a timeout), and every
    /// later one too.
    pub(super) fn fail_all(&mut self, err: IoError, why: &dyn std::fmt::Display) {
        tracing::warn!(addr = %self.addr, qid = self.qid, error = %why, "nvme/tcp i/o queue failed; its requests fail");
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
        self.failed = Some(err);
        self.recon = None;
        self.drop_commands();
        self.pending.clear();
        for ri in 0..self.reqs.len() as u16 {
            if self.reqs[ri as usize].live {
                let own = self.reqs[ri as usize]
                    .err
                    .filter(|e| *e == IoError::Timeout);
                self.finish(ri, Some(own.unwrap_or(err)));
            }
        }
    }

    /// Starts making the connection again: the requests wait, from their start.
    pub(super) fn begin_reconnect(&mut self, why: &dyn std::fmt::Display) {
        tracing::warn!(addr = %self.addr, qid = self.qid, error = %why, "nvme/tcp i/o queue lost its connection; reconnecting");
        let _ = self.sock.shutdown(std::net::Shutdown::Both);
        self.drop_commands();
        self.pending.clear();
        for ri in 0..self.reqs.len() as u16 {
            let r = &mut self.reqs[ri as usize];
            if !r.live {
                continue;
            }
            if r.err == Some(IoError::Timeout) {
                self.finish(ri, None);
                continue;
            }
            r.issued = 0;
            r.cmds = 0;
            r.err = None;
            r.value = 0;
            self.stats.retries += 1;
            self.pending.push_back(ri);
        }
        self.stats.resets += 1;
        let now = Instant::now();
        self.recon = Some(Recon {
            since: now,
            next: now,
            delay: FIRST_BACKOFF,
        });
        self.ctrl.kick();
    }

    /// One attempt, when its time has come; gives up past the controller loss timeout.
    pub(super) fn try_reconnect(&mut self) {
        let Some(mut r) = self.recon else { return };
        let now = Instant::now();
        let tmo = self.ctrl.options().ctrl_loss_tmo;
        if self.ctrl.is_lost() || now.duration_since(r.since) >= tmo {
            let why = format!("not reconnected within ctrl_loss_tmo ({tmo:?})");
            self.fail_all(IoError::Os(libc::ENOTCONN), &why);
            return;
        }
        if now < r.next {
            return;
        }
        match open_conn(&self.ctrl, self.qid, self.depth) {
            Ok((sock, neg, _)) => {
                tracing::info!(addr = %self.addr, qid = self.qid, waiting = self.pending.len(), "nvme/tcp i/o queue reconnected");
                if let Some(w) = &self.wake {
                    // The poller watches `wake`, not the socket: the new socket joins it
                    // (the old one left it when it closed). Without it the poller would
                    // hear this queue only at its wait's time-out.
                    if let Err(e) = super::watch(w, &sock) {
                        tracing::warn!(addr = %self.addr, qid = self.qid, error = %e, "nvme/tcp: the reconnected socket is not watched; the queue is polled at the wait's time-out");
                    }
                }
                self.sock = sock;
                self.neg = neg;
                self.recon = None;
                self.issue_pending();
                self.transmit();
            }
            Err(e) => {
                tracing::debug!(addr = %self.addr, qid = self.qid, error = %e, "nvme/tcp i/o queue reconnect failed");
                r.next = now + r.delay;
                r.delay = (r.delay * 2).min(MAX_BACKOFF);
                self.recon = Some(r);
            }
        }
    }
}

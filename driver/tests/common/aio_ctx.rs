//! Helpers for the aio tests (run-to-completion and cross-thread contexts): targets to
//! open contexts on, and ways to collect and index their events.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kestrel::aio::{Event, IoContext};
use kestrel::emu::{EmuConfig, EmuController};
use kestrel::target::file::{FileOptions, FileTarget};
use kestrel::target::Target;
use kestrel::NvmeNamespace;

use super::{emu_with, WAIT};

/// Namespace 1 of an emulated controller brought up by the driver, as a target.
pub fn emu_target(cfg: EmuConfig) -> (Arc<EmuController>, Arc<dyn Target>) {
    let (emu, c) = emu_with(cfg);
    let ns = NvmeNamespace::new(c, 1).expect("namespace 1");
    (emu, Arc::new(ns))
}

/// As [`emu_target`], each I/O completion posted `latency` after its command is fetched.
pub fn slow_emu_target(latency: Duration) -> (Arc<EmuController>, Arc<dyn Target>) {
    emu_target(EmuConfig {
        latency,
        ..Default::default()
    })
}

/// A file target of `size` bytes, created at `path`.
pub fn file_target(path: &Path, size: u64) -> Arc<dyn Target> {
    FileTarget::open(
        path,
        &FileOptions {
            size: Some(size),
            ..Default::default()
        },
    )
    .unwrap()
}

/// Collects exactly `n` events (panics if more or fewer come within WAIT).
pub fn collect(ctx: &mut IoContext, n: usize) -> Vec<Event> {
    let mut out = Vec::with_capacity(n);
    let mut buf = vec![Event::default(); 64];
    let deadline = Instant::now() + WAIT;
    while out.len() < n {
        let want = (n - out.len()).min(buf.len());
        let got = ctx
            .getevents(1, &mut buf[..want], Some(Duration::from_millis(100)))
            .unwrap();
        out.extend_from_slice(&buf[..got]);
        assert!(
            Instant::now() < deadline,
            "only {} of {n} events",
            out.len()
        );
    }
    assert_eq!(
        ctx.in_flight(),
        0,
        "more requests outstanding than expected"
    );
    out
}

/// The events by user_data (panics on two events with the same user_data).
pub fn by_user_data(evs: &[Event]) -> HashMap<u64, Event> {
    let mut m = HashMap::new();
    for e in evs {
        assert!(m.insert(e.user_data, *e).is_none(), "duplicate event {e:?}");
    }
    m
}

/// Waits (at most WAIT) until the emulator has fetched a first read.
pub fn wait_for_a_device_read(emu: &EmuController) {
    let deadline = Instant::now() + WAIT;
    while emu.stats().reads == 0 {
        assert!(Instant::now() < deadline, "no read reached the device");
        std::thread::yield_now();
    }
}

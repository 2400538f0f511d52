//! Asynchronous events: a relay in front of the target completes the host's Asynchronous
//! Event Request with a Notice (namespace attribute changed, log page 04h), as a target
//! does when its namespaces change. The host must report the event, read the Changed
//! Namespace List to clear it and send a new request, whether the completion comes while
//! the admin queue is quiet or while another admin command is awaited.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kestrel::spec::{lid, AsyncEvent, Sqe};
use kestrel_nvmf::Server;

use crate::common::*;

const CAPSULE_CMD: u8 = 0x04;
const AER: u8 = 0x0C;
const GET_LOG_PAGE: u8 = 0x02;
/// Completion dword 0 of the forged event: Notice (2), namespace attribute changed (00h),
/// Changed Namespace List (04h).
const NS_CHANGED: u32 = 0x0004_0002;

/// When the relay completes the first Asynchronous Event Request.
#[derive(Clone, Copy)]
enum When {
    /// 200 ms after the request, the admin queue quiet.
    Later,
    /// Just before the next admin command reaches the target: the host is then waiting
    /// for that command's answer when the event's completion comes.
    BeforeNextCommand,
}

/// What the host sent on its admin queue.
#[derive(Default)]
struct Seen {
    aers: AtomicU32,
    changed_ns_log_reads: AtomicU32,
}

/// One PDU from `from` (no digests): its 8-byte common header and the rest.
fn read_pdu(from: &mut TcpStream) -> Option<Vec<u8>> {
    let mut ch = [0u8; 8];
    from.read_exact(&mut ch).ok()?;
    let plen = u32::from_le_bytes(ch[4..8].try_into().unwrap()) as usize;
    if !(8..=(1 << 20) + 128).contains(&plen) {
        return None;
    }
    let mut pdu = vec![0u8; plen];
    pdu[..8].copy_from_slice(&ch);
    from.read_exact(&mut pdu[8..]).ok()?;
    Some(pdu)
}

/// A CapsuleResp completing command `cid` successfully with dword 0 `dw0`.
fn response(cid: u16, dw0: u32) -> [u8; 24] {
    let mut r = [0u8; 24];
    r[..8].copy_from_slice(&[0x05, 0, 24, 0, 24, 0, 0, 0]);
    r[8..12].copy_from_slice(&dw0.to_le_bytes());
    r[20..22].copy_from_slice(&cid.to_le_bytes());
    r
}

/// The admin connection's relay: the host's PDUs to the target (noting AERs and reads of
/// the Changed Namespace List), the target's to the host, whole PDUs under one lock so the
/// forged completion never lands inside another PDU.
fn admin_relay(host: TcpStream, target: TcpStream, seen: Arc<Seen>, when: When) {
    let to_host = Arc::new(Mutex::new(host.try_clone().unwrap()));
    let down = Arc::clone(&to_host);
    let mut from_target = target.try_clone().unwrap();
    std::thread::spawn(move || {
        while let Some(p) = read_pdu(&mut from_target) {
            if down.lock().unwrap().write_all(&p).is_err() {
                break;
            }
        }
        let _ = down.lock().unwrap().shutdown(Shutdown::Both);
    });
    let (mut from_host, mut to_target) = (host, target);
    std::thread::spawn(move || {
        let mut pending: Option<u16> = None;
        while let Some(p) = read_pdu(&mut from_host) {
            if p[0] == CAPSULE_CMD && p.len() >= 72 {
                let (opc, cid) = (p[8], u16::from_le_bytes([p[10], p[11]]));
                let cdw10 = u32::from_le_bytes(p[48..52].try_into().unwrap());
                if opc == AER {
                    if seen.aers.fetch_add(1, Ordering::SeqCst) == 0 {
                        match when {
                            When::Later => {
                                let h = Arc::clone(&to_host);
                                std::thread::spawn(move || {
                                    std::thread::sleep(Duration::from_millis(200));
                                    let _ = h.lock().unwrap().write_all(&response(cid, NS_CHANGED));
                                });
                            }
                            When::BeforeNextCommand => pending = Some(cid),
                        }
                    }
                } else {
                    if let Some(aer) = pending.take() {
                        let _ = to_host
                            .lock()
                            .unwrap()
                            .write_all(&response(aer, NS_CHANGED));
                    }
                    if opc == GET_LOG_PAGE && cdw10 & 0xff == u32::from(lid::CHANGED_NAMESPACES) {
                        seen.changed_ns_log_reads.fetch_add(1, Ordering::SeqCst);
                    }
                }
            }
            if to_target.write_all(&p).is_err() {
                break;
            }
        }
        let _ = to_target.shutdown(Shutdown::Both);
    });
}

/// Opens a controller through the relay; returns it with what the relay saw.
fn open_through_relay(s: &Server, when: When) -> (kestrel::target_spec::Opened, Arc<Seen>) {
    let seen = Arc::new(Seen::default());
    let sn = Arc::clone(&seen);
    let at = relay(s.local_addr(), move |k, host, t| {
        if k == 0 {
            admin_relay(host, t, Arc::clone(&sn), when);
        } else {
            pass_upstream(&host, &t);
            let (mut t, mut h) = (t, host);
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut t, &mut h);
                let _ = h.shutdown(Shutdown::Both);
            });
        }
    });
    let spec = kestrel::target_spec::parse(&format!("tcp:{at}/{NQN}")).unwrap();
    let opened = kestrel::target_spec::open_with(&spec, &Default::default()).unwrap();
    (opened, seen)
}

/// Waits (up to 10 s) until the host reported an event, read its log and asked again.
fn wait_for_the_event(ctrlr: &kestrel::target::tcp::TcpController, seen: &Seen) {
    let end = Instant::now() + Duration::from_secs(10);
    while ctrlr.async_event_count() < 1
        || seen.aers.load(Ordering::SeqCst) < 2
        || seen.changed_ns_log_reads.load(Ordering::SeqCst) < 1
    {
        assert!(
            Instant::now() < end,
            "no event handled: {} reported, {} requests, {} log reads",
            ctrlr.async_event_count(),
            seen.aers.load(Ordering::SeqCst),
            seen.changed_ns_log_reads.load(Ordering::SeqCst)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        ctrlr.async_events(),
        vec![AsyncEvent::from_dw0(NS_CHANGED)],
        "the event as the controller reported it"
    );
    assert_eq!(ctrlr.async_event_count(), 1);
}

#[test]
fn an_event_on_a_quiet_admin_queue_is_reported_cleared_and_asked_again() {
    let s = server(1, "16M", 128 << 10);
    let (opened, seen) = open_through_relay(&s, When::Later);
    let kestrel::target_spec::Opened::Tcp { ctrlr, .. } = &opened else {
        panic!("a tcp target opens as one");
    };
    wait_for_the_event(ctrlr, &seen);
    // The controller goes on: I/O through it, and the admin queue still answers.
    let t = opened.first_target().unwrap();
    let (mut q, buf) = queue_with_buffer(&t, 8, 256 << 10);
    write_read(q.as_mut(), &buf, 1, 4096, 8, &pattern(16 << 10, 3));
    let id = Sqe::identify(kestrel::spec::cns::CONTROLLER, 0, 0).to_bytes();
    let (cqe, data) = ctrlr.admin_command(id, &[], 4096).unwrap();
    assert!(cqe.status().is_success() && data.len() == 4096);
    assert_eq!(
        seen.aers.load(Ordering::SeqCst),
        2,
        "one request at bring-up, one after the event"
    );
}

#[test]
fn an_event_that_comes_during_another_admin_command_is_kept_for_later() {
    let s = server(1, "16M", 128 << 10);
    let (opened, seen) = open_through_relay(&s, When::BeforeNextCommand);
    let kestrel::target_spec::Opened::Tcp { ctrlr, .. } = &opened else {
        panic!("a tcp target opens as one");
    };
    // The event's completion reaches the host before this Identify's answer.
    let id = Sqe::identify(kestrel::spec::cns::CONTROLLER, 0, 0).to_bytes();
    let (cqe, data) = ctrlr.admin_command(id, &[], 4096).unwrap();
    assert!(
        cqe.status().is_success() && data.len() == 4096,
        "the command awaited is answered: {cqe:?}"
    );
    wait_for_the_event(ctrlr, &seen);
}

//! A response that cannot acknowledge a write: a relay between the host and the target
//! replaces the first R2T it sees with a successful CapsuleResp for the same command, so
//! the host is told "done" for a write whose data it never sent. The host must not report
//! that write done (its data never reached the namespace): it treats the response as a
//! protocol error, connects again and sends the write again, which then lands.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use kestrel::io::IoRequest;

use crate::common::*;

const R2T: u8 = 0x09;
const CAPSULE_RESP: u8 = 0x05;
const C2H_DATA: u8 = 0x07;
const LAST_PDU: u8 = 0x04;
const SUCCESS: u8 = 0x08;

/// What the relay changes in the target's PDUs.
#[derive(Clone, Copy)]
enum Mode {
    /// The first R2T (of any connection) becomes a successful CapsuleResp for its CCCID.
    R2tToResponse,
    /// Every last C2HData gets the SUCCESS flag and its command's CapsuleResp is dropped.
    C2hSuccess,
    /// The same on the admin queue too (SPDK's target sets SUCCESS there as well).
    C2hSuccessAdmin,
    /// Nothing.
    Pass,
}

/// Copies the target's PDUs to the host, changed as `mode` says (24-byte headers, no
/// digests); counts the PDUs changed in `forged`.
fn forge(mut from: TcpStream, mut to: TcpStream, forged: &AtomicU32, mode: Mode) {
    let mut ch = [0u8; 8];
    let mut rest = vec![0u8; 1 << 20];
    let mut drop_resp = std::collections::HashSet::new();
    while from.read_exact(&mut ch).is_ok() {
        let plen = u32::from_le_bytes(ch[4..8].try_into().unwrap()) as usize;
        if plen < 8 || plen - 8 > rest.len() || from.read_exact(&mut rest[..plen - 8]).is_err() {
            break;
        }
        let cid = u16::from_le_bytes([rest[0], rest[1]]);
        if let Mode::C2hSuccess = mode {
            if ch[0] == C2H_DATA && ch[1] & LAST_PDU != 0 {
                ch[1] |= SUCCESS;
                drop_resp.insert(cid);
                forged.fetch_add(1, Ordering::SeqCst);
            } else if ch[0] == CAPSULE_RESP
                && drop_resp.remove(&u16::from_le_bytes([rest[12], rest[13]]))
            {
                continue;
            }
        }
        let r2t = matches!(mode, Mode::R2tToResponse) && ch[0] == R2T;
        let out = if r2t && forged.fetch_add(1, Ordering::SeqCst) == 0 {
            let mut r = [0u8; 24];
            r[..8].copy_from_slice(&[CAPSULE_RESP, 0, 24, 0, 24, 0, 0, 0]);
            // CQE: DW0, DW1, SQHD, SQID, then the CID (the R2T's CCCID), status 0.
            r[20..22].copy_from_slice(&rest[0..2]);
            to.write_all(&r)
        } else {
            to.write_all(&ch)
                .and_then(|()| to.write_all(&rest[..plen - 8]))
        };
        if out.is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
}

/// The relay in front of `target`; counts the PDUs it forged in `forged`.
fn forging_relay(target: SocketAddr, forged: Arc<AtomicU32>, mode: Mode) -> SocketAddr {
    relay(target, move |k, host, t| {
        pass_upstream(&host, &t);
        let f = Arc::clone(&forged);
        // C2hSuccess: I/O queues only, the admin queue (the first connection) as is.
        let mode = match mode {
            Mode::C2hSuccess if k == 0 => Mode::Pass,
            Mode::C2hSuccessAdmin => Mode::C2hSuccess,
            m => m,
        };
        std::thread::spawn(move || forge(t, host, &f, mode));
    })
}

#[test]
fn a_response_before_the_data_is_not_an_acknowledgment() {
    let s = server(1, "16M", 128 << 10);
    let forged = Arc::new(AtomicU32::new(0));
    let at = forging_relay(s.local_addr(), Arc::clone(&forged), Mode::R2tToResponse);
    let t = kestrel::target_spec::open(&format!("tcp:{at}/{NQN}")).expect("tcp target opens");
    let (mut q, buf) = queue_with_buffer(&t, 8, 256 << 10);
    // 64 KiB: above the target's in-capsule size, so it goes through R2T.
    let data = pattern(64 << 10, 42);
    let w = buf.sub(0, data.len()).unwrap();
    q.write_lent(&w, 0, &data).unwrap();
    q.submit(IoRequest::write(1, 8, 16, w, 1)).unwrap();
    q.flush();
    let c = reap(q.as_mut(), 1);
    assert!(forged.load(Ordering::SeqCst) >= 1, "the relay saw no R2T");
    assert_eq!(c[0].result, Ok(()), "the write, sent again, succeeds");
    assert!(
        q.stats().resets >= 1,
        "the forged response must have cost the connection: {:?}",
        q.stats()
    );
    let r = buf.sub(128 << 10, data.len()).unwrap();
    q.submit(IoRequest::read(1, 8, 16, r, 2)).unwrap();
    q.flush();
    assert_eq!(reap(q.as_mut(), 1)[0].result, Ok(()));
    let mut back = vec![0u8; data.len()];
    q.read_lent(&r, 0, &mut back).unwrap();
    assert!(
        back == data,
        "a write reported done did not reach the namespace"
    );
}

#[test]
fn c2h_data_with_success_completes_reads() {
    let s = server(1, "16M", 128 << 10);
    let forged = Arc::new(AtomicU32::new(0));
    let at = forging_relay(s.local_addr(), Arc::clone(&forged), Mode::C2hSuccess);
    let t = kestrel::target_spec::open(&format!("tcp:{at}/{NQN}")).expect("tcp target opens");
    let (mut q, buf) = queue_with_buffer(&t, 16, 2 << 20);
    write_then_read_back_sizes(q.as_mut(), &buf);
    // Every read's SUCCESS was forged, and the reads completed with their data.
    assert_eq!(forged.load(Ordering::SeqCst), 8);
}

/// SPDK's target completes an admin command that returns data (Identify) with C2HData's
/// SUCCESS flag and no response capsule: the controller must come up and work.
#[test]
fn c2h_data_with_success_on_the_admin_queue() {
    let s = server(1, "16M", 128 << 10);
    let forged = Arc::new(AtomicU32::new(0));
    let at = forging_relay(s.local_addr(), Arc::clone(&forged), Mode::C2hSuccessAdmin);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let t = kestrel::target_spec::open(&format!("tcp:{at}/{NQN}"));
        let _ = tx.send(t.map(|t| t.info().num_blocks).map_err(|e| e.to_string()));
    });
    let got = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("the tcp target opens (an Identify answered by C2HData with SUCCESS)");
    assert_eq!(got, Ok((16 << 20) / 4096));
    assert!(
        forged.load(Ordering::SeqCst) >= 1,
        "an admin C2HData was forged"
    );
}

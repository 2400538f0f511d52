//! The `tcp:` target: a subsystem (or a discovery controller) reached over NVMe/TCP.
//!
//! ```text
//! tcp     = "tcp:" addr [":" PORT] ["/" NQN] *("," tcpopt) [nssel]
//! addr    = HOSTNAME | IPV4 | "[" IPV6 "]"
//! tcpopt  = "hostnqn=" NQN | "hostid=" UUID           ; default: /etc/nvme/hostnqn, hostid,
//!                                                     ; else derived from /etc/machine-id
//!         | "digest=" ("none" | "hdr" | "data" | "both")
//!         | "queues=" 1..1024                         ; I/O queues (connections) to ask for
//!         | "queue_size=" 2..65536                    ; entries per I/O queue
//!         | "kato=" duration                          ; keep alive timeout (0: none)
//!         | "ctrl_loss_tmo=" duration                 ; how long to try to reconnect
//!         | "connect_timeout=" duration               ; one connection attempt
//!         | "sqflow=" ("on" | "off")                  ; SQ flow control on I/O queues
//!                                                     ; (default off: asked disabled)
//! ```
//!
//! Without `/NQN` the string names the discovery controller at that address (the
//! well-known discovery NQN), whose log `kestrel list` prints; the port is then 8009
//! unless given, else 4420. NQNs contain neither `,` nor `/`.

use std::time::Duration;

use super::{for_each_option, parse_duration};

/// The NVMe/TCP port of I/O controllers (IANA).
pub const DEFAULT_TCP_PORT: u16 = 4420;
/// The NVMe/TCP port of discovery controllers (IANA).
pub const DEFAULT_DISCOVERY_PORT: u16 = 8009;
/// The most I/O queues a `tcp:` target asks for.
pub const MAX_TCP_QUEUES: u16 = 1024;
/// The well-known discovery NQN (as `spec::fabrics::DISCOVERY_NQN`; `parse` imports nothing
/// from the crate).
const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// Which NVMe/TCP digests to ask for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Digests {
    /// Header digests (CRC32C of every PDU header).
    pub header: bool,
    /// Data digests (CRC32C of every PDU's data).
    pub data: bool,
}

/// `tcp:HOST:PORT/NQN,...`: a remote subsystem over NVMe/TCP.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpSpec {
    /// Host name or address (an IPv6 address without its brackets).
    pub host: String,
    /// TCP port.
    pub port: u16,
    /// The subsystem NQN; `None`: the discovery controller.
    pub subnqn: Option<String>,
    /// Host NQN; `None`: the machine's default.
    pub hostnqn: Option<String>,
    /// Host identifier; `None`: the machine's default.
    pub hostid: Option<[u8; 16]>,
    /// Digests to ask for.
    pub digests: Digests,
    /// I/O queues to ask for; `None`: the opener's default.
    pub queues: Option<u16>,
    /// Entries per I/O queue; `None`: the controller's maximum, up to the opener's default.
    pub queue_size: Option<u32>,
    /// Keep Alive Timeout; `None`: the default.
    pub kato: Option<Duration>,
    /// Controller loss timeout: how long a lost connection is retried; `None`: the default.
    pub ctrl_loss_tmo: Option<Duration>,
    /// One connection attempt's limit; `None`: the default.
    pub connect_timeout: Option<Duration>,
    /// `None` or `sqflow=on`: keep SQ flow control on the I/O queues (as the Linux
    /// initiator does by default); `sqflow=off` (`Some(false)`): ask the controller to
    /// disable it at Connect.
    pub sqflow: Option<bool>,
    /// `/ns=N`: use only this namespace.
    pub nsid: Option<u32>,
}

impl TcpSpec {
    /// Whether it names a discovery controller.
    pub fn is_discovery(&self) -> bool {
        self.subnqn.as_deref().is_none_or(|n| n == DISCOVERY_NQN)
    }
    /// `HOST:PORT`, with brackets around an IPv6 address.
    pub fn address(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// Parses a UUID in its text form (`8-4-4-4-12` hex digits).
pub fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    let groups: Vec<&str> = s.split('-').collect();
    if groups.iter().map(|g| g.len()).collect::<Vec<_>>() != [8, 4, 4, 4, 12] {
        return None;
    }
    let hex: String = groups.concat();
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// The text form of a UUID.
pub fn uuid_text(u: &[u8; 16]) -> String {
    let h: String = u.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

fn nqn_ok(s: &str) -> bool {
    s.len() > 4
        && s.len() <= 223
        && s.starts_with("nqn.")
        && s.bytes().all(|b| (0x21..0x7f).contains(&b))
}

/// `HOST[:PORT]` or `[V6][:PORT]`.
fn parse_addr(s: &str, discovery: bool) -> Result<(String, u16), String> {
    let dflt = if discovery {
        DEFAULT_DISCOVERY_PORT
    } else {
        DEFAULT_TCP_PORT
    };
    let (host, port) = if let Some(rest) = s.strip_prefix('[') {
        let (h, tail) = rest
            .split_once(']')
            .ok_or("an IPv6 address in [ ] has no closing ]")?;
        match tail {
            "" => (h, None),
            t => (
                h,
                Some(
                    t.strip_prefix(':')
                        .ok_or("text after ] that is not :PORT")?,
                ),
            ),
        }
    } else {
        match s.split_once(':') {
            Some((h, p)) => (h, Some(p)),
            None => (s, None),
        }
    };
    if host.is_empty() || host.contains([',', '/', ' ']) {
        return Err(format!("'{host}' is not a host name or address"));
    }
    let port = match port {
        None => dflt,
        Some(p) => match p.parse::<u16>() {
            Ok(n @ 1..) => n,
            _ => return Err(format!("port '{p}' is not a number from 1 to 65535")),
        },
    };
    Ok((host.to_string(), port))
}

fn tcp_option(t: &mut TcpSpec, k: &str, v: &str) -> Result<(), String> {
    let dur = |v: &str| parse_duration(v).map_err(|e| e.to_string());
    match k {
        "hostnqn" if nqn_ok(v) => t.hostnqn = Some(v.to_string()),
        "hostnqn" => return Err(format!("hostnqn={v}: not an nqn (nqn.<date>.<domain>:<name>, printable, at most 223 bytes)")),
        "hostid" => {
            t.hostid = Some(parse_uuid(v).ok_or_else(|| {
                format!("hostid={v}: not a uuid (xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")
            })?)
        }
        "digest" => {
            t.digests = match v {
                "none" => Digests::default(),
                "hdr" | "header" => Digests { header: true, data: false },
                "data" => Digests { header: false, data: true },
                "both" => Digests { header: true, data: true },
                _ => return Err(format!("digest={v}: expected none, hdr, data or both")),
            }
        }
        "queues" => match v.parse::<u16>() {
            Ok(n @ 1..) if n <= MAX_TCP_QUEUES => t.queues = Some(n),
            _ => return Err(format!("queues={v}: expected 1 to {MAX_TCP_QUEUES}")),
        },
        "queue_size" => match v.parse::<u32>() {
            Ok(n @ 2..=65536) => t.queue_size = Some(n),
            _ => return Err(format!("queue_size={v}: expected 2 to 65536")),
        },
        "kato" => t.kato = Some(dur(v)?),
        "ctrl_loss_tmo" => t.ctrl_loss_tmo = Some(dur(v)?),
        "connect_timeout" => match dur(v)? {
            d if d.is_zero() => return Err("connect_timeout=0: give a time limit".into()),
            d => t.connect_timeout = Some(d),
        },
        "sqflow" => match v {
            "on" => t.sqflow = Some(true),
            "off" => t.sqflow = Some(false),
            _ => return Err(format!("sqflow={v}: expected on or off")),
        },
        _ => return Err(format!("unknown option '{k}' for tcp (known: hostnqn, hostid, digest, queues, queue_size, kato, ctrl_loss_tmo, connect_timeout, sqflow)")),
    }
    Ok(())
}

/// Parses what follows `tcp:` (a trailing `/ns=N` already split off into `nsid`).
pub(super) fn parse_tcp(s: &str, nsid: Option<u32>) -> Result<TcpSpec, String> {
    let (addr_nqn, opts) = s.split_once(',').unwrap_or((s, ""));
    // The address ends at the first '/' outside an IPv6 address's brackets.
    let search_from = if addr_nqn.starts_with('[') {
        addr_nqn.find(']').unwrap_or(0)
    } else {
        0
    };
    let (addr, nqn) = match addr_nqn[search_from..].find('/') {
        Some(i) => (
            &addr_nqn[..search_from + i],
            Some(&addr_nqn[search_from + i + 1..]),
        ),
        None => (addr_nqn, None),
    };
    if let Some(n) = nqn {
        if !nqn_ok(n) {
            return Err(format!(
                "'{n}' is not a subsystem nqn (nqn.<date>.<domain>:<name>, printable, at most 223 bytes)"
            ));
        }
    }
    let discovery = nqn.is_none_or(|n| n == DISCOVERY_NQN);
    let (host, port) = parse_addr(addr, discovery)?;
    let mut t = TcpSpec {
        host,
        port,
        subnqn: nqn.map(str::to_string),
        hostnqn: None,
        hostid: None,
        digests: Digests::default(),
        queues: None,
        queue_size: None,
        kato: None,
        ctrl_loss_tmo: None,
        connect_timeout: None,
        sqflow: None,
        nsid,
    };
    for_each_option(opts, |k, v| tcp_option(&mut t, k, v))?;
    if t.is_discovery() && nsid.is_some() {
        return Err("/ns=: a discovery controller has no namespaces".into());
    }
    Ok(t)
}

#[cfg(test)]
mod tests {
    use super::super::{parse_target, TargetSpec};
    use super::*;

    fn tcp(s: &str) -> Result<TcpSpec, String> {
        match parse_target(s) {
            Ok(TargetSpec::Tcp(t)) => Ok(t),
            Ok(other) => panic!("{s}: not a tcp spec: {other:?}"),
            Err(e) => Err(e.to_string()),
        }
    }

    #[test]
    fn subsystems_with_every_option() {
        let t = tcp("tcp:192.0.2.10:4421/nqn.2026-12.io.kestrel:disk,hostnqn=nqn.2014-08.org.nvmexpress:uuid:1,hostid=11111111-2222-3333-4444-555555555555,digest=both,queues=4,queue_size=64,kato=2s,ctrl_loss_tmo=10s,connect_timeout=500ms,sqflow=on/ns=2").unwrap();
        assert_eq!((t.host.as_str(), t.port), ("192.0.2.10", 4421));
        assert_eq!(t.subnqn.as_deref(), Some("nqn.2026-12.io.kestrel:disk"));
        assert_eq!(
            t.hostnqn.as_deref(),
            Some("nqn.2014-08.org.nvmexpress:uuid:1")
        );
        assert_eq!(
            uuid_text(&t.hostid.unwrap()),
            "11111111-2222-3333-4444-555555555555"
        );
        assert_eq!(
            t.digests,
            Digests {
                header: true,
                data: true
            }
        );
        assert_eq!((t.queues, t.queue_size), (Some(4), Some(64)));
        assert_eq!(t.kato, Some(Duration::from_secs(2)));
        assert_eq!(t.ctrl_loss_tmo, Some(Duration::from_secs(10)));
        assert_eq!(t.sqflow, Some(true));
        assert_eq!(t.connect_timeout, Some(Duration::from_millis(500)));
        assert_eq!(t.nsid, Some(2));
        assert!(!t.is_discovery());
        // Defaults: port 4420 for a subsystem, 8009 for discovery; IPv6 in brackets.
        let t = tcp("tcp:host.example/nqn.2026-12.io.kestrel:a").unwrap();
        assert_eq!((t.port, t.digests), (DEFAULT_TCP_PORT, Digests::default()));
        let t = tcp("tcp:[::1]").unwrap();
        assert_eq!(
            (t.host.as_str(), t.port, t.is_discovery()),
            ("::1", DEFAULT_DISCOVERY_PORT, true)
        );
        assert_eq!(t.address(), "[::1]:8009");
        let t = tcp("tcp:[fe80::1]:4420/nqn.2014-08.org.nvmexpress.discovery").unwrap();
        assert!(t.is_discovery());
        assert_eq!(
            TargetSpec::Tcp(tcp("tcp:h:1/nqn.x.y:z,digest=hdr").unwrap()).to_string(),
            "tcp:h:1/nqn.x.y:z"
        );
    }

    #[test]
    fn mistakes_are_named() {
        for (s, want) in [
            ("tcp:", "not a host name"),
            ("tcp:h:0/nqn.x.y:z", "port '0'"),
            ("tcp:h:99999/nqn.x.y:z", "port '99999'"),
            ("tcp:h/iqn.x", "not a subsystem nqn"),
            ("tcp:h/nqn.x.y:z,digest=crc", "digest=crc"),
            ("tcp:h/nqn.x.y:z,queues=0", "queues=0"),
            ("tcp:h/nqn.x.y:z,queue_size=1", "queue_size=1"),
            ("tcp:h/nqn.x.y:z,hostid=xyz", "hostid=xyz"),
            ("tcp:h/nqn.x.y:z,hostnqn=bob", "hostnqn=bob"),
            ("tcp:h/nqn.x.y:z,kato=5", "invalid duration"),
            ("tcp:h/nqn.x.y:z,connect_timeout=0", "connect_timeout=0"),
            ("tcp:h/nqn.x.y:z,sqflow=maybe", "sqflow=maybe"),
            ("tcp:h/nqn.x.y:z,bogus=1", "unknown option 'bogus' for tcp"),
            ("tcp:h/nqn.x.y:z,queues=2,queues=3", "given twice"),
            ("tcp:[::1/nqn.x.y:z", "no closing ]"),
            ("tcp:h/ns=1", "discovery controller has no namespaces"),
        ] {
            let e = tcp(s).unwrap_err();
            assert!(e.contains(want), "{s}: {e}");
        }
    }

    #[test]
    fn uuids_round_trip() {
        let u = parse_uuid("0123abcd-4567-89ef-0123-456789abcdef").unwrap();
        assert_eq!(uuid_text(&u), "0123abcd-4567-89ef-0123-456789abcdef");
        assert_eq!(parse_uuid("0123abcd456789ef0123456789abcdef"), None);
        assert_eq!(parse_uuid("0123abcd-4567-89ef-0123-456789abcdeg"), None);
    }
}

//! `kestrel serve`: export targets over NVMe/TCP until Ctrl-C.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kestrel::target_spec::{self, TargetSpec};
use kestrel::Target;

use crate::config::{subsystem_nqn, Limits, ServerConfig, SubsystemConfig};
use crate::{ServeError, Server};

/// Help after the options.
pub const SERVE_AFTER_HELP: &str = "\
Each --target is a namespace of the NVM subsystem nqn.2026-12.io.kestrel:NAME. Targets
given the same NAME are namespaces 1, 2, ... of one subsystem, in the order given; a target
without a name gets its own subsystem, named by kind and position (emu0, pci1, file2).
A discovery subsystem (nqn.2014-08.org.nvmexpress.discovery) answers on the same listener
and on --discovery-port.

Hosts must be allowed: --allow-host NQN (every subsystem) or --allow-host NAME=NQN (one
subsystem). --allow-any-host opens every subsystem to any host, and only with loopback
listeners.

From a Linux host (modprobe nvme-tcp):
  echo 'transport=tcp,traddr=127.0.0.1,trsvcid=4420,nqn=nqn.2026-12.io.kestrel:emu0,hostnqn=HOST' \\
      > /dev/nvme-fabrics
  nvme connect -t tcp -a 127.0.0.1 -s 4420 -n nqn.2026-12.io.kestrel:emu0
  nvme discover -t tcp -a 127.0.0.1 -s 8009

Examples:
  kestrel serve --target emu --allow-any-host
  kestrel serve --target disk=pci:0000:01:00.0 --listen 192.0.2.10:4420 \\
      --allow-host nqn.2014-08.org.nvmexpress:uuid:5e1c... -c 2-3
  kestrel serve --target emu:size=1G --target scratch=file:/tmp/x.img,size=1G --allow-any-host
  kestrel serve --target pool=emu:size=1G --target pool=file:/tmp/y.img,size=1G --allow-any-host
      (one subsystem, pool, with two namespaces)

Runs until Ctrl-C (or --time). See docs/nvme-tcp.md.";

/// `kestrel serve`.
#[derive(clap::Args, Debug, Clone)]
pub struct ServeArgs {
    /// Target to export, [NAME=]SPEC (repeatable; one NAME again adds a namespace to its
    /// subsystem): pci:BDF, file:PATH[,...], emu[:...] or null[:...].
    #[arg(long = "target", value_name = "[NAME=]SPEC", required = true)]
    pub targets: Vec<String>,
    /// Address and port to listen on (an explicit address; 0.0.0.0 only if you mean it).
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:4420")]
    pub listen: SocketAddr,
    /// Extra discovery-only listener port on the same address, or "off".
    #[arg(long, value_name = "PORT|off", default_value = "8009")]
    pub discovery_port: String,
    /// Host NQN allowed to connect: NQN (all subsystems) or NAME=NQN (repeatable).
    #[arg(long = "allow-host", value_name = "[NAME=]NQN")]
    pub allow_hosts: Vec<String>,
    /// Let any host connect to every subsystem (loopback listeners only).
    #[arg(long)]
    pub allow_any_host: bool,
    /// Cores to run reactors on (one pinned thread each): a list like 0,2-3.
    #[arg(short = 'c', long, value_name = "CORES", default_value = "0")]
    pub cores: String,
    /// I/O queues per controller.
    #[arg(long, value_name = "N", default_value_t = 16, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub io_queues: u16,
    /// Entries per queue (CAP.MQES + 1).
    #[arg(long, value_name = "N", default_value_t = 128, value_parser = clap::value_parser!(u16).range(2..=4096))]
    pub queue_size: u16,
    /// In-capsule data of I/O commands in bytes (a multiple of 16; 0: none).
    #[arg(long, value_name = "BYTES", default_value_t = 8192)]
    pub in_capsule: u32,
    /// Largest transfer of one command in bytes (MDTS; a power of two from 4096).
    #[arg(long, value_name = "BYTES", default_value_t = 131072)]
    pub max_io_size: u32,
    /// Data buffer per I/O queue in bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 2 << 20)]
    pub queue_buffer: u32,
    /// Connections open at once on the whole server; a connection beyond it is closed at
    /// accept (docs/nvme-tcp.md, "Limits" and "Memory and time budget").
    #[arg(long, value_name = "N", default_value_t = 256, help_heading = "Bounds")]
    pub max_connections: u32,
    /// Controllers alive at once per subsystem.
    #[arg(long, value_name = "N", default_value_t = 16, help_heading = "Bounds")]
    pub max_controllers: u16,
    /// Of those, discovery controllers of hosts no allow-list names; the rest is kept for
    /// listed hosts.
    #[arg(long, value_name = "N", default_value_t = 4, help_heading = "Bounds")]
    pub max_unauth_controllers: u16,
    /// Connections that have not sent their Connect yet, server wide; a new one beyond it
    /// closes the oldest of them.
    #[arg(long, value_name = "N", default_value_t = 64, help_heading = "Bounds")]
    pub max_pending: u32,
    /// Data buffers of one admin queue of a listed host, in bytes; a command beyond it
    /// waits in the socket.
    #[arg(long, value_name = "BYTES", default_value_t = 128 << 10, help_heading = "Bounds")]
    pub admin_buffer: u32,
    /// The same for a discovery admin queue of a host no allow-list names.
    #[arg(long, value_name = "BYTES", default_value_t = 32 << 10, help_heading = "Bounds")]
    pub unauth_buffer: u32,
    /// Time from accept to a successful Connect, milliseconds.
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 10_000,
        help_heading = "Bounds"
    )]
    pub connect_timeout_ms: u32,
    /// Time to receive a PDU whole once its first byte came, milliseconds, whatever KATO
    /// says.
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 10_000,
        help_heading = "Bounds"
    )]
    pub pdu_timeout_ms: u32,
    /// Time for all the data an R2T asked for to arrive, milliseconds.
    #[arg(
        long,
        value_name = "MS",
        default_value_t = 30_000,
        help_heading = "Bounds"
    )]
    pub r2t_timeout_ms: u32,
    /// Allow VFIO's unsafe noiommu mode for pci targets.
    #[arg(long)]
    pub noiommu: bool,
    /// How reactors wait when the connections are quiet: hybrid (poll while busy, sleep on
    /// the sockets after a pause) or busy (never sleep: the cores are always 100 % busy).
    #[arg(long, value_name = "MODE", default_value = "hybrid", value_parser = parse_poll)]
    pub poll: crate::PollMode,
    /// Stop after this many seconds (default: at Ctrl-C).
    #[arg(long = "time", value_name = "SECONDS")]
    pub time: Option<u64>,
}

/// Why `kestrel serve` failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A bad option or combination (exit status 2).
    #[error("{0}")]
    Usage(String),
    /// Opening a target failed.
    #[error("opening target {spec:?}: {source}")]
    Target {
        /// The target string.
        spec: String,
        /// The error.
        source: Box<kestrel::Error>,
    },
    /// The server failed.
    #[error(transparent)]
    Serve(#[from] ServeError),
}

/// `--poll`: `hybrid` or `busy`.
fn parse_poll(s: &str) -> Result<crate::PollMode, String> {
    match s {
        "hybrid" => Ok(crate::PollMode::Hybrid),
        "busy" => Ok(crate::PollMode::Busy),
        _ => Err(format!("'{s}' is not a poll mode: hybrid or busy")),
    }
}

/// A core list in the driver's one grammar (`0,2-3`, `[0,2-3]`, `0x5`).
fn parse_cores(s: &str) -> Result<Vec<usize>, String> {
    kestrel::parse::parse_cores(s).map_err(|e| e.to_string())
}

/// Splits `NAME=SPEC`; the name is the part before `=` when that part is a plain word
/// (so `emu:size=1G` has no name).
fn split_name(s: &str) -> (Option<&str>, &str) {
    if let Some((n, rest)) = s.split_once('=') {
        if !n.is_empty()
            && n.len() <= 64
            && n.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        {
            return (Some(n), rest);
        }
    }
    (None, s)
}

fn open_target(spec: &TargetSpec, noiommu: bool) -> Result<Arc<dyn Target>, kestrel::Error> {
    let opts = target_spec::OpenOptions {
        noiommu,
        ..Default::default()
    };
    Ok(target_spec::open_with(spec, &opts)?.first_target()?)
}

/// Builds the configuration from the arguments (targets already opened, with their
/// subsystem names: one subsystem per distinct name, its namespaces in the order given).
pub fn build_config(
    a: &ServeArgs,
    opened: Vec<(String, Arc<dyn Target>)>,
) -> Result<ServerConfig, CliError> {
    let mut names: Vec<&str> = Vec::new();
    let mut subsystems: Vec<SubsystemConfig> = Vec::new();
    for (n, t) in &opened {
        match names.iter().position(|x| x == n) {
            Some(i) => subsystems[i].namespaces.push(Arc::clone(t)),
            None => {
                names.push(n);
                subsystems.push(SubsystemConfig {
                    nqn: subsystem_nqn(n),
                    namespaces: vec![Arc::clone(t)],
                    allowed_hosts: Vec::new(),
                    allow_any_host: a.allow_any_host,
                });
            }
        }
    }
    for h in &a.allow_hosts {
        match split_name(h) {
            (Some(n), nqn) if !h.starts_with("nqn.") => {
                let Some(i) = names.iter().position(|x| *x == n) else {
                    return Err(CliError::Usage(format!(
                        "--allow-host {h}: no target is named {n:?} (names: {})",
                        names.join(", ")
                    )));
                };
                subsystems[i].allowed_hosts.push(nqn.to_string());
            }
            _ => {
                for s in &mut subsystems {
                    s.allowed_hosts.push(h.clone());
                }
            }
        }
    }
    let discovery_listen = match a.discovery_port.as_str() {
        "off" | "none" => None,
        p => {
            let port: u16 = p.parse().map_err(|_| {
                CliError::Usage(format!(
                    "--discovery-port {p:?} is not a port number or off"
                ))
            })?;
            (port != a.listen.port()).then_some(SocketAddr::new(a.listen.ip(), port))
        }
    };
    let cores = parse_cores(&a.cores).map_err(|e| CliError::Usage(format!("--cores: {e}")))?;
    let cfg = ServerConfig {
        listen: a.listen,
        discovery_listen,
        reactors: cores.into_iter().map(Some).collect(),
        subsystems,
        limits: Limits {
            max_io_queues: a.io_queues,
            max_queue_size: a.queue_size,
            in_capsule_data: a.in_capsule,
            max_io_size: a.max_io_size,
            queue_buffer: a.queue_buffer,
            poll: a.poll,
            max_connections: a.max_connections,
            max_controllers: a.max_controllers,
            max_unauth_controllers: a.max_unauth_controllers,
            max_pending: a.max_pending,
            admin_buffer: a.admin_buffer,
            unauth_buffer: a.unauth_buffer,
            connect_timeout_ms: a.connect_timeout_ms,
            pdu_timeout_ms: a.pdu_timeout_ms,
            r2t_timeout_ms: a.r2t_timeout_ms,
            ..Limits::default()
        },
    };
    cfg.validate().map_err(|e| CliError::Usage(e.to_string()))?;
    Ok(cfg)
}

/// Runs `kestrel serve`.
pub fn run(a: &ServeArgs) -> Result<(), CliError> {
    if a.listen.ip() == IpAddr::V4(Ipv4Addr::UNSPECIFIED) || a.listen.ip().is_unspecified() {
        tracing::warn!("listening on every interface ({}) as asked", a.listen);
    }
    let parsed = parse_targets(a)?;
    let mut opened = Vec::new();
    for (name, s, spec) in parsed {
        let t = open_target(&spec, a.noiommu).map_err(|source| CliError::Target {
            spec: s.clone(),
            source: Box::new(source),
        })?;
        opened.push((name, t));
    }
    let cfg = build_config(a, opened)?;
    let lines = export_lines(&cfg);
    let server = Server::start(cfg)?;
    println!(
        "kestrel serve: listening on {}{}",
        server.local_addr(),
        server
            .discovery_addr()
            .map(|d| format!(" (discovery also on {d})"))
            .unwrap_or_default()
    );
    for l in lines {
        println!("{l}");
    }
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = Arc::clone(&stop);
    let _ = ctrlc::set_handler(move || s2.store(true, Ordering::SeqCst));
    let start = Instant::now();
    while !stop.load(Ordering::SeqCst) {
        if a.time
            .is_some_and(|t| start.elapsed() >= Duration::from_secs(t))
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    println!("kestrel serve: stopping");
    for (i, (busy, idle)) in server.pass_time().into_iter().enumerate() {
        // Busy: passes that handled something (socket events, target completions).
        println!(
            "kestrel serve: reactor {i}: busy {:.3} s, idle {:.3} s",
            busy as f64 / 1e9,
            idle as f64 / 1e9
        );
    }
    server.shutdown();
    Ok(())
}

/// The targets of `--target`, each with its name (given, or its kind and index).
fn parse_targets(a: &ServeArgs) -> Result<Vec<(String, String, TargetSpec)>, CliError> {
    let mut parsed = Vec::new();
    for (i, t) in a.targets.iter().enumerate() {
        let (name, spec_s) = split_name(t);
        let spec = target_spec::parse(spec_s).map_err(|e| CliError::Usage(e.to_string()))?;
        let kind = match &spec {
            TargetSpec::Pci { .. } => "pci",
            TargetSpec::File(_) => "file",
            TargetSpec::Emu(_) => "emu",
            TargetSpec::Tcp(_) => "tcp",
            TargetSpec::Null(_) => "null",
        };
        let name = match name {
            Some(n) => n.to_string(),
            None => {
                let n = format!("{kind}{i}");
                if a.targets
                    .iter()
                    .any(|t| split_name(t).0 == Some(n.as_str()))
                {
                    return Err(CliError::Usage(format!(
                        "--target {t}: its default name {n:?} is also given to another target; name it"
                    )));
                }
                n
            }
        };
        parsed.push((name, spec_s.to_string(), spec));
    }
    Ok(parsed)
}

/// What the server exports, a line each subsystem and namespace.
fn export_lines(cfg: &ServerConfig) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    for s in &cfg.subsystems {
        lines.push(format!(
            "  {}{}",
            s.nqn,
            if s.allow_any_host {
                ", any host".to_string()
            } else {
                format!(", hosts: {}", s.allowed_hosts.join(" "))
            }
        ));
        for (k, t) in s.namespaces.iter().enumerate() {
            let i = t.info();
            lines.push(format!(
                "    nsid {}: {} ({} blocks of {} bytes)",
                k + 1,
                i.name,
                i.num_blocks,
                i.block_size
            ));
        }
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_cores() {
        assert_eq!(
            split_name("disk=pci:0000:01:00.0"),
            (Some("disk"), "pci:0000:01:00.0")
        );
        assert_eq!(split_name("emu:size=1G"), (None, "emu:size=1G"));
        assert_eq!(split_name("emu"), (None, "emu"));
        assert_eq!(parse_cores("0,2-3").unwrap(), vec![0, 2, 3]);
        assert!(parse_cores("3-1").is_err());
        assert!(parse_cores("x").is_err());
    }

    #[test]
    fn one_name_given_twice_makes_two_namespaces_of_one_subsystem() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            a: ServeArgs,
        }
        let a = P::parse_from([
            "serve",
            "--target",
            "pool=emu",
            "--target",
            "emu",
            "--target",
            "pool=emu",
            "--allow-host",
            "pool=nqn.2014-08.org.nvmexpress:uuid:1",
            "--discovery-port",
            "off",
        ])
        .a;
        let t = |n: &str| -> (String, Arc<dyn Target>) {
            (
                n.to_string(),
                kestrel::target_spec::open("emu:size=1M,core=none").unwrap(),
            )
        };
        let cfg = build_config(&a, vec![t("pool"), t("emu1"), t("pool")]).unwrap();
        assert_eq!(cfg.subsystems.len(), 2);
        assert_eq!(cfg.subsystems[0].nqn, "nqn.2026-12.io.kestrel:pool");
        assert_eq!(cfg.subsystems[0].namespaces.len(), 2);
        assert_eq!(
            cfg.subsystems[0].allowed_hosts,
            vec!["nqn.2014-08.org.nvmexpress:uuid:1".to_string()]
        );
        assert_eq!(cfg.subsystems[1].nqn, "nqn.2026-12.io.kestrel:emu1");
        assert_eq!(cfg.subsystems[1].namespaces.len(), 1);
        assert!(cfg.subsystems[1].allowed_hosts.is_empty());
    }

    #[test]
    fn bounds_flags_reach_the_limits_and_default_to_them() {
        use clap::Parser;
        #[derive(clap::Parser)]
        struct P {
            #[command(flatten)]
            a: ServeArgs,
        }
        let emu = || -> Vec<(String, Arc<dyn Target>)> {
            vec![(
                "emu".into(),
                kestrel::target_spec::open("emu:size=1M,core=none").unwrap(),
            )]
        };
        let a = P::parse_from(["serve", "--target", "emu"]).a;
        let cfg = build_config(&a, emu()).unwrap();
        assert_eq!(
            cfg.limits,
            Limits::default(),
            "the flags' defaults are the library's"
        );
        let a = P::parse_from([
            "serve",
            "--target",
            "emu",
            "--max-connections",
            "1000",
            "--max-controllers",
            "40",
            "--max-unauth-controllers",
            "8",
            "--max-pending",
            "100",
            "--admin-buffer",
            "65536",
            "--unauth-buffer",
            "16384",
            "--connect-timeout-ms",
            "2000",
            "--pdu-timeout-ms",
            "3000",
            "--r2t-timeout-ms",
            "4000",
        ])
        .a;
        let l = build_config(&a, emu()).unwrap().limits;
        assert_eq!(
            (
                l.max_connections,
                l.max_controllers,
                l.max_unauth_controllers,
                l.max_pending
            ),
            (1000, 40, 8, 100)
        );
        assert_eq!((l.admin_buffer, l.unauth_buffer), (65536, 16384));
        assert_eq!(
            (l.connect_timeout_ms, l.pdu_timeout_ms, l.r2t_timeout_ms),
            (2000, 3000, 4000)
        );
        // A bound that leaves listed hosts no room is refused, naming the flags.
        let a = P::parse_from(["serve", "--target", "emu", "--max-pending", "300"]).a;
        let Err(e) = build_config(&a, emu()) else {
            panic!("--max-pending 300 with 256 connections was accepted");
        };
        let e = e.to_string();
        assert!(
            e.contains("--max-pending") && e.contains("--max-connections"),
            "{e}"
        );
    }
}

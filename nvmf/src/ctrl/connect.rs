//! Connect's admission rules: the subsystem, the host, a new controller on an admin
//! queue, an I/O queue bound to a live controller.

use super::*;

/// Why a Connect is refused: its status, dword 0 and a log line.
#[derive(Debug)]
pub struct ConnectRefusal {
    /// Status.
    pub status: Status,
    /// Dword 0 (IPO/IATTR for Invalid Parameters).
    pub dw0: u32,
    /// For the log.
    pub why: String,
}

fn refuse_param(p: InvalidParam, extra: &str) -> ConnectRefusal {
    ConnectRefusal {
        status: Status::new(Sct::CommandSpecific, connect_sc::INVALID_PARAMETERS).with_dnr(true),
        dw0: p.dw0(),
        why: format!("{}{extra}", p.why),
    }
}

/// What a successful Connect made.
pub enum Connected {
    /// An admin queue: a new controller.
    Admin(Arc<Controller>),
    /// An I/O queue of an existing controller.
    Io(Arc<Controller>, u16),
}

/// Admits a Connect: finds the subsystem, checks the host, makes the controller (admin
/// queue) or binds the I/O queue to its controller.
pub fn connect(
    shared: &Shared,
    cmd: &ConnectCmd,
    data: &[u8],
) -> Result<(Connected, ConnectData), ConnectRefusal> {
    let (d, nqn_host) = connect_data(data)?;
    if cmd.recfmt != 0 {
        return Err(ConnectRefusal {
            status: Status::new(Sct::CommandSpecific, connect_sc::INCOMPATIBLE_FORMAT)
                .with_dnr(true),
            dw0: 0,
            why: format!("record format {} is not 0", cmd.recfmt),
        });
    }
    let Some(sub) = shared.subsystem(&d.subnqn) else {
        return Err(refuse_param(
            InvalidParam {
                offset: fabrics::connect_data_off::SUBNQN as u16,
                in_data: true,
                why: "no such subsystem",
            },
            &format!(" ({})", d.subnqn),
        ));
    };
    if !nqn_host && !sub.is_discovery() && !sub.allow_any_host {
        return Err(refuse_param(
            InvalidParam {
                offset: fabrics::connect_data_off::HOSTNQN as u16,
                in_data: true,
                why: "hostnqn is not a valid nqn",
            },
            &format!(" ({:?})", d.hostnqn),
        ));
    }
    if !sub.host_allowed(&d.hostnqn) {
        return Err(ConnectRefusal {
            status: Status::new(Sct::CommandSpecific, connect_sc::INVALID_HOST).with_dnr(true),
            dw0: 0,
            why: format!(
                "host {} is not allowed to connect to {}",
                d.hostnqn, sub.nqn
            ),
        });
    }
    let lim = &shared.limits;
    let sq_param = |why| InvalidParam {
        offset: fabrics::connect_off::SQSIZE as u16,
        in_data: false,
        why,
    };
    if cmd.sqsize == 0 || cmd.sqsize >= lim.max_queue_size {
        return Err(refuse_param(
            sq_param("sqsize is 0 or above the maximum queue entries"),
            &format!(
                " (sqsize {}, at most {})",
                cmd.sqsize,
                lim.max_queue_size - 1
            ),
        ));
    }
    if cmd.qid == 0 {
        return connect_admin(shared, sub, cmd, d);
    }
    connect_io(sub, cmd, d, lim)
}

/// The Connect data, with the host NQN as sent even when it is not an NQN (and whether it
/// is one). A host that sends an empty host NQN (SPDK's initiator when none is given) or
/// some other text may still connect where any host is allowed, as with the Linux
/// target: it is known by that text (printable ASCII as sent, other bytes escaped; the
/// empty string for none) and its HOSTID, which its I/O queues must repeat. Such a name
/// never matches an allow-list entry (those are NQNs), so the host reaches only the
/// discovery subsystem and subsystems open to any host.
fn connect_data(data: &[u8]) -> Result<(ConnectData, bool), ConnectRefusal> {
    use fabrics::connect_data_off as o;
    match ConnectData::parse(data) {
        Ok(d) => Ok((d, true)),
        Err(p) if p.offset as usize == o::HOSTNQN && data.len() >= fabrics::CONNECT_DATA_LEN => {
            let field = &data[o::HOSTNQN..o::HOSTNQN + fabrics::NQN_FIELD];
            let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
            let mut hostid = [0u8; 16];
            hostid.copy_from_slice(&data[o::HOSTID..o::HOSTID + 16]);
            let subnqn = fabrics::read_nqn(&data[o::SUBNQN..o::SUBNQN + fabrics::NQN_FIELD])
                .ok_or_else(|| {
                    refuse_param(
                        InvalidParam {
                            offset: o::SUBNQN as u16,
                            in_data: true,
                            why: "subnqn is not a valid nqn",
                        },
                        "",
                    )
                })?;
            let d = ConnectData {
                hostid,
                cntlid: u16::from_le_bytes([data[o::CNTLID], data[o::CNTLID + 1]]),
                subnqn,
                hostnqn: field[..end].escape_ascii().to_string(),
            };
            Ok((d, false))
        }
        Err(p) => Err(refuse_param(p, "")),
    }
}

/// A Connect on an admin queue: a new controller with the next free CNTLID.
fn connect_admin(
    shared: &Shared,
    sub: &Arc<Subsystem>,
    cmd: &ConnectCmd,
    d: ConnectData,
) -> Result<(Connected, ConnectData), ConnectRefusal> {
    let lim = &shared.limits;
    if d.cntlid != CNTLID_DYNAMIC {
        return Err(refuse_param(
            InvalidParam {
                offset: fabrics::connect_data_off::CNTLID as u16,
                in_data: true,
                why: "the dynamic controller model needs cntlid ffffh on the admin queue",
            },
            "",
        ));
    }
    let mut t = super::lock(&sub.table, "the controller table");
    if t.live.len() >= lim.max_controllers as usize {
        return Err(ConnectRefusal {
            status: Status::new(Sct::CommandSpecific, connect_sc::CONTROLLER_BUSY),
            dw0: 0,
            why: format!(
                "{} already has {} controllers (the limit)",
                sub.nqn,
                t.live.len()
            ),
        });
    }
    let unauth = crate::budget::unauth_controller_refusal(shared, sub, &t.live, &d.hostnqn)?;
    // Next free CNTLID in 1..=FFEFh, distinct from every live one.
    let mut id = t.next_cntlid;
    while t.live.iter().any(|c| c.cntlid == id) {
        id = if id >= CNTLID_MAX { 1 } else { id + 1 };
    }
    t.next_cntlid = if id >= CNTLID_MAX { 1 } else { id + 1 };
    let ctrl = Arc::new(Controller {
        cntlid: id,
        subsys: Arc::clone(sub),
        hostnqn: d.hostnqn.clone(),
        hostid: d.hostid,
        dead: AtomicBool::new(false),
        epoch: AtomicU32::new(0),
        kato_ms: AtomicU32::new(cmd.kato_ms),
        last_keep_alive: AtomicU64::new(shared.now_ms()),
        unauth,
        st: Mutex::new(CtrlState {
            regs: Regs::default(),
            nq_granted: 0,
            aec: 0,
            io_qids: vec![false; lim.max_io_queues as usize + 1],
        }),
    });
    t.live.push(Arc::clone(&ctrl));
    Ok((Connected::Admin(ctrl), d))
}

/// A Connect on an I/O queue: bound to the host's live controller, within the queues
/// granted, once the controller is enabled.
fn connect_io(
    sub: &Arc<Subsystem>,
    cmd: &ConnectCmd,
    d: ConnectData,
    lim: &Limits,
) -> Result<(Connected, ConnectData), ConnectRefusal> {
    let cntlid_param = InvalidParam {
        offset: fabrics::connect_data_off::CNTLID as u16,
        in_data: true,
        why: "no live controller with this cntlid for this host",
    };
    let Some(ctrl) = sub.controller(d.cntlid) else {
        return Err(refuse_param(cntlid_param, &format!(" ({})", d.cntlid)));
    };
    if ctrl.hostnqn != d.hostnqn || ctrl.hostid != d.hostid || sub.is_discovery() {
        return Err(refuse_param(cntlid_param, &format!(" ({})", d.cntlid)));
    }
    let mut st = super::lock(&ctrl.st, "a controller's state");
    let qid_param = InvalidParam {
        offset: fabrics::connect_off::QID as u16,
        in_data: false,
        why: "qid above the queues granted, or already connected",
    };
    let allowed = if st.nq_granted > 0 {
        st.nq_granted
    } else {
        lim.max_io_queues
    };
    if cmd.qid > allowed || st.io_qids.get(cmd.qid as usize).copied().unwrap_or(true) {
        return Err(refuse_param(qid_param, &format!(" (qid {})", cmd.qid)));
    }
    if st.regs.csts & 1 == 0 {
        return Err(ConnectRefusal {
            status: Status::COMMAND_SEQUENCE_ERROR.with_dnr(true),
            dw0: 0,
            why: format!(
                "i/o queue {} connect before the controller {} is enabled",
                cmd.qid, ctrl.cntlid
            ),
        });
    }
    st.io_qids[cmd.qid as usize] = true;
    drop(st);
    Ok((Connected::Io(ctrl, cmd.qid), d))
}

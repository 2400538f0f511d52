//! The fault spec grammar (module doc of [`crate::emu`]): one `+`-separated item at a
//! time.

use std::time::Duration;

use super::{FaultAction, FaultPlan, FaultRule, FaultTarget, PiField};
use crate::spec::{nvm_opc, Sct, Status};

fn parse_target(s: &str) -> Result<FaultTarget, String> {
    let hex = |h: &str| {
        u8::from_str_radix(h.trim_start_matches("0x"), 16)
            .map_err(|_| format!("bad opcode `{h}` (hex, like 0x02)"))
    };
    Ok(match s {
        "io" | "any" => FaultTarget::AnyIo,
        "read" => FaultTarget::Io(nvm_opc::READ),
        "write" => FaultTarget::Io(nvm_opc::WRITE),
        "flush" => FaultTarget::Io(nvm_opc::FLUSH),
        "write-zeroes" | "wz" => FaultTarget::Io(nvm_opc::WRITE_ZEROES),
        "dsm" | "deallocate" => FaultTarget::Io(nvm_opc::DATASET_MANAGEMENT),
        "admin" => FaultTarget::AnyAdmin,
        _ if s.starts_with("admin0x") => FaultTarget::Admin(hex(&s[5..])?),
        _ if s.starts_with("0x") => FaultTarget::Io(hex(s)?),
        _ => {
            return Err(format!(
            "unknown command `{s}`: use read, write, flush, wz, dsm, io, admin, 0xNN or admin0xNN"
        ))
        }
    })
}

fn parse_status(s: &str) -> Result<Status, String> {
    let named = match s {
        "internal" => Some(Status::INTERNAL_ERROR),
        "dte" | "data-transfer" => Some(Status::DATA_TRANSFER_ERROR),
        "abort" | "aborted" => Some(Status::ABORT_REQUESTED),
        "not-ready" => Some(Status::NAMESPACE_NOT_READY),
        "read-error" | "unrecovered-read" => Some(Status::UNRECOVERED_READ_ERROR),
        "write-fault" => Some(Status::WRITE_FAULT),
        "transient" => Some(Status::TRANSIENT_TRANSPORT_ERROR),
        _ => None,
    };
    if let Some(st) = named {
        return Ok(st);
    }
    let (sct, sc) = s
        .split_once('-')
        .ok_or_else(|| format!("bad status `{s}`: use <sct>-<sc> in hex (2-81) or a name (internal, dte, read-error, write-fault, not-ready, abort, transient)"))?;
    let sct = u8::from_str_radix(sct.trim_start_matches("0x"), 16)
        .ok()
        .filter(|v| *v < 8)
        .ok_or_else(|| format!("bad status code type `{sct}` (hex 0..7)"))?;
    let sc = u8::from_str_radix(sc.trim_start_matches("0x"), 16)
        .map_err(|_| format!("bad status code `{sc}` (hex 00..ff)"))?;
    Ok(Status::new(Sct::from_code(sct), sc))
}

/// A delay: the crate's one duration grammar ([`crate::parse::parse_duration`]).
fn parse_duration(s: &str) -> Result<Duration, String> {
    crate::parse::parse_duration(s).map_err(|e| e.to_string())
}

fn parse_rate(s: &str) -> Option<Result<f64, String>> {
    let v = if let Some(p) = s.strip_suffix('%') {
        p.parse::<f64>().ok().map(|v| v / 100.0)
    } else if s.contains('.') || s == "0" || s == "1" {
        s.parse::<f64>().ok()
    } else {
        return None;
    }?;
    Some(if (0.0..=1.0).contains(&v) {
        Ok(v)
    } else {
        Err(format!("rate `{s}` outside 0..=100%"))
    })
}

pub(super) fn parse_item(item: &str, plan: &mut FaultPlan) -> Result<(), String> {
    let mut f = item.split('/');
    let action = f.next().unwrap_or_default();
    if parse_plan_item(action, &mut f, plan)? {
        return Ok(());
    }
    let target = parse_target(
        f.next()
            .ok_or("missing the command (read, write, io, ...)")?,
    )?;
    let mut rule = parse_rule_action(action, target, &mut f)?;
    parse_options(&mut rule, f)?;
    plan.rules.push(rule);
    Ok(())
}

fn num(s: Option<&str>, what: &str) -> Result<u64, String> {
    s.and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("{what} needs a number"))
}

/// The items that set the plan rather than add a rule (`seed`, `fatal`, `remove`,
/// `nsze`); returns whether `action` was one.
fn parse_plan_item<'a>(
    action: &str,
    f: &mut impl Iterator<Item = &'a str>,
    plan: &mut FaultPlan,
) -> Result<bool, String> {
    match action {
        "seed" => {
            plan.seed = num(f.next(), "seed")?;
            Ok(true)
        }
        "nsze" => {
            let v = f.next().ok_or("nsze needs a number of blocks")?;
            let n = match v.strip_prefix("0x") {
                Some(h) => u64::from_str_radix(h, 16).ok(),
                None => v.parse().ok(),
            }
            .ok_or_else(|| format!("bad nsze `{v}` (a number of blocks, decimal or 0x hex)"))?;
            if n == 0 {
                return Err("nsze/0 hides every namespace; give a number of blocks".into());
            }
            if let Some(extra) = f.next() {
                return Err(format!("unexpected `{extra}` after the nsze"));
            }
            plan.nsze = Some(n);
            Ok(true)
        }
        "fatal" | "remove" => {
            if f.next() != Some("after") {
                return Err(format!("use {action}/after/<I/O commands>"));
            }
            let n = num(f.next(), action)?;
            if n == 0 {
                return Err(format!(
                    "{action}/after/0 never fires: I/O commands are counted from 1 (use {action}/after/1 for the first)"
                ));
            }
            if let Some(extra) = f.next() {
                return Err(format!("unexpected `{extra}` after the count"));
            }
            if action == "fatal" {
                plan.fatal_after = Some(n);
            } else {
                plan.remove_after = Some(n);
            }
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// The rule an action makes (with its own field, for `status` and `delay`).
fn parse_rule_action<'a>(
    action: &str,
    target: FaultTarget,
    f: &mut impl Iterator<Item = &'a str>,
) -> Result<FaultRule, String> {
    let a = match action {
        "status" => {
            let st = parse_status(f.next().ok_or("missing the status")?)?;
            if st.is_success() {
                return Err(
                    "0-0 is Successful Completion, not a fault (use another status)".into(),
                );
            }
            FaultAction::Status(st)
        }
        "delay" => {
            let d = parse_duration(f.next().ok_or("missing the delay")?)?;
            if d.is_zero() {
                return Err("a delay of 0 changes nothing (give a duration such as 2ms)".into());
            }
            FaultAction::Delay(d)
        }
        "drop" => FaultAction::Drop,
        "pi-guard" => FaultAction::CorruptPi(PiField::Guard),
        "pi-app" => FaultAction::CorruptPi(PiField::AppTag),
        "pi-ref" => FaultAction::CorruptPi(PiField::RefTag),
        "dup" | "duplicate" => FaultAction::Duplicate,
        "spurious" => FaultAction::Spurious,
        _ => {
            return Err(format!(
                "unknown fault `{action}`: use status, delay, drop, dup, spurious, pi-guard, pi-app, pi-ref, fatal, remove, nsze or seed"
            ))
        }
    };
    Ok(FaultRule::new(target, a))
}

/// The options after a rule's fields: `dnr`, `max<N>`, `cid<N>`, a rate; each once.
fn parse_options<'a>(rule: &mut FaultRule, f: impl Iterator<Item = &'a str>) -> Result<(), String> {
    let mut opts_seen: Vec<&str> = Vec::new();
    for opt in f {
        let kind = if opt == "dnr" {
            "dnr"
        } else if opt.starts_with("max") {
            "max"
        } else if opt.starts_with("cid") {
            "cid"
        } else {
            "rate"
        };
        if opts_seen.contains(&kind) {
            return Err(format!("{kind} is given twice"));
        }
        opts_seen.push(kind);
        if opt == "dnr" {
            match &mut rule.action {
                FaultAction::Status(s) => *s = s.with_dnr(true),
                _ => return Err("dnr applies to status faults only".into()),
            }
        } else if let Some(n) = opt.strip_prefix("max") {
            let n: u64 = n.parse().map_err(|_| format!("bad limit `{opt}`"))?;
            if n == 0 {
                return Err("max0 never fires (give at least max1)".into());
            }
            rule.max = Some(n);
        } else if let Some(c) = opt.strip_prefix("cid") {
            rule.spurious_cid = c
                .parse()
                .map_err(|_| format!("bad cid `{opt}` (decimal)"))?;
        } else if let Some(r) = parse_rate(opt) {
            rule.rate = r?;
            if rule.rate == 0.0 {
                return Err(format!("a rate of `{opt}` never fires"));
            }
        } else {
            return Err(format!(
                "unknown option `{opt}` (dnr, <rate>%, max<N>, cid<N>)"
            ));
        }
    }
    Ok(())
}

//! The server's memory and time budget against hosts that try to exceed it: R2Ts never
//! answered and log pages never read on a discovery admin queue of a host no allow-list
//! names, connections that never connect, strangers taking discovery controllers or
//! filling the connection table, half-sent PDUs with keep-alive off. Each test measures the
//! process's resident memory (`/proc/self/status`) and the server's own accounting
//! (`Server::memory`) while a listed host keeps doing verified I/O.
//!
//! The tests run one at a time (`serial`): resident memory is the whole process's.

#[path = "../loopback/common.rs"]
#[allow(dead_code)]
mod common;
#[path = "../loopback/host.rs"]
#[allow(dead_code)]
mod host;

mod admin;
mod deadlines;
mod strangers;
mod support;

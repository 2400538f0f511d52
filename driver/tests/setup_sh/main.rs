//! `scripts/setup.sh` against fake sysfs/procfs/dev trees, and `status` on this machine.
//!
//! `modprobe`, `mount` and `umount` are replaced by stubs that log their arguments. The
//! failing stubs ([`fixture::run`]) change nothing; the working ones
//! ([`fixture::run_working`]) act on the fake tree only (a module directory, a line of
//! the fake mounts file). No test can load a module or mount anything on the machine
//! running it. [`fake_kernel::FakeKernel`] plays the kernel's part in binding
//! (driver_override, unbind, drivers_probe) on the fake tree.
//!
//! A module per area: `status`, binding with `config`, noiommu, the hugepage pool,
//! `reset`, `TARGET_USER`, refused values, and a run with busybox tools only.

#[path = "../support/fakesys.rs"]
mod fakesys;

#[macro_use]
mod fixture;
mod fake_kernel;

mod binding;
mod busybox;
mod hugepages;
mod noiommu;
mod reset;
mod status;
mod target_user;
mod validation;

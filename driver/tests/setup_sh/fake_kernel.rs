//! A thread that plays the kernel's part in binding on a fake tree.

use std::fs;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::fakesys::{kernel_bind, kernel_unbind, FakeSys};
use crate::fixture::read;

/// Plays the kernel's part in binding on a fake tree, polled every 2 ms until dropped:
/// a BDF written to `bus/pci/drivers/<drv>/unbind` unbinds the device; a BDF written to
/// `bus/pci/drivers_probe` binds an unbound device to its `driver_override` or, with
/// none, to `nvme` when that driver is there (NVMe class only). Binding to vfio-pci makes
/// `/dev/vfio/<group>`; unbinding from it removes the node. Each file is consumed.
pub struct FakeKernel {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl FakeKernel {
    pub fn start(f: &FakeSys) -> Self {
        let (sys, dev) = (f.sys(), f.dev());
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                Self::step(&sys, &dev);
                std::thread::sleep(Duration::from_millis(2));
            }
        });
        FakeKernel {
            stop,
            thread: Some(thread),
        }
    }

    /// A BDF from a file the script wrote, consuming the file; `None` while it is empty
    /// (written a moment later).
    fn take(p: &Path) -> Option<String> {
        let s = fs::read_to_string(p).ok()?;
        let b = s.trim().to_string();
        if b.is_empty() {
            return None;
        }
        fs::remove_file(p).unwrap();
        Some(b)
    }

    fn group(sys: &Path, bdf: &str) -> Option<String> {
        let l = fs::read_link(sys.join("devices/pci0000:00").join(bdf).join("iommu_group")).ok()?;
        Some(l.file_name()?.to_string_lossy().into_owned())
    }

    fn step(sys: &Path, dev: &Path) {
        let drivers = sys.join("bus/pci/drivers");
        for d in fs::read_dir(&drivers).into_iter().flatten().flatten() {
            if let Some(b) = Self::take(&d.path().join("unbind")) {
                if kernel_unbind(sys, &b).as_deref() == Some("vfio-pci") {
                    if let Some(g) = Self::group(sys, &b) {
                        let _ = fs::remove_file(dev.join("vfio").join(g));
                    }
                }
            }
        }
        let Some(b) = Self::take(&sys.join("bus/pci/drivers_probe")) else {
            return;
        };
        let d = sys.join("devices/pci0000:00").join(&b);
        if fs::symlink_metadata(d.join("driver")).is_ok() {
            return;
        }
        let ov = read(d.join("driver_override")).unwrap_or_default();
        let ov = ov.trim();
        let target = if !ov.is_empty() && ov != "(null)" {
            ov.to_string()
        } else if read(d.join("class")).as_deref() == Some("0x010802\n")
            && drivers.join("nvme").is_dir()
        {
            "nvme".to_string()
        } else {
            return;
        };
        if !drivers.join(&target).is_dir() {
            return;
        }
        kernel_bind(sys, &b, &target);
        if target == "vfio-pci" {
            if let Some(g) = Self::group(sys, &b) {
                fs::write(dev.join("vfio").join(g), "").unwrap();
            }
        }
    }
}

impl Drop for FakeKernel {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

//! `TARGET_USER`: the group node, the hugetlbfs group and the memlock advice for a
//! user who is not root.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::process::Command;

use crate::fake_kernel::FakeKernel;
use crate::fixture::{fresh_tree, run_working};

#[test]
fn target_user_gets_the_group_node_a_hugetlbfs_group_and_memlock_advice() {
    need_bash!();
    let f = fresh_tree();
    let me = |flag: &str| {
        let o = Command::new("id").arg(flag).output().unwrap();
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    // As root, hand the device to `nobody`; otherwise to oneself (a chown to one's own
    // uid and gid is allowed), which still checks the whole path.
    let nobody = Command::new("id").args(["-u", "nobody"]).output().ok();
    let user = if me("-u") == "0" && nobody.is_some_and(|o| o.status.success()) {
        "nobody".to_string()
    } else {
        me("-un")
    };
    let id = |flag: &str| {
        let o = Command::new("id").args([flag, &user]).output().unwrap();
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse::<u32>()
            .unwrap()
    };
    let (uid, gid) = (id("-u"), id("-g"));
    let _k = FakeKernel::start(&f);
    let r = run_working(
        &f,
        &["config"],
        &[
            ("TARGET_USER", &user),
            ("HUGEMEM", "64"),
            ("BIND_WAIT_S", "5"),
        ],
    );
    assert_eq!(r.code(), 0, "{}{}", r.stdout(), r.stderr());
    let node = f.dev().join("vfio/9");
    let md = fs::metadata(&node).unwrap();
    assert_eq!((md.uid(), md.gid()), (uid, gid));
    assert!(
        r.stdout().contains(&format!(
            "0000:01:00.0: {} now belongs to {user} (uid {uid}, gid {gid})",
            node.display()
        )),
        "{}",
        r.stdout()
    );
    assert!(
        r.calls.contains(&format!(
            "mount -t hugetlbfs -o pagesize=2048K,gid={gid},mode=1770 nodev"
        )),
        "{}",
        r.calls
    );
    let out = r.stdout();
    assert!(
        out.contains(&format!("a line '{user} - memlock 65536'")),
        "{out}"
    );
    assert!(out.contains("LimitMEMLOCK=67108864"), "{out}");
    assert!(out.contains("kestrel doctor"), "{out}");
}

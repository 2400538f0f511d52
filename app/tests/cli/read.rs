//! `read`: a range of a target into a file.

use crate::common::{assert_usage_error, kestrel, stderr, test_bytes};

#[test]
fn read_copies_a_range_of_a_file_target() {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("t.img");
    let data = test_bytes(256 << 10);
    std::fs::write(&img, &data).unwrap();
    let out = dir.path().join("out.bin");
    let o = kestrel(&[
        "read",
        "--target",
        &format!("file:{},direct=off", img.display()),
        "--offset",
        "8k",
        "--length",
        "200k",
        "--output",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let got = std::fs::read(&out).unwrap();
    assert!(got == data[8192..8192 + 200 * 1024], "the range read back");
    let o = kestrel(&[
        "read",
        "--target",
        &format!("file:{},direct=off", img.display()),
        "--offset",
        "100",
        "--length",
        "4k",
    ]);
    assert_usage_error(&o, &["multiples of the block size"]);
}

#[test]
fn read_and_write_take_one_target() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.bin");
    std::fs::write(&input, test_bytes(4096)).unwrap();
    let two = ["--target", "emu", "--target", "emu"];
    let o = kestrel(&[&["read"][..], &two, &["--length", "4k"]].concat());
    assert_usage_error(&o, &["kestrel read takes one --target"]);
    let o = kestrel(&[&["write"][..], &two, &["--input", input.to_str().unwrap()]].concat());
    assert_usage_error(&o, &["kestrel write takes one --target"]);
}

//! A host page cache that holds older bytes than the device: oleo reads around it.
//!
//! oleo writes large data O_DIRECT and reads through the host page cache. A buffered read
//! that races an O_DIRECT write of the same blocks can leave the old bytes cached after the
//! write (fstests generic/418 on a loop device gave "data checksum mismatch" and EIO on a
//! buffered read of a just-written file). The race is timing-dependent; the state it
//! leaves is not, and is built here: a loop device whose own page cache holds bytes that
//! differ from what its backing file (the disk) holds. A read through oleo must give the
//! disk's bytes, which match their checksums, not EIO.

use oleo_testkit::damage::{physical_copies, write_at};
use oleo_testkit::*;
use std::os::unix::fs::FileExt;
use std::path::Path;

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");

fn pattern(len: usize) -> Vec<u8> {
    (0..len).map(|i| (i * 37 % 253) as u8).collect()
}

/// The logical address (btrfs's filefrag "physical") of the first extent of `file`.
fn first_extent(file: &Path) -> u64 {
    let out = std::process::Command::new("filefrag")
        .args(["-v", "-b1"])
        .arg(file)
        .output()
        .expect("filefrag");
    let text = String::from_utf8_lossy(&out.stdout);
    // "   0:        0..  131071:  298844160.. 298975231: 131072: last,eof"
    let line = text
        .lines()
        .find(|l| l.trim_start().starts_with("0:"))
        .unwrap_or_else(|| panic!("no extent in filefrag output:\n{text}"));
    let field = line.split(':').nth(2).expect("physical field");
    field
        .split("..")
        .next()
        .unwrap()
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{line}: {e}"))
}

#[test]
fn a_stale_host_page_cache_is_read_around() {
    let name = "stale_cache";
    if !(require_root(name) && require_fuse(name)) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image = dir.join("image");
    empty_image(&image, 256, &[]).unwrap();
    let kmnt = dir.subdir("kmnt").unwrap();
    let data = pattern(128 << 10);
    // The kernel writes the file, with its checksums.
    let k = KernelMount::mount(&image, &kmnt, &["rw"]).unwrap();
    std::fs::write(kmnt.join("f"), &data).unwrap();
    k.unmount().unwrap();
    let k = KernelMount::mount(&image, &kmnt, &["ro"]).unwrap();
    let logical = first_extent(&kmnt.join("f"));
    k.unmount().unwrap();
    let physical = physical_copies(&image, logical).unwrap()[0];

    // The loop device's page cache gets other bytes than the disk has: garbage is written
    // to the backing file, read through the device (now cached there), and the right bytes
    // put back into the backing file behind the device's cache.
    let lo = LoopDevice::attach(&image, false).unwrap();
    let garbage = vec![0xa5u8; 4096];
    write_at(&image, physical, &garbage).unwrap();
    let dev = std::fs::File::open(lo.path()).unwrap();
    let mut seen = vec![0u8; 4096];
    dev.read_exact_at(&mut seen, physical).unwrap();
    assert_eq!(seen, garbage, "the device reads its backing file");
    write_at(&image, physical, &data[..4096]).unwrap();
    dev.read_exact_at(&mut seen, physical).unwrap();
    assert_eq!(
        seen, garbage,
        "the device's page cache keeps the old bytes (else this test shows nothing)"
    );
    // `dev` stays open: the last close of a block device drops its page cache.

    let mnt = dir.subdir("mnt").unwrap();
    let m = OleoMount::mount(Path::new(OLEO), lo.path(), &mnt, &[]).unwrap();
    let got = std::fs::read(mnt.join("f"));
    let log = m.log_text();
    m.unmount().unwrap();
    drop(dev);
    let got = got.unwrap_or_else(|e| panic!("read through oleo: {e}\n{log}"));
    assert!(got == data, "oleo returned other bytes than the disk holds");
    drop(lo);
    btrfs_check(&image, true).unwrap();
}

//! POSIX behaviour found missing by a standard test suite, through a real FUSE mount and
//! against what kernel btrfs does: a listing ends where the directory ended at opendir,
//! timestamps come from one clock, renameat2(RENAME_WHITEOUT) leaves a whiteout, SEEK_DATA
//! sees data still in the page cache.

use oleo_testkit::*;
use std::collections::HashSet;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::process::Command;

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");

fn ready(what: &str) -> bool {
    require_root(what) && require_fuse(what)
}

fn fresh_mount(dir: &TempDir) -> OleoMount {
    let image = dir.join("image");
    let out = Command::new(OLEO)
        .args(["mkfs", "-q", "--size", "512M"])
        .arg(&image)
        .output()
        .unwrap();
    assert!(out.status.success(), "oleo mkfs: {out:?}");
    let mnt = dir.subdir("mnt").unwrap();
    OleoMount::mount_rw(Path::new(OLEO), &image, &mnt, &[]).unwrap()
}

#[test]
fn a_listing_renamed_while_read_lists_each_entry_once() {
    let name = "posix_readdir_rename";
    if !ready(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let m = fresh_mount(&dir);
    let d = m.path().join("d");
    std::fs::create_dir(&d).unwrap();
    const N: usize = 2000;
    for i in 0..N {
        std::fs::write(d.join(format!("f{i}")), b"").unwrap();
    }
    let mut seen = HashSet::new();
    let mut listed = 0;
    for e in std::fs::read_dir(&d).unwrap() {
        let e = e.unwrap();
        listed += 1;
        assert!(listed <= N, "the listing runs on past {N} entries");
        let name = e.file_name();
        assert!(seen.insert(name.clone()), "{name:?} listed twice");
        // Each rename gives the entry a new, higher DIR_INDEX.
        let mut renamed = b"r".to_vec();
        renamed.extend_from_slice(name.as_bytes());
        std::fs::rename(e.path(), d.join(std::ffi::OsStr::from_bytes(&renamed))).unwrap();
    }
    assert_eq!(listed, N, "every entry that existed at opendir is listed");
    assert_eq!(std::fs::read_dir(&d).unwrap().count(), N);
}

#[test]
fn a_whiteout_is_left_where_a_file_was_renamed_from() {
    let name = "posix_whiteout";
    if !ready(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let m = fresh_mount(&dir);
    let (a, b) = (m.path().join("a"), m.path().join("b"));
    std::fs::write(&a, b"moved").unwrap();
    let (ca, cb) = (
        CString::new(a.as_os_str().as_bytes()).unwrap(),
        CString::new(b.as_os_str().as_bytes()).unwrap(),
    );
    // SAFETY: both paths are NUL-terminated.
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_WHITEOUT,
        )
    };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    assert_eq!(std::fs::read(&b).unwrap(), b"moved");
    let w = std::fs::symlink_metadata(&a).unwrap();
    assert!(w.file_type().is_char_device(), "{w:?}");
    assert_eq!(w.rdev(), 0, "a whiteout is the 0:0 character device");
}

#[test]
fn seek_data_sees_data_still_in_the_page_cache() {
    let name = "posix_seek_dirty";
    if !ready(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let m = fresh_mount(&dir);
    use std::os::fd::AsRawFd;
    use std::os::unix::fs::FileExt;
    let seek = |f: &std::fs::File, at: i64, whence: i32| {
        // SAFETY: lseek on an open descriptor.
        unsafe { libc::lseek(f.as_raw_fd(), at, whence) }
    };
    // A file written and closed: oleo knows its holes and reports them.
    let clean = m.path().join("clean");
    {
        let f = std::fs::File::create(&clean).unwrap();
        f.write_all_at(&[1u8; 4096], 0).unwrap();
        f.write_all_at(&[2u8; 4096], 1 << 20).unwrap();
    }
    let f = std::fs::File::open(&clean).unwrap();
    assert_eq!(
        seek(&f, 0, libc::SEEK_HOLE),
        4096,
        "the hole of a clean file"
    );
    assert_eq!(seek(&f, 4096, libc::SEEK_DATA), 1 << 20);
    drop(f);
    // Data only in the page cache: never reported as a hole (xfs_io's pwrite 2 1; seek -d 0).
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(m.path().join("dirty"))
        .unwrap();
    f.write_all_at(b"x", 2).unwrap();
    let data = seek(&f, 0, libc::SEEK_DATA);
    assert_eq!(data, 0, "{}", std::io::Error::last_os_error());
    let hole = seek(&f, 0, libc::SEEK_HOLE);
    assert_eq!(hole, 3, "no hole before the end of the dirty data");
}

#[test]
fn a_link_is_never_older_than_a_fifo_made_before_it() {
    let name = "posix_one_clock";
    if !ready(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let m = fresh_mount(&dir);
    std::fs::write(m.path().join("file"), b"").unwrap();
    for i in 0..200 {
        let fifo = m.path().join(format!("fifo{i}"));
        let c = CString::new(fifo.as_os_str().as_bytes()).unwrap();
        // SAFETY: a NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
        let link = m.path().join(format!("link{i}"));
        std::fs::hard_link(m.path().join("file"), &link).unwrap();
        let (f, l) = (
            std::fs::symlink_metadata(&fifo).unwrap(),
            std::fs::symlink_metadata(&link).unwrap(),
        );
        let (ft, lt) = ((f.ctime(), f.ctime_nsec()), (l.ctime(), l.ctime_nsec()));
        assert!(
            lt >= ft,
            "round {i}: link ctime {lt:?} older than the fifo's {ft:?}"
        );
    }
}

#[test]
fn removed_inodes_live_until_the_kernel_forgets_them() {
    let name = "posix_forget";
    if !ready(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let m = fresh_mount(&dir);
    use std::os::fd::AsRawFd;

    // An open directory, removed: fstat still answers, with no links (kernel btrfs does).
    let d = m.path().join("gone");
    std::fs::create_dir(&d).unwrap();
    let open_dir = std::fs::File::open(&d).unwrap();
    std::fs::remove_dir(&d).unwrap();
    let st = open_dir.metadata().unwrap();
    assert!(st.is_dir() && st.nlink() == 0, "{st:?}");
    // A directory renamed over another one the same way.
    let (a, b) = (m.path().join("a"), m.path().join("b"));
    std::fs::create_dir(&a).unwrap();
    std::fs::create_dir(&b).unwrap();
    let open_b = std::fs::File::open(&b).unwrap();
    std::fs::rename(&a, &b).unwrap();
    assert_eq!(open_b.metadata().unwrap().nlink(), 0);
    drop((open_dir, open_b));

    // Written, closed, unlinked: the kernel may still send a SETATTR for it.
    let f = m.path().join("written");
    std::fs::write(&f, b"data").unwrap();
    std::fs::remove_file(&f).unwrap();
    let c = CString::new(m.path().as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path; the descriptor is closed below.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY) };
    assert!(fd >= 0);
    // SAFETY: fd is open.
    let r = unsafe { libc::syncfs(fd) };
    // SAFETY: fd is open.
    unsafe { libc::close(fd) };
    assert_eq!(r, 0, "syncfs: {}", std::io::Error::last_os_error());

    // Found (an O_PATH descriptor holds the inode), unlinked, then opened: works.
    let p = m.path().join("found");
    std::fs::write(&p, b"still here").unwrap();
    let cp = CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    let path_fd = unsafe { libc::open(cp.as_ptr(), libc::O_PATH) };
    assert!(path_fd >= 0);
    std::fs::remove_file(&p).unwrap();
    let reopened = std::fs::File::open(format!("/proc/self/fd/{path_fd}")).unwrap();
    assert_eq!(reopened.metadata().unwrap().nlink(), 0);
    let mut text = String::new();
    use std::io::Read;
    (&reopened).read_to_string(&mut text).unwrap();
    assert_eq!(text, "still here");
    assert!(reopened.as_raw_fd() >= 0);
    drop(reopened);
    // SAFETY: path_fd is open.
    unsafe { libc::close(path_fd) };
}

//! POSIX behaviour found missing by a standard test suite, through a real FUSE mount and
//! against what kernel btrfs does: a listing ends where the directory ended at opendir,
//! timestamps come from one clock, renameat2(RENAME_WHITEOUT) leaves a whiteout, SEEK_DATA
//! sees data still in the page cache, O_TMPFILE makes unnamed files that linkat(2) can name.

use oleo_testkit::*;
use std::collections::HashSet;
use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::Path;
use std::process::Command;

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");

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
    if !require_fuse_mount(name) {
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
    if !require_fuse_mount(name) {
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
    if !require_fuse_mount(name) {
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
    if !require_fuse_mount(name) {
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
    if !require_fuse_mount(name) {
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

/// open(O_TMPFILE) in a directory; the descriptor.
fn open_tmpfile(dir: &Path, extra: i32) -> std::fs::File {
    use std::os::fd::FromRawFd;
    let c = CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_TMPFILE | libc::O_RDWR | extra, 0o640) };
    assert!(fd >= 0, "O_TMPFILE: {}", std::io::Error::last_os_error());
    // SAFETY: fd was just opened and is owned here only.
    unsafe { std::fs::File::from_raw_fd(fd) }
}

/// linkat(2) of an open descriptor through /proc, as `ln` of an O_TMPFILE file is done.
fn link_fd(f: &std::fs::File, to: &Path) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    let from = CString::new(format!("/proc/self/fd/{}", f.as_raw_fd())).unwrap();
    let to = CString::new(to.as_os_str().as_bytes()).unwrap();
    // SAFETY: both paths are NUL-terminated.
    let r = unsafe {
        libc::linkat(
            libc::AT_FDCWD,
            from.as_ptr(),
            libc::AT_FDCWD,
            to.as_ptr(),
            libc::AT_SYMLINK_FOLLOW,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Used bytes of the filesystem at `p`.
fn used(p: &Path) -> u64 {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: zeroed statvfs is a valid out-parameter.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a NUL-terminated path and a valid out-parameter.
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0);
    (st.f_blocks - st.f_bfree) * st.f_frsize
}

fn commit(p: &Path) {
    oleo_testkit::mount::btrfs_sync(p).unwrap();
}

#[test]
fn o_tmpfile_makes_unnamed_files_that_linkat_can_name() {
    use std::io::{Read, Seek, SeekFrom, Write};
    let name = "posix_tmpfile";
    if !require_fuse_mount(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let m = fresh_mount(&dir);
    let d = m.path().join("d");
    std::fs::create_dir(&d).unwrap();
    // A set-group-ID directory: the new file takes its group, as any new file would.
    std::os::unix::fs::chown(&d, None, Some(4242)).unwrap();
    std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o2775)).unwrap();
    commit(m.path());
    let before = used(m.path());

    // Named later: written, read back, committed while unnamed, then linked in.
    let mut f = open_tmpfile(&d, 0);
    let data: Vec<u8> = (0..(3u32 << 20)).map(|i| (i * 7 % 251) as u8).collect();
    f.write_all(&data).unwrap();
    let st = f.metadata().unwrap();
    assert_eq!(
        (st.nlink(), st.mode() & 0o170777, st.gid(), st.len()),
        (0, 0o100640, 4242, data.len() as u64)
    );
    assert_eq!(
        std::fs::read_dir(&d).unwrap().count(),
        0,
        "an unnamed file is listed"
    );
    f.sync_all().unwrap();
    link_fd(&f, &d.join("named")).unwrap();
    assert_eq!(f.metadata().unwrap().nlink(), 1);
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut back = Vec::new();
    f.read_to_end(&mut back).unwrap();
    assert!(back == data, "read back through the descriptor differs");
    drop(f);
    assert!(std::fs::read(d.join("named")).unwrap() == data);

    // O_EXCL: never to be named (the kernel refuses the link).
    let excl = open_tmpfile(&d, libc::O_EXCL);
    let e = link_fd(&excl, &d.join("never")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOENT), "{e}");
    drop(excl);

    // Never named: its space comes back at the last close.
    let mut gone = open_tmpfile(m.path(), 0);
    gone.write_all(&vec![1u8; 32 << 20]).unwrap();
    gone.sync_all().unwrap();
    assert!(used(m.path()) > before + (30 << 20));
    drop(gone);
    let t0 = std::time::Instant::now();
    loop {
        commit(m.path());
        if used(m.path()) < before + (8 << 20) {
            break;
        }
        assert!(
            t0.elapsed().as_secs() < 10,
            "an unnamed file's space was not given back"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let image = dir.join("image");
    m.unmount().unwrap();
    assert_btrfs_check(&image, "O_TMPFILE");
    // The kernel sees the named one, with its bytes, and nothing else.
    let kmnt = dir.subdir("kmnt").unwrap();
    let k = KernelMount::mount(&image, &kmnt, &["ro"]).unwrap();
    let names: Vec<_> = std::fs::read_dir(k.path().join("d"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec![std::ffi::OsString::from("named")]);
    assert!(std::fs::read(k.path().join("d/named")).unwrap() == data);
    assert_eq!(std::fs::read_dir(k.path()).unwrap().count(), 1);
    k.unmount().unwrap();
}

/// A server killed with an unnamed file open leaves its orphan item; the next mount
/// deletes the file, as the kernel does.
#[test]
fn an_unnamed_file_of_a_killed_server_is_deleted_at_the_next_mount() {
    use std::io::Write;
    let name = "posix_tmpfile_killed";
    if !require_fuse_mount(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image = dir.join("image");
    let out = Command::new(OLEO)
        .args(["mkfs", "-q", "--size", "512M"])
        .arg(&image)
        .output()
        .unwrap();
    assert!(out.status.success(), "oleo mkfs: {out:?}");
    let mnt = dir.subdir("mnt").unwrap();
    let mut server = Command::new(OLEO)
        .args(["mount", "-f", "-o", "rw"])
        .arg(&image)
        .arg(&mnt)
        .spawn()
        .unwrap();
    let t0 = std::time::Instant::now();
    while mount_at(&mnt).is_none() {
        assert!(t0.elapsed().as_secs() < 10, "mount did not appear");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    commit(&mnt);
    let before = used(&mnt);
    let mut f = open_tmpfile(&mnt, 0);
    f.write_all(&vec![3u8; 16 << 20]).unwrap();
    f.sync_all().unwrap();
    let _ = server.kill();
    let _ = server.wait();
    drop(f);
    let _ = Command::new("umount").arg("-l").arg(&mnt).status();
    assert_btrfs_check(&image, "killed with an unnamed file open");
    let m = OleoMount::mount_rw(Path::new(OLEO), &image, &mnt, &[]).unwrap();
    commit(m.path());
    assert!(
        used(m.path()) < before + (4 << 20),
        "the unnamed file was not deleted at mount"
    );
    assert_eq!(std::fs::read_dir(m.path()).unwrap().count(), 0);
    m.unmount().unwrap();
    assert_btrfs_check(&image, "after the next mount");
}

/// Writes, truncates and O_TRUNC opens by a caller without CAP_FSETID drop setuid, and
/// setgid where the group may execute (oleo does it: the kernel then stops asking for
/// security.capability before every write); root keeps them. Compared with the host's
/// own filesystem doing the same.
#[test]
fn unprivileged_writes_drop_setuid_as_the_kernel_does() {
    let name = "posix_killpriv";
    if !require_fuse_mount(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let m = fresh_mount(&dir);
    let host = dir.subdir("host").unwrap();
    use std::os::unix::fs::PermissionsExt;
    // nobody must reach both directories.
    let mut p = Some(dir.path());
    while let Some(d) =
        p.filter(|d| d.starts_with(std::env::temp_dir()) && *d != std::env::temp_dir())
    {
        let mode = std::fs::metadata(d).unwrap().mode() | 0o711;
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(mode)).unwrap();
        p = d.parent();
    }
    use std::os::unix::process::CommandExt;
    let nobody = |script: &str, cwd: &Path| {
        let st = Command::new("sh")
            .args(["-c", script])
            .current_dir(cwd)
            .uid(65534)
            .gid(65534)
            .status()
            .unwrap();
        assert!(st.success(), "{script} as nobody in {}", cwd.display());
    };
    let modes = |at: &Path| {
        let mut v = Vec::new();
        for (f, mode) in [
            ("write", 0o6777),
            ("truncate", 0o6777),
            ("otrunc", 0o6777),
            ("sgid-no-exec", 0o2767),
            ("root-writes", 0o6777),
        ] {
            let p = at.join(f);
            std::fs::write(&p, b"0123456789").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
        }
        std::fs::set_permissions(at, std::fs::Permissions::from_mode(0o777)).unwrap();
        nobody(
            "echo more >> write && truncate -s 3 truncate && : > otrunc && echo x >> sgid-no-exec",
            at,
        );
        let st = Command::new("sh")
            .args(["-c", "echo more >> root-writes"])
            .current_dir(at)
            .status()
            .unwrap();
        assert!(st.success());
        for f in ["write", "truncate", "otrunc", "sgid-no-exec", "root-writes"] {
            let md = std::fs::metadata(at.join(f)).unwrap();
            v.push((f, md.mode() & 0o7777, md.len()));
        }
        v
    };
    let want = modes(&host);
    assert_eq!(
        want[0].1, 0o777,
        "the host drops setuid and setgid on a write"
    );
    assert_eq!(modes(m.path()), want, "oleo against the host's filesystem");
}

/// chattr: sets or clears FS_APPEND_FL (0x20) or FS_IMMUTABLE_FL (0x10).
fn set_inode_flag(p: &Path, flag: libc::c_long, on: bool) {
    const FS_IOC_GETFLAGS: libc::c_ulong = 0x8008_6601;
    const FS_IOC_SETFLAGS: libc::c_ulong = 0x4008_6602;
    let f = std::fs::File::open(p).unwrap();
    let mut v: libc::c_long = 0;
    use std::os::fd::AsRawFd;
    // SAFETY: an open descriptor and a long to read and write.
    unsafe {
        assert_eq!(libc::ioctl(f.as_raw_fd(), FS_IOC_GETFLAGS as _, &mut v), 0);
        v = if on { v | flag } else { v & !flag };
        assert_eq!(libc::ioctl(f.as_raw_fd(), FS_IOC_SETFLAGS as _, &v), 0);
    }
}

/// Access and modification times for utimensat(2), (seconds, nanoseconds) each; None
/// passes NULL.
type Times = Option<[(i64, i64); 2]>;

/// utimensat(2) with `times`; 0 or the errno.
fn utimensat(p: &Path, times: Times) -> i32 {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    let ts = times.map(|t| {
        t.map(|(s, n)| libc::timespec {
            tv_sec: s,
            tv_nsec: n,
        })
    });
    let ptr = ts.as_ref().map_or(std::ptr::null(), |t| t.as_ptr());
    // SAFETY: a NUL-terminated path and NULL or two timespecs.
    if unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), ptr, 0) } == 0 {
        0
    } else {
        std::io::Error::last_os_error().raw_os_error().unwrap()
    }
}

/// notify_change's rule: on an append-only inode times may be touched (utimes(NULL), both
/// UTIME_NOW) but not set (any other utimensat); an immutable one refuses both. Appending
/// still moves the times. FUSE leaves this to the server; kernel btrfs is the reference.
#[test]
fn explicit_times_are_refused_on_append_only_and_immutable_inodes() {
    let name = "posix_append_times";
    if !require_fuse_mount(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let m = fresh_mount(&dir);
    let kimage = dir.join("kimage");
    image::empty_image(&kimage, 256, &[]).expect("mkfs.btrfs");
    let k = KernelMount::mount(&kimage, &dir.join("kmnt"), &["rw"]).expect("kernel mount");
    const OMIT: i64 = libc::UTIME_OMIT;
    const NOW: i64 = libc::UTIME_NOW;
    let cases: [(&str, Times); 7] = [
        ("NULL", None),
        ("now,now", Some([(0, NOW), (0, NOW)])),
        ("epoch,epoch", Some([(0, 0), (0, 0)])),
        ("omit,epoch", Some([(0, OMIT), (100, 5)])),
        ("epoch,omit", Some([(100, 5), (0, OMIT)])),
        ("now,omit", Some([(0, NOW), (0, OMIT)])),
        ("now,epoch", Some([(0, NOW), (100, 5)])),
    ];
    let run = |root: &Path| {
        let mut out = Vec::new();
        for (kind, flag) in [("append", 0x20), ("immutable", 0x10)] {
            let f = root.join(format!("{kind}.f"));
            let d = root.join(format!("{kind}.d"));
            std::fs::write(&f, b"data").unwrap();
            std::fs::create_dir(&d).unwrap();
            for p in [&f, &d] {
                set_inode_flag(p, flag, true);
                for (what, t) in &cases {
                    out.push((s(p, root), *what, utimensat(p, *t)));
                }
            }
            if kind == "append" {
                // Appending moves mtime, and its write-back of the times is no utimensat.
                let before = std::fs::metadata(&f).unwrap().mtime_nsec();
                std::thread::sleep(std::time::Duration::from_millis(20));
                let mut h = std::fs::OpenOptions::new().append(true).open(&f).unwrap();
                use std::io::Write;
                h.write_all(b" more").unwrap();
                h.sync_all().unwrap();
                drop(h);
                let md = std::fs::metadata(&f).unwrap();
                out.push((s(&f, root), "append", i32::from(md.mtime_nsec() == before)));
                out.push((s(&f, root), "size", md.len() as i32));
            }
            set_inode_flag(&f, flag, false);
            set_inode_flag(&d, flag, false);
        }
        out
    };
    let want = run(k.path());
    assert!(want.contains(&("append.f".into(), "epoch,epoch", libc::EPERM)));
    assert_eq!(run(m.path()), want, "oleo against kernel btrfs");
    k.unmount().unwrap();
}

fn s(p: &Path, root: &Path) -> String {
    p.strip_prefix(root).unwrap().to_string_lossy().into_owned()
}

/// statfs(2) of a mount: (blocks, free, available) in `bsize` units, and bsize.
fn statfs(p: &Path) -> (u64, u64, u64, u64) {
    let c = CString::new(p.as_os_str().as_bytes()).unwrap();
    // SAFETY: a NUL-terminated path and a zeroed struct for statfs to fill.
    unsafe {
        let mut s: libc::statfs = std::mem::zeroed();
        assert_eq!(libc::statfs(c.as_ptr(), &mut s), 0);
        (
            s.f_blocks as u64,
            s.f_bfree as u64,
            s.f_bavail as u64,
            s.f_bsize as u64,
        )
    }
}

/// statfs counts as kernel btrfs does (btrfs_statfs): free space less the global block
/// reserve, available space less the first MiB of the device that no chunk ever takes.
/// So a fallocate of what statfs calls available succeeds (fstests generic/103).
#[test]
fn statfs_counts_free_space_as_kernel_btrfs() {
    let name = "posix_statfs";
    if !require_fuse_mount(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    for (size, args) in [(2048, &[][..]), (1024, &["--nodesize", "4096"][..])] {
        let image = dir.join("image");
        image::empty_image(&image, size, args).expect("mkfs.btrfs");
        let k = KernelMount::mount(&image, &dir.join("kmnt"), &["rw"]).expect("kernel mount");
        for i in 0..64 {
            std::fs::write(k.path().join(format!("f{i}")), vec![i as u8; 3000]).unwrap();
        }
        std::fs::write(k.path().join("big"), vec![7u8; 40 << 20]).unwrap();
        k.sync().unwrap();
        let want = statfs(k.path());
        k.unmount().unwrap();
        let o = OleoMount::mount(Path::new(OLEO), &image, &dir.join("omnt"), &[]).unwrap();
        assert_eq!(
            statfs(o.path()),
            want,
            "{args:?}: oleo against kernel btrfs"
        );
        o.unmount().unwrap();
    }
    // Available space can be taken whole, but for a little room for the metadata.
    let dir = TempDir::new(&format!("{name}-falloc")).unwrap();
    let m = fresh_mount(&dir);
    for i in 0..64 {
        std::fs::write(m.path().join(format!("f{i}")), b"").unwrap();
    }
    let (_, _, avail, bsize) = statfs(m.path());
    let f = std::fs::File::create(m.path().join("spc")).unwrap();
    use std::os::fd::AsRawFd;
    let len = (avail * bsize - (512 << 10)) as i64;
    // SAFETY: an open descriptor.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, len) };
    assert_eq!(
        r,
        0,
        "fallocate of {len} bytes of {} available: {}",
        avail * bsize,
        std::io::Error::last_os_error()
    );
}

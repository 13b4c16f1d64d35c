//! One test per promise oleo makes the kernel at FUSE INIT and in its replies (the list is
//! the doc comment of `init_flags` in crates/fuse/src/ops.rs). Each checks the result
//! through the mount, and again after unmounting (which waits for the final commit): by a
//! fresh oleo mount and by a kernel mount of the same image, after a clean
//! `btrfs check --readonly --check-data-csum`. A check made only while mounted can be
//! answered by the kernel's caches and miss what reached the disk (O_TRUNC once showed
//! 3 bytes through the mount while the image kept 8192).
//!
//! Where the rule is the VFS's (setuid, ACLs, umask), the same steps run on a kernel btrfs
//! loop mount and must give the same result.

use oleo_testkit::ops::{cpath, pattern, xattr_value, Rng};
use oleo_testkit::syscalls::{acl_text, as_user, fnv, USER};
use oleo_testkit::*;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Debug;
use std::fs::{File, Metadata, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");

type View<T> = BTreeMap<String, T>;

/// An empty btrfs image mounted read-write by oleo.
struct Fs {
    // Dropped before `dir`: unmounts first.
    mount: Option<OleoMount>,
    image: PathBuf,
    name: String,
    dir: TempDir,
}

impl Fs {
    fn new(name: &str) -> Fs {
        let dir = TempDir::new(&format!("promise-{name}")).unwrap();
        let image = dir.join("image");
        image::empty_image(&image, 512, &[]).expect("mkfs.btrfs");
        let mount = OleoMount::mount_rw(Path::new(OLEO), &image, &dir.join("mnt"), &[])
            .expect("oleo mount");
        Fs {
            mount: Some(mount),
            image,
            name: name.to_string(),
            dir,
        }
    }

    fn root(&self) -> &Path {
        self.mount.as_ref().expect("mounted").path()
    }

    fn p(&self, rel: &str) -> PathBuf {
        self.root().join(rel)
    }

    /// A kernel btrfs mount of a second, empty image: the reference for VFS rules.
    fn kernel_reference(&self) -> KernelMount {
        let image = self.dir.join("kimage");
        image::empty_image(&image, 256, &[]).expect("mkfs.btrfs");
        KernelMount::mount(&image, &self.dir.join("kref"), &["rw"]).expect("kernel mount")
    }

    /// Observes the tree live, unmounts, checks the image, and observes it again through a
    /// fresh oleo mount and through the kernel: all three must agree. Returns the live view.
    fn settle<T: PartialEq + Debug>(mut self, observe: impl Fn(&Path) -> View<T>) -> View<T> {
        let m = self.mount.take().expect("mounted");
        let live = observe(m.path());
        m.unmount().expect("unmount");
        let name = &self.name;
        assert_btrfs_check(&self.image, &format!("{name}: oleo's unmount"));
        let o = OleoMount::mount(Path::new(OLEO), &self.image, &self.dir.join("again"), &[])
            .expect("oleo remount");
        same(
            &format!("{name}: live, then through a fresh oleo mount"),
            &live,
            &observe(o.path()),
        );
        o.unmount().expect("unmount the remount");
        let k = KernelMount::mount(&self.image, &self.dir.join("kernel"), &["ro"])
            .expect("kernel mount");
        same(
            &format!("{name}: live, then through the kernel"),
            &live,
            &observe(k.path()),
        );
        k.unmount().expect("kernel unmount");
        live
    }
}

/// Asserts two views are equal, naming each entry that differs.
fn same<T: PartialEq + Debug>(what: &str, want: &View<T>, got: &View<T>) {
    let keys: BTreeSet<&String> = want.keys().chain(got.keys()).collect();
    let diffs: Vec<String> = keys
        .into_iter()
        .filter(|k| want.get(*k) != got.get(*k))
        .map(|k| format!("  {k}: {:?}\n    vs {:?}", want.get(k), got.get(k)))
        .collect();
    assert!(diffs.is_empty(), "{what}:\n{}", diffs.join("\n"));
}

/// What stat says of an inode, less what each filesystem picks itself (inode, blocks).
#[derive(Debug, PartialEq, Clone)]
struct St {
    mode: u32,
    size: u64,
    nlink: u64,
    uid: u32,
    gid: u32,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl St {
    fn of(m: &Metadata) -> St {
        St {
            mode: m.mode(),
            size: m.size(),
            nlink: m.nlink(),
            uid: m.uid(),
            gid: m.gid(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

fn lstat(p: &Path) -> Metadata {
    std::fs::symlink_metadata(p).unwrap_or_else(|e| panic!("lstat {}: {e}", p.display()))
}

fn st(p: &Path) -> St {
    St::of(&lstat(p))
}

/// Length and hash of a file's data.
fn digest(p: &Path) -> (usize, u64) {
    let d = std::fs::read(p).unwrap_or_else(|e| panic!("read {}: {e}", p.display()));
    (d.len(), fnv(&d))
}

fn errno(e: std::io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

fn last_errno() -> i32 {
    errno(std::io::Error::last_os_error())
}

fn s(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}

/// Runs a command, which must succeed; returns its stdout.
fn run(prog: &str, args: &[&str]) -> String {
    let out = Command::new(prog).args(args).output().expect(prog);
    assert!(
        out.status.success(),
        "{prog} {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn write_file(p: &Path, data: &[u8]) {
    std::fs::write(p, data).unwrap_or_else(|e| panic!("write {}: {e}", p.display()));
}

fn chmod(p: &Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
}

/// A buffer aligned for O_DIRECT.
struct Aligned {
    buf: Vec<u8>,
    at: usize,
    len: usize,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let buf = vec![0u8; len + 4096];
        let at = buf.as_ptr().align_offset(4096);
        Aligned { buf, at, len }
    }

    fn of(data: &[u8]) -> Aligned {
        let mut a = Aligned::new(data.len());
        a.as_mut().copy_from_slice(data);
        a
    }

    fn as_ref(&self) -> &[u8] {
        &self.buf[self.at..self.at + self.len]
    }

    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.buf[self.at..self.at + self.len]
    }
}

fn open_direct(p: &Path, write: bool, create: bool) -> File {
    OpenOptions::new()
        .read(true)
        .write(write)
        .create(create)
        .custom_flags(libc::O_DIRECT)
        .open(p)
        .unwrap_or_else(|e| panic!("O_DIRECT open {}: {e}", p.display()))
}

/// The whole file, read with O_DIRECT (bypassing the page cache: what the server has).
fn read_direct(p: &Path) -> Vec<u8> {
    let f = open_direct(p, false, false);
    let len = f.metadata().unwrap().len() as usize;
    let mut a = Aligned::new(len.div_ceil(4096) * 4096);
    let mut got = 0;
    while got < len {
        let n = f.read_at(&mut a.as_mut()[got..], got as u64).unwrap();
        if n == 0 {
            break;
        }
        got += n;
    }
    a.as_ref()[..got].to_vec()
}

/// The chattr flags both kinds of mount must keep (FS_IOC_GETFLAGS).
fn inode_flags(p: &Path) -> i64 {
    const FS_IOC_GETFLAGS: libc::c_ulong = 0x8008_6601;
    const KEPT: i64 = 0x10 | 0x20 | 0x0080_0000; // immutable, append, nocow
    let f = File::open(p).unwrap();
    let mut v: libc::c_long = 0;
    // SAFETY: an open descriptor and a long to write to.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_GETFLAGS as _, &mut v) };
    assert_eq!(r, 0, "FS_IOC_GETFLAGS {}: {}", p.display(), last_errno());
    v as i64 & KEPT
}

/// chattr +d, or -d where set (FS_IOC_SETFLAGS: a ctime change made by the server).
fn toggle_nodump(p: &Path) {
    const FS_IOC_GETFLAGS: libc::c_ulong = 0x8008_6601;
    const FS_IOC_SETFLAGS: libc::c_ulong = 0x4008_6602;
    let f = File::open(p).unwrap();
    let mut v: libc::c_long = 0;
    // SAFETY: an open descriptor and a long to read and write.
    unsafe {
        assert_eq!(libc::ioctl(f.as_raw_fd(), FS_IOC_GETFLAGS as _, &mut v), 0);
        v ^= 0x40;
        assert_eq!(libc::ioctl(f.as_raw_fd(), FS_IOC_SETFLAGS as _, &v), 0);
    }
}

/// `open(2)` with raw flags; the errno on failure.
fn open_raw(p: &Path, flags: i32) -> Result<File, i32> {
    let c = cpath(p);
    // SAFETY: a NUL-terminated path.
    let fd = unsafe { libc::open(c.as_ptr(), flags | libc::O_CLOEXEC, 0o644) };
    if fd < 0 {
        return Err(last_errno());
    }
    // SAFETY: a descriptor we own.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd) })
}

/// `getfacl` of a path, numeric, no header.
fn getfacl(p: &Path) -> String {
    run("getfacl", &["-c", "-n", "-p", &s(p)])
}

/// The POSIX ACL xattrs of a path (access, default), as getfacl would print them short.
fn acls(p: &Path) -> (String, String) {
    let text = |n: &[u8]| xattr_value(p, n).map(|v| acl_text(&v)).unwrap_or_default();
    (
        text(b"system.posix_acl_access"),
        text(b"system.posix_acl_default"),
    )
}

/// Every path under `top` with its type and, for files, data digest; symlinks' targets.
fn tree(top: &Path) -> View<String> {
    let mut out = View::new();
    let mut todo = vec![top.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let p = e.expect("entry").path();
            let rel = s(p.strip_prefix(top).unwrap());
            let m = lstat(&p);
            let what = if m.is_dir() {
                todo.push(p);
                "dir".to_string()
            } else if m.file_type().is_symlink() {
                format!("-> {}", s(&std::fs::read_link(&p).unwrap()))
            } else {
                format!("{:?}", digest(&p))
            };
            out.insert(rel, what);
        }
    }
    out
}

#[test]
fn big_writes_land_whole() {
    let name = "big_writes_land_whole";
    if !require_fuse_mount(name) {
        return;
    }
    let fs = Fs::new(name);
    let mut want = View::new();
    for (file, len, direct) in [
        ("buffered-1m", 1 << 20, false),
        ("buffered-4m", 4 << 20, false),
        ("direct-1m", 1 << 20, true),
        ("direct-4m", 4 << 20, true),
    ] {
        let data = pattern(len as u64 + direct as u64, len);
        let p = fs.p(file);
        // One write(2) each: up to max_write it reaches oleo as one WRITE.
        let n = if direct {
            open_direct(&p, true, true)
                .write_at(Aligned::of(&data).as_ref(), 0)
                .unwrap()
        } else {
            File::create(&p).unwrap().write(&data).unwrap()
        };
        assert_eq!(n, len, "{file}: a short write(2)");
        want.insert(file.to_string(), (len, fnv(&data)));
    }
    // Unaligned, across a 1 MiB boundary, over existing data.
    let patch = pattern(9, (1 << 20) + 3);
    let f = OpenOptions::new()
        .write(true)
        .open(fs.p("buffered-4m"))
        .unwrap();
    assert_eq!(f.write_at(&patch, 777).unwrap(), patch.len());
    drop(f);
    let mut full = pattern((4 << 20) as u64, 4 << 20);
    full[777..777 + patch.len()].copy_from_slice(&patch);
    want.insert("buffered-4m".into(), (full.len(), fnv(&full)));
    for (file, w) in &want {
        let p = fs.p(file);
        assert_eq!(&digest(&p), w, "{file} read through the page cache");
        let d = read_direct(&p);
        assert_eq!(&(d.len(), fnv(&d)), w, "{file} read with O_DIRECT");
    }
    let got = fs.settle(|root| {
        want.keys()
            .map(|f| (f.clone(), digest(&root.join(f))))
            .collect()
    });
    same("what was written", &want, &got);
}

#[test]
fn o_trunc_truncates_on_disk() {
    let name = "o_trunc_truncates_on_disk";
    if !require_fuse_mount(name) {
        return;
    }
    let fs = Fs::new(name);
    let p = |f: &str| fs.p(f);

    // Shell redirection over an 8 KiB file (the bug: 3 bytes live, 8192 on disk).
    write_file(&p("shell"), &pattern(1, 8192));
    run("sh", &["-c", &format!("echo hi > '{}'", s(&p("shell")))]);
    assert_eq!(std::fs::read(p("shell")).unwrap(), b"hi\n");

    // Python's open(path, "w"): O_WRONLY|O_CREAT|O_TRUNC.
    write_file(&p("python"), &pattern(2, 300_000));
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(p("python"))
        .unwrap();
    f.write_all(b"py").unwrap();
    drop(f);

    // cp of a small file over a larger one.
    write_file(&p("small"), b"small file\n");
    write_file(&p("cp"), &pattern(3, 100_000));
    run("cp", &[&s(&p("small")), &s(&p("cp"))]);

    write_file(&p("truncate"), &pattern(4, 20_000));
    run("truncate", &["-s", "0", &s(&p("truncate"))]);

    // Empty, with space allocated past EOF: O_TRUNC frees it, as do_truncate does on btrfs.
    let f = File::create(p("falloc")).unwrap();
    // SAFETY: an open descriptor.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), libc::FALLOC_FL_KEEP_SIZE, 0, 1 << 20) };
    assert_eq!(r, 0, "fallocate: {}", last_errno());
    drop(f);
    assert!(lstat(&p("falloc")).blocks() > 0, "KEEP_SIZE allocates");
    drop(open_raw(&p("falloc"), libc::O_RDWR | libc::O_TRUNC).unwrap());
    assert_eq!(
        lstat(&p("falloc")).blocks(),
        0,
        "O_TRUNC frees blocks past EOF"
    );

    // NOCOW: the flag stays, the data goes.
    File::create(p("nocow")).unwrap();
    run("chattr", &["+C", &s(&p("nocow"))]);
    let f = OpenOptions::new().write(true).open(p("nocow")).unwrap();
    f.write_all_at(&pattern(5, 65536), 0).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let mut f = open_raw(&p("nocow"), libc::O_WRONLY | libc::O_TRUNC).unwrap();
    f.write_all(b"n").unwrap();
    drop(f);

    // Times: O_TRUNC stamps mtime and ctime, even with nothing written after.
    let old = [libc::timespec {
        tv_sec: 1_000_000_000,
        tv_nsec: 0,
    }; 2];
    for (file, pause) in [("times", 20), ("times-at-once", 0)] {
        write_file(&p(file), &pattern(6, 5000));
        let c = cpath(&p(file));
        // SAFETY: a NUL-terminated path and two timespecs.
        assert_eq!(
            unsafe { libc::utimensat(libc::AT_FDCWD, c.as_ptr(), old.as_ptr(), 0) },
            0
        );
        // Without a pause the stat just made has the kernel stamp the open finer
        // (multigrain timestamps) than oleo's coarse clock does.
        let before = st(&p(file));
        std::thread::sleep(std::time::Duration::from_millis(pause));
        drop(open_raw(&p(file), libc::O_WRONLY | libc::O_TRUNC).unwrap());
        let after = st(&p(file));
        assert_eq!(after.size, 0);
        assert!(
            after.mtime > before.mtime,
            "{file}: mtime {before:?} then {after:?}"
        );
        if pause > 0 {
            assert!(
                after.ctime > before.ctime,
                "{file}: ctime {before:?} then {after:?}"
            );
        }
    }

    // A burst of rewrites, as a build does: some opens fall in a tick where the kernel's
    // time is finer than oleo's, and the kernel's is the one stat shows.
    for i in 0..20 {
        let f = p(&format!("burst{i:02}"));
        write_file(&f, &pattern(i, 8192));
        lstat(&f);
        write_file(&f, b"x");
    }

    // Immutable and append-only files refuse O_TRUNC, whatever the access mode.
    for (file, flag) in [("immutable", "+i"), ("append", "+a")] {
        write_file(&p(file), b"kept\n");
        run("chattr", &[flag, &s(&p(file))]);
        for flags in [
            libc::O_WRONLY | libc::O_TRUNC,
            libc::O_RDONLY | libc::O_TRUNC,
            libc::O_WRONLY | libc::O_APPEND | libc::O_TRUNC,
        ] {
            assert_eq!(
                open_raw(&p(file), flags).err(),
                Some(libc::EPERM),
                "{file}: open flags {flags:#o}"
            );
        }
        assert_eq!(std::fs::read(p(file)).unwrap(), b"kept\n");
    }

    // A user's O_TRUNC drops setuid/setgid (group-executable), shown by stat at once;
    // root's (CAP_FSETID) keeps them.
    for file in ["suid-user", "suid-root"] {
        write_file(&p(file), &pattern(7, 5000));
        chmod(&p(file), 0o6777);
    }
    let user_path = p("suid-user");
    let (fmode, smode) = as_user(|| {
        let f = open_raw(&user_path, libc::O_WRONLY | libc::O_TRUNC).expect("user O_TRUNC");
        (f.metadata().unwrap().mode(), lstat(&user_path).mode())
    });
    assert_eq!(
        (fmode & 0o7777, smode & 0o7777),
        (0o777, 0o777),
        "user O_TRUNC"
    );
    drop(open_raw(&p("suid-root"), libc::O_WRONLY | libc::O_TRUNC).unwrap());
    assert_eq!(
        lstat(&p("suid-root")).mode() & 0o7777,
        0o6777,
        "root O_TRUNC"
    );

    let want: View<&[u8]> = [
        ("shell", &b"hi\n"[..]),
        ("python", b"py"),
        ("cp", b"small file\n"),
        ("truncate", b""),
        ("falloc", b""),
        ("nocow", b"n"),
        ("times", b""),
        ("times-at-once", b""),
        ("immutable", b"kept\n"),
        ("append", b"kept\n"),
        ("suid-user", b""),
        ("suid-root", b""),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .chain((0..20).map(|i| (format!("burst{i:02}"), &b"x"[..])))
    .collect();
    // Live first: what the kernel's caches say.
    for (f, data) in &want {
        assert_eq!(&std::fs::read(p(f)).unwrap(), data, "{f} through the mount");
        assert_eq!(st(&p(f)).size, data.len() as u64, "{f}: size");
    }
    let falloc_blocks = |root: &Path| lstat(&root.join("falloc")).blocks();
    let observe = |root: &Path| -> View<(St, Vec<u8>, i64, u64)> {
        want.keys()
            .map(|f| {
                let q = root.join(f);
                let blocks = if f == "falloc" {
                    falloc_blocks(root)
                } else {
                    0
                };
                (
                    f.clone(),
                    (st(&q), std::fs::read(&q).unwrap(), inode_flags(&q), blocks),
                )
            })
            .collect()
    };
    let got = fs.settle(observe);
    assert_eq!(got["nocow"].2, 0x0080_0000, "NOCOW kept");
    assert_eq!(got["immutable"].2, 0x10);
    assert_eq!(got["append"].2, 0x20);
    assert_eq!(got["suid-user"].0.mode & 0o7777, 0o777);
}

/// `ls -ln` of a directory: name -> the rest of its line (mode, links, owner, size, mtime).
fn ls(dir: &Path) -> View<String> {
    run("ls", &["-ln", "--time-style=+%s.%N", &s(dir)])
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert!(f.len() == 7, "ls line {l:?}");
            (f[6].to_string(), f[..6].join(" "))
        })
        .collect()
}

/// The `ls -l` mode column of a regular file.
fn ls_mode(mode: u32) -> String {
    let bit = |b: u32, c: char| if mode & b != 0 { c } else { '-' };
    let special = |x: u32, s: u32, on: char| match (mode & x != 0, mode & s != 0) {
        (true, true) => on,
        (false, true) => on.to_ascii_uppercase(),
        (x, false) => {
            if x {
                'x'
            } else {
                '-'
            }
        }
    };
    [
        '-',
        bit(0o400, 'r'),
        bit(0o200, 'w'),
        special(0o100, 0o4000, 's'),
        bit(0o40, 'r'),
        bit(0o20, 'w'),
        special(0o10, 0o2000, 's'),
        bit(0o4, 'r'),
        bit(0o2, 'w'),
        special(0o1, 0o1000, 't'),
    ]
    .iter()
    .collect()
}

#[test]
fn readdirplus_attributes_are_current() {
    let name = "readdirplus_attributes_are_current";
    if !require_fuse_mount(name) {
        return;
    }
    let fs = Fs::new(name);
    let d = fs.p("d");
    std::fs::create_dir(&d).unwrap();
    let mut want: View<(u32, u64)> = View::new();
    for i in 0..300u64 {
        let f = format!("f{i:03}");
        write_file(&d.join(&f), &pattern(i, (i * 37) as usize));
        want.insert(f, (0o644, i * 37));
    }
    let check = |want: &View<(u32, u64)>, when: &str| {
        let listed = ls(&d);
        let shown: View<(String, String)> = listed
            .iter()
            .map(|(n, l)| {
                let f: Vec<&str> = l.split(' ').collect();
                (n.clone(), (f[0].to_string(), f[4].to_string()))
            })
            .collect();
        let expected: View<(String, String)> = want
            .iter()
            .map(|(n, (m, sz))| (n.clone(), (ls_mode(*m), sz.to_string())))
            .collect();
        same(&format!("ls -l {when}"), &expected, &shown);
    };
    check(&want, "at first");
    check(&want, "again (from the caches)");

    // Changes of every kind the kernel learns in a different way.
    std::fs::OpenOptions::new()
        .write(true)
        .open(d.join("f003"))
        .unwrap()
        .set_len(99_999)
        .unwrap();
    want.insert("f003".into(), (0o644, 99_999));
    chmod(&d.join("f005"), 0o600);
    want.insert("f005".into(), (0o600, 5 * 37));
    // Dirty in the page cache, still open: the kernel's size, not ours, is current.
    let mut open = OpenOptions::new()
        .append(true)
        .open(d.join("f007"))
        .unwrap();
    open.write_all(&[7u8; 5000]).unwrap();
    want.insert("f007".into(), (0o644, 7 * 37 + 5000));
    write_file(&d.join("new"), b"new");
    want.insert("new".into(), (0o644, 3));
    std::fs::remove_file(d.join("f009")).unwrap();
    want.remove("f009");
    std::fs::rename(d.join("f011"), d.join("renamed")).unwrap();
    want.remove("f011");
    want.insert("renamed".into(), (0o644, 11 * 37));
    drop(open_raw(&d.join("f013"), libc::O_WRONLY | libc::O_TRUNC).unwrap());
    want.insert("f013".into(), (0o644, 0));
    // A mode the server changes by itself (setuid dropped on a user's write).
    chmod(&d.join("f015"), 0o6777);
    let f015 = d.join("f015");
    as_user(|| {
        let f = OpenOptions::new().write(true).open(&f015).unwrap();
        f.write_all_at(b"u", 0).unwrap();
    });
    want.insert("f015".into(), (0o777, 15 * 37));
    check(&want, "after changes");
    drop(open);
    check(&want, "after close");
    let got = fs.settle(|root| ls(&root.join("d")));
    assert_eq!(got.len(), want.len());
}

#[test]
fn parallel_direct_io() {
    let name = "parallel_direct_io";
    if !require_fuse_mount(name) {
        return;
    }
    let fs = Fs::new(name);
    const THREADS: usize = 8;
    const CHUNKS: usize = 12;
    const CHUNK: usize = 64 << 10;
    let p = fs.p("shared");
    let file = Arc::new(open_direct(&p, true, true));
    let mut model = vec![0u8; THREADS * CHUNKS * CHUNK];
    // Round 0 extends the file from every thread at once; round 1 overwrites in place.
    for round in 0..2u64 {
        let barrier = Arc::new(std::sync::Barrier::new(THREADS));
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let (file, barrier) = (Arc::clone(&file), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    barrier.wait();
                    for k in 0..CHUNKS {
                        let at = (k * THREADS + t) * CHUNK;
                        let seed = round * 1000 + at as u64;
                        let buf = Aligned::of(&pattern(seed, CHUNK));
                        assert_eq!(file.write_at(buf.as_ref(), at as u64).unwrap(), CHUNK);
                    }
                })
            })
            .collect();
        for h in handles {
            h.join().expect("writer");
        }
        for t in 0..THREADS {
            for k in 0..CHUNKS {
                let at = (k * THREADS + t) * CHUNK;
                model[at..at + CHUNK].copy_from_slice(&pattern(round * 1000 + at as u64, CHUNK));
            }
        }
        assert!(read_direct(&p) == model, "round {round}: O_DIRECT read");
        assert!(
            std::fs::read(&p).unwrap() == model,
            "round {round}: buffered read"
        );
    }
    drop(file);
    let want = (model.len(), fnv(&model));
    let got = fs.settle(|root| [("shared".to_string(), digest(&root.join("shared")))].into());
    assert_eq!(got["shared"], want);
}

#[test]
fn symlinks_cached() {
    let name = "symlinks_cached";
    if !require_fuse_mount(name) {
        return;
    }
    let fs = Fs::new(name);
    let target = |len: usize, c: u8| -> String {
        (0..len)
            .map(|i| {
                if i % 50 == 49 {
                    '/'
                } else {
                    (c + (i % 26) as u8) as char
                }
            })
            .collect()
    };
    let mut want = View::new();
    for len in [1, 60, 255, 256, 1024, 2048, 4000, 4095] {
        let (l, t) = (format!("l{len}"), target(len, b'a'));
        std::os::unix::fs::symlink(&t, fs.p(&l))
            .unwrap_or_else(|e| panic!("symlink with a {len}-byte target: {e}"));
        want.insert(l, t);
    }
    // PATH_MAX counts the NUL: 4096 bytes is too long, as on any Linux filesystem.
    let e = std::os::unix::fs::symlink(target(4096, b'a'), fs.p("l4096")).unwrap_err();
    assert_eq!(errno(e), libc::ENAMETOOLONG);
    let read = |root: &Path, want: &View<String>| -> View<String> {
        want.keys()
            .map(|l| {
                let t = s(&std::fs::read_link(root.join(l)).unwrap());
                assert_eq!(lstat(&root.join(l)).size(), t.len() as u64, "{l}: size");
                (l.clone(), t)
            })
            .collect()
    };
    same("readlink", &want, &read(fs.root(), &want));
    same("readlink again (cached)", &want, &read(fs.root(), &want));
    // A name that gets a new link: the cached target is the old inode's, not the name's.
    let t = target(3000, b'A');
    std::os::unix::fs::symlink(&t, fs.p("tmp")).unwrap();
    std::fs::rename(fs.p("tmp"), fs.p("l60")).unwrap();
    want.insert("l60".into(), t);
    same(
        "readlink after a rename over",
        &want,
        &read(fs.root(), &want),
    );
    let got = fs.settle(|root| read(root, &want));
    same("after remount", &want, &got);
}

/// ACL steps run on a mount; what each left (mode and getfacl).
fn acl_steps(root: &Path) -> View<(u32, String)> {
    let p = |f: &str| root.join(f);
    let files = ["named", "equiv", "removed", "chmod"];
    for f in files {
        write_file(&p(f), b"x");
    }
    chmod(&p("named"), 0o640);
    chmod(&p("equiv"), 0o644);
    chmod(&p("removed"), 0o600);
    chmod(&p("chmod"), 0o750);
    let setfacl = |args: &[&str], f: &str| {
        let mut a = args.to_vec();
        let path = s(&p(f));
        a.push(&path);
        run("setfacl", &a);
    };
    let mut seen = View::new();
    let mut look = |when: &str, f: &str| {
        seen.insert(format!("{f} {when}"), (lstat(&p(f)).mode(), getfacl(&p(f))));
    };
    // A named entry: the group bits become the mask.
    setfacl(&["-m", "u:1000:rw"], "named");
    look("setfacl", "named");
    chmod(&p("named"), 0o604);
    look("chmod", "named");
    // Only the three base entries: the mode alone says it, no xattr is kept.
    setfacl(&["-m", "g::rwx"], "equiv");
    look("setfacl", "equiv");
    setfacl(&["-m", "u:1000:r,m::r"], "removed");
    look("setfacl", "removed");
    setfacl(&["-b"], "removed");
    look("setfacl -b", "removed");
    setfacl(&["-m", "g:1000:rwx,o::r"], "chmod");
    look("setfacl", "chmod");
    chmod(&p("chmod"), 0o700);
    look("chmod", "chmod");
    std::fs::create_dir(p("dir")).unwrap();
    setfacl(&["-d", "-m", "u:1000:rwx"], "dir");
    setfacl(&["-m", "u:1000:rx"], "dir");
    look("setfacl", "dir");
    chmod(&p("dir"), 0o700);
    look("chmod", "dir");
    seen
}

#[test]
fn acl_mode_in_step() {
    let name = "acl_mode_in_step";
    if !require_fuse_mount(name) {
        return;
    }
    let fs = Fs::new(name);
    let k = fs.kernel_reference();
    same(
        "ACL steps, kernel btrfs against oleo",
        &acl_steps(k.path()),
        &acl_steps(fs.root()),
    );
    drop(k);
    let got = fs.settle(|root| {
        ["named", "equiv", "removed", "chmod", "dir"]
            .into_iter()
            .map(|f| {
                let p = root.join(f);
                (f.to_string(), (lstat(&p).mode(), getfacl(&p), acls(&p)))
            })
            .collect()
    });
    assert_eq!(got["named"].0 & 0o777, 0o604);
    assert!(got["named"].1.contains("mask::---"), "{}", got["named"].1);
}

/// Setuid/setgid steps by [`USER`] and root; the mode fstat and stat show right after each.
fn suid_steps(root: &Path) -> View<(u32, u32)> {
    let p = |f: &str| root.join(f);
    for (f, mode) in [
        ("write", 0o6777),
        ("direct", 0o6777),
        ("ftruncate", 0o6777),
        ("otrunc", 0o6777),
        ("sgid-noexec", 0o2666),
        ("suid-only", 0o4777),
        ("root-write", 0o6777),
        ("root-chown", 0o6777),
        ("chown-own", 0o6777),
        ("chown-other", 0o6777),
        ("chown-plain", 0o0777),
    ] {
        write_file(&p(f), &pattern(mode as u64, 8192));
        chmod(&p(f), mode);
    }
    std::os::unix::fs::chown(p("chown-own"), Some(USER.0), Some(USER.1)).unwrap();
    chmod(&p("chown-own"), 0o6777);
    let modes = |f: &File, name: &str| (f.metadata().unwrap().mode(), lstat(&p(name)).mode());
    // chown(-1, -1): the errno (0 when it passes) and the mode left.
    let chown_none = |name: &str| {
        let r = std::os::unix::fs::chown(p(name), None, None);
        (r.err().map_or(0, errno) as u32, lstat(&p(name)).mode())
    };
    let w = |f: &str| OpenOptions::new().write(true).open(p(f)).unwrap();
    // A clock tick between setup and the writes: a time the kernel was not told of shows.
    std::thread::sleep(std::time::Duration::from_millis(10));
    let mut seen: View<(u32, u32)> = as_user(|| {
        let mut seen = View::new();
        let f = w("write");
        f.write_all_at(b"user", 100).unwrap();
        seen.insert("write".into(), modes(&f, "write"));
        let f = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(p("direct"))
            .unwrap();
        let buf = Aligned::of(&pattern(42, 4096));
        assert_eq!(f.write_at(buf.as_ref(), 4096).unwrap(), 4096);
        seen.insert("direct".into(), modes(&f, "direct"));
        let f = w("ftruncate");
        f.set_len(100).unwrap();
        seen.insert("ftruncate".into(), modes(&f, "ftruncate"));
        let f = open_raw(&p("otrunc"), libc::O_WRONLY | libc::O_TRUNC).unwrap();
        seen.insert("otrunc".into(), modes(&f, "otrunc"));
        for f in ["sgid-noexec", "suid-only"] {
            let h = w(f);
            h.write_all_at(b"user", 0).unwrap();
            seen.insert(f.into(), modes(&h, f));
        }
        for f in ["chown-own", "chown-other", "chown-plain"] {
            seen.insert(f.into(), chown_none(f));
        }
        seen
    });
    let f = w("root-write");
    f.write_all_at(b"root", 0).unwrap();
    seen.insert("root-write".into(), modes(&f, "root-write"));
    std::os::unix::fs::chown(p("root-chown"), Some(USER.0), Some(USER.1)).unwrap();
    let f = File::open(p("root-chown")).unwrap();
    seen.insert("root-chown".into(), modes(&f, "root-chown"));
    seen
}

#[test]
fn setuid_dropped() {
    let name = "setuid_dropped";
    if !require_fuse_mount(name) {
        return;
    }
    let fs = Fs::new(name);
    let k = fs.kernel_reference();
    let oleo = suid_steps(fs.root());
    same(
        "setuid steps, kernel btrfs against oleo",
        &suid_steps(k.path()),
        &oleo,
    );
    drop(k);
    for f in ["write", "direct", "ftruncate", "otrunc"] {
        assert_eq!(oleo[f], (0o100777, 0o100777), "{f}: setuid/setgid dropped");
    }
    assert_eq!(
        oleo["root-write"].0 & 0o7777,
        0o6777,
        "CAP_FSETID keeps them"
    );
    // A chown that must drop the bits is a mode change: the owner's only.
    assert_eq!(oleo["chown-own"], (0, 0o100777));
    assert_eq!(oleo["chown-other"], (libc::EPERM as u32, 0o106777));
    assert_eq!(oleo["chown-plain"], (0, 0o100777));
    let live = oleo;
    let got = fs.settle(|root| {
        live.keys()
            .map(|f| {
                let p = root.join(f);
                (f.clone(), (st(&p), digest(&p)))
            })
            .collect()
    });
    for (f, (_, mode)) in &live {
        assert_eq!(got[f].0.mode, *mode, "{f}: the mode shown is the one kept");
    }
}

/// Creates a file, a directory, a fifo and an O_TMPFILE (then linked) in `dir`, on a
/// thread with its own umask.
fn create_all(dir: &Path, umask: u32) {
    let dir = dir.to_path_buf();
    std::thread::spawn(move || {
        // SAFETY: unshare(CLONE_FS) gives this thread its own umask (fs_struct), so the
        // other tests' threads keep theirs; umask cannot fail.
        unsafe {
            assert_eq!(libc::unshare(libc::CLONE_FS), 0, "{}", last_errno());
            libc::umask(umask as libc::mode_t);
        }
        let c = |n: &str| cpath(&dir.join(n));
        // SAFETY: NUL-terminated paths; descriptors closed here.
        unsafe {
            let fd = libc::open(c("file").as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o666);
            assert!(fd >= 0, "create: {}", last_errno());
            libc::close(fd);
            let fd = libc::open(c("exec").as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o777);
            assert!(fd >= 0, "create: {}", last_errno());
            libc::close(fd);
            assert_eq!(libc::mkdir(c("dir").as_ptr(), 0o777), 0, "{}", last_errno());
            assert_eq!(libc::mkdir(c("dir/sub").as_ptr(), 0o750), 0);
            let fd = libc::open(
                c("dir/inner").as_ptr(),
                libc::O_CREAT | libc::O_WRONLY,
                0o666,
            );
            assert!(fd >= 0);
            libc::close(fd);
            assert_eq!(
                libc::mknod(c("fifo").as_ptr(), libc::S_IFIFO | 0o666, 0),
                0,
                "{}",
                last_errno()
            );
            let fd = libc::open(
                cpath(&dir).as_ptr(),
                libc::O_TMPFILE | libc::O_WRONLY,
                0o666,
            );
            assert!(fd >= 0, "O_TMPFILE: {}", last_errno());
            let r = libc::linkat(
                fd,
                c"".as_ptr(),
                libc::AT_FDCWD,
                c("tmpfile").as_ptr(),
                libc::AT_EMPTY_PATH,
            );
            assert_eq!(r, 0, "linkat: {}", last_errno());
            libc::close(fd);
        }
    })
    .join()
    .expect("creating thread");
}

/// Mode and ACLs of every path under `root`.
fn modes_and_acls(root: &Path) -> View<(u32, String, String)> {
    let mut out = View::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() && !p.is_symlink() {
                todo.push(p.clone());
            }
            let (a, d) = acls(&p);
            out.insert(s(p.strip_prefix(root).unwrap()), (lstat(&p).mode(), a, d));
        }
    }
    out
}

fn umask_steps(root: &Path) -> View<(u32, String, String)> {
    for d in ["acl", "plain"] {
        std::fs::create_dir(root.join(d)).unwrap();
        chmod(&root.join(d), 0o755);
    }
    run(
        "setfacl",
        &["-d", "-m", "u::rwx,g::rwx,o::rwx", &s(&root.join("acl"))],
    );
    std::fs::create_dir(root.join("named")).unwrap();
    run(
        "setfacl",
        &["-d", "-m", "u:1000:rx,g::r", &s(&root.join("named"))],
    );
    for d in ["acl", "plain", "named"] {
        create_all(&root.join(d), 0o077);
    }
    modes_and_acls(root)
}

#[test]
fn umask_and_default_acl() {
    let name = "umask_and_default_acl";
    if !require_fuse_mount(name) {
        return;
    }
    let fs = Fs::new(name);
    let k = fs.kernel_reference();
    let oleo = umask_steps(fs.root());
    same(
        "umask 077, kernel btrfs against oleo",
        &umask_steps(k.path()),
        &oleo,
    );
    drop(k);
    assert_eq!(oleo["plain/file"].0, 0o100600, "umask applied");
    assert_eq!(oleo["plain/dir"].0, 0o40700);
    assert_eq!(
        oleo["acl/file"].0, 0o100666,
        "the default ACL replaces the umask"
    );
    assert_eq!(oleo["acl/tmpfile"].0, 0o100666);
    let got = fs.settle(modes_and_acls);
    same("after remount", &oleo, &got);
}

/// Sets an access ACL with a named entry as [`USER`] and as root on setgid files.
fn kill_sgid_steps(root: &Path) -> View<(u32, String)> {
    let p = |f: &str| root.join(f);
    for (f, gid) in [
        ("user-setfacl", 0),
        ("user-setxattr", 0),
        ("user-in-group", USER.1),
        ("root-setfacl", 0),
    ] {
        write_file(&p(f), b"x");
        std::os::unix::fs::chown(p(f), Some(USER.0), Some(gid)).unwrap();
        chmod(&p(f), 0o2775);
    }
    // version 2; user::rwx, user:1000:rwx, group::r-x, mask::rwx, other::r-x
    let mut acl = 2u32.to_le_bytes().to_vec();
    for (tag, perm, id) in [
        (1u16, 7u16, u32::MAX),
        (2, 7, USER.0),
        (4, 5, u32::MAX),
        (0x10, 7, u32::MAX),
        (0x20, 5, u32::MAX),
    ] {
        acl.extend(tag.to_le_bytes());
        acl.extend(perm.to_le_bytes());
        acl.extend(id.to_le_bytes());
    }
    let setfacl = |f: &str| run("setfacl", &["-m", "u:1000:rwx", &s(&p(f))]);
    as_user(|| {
        setfacl("user-setfacl");
        setfacl("user-in-group");
        let c = cpath(&p("user-setxattr"));
        // SAFETY: a NUL-terminated path and name; the value is a valid ACL.
        let r = unsafe {
            libc::setxattr(
                c.as_ptr(),
                c"system.posix_acl_access".as_ptr(),
                acl.as_ptr().cast(),
                acl.len(),
                0,
            )
        };
        assert_eq!(r, 0, "setxattr: {}", last_errno());
    });
    setfacl("root-setfacl");
    [
        "user-setfacl",
        "user-setxattr",
        "user-in-group",
        "root-setfacl",
    ]
    .into_iter()
    .map(|f| (f.to_string(), (lstat(&p(f)).mode(), getfacl(&p(f)))))
    .collect()
}

#[test]
fn acl_kill_sgid() {
    let name = "acl_kill_sgid";
    if !require_fuse_mount(name) {
        return;
    }
    let fs = Fs::new(name);
    let k = fs.kernel_reference();
    let oleo = kill_sgid_steps(fs.root());
    same(
        "ACL_KILL_SGID, kernel btrfs against oleo",
        &kill_sgid_steps(k.path()),
        &oleo,
    );
    drop(k);
    assert_eq!(oleo["user-setfacl"].0 & 0o7777, 0o775, "S_ISGID dropped");
    assert_eq!(oleo["user-setxattr"].0 & 0o7777, 0o775, "S_ISGID dropped");
    assert_eq!(
        oleo["user-in-group"].0 & 0o7777,
        0o2775,
        "in the group: kept"
    );
    assert_eq!(oleo["root-setfacl"].0 & 0o7777, 0o2775, "root: kept");
    let got = fs.settle(|root| {
        oleo.keys()
            .map(|f| {
                let p = root.join(f);
                (f.clone(), (lstat(&p).mode(), getfacl(&p)))
            })
            .collect()
    });
    same("after remount", &oleo, &got);
}

/// stat of every entry of a directory (hard links included).
fn stats(dir: &Path) -> View<St> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let p = e.unwrap().path();
            (s(p.file_name().unwrap().as_ref()), st(&p))
        })
        .collect()
}

#[test]
fn times_survive_remount() {
    let name = "times_survive_remount";
    if !require_fuse_mount(name) {
        return;
    }
    let fs = Fs::new(name);
    let seed = seed(0x71_3e5);
    eprintln!("{name}: seed {seed} (OLEO_TEST_SEED replays it)");
    let mut rng = Rng::new(seed);
    let d = fs.p("t");
    std::fs::create_dir(&d).unwrap();
    const FILES: u64 = 30;
    let path = |i: u64| d.join(format!("f{i:02}"));
    for i in 0..FILES {
        let len = rng.below(20_000) as usize;
        write_file(&path(i), &pattern(i, len));
    }
    // Appenders kept open to the end, their last pages maybe still dirty.
    let mut open: BTreeMap<u64, File> = BTreeMap::new();
    for step in 0..400u64 {
        let i = rng.below(FILES);
        let p = path(i);
        let size = lstat(&p).len();
        match rng.below(10) {
            0 | 1 => {
                let f = OpenOptions::new().write(true).open(&p).unwrap();
                let at = rng.below(size + 4096);
                let len = 1 + rng.below(5000) as usize;
                f.write_all_at(&pattern(step, len), at).unwrap();
            }
            2 => {
                let f = open
                    .entry(i)
                    .or_insert_with(|| OpenOptions::new().append(true).open(&p).unwrap());
                f.write_all(&pattern(step, 1 + rng.below(3000) as usize))
                    .unwrap();
            }
            3 => {
                let f = OpenOptions::new().write(true).open(&p).unwrap();
                f.set_len(rng.below(size * 3 / 2 + 100)).unwrap();
            }
            4 => {
                let c = cpath(&p);
                // SAFETY: a NUL-terminated path.
                let r = unsafe { libc::truncate(c.as_ptr(), rng.below(30_000) as i64) };
                assert_eq!(r, 0);
            }
            5 if size > 0 => {
                let f = OpenOptions::new().read(true).write(true).open(&p).unwrap();
                let at = rng.below(size) as usize;
                let len = (1 + rng.below(3000) as usize).min(size as usize - at);
                // SAFETY: a shared mapping of the file's first `size` bytes, written only
                // inside them, synced and unmapped here.
                unsafe {
                    let m = libc::mmap(
                        std::ptr::null_mut(),
                        size as usize,
                        libc::PROT_READ | libc::PROT_WRITE,
                        libc::MAP_SHARED,
                        f.as_raw_fd(),
                        0,
                    );
                    assert_ne!(m, libc::MAP_FAILED, "mmap: {}", last_errno());
                    let b = std::slice::from_raw_parts_mut(m.cast::<u8>(), size as usize);
                    b[at..at + len].copy_from_slice(&pattern(step, len));
                    let how = if rng.chance(50) {
                        libc::MS_SYNC
                    } else {
                        libc::MS_ASYNC
                    };
                    assert_eq!(libc::msync(m, size as usize, how), 0);
                    libc::munmap(m, size as usize);
                }
            }
            6 => chmod(&p, 0o600 | rng.below(0o200) as u32),
            7 => {
                let l = d.join(format!("f{i:02}.link"));
                if l.exists() {
                    std::fs::remove_file(l).unwrap();
                } else {
                    std::fs::hard_link(&p, l).unwrap();
                }
            }
            // Changes the kernel does not stamp itself: the server's times must still be
            // the ones stat shows.
            8 => {
                let at = rng.below(size / 4096 + 1) * 4096;
                let buf = Aligned::of(&pattern(step, 4096));
                assert_eq!(
                    open_direct(&p, true, false)
                        .write_at(buf.as_ref(), at)
                        .unwrap(),
                    4096
                );
            }
            _ => toggle_nodump(&p),
        }
        if rng.chance(10) {
            std::thread::sleep(std::time::Duration::from_millis(rng.below(5)));
        }
    }
    let dirty = stats(&d);
    drop(open);
    // Closing writes the pages back: times stay what stat showed.
    same("stat before and after the last close", &dirty, &stats(&d));
    let got = fs.settle(|root| stats(&root.join("t")));
    same("after remount", &dirty, &got);
}

/// statx with the birth time: (mask has STATX_BTIME, sec, nsec).
fn btime(p: &Path) -> (bool, i64, u32) {
    let c = cpath(p);
    // SAFETY: a NUL-terminated path; statx fills the zeroed struct.
    unsafe {
        let mut x: libc::statx = std::mem::zeroed();
        let r = libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_BASIC_STATS | libc::STATX_BTIME,
            &mut x,
        );
        assert_eq!(r, 0, "statx {}: {}", p.display(), last_errno());
        (
            x.stx_mask & libc::STATX_BTIME != 0,
            x.stx_btime.tv_sec,
            x.stx_btime.tv_nsec,
        )
    }
}

#[test]
fn statx_birth_time() {
    let name = "statx_birth_time";
    if !require_fuse_mount(name) {
        return;
    }
    let fs = Fs::new(name);
    let now = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64
    };
    let start = now();
    write_file(&fs.p("file"), b"born");
    std::fs::create_dir(fs.p("dir")).unwrap();
    std::os::unix::fs::symlink("file", fs.p("link")).unwrap();
    let c = cpath(&fs.p("fifo"));
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    // Later changes leave the birth time alone.
    std::thread::sleep(std::time::Duration::from_millis(1100));
    write_file(&fs.p("file"), b"changed");
    std::fs::File::create(fs.p("dir/new")).unwrap();
    let names = ["file", "dir", "link", "fifo"];
    for n in names {
        let (has, sec, nsec) = btime(&fs.p(n));
        assert!(has, "{n}: statx answers without STATX_BTIME");
        assert!(
            (start - 1..=start + 1).contains(&sec),
            "{n}: birth time {sec}, made at {start}"
        );
        let m = lstat(&fs.p(n));
        assert!(
            (sec, i64::from(nsec)) < (m.mtime(), m.mtime_nsec()) || n == "link" || n == "fifo",
            "{n}: born after its last change"
        );
    }
    fs.settle(|root| {
        names
            .iter()
            .map(|n| (n.to_string(), btime(&root.join(n))))
            .collect()
    });
}

#[test]
fn mmap_of_direct_handle() {
    let name = "mmap_of_direct_handle";
    if !require_fuse_mount(name) {
        return;
    }
    let fs = Fs::new(name);
    const LEN: usize = 256 << 10;
    let p = fs.p("mapped");
    let f = open_direct(&p, true, true);
    let first = pattern(1, LEN);
    assert_eq!(f.write_at(Aligned::of(&first).as_ref(), 0).unwrap(), LEN);
    let mut want = first.clone();
    let patch = pattern(2, 70_000);
    want[5000..75_000].copy_from_slice(&patch);
    // SAFETY: a shared mapping of the file's LEN bytes, used only inside them.
    unsafe {
        let m = libc::mmap(
            std::ptr::null_mut(),
            LEN,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(
            m,
            libc::MAP_FAILED,
            "mmap of an O_DIRECT handle: {}",
            last_errno()
        );
        let b = std::slice::from_raw_parts_mut(m.cast::<u8>(), LEN);
        assert!(b == &first[..], "the mapping shows what O_DIRECT wrote");
        b[5000..75_000].copy_from_slice(&patch);
        assert_eq!(libc::msync(m, LEN, libc::MS_SYNC), 0, "{}", last_errno());
        assert_eq!(libc::munmap(m, LEN), 0);
    }
    drop(f);
    assert!(read_direct(&p) == want, "O_DIRECT read after msync");
    assert!(std::fs::read(&p).unwrap() == want, "buffered read");
    let got = fs.settle(|root| [("mapped".to_string(), digest(&root.join("mapped")))].into());
    assert_eq!(got["mapped"], (LEN, fnv(&want)));
}

#[test]
fn reopen_reads_what_was_written() {
    let name = "reopen_reads_what_was_written";
    if !require_fuse_mount(name) {
        return;
    }
    let fs = Fs::new(name);
    let p = |f: &str| fs.p(f);
    let mut want: View<Vec<u8>> = View::new();

    let data = pattern(1, 100_000);
    File::create(p("plain")).unwrap().write_all(&data).unwrap();
    let mut back = Vec::new();
    File::open(p("plain"))
        .unwrap()
        .read_to_end(&mut back)
        .unwrap();
    assert!(back == data, "reopened");
    want.insert("plain".into(), data);

    // A reader with the file cached (KEEP_CACHE) while copy_file_range changes it.
    let mut dst = pattern(2, 65536);
    let src = pattern(3, 65536);
    write_file(&p("dst"), &dst);
    write_file(&p("src"), &src);
    let reader = File::open(p("dst")).unwrap();
    let mut cached = vec![0u8; 65536];
    reader.read_exact_at(&mut cached, 0).unwrap();
    assert!(cached == dst);
    // SAFETY: a read-only shared mapping of the file's 64 KiB, unmapped below.
    let map = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            65536,
            libc::PROT_READ,
            libc::MAP_SHARED,
            reader.as_raw_fd(),
            0,
        )
    };
    assert_ne!(map, libc::MAP_FAILED);
    // SAFETY: the mapping is 64 KiB long and stays mapped while used.
    let mapped = || unsafe { std::slice::from_raw_parts(map.cast::<u8>(), 65536).to_vec() };
    assert!(mapped() == dst);
    let copy = |from: u64, to: u64, len: usize| {
        let (i, o) = (
            File::open(p("src")).unwrap(),
            OpenOptions::new().write(true).open(p("dst")).unwrap(),
        );
        let (mut fi, mut fo) = (from as i64, to as i64);
        // SAFETY: open descriptors and offsets we own.
        let n = unsafe {
            libc::copy_file_range(i.as_raw_fd(), &mut fi, o.as_raw_fd(), &mut fo, len, 0)
        };
        assert_eq!(n, len as isize, "copy_file_range: {}", last_errno());
    };
    copy(4096, 8192, 32768);
    dst[8192..8192 + 32768].copy_from_slice(&src[4096..4096 + 32768]);
    reader.read_exact_at(&mut cached, 0).unwrap();
    assert!(cached == dst, "the open reader sees the copied range");
    assert!(
        mapped() == dst,
        "the reader's mapping sees the copied range"
    );
    // Past the end: the reader's size grows too.
    copy(0, 60_000, 20_000);
    dst.resize(80_000, 0);
    dst[60_000..].copy_from_slice(&src[..20_000]);
    assert_eq!(reader.metadata().unwrap().len(), 80_000);
    let mut all = Vec::new();
    (&reader).read_to_end(&mut all).unwrap();
    assert!(all == dst, "the open reader reads to the new end");
    assert!(std::fs::read(p("dst")).unwrap() == dst, "reopened");
    // SAFETY: mapped above, not used after.
    unsafe { libc::munmap(map, 65536) };
    drop(reader);
    want.insert("dst".into(), dst);
    want.insert("src".into(), src);
    let want: View<(usize, u64)> = want
        .into_iter()
        .map(|(k, v)| (k, (v.len(), fnv(&v))))
        .collect();
    let got = fs.settle(|root| {
        want.keys()
            .map(|f| (f.clone(), digest(&root.join(f))))
            .collect()
    });
    same("after remount", &want, &got);
}

#[test]
fn listing_shows_new_snapshot() {
    let name = "listing_shows_new_snapshot";
    if !require_fuse_mount(name) {
        return;
    }
    let fs = Fs::new(name);
    let names = |d: &Path| -> BTreeSet<String> {
        std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect()
    };
    let set = |v: &[&str]| -> BTreeSet<String> { v.iter().map(|s| s.to_string()).collect() };
    let top = fs.p("top");
    std::fs::create_dir(&top).unwrap();
    write_file(&top.join("file"), b"f");
    let oleo = |args: &[&str]| run(OLEO, args);
    let t = |n: &str| s(&top.join(n));
    // Listed twice: the second answer may come from the kernel's cache.
    for _ in 0..2 {
        assert_eq!(names(&top), set(&["file"]));
        assert_eq!(names(fs.root()), set(&["top"]));
    }
    oleo(&["subvolume", "create", &t("sv")]);
    assert_eq!(names(&top), set(&["file", "sv"]), "a new subvolume");
    write_file(&top.join("sv/inner"), b"inner");
    oleo(&["subvolume", "snapshot", &t("sv"), &t("snap")]);
    assert_eq!(names(&top), set(&["file", "snap", "sv"]), "a new snapshot");
    oleo(&["subvolume", "snapshot", "-r", &t("sv"), &s(&fs.p("rosnap"))]);
    assert_eq!(
        names(fs.root()),
        set(&["rosnap", "top"]),
        "a snapshot at the top"
    );
    assert_eq!(std::fs::read(top.join("snap/inner")).unwrap(), b"inner");
    oleo(&["subvolume", "delete", &t("snap")]);
    assert_eq!(names(&top), set(&["file", "sv"]), "a deleted snapshot");
    oleo(&["subvolume", "create", &t("later")]);
    oleo(&["subvolume", "delete", &t("later")]);
    assert_eq!(names(&top), set(&["file", "sv"]), "created and deleted");
    let got = fs.settle(tree);
    let listed: Vec<&str> = got.keys().map(String::as_str).collect();
    assert_eq!(
        listed,
        [
            "rosnap",
            "rosnap/inner",
            "top",
            "top/file",
            "top/sv",
            "top/sv/inner"
        ]
    );
}

/// A file handle (`struct file_handle` with room for any filesystem's).
#[repr(C)]
struct Handle {
    bytes: u32,
    kind: i32,
    f: [u8; 128],
}

/// name_to_handle_at(2) of a path.
fn handle_of(p: &Path) -> Handle {
    let c = cpath(p);
    let mut h = Handle {
        bytes: 128,
        kind: 0,
        f: [0; 128],
    };
    let mut mount_id: libc::c_int = 0;
    // SAFETY: a NUL-terminated path, a handle with room for `bytes`, an int to write to.
    let r = unsafe {
        libc::syscall(
            libc::SYS_name_to_handle_at,
            libc::AT_FDCWD,
            c.as_ptr(),
            &mut h as *mut Handle,
            &mut mount_id as *mut libc::c_int,
            0,
        )
    };
    assert_eq!(r, 0, "name_to_handle_at {}: {}", p.display(), last_errno());
    h
}

/// open_by_handle_at(2) on the mount at `mnt`: the file, or the errno.
fn open_handle(mnt: &Path, h: &Handle, flags: i32) -> Result<File, i32> {
    let m = File::open(mnt).unwrap();
    // SAFETY: an open descriptor and a handle filled by name_to_handle_at.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_by_handle_at,
            m.as_raw_fd(),
            h as *const Handle,
            flags | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(last_errno());
    }
    // SAFETY: a descriptor we own.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(fd as i32) })
}

/// Makes the kernel forget every unused inode and dentry (FORGET reaches the server).
fn drop_kernel_caches() {
    std::fs::write("/proc/sys/vm/drop_caches", "2").expect("drop_caches");
    std::thread::sleep(std::time::Duration::from_millis(200));
}

/// Where an open descriptor's path leads (connected: found up to the root by "..").
fn fd_path(f: &File) -> PathBuf {
    std::fs::read_link(format!("/proc/self/fd/{}", f.as_raw_fd())).unwrap()
}

#[test]
fn file_handles_outlive_the_cache() {
    let name = "file_handles_outlive_the_cache";
    if !require_fuse_mount(name) {
        return;
    }
    let mut fs = Fs::new(name);
    std::fs::create_dir_all(fs.p("a/b/c")).unwrap();
    let files = ["a/one", "a/b/two", "a/b/c/three", "top"];
    for (i, f) in files.iter().enumerate() {
        write_file(&fs.p(f), &pattern(i as u64, 5000 + i));
    }
    let dirs = ["a", "a/b", "a/b/c"];
    let mut handles: Vec<(&str, Handle)> = Vec::new();
    for p in files.iter().chain(dirs.iter()) {
        handles.push((p, handle_of(&fs.p(p))));
    }
    // The newest inode, deleted: btrfs hands its number out again after a remount, with a
    // new generation.
    write_file(&fs.p("a/gone"), b"unlinked before the lookup");
    let gone = handle_of(&fs.p("a/gone"));
    let gone_ino = lstat(&fs.p("a/gone")).ino();
    std::fs::remove_file(fs.p("a/gone")).unwrap();

    let check = |mnt: &Path, when: &str| {
        drop_kernel_caches();
        for (p, h) in &handles {
            let dir = dirs.contains(p);
            let flags = if dir { libc::O_DIRECTORY } else { 0 };
            let f = open_handle(mnt, h, libc::O_RDONLY | flags)
                .unwrap_or_else(|e| panic!("{when}: open_by_handle_at {p}: errno {e}"));
            if dir {
                // A directory's dentry is connected: its parents were looked up by "..".
                assert_eq!(fd_path(&f), mnt.join(p), "{when}: {p} reconnected");
            } else {
                let i = files.iter().position(|f| f == p).unwrap();
                let mut got = Vec::new();
                (&f).read_to_end(&mut got).unwrap();
                assert!(got == pattern(i as u64, 5000 + i), "{when}: {p} by handle");
            }
        }
        assert_eq!(
            open_handle(mnt, &gone, libc::O_RDONLY).err(),
            Some(libc::ESTALE),
            "{when}: a handle of an unlinked file"
        );
    };
    check(fs.root(), "mounted");

    // Node ids of the mounted subvolume survive a remount; the generation tells a reused
    // inode number from the one a handle was made for.
    let mnt = fs.root().to_path_buf();
    fs.mount.take().unwrap().unmount().expect("unmount");
    fs.mount = Some(OleoMount::mount_rw(Path::new(OLEO), &fs.image, &mnt, &[]).expect("remount"));
    write_file(&fs.p("new"), b"new");
    assert_eq!(
        lstat(&fs.p("new")).ino(),
        gone_ino,
        "btrfs reuses the number"
    );
    // Among the rest: the handle of the deleted file is stale, not one of "new".
    check(&mnt, "remounted");
    fs.settle(tree);
}

/// ASYNC_DIO: an asynchronous O_DIRECT write completes without the kernel dropping the
/// pages a buffered reader cached meanwhile; a buffered read after its completion must
/// still see what it wrote (fstests generic/451).
#[test]
fn buffered_read_after_async_direct_write() {
    let name = "buffered_read_after_async_direct_write";
    if !require_fuse_mount(name) {
        return;
    }
    let fs = Fs::new(name);
    const LEN: usize = 640 << 10;
    let p = fs.p("cycled");
    let fills = [Aligned::of(&vec![0x5a; LEN]), Aligned::of(&vec![0xa5; LEN])];
    let f = open_direct(&p, true, true);
    assert_eq!(f.write_at(fills[0].as_ref(), 0).unwrap(), LEN);
    let aio = oleo_testkit::aio::Aio::new(4).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (p, stop) = (p.clone(), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let _ = std::fs::read(&p);
                }
            })
        })
        .collect();
    let started = std::time::Instant::now();
    let mut stale = None;
    let mut cycles = 0;
    while started.elapsed() < std::time::Duration::from_secs(5) && stale.is_none() {
        let fill = &fills[(cycles + 1) % 2];
        assert_eq!(aio.write(&f, fill.as_ref(), 0), LEN as i64);
        if std::fs::read(&p).unwrap() != fill.as_ref() {
            stale = Some(cycles);
        }
        cycles += 1;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for r in readers {
        r.join().unwrap();
    }
    drop(aio);
    assert_eq!(stale, None, "buffered read stale after cycle (of {cycles})");
    drop(f);
    let want = digest(&p);
    let got = fs.settle(|root| [("cycled".to_string(), digest(&root.join("cycled")))].into());
    assert_eq!(got["cycled"], want);
}

/// statx's (attributes, attributes_mask) of a path.
fn statx_attributes(p: &Path) -> (u64, u64) {
    let c = cpath(p);
    // SAFETY: a NUL-terminated path; statx fills the zeroed struct.
    unsafe {
        let mut x: libc::statx = std::mem::zeroed();
        let r = libc::statx(
            libc::AT_FDCWD,
            c.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW,
            libc::STATX_BASIC_STATS | libc::STATX_BTIME,
            &mut x,
        );
        assert_eq!(r, 0, "statx {}: {}", p.display(), last_errno());
        (x.stx_attributes, x.stx_attributes_mask)
    }
}

/// The STATX reply carries the attributes btrfs_getattr reports (append, compressed,
/// immutable, nodump), but the kernel's fuse_do_statx copies none of them
/// (docs/fuse-limits.md). While it does not, statx through the mount shows none; once it
/// does, they must be kernel btrfs's.
#[test]
fn statx_attributes_as_far_as_fuse_passes_them() {
    let name = "statx_attributes_as_far_as_fuse_passes_them";
    if !require_fuse_mount(name) {
        return;
    }
    const BTRFS: u64 = 0x4 | 0x10 | 0x20 | 0x40; // compressed, immutable, append, nodump
    let fs = Fs::new(name);
    let k = fs.kernel_reference();
    let flags = [
        ("plain", ""),
        ("a", "+a"),
        ("i", "+i"),
        ("d", "+d"),
        ("c", "+c"),
    ];
    let attrs = |root: &Path| {
        let mut out = View::new();
        for (f, set) in flags {
            let p = root.join(f);
            write_file(&p, b"x");
            if !set.is_empty() {
                run("chattr", &[set, &s(&p)]);
            }
            let (a, mask) = statx_attributes(&p);
            out.insert(f.to_string(), (a & BTRFS, mask & BTRFS));
            if !set.is_empty() {
                run("chattr", &[&set.replace('+', "-"), &s(&p)]);
            }
        }
        out
    };
    let want = attrs(k.path());
    assert_eq!(want["a"], (0x20, BTRFS), "kernel btrfs");
    let got = attrs(fs.root());
    if got.values().all(|&(_, mask)| mask == 0) {
        eprintln!("{name}: this kernel passes no statx attributes from a FUSE server");
        assert!(got.values().all(|&(a, _)| a == 0));
    } else {
        same("statx attributes, oleo against kernel btrfs", &want, &got);
    }
}

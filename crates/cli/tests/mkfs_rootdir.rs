//! `oleo mkfs --rootdir DIR`: the new image holds the tree, as the kernel sees it after a
//! loop mount (every kind of inode, owners, modes, xattrs and ACLs, hard links, holes,
//! mtimes), `btrfs check` is clean, and it works without root.

use oleo_testkit::*;
use std::collections::{BTreeMap, HashMap};
use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn mknod(p: &Path, mode: u32, dev: u64) {
    // SAFETY: a NUL-terminated path.
    let r = unsafe { libc::mknod(cpath(p).as_ptr(), mode, dev) };
    assert_eq!(
        r,
        0,
        "mknod {}: {}",
        p.display(),
        std::io::Error::last_os_error()
    );
}

fn setxattr(p: &Path, name: &str, value: &[u8]) {
    let n = CString::new(name).unwrap();
    // SAFETY: NUL-terminated strings and a valid buffer.
    let r = unsafe {
        libc::lsetxattr(
            cpath(p).as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    assert_eq!(r, 0, "setxattr {name}: {}", std::io::Error::last_os_error());
}

/// A tree with every kind of inode root can make.
fn build_tree(root: &Path, many: usize) {
    std::fs::create_dir_all(root.join("a/b/c")).unwrap();
    std::fs::write(root.join("empty"), b"").unwrap();
    std::fs::write(root.join("small"), b"inline-sized\n").unwrap();
    let big: Vec<u8> = (0..3 << 20).map(|i: u32| (i % 251) as u8).collect();
    std::fs::write(root.join("a/big"), &big).unwrap();
    // Sparse: data, a 1 MiB hole, data, a trailing hole.
    let sparse = std::fs::File::create(root.join("sparse")).unwrap();
    use std::os::unix::fs::FileExt;
    sparse.write_all_at(&[7u8; 8192], 0).unwrap();
    sparse.write_all_at(&[9u8; 4096], (1 << 20) + 8192).unwrap();
    sparse.set_len(4 << 20).unwrap();
    std::os::unix::fs::symlink("a/big", root.join("link-to-big")).unwrap();
    std::os::unix::fs::symlink("/nowhere/dangling", root.join("dangling")).unwrap();
    std::fs::hard_link(root.join("small"), root.join("a/b/hard")).unwrap();
    std::fs::hard_link(root.join("small"), root.join("a/b/c/hard2")).unwrap();
    mknod(&root.join("fifo"), libc::S_IFIFO | 0o640, 0);
    mknod(
        &root.join("chr"),
        libc::S_IFCHR | 0o600,
        libc::makedev(1, 3),
    );
    mknod(
        &root.join("blk"),
        libc::S_IFBLK | 0o600,
        libc::makedev(7, 42),
    );
    let _sock = std::os::unix::net::UnixListener::bind(root.join("sock")).unwrap();
    let suid = root.join("suid");
    std::fs::write(&suid, b"#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    std::fs::set_permissions(root.join("a/b"), std::fs::Permissions::from_mode(0o1777)).unwrap();
    let owned = root.join("owned");
    std::fs::write(&owned, b"someone else's").unwrap();
    std::os::unix::fs::chown(&owned, Some(1234), Some(5678)).unwrap();
    setxattr(&root.join("small"), "user.note", b"hello xattr");
    setxattr(&root.join("a"), "user.dir", b"on a directory");
    setxattr(
        &root.join("a/big"),
        "security.oleo-test",
        b"security namespace",
    );
    let acl = Command::new("setfacl")
        .args(["-m", "u:1234:rw,g:5678:r"])
        .arg(root.join("owned"))
        .status();
    assert!(acl.is_ok_and(|s| s.success()), "setfacl (acl package)");
    let long = "L".repeat(255);
    std::fs::write(root.join(&long), b"long name").unwrap();
    std::fs::write(root.join(OsStr::from_bytes(b"latin1-\xe9t\xe9")), b"bytes").unwrap();
    for i in 0..many {
        let d = root.join(format!("many/{:02}", i % 50));
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(format!("f{i}")), format!("file {i}\n")).unwrap();
    }
    // Times last: creating entries changes directories' mtimes.
    run(Command::new("touch")
        .args(["-h", "-d", "2001-02-03 04:05:06.789"])
        .arg(root.join("small"))
        .arg(root.join("dangling"))
        .arg(root.join("a/b/c")));
}

#[derive(Debug, PartialEq)]
struct Seen {
    kind: u32,
    mode: u32,
    uid: u32,
    gid: u32,
    size: u64,
    nlink: u64,
    rdev: u64,
    mtime: (i64, i64),
    content: Vec<u8>,
    xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    holes: Vec<(i64, i64)>,
}

fn xattrs(p: &Path) -> BTreeMap<Vec<u8>, Vec<u8>> {
    let out = Command::new("getfattr")
        .args(["-h", "-d", "-m", "-", "-e", "hex", "--absolute-names"])
        .arg(p)
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.as_bytes().to_vec(), v.as_bytes().to_vec()))
        .collect()
}

fn data_map(p: &Path, len: u64) -> Vec<(i64, i64)> {
    let f = std::fs::File::open(p).unwrap();
    use std::os::fd::AsRawFd;
    let mut out = Vec::new();
    let mut at = 0i64;
    while (at as u64) < len {
        // SAFETY: lseek on an open descriptor.
        let d = unsafe { libc::lseek(f.as_raw_fd(), at, libc::SEEK_DATA) };
        if d < 0 {
            break;
        }
        // SAFETY: as above.
        let h = unsafe { libc::lseek(f.as_raw_fd(), d, libc::SEEK_HOLE) };
        out.push((d, h));
        at = h;
    }
    out
}

/// Everything the copy must keep, path by path; plus hard-link groups by path.
fn observe(root: &Path) -> (BTreeMap<PathBuf, Seen>, Vec<Vec<PathBuf>>) {
    let mut seen = BTreeMap::new();
    let mut groups: HashMap<u64, Vec<PathBuf>> = HashMap::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let p = e.unwrap().path();
            let m = std::fs::symlink_metadata(&p).unwrap();
            let rel = p.strip_prefix(root).unwrap().to_path_buf();
            let ft = m.file_type();
            let content = if ft.is_file() {
                std::fs::read(&p).unwrap()
            } else if ft.is_symlink() {
                std::fs::read_link(&p)
                    .unwrap()
                    .as_os_str()
                    .as_bytes()
                    .to_vec()
            } else {
                Vec::new()
            };
            if ft.is_dir() {
                stack.push(p.clone());
            } else {
                groups.entry(m.ino()).or_default().push(rel.clone());
            }
            seen.insert(
                rel,
                Seen {
                    kind: m.mode() & libc::S_IFMT,
                    mode: m.mode() & 0o7777,
                    uid: m.uid(),
                    gid: m.gid(),
                    size: if ft.is_dir() { 0 } else { m.len() },
                    nlink: if ft.is_dir() { 1 } else { m.nlink() },
                    rdev: m.rdev(),
                    mtime: (m.mtime(), m.mtime_nsec()),
                    content,
                    xattrs: xattrs(&p),
                    holes: if ft.is_file() {
                        data_map(&p, m.len())
                    } else {
                        Vec::new()
                    },
                },
            );
        }
    }
    let mut groups: Vec<Vec<PathBuf>> = groups
        .into_values()
        .filter(|g| g.len() > 1)
        .map(|mut g| {
            g.sort();
            g
        })
        .collect();
    groups.sort();
    (seen, groups)
}

fn compare(src: &Path, image: &Path, kmnt: &Path) {
    assert_btrfs_check(image, "mkfs --rootdir");
    let k = KernelMount::mount(image, kmnt, &["ro"]).unwrap();
    let (want, want_links) = observe(src);
    let (got, got_links) = observe(kmnt);
    for (path, w) in &want {
        let g = got
            .get(path)
            .unwrap_or_else(|| panic!("{} is missing from the image", path.display()));
        // Directories' size and nlink are btrfs's own (names * 2, 1): not compared.
        assert_eq!(w, g, "{} differs", path.display());
    }
    assert_eq!(want.len(), got.len(), "extra entries in the image");
    assert_eq!(want_links, got_links, "hard-link groups");
    let (rs, rk) = (
        std::fs::metadata(src).unwrap(),
        std::fs::metadata(kmnt).unwrap(),
    );
    assert_eq!(
        (rs.mode(), rs.uid(), rs.gid()),
        (rk.mode(), rk.uid(), rk.gid()),
        "the root directory"
    );
    k.unmount().unwrap();
}

#[test]
fn a_tree_of_every_kind_of_inode_arrives_whole() {
    let name = "mkfs_rootdir_kinds";
    if !require_root(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let src = dir.subdir("src").unwrap();
    build_tree(&src, 5000);
    let image = dir.join("tree.img");
    run(Command::new(OLEO)
        .args(["mkfs", "-q", "--rootdir"])
        .arg(&src)
        .arg(&image));
    let kmnt = dir.subdir("kmnt").unwrap();
    compare(&src, &image, &kmnt);
}

#[test]
fn an_unprivileged_user_builds_an_image_of_their_tree() {
    let name = "mkfs_rootdir_rootless";
    if !require_root(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let home = dir.subdir("home").unwrap();
    let src = home.join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("sub/file"), b"made by nobody").unwrap();
    std::os::unix::fs::symlink("sub/file", src.join("link")).unwrap();
    run(Command::new("chown").args(["-R", "65534:65534"]).arg(&home));
    let image = home.join("user.img");
    run(Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", OLEO])
        .args(["mkfs", "-q", "--rootdir"])
        .arg(&src)
        .arg(&image));
    let kmnt = dir.subdir("kmnt").unwrap();
    compare(&src, &image, &kmnt);
}

#[test]
fn a_tree_that_does_not_fit_is_refused_naming_the_file() {
    let name = "mkfs_rootdir_enospc";
    if !require_root(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let src = dir.subdir("src").unwrap();
    let big: Vec<u8> = (0..120u32 << 20).map(|i| (i % 253) as u8).collect();
    std::fs::write(src.join("too-big"), &big).unwrap();
    let image = dir.join("small.img");
    let out = Command::new(OLEO)
        .args(["mkfs", "-q", "--size", "128M", "--rootdir"])
        .arg(&src)
        .arg(&image)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a 120 MiB file fit in a 128 MiB image?"
    );
    assert!(err.contains("too-big") && err.contains("no space"), "{err}");
    assert!(!image.exists(), "the half-made image was left behind");
}

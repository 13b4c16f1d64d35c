//! Idmapped mounts of an oleo mount (FUSE_ALLOW_IDMAP, Linux 6.12+), against kernel btrfs.
//!
//! The same sequence runs on an idmapped view of an oleo mount and of a kernel btrfs mount
//! of a copy of the same image: the view maps on-disk ids 0..65536 to 10000..75536 (the
//! idmap of a user namespace whose uid_map and gid_map say `0 10000 65536`), made with
//! open_tree(OPEN_TREE_CLONE), mount_setattr(MOUNT_ATTR_IDMAP) and move_mount, as fstests'
//! src/vfs/mount-idmapped does. Each step (creates by an unmapped root and by a mapped
//! user, stat through the view and through the plain mount, chown through the view to a
//! mapped and to an unmapped id, writes allowed and refused by the mapped owner) must give
//! the same result on both, and the owners oleo wrote must be those kernel btrfs reads
//! from the oleo image after the unmount.

use oleo_testkit::*;
use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");

/// `struct mount_attr` of mount_setattr(2).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;
const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 4;

/// A user namespace mapping 0..65536 to 10000..75536, held by a sleeping child.
struct Userns {
    child: std::process::Child,
    fd: OwnedFd,
}

impl Userns {
    fn new() -> Userns {
        let mut c = Command::new("sleep");
        c.arg("600");
        // SAFETY: unshare is async-signal-safe; nothing else runs between fork and exec.
        unsafe {
            c.pre_exec(|| {
                if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = c.spawn().expect("a child in a new user namespace");
        let pid = child.id();
        // Written once the child has unshared: its ns link then differs from ours.
        let ours = std::fs::read_link("/proc/self/ns/user").unwrap();
        for _ in 0..500 {
            if std::fs::read_link(format!("/proc/{pid}/ns/user")).is_ok_and(|l| l != ours) {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        for map in ["uid_map", "gid_map"] {
            std::fs::write(format!("/proc/{pid}/{map}"), "0 10000 65536\n").unwrap();
        }
        let f = std::fs::File::open(format!("/proc/{pid}/ns/user")).unwrap();
        Userns {
            child,
            fd: f.into(),
        }
    }
}

impl Drop for Userns {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Mounts an idmapped view of the mount at `src` on `dst`.
fn idmapped_bind(src: &Path, dst: &Path, ns: &Userns) -> std::io::Result<()> {
    let src_c = CString::new(src.as_os_str().as_bytes()).unwrap();
    let dst_c = CString::new(dst.as_os_str().as_bytes()).unwrap();
    // SAFETY: a path that outlives the call; the result is a new descriptor or -1.
    let tree = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            libc::AT_FDCWD,
            src_c.as_ptr(),
            OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
        )
    };
    if tree < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: open_tree returned a descriptor we now own.
    let tree = unsafe { OwnedFd::from_raw_fd(tree as i32) };
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: ns.fd.as_raw_fd() as u64,
    };
    // SAFETY: the attribute struct and the empty path outlive the call.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: as above.
    let r = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_FDCWD,
            dst_c.as_ptr(),
            MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Runs `script` with `sh` in `dir` as uid:gid (no supplementary groups); its output and
/// exit status, with the paths it printed being relative to `dir`.
fn run_as(dir: &Path, uid: u32, gid: u32, script: &str) -> String {
    let out = Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .arg("--clear-groups")
        .args(["sh", "-c", script])
        .current_dir(dir)
        .env("LC_ALL", "C")
        .output()
        .unwrap();
    format!(
        "{}{}exit {}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        out.status.code().unwrap_or(-1)
    )
}

/// The sequence, on the plain mount `plain` and its idmapped view `view`; one line per step.
fn sequence(plain: &Path, view: &Path) -> Vec<String> {
    let mut log = Vec::new();
    let mut step = |what: &str, dir: &Path, uid: u32, gid: u32, script: &str| {
        log.push(format!("{what}: {}", run_as(dir, uid, gid, script)));
    };
    step("setup", plain, 0, 0, "mkdir d && chmod 777 d && echo x > d/owned && chown 1000:1000 d/owned && chmod 600 d/owned");
    // Root has no mapping in the view: the VFS refuses it a new inode.
    step("root creates", view, 0, 0, "touch d/by_root");
    step("root mkdir", view, 0, 0, "mkdir d/dir_by_root");
    // 10000 is on-disk 0 through the view.
    step(
        "mapped creates",
        view,
        10000,
        10000,
        "touch d/f && mkdir d/sub && ln -s f d/l && mkfifo d/p && stat -c '%n %u:%g' d/f d/sub d/l d/p",
    );
    step(
        "stat plain",
        plain,
        0,
        0,
        "stat -c '%n %u:%g' d/f d/sub d/l d/p d/owned",
    );
    step(
        "stat view",
        view,
        0,
        0,
        "stat -c '%n %u:%g' d/f d/sub d/l d/p d/owned",
    );
    step(
        "chown mapped",
        view,
        0,
        0,
        "chown 10005:10007 d/f && stat -c '%u:%g' d/f",
    );
    step("chown mapped plain", plain, 0, 0, "stat -c '%u:%g' d/f");
    step("chown unmapped", view, 0, 0, "chown 5:7 d/sub");
    step(
        "chown link",
        view,
        0,
        0,
        "chown -h 10003:10004 d/l && stat -c '%u:%g' d/l",
    );
    // d/owned is on-disk 1000, 11000 through the view, mode 600.
    step(
        "owner writes",
        view,
        11000,
        11000,
        "echo y >> d/owned && cat d/owned",
    );
    step("non-owner writes", view, 1000, 1000, "echo z >> d/owned");
    step(
        "owner chmods",
        view,
        11000,
        11000,
        "chmod 640 d/owned && stat -c '%a' d/owned",
    );
    step("group reads", view, 12000, 11000, "cat d/owned");
    step(
        "owner chowns to own group",
        view,
        11000,
        11000,
        "chgrp 11000 d/owned && stat -c '%u:%g' d/owned",
    );
    step(
        "owner chowns away",
        view,
        11000,
        11000,
        "chown 12000 d/owned",
    );
    step("mapped rename", view, 10000, 10000, "mv d/f d/g && ls d");
    step("mapped unlink", view, 10000, 10000, "rm d/p && ls d");
    // A setgid directory hands its group on, through the view as on disk.
    step(
        "setgid dir",
        plain,
        0,
        0,
        "mkdir d/sg && chown 0:50 d/sg && chmod 2777 d/sg",
    );
    step(
        "create in setgid dir",
        view,
        10001,
        10001,
        "touch d/sg/x && mkdir d/sg/y && stat -c '%n %u:%g %A' d/sg/x d/sg/y",
    );
    step(
        "setgid plain",
        plain,
        0,
        0,
        "stat -c '%n %u:%g %A' d/sg/x d/sg/y",
    );
    log
}

/// Owners of every name under `root`/d, sorted, as `name uid:gid mode`.
fn owners(root: &Path) -> String {
    run_as(root, 0, 0, "find d | sort | xargs stat -c '%n %u:%g %a'")
}

#[test]
fn an_idmapped_view_maps_owners_as_kernel_btrfs_does() {
    let name = "fuse_idmap";
    if !require_fuse_mount(name) {
        return;
    }
    if env::find_in_path("setpriv").is_none() && !env::skip(name, "needs setpriv (util-linux)") {
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
    let copy = dir.join("copy");
    std::fs::copy(&image, &copy).unwrap();
    let ns = Userns::new();

    // Kernel btrfs, the oracle.
    let kmnt = dir.subdir("kernel").unwrap();
    let kview = dir.subdir("kernel_view").unwrap();
    let k = KernelMount::mount(&copy, &kmnt, &["rw"]).unwrap();
    idmapped_bind(&kmnt, &kview, &ns).expect("idmapped view of kernel btrfs");
    let want = sequence(&kmnt, &kview);
    let want_owners = owners(&kmnt);
    eprintln!("kernel btrfs:\n{}\n{want_owners}", want.join("\n"));
    // SAFETY: a NUL-terminated path.
    unsafe {
        libc::umount2(
            CString::new(kview.as_os_str().as_bytes()).unwrap().as_ptr(),
            0,
        )
    };
    k.unmount().unwrap();

    // oleo.
    let omnt = dir.subdir("oleo").unwrap();
    let oview = dir.subdir("oleo_view").unwrap();
    let m = OleoMount::mount_rw(Path::new(OLEO), &image, &omnt, &[]).unwrap();
    if let Err(e) = idmapped_bind(&omnt, &oview, &ns) {
        panic!("idmapped view of the oleo mount refused ({e}): FUSE_ALLOW_IDMAP not agreed?");
    }
    let got = sequence(&omnt, &oview);
    let got_view_owners = owners(&omnt);
    // SAFETY: as above.
    unsafe {
        libc::umount2(
            CString::new(oview.as_os_str().as_bytes()).unwrap().as_ptr(),
            0,
        )
    };
    m.unmount().unwrap();

    for (w, g) in want.iter().zip(&got) {
        assert_eq!(g, w, "oleo (left) and kernel btrfs (right) differ");
    }
    assert_eq!(got.len(), want.len());
    assert_eq!(
        got_view_owners, want_owners,
        "owners through oleo's plain mount"
    );

    // What oleo wrote, read by kernel btrfs.
    let k = KernelMount::mount(&image, &kmnt, &["ro"]).unwrap();
    assert_eq!(
        owners(&kmnt),
        want_owners,
        "owners oleo wrote, read by kernel btrfs"
    );
    k.unmount().unwrap();
}

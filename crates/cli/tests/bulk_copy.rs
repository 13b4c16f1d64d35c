//! `oleo cp` and `oleo tar -x` fill an unmounted image: a populated tree (every kind of
//! inode, xattrs, ACLs, hard links, holes, long names) copied in arrives whole as the kernel
//! sees it after a mount, `btrfs check` is clean, copying back out gives the tree again,
//! GNU tar's archive of it extracts as the kernel's extraction does, and a plain user gets
//! their own files, as cp gives them.

use oleo_testkit::manifest::display_path;
use oleo_testkit::mount::syncfs;
use oleo_testkit::populate::populate;
use oleo_testkit::*;
use std::path::Path;
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

/// A manifest with what a copy makes its own left out: directory sizes (the host
/// filesystem's) and the root's name.
fn capture(root: &Path) -> Manifest {
    let mut m = Manifest::capture(root).unwrap();
    for e in m.entries.values_mut() {
        if e.kind == Kind::Dir {
            e.size = 0;
            e.nlink = 1;
        }
    }
    m
}

/// `m` without atimes: GNU tar stamps the time of extraction, and reading a host source
/// under relatime moves them.
fn no_atimes(mut m: Manifest) -> Manifest {
    for e in m.entries.values_mut() {
        e.atime = Time::default();
    }
    m
}

fn assert_same(want: &Manifest, got: &Manifest, what: &str) {
    let mut diffs = want.sent_differences(got);
    for (p, w) in &want.entries {
        if let Some(g) = got.entries.get(p) {
            if w.kind == Kind::File && w.data_map != g.data_map {
                diffs.push(format!(
                    "{}: holes {:?} vs {:?}",
                    display_path(p),
                    w.data_map,
                    g.data_map
                ));
            }
        }
    }
    assert!(diffs.is_empty(), "{what}:\n{}", diffs.join("\n"));
}

/// A kernel-mounted btrfs holding the populated tree.
fn source(dir: &TempDir) -> (KernelMount, std::path::PathBuf) {
    let img = dir.join("src.img");
    empty_image(&img, 512, &[]).unwrap();
    let mnt = dir.subdir("src").unwrap();
    let k = KernelMount::mount(&img, &mnt, &["noatime"]).unwrap();
    populate(&k, &["noatime".to_string()], &PopulateSpec::basic(), 41).unwrap();
    syncfs(&mnt).unwrap();
    (k, img)
}

#[test]
fn cp_in_and_out_and_tar_keep_everything() {
    let name = "bulk_copy_root";
    if !require_root(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let (src, _) = source(&dir);
    let want = capture(src.path());

    // Host to image.
    let img = dir.join("dst.img");
    empty_image(&img, 512, &[]).unwrap();
    run(Command::new(OLEO)
        .args(["cp", "-a"])
        .arg(src.path())
        .arg(format!("{}:/dst", img.display())));
    btrfs_check(&img, true).unwrap();
    let kmnt = dir.subdir("k").unwrap();
    let k = KernelMount::mount(&img, &kmnt, &["ro", "noatime"]).unwrap();
    assert_same(&want, &capture(&kmnt.join("dst")), "cp -a into the image");
    k.unmount().unwrap();

    // Image to host: into a btrfs as well, so holes read the same.
    let out = dir.subdir("out").unwrap();
    let outimg = dir.join("out.img");
    empty_image(&outimg, 512, &[]).unwrap();
    let o = KernelMount::mount(&outimg, &out, &["noatime"]).unwrap();
    run(Command::new(OLEO)
        .args(["cp", "-a"])
        .arg(format!("{}:/dst", img.display()))
        .arg(out.join("copy")));
    assert_same(&want, &capture(&out.join("copy")), "cp -a out of the image");
    o.unmount().unwrap();

    // GNU tar's archive, extracted by the kernel and by oleo.
    let tarball = dir.join("tree.tar");
    run(Command::new("tar")
        .args(["--xattrs", "--xattrs-include=*", "--acls", "-S", "-cpf"])
        .arg(&tarball)
        .arg("-C")
        .arg(src.path())
        .arg("."));
    let kimg = dir.join("kernel-tar.img");
    empty_image(&kimg, 512, &[]).unwrap();
    let km = KernelMount::mount(&kimg, &kmnt, &["noatime"]).unwrap();
    run(Command::new("tar")
        .args([
            "--xattrs",
            "--xattrs-include=*",
            "--acls",
            "--same-owner",
            "-xpf",
        ])
        .arg(&tarball)
        .arg("-C")
        .arg(&kmnt));
    let kernel_tar = capture(&kmnt);
    km.unmount().unwrap();
    let oimg = dir.join("oleo-tar.img");
    empty_image(&oimg, 512, &[]).unwrap();
    run(Command::new(OLEO)
        .args(["tar", "-x", "-f"])
        .arg(&tarball)
        .arg("-C")
        .arg(format!("{}:", oimg.display())));
    btrfs_check(&oimg, true).unwrap();
    let k = KernelMount::mount(&oimg, &kmnt, &["ro", "noatime"]).unwrap();
    let kernel_tar = no_atimes(kernel_tar);
    assert_same(
        &kernel_tar,
        &no_atimes(capture(&kmnt)),
        "tar -x against the kernel's",
    );
    k.unmount().unwrap();
    drop(src);

    // The same archive compressed (read ahead on a thread of its own, as every archive
    // is): gzip from a file, zstd from standard input; then a gzip stream cut short.
    let gz = dir.join("tree.tar.gz");
    let zst = dir.join("tree.tar.zst");
    run(Command::new("sh").arg("-c").arg(format!(
        "gzip -c {0} > {1} && zstd -q -c {0} > {2}",
        tarball.display(),
        gz.display(),
        zst.display()
    )));
    for (what, input, stdin) in [("gzip", &gz, false), ("zstd on stdin", &zst, true)] {
        let img = dir.join("compressed.img");
        empty_image(&img, 512, &[]).unwrap();
        let mut c = Command::new(OLEO);
        c.args(["tar", "-x", "-f"]);
        if stdin {
            c.arg("-").stdin(std::fs::File::open(input).unwrap());
        } else {
            c.arg(input);
        }
        run(c.arg("-C").arg(format!("{}:", img.display())));
        btrfs_check(&img, true).unwrap();
        let k = KernelMount::mount(&img, &kmnt, &["ro", "noatime"]).unwrap();
        assert_same(&kernel_tar, &no_atimes(capture(&kmnt)), what);
        k.unmount().unwrap();
    }
    let cut = dir.join("cut.tar.gz");
    let whole = std::fs::read(&gz).unwrap();
    std::fs::write(&cut, &whole[..whole.len() * 2 / 3]).unwrap();
    let img = dir.join("cut.img");
    empty_image(&img, 512, &[]).unwrap();
    let out = Command::new(OLEO)
        .args(["tar", "-x", "-f"])
        .arg(&cut)
        .arg("-C")
        .arg(format!("{}:", img.display()))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "a cut archive extracted cleanly: {err}"
    );
    assert!(
        err.contains("cut.tar.gz"),
        "the error names the archive: {err}"
    );
    btrfs_check(&img, true).unwrap();
}

#[test]
fn a_plain_user_copies_into_their_own_image() {
    let name = "bulk_copy_user";
    if !require_root(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let home = dir.subdir("home").unwrap();
    let src = home.join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();
    std::fs::write(src.join("sub/file"), b"made by nobody").unwrap();
    std::os::unix::fs::symlink("sub/file", src.join("link")).unwrap();
    std::fs::hard_link(src.join("sub/file"), src.join("hard")).unwrap();
    run(Command::new("chown").args(["-R", "65534:65534"]).arg(&home));
    // A file of someone else's: the copy is the user's own.
    std::fs::write(src.join("theirs"), b"root's").unwrap();
    std::os::unix::fs::chown(src.join("theirs"), Some(0), Some(0)).unwrap();
    let img = home.join("user.img");
    empty_image(&img, 256, &[]).unwrap();
    run(Command::new("chown").arg("65534:65534").arg(&img));
    run(Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", OLEO])
        .args(["cp", "-a"])
        .arg(&src)
        .arg(format!("{}:/in", img.display())));
    btrfs_check(&img, true).unwrap();
    let mut want = capture(&src);
    want.entries.get_mut(b"theirs".as_slice()).unwrap().uid = 65534;
    want.entries.get_mut(b"theirs".as_slice()).unwrap().gid = 65534;
    let kmnt = dir.subdir("k").unwrap();
    let k = KernelMount::mount(&img, &kmnt, &["ro", "noatime"]).unwrap();
    assert_same(
        &no_atimes(want),
        &no_atimes(capture(&kmnt.join("in"))),
        "cp -a by a plain user",
    );
    k.unmount().unwrap();
}

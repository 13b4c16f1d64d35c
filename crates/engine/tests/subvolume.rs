//! Subvolumes and snapshots made by oleo, checked against the kernel: `btrfs check` clean,
//! the kernel sees the same files in every subvolume and snapshot, `btrfs subvolume list`
//! agrees with oleo's list (ids, paths, uuids, parent uuids, read-only flags), a snapshot
//! keeps what its source held when it was taken while both change afterwards, and the
//! kernel can go on writing to both (its copy-on-write of shared blocks trusts the
//! references oleo wrote; `btrfs check` again after).
//!
//! Needs root, kernel btrfs and btrfs-progs (a skip elsewhere, a failure under CI=true).

mod common;

use common::tree_log::{diff_trees, kernel_tree, oleo_tree, random_changes, sh, TreeView};
use common::{open_top_rw as open_rw, resolve};
use oleo::{Filesystem, InodeId, NewInode, OpenOptions};
use oleo_testkit::{assert_btrfs_check, KernelMount, TempDir};
use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// A scratch directory and an empty mkfs.btrfs image of `mb` MiB in it; None (after a skip
/// message) where the tests cannot run.
fn setup(label: &str, mb: u64) -> Option<(TempDir, std::path::PathBuf)> {
    setup_with(label, mb, &[])
}

/// `setup` with mkfs.btrfs arguments.
fn setup_with(label: &str, mb: u64, mkfs: &[&str]) -> Option<(TempDir, std::path::PathBuf)> {
    common::scratch_image("subvolume tests", label, mb, mkfs)
}

fn open_ro(image: &Path) -> Filesystem {
    let opts = OpenOptions {
        subvolid: Some(5),
        ..OpenOptions::default()
    };
    Filesystem::open(image, opts).expect("open read-only")
}

/// Writes `data` as file `name` in `dir`, replacing what was there.
fn put_file(fs: &Filesystem, dir: InodeId, name: &str, data: &[u8]) {
    let id = match fs.lookup(dir, name.as_bytes()) {
        Ok(id) => {
            let set = oleo::SetAttr {
                size: Some(0),
                ..Default::default()
            };
            fs.setattr(id, &set).expect("truncate");
            id
        }
        Err(_) => {
            fs.mknod(dir, name.as_bytes(), &NewInode::file(0o644))
                .expect("create")
                .id
        }
    };
    fs.write(id, 0, data).expect("write");
}

fn pattern(seed: u64, n: usize) -> Vec<u8> {
    common::tree_log::pattern(seed, n)
}

/// The kernel's random changes (`random_changes`) under `dir`, after giving it the
/// directories and files they start from if it lacks them.
fn kernel_changes(dir: &Path, seed: u64, ops: usize) {
    for d in ["a", "b", "a/c"] {
        std::fs::create_dir_all(dir.join(d)).expect("mkdir");
        for i in 0..3u64 {
            let f = dir.join(format!("{d}/f{i}"));
            if !f.exists() {
                std::fs::write(&f, pattern(seed + i, 20_000 + i as usize * 999)).expect("write");
            }
        }
    }
    random_changes(dir, seed, ops).expect("the kernel's random changes");
}

/// `btrfs subvolume list -u -q -R -a` as (id -> (path, uuid, parent uuid, received uuid)),
/// and the read-only ones (`-r`).
/// Subvolumes by id: (path, uuid, parent uuid); and the read-only ones.
type Listing = (BTreeMap<u64, (String, String, String)>, Vec<u64>);

fn kernel_list(mnt: &Path) -> Listing {
    let parse = |args: &[&str]| -> BTreeMap<u64, (String, String, String)> {
        let out = Command::new("btrfs")
            .args(["subvolume", "list"])
            .args(args)
            .arg(mnt)
            .output()
            .expect("btrfs subvolume list");
        assert!(out.status.success(), "btrfs subvolume list failed");
        let mut m = BTreeMap::new();
        for line in String::from_utf8_lossy(&out.stdout).lines() {
            let w: Vec<&str> = line.split_whitespace().collect();
            let field = |name: &str| {
                w.iter()
                    .position(|x| *x == name)
                    .and_then(|i| w.get(i + 1))
                    .map(|s| s.to_string())
                    .unwrap_or_default()
            };
            let id: u64 = field("ID").parse().expect("id");
            let path = w.last().map(|s| s.to_string()).unwrap_or_default();
            m.insert(id, (path, field("uuid"), field("parent_uuid")));
        }
        m
    };
    let all = parse(&["-u", "-q"]);
    let ro = parse(&["-r"]).into_keys().collect();
    (all, ro)
}

fn uuid_text(u: &[u8; 16]) -> String {
    if u.iter().all(|&b| b == 0) {
        return "-".into();
    }
    oleo::format::bytes::uuid_string(u)
}

/// oleo's list in the kernel's terms.
fn oleo_list(fs: &Filesystem) -> Listing {
    let mut all = BTreeMap::new();
    let mut ro = Vec::new();
    for s in fs.list_subvolumes().expect("list") {
        if s.id == 5 {
            continue;
        }
        let path = String::from_utf8_lossy(s.path.as_deref().unwrap_or(b"?")).into_owned();
        all.insert(s.id, (path, uuid_text(&s.uuid), uuid_text(&s.parent_uuid)));
        if s.readonly {
            ro.push(s.id);
        }
    }
    (all, ro)
}

fn kernel_view(image: &Path, tmp: &TempDir, what: &str) -> (TreeView, Listing) {
    let mnt = tmp.join("mnt");
    let m = KernelMount::mount(image, &mnt, &["ro", "noatime"])
        .unwrap_or_else(|e| panic!("kernel mount {what}: {e}"));
    let view = kernel_tree(m.path());
    let list = kernel_list(m.path());
    m.unmount().expect("umount");
    (view, list)
}

/// Subvolumes (nested too) and snapshots (read-only and writable, of the top level and of a
/// subvolume, of a snapshot) made by oleo between changes, as the kernel sees them.
#[test]
fn subvolumes_and_snapshots_are_the_kernels() {
    let Some((tmp, image)) = setup("oleo-subvol", 512) else {
        return;
    };
    // The kernel fills the top level (enough files for a tree of several levels).
    {
        let m = KernelMount::mount(&image, &tmp.join("mnt"), &["rw"]).expect("mount");
        kernel_changes(m.path(), 11, 1500);
        for i in 0..400 {
            std::fs::write(
                m.path().join(format!("f{i:04}")),
                pattern(i, 300 + i as usize * 7),
            )
            .expect("write");
        }
        m.unmount().expect("umount");
    }
    let fs = open_rw(&image);
    let top = fs.root();
    fs.create_subvolume(top, b"sub", 0, 0).expect("create sub");
    let sub = resolve(&fs, "sub");
    assert_eq!(sub.ino, 256, "a subvolume's root directory is inode 256");
    fs.mkdir(top, b"dir", &NewInode::dir(0o755)).expect("mkdir");
    fs.create_subvolume(resolve(&fs, "dir"), b"inner", 1000, 1000)
        .expect("create dir/inner");
    fs.create_subvolume(sub, b"nested", 0, 0)
        .expect("create sub/nested");
    for i in 0..50u64 {
        put_file(
            &fs,
            sub,
            &format!("s{i}"),
            &pattern(100 + i, 5000 + i as usize * 333),
        );
    }
    put_file(&fs, resolve(&fs, "sub/nested"), "deep", &pattern(7, 70_000));
    // Snapshots: the top level (read-only and writable), a subvolume, a snapshot.
    let before = pattern(1, 9000);
    put_file(&fs, top, "f0001", &before);
    fs.snapshot(5, top, b"snap-ro", true).expect("snapshot ro");
    fs.snapshot(5, resolve(&fs, "dir"), b"snap-rw", false)
        .expect("snapshot rw");
    let sub_id = sub.subvol;
    fs.snapshot(sub_id, top, b"sub-snap", false)
        .expect("snapshot of sub");
    // Both sides change after the snapshot; each keeps its own content.
    let after = pattern(2, 12_000);
    put_file(&fs, top, "f0001", &after);
    for i in 0..200u64 {
        put_file(
            &fs,
            top,
            &format!("f{:04}", 100 + i),
            &pattern(500 + i, 4000),
        );
    }
    let snap_rw = resolve(&fs, "dir/snap-rw");
    put_file(&fs, snap_rw, "f0002", &pattern(3, 8000));
    fs.unlink(snap_rw, b"f0003").expect("unlink in a snapshot");
    let sub_snap = resolve(&fs, "sub-snap");
    put_file(&fs, sub_snap, "s1", &pattern(4, 100));
    fs.snapshot(sub_snap.subvol, top, b"snap-of-snap", true)
        .expect("snapshot of a snapshot");
    put_file(&fs, sub_snap, "s2", &pattern(5, 100));
    let ro = resolve(&fs, "snap-ro");
    assert!(
        matches!(
            fs.mknod(ro, b"x", &NewInode::file(0o644)),
            Err(oleo::Error::ReadOnly)
        ),
        "a read-only snapshot refuses writes"
    );
    let id = fs.lookup(ro, b"f0001").expect("f0001 in the snapshot");
    assert_eq!(
        fs.read(id, 0, 1 << 20).expect("read"),
        before,
        "snapshot content"
    );
    let id = fs.lookup(top, b"f0001").expect("f0001");
    assert_eq!(
        fs.read(id, 0, 1 << 20).expect("read"),
        after,
        "source content"
    );
    fs.sync().expect("commit");
    let want = oleo_tree(&fs);
    let want_list = oleo_list(&fs);
    drop(fs);
    assert_btrfs_check(&image, "after oleo made subvolumes and snapshots");

    let (view, list) = kernel_view(&image, &tmp, "after oleo's snapshots");
    diff_trees("the kernel's view of oleo's subvolumes", &want, &view);
    assert_eq!(
        list, want_list,
        "btrfs subvolume list -u -q and -r against oleo's"
    );
    // A reopened oleo sees the same.
    let fs = open_ro(&image);
    diff_trees("oleo reopened", &want, &oleo_tree(&fs));
    drop(fs);

    // The kernel writes on both sides of every snapshot: its copy-on-write of the shared
    // blocks follows the references oleo wrote.
    {
        let m = KernelMount::mount(&image, &tmp.join("mnt"), &["rw"]).expect("mount rw");
        kernel_changes(m.path(), 12, 400);
        kernel_changes(&m.path().join("dir/snap-rw"), 13, 400);
        kernel_changes(&m.path().join("sub-snap"), 14, 200);
        sh(Command::new("btrfs")
            .args(["subvolume", "delete"])
            .arg(m.path().join("snap-of-snap")))
        .expect("kernel deletes an oleo snapshot");
        m.sync().expect("sync");
        m.unmount().expect("umount");
    }
    assert_btrfs_check(&image, "after the kernel wrote to oleo's snapshots");
    let (view, _) = kernel_view(&image, &tmp, "after the kernel's writes");
    let fs = open_ro(&image);
    diff_trees("oleo after the kernel's writes", &view, &oleo_tree(&fs));
}

/// Snapshots the kernel made, snapshotted again by oleo; oleo writes to all of them, then
/// deletes and drops the kernel's snapshot.
#[test]
fn snapshots_of_kernel_snapshots() {
    let Some((tmp, image)) = setup("oleo-ksnap", 256) else {
        return;
    };
    {
        let m = KernelMount::mount(&image, &tmp.join("mnt"), &["rw"]).expect("mount");
        sh(Command::new("btrfs")
            .args(["subvolume", "create"])
            .arg(m.path().join("vol")))
        .expect("create");
        kernel_changes(&m.path().join("vol"), 21, 800);
        sh(Command::new("btrfs")
            .args(["subvolume", "snapshot"])
            .arg(m.path().join("vol"))
            .arg(m.path().join("ksnap")))
        .expect("kernel snapshot");
        kernel_changes(&m.path().join("vol"), 22, 300);
        m.unmount().expect("umount");
    }
    let fs = open_rw(&image);
    let top = fs.root();
    let ksnap = resolve(&fs, "ksnap");
    fs.snapshot(ksnap.subvol, top, b"osnap", false)
        .expect("oleo snapshot of a kernel snapshot");
    let vol = resolve(&fs, "vol");
    fs.snapshot(vol.subvol, top, b"osnap-ro", true)
        .expect("oleo snapshot");
    for (i, dir) in ["vol", "ksnap", "osnap"].iter().enumerate() {
        let d = resolve(&fs, dir);
        for j in 0..30u64 {
            put_file(
                &fs,
                d,
                &format!("o{j}"),
                &pattern(i as u64 * 100 + j, 3000 + j as usize * 50),
            );
        }
    }
    fs.sync().expect("commit");
    let want = oleo_tree(&fs);
    drop(fs);
    assert_btrfs_check(&image, "after oleo snapshotted kernel snapshots");
    let (view, (list, ro)) = kernel_view(&image, &tmp, "after oleo's writes");
    diff_trees("the kernel's view", &want, &view);
    let osnap = list
        .values()
        .find(|(p, _, _)| p == "osnap")
        .expect("osnap listed");
    let ksnap_uuid = &list
        .values()
        .find(|(p, _, _)| p == "ksnap")
        .expect("ksnap")
        .1;
    assert_eq!(
        &osnap.2, ksnap_uuid,
        "a snapshot's parent uuid is its source's uuid"
    );
    assert_eq!(ro.len(), 1, "one read-only snapshot");
    // oleo deletes the kernel's snapshot (and one of its own) and drops them.
    let fs = open_rw(&image);
    let top = fs.root();
    fs.delete_subvolume(top, b"ksnap")
        .expect("delete the kernel's snapshot");
    fs.delete_subvolume(top, b"osnap-ro")
        .expect("delete oleo's");
    fs.clean_all().expect("drop them");
    let want = oleo_tree(&fs);
    drop(fs);
    assert_btrfs_check(&image, "after oleo dropped a kernel snapshot");
    let (view, (list, _)) = kernel_view(&image, &tmp, "after oleo's drops");
    diff_trees("the kernel after oleo dropped its snapshot", &want, &view);
    assert!(
        list.values()
            .all(|(p, _, _)| p != "ksnap" && p != "osnap-ro"),
        "{list:?}"
    );
}

fn kernel_out(cmd: &mut Command) -> String {
    let out = cmd.output().expect("run a btrfs command");
    assert!(
        out.status.success(),
        "{cmd:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `property set ro` by oleo: a snapshot made read-only and writable again, and a received
/// subvolume (from the kernel's send | receive) that stays read-only unless forced, which
/// clears its received uuid as btrfs-progs does.
#[test]
fn readonly_flag_as_the_kernel() {
    let Some((tmp, image)) = setup("oleo-ro", 256) else {
        return;
    };
    {
        let m = KernelMount::mount(&image, &tmp.join("mnt"), &["rw"]).expect("mount");
        let p = m.path();
        sh(Command::new("btrfs")
            .args(["subvolume", "create"])
            .arg(p.join("vol")))
        .expect("create");
        kernel_changes(&p.join("vol"), 31, 200);
        sh(Command::new("btrfs")
            .args(["subvolume", "snapshot", "-r"])
            .arg(p.join("vol"))
            .arg(p.join("vol-ro")))
        .expect("snapshot -r");
        std::fs::create_dir(p.join("recv")).expect("mkdir");
        send_receive(&[p.join("vol-ro").as_os_str()], &p.join("recv"));
        m.unmount().expect("umount");
    }
    let fs = open_rw(&image);
    let top = fs.root();
    fs.snapshot(resolve(&fs, "vol").subvol, top, b"snap", false)
        .expect("snapshot");
    let snap = resolve(&fs, "snap").subvol;
    fs.set_subvolume_readonly(snap, true, false)
        .expect("ro true");
    assert!(fs.subvolume_readonly(snap).expect("get"));
    assert!(matches!(
        fs.mknod(resolve(&fs, "snap"), b"x", &NewInode::file(0o644)),
        Err(oleo::Error::ReadOnly)
    ));
    let recv = resolve(&fs, "recv/vol-ro").subvol;
    assert!(
        fs.set_subvolume_readonly(recv, false, false).is_err(),
        "a received subvolume stays read-only unless forced"
    );
    fs.set_subvolume_readonly(recv, false, true)
        .expect("forced ro false");
    fs.mknod(
        resolve(&fs, "recv/vol-ro"),
        b"now-writable",
        &NewInode::file(0o644),
    )
    .expect("a write after ro false");
    fs.sync().expect("commit");
    drop(fs);
    assert_btrfs_check(&image, "after oleo changed read-only flags");
    let m = KernelMount::mount(&image, &tmp.join("mnt"), &["ro"]).expect("mount");
    let get = |p: &str| {
        kernel_out(
            Command::new("btrfs")
                .args(["property", "get"])
                .arg(m.path().join(p))
                .arg("ro"),
        )
    };
    assert_eq!(get("snap").trim(), "ro=true");
    assert_eq!(get("recv/vol-ro").trim(), "ro=false");
    assert_eq!(get("vol-ro").trim(), "ro=true");
    let show = kernel_out(
        Command::new("btrfs")
            .args(["subvolume", "show"])
            .arg(m.path().join("recv/vol-ro")),
    );
    let received = show
        .lines()
        .find(|l| l.trim_start().starts_with("Received UUID:"))
        .expect("Received UUID line");
    assert!(
        received.trim().ends_with('-'),
        "received uuid cleared: {received}"
    );
    assert!(m.path().join("recv/vol-ro/now-writable").exists());
}

/// `btrfs send | btrfs receive` runs a process pair and fails the test if either fails.
fn send_receive(args: &[&std::ffi::OsStr], into: &Path) {
    let mut send = Command::new("btrfs")
        .args(["send", "-q"])
        .args(args)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("btrfs send");
    let out = Command::new("btrfs")
        .args(["receive", "-q"])
        .arg(into)
        .stdin(send.stdout.take().expect("send's output"))
        .output()
        .expect("btrfs receive");
    assert!(
        out.status.success(),
        "btrfs receive {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        send.wait().expect("btrfs send").success(),
        "btrfs send {args:?} failed"
    );
}

/// The kernel's send of oleo's read-only snapshots, full and incremental (`-p`), received on
/// another kernel filesystem: the same files. Send trusts the uuids, parent uuids and
/// transids oleo wrote, and walks both trees' shared blocks.
#[test]
fn kernel_sends_oleo_snapshots() {
    let Some((tmp, image)) = setup("oleo-send", 256) else {
        return;
    };
    let other = tmp.join("other");
    oleo_testkit::image::empty_image(&other, 256, &[]).expect("mkfs.btrfs");
    {
        let m = KernelMount::mount(&image, &tmp.join("mnt"), &["rw"]).expect("mount");
        sh(Command::new("btrfs")
            .args(["subvolume", "create"])
            .arg(m.path().join("vol")))
        .expect("create");
        kernel_changes(&m.path().join("vol"), 41, 600);
        m.unmount().expect("umount");
    }
    let fs = open_rw(&image);
    let top = fs.root();
    let vol = resolve(&fs, "vol");
    put_file(&fs, vol, "gone", &pattern(76, 30_000));
    fs.snapshot(vol.subvol, top, b"s1", true)
        .expect("snapshot s1");
    for i in 0..40u64 {
        put_file(
            &fs,
            vol,
            &format!("new{i}"),
            &pattern(900 + i, 2000 + i as usize * 700),
        );
    }
    put_file(&fs, resolve(&fs, "vol/a"), "f0", &pattern(77, 50_000));
    fs.unlink(vol, b"gone").expect("unlink");
    fs.snapshot(vol.subvol, top, b"s2", true)
        .expect("snapshot s2");
    drop(fs);
    assert_btrfs_check(&image, "after oleo's snapshots for send");
    let m = KernelMount::mount(&image, &tmp.join("mnt"), &["ro"]).expect("mount");
    let o = KernelMount::mount(&other, &tmp.join("other-mnt"), &["rw"]).expect("mount other");
    send_receive(&[m.path().join("s1").as_os_str()], o.path());
    send_receive(
        &[
            std::ffi::OsStr::new("-p"),
            m.path().join("s1").as_os_str(),
            m.path().join("s2").as_os_str(),
        ],
        o.path(),
    );
    for s in ["s1", "s2"] {
        diff_trees(
            &format!("{s} received by the kernel"),
            &kernel_tree(&m.path().join(s)),
            &kernel_tree(&o.path().join(s)),
        );
    }
    o.unmount().expect("umount other");
    m.unmount().expect("umount");
}

/// Snapshots taken while threads keep writing to the subvolume (seed 004's workload in
/// small): each snapshot holds, of every file, exactly the writes that returned before it
/// was asked for, perhaps some that overlapped it, and none that began after it returned;
/// writers are never refused; `btrfs check` is clean and the kernel sees what oleo sees.
#[test]
fn snapshots_under_writers() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    const WRITERS: usize = 4;
    const SNAPSHOTS: usize = 6;
    const CHUNK: usize = 4096;
    const MAX_WRITES: u64 = 6000;
    let Some((tmp, image)) = setup("oleo-snapw", 512) else {
        return;
    };
    let fs = open_rw(&image);
    let top = fs.root();
    fs.create_subvolume(top, b"vol", 0, 0).expect("create");
    let vol = resolve(&fs, "vol");
    let files: Vec<InodeId> = (0..WRITERS)
        .map(|w| {
            fs.mknod(vol, format!("w{w}").as_bytes(), &NewInode::file(0o644))
                .expect("create")
                .id
        })
        .collect();
    // Write k of file w: chunk k filled with a byte naming (w, k).
    let chunk = |w: usize, k: u64| vec![(w as u8).wrapping_mul(61) ^ (k as u8) | 1; CHUNK];
    let done: Vec<AtomicU64> = (0..WRITERS).map(|_| AtomicU64::new(0)).collect();
    let stop = AtomicBool::new(false);
    let mut bounds = Vec::new();
    std::thread::scope(|s| {
        for (w, &id) in files.iter().enumerate() {
            let (fs, done, stop) = (&fs, &done[w], &stop);
            s.spawn(move || {
                let mut k = 0u64;
                // Paced and bounded: the image must not fill up.
                while !stop.load(Ordering::SeqCst) && k < MAX_WRITES {
                    fs.write(id, k * CHUNK as u64, &chunk(w, k))
                        .expect("a writer is never refused");
                    k += 1;
                    done.store(k, Ordering::SeqCst);
                    std::thread::sleep(std::time::Duration::from_micros(100));
                }
            });
        }
        for n in 0..SNAPSHOTS {
            std::thread::sleep(std::time::Duration::from_millis(150));
            let before: Vec<u64> = done.iter().map(|d| d.load(Ordering::SeqCst)).collect();
            fs.snapshot(vol.subvol, top, format!("snap{n}").as_bytes(), n % 2 == 0)
                .expect("snapshot under writers");
            let after: Vec<u64> = done.iter().map(|d| d.load(Ordering::SeqCst)).collect();
            bounds.push((before, after));
        }
        stop.store(true, Ordering::SeqCst);
    });
    eprintln!("writes done before and after each snapshot: {bounds:?}");
    // Each snapshot's files: a prefix of the writes, within the bounds.
    for (n, (before, after)) in bounds.iter().enumerate() {
        let snap = resolve(&fs, &format!("snap{n}"));
        for w in 0..WRITERS {
            let id = fs
                .lookup(snap, format!("w{w}").as_bytes())
                .expect("file in snapshot");
            let size = fs.getattr(id).expect("getattr").size;
            let data = fs.read(id, 0, size as u32).expect("read");
            let writes = size / CHUNK as u64;
            assert_eq!(
                size % CHUNK as u64,
                0,
                "snap{n}/w{w}: a whole number of writes"
            );
            for k in 0..writes {
                let at = (k as usize) * CHUNK;
                assert!(
                    data[at..at + CHUNK] == chunk(w, k)[..],
                    "snap{n}/w{w}: write {k} of {writes} is not what was written"
                );
            }
            assert!(
                writes >= before[w] && writes <= after[w] + 1,
                "snap{n}/w{w}: {writes} writes, but {} had returned before the snapshot \
                 and {} when it returned",
                before[w],
                after[w]
            );
        }
    }
    fs.sync().expect("commit");
    let want = oleo_tree(&fs);
    drop(fs);
    assert_btrfs_check(&image, "after snapshots under writers");
    let (view, _) = kernel_view(&image, &tmp, "after snapshots under writers");
    diff_trees(
        "the kernel's view of snapshots taken under writers",
        &want,
        &view,
    );
}

/// An operation that fails without changing anything (a name taken, a name missing) on a
/// path a snapshot shares: copying that path moved references in the extent tree, which
/// once made the operation look half-done and aborted the transaction (every change since
/// the last commit lost, the filesystem read-only). It must fail alone.
#[test]
fn refused_operations_on_shared_paths_keep_the_transaction() {
    let Some((tmp, image)) = setup("oleo-shared-fail", 256) else {
        return;
    };
    {
        let m = KernelMount::mount(&image, &tmp.join("mnt"), &["rw"]).expect("mount");
        // Files with extents (not inline) in a directory of their own: its names share
        // leaves with file extent items, whose copy moves data references.
        std::fs::create_dir(m.path().join("d")).expect("mkdir");
        for i in 0..300 {
            std::fs::write(m.path().join(format!("d/f{i:03}")), pattern(i, 5000)).expect("write");
        }
        sh(Command::new("btrfs")
            .args(["subvolume", "snapshot"])
            .arg(m.path())
            .arg(m.path().join("ksnap")))
        .expect("kernel snapshot");
        m.unmount().expect("umount");
    }
    let fs = open_rw(&image);
    let top = fs.root();
    put_file(&fs, top, "kept", b"written before the refusals");
    for (i, dir) in [resolve(&fs, "d"), resolve(&fs, "ksnap/d")]
        .into_iter()
        .enumerate()
    {
        assert!(matches!(
            fs.mknod(dir, b"f123", &NewInode::file(0o644)),
            Err(oleo::Error::AlreadyExists)
        ));
        assert!(matches!(
            fs.unlink(dir, b"no-such-name"),
            Err(oleo::Error::NotFound)
        ));
        put_file(&fs, dir, &format!("after{i}"), b"still writable");
    }
    fs.sync().expect("commit");
    drop(fs);
    assert_btrfs_check(&image, "after refused operations on shared paths");
    let fs = open_ro(&image);
    for p in ["kept", "d/after0", "ksnap/d/after1"] {
        resolve(&fs, p);
    }
}

/// `bytes_used` of the superblock, as btrfs-progs reads it.
fn bytes_used(image: &Path) -> u64 {
    let out = kernel_out(
        Command::new("btrfs")
            .args(["inspect-internal", "dump-super"])
            .arg(image),
    );
    out.lines()
        .find_map(|l| l.strip_prefix("bytes_used"))
        .and_then(|v| v.trim().parse().ok())
        .expect("bytes_used in dump-super")
}

/// Deletion by oleo: the entry, references and uuid items go, the tree waits as an orphan
/// (`btrfs check` accepts that state), refusals as the kernel's; then the kernel's cleaner
/// drops the trees at its next mount and the space comes back.
#[test]
fn deleted_subvolumes_are_dropped_by_the_kernel() {
    let Some((tmp, image)) = setup("oleo-delete", 512) else {
        return;
    };
    {
        let m = KernelMount::mount(&image, &tmp.join("mnt"), &["rw"]).expect("mount");
        kernel_changes(m.path(), 51, 300);
        m.unmount().expect("umount");
    }
    let empty = bytes_used(&image);
    let fs = open_rw(&image);
    let top = fs.root();
    fs.create_subvolume(top, b"vol", 0, 0).expect("create");
    let vol = resolve(&fs, "vol");
    for i in 0..100u64 {
        put_file(&fs, vol, &format!("f{i}"), &pattern(i, 20_000));
    }
    fs.create_subvolume(vol, b"nested", 0, 0).expect("nested");
    fs.snapshot(5, top, b"snap", true)
        .expect("snapshot of the top level");
    fs.snapshot(vol.subvol, top, b"vsnap", false)
        .expect("snapshot of vol");
    // Changes after the snapshots: the deleted trees share blocks with live ones.
    for i in 0..100u64 {
        put_file(&fs, vol, &format!("f{i}"), &pattern(500 + i, 7000));
    }
    assert!(
        matches!(fs.delete_subvolume(top, b"vol"), Err(oleo::Error::NotEmpty)),
        "a subvolume holding another is refused"
    );
    assert!(
        fs.delete_subvolume(top, b"a").is_err(),
        "a plain directory is not a subvolume"
    );
    let id = fs.delete_subvolume(vol, b"nested").expect("delete nested");
    assert!(fs.lookup(vol, b"nested").is_err());
    fs.delete_subvolume(top, b"vol").expect("delete vol");
    assert!(
        matches!(
            fs.mknod(vol, b"late", &NewInode::file(0o644)),
            Err(oleo::Error::ReadOnly)
        ),
        "a deleted subvolume takes no writes"
    );
    fs.delete_subvolume(top, b"snap")
        .expect("delete a read-only snapshot");
    assert!(fs
        .list_subvolumes()
        .expect("list")
        .iter()
        .all(|s| s.id != id));
    fs.sync().expect("commit");
    let want = oleo_tree(&fs);
    drop(fs);
    assert_btrfs_check(&image, "with oleo's deleted subvolumes not yet dropped");
    // The kernel lists them as deleted, drops them, and agrees on what is left.
    {
        let m = KernelMount::mount(&image, &tmp.join("mnt"), &["rw", "commit=1"]).expect("mount");
        diff_trees(
            "the kernel after oleo's deletions",
            &want,
            &kernel_tree(m.path()),
        );
        sh(Command::new("btrfs")
            .args(["subvolume", "sync"])
            .arg(m.path()))
        .expect("btrfs subvolume sync");
        let deleted = kernel_out(
            Command::new("btrfs")
                .args(["subvolume", "list", "-d"])
                .arg(m.path()),
        );
        assert!(deleted.trim().is_empty(), "still to drop: {deleted}");
        sh(Command::new("btrfs")
            .args(["subvolume", "delete"])
            .arg(m.path().join("vsnap")))
        .expect("the kernel deletes the last one");
        sh(Command::new("btrfs")
            .args(["subvolume", "sync"])
            .arg(m.path()))
        .expect("btrfs subvolume sync");
        m.sync().expect("sync");
        m.unmount().expect("umount");
    }
    assert_btrfs_check(&image, "after the kernel dropped oleo's deleted subvolumes");
    let back = bytes_used(&image);
    // What is left: the top level as before, plus what the commits of its changes wrote.
    assert!(
        back <= empty + (4 << 20),
        "space not back: {back} bytes used, {empty} before the subvolumes"
    );
}

/// set-default by oleo: the kernel (mounting without subvol=) and oleo open that subvolume,
/// `btrfs subvolume get-default` names it, the DEFAULT_SUBVOL bit is set; the default
/// cannot be deleted; back to the top level.
#[test]
fn default_subvolume_as_the_kernel() {
    let Some((tmp, image)) = setup("oleo-default", 256) else {
        return;
    };
    let fs = open_rw(&image);
    let top = fs.root();
    fs.create_subvolume(top, b"vol", 0, 0).expect("create");
    let vol = resolve(&fs, "vol");
    put_file(&fs, vol, "inside", b"in the default subvolume");
    fs.set_default_subvolume(vol.subvol).expect("set-default");
    assert_eq!(fs.default_subvolume().expect("default"), vol.subvol);
    assert!(
        fs.delete_subvolume(top, b"vol").is_err(),
        "the default subvolume cannot be deleted"
    );
    fs.sync().expect("commit");
    drop(fs);
    assert_btrfs_check(&image, "after set-default");
    let fs = Filesystem::open(&image, OpenOptions::default()).expect("open at the default");
    assert_eq!(
        fs.root().subvol,
        vol.subvol,
        "oleo opens the default subvolume"
    );
    drop(fs);
    {
        let m = KernelMount::mount(&image, &tmp.join("mnt"), &["ro"]).expect("mount");
        assert_eq!(
            std::fs::read(m.path().join("inside")).expect("the kernel mounts the default"),
            b"in the default subvolume"
        );
        let d = kernel_out(
            Command::new("btrfs")
                .args(["subvolume", "get-default"])
                .arg(m.path()),
        );
        assert!(
            d.contains(&format!("ID {} ", vol.subvol)) && d.trim_end().ends_with("path vol"),
            "{d}"
        );
        m.unmount().expect("umount");
    }
    let sb = kernel_out(
        Command::new("btrfs")
            .args(["inspect-internal", "dump-super"])
            .arg(&image),
    );
    assert!(
        sb.contains("DEFAULT_SUBVOL"),
        "incompat DEFAULT_SUBVOL:\n{sb}"
    );
    let fs = open_rw(&image);
    fs.set_default_subvolume(5).expect("back to the top level");
    fs.sync().expect("commit");
    drop(fs);
    let m = KernelMount::mount(&image, &tmp.join("mnt"), &["ro"]).expect("mount");
    assert!(
        m.path().join("vol/inside").exists(),
        "the top level is the default again"
    );
}

/// oleo's own cleaner: deleted subvolumes (sharing blocks with live ones, several levels
/// deep) are dropped step by step; stopped half-way (progress committed, the filesystem
/// closed), `btrfs check` accepts the state, a reopened filesystem resumes; at the end the
/// space is back and the kernel sees the live subvolumes unchanged.
#[test]
fn oleo_drops_deleted_subvolumes() {
    // 4 KiB nodes: three levels from a few thousand files.
    let Some((tmp, image)) = setup_with("oleo-drop", 1024, &["--nodesize", "4096"]) else {
        return;
    };
    let before = bytes_used(&image);
    let fs = open_rw(&image);
    let top = fs.root();
    fs.create_subvolume(top, b"vol", 0, 0).expect("create");
    let vol = resolve(&fs, "vol");
    for i in 0..3000u64 {
        put_file(
            &fs,
            vol,
            &format!("file-{i:05}"),
            &pattern(i, 3000 + (i % 7) as usize * 1000),
        );
    }
    fs.snapshot(vol.subvol, top, b"snap", false)
        .expect("snapshot");
    // Both change after the snapshot: some blocks stay shared, some are copied.
    for i in (0..3000u64).step_by(7) {
        put_file(&fs, vol, &format!("file-{i:05}"), &pattern(9000 + i, 5000));
    }
    let snap = resolve(&fs, "snap");
    for i in (0..3000u64).step_by(11) {
        put_file(&fs, snap, &format!("file-{i:05}"), &pattern(7000 + i, 6000));
    }
    fs.sync().expect("commit");
    let live_before = oleo_tree(&fs);
    fs.delete_subvolume(top, b"vol").expect("delete vol");
    fs.sync().expect("commit the deletion");
    let root = kernel_out(
        Command::new("btrfs")
            .args(["inspect-internal", "dump-tree", "-t", "256"])
            .arg(&image),
    );
    let first = root
        .lines()
        .find(|l| l.starts_with("node") || l.starts_with("leaf"))
        .unwrap_or_default();
    assert!(first.contains("level 2"), "a three-level tree: {first}");
    // A few steps, then stop as an unmount would.
    for _ in 0..3 {
        assert!(
            fs.clean_step().expect("clean step"),
            "there is something to drop"
        );
    }
    fs.sync().expect("commit the progress");
    drop(fs);
    assert_btrfs_check(&image, "with a subvolume dropped half-way");
    let fs = open_rw(&image);
    fs.clean_all().expect("drop the rest");
    assert!(
        !fs.clean_step().expect("nothing left"),
        "nothing left to drop"
    );
    // The snapshot lives on, as it was.
    let snap = resolve(&fs, "snap");
    for i in (0..3000u64).step_by(11) {
        let id = fs
            .lookup(snap, format!("file-{i:05}").as_bytes())
            .expect("file");
        assert_eq!(
            fs.read(id, 0, 1 << 20).expect("read"),
            pattern(7000 + i, 6000)
        );
    }
    fs.delete_subvolume(top, b"snap").expect("delete snap");
    fs.clean_all().expect("drop snap");
    let want = oleo_tree(&fs);
    drop(fs);
    assert_btrfs_check(&image, "after oleo dropped both");
    let after = bytes_used(&image);
    assert!(
        after <= before + (2 << 20),
        "space not back: {after} bytes used, {before} before the subvolumes"
    );
    let (view, (list, _)) = kernel_view(&image, &tmp, "after oleo's drops");
    diff_trees("the kernel after oleo's drops", &want, &view);
    assert!(list.is_empty(), "no subvolume left: {list:?}");
    let _ = live_before;
}

/// Crash states while the cleaner drops a tree (its steps committed one by one, the write
/// and flush stream recorded): at every crash point `btrfs check` is clean, a reopened
/// filesystem resumes and finishes the drop (clean again), and the snapshot that shared
/// the tree's blocks keeps its files.
#[test]
fn crash_states_during_a_drop() {
    use common::crash::{crash_image, sparse_copy};
    use oleo::device::IoEvent;
    // 16 KiB nodes: a two-level tree, one step per leaf, dozens of committed steps.
    let Some((tmp, image)) = setup("oleo-drop-crash", 512) else {
        return;
    };
    let fs = open_rw(&image);
    let top = fs.root();
    fs.create_subvolume(top, b"vol", 0, 0).expect("create");
    let vol = resolve(&fs, "vol");
    for i in 0..2000u64 {
        put_file(&fs, vol, &format!("f{i:05}"), &pattern(i, 3000));
    }
    fs.snapshot(vol.subvol, top, b"snap", false)
        .expect("snapshot");
    for i in (0..2000u64).step_by(5) {
        put_file(&fs, vol, &format!("f{i:05}"), &pattern(5000 + i, 4000));
    }
    fs.delete_subvolume(top, b"vol").expect("delete");
    fs.sync().expect("commit");
    drop(fs);
    let base = tmp.join("base");
    sparse_copy(&image, &base);
    let fs = open_rw(&image);
    fs.start_io_recording();
    let mut steps = 0;
    while fs.clean_step().expect("step") {
        fs.sync().expect("commit the step");
        steps += 1;
    }
    fs.sync().expect("commit");
    let events = fs.take_io_recording();
    drop(fs);
    assert!(steps > 10, "the drop took {steps} steps");
    let mut rng = oleo_testkit::ops::Rng::new(oleo_testkit::seed(7));
    let mut cuts: Vec<usize> = events
        .iter()
        .enumerate()
        .filter(|(_, e)| **e == IoEvent::Flush)
        .flat_map(|(i, _)| [i, i + 1])
        .collect();
    for _ in 0..10 {
        cuts.push(rng.below(events.len() as u64 + 1) as usize);
    }
    cuts.sort();
    cuts.dedup();
    let step = (cuts.len() / 24).max(1);
    let crash = tmp.join("crash");
    eprintln!(
        "{steps} steps, {} events, {} crash points",
        events.len(),
        cuts.iter().step_by(step).count()
    );
    for &n in cuts.iter().step_by(step) {
        crash_image(&base, &crash, &events, n, &mut rng);
        assert_btrfs_check(
            &crash,
            &format!("a crash after {n} of {} events", events.len()),
        );
        let fs = open_rw(&crash);
        fs.clean_all().expect("the drop resumes and finishes");
        let snap = resolve(&fs, "snap");
        for i in (0..2000u64).step_by(97) {
            let id = fs
                .lookup(snap, format!("f{i:05}").as_bytes())
                .expect("file");
            assert_eq!(fs.read(id, 0, 1 << 20).expect("read"), pattern(i, 3000));
        }
        drop(fs);
        assert_btrfs_check(&crash, &format!("the drop finished after a crash at {n}"));
    }
}

/// A deleted tree that turns out damaged: the cleaner's step fails (the filesystem turns
/// read-only, as the kernel's does), but changes others made before it are not lost: the
/// step runs between two commits of its own.
#[test]
fn a_damaged_dead_tree_costs_no_other_change() {
    use std::os::unix::fs::FileExt;
    let Some((_tmp, image)) = setup("oleo-drop-damaged", 256) else {
        return;
    };
    let fs = open_rw(&image);
    let top = fs.root();
    fs.create_subvolume(top, b"vol", 0, 0).expect("create");
    let vol = resolve(&fs, "vol");
    for i in 0..800u64 {
        put_file(&fs, vol, &format!("f{i:04}"), &pattern(i, 3000));
    }
    fs.delete_subvolume(top, b"vol").expect("delete");
    fs.sync().expect("commit");
    drop(fs);
    // Damage every copy of the dead tree's last leaf.
    let dump = kernel_out(
        Command::new("btrfs")
            .args(["inspect-internal", "dump-tree", "-t", "256"])
            .arg(&image),
    );
    let leaf: u64 = dump
        .lines()
        .rfind(|l| l.starts_with("leaf "))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .expect("a leaf of the dead tree");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&image)
        .expect("open image");
    for at in common::tree_log::physical_copies(&image, leaf) {
        f.write_all_at(&[0x5a; 64], at + 200).expect("damage");
    }
    drop(f);
    let fs = open_rw(&image);
    put_file(&fs, top, "precious", b"written before the cleaner ran");
    assert!(fs.clean_all().is_err(), "the damaged leaf stops the drop");
    drop(fs);
    let fs = open_ro(&image);
    let id = resolve(&fs, "precious");
    assert_eq!(
        fs.read(id, 0, 100).expect("read"),
        b"written before the cleaner ran"
    );
}

/// A subvolume's ROOT_ITEM ctransid, as btrfs-progs reads it from the image.
fn ctransid(image: &Path, id: u64) -> u64 {
    let out = kernel_out(
        Command::new("btrfs")
            .args(["inspect-internal", "dump-tree", "-t", "1"])
            .arg(image),
    );
    let head = format!("({id} ROOT_ITEM ");
    let item = out
        .split("\titem ")
        .find(|i| i.contains(&head))
        .unwrap_or_else(|| panic!("no ROOT_ITEM of {id} in:\n{out}"));
    let at = item.find("ctransid ").expect("ctransid printed") + "ctransid ".len();
    item[at..]
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .expect("a number after ctransid")
}

/// ctransid moves when an inode of the subvolume changes, never because the subvolume was
/// snapshotted (the kernel's btrfs_update_root_times): send streams name a parent by its
/// ctransid, and receive looks it up by it.
#[test]
fn a_snapshot_leaves_its_sources_ctransid() {
    let Some((_tmp, image)) = setup("ctransid", 256) else {
        return;
    };
    let fs = open_rw(&image);
    let top = resolve(&fs, "");
    let sub = fs.create_subvolume(top, b"sub", 0, 0).expect("create sub");
    let sub_dir = InodeId {
        subvol: sub,
        ino: 256,
    };
    put_file(&fs, sub_dir, "f", &pattern(1, 10_000));
    fs.sync().expect("sync");
    fs.snapshot(sub, top, b"snap1", true).expect("snapshot");
    fs.sync().expect("sync");
    drop(fs);
    let before = ctransid(&image, sub);
    let fs = open_rw(&image);
    let top = resolve(&fs, "");
    fs.snapshot(sub, top, b"snap2", true).expect("snapshot");
    fs.sync().expect("sync");
    drop(fs);
    assert_eq!(
        ctransid(&image, sub),
        before,
        "a snapshot moved its source's ctransid"
    );
    let fs = open_rw(&image);
    put_file(&fs, sub_dir, "g", b"new");
    fs.sync().expect("sync");
    drop(fs);
    assert!(
        ctransid(&image, sub) > before,
        "a new file did not move ctransid"
    );
}

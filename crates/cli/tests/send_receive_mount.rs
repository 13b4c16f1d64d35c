//! `oleo send MNT/SNAPSHOT` and `oleo receive MNT/DIR` on a mounted oleo filesystem, where
//! the mount's server does the work. A send through the mount is byte for byte the stream
//! `oleo send --image` makes of the unmounted image, and the kernel's `btrfs receive` of it
//! gives the kernel's snapshot. Streams the kernel made (full, then incremental) received
//! through the mount show at once, read-only, and after unmount the kernel sees the same
//! trees with the sent uuids as received uuids, and `btrfs check` is clean. Refused: a path
//! not on an oleo mount, a writable snapshot, a read-only mount. On a terminal a progress
//! line is drawn; elsewhere stderr stays empty.
//!
//! Needs root, loop devices, kernel btrfs, btrfs-progs, setfattr, FUSE and script(1) (a
//! skip elsewhere, a failure under CI=true).

use oleo_testkit::cmd::{btrfs_in, require_tools, sh_ok, subvolume_show_field};
use oleo_testkit::{
    btrfs_check, empty_image, require_fuse, KernelMount, Manifest, OleoMount, TempDir,
};
use std::path::{Path, PathBuf};
use std::process::{Command as Cmd, Output, Stdio};

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");

/// Every kind of inode, holes, xattrs, hard links, odd names, owners, modes and times.
const POPULATE: &str = r#"
set -e
printf 'hello' > inline
: > empty
head -c 300000 /dev/urandom > data
head -c 2000000 /dev/urandom > big
ln data hard1
mkdir -p links/deeper && ln data links/deeper/hard2
setfattr -n user.a -v hello data
setfattr -n trusted.t -v 'new
line' data
truncate -s 8M sparse
printf x | dd of=sparse bs=1 seek=4194304 conv=notrunc status=none
ln -s target-does-not-exist sym
mkfifo fifo
mknod cdev c 1 3
mkdir odd
touch "odd/with space" "odd/$(printf 'new\nline')" "odd/$(printf 'latin\351\377')"
mkdir -p deep/a/b && printf deep > deep/a/b/f
chown 1000:2000 inline
chown -h 7:8 sym
chmod 4755 big
touch -d '@1000000000.5' big
touch -h -d '@999999999' sym
"#;

/// What changes between the two snapshots.
const CHANGE: &str = r#"
set -e
mv "odd/with space" "odd/renamed"
rm data
echo appended >> inline
truncate -s 1000 big
mv deep/a/b deep/b_moved
printf 'OVER' | dd of=hard1 bs=1 seek=5000 conv=notrunc status=none
setfattr -n user.b -v new hard1
mkdir newdir && printf new > newdir/f
"#;

fn oleo(args: &[&str]) -> Output {
    Cmd::new(OLEO)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn oleo_ok(args: &[&str]) -> Output {
    let o = oleo(args);
    assert!(
        o.status.success(),
        "oleo {args:?}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    o
}

fn oleo_fails(args: &[&str], says: &str) {
    let o = oleo(args);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "oleo {args:?} succeeded");
    assert!(
        err.contains(says),
        "oleo {args:?} says {err:?}, not {says:?}"
    );
}

fn s(p: &Path) -> String {
    p.display().to_string()
}

fn assert_same(want: &Manifest, root: &Path, how: &str) {
    let got = Manifest::capture(root).unwrap();
    let d = want.sent_differences(&got);
    assert!(d.is_empty(), "{how}:\n{}", d.join("\n"));
}

/// The kernel's image: `vol` (writable), `snap1` and `snap2` read-only snapshots of it
/// before and after CHANGE; streams of both (full, incremental); their uuids and trees.
struct Source {
    image: PathBuf,
    full: PathBuf,
    inc: PathBuf,
    snaps: Vec<(String, Manifest)>,
}

fn make_source(dir: &TempDir) -> Source {
    let image = dir.join("source.img");
    empty_image(&image, 512, &[]).unwrap();
    let k = KernelMount::mount(&image, &dir.join("source"), &["rw", "noatime"]).unwrap();
    let m = k.path().to_path_buf();
    btrfs_in(&["subvolume", "create", "vol"], &m);
    sh_ok(&m.join("vol"), POPULATE);
    btrfs_in(&["subvolume", "snapshot", "-r", "vol", "snap1"], &m);
    sh_ok(&m.join("vol"), CHANGE);
    btrfs_in(&["subvolume", "snapshot", "-r", "vol", "snap2"], &m);
    let (full, inc) = (dir.join("full.stream"), dir.join("inc.stream"));
    btrfs_in(&["send", "-q", "-f", &s(&full), "snap1"], &m);
    btrfs_in(&["send", "-q", "-f", &s(&inc), "-p", "snap1", "snap2"], &m);
    let snaps = ["snap1", "snap2"]
        .iter()
        .map(|n| {
            (
                subvolume_show_field(&m, n, "UUID"),
                Manifest::capture(&m.join(n)).unwrap(),
            )
        })
        .collect();
    k.unmount().unwrap();
    Source {
        image,
        full,
        inc,
        snaps,
    }
}

fn tools(what: &str) -> bool {
    require_tools(
        what,
        &["btrfs", "setfattr", "mknod", "mkfifo", "script", "setpriv"],
        "btrfs-progs attr util-linux",
    ) && require_fuse(what)
}

fn check_clean(image: &Path, when: &str) {
    for csum in [false, true] {
        if let Err(text) = btrfs_check(image, csum) {
            panic!("btrfs check (data csum {csum}) after {when}:\n{text}");
        }
    }
}

#[test]
fn send_on_a_mount_is_the_send_of_the_image() {
    let what = "send_on_a_mount_is_the_send_of_the_image";
    if !tools(what) {
        return;
    }
    let dir = TempDir::new("send-mount").unwrap();
    let src = make_source(&dir);
    let mnt = dir.join("mnt");
    let m = OleoMount::mount_rw(Path::new(OLEO), &src.image, &mnt, &[]).unwrap();
    let top = m.path().to_path_buf();
    let via_mount = dir.join("mount.stream");
    for proto in ["1", "2"] {
        let f = dir.join(format!("mount.v{proto}"));
        let o = oleo_ok(&[
            "send",
            "--proto",
            proto,
            "-f",
            &s(&f),
            &s(&top.join("snap1")),
        ]);
        assert!(o.stderr.is_empty(), "stderr: {:?}", o.stderr);
    }
    std::fs::copy(dir.join("mount.v1"), &via_mount).unwrap();
    // To standard output too, as a pipe gets it.
    let o = oleo_ok(&["send", &s(&top.join("snap2"))]);
    assert!(o.stderr.is_empty(), "stderr: {:?}", o.stderr);
    let snap2_stdout = o.stdout;

    // Refused: writable, not a subvolume, not on an oleo mount. No stream file is left.
    let nofile = dir.join("refused.stream");
    oleo_fails(
        &["send", "-f", &s(&nofile), &s(&top.join("vol"))],
        "is not read-only",
    );
    oleo_fails(
        &["send", "-f", &s(&nofile), &s(&top.join("snap1/deep"))],
        "Not a Btrfs subvolume",
    );
    oleo_fails(&["send", "-f", &s(&nofile), &s(&dir.join("."))], "--image");
    assert!(!nofile.exists(), "a refused send left {}", nofile.display());
    // Another user may read the mount, not send its subvolumes.
    let o = Cmd::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            OLEO,
            "send",
        ])
        .args(["-f", "/dev/null", &s(&top.join("snap1"))])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("need root"),
        "another user's send: {err}"
    );

    // While a send waits on a slow reader, the snapshot can be neither deleted nor made
    // writable; the stream is whole all the same.
    let slow = dir.join("slow.stream");
    let line = format!(
        "'{OLEO}' send '{}' | {{ sleep 3; cat > '{}'; }}",
        s(&top.join("snap1")),
        s(&slow)
    );
    let mut sender = Cmd::new("sh").args(["-c", &line]).spawn().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1000));
    let snap1 = s(&top.join("snap1"));
    let del = oleo(&["subvolume", "delete", &snap1]);
    let busy = |o: &Output| String::from_utf8_lossy(&o.stderr).contains("not permitted");
    assert!(
        !del.status.success() && busy(&del),
        "snap1 was deleted during its send: {del:?}"
    );
    let rw = oleo(&["property", "set", &snap1, "ro", "false"]);
    assert!(
        !rw.status.success(),
        "snap1 was made writable during its send"
    );
    assert!(sender.wait().unwrap().success(), "the slow send failed");
    assert!(
        std::fs::read(&slow).unwrap() == std::fs::read(&via_mount).unwrap(),
        "the slow send's stream differs"
    );
    // Ctrl-C while the server waits on a reader that does not read: the command ends (the
    // server is not left holding it), its FIFO goes, and the snapshot is free again.
    let tmp = dir.subdir("tmp").unwrap();
    let mut stuck = Cmd::new(OLEO)
        .args(["send", &snap1])
        .env("TMPDIR", &tmp)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1000));
    // SAFETY: kill with a valid signal, to our own child.
    unsafe { libc::kill(stuck.id() as i32, libc::SIGINT) };
    let mut ended = None;
    for _ in 0..100 {
        ended = stuck.try_wait().unwrap();
        if ended.is_some() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    if ended.is_none() {
        stuck.kill().unwrap();
        panic!("oleo send did not end on SIGINT");
    }
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    // Once sent, it may go writable again.
    oleo_ok(&["property", "set", &snap1, "ro", "false"]);
    oleo_ok(&["property", "set", &snap1, "ro", "true"]);
    m.unmount().unwrap();

    // Byte for byte what the unmounted image sends.
    for (proto, snap, got) in [
        ("1", "/snap1", std::fs::read(dir.join("mount.v1")).unwrap()),
        ("2", "/snap1", std::fs::read(dir.join("mount.v2")).unwrap()),
        ("1", "/snap2", snap2_stdout),
    ] {
        let f = dir.join("image.stream");
        oleo_ok(&[
            "send",
            "--image",
            &s(&src.image),
            "--proto",
            proto,
            "-f",
            &s(&f),
            snap,
        ]);
        let want = std::fs::read(&f).unwrap();
        assert!(want.len() > 200_000, "{snap}: a {} byte stream", want.len());
        assert!(got == want, "{snap} v{proto}: the mount's stream differs");
    }

    // The kernel receives the snapshot from it.
    let dst = dir.join("kernel.img");
    empty_image(&dst, 512, &[]).unwrap();
    let k = KernelMount::mount(&dst, &dir.join("kdst"), &["noatime"]).unwrap();
    btrfs_in(&["receive", "-f", &s(&via_mount), &s(k.path())], k.path());
    assert_same(
        &src.snaps[0].1,
        &k.path().join("snap1"),
        "the kernel's receive of the mount's stream",
    );
    k.unmount().unwrap();
}

#[test]
fn receive_on_a_mount_shows_at_once_and_on_disk() {
    let what = "receive_on_a_mount_shows_at_once_and_on_disk";
    if !tools(what) {
        return;
    }
    let dir = TempDir::new("receive-mount").unwrap();
    let src = make_source(&dir);
    let img = dir.join("dest.img");
    empty_image(&img, 512, &[]).unwrap();
    let mnt = dir.join("mnt");
    let m = OleoMount::mount_rw(Path::new(OLEO), &img, &mnt, &[]).unwrap();
    let top = m.path().to_path_buf();
    let inbox = top.join("inbox");
    std::fs::create_dir(&inbox).unwrap();
    // The kernel has looked: it knows the names are absent and the directory empty.
    for n in ["snap1", "snap2"] {
        assert!(!inbox.join(n).exists());
    }
    assert_eq!(std::fs::read_dir(&inbox).unwrap().count(), 0);

    for (i, stream) in [&src.full, &src.inc].into_iter().enumerate() {
        let name = format!("snap{}", i + 1);
        let o = oleo_ok(&["receive", "-f", &s(stream), &s(&inbox)]);
        // btrfs receive's lines: "At subvol" on stderr, "At snapshot" on stdout.
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr),
        );
        if i == 0 {
            assert_eq!(err, "At subvol snap1\n");
        } else {
            assert_eq!(out, "At snapshot snap2\n");
        }
        let listed: Vec<_> = std::fs::read_dir(&inbox)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(listed.contains(&name), "{name} not listed: {listed:?}");
        assert_same(
            &src.snaps[i].1,
            &inbox.join(&name),
            &format!("{name} through the mount right after the receive"),
        );
        let e = std::fs::write(inbox.join(&name).join("new"), b"x").unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EROFS), "{name} is writable");
    }
    // A stream cut short: an error, and the mount goes on.
    let cut = dir.join("cut.stream");
    let full = std::fs::read(&src.full).unwrap();
    std::fs::write(&cut, &full[..full.len() / 2]).unwrap();
    let other = top.join("other");
    std::fs::create_dir(&other).unwrap();
    let o = oleo(&["receive", "-q", "-f", &s(&cut), &s(&other)]);
    assert!(!o.status.success(), "a cut stream was received");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("cut.stream"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    oleo_fails(
        &["receive", "-f", &s(&src.full), &s(&dir.join("."))],
        "--image",
    );
    m.unmount().unwrap();

    check_clean(&img, "receives through the mount");
    let k = KernelMount::mount(&img, &dir.join("kcheck"), &["ro"]).unwrap();
    for (i, (uuid, want)) in src.snaps.iter().enumerate() {
        let name = format!("inbox/snap{}", i + 1);
        assert_same(
            want,
            &k.path().join(&name),
            &format!("{name}, kernel mount"),
        );
        assert_eq!(
            &subvolume_show_field(k.path(), &name, "Received UUID"),
            uuid
        );
        assert!(subvolume_show_field(k.path(), &name, "Flags").contains("readonly"));
    }
    k.unmount().unwrap();

    // A read-only mount refuses before reading anything.
    let ro = OleoMount::mount(Path::new(OLEO), &img, &mnt, &[]).unwrap();
    oleo_fails(
        &["receive", "-f", &s(&src.full), &s(&ro.path().join("inbox"))],
        "read-only",
    );
    ro.unmount().unwrap();
}

/// `oleo ARGS` with `stream` fed to its standard input in two parts a second apart (the
/// meter redraws only as bytes flow), under a pseudo-terminal when `tty`; what it wrote to
/// the terminal, or its stderr.
fn slow_receive(args: &str, stream: &Path, tty: bool) -> (bool, Vec<u8>) {
    let f = s(stream);
    let feed = format!("{{ head -c 1000 '{f}'; sleep 1; tail -c +1001 '{f}'; }}");
    let o = if tty {
        let line = format!("{feed} | '{OLEO}' {args}");
        Cmd::new("script")
            .args(["-qec", &line, "/dev/null"])
            .stdin(Stdio::null())
            .output()
            .unwrap()
    } else {
        Cmd::new("sh")
            .args(["-c", &format!("{feed} | '{OLEO}' {args}")])
            .output()
            .unwrap()
    };
    (o.status.success(), if tty { o.stdout } else { o.stderr })
}

#[test]
fn progress_shows_on_a_terminal_only() {
    let what = "progress_shows_on_a_terminal_only";
    if !tools(what) {
        return;
    }
    let dir = TempDir::new("stream-progress").unwrap();
    let src = make_source(&dir);
    let img = dir.join("dest.img");
    empty_image(&img, 512, &[]).unwrap();
    let mnt = dir.join("mnt");
    let m = OleoMount::mount_rw(Path::new(OLEO), &img, &mnt, &[]).unwrap();
    for (i, tty) in [true, false].into_iter().enumerate() {
        let into = m.path().join(format!("d{i}"));
        std::fs::create_dir(&into).unwrap();
        let (ok, said) = slow_receive(&format!("receive '{}'", s(&into)), &src.full, tty);
        let text = String::from_utf8_lossy(&said);
        assert!(ok, "receive (tty {tty}): {text}");
        if tty {
            drawn_and_cleared(&text);
        } else {
            assert_eq!(text, "At subvol snap1\n", "stderr without a terminal");
        }
        assert_same(
            &src.snaps[0].1,
            &into.join("snap1"),
            "snap1 received with a meter",
        );
    }
    m.unmount().unwrap();
    // The image form draws the same.
    let img2 = dir.join("dest2.img");
    empty_image(&img2, 512, &[]).unwrap();
    let (ok, said) = slow_receive(
        &format!("receive --image '{}' /", s(&img2)),
        &src.full,
        true,
    );
    let text = String::from_utf8_lossy(&said);
    assert!(ok, "{text}");
    drawn_and_cleared(&text);
    // -q: no line at all.
    let img3 = dir.join("dest3.img");
    empty_image(&img3, 512, &[]).unwrap();
    let (ok, said) = slow_receive(
        &format!("receive -q --image '{}' /", s(&img3)),
        &src.full,
        true,
    );
    assert!(
        ok && said.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&said)
    );
}

/// A progress line (a size and a rate, drawn over itself with \r) was drawn, and taken
/// away after its last drawing.
fn drawn_and_cleared(text: &str) {
    let last = text
        .rfind("B/s")
        .unwrap_or_else(|| panic!("no progress line: {text:?}"));
    assert!(text.contains("\r"), "{text:?}");
    assert!(text[last..].contains("\r\x1b[K"), "not cleared: {text:?}");
}

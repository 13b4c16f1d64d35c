//! `oleo receive --dump` against `btrfs receive --dump`: streams the kernel made (`btrfs
//! send`, full and incremental, protocol 1 and protocol 2 with compressed data) of a
//! varied tree must print exactly what btrfs-progs prints; written again by oleo's
//! `StreamWriter` they must be the same bytes; damaged ones must be refused with the byte
//! offset and the command, never a panic.
//!
//! Needs root, loop devices, kernel btrfs, btrfs-progs and setfattr (a skip elsewhere, a
//! failure under CI=true).

use oleo_format::send_stream::{crc32c_raw, Command, StreamReader, StreamWriter};
use oleo_testkit::cmd::{btrfs_in, require_tools, sh_ok};
use oleo_testkit::{empty_image, KernelMount, TempDir};
use std::path::{Path, PathBuf};
use std::process::{Command as Cmd, Output};

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");

/// The first version of the tree: every kind of inode, odd names, xattrs, holes,
/// preallocation, inline and compressed data, reflinks.
const POPULATE: &str = r#"
set -e
printf 'hello' > inline
head -c 300000 /dev/urandom > data
ln data hard1
mkdir -p links && ln data links/hard2
setfattr -n user.a -v hello data
setfattr -n user.bin -v 0x00ff10 data
setfattr -n user.pct -v '%s %n' data
setfattr -n trusted.t -v 'new
line' data
setfattr -n security.capability -v 0x0100000200040000000000000000000000000000 data
setfacl -m u:1234:rw data
truncate -s 8M sparse
printf x | dd of=sparse bs=1 seek=4194304 conv=notrunc status=none
fallocate -l 1M prealloc
printf abc | dd of=prealloc conv=notrunc status=none
fallocate -n -o 4M -l 1M prealloc
head -c 200000 /dev/urandom > random2
ln -s target-does-not-exist sym
ln -s /an/absolute/target abs_sym
ln -s "$(printf 'odd target\nwith newline')" odd_sym
mkfifo fifo
mknod cdev c 1 3
mknod bdev b 7 250
mkdir odd
touch "odd/with space" "odd/$(printf 'new\nline')" "odd/$(printf 'back\\slash')" \
      "odd/$(printf 'latin\351\377')" "odd/$(printf 'tab\there')" \
      "odd/$(printf 'bell\007esc\033')" "odd/pct%s%n" "odd/quote'\"" \
      "odd/a_rather_long_file_name_that_exceeds_the_column"
mkdir comp
setfattr -n btrfs.compression -v zstd comp
yes 'oleo send stream test line' | head -c 3000000 > comp/text
yes x | head -c 2000 > comp/small
cp --reflink=always data reflinked
cp --reflink=always comp/text comp/text_ref
mkdir -p deep/a/b/c && printf deep > deep/a/b/c/f
mkdir swapA swapB rmme
printf A > swapA/f
printf B > swapB/f
printf 1 > rmme/one && printf 2 > rmme/two
chown 1000:2000 inline
chmod 4755 random2
mkdir sticky && chmod 1777 sticky
setfacl -d -m u:1234:rx sticky
touch -d '@1000000000.5' random2
touch -h -d '@999999999' sym
"#;

/// The changes between the two snapshots.
const CHANGE: &str = r#"
set -e
mv "odd/with space" "odd/with  two  spaces"
mv "odd/$(printf 'new\nline')" top_newline
rm data
mv deep/a/b deep/b_moved
mv deep elsewhere
mv swapA tmpx && mv swapB swapA && mv tmpx swapB
rm -r rmme
printf 'OVERWRITE' | dd of=reflinked bs=1 seek=5000 conv=notrunc status=none
truncate -s 1000 random2
truncate -s 16M sparse
fallocate -p -o 8192 -l 65536 reflinked
setfattr -x user.a hard1
setfattr -n user.b -v changed hard1
chmod 640 inline
chown 3:4 inline
echo appended >> inline
cp --reflink=always comp/text comp/text_clone
yes more | head -c 500000 >> comp/text
ln -sf newtarget sym
rm fifo && mkfifo fifo2
fallocate -o 2M -l 1M prealloc
touch -d '@1234567890' odd/*
"#;

/// Makes the image and the streams; returns their paths by name. The kernel mount is gone
/// when it returns (and on any panic, by the guards).
fn make_streams(dir: &TempDir) -> Vec<(String, PathBuf)> {
    let img = dir.join("img");
    empty_image(&img, 512, &[]).unwrap();
    let k = KernelMount::mount(&img, &dir.join("mnt"), &["rw", "noatime"]).unwrap();
    let m = k.path().to_path_buf();
    btrfs_in(&["subvolume", "create", "vol"], &m);
    let vol = m.join("vol");
    sh_ok(&vol, POPULATE);
    let sock = std::os::unix::net::UnixListener::bind(vol.join("sock")).unwrap();
    drop(sock);
    btrfs_in(&["subvolume", "snapshot", "-r", "vol", "snap1"], &m);
    sh_ok(&vol, CHANGE);
    std::os::unix::net::UnixListener::bind(vol.join("sock2")).unwrap();
    btrfs_in(&["subvolume", "snapshot", "-r", "vol", "snap2"], &m);
    let out = dir.subdir("streams").unwrap();
    let s = |n: &str| out.join(n).display().to_string();
    let sends: &[(&str, &[&str])] = &[
        ("full.v1", &["snap1"]),
        ("inc.v1", &["-p", "snap1", "snap2"]),
        ("full2.v1", &["snap2"]),
        ("nodata.v1", &["--no-data", "-p", "snap1", "snap2"]),
        ("multi.v1", &["snap1", "snap2"]),
        ("full.v2", &["--proto", "2", "--compressed-data", "snap1"]),
        (
            "inc.v2",
            &["--proto", "2", "--compressed-data", "-p", "snap1", "snap2"],
        ),
        ("plain.v2", &["--proto", "2", "snap2"]),
    ];
    let mut v = Vec::new();
    for (name, args) in sends {
        let f = s(name);
        let mut a = vec!["send", "-q", "-f", f.as_str()];
        a.extend_from_slice(args);
        btrfs_in(&a, &m);
        v.push((name.to_string(), out.join(name)));
    }
    k.unmount().unwrap();
    v
}

fn dump(tool: &str, stream: &Path, tz: Option<&str>) -> Output {
    let mut c = if tool == "oleo" {
        let mut c = Cmd::new(OLEO);
        c.arg("receive");
        c
    } else {
        let mut c = Cmd::new("btrfs");
        c.arg("receive");
        c
    };
    c.args(["--dump", "-f"]).arg(stream);
    if let Some(tz) = tz {
        c.env("TZ", tz);
    }
    c.output().unwrap()
}

fn show(l: &[u8]) -> String {
    l.escape_ascii().to_string()
}

/// Line by line; the first difference, if any.
fn first_difference(ours: &[u8], theirs: &[u8]) -> Option<String> {
    let a: Vec<&[u8]> = ours.split(|&b| b == b'\n').collect();
    let b: Vec<&[u8]> = theirs.split(|&b| b == b'\n').collect();
    for i in 0..a.len().max(b.len()) {
        let (x, y) = (a.get(i), b.get(i));
        if x != y {
            return Some(format!(
                "line {}:\n  oleo:  {}\n  btrfs: {}",
                i + 1,
                x.map_or("(none)".into(), |l| show(l)),
                y.map_or("(none)".into(), |l| show(l))
            ));
        }
    }
    None
}

#[test]
fn dump_matches_btrfs_receive_dump() {
    if !require_tools(
        "dump_matches_btrfs_receive_dump",
        &["setfattr", "fallocate", "mknod", "mkfifo"],
        "attr util-linux",
    ) {
        return;
    }
    let dir = TempDir::new("receive-dump").unwrap();
    let streams = make_streams(&dir);
    let mut seen = std::collections::BTreeSet::new();
    for (name, path) in &streams {
        for tz in [None, Some("NST3:30")] {
            let theirs = dump("btrfs", path, tz);
            assert!(
                theirs.status.success(),
                "btrfs receive --dump {name}: {}",
                String::from_utf8_lossy(&theirs.stderr)
            );
            let ours = dump("oleo", path, tz);
            assert!(
                ours.status.success(),
                "oleo receive --dump {name}: {}",
                String::from_utf8_lossy(&ours.stderr)
            );
            if let Some(d) = first_difference(&ours.stdout, &theirs.stdout) {
                panic!("{name} (TZ {tz:?}): dumps differ at {d}");
            }
            for l in theirs.stdout.split(|&b| b == b'\n') {
                let title = l.split(|&b| b == b' ').next().unwrap_or_default();
                seen.insert(String::from_utf8_lossy(title).into_owned());
            }
        }
        // Decoded and written again: the kernel's bytes.
        let bytes = std::fs::read(path).unwrap();
        let mut r = StreamReader::new(&bytes[..]).unwrap();
        let mut w = StreamWriter::new(Vec::new(), r.version()).unwrap();
        while let Some(c) = r.next_command().unwrap() {
            w.write_command(&c).unwrap();
        }
        let again = w.into_inner();
        // Up to the END: `btrfs send` of two subvolumes writes two whole streams, and
        // `btrfs receive --dump` too stops at the first END.
        let read = &bytes[..r.position() as usize];
        if let Some(i) = (0..read.len().min(again.len())).find(|&i| read[i] != again[i]) {
            panic!("{name}: written again, the stream differs at byte {i}");
        }
        assert_eq!(
            again.len(),
            read.len(),
            "{name}: written again, another length"
        );
    }
    // The streams covered what they were made for.
    for t in [
        "subvol",
        "snapshot",
        "mkfile",
        "mkdir",
        "mknod",
        "mkfifo",
        "mksock",
        "symlink",
        "rename",
        "link",
        "unlink",
        "rmdir",
        "set_xattr",
        "remove_xattr",
        "write",
        "clone",
        "truncate",
        "chmod",
        "chown",
        "utimes",
        "update_extent",
        "encoded_write",
        "fallocate",
    ] {
        assert!(seen.contains(t), "no {t} line in any stream: {seen:?}");
    }
}

/// (offset, command number, length) of each command of a stream.
fn commands(bytes: &[u8]) -> Vec<(usize, u16, usize)> {
    let mut v = Vec::new();
    let mut p = 17;
    while p + 10 <= bytes.len() {
        let len = u32::from_le_bytes(bytes[p..p + 4].try_into().unwrap()) as usize;
        let cmd = u16::from_le_bytes([bytes[p + 4], bytes[p + 5]]);
        v.push((p, cmd, len));
        p += 10 + len;
    }
    v
}

/// Runs `oleo receive --dump` on `bytes`; its exit code and stderr.
fn refused(dir: &Path, name: &str, bytes: &[u8]) -> String {
    let f = dir.join(name);
    std::fs::write(&f, bytes).unwrap();
    let o = dump("oleo", &f, None);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(1), "{name}: {err}");
    assert!(!err.contains("panicked"), "{name}: {err}");
    err
}

fn recrc(bytes: &mut [u8], at: usize, len: usize) {
    bytes[at + 6..at + 10].fill(0);
    let crc = crc32c_raw(0, &bytes[at..at + 10 + len]);
    bytes[at + 6..at + 10].copy_from_slice(&crc.to_le_bytes());
}

#[test]
fn damaged_streams_are_refused() {
    if !require_tools(
        "damaged_streams_are_refused",
        &["setfattr", "fallocate", "mknod", "mkfifo"],
        "attr util-linux",
    ) {
        return;
    }
    let dir = TempDir::new("receive-dump-bad").unwrap();
    let streams = make_streams(&dir);
    let bad = dir.subdir("bad").unwrap();
    for (name, path) in streams
        .iter()
        .filter(|(n, _)| n == "full.v1" || n == "full.v2")
    {
        let good = std::fs::read(path).unwrap();
        let cmds = commands(&good);
        let name_of = |n: u16| oleo_format::send_stream::command_name(n).unwrap_or("unknown");
        // The first WRITE (or ENCODED_WRITE) with some data.
        let &(w_at, w_cmd, w_len) = cmds
            .iter()
            .find(|c| (c.1 == 15 || c.1 == 25) && c.2 > 100)
            .unwrap();
        let w_label = format!("command {w_cmd} ({})", name_of(w_cmd));

        // Truncated: inside the header, between commands, inside a command header, inside
        // a payload, inside the END.
        let cuts = [
            (10, "byte 10".to_string()),
            (
                17,
                "byte 17: stream ends without an END command".to_string(),
            ),
            (17 + 7, "byte 24, command 1 (SUBVOL)".to_string()),
            (
                w_at + 10 + 50,
                format!("byte {}, {w_label} at byte {w_at}", w_at + 60),
            ),
            (
                good.len() - 10,
                format!("byte {}: stream ends without", good.len() - 10),
            ),
            (good.len() - 3, format!("byte {}", good.len() - 3)),
        ];
        for (cut, want) in cuts {
            let err = refused(&bad, &format!("{name}.cut{cut}"), &good[..cut]);
            assert!(err.contains(&want), "{name} cut at {cut}: {err}");
        }

        // One byte flipped in a payload: bad CRC, named.
        let mut b = good.clone();
        b[w_at + 10 + w_len / 2] ^= 0x10;
        let err = refused(&bad, &format!("{name}.flip"), &b);
        let want = format!("byte {w_at}, {w_label}: bad CRC");
        assert!(err.contains(&want), "{name} flipped: {err}");

        // An unknown command number with a valid CRC.
        let mut b = good.clone();
        b[w_at + 4..w_at + 6].copy_from_slice(&200u16.to_le_bytes());
        recrc(&mut b, w_at, w_len);
        let err = refused(&bad, &format!("{name}.unknown"), &b);
        let want = format!("byte {w_at}, command 200 (unknown): unknown command");
        assert!(err.contains(&want), "{name} unknown command: {err}");

        // A valid stream whose rename leaves the subvolume: refused at decode time.
        let mut r = StreamReader::new(&good[..]).unwrap();
        let mut w = StreamWriter::new(Vec::new(), r.version()).unwrap();
        let mut renamed = false;
        while let Some(mut c) = r.next_command().unwrap() {
            if let Command::Rename { to, .. } = &mut c {
                if !renamed {
                    *to = b"../../etc/evil".to_vec();
                    renamed = true;
                }
            }
            w.write_command(&c).unwrap();
        }
        let evil = w.into_inner();
        let err = refused(&bad, &format!("{name}.evil"), &evil);
        assert!(
            err.contains("command 9 (RENAME)") && err.contains("'..' component"),
            "{name} evil rename: {err}"
        );
    }
}

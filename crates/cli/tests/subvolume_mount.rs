//! `oleo subvolume` and `oleo property` on a mounted oleo filesystem, as a user runs them:
//! subvolumes created, snapshots taken (read-only too) while a writer keeps appending
//! through the page cache, the read-only flag set and cleared, snapshots deleted. Each snapshot holds at least
//! what was written before the command started (the CLI pushes the page cache to the
//! daemon first); new entries show at once; after unmount `btrfs check` is clean and the
//! kernel sees what the mount showed.

use oleo_testkit::*;
use std::io::Write;
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");

fn oleo(args: &[&str]) -> String {
    let out = Command::new(OLEO).args(args).output().expect("run oleo");
    assert!(
        out.status.success(),
        "oleo {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every file under `top` with its content (directories as empty entries).
fn view(top: &Path) -> std::collections::BTreeMap<String, Vec<u8>> {
    let mut out = std::collections::BTreeMap::new();
    let mut todo = vec![top.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let p = e.expect("entry").path();
            let rel = p.strip_prefix(top).unwrap().to_string_lossy().into_owned();
            if p.is_dir() {
                out.insert(rel + "/", Vec::new());
                todo.push(p);
            } else {
                out.insert(rel, std::fs::read(&p).expect("read"));
            }
        }
    }
    out
}

#[test]
fn subvolumes_and_snapshots_on_a_mount() {
    if !(require_root("subvolume_mount") && require_fuse("subvolume_mount")) {
        return;
    }
    let tmp = TempDir::new("oleo-subvol-mount").expect("tempdir");
    let image = tmp.join("image");
    image::empty_image(&image, 512, &[]).expect("mkfs.btrfs");
    let mnt = tmp.join("mnt");
    let m = OleoMount::mount_rw(Path::new(OLEO), &image, &mnt, &[]).expect("oleo mount");
    let top = m.path().to_path_buf();
    let s = |p: &str| top.join(p).to_string_lossy().into_owned();
    oleo(&["subvolume", "create", &s("vol")]);
    assert!(top.join("vol").is_dir(), "a new subvolume shows at once");
    std::fs::write(top.join("vol/before"), b"written before any snapshot").expect("write");
    // Two writers append 4 KiB records to vol/log0 and vol/log1 through the page cache
    // meanwhile (the CLI pushes open files all at once).
    let written = [AtomicU64::new(0), AtomicU64::new(0)];
    let stop = AtomicBool::new(false);
    let mut bounds = Vec::new();
    std::thread::scope(|sc| {
        for (w, written) in written.iter().enumerate() {
            let (top, stop) = (&top, &stop);
            sc.spawn(move || {
                let mut f =
                    std::fs::File::create(top.join(format!("vol/log{w}"))).expect("create log");
                let mut n = 0u64;
                while !stop.load(Ordering::SeqCst) {
                    // Bursts small enough (12 MiB in all) that the kernel keeps them in its
                    // page cache, unwritten, until something makes it write them back.
                    if n < 1_536 {
                        for _ in 0..64 {
                            f.write_all(&[(n % 251) as u8 + 1; 4096]).expect("append");
                            n += 1;
                            written.store(n, Ordering::SeqCst);
                        }
                        std::thread::sleep(std::time::Duration::from_millis(30));
                    } else {
                        // Still open (as fio keeps its files): its pages may still be dirty.
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                }
            });
        }
        for i in 0..4 {
            std::thread::sleep(std::time::Duration::from_millis(100));
            let before = written.each_ref().map(|w| w.load(Ordering::SeqCst));
            let name = format!("snap{i}");
            if i % 2 == 0 {
                oleo(&["subvolume", "snapshot", "-r", &s("vol"), &s(&name)]);
            } else {
                oleo(&["subvolume", "snapshot", &s("vol"), &s(&name)]);
            }
            bounds.push((name, before));
        }
        stop.store(true, Ordering::SeqCst);
    });
    for (name, before) in &bounds {
        for (w, before) in before.iter().enumerate() {
            let log =
                std::fs::read(top.join(name).join(format!("log{w}"))).expect("log in the snapshot");
            let records = log.len() as u64 / 4096;
            assert_eq!(log.len() % 4096, 0, "{name}: whole records");
            assert!(
                records >= *before,
                "{name} log{w}: {records} records, but {before} were written before the snapshot began"
            );
            for (k, rec) in log.chunks(4096).enumerate() {
                assert!(
                    rec.iter().all(|&b| b == (k as u64 % 251) as u8 + 1),
                    "{name} log{w}: record {k}"
                );
            }
        }
        assert_eq!(
            std::fs::read(top.join(name).join("before")).expect("before"),
            b"written before any snapshot"
        );
    }
    // Read-only flags as btrfs property shows them.
    assert_eq!(
        oleo(&["property", "get", &s("snap0"), "ro"]).trim(),
        "ro=true"
    );
    assert_eq!(
        oleo(&["property", "get", &s("snap1"), "ro"]).trim(),
        "ro=false"
    );
    assert!(
        std::fs::write(top.join("snap0/x"), b"x").is_err(),
        "read-only snapshot"
    );
    oleo(&["property", "set", &s("snap0"), "ro", "false"]);
    std::fs::write(top.join("snap0/x"), b"x").expect("writable after ro false");
    let list = oleo(&["subvolume", "list", &s("")]);
    for name in ["vol", "snap0", "snap1", "snap2", "snap3"] {
        assert!(
            list.lines().any(|l| l.ends_with(&format!(" path {name}"))),
            "{name} listed:\n{list}"
        );
    }
    let ids: Vec<String> = oleo(&["subvolume", "list", &s("")])
        .lines()
        .filter(|l| l.ends_with(" path snap1") || l.ends_with(" path snap3"))
        .map(|l| l.split_whitespace().nth(1).unwrap_or_default().to_string())
        .collect();
    assert_eq!(ids.len(), 2, "snap1 and snap3 listed");
    oleo(&["subvolume", "delete", &s("snap1"), &s("snap3")]);
    assert!(
        !top.join("snap1").exists(),
        "a deleted subvolume is gone at once"
    );
    let list = oleo(&["subvolume", "list", &s("")]);
    assert!(
        !list.contains("path snap3"),
        "deleted ones are not listed:\n{list}"
    );
    let want = view(&top);
    let shown: Vec<String> = ["vol", "snap0", "snap2"]
        .iter()
        .map(|n| oleo(&["subvolume", "show", &s(n)]))
        .collect();
    m.unmount().expect("unmount");
    assert_btrfs_check(&image, "after snapshots on a mount");
    let image_s = image.to_string_lossy().into_owned();
    // The mount showed the last commit's generation; unmounting committed once more.
    let without_gen = |t: &str| -> String {
        t.lines()
            .filter(|l| !l.contains("\tGeneration:"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let names = ["vol", "snap0", "snap2"];
    let offline: Vec<String> = names
        .iter()
        .map(|n| oleo(&["subvolume", "show", "--image", &image_s, &format!("/{n}")]))
        .collect();
    for (i, o) in offline.iter().enumerate() {
        assert_eq!(
            without_gen(o),
            without_gen(&shown[i]),
            "show on the mount and on the image"
        );
    }
    let flag_sets: [&[&str]; 4] = [&[], &["-p", "-c", "-g", "-u", "-q", "-R"], &["-s"], &["-r"]];
    let listed: Vec<String> = flag_sets
        .iter()
        .map(|f| {
            let mut args = vec!["subvolume", "list", "--image", &image_s];
            args.extend_from_slice(f);
            oleo(&args)
        })
        .collect();
    let k = KernelMount::mount(&image, &tmp.join("kmnt"), &["ro"]).expect("kernel mount");
    for (f, want) in flag_sets.iter().zip(&listed) {
        let out = Command::new("btrfs")
            .args(["subvolume", "list"])
            .args(*f)
            .arg(k.path())
            .output()
            .expect("btrfs subvolume list");
        assert_eq!(
            &String::from_utf8_lossy(&out.stdout),
            want,
            "oleo subvolume list {f:?} against btrfs subvolume list"
        );
    }
    assert_eq!(
        view(k.path()),
        want,
        "the kernel sees what the mount showed"
    );
    for (i, n) in names.iter().enumerate() {
        let out = Command::new("btrfs")
            .args(["subvolume", "show"])
            .arg(k.path().join(n))
            .output()
            .expect("btrfs subvolume show");
        assert_eq!(
            String::from_utf8_lossy(&out.stdout),
            offline[i],
            "oleo subvolume show {n} against btrfs subvolume show"
        );
    }
    let out = Command::new("btrfs")
        .args(["subvolume", "list", "-r"])
        .arg(k.path())
        .output()
        .expect("btrfs subvolume list");
    let ro = String::from_utf8_lossy(&out.stdout);
    assert!(
        ro.contains("path snap2") && !ro.contains("path snap0"),
        "read-only: {ro}"
    );
}

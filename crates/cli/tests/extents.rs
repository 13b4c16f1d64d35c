//! `oleo extents` tells what the kernel's FIEMAP (`filefrag -v`) tells about the same file
//! on a loop-mounted image: the same data ranges at the same addresses, unwritten
//! (preallocated) and inline extents marked.

use oleo_testkit::*;
use std::path::Path;
use std::process::Command;

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");

/// (logical first, logical last, physical first, physical last, flags) rows of
/// `filefrag -v`-style output; inline rows (reported in bytes by filefrag) keep flags only.
fn rows(text: &str) -> Vec<(u64, u64, u64, u64, String)> {
    text.lines()
        .filter_map(|l| {
            let (_, rest) = l.trim_start().split_once(": ")?;
            let f: Vec<&str> = rest.split(':').map(str::trim).collect();
            let range = |s: &str| -> Option<(u64, u64)> {
                let (a, b) = s.split_once("..")?;
                Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
            };
            let (l0, l1) = range(f.first()?)?;
            let (p0, p1) = range(f.get(1)?)?;
            let mut flags: Vec<&str> = f.last()?.split(',').map(str::trim).collect();
            flags.retain(|x| ["unwritten", "inline", "encoded"].contains(x));
            flags.sort_unstable();
            let flags = flags.join(",");
            Some(if flags.contains("inline") {
                (0, 0, 0, 0, flags)
            } else {
                (l0, l1, p0, p1, flags)
            })
        })
        .collect()
}

/// Joins rows that continue each other (filefrag merges physically contiguous extents).
fn merged(mut v: Vec<(u64, u64, u64, u64, String)>) -> Vec<(u64, u64, u64, u64, String)> {
    let mut out: Vec<(u64, u64, u64, u64, String)> = Vec::new();
    for r in v.drain(..) {
        match out.last_mut() {
            Some(p) if p.1 + 1 == r.0 && p.3 + 1 == r.2 && p.4 == r.4 && r.4.is_empty() => {
                p.1 = r.1;
                p.3 = r.3;
            }
            _ => out.push(r),
        }
    }
    out
}

#[test]
fn extents_match_the_kernels_fiemap() {
    let name = "extents_fiemap";
    if !require_root(name) {
        return;
    }
    let dir = TempDir::new(name).unwrap();
    let image = dir.join("fx.img");
    empty_image(&image, 512, &[]).unwrap();
    let kmnt = dir.subdir("kmnt").unwrap();
    let k = KernelMount::mount(&image, &kmnt, &["rw"]).unwrap();
    let sh = |cmd: &str| {
        assert!(Command::new("sh")
            .arg("-c")
            .arg(cmd)
            .current_dir(&kmnt)
            .status()
            .unwrap()
            .success());
    };
    sh(
        "head -c 1048576 /dev/urandom > holes && sync holes && \
        head -c 262144 /dev/urandom | dd of=holes bs=4096 seek=1024 conv=notrunc,fsync 2>/dev/null",
    );
    sh("head -c 300000 /dev/urandom > big && sync big");
    sh("echo small > small && sync small");
    sh("fallocate -l 1M pre && sync pre");
    let mut kernel = Vec::new();
    for f in ["holes", "big", "small", "pre"] {
        let out = Command::new("filefrag")
            .args(["-v", "-b4096"])
            .arg(kmnt.join(f))
            .output()
            .unwrap();
        kernel.push(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    k.unmount().unwrap();
    let extents = |f: &str| {
        let out = Command::new(OLEO)
            .args(["extents"])
            .arg(Path::new(&image))
            .arg(f)
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let mut from_image = Vec::new();
    for (f, kernel) in ["holes", "big", "small", "pre"].iter().zip(kernel) {
        let ours = extents(f);
        let (k, o) = (merged(rows(&kernel)), merged(rows(&ours)));
        assert!(!k.is_empty(), "filefrag said nothing for {f}: {kernel}");
        assert_eq!(k, o, "{f}:\nkernel:\n{kernel}\noleo:\n{ours}");
        from_image.push(ours);
    }
    // With the image mounted by oleo, the same command asks the daemon through the mount.
    let omnt = dir.subdir("omnt").unwrap();
    let m = OleoMount::mount_rw(Path::new(OLEO), &image, &omnt, &[]).unwrap();
    for (f, want) in ["holes", "big", "small", "pre"].iter().zip(&from_image) {
        assert_eq!(&extents(f), want, "{f} through the mount");
    }
    m.unmount().unwrap();
}

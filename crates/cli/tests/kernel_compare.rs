//! oleo must show exactly what the Linux kernel shows.
//!
//! Each test builds a seeded btrfs image with mkfs.btrfs and the kernel driver, captures the
//! tree through a kernel mount (`ro,noatime`), captures it again through `oleo mount`, and
//! fails with every difference. One test per image variant, so a failure names the feature.
//!
//! Needs root, loop devices, kernel btrfs and FUSE; without them each test prints `SKIP:` and
//! passes, except under `CI=true`, where that is a failure. Replay a failure with
//! `OLEO_TEST_SEED=<seed printed by the test>`; keep its files with `OLEO_KEEP_TMP=1`.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use oleo_testkit::*;

const OLEO: &str = env!("CARGO_BIN_EXE_oleo");

/// A hung oleo must fail the test, not stall CI: the oleo capture may take this many times
/// as long as the kernel's, within these bounds, before its FUSE connection is aborted.
const CAPTURE_SLOWDOWN_ALLOWED: u32 = 30;
const CAPTURE_LIMIT_MIN: Duration = Duration::from_secs(60);
const CAPTURE_LIMIT_MAX: Duration = Duration::from_secs(600);

/// Beyond this many lines the panic message is cut; the whole list goes to a file.
const MAX_LINES_IN_MESSAGE: usize = 2000;

/// One way of looking at an image: the same subvolume through the kernel and through oleo.
struct View {
    label: String,
    /// Options for the kernel mount, on top of `ro,noatime`.
    kernel_opts: Vec<String>,
    /// Options for `oleo mount -o ro,...`.
    oleo_opts: Vec<String>,
    /// The kernel mounts this copy instead (a mount that replays a log writes, even
    /// read-only).
    kernel_image: Option<std::path::PathBuf>,
}

impl View {
    fn top() -> View {
        View {
            label: "top".into(),
            kernel_opts: vec![],
            oleo_opts: vec![],
            kernel_image: None,
        }
    }

    /// The same extra option on both sides (e.g. `subvol=sv1`).
    fn both(opt: &str) -> View {
        View {
            label: opt.into(),
            kernel_opts: vec![opt.into()],
            oleo_opts: vec![opt.into()],
            kernel_image: None,
        }
    }
}

fn requirements_met(what: &str, spec: &ImageSpec) -> bool {
    if !require_root(what) || !require_fuse(what) {
        return false;
    }
    let features = oleo_testkit::env::features_in_args(&spec.mkfs_args);
    let features: Vec<&str> = features.iter().map(String::as_str).collect();
    require_mkfs_features(what, &features)
}

/// Captures `view` of `image` through the kernel and through oleo and returns the diff.
fn compare_view(
    tmp: &TempDir,
    image: &Path,
    view: &View,
    extra_kernel: &[&str],
) -> Result<Vec<String>, String> {
    // A copy of its own the kernel may write (to replay a log): mounted read-write.
    let mut kopts: Vec<&str> = if view.kernel_image.is_some() {
        vec!["rw", "noatime"]
    } else {
        KernelMount::DEFAULT_OPTS.to_vec()
    };
    kopts.extend(extra_kernel);
    kopts.extend(view.kernel_opts.iter().map(String::as_str));
    let kernel_mp = tmp.join(format!("kernel-{}", view.label.replace('/', "_")));
    let t = Instant::now();
    let kernel = {
        let m = KernelMount::mount(
            view.kernel_image.as_deref().unwrap_or(image),
            &kernel_mp,
            &kopts,
        )
        .map_err(|e| format!("kernel mount: {e}"))?;
        Manifest::capture(m.path()).map_err(|e| format!("kernel capture: {e}"))?
    };
    let kernel_time = t.elapsed();

    let oleo_mp = tmp.join(format!("oleo-{}", view.label.replace('/', "_")));
    let oopts: Vec<&str> = view.oleo_opts.iter().map(String::as_str).collect();
    let t = Instant::now();
    let m = OleoMount::mount(Path::new(OLEO), image, &oleo_mp, &oopts)
        .map_err(|e| format!("oleo mount: {e}"))?;
    let oleo = {
        let limit =
            (kernel_time * CAPTURE_SLOWDOWN_ALLOWED).clamp(CAPTURE_LIMIT_MIN, CAPTURE_LIMIT_MAX);
        let _wd = m.watchdog(limit);
        Manifest::capture(m.path())
    };
    let log = m.log_text();
    m.unmount().map_err(|e| format!("oleo unmount: {e}"))?;
    let oleo = oleo.map_err(|e| format!("oleo capture: {e}\noleo's output:\n{log}"))?;
    eprintln!(
        "view {}: {} paths; kernel capture {:.1?}, oleo mount+capture {:.1?}",
        view.label,
        kernel.len(),
        kernel_time,
        t.elapsed()
    );
    Ok(Manifest::diff(&kernel, &oleo, &CompareRules::default()))
}

/// Builds the image and compares every view; panics with all differences.
fn check(spec: ImageSpec, views: Vec<View>) {
    check_with(spec, false, |_, _| views)
}

/// `pending_log`: build with a pending log tree (views say how each side mounts it).
/// `after_build` may adjust the image (with the kernel) and returns the views to compare.
fn check_with(
    spec: ImageSpec,
    pending_log: bool,
    after_build: impl FnOnce(&TempDir, &Path) -> Vec<View>,
) {
    let what = format!("kernel_compare {}", spec.name);
    if !requirements_met(&what, &spec) {
        return;
    }
    let tmp = TempDir::new(&format!("cmp-{}", spec.name)).expect("temp dir");
    let image = tmp.join(format!("{}.img", spec.name));
    let t = Instant::now();
    if pending_log {
        build_image_with_pending_log(&spec, &image).expect("build image");
    } else {
        build_image(&spec, &image).expect("build image");
    }
    let views = after_build(&tmp, &image);
    eprintln!("{}: image ready in {:.1?}", spec.name, t.elapsed());

    let extra_kernel: &[&str] = &[];
    let mut report = String::new();
    let mut total = 0;
    for view in &views {
        match compare_view(&tmp, &image, view, extra_kernel) {
            Ok(lines) if lines.is_empty() => {}
            Ok(lines) => {
                total += lines.len();
                report.push_str(&format!(
                    "\n--- view {}: {} differences (kernel vs oleo)\n",
                    view.label,
                    lines.len()
                ));
                if lines.len() > MAX_LINES_IN_MESSAGE {
                    let file = std::env::temp_dir().join(format!(
                        "oleo-kernel-compare-{}-{}.diff",
                        spec.name,
                        view.label.replace('/', "_")
                    ));
                    let _ = std::fs::write(&file, lines.join("\n") + "\n");
                    report.push_str(&lines[..MAX_LINES_IN_MESSAGE].join("\n"));
                    report.push_str(&format!(
                        "\n... all {} lines in {}\n",
                        lines.len(),
                        file.display()
                    ));
                } else {
                    report.push_str(&lines.join("\n"));
                    report.push('\n');
                }
            }
            Err(e) => {
                total += 1;
                report.push_str(&format!("\n--- view {}: {e}\n", view.label));
            }
        }
    }
    assert!(
        total == 0,
        "image '{}' (seed {}, mkfs {:?}, mount {:?}): oleo differs from the kernel:{report}",
        spec.name,
        spec.seed,
        spec.mkfs_args,
        spec.mount_opts
    );
}

fn spec(name: &str, seed_default: u64) -> ImageSpec {
    ImageSpec::new(name, seed(seed_default))
}

// ---- mkfs variants ----------------------------------------------------------------------

#[test]
fn default_mkfs() {
    check(spec("default", 0x0100), vec![View::top()]);
}

#[test]
fn csum_xxhash() {
    check(
        spec("csum-xxhash", 0x0201).mkfs(&["--csum", "xxhash"]),
        vec![View::top()],
    );
}

#[test]
fn csum_sha256() {
    check(
        spec("csum-sha256", 0x0202).mkfs(&["--csum", "sha256"]),
        vec![View::top()],
    );
}

#[test]
fn csum_blake2() {
    check(
        spec("csum-blake2", 0x0203).mkfs(&["--csum", "blake2"]),
        vec![View::top()],
    );
}

#[test]
fn nodesize_4096() {
    check(
        spec("nodesize-4k", 0x0301).mkfs(&["--nodesize", "4096"]),
        vec![View::top()],
    );
}

#[test]
fn nodesize_65536() {
    check(
        spec("nodesize-64k", 0x0302).mkfs(&["--nodesize", "65536"]),
        vec![View::top()],
    );
}

#[test]
fn explicit_holes() {
    check(
        spec("no-holes-off", 0x0401).mkfs(&["-O", "^no-holes"]),
        vec![View::top()],
    );
}

#[test]
fn block_group_tree() {
    check(
        spec("block-group-tree", 0x0402).mkfs(&["-O", "block-group-tree"]),
        vec![View::top()],
    );
}

#[test]
fn mixed_block_groups() {
    check(
        spec("mixed-bg", 0x0501).mkfs(&["--mixed"]).size_mb(256),
        vec![View::top()],
    );
}

#[test]
fn single_profiles() {
    check(
        spec("single", 0x0502).mkfs(&["-m", "single", "-d", "single"]),
        vec![View::top()],
    );
}

#[test]
fn dup_profiles() {
    check(
        spec("dup", 0x0503).mkfs(&["-m", "dup", "-d", "dup"]),
        vec![View::top()],
    );
}

// ---- mount option variants when writing -------------------------------------------------

/// Everything compressed (compress-force as the base option, so sparse, prealloc, reflinked
/// and overwritten files are compressed too), with explicit levels in the per-algorithm groups.
#[test]
fn compression() {
    let populate = PopulateSpec {
        compression: ["zlib:9", "lzo", "zstd:15", "zstd:1"]
            .map(String::from)
            .to_vec(),
        ..PopulateSpec::full()
    };
    check(
        spec("compression", 0x0601)
            .mount_opts(&["compress-force=zlib:1"])
            .populate(populate),
        vec![View::top()],
    );
}

/// Data without checksums (nodatacow implies nodatasum) except where compression re-enables them.
#[test]
fn nodatacow() {
    check(
        spec("nodatacow", 0x0602).mount_opts(&["nodatacow"]),
        vec![View::top()],
    );
}

/// No inline extents at all: every small file gets a regular extent.
#[test]
fn max_inline_zero() {
    check(
        spec("max-inline-0", 0x0603).mount_opts(&["max_inline=0"]),
        vec![View::top()],
    );
}

// ---- subvolumes ---------------------------------------------------------------------------

/// Looks up subvolume ids with a kernel mount of the top level.
fn subvol_ids(tmp: &TempDir, image: &Path, names: &[&str]) -> Vec<u64> {
    let m = KernelMount::mount(image, &tmp.join("ids"), &[]).expect("kernel mount for ids");
    names
        .iter()
        .map(|n| subvolume_id(&m.path().join(n)).expect("subvolume id"))
        .collect()
}

#[test]
fn subvolumes_and_snapshots() {
    let spec = spec("subvolumes", 0x0701).populate(PopulateSpec {
        big_dir: 0,
        ..PopulateSpec::full()
    });
    check_with(spec, false, |tmp, image| {
        let mut views = vec![
            View::top(),
            View::both("subvolid=5"),
            View::both("subvol=sv1"),
            View::both("subvol=/sv1/nested"),
            View::both("subvol=snaps/sv1-rw"),
            View::both("subvol=snaps/sv1-ro"),
            View::both("subvol=snaps/top"),
        ];
        for id in subvol_ids(tmp, image, &["sv1", "sv1/dir/deep", "snaps/snap-of-snap"]) {
            views.push(View::both(&format!("subvolid={id}")));
        }
        views
    });
}

/// A default subvolume set with `btrfs subvolume set-default`: a mount without subvol= shows it.
#[test]
fn default_subvolume() {
    let populate = PopulateSpec {
        subvolumes: true,
        snapshots: true,
        ..PopulateSpec::basic()
    };
    check_with(
        spec("default-subvol", 0x0702).populate(populate),
        false,
        |tmp, image| {
            let m = KernelMount::mount(image, &tmp.join("set-default"), &["rw", "noatime"])
                .expect("rw mount");
            let st = Command::new("btrfs")
                .args(["subvolume", "set-default"])
                .arg(m.path().join("sv1"))
                .stdout(std::process::Stdio::null())
                .status()
                .expect("btrfs subvolume set-default");
            assert!(st.success(), "btrfs subvolume set-default failed");
            m.unmount().expect("unmount");
            vec![
                View::top(),
                View::both("subvolid=5"),
                View::both("subvol=/"),
            ]
        },
    );
}

// ---- size and logs -------------------------------------------------------------------------

/// 100,000 entries in one directory: readdir continuation, no entry lost or repeated.
#[test]
fn big_directory() {
    let populate = PopulateSpec {
        big_dir: 100_000,
        attrs: true,
        ..PopulateSpec::none()
    };
    check(spec("bigdir", 0x0801).populate(populate), vec![View::top()]);
}

/// An image whose superblock points to a log tree (a crash after fsync). Read-only, oleo
/// replays it in memory and shows what the kernel shows after its replay (of a copy: the
/// kernel writes even on a read-only mount), without writing the image; with
/// `nologreplay` both show the last committed state.
#[test]
fn pending_log_tree() {
    let spec = spec("pending-log", 0x0901).populate(PopulateSpec {
        big_dir: 0,
        ..PopulateSpec::full()
    });
    check_with(spec, true, |tmp, image| {
        assert_ne!(superblock_log_root(image).expect("read superblock"), 0);
        let copy = tmp.join("kernel-replays.img");
        std::fs::copy(image, &copy).expect("copy image");
        vec![
            View {
                label: "replayed".into(),
                kernel_opts: vec![],
                oleo_opts: vec![],
                kernel_image: Some(copy),
            },
            View {
                label: "nologreplay".into(),
                kernel_opts: vec!["rescue=nologreplay".into()],
                oleo_opts: vec!["nologreplay".into()],
                kernel_image: None,
            },
        ]
    });
}

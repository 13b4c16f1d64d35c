//! Building btrfs images with mkfs.btrfs and the kernel driver.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Seek, SeekFrom, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use rand::SeedableRng;

use crate::cmd::{run, run_stdout};
use crate::env::{features_in_args, mkfs_btrfs_for};
use crate::mount::{syncfs, KernelMount};
use crate::populate::{populate, random_bytes, set_xattr, write_file, PopulateSpec};
use crate::tempdir::TempDir;

/// What image to build. `seed` drives every random choice of the populate step.
#[derive(Debug, Clone)]
pub struct ImageSpec {
    /// A short name, used in messages and temp dir names.
    pub name: String,
    pub seed: u64,
    /// Size of the (sparse) image file.
    pub size_mb: u64,
    /// Extra `mkfs.btrfs` arguments, e.g. `--csum xxhash`, `-O ^no-holes`.
    pub mkfs_args: Vec<String>,
    /// Options for the kernel mount that populates the image (e.g. `compress=zstd`).
    pub mount_opts: Vec<String>,
    pub populate: PopulateSpec,
}

impl ImageSpec {
    /// 512 MiB, default mkfs and mount options, [`PopulateSpec::full`].
    pub fn new(name: &str, seed: u64) -> Self {
        ImageSpec {
            name: name.to_string(),
            seed,
            size_mb: 512,
            mkfs_args: Vec::new(),
            mount_opts: Vec::new(),
            populate: PopulateSpec::full(),
        }
    }

    pub fn mkfs(mut self, args: &[&str]) -> Self {
        self.mkfs_args = args.iter().map(|s| s.to_string()).collect();
        self
    }

    pub fn mount_opts(mut self, opts: &[&str]) -> Self {
        self.mount_opts = opts.iter().map(|s| s.to_string()).collect();
        self
    }

    pub fn size_mb(mut self, mb: u64) -> Self {
        self.size_mb = mb;
        self
    }

    pub fn populate(mut self, p: PopulateSpec) -> Self {
        self.populate = p;
        self
    }
}

/// Makes the image file at `path`: a sparse file, `mkfs.btrfs -f`, a kernel mount in a
/// private temp dir, [`populate`], sync, unmount. The mount is undone even on error.
pub fn build_image(spec: &ImageSpec, path: &Path) -> io::Result<()> {
    build(spec, path, |_| Ok(()))
}

fn build(
    spec: &ImageSpec,
    path: &Path,
    before_unmount: impl FnOnce(&KernelMount) -> io::Result<()>,
) -> io::Result<()> {
    eprintln!(
        "oleo-testkit: building image '{}' with seed {} (replay with OLEO_TEST_SEED={}); mkfs {:?}, mount {:?}",
        spec.name, spec.seed, spec.seed, spec.mkfs_args, spec.mount_opts
    );
    let start = Instant::now();
    let err = |e: io::Error| {
        io::Error::new(
            e.kind(),
            format!("image '{}' (seed {}): {e}", spec.name, spec.seed),
        )
    };

    let f = File::create(path).map_err(err)?;
    f.set_len(spec.size_mb * 1024 * 1024).map_err(err)?;
    drop(f);
    let features = features_in_args(&spec.mkfs_args);
    let fref: Vec<&str> = features.iter().map(String::as_str).collect();
    let mkfs = mkfs_btrfs_for(&fref).ok_or_else(|| {
        err(io::Error::other(format!(
            "no mkfs.btrfs supports {features:?}"
        )))
    })?;
    run(Command::new(&mkfs)
        .args(["-f", "-q"])
        .args(&spec.mkfs_args)
        .arg(path))
    .map_err(err)?;

    let tmp = TempDir::new(&format!("build-{}", spec.name)).map_err(err)?;
    let mp = tmp.subdir("mnt").map_err(err)?;
    let mut opts = vec!["rw"];
    opts.extend(spec.mount_opts.iter().map(String::as_str));
    let mount = KernelMount::mount(path, &mp, &opts).map_err(err)?;
    populate(&mount, &spec.mount_opts, &spec.populate, spec.seed).map_err(err)?;
    mount.sync().map_err(err)?;
    before_unmount(&mount).map_err(err)?;
    mount.unmount().map_err(err)?;
    drop(tmp);
    eprintln!(
        "oleo-testkit: image '{}' built in {:.1?}",
        spec.name,
        start.elapsed()
    );
    Ok(())
}

/// Offset of the primary superblock, and of fields in it (see btrfs-format.md section 1.3).
pub const SUPER_OFFSET: u64 = 65536;
const SB_GENERATION: u64 = 72;
const SB_LOG_ROOT: u64 = 96;

fn read_u64_at(path: &Path, off: u64) -> io::Result<u64> {
    let mut b = [0u8; 8];
    File::open(path)?.read_exact_at(&mut b, off)?;
    Ok(u64::from_le_bytes(b))
}

/// The primary superblock's `log_root` (0: no pending log tree).
pub fn superblock_log_root(image: &Path) -> io::Result<u64> {
    read_u64_at(image, SUPER_OFFSET + SB_LOG_ROOT)
}

/// The primary superblock's `generation`.
pub fn superblock_generation(image: &Path) -> io::Result<u64> {
    read_u64_at(image, SUPER_OFFSET + SB_GENERATION)
}

/// Removes a file on drop (the live image behind a pending-log copy).
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// Like [`build_image`], then makes changes that only a log tree records, and leaves at
/// `path` the image as a crash right after the last fsync would leave it: the superblock's
/// `log_root` is non-zero. The committed state (what `-o ro,rescue=nologreplay` shows) does
/// not contain the changes under `pending/`; a log replay would add them.
///
/// How: the filesystem is built on `path.live`; after a full commit (syncfs) files are
/// changed and fsynced, which writes only log blocks and the superblock; then the live
/// image file is copied while still mounted. The loop device writes through the backing
/// file's page cache, so the copy sees exactly what the device has (no commit can sneak in:
/// the build mount runs with `commit=3600`).
pub fn build_image_with_pending_log(spec: &ImageSpec, path: &Path) -> io::Result<()> {
    let seed = spec.seed;
    build_image_with_log(spec, path, |mount| make_pending_log(mount, seed))
}

/// Like [`build_image_with_pending_log`], with the changes made by `fsyncs`: it runs after
/// a full commit, with background commits held off, and must end with an fsync (only log
/// blocks and the superblock reach the disk after the commit). `path` gets a copy of the
/// image as a crash at that moment leaves it.
pub fn build_image_with_log(
    spec: &ImageSpec,
    path: &Path,
    fsyncs: impl FnOnce(&KernelMount) -> io::Result<()>,
) -> io::Result<()> {
    let mut live = path.as_os_str().to_owned();
    live.push(".live");
    let live = RemoveOnDrop(PathBuf::from(live));
    build(spec, &live.0, |mount| {
        mount.remount(&["commit=3600"])?;
        syncfs(mount.path())?;
        fsyncs(mount)?;
        run(Command::new("cp")
            .arg("--sparse=always")
            .arg(&live.0)
            .arg(path))?;
        Ok(())
    })?;
    let log_root = superblock_log_root(path)?;
    if log_root == 0 {
        return Err(io::Error::other(format!(
            "image '{}': log_root is 0 after fsync; the kernel committed instead of logging",
            spec.name
        )));
    }
    eprintln!(
        "oleo-testkit: image '{}' has a pending log tree at {log_root}",
        spec.name
    );
    Ok(())
}

fn make_pending_log(mount: &KernelMount, seed: u64) -> io::Result<()> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x10_9000);
    let d = mount.path().join("pending");
    fs::create_dir_all(&d)?;
    write_file(&d.join("existing"), &random_bytes(&mut rng, 64 * 1024))?;
    write_file(&d.join("untouched"), b"committed")?;
    syncfs(mount.path())?;

    // From here on only fsyncs: each writes log blocks and the superblock, never a commit.
    let mut f = fs::OpenOptions::new()
        .write(true)
        .open(d.join("existing"))?;
    f.seek(SeekFrom::Start(4096))?;
    f.write_all(&random_bytes(&mut rng, 4096))?;
    f.seek(SeekFrom::End(0))?;
    f.write_all(&random_bytes(&mut rng, 10000))?;
    f.sync_all()?;
    drop(f);
    let mut n = File::create(d.join("new-file"))?;
    n.write_all(&random_bytes(&mut rng, 20000))?;
    n.sync_all()?;
    drop(n);
    set_xattr(&d.join("existing"), "user.logged", b"only in the log")?;
    File::open(d.join("existing"))?.sync_all()?;
    File::create(d.join("created-then-dir-fsynced"))?;
    File::open(&d)?.sync_all()?;
    // A second subvolume with logged changes: the log root tree then has two log trees.
    let sv = mount.path().join("sv1");
    if sv.is_dir() {
        let mut f = File::create(sv.join("pending-in-subvolume"))?;
        f.write_all(&random_bytes(&mut rng, 9000))?;
        f.sync_all()?;
    }
    Ok(())
}

/// Counts of the on-disk structures in an image, from `btrfs inspect-internal dump-tree`:
/// keys like `inline`, `inline/zstd`, `regular`, `regular/lzo`, `prealloc`, `hole`,
/// `offset>0` (partially referenced extents), `shared` (extent items with more than one ref),
/// and every item type name (`INODE_EXTREF`, `ROOT_ITEM`, ...). Used to check that the
/// populate step really produces what it promises.
#[derive(Debug, Default, Clone)]
pub struct ImageStats {
    pub counts: BTreeMap<String, u64>,
}

impl ImageStats {
    pub fn get(&self, key: &str) -> u64 {
        self.counts.get(key).copied().unwrap_or(0)
    }
}

/// Runs `btrfs inspect-internal dump-tree` on an (unmounted) image and counts what it shows.
pub fn image_stats(image: &Path) -> io::Result<ImageStats> {
    let out = run_stdout(
        Command::new("btrfs")
            .args(["inspect-internal", "dump-tree"])
            .arg(image),
    )?;
    let mut s = ImageStats::default();
    let mut bump = |k: &str| *s.counts.entry(k.to_string()).or_insert(0) += 1;
    let mut regular_disk_zero = false;
    let mut kind = String::new();
    for line in out.lines() {
        let t = line.trim();
        if let Some(rest) = t.strip_prefix("item ") {
            // "item 5 key (257 EXTENT_DATA 0) itemoff ..."
            if let Some(ty) = rest.split_whitespace().nth(3) {
                bump(ty);
            }
        } else if t.contains(" type 1 (regular)") {
            kind = "regular".into();
        } else if t.contains(" type 2 (prealloc)") {
            kind = "prealloc".into();
            bump("prealloc");
        } else if let Some(rest) = t.strip_prefix("extent data disk byte ") {
            regular_disk_zero = rest.starts_with("0 ");
            if regular_disk_zero && kind == "regular" {
                bump("hole");
            }
        } else if let Some(rest) = t.strip_prefix("extent data offset ") {
            if !rest.starts_with("0 ") && !regular_disk_zero {
                bump("offset>0");
            }
        } else if let Some(rest) = t.strip_prefix("extent compression ") {
            if kind == "regular" && !regular_disk_zero {
                bump("regular");
                let alg = rest.split(['(', ')']).nth(1).unwrap_or("?");
                if alg != "none" {
                    bump(&format!("regular/{alg}"));
                }
            }
        } else if let Some(rest) = t.strip_prefix("inline extent data size ") {
            bump("inline");
            let alg = rest.split(['(', ')']).nth(1).unwrap_or("?");
            if alg != "none" {
                bump(&format!("inline/{alg}"));
            }
        } else if let Some(rest) = t.strip_prefix("refs ") {
            // "refs 2 gen 7 flags DATA"
            if rest.contains("DATA") && rest.split_whitespace().next().is_some_and(|n| n != "1") {
                bump("shared");
            }
        }
    }
    Ok(s)
}

/// An empty filesystem made by `mkfs.btrfs -f ARGS` in a new sparse file of `mb` MiB.
pub fn empty_image(path: &Path, mb: u64, args: &[&str]) -> io::Result<()> {
    std::fs::File::create(path)?.set_len(mb << 20)?;
    let out = std::process::Command::new("mkfs.btrfs")
        .args(["-q", "-f"])
        .args(args)
        .arg(path)
        .output()?;
    if out.status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!(
            "mkfs.btrfs {}: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr)
        )))
    }
}

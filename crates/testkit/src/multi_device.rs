//! Multi-device btrfs sets (RAID profiles) built, filled and damaged with the real tools, so
//! that engine tests can compare oleo against the kernel on striped and mirrored layouts.
//!
//! The recipe:
//! 1. [`mkfs_set`]: N sparse image files, one `mkfs.btrfs -d DATA -m METADATA` over all;
//! 2. [`KernelSet::mount`] (loop devices, `device=` for the other members, `degraded` with
//!    members left out) and [`fill`], which returns the [`Manifest`] of what it wrote;
//! 3. unmount, then check any view against the manifest: [`Manifest::check_dir`] for a mount,
//!    [`Manifest::check_with`] for a library that reads files by path;
//! 4. for self-heal and scrub tests: [`file_logical_extents`] (on a kernel mount),
//!    [`chunk_map`], [`copies`], [`image_of_devid`], [`overwrite`], then [`offline_check`] or
//!    [`KernelSet::scrub`] to see what the kernel tools make of the damage.
//!
//! What was verified on Linux 6.18 / btrfs-progs 6.2 (and is relied on here):
//! - the kernel remembers the members of an fsid after umount (a later mount of one member
//!   silently uses a remembered one, even without `degraded`); `btrfs device scan --forget
//!   /dev/loopN` per device ends that, and is what [`LoopDevice`]'s drop does;
//! - `dump-tree -t chunk` of one member works when the system chunk is mirrored (single,
//!   dup, raid1*) and fails ("cannot read chunk root") when it is striped (raid0/10/5/6): then
//!   pass every image ([`chunk_map_all`]);
//! - FIEMAP's (and `filefrag -v`'s) "physical" on btrfs is the btrfs logical address;
//! - `btrfs check --check-data-csum` on one image of a set with the others missing prints the
//!   csum mismatch but still says "no error found" and exits 0: [`offline_check`] therefore
//!   attaches every member to a loop device so that progs finds the whole set.
//!
//! Note: [`Manifest`] here is the *intended* content written by [`fill`]; it is not
//! [`crate::Manifest`], which captures everything stat shows for a kernel-vs-oleo diff.

use std::collections::{BTreeMap, HashMap};
use std::ffi::{CString, OsStr};
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::SeedableRng;
use sha2::{Digest, Sha256};

use crate::cmd::{command, run, run_stdout, run_with_timeout};
use crate::env::mkfs_btrfs_for;
use crate::image::SUPER_OFFSET;
use crate::manifest::Kind;
use crate::mount::{mount_at, syncfs, LoopDevice};
use crate::populate::{compressible, random_bytes, set_xattr, write_file};

// ---- making a set -----------------------------------------------------------------------

/// Creates `ndevs` sparse image files `DIR/NAME-1.img` .. `NAME-N.img` of `size` bytes and
/// runs `mkfs.btrfs -f -q -d DATA -m METADATA` over all of them. Profiles are spelled as
/// mkfs spells them (single, dup, raid0, raid1, raid1c3, raid1c4, raid10, raid5, raid6).
/// mkfs gives devid i+1 to the i-th image (see [`devid_of`]).
pub fn mkfs_set(
    dir: &Path,
    name: &str,
    ndevs: usize,
    size: u64,
    data: &str,
    metadata: &str,
) -> io::Result<Vec<PathBuf>> {
    if ndevs == 0 {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "mkfs_set: ndevs is 0",
        ));
    }
    let images: Vec<PathBuf> = (1..=ndevs)
        .map(|i| dir.join(format!("{name}-{i}.img")))
        .collect();
    for img in &images {
        File::create(img)?.set_len(size)?;
    }
    let mkfs = mkfs_btrfs_for(&[]).unwrap_or_else(|| PathBuf::from("mkfs.btrfs"));
    run(Command::new(mkfs)
        .args(["-f", "-q", "-d", data, "-m", metadata])
        .args(&images))?;
    Ok(images)
}

// ---- superblock facts -------------------------------------------------------------------

// Superblock field offsets (btrfs_super_block): fsid at 0x20, magic at 0x40, and the
// embedded dev_item at 0xc9 whose first field is the devid.
const SB_FSID: u64 = 0x20;
const SB_MAGIC: u64 = 0x40;
const SB_DEVID: u64 = 0xc9;

fn read_super(image: &Path) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; 4096];
    File::open(image)?.read_exact_at(&mut buf, SUPER_OFFSET)?;
    if &buf[SB_MAGIC as usize..SB_MAGIC as usize + 8] != b"_BHRfS_M" {
        return Err(io::Error::other(format!(
            "{}: no btrfs superblock",
            image.display()
        )));
    }
    Ok(buf)
}

/// The devid this image has in its set (the superblock's dev_item; what `btrfs
/// inspect-internal dump-super` prints as `dev_item.devid`).
pub fn devid_of(image: &Path) -> io::Result<u64> {
    let sb = read_super(image)?;
    let at = SB_DEVID as usize;
    Ok(u64::from_le_bytes(sb[at..at + 8].try_into().unwrap()))
}

/// The filesystem UUID as text (`dump-super`'s `fsid`, the name under /sys/fs/btrfs).
pub fn fsid_of(image: &Path) -> io::Result<String> {
    let sb = read_super(image)?;
    let u = &sb[SB_FSID as usize..SB_FSID as usize + 16];
    let hex: String = u.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    ))
}

/// The image of `images` that has `devid`.
pub fn image_of_devid(images: &[PathBuf], devid: u64) -> io::Result<PathBuf> {
    for img in images {
        if devid_of(img)? == devid {
            return Ok(img.clone());
        }
    }
    Err(io::Error::new(
        io::ErrorKind::NotFound,
        format!("no image with devid {devid} among {images:?}"),
    ))
}

// ---- kernel mounts of a set -------------------------------------------------------------

/// A kernel mount of a multi-device set, each member on its own loop device. Unmounts, then
/// forgets and detaches the loop devices (see [`LoopDevice`]) on [`KernelSet::unmount`] and
/// on drop, so that the kernel keeps no memory of the members: a later degraded mount then
/// really misses what it leaves out.
pub struct KernelSet {
    mountpoint: PathBuf,
    fsid: String,
    /// One per image, `None` for a member left out. Dropped only after the unmount.
    loops: Vec<Option<LoopDevice>>,
    mounted: bool,
}

impl KernelSet {
    /// Mounts the members of `images` marked in `present` (an empty `present` means all) at
    /// `mnt` (created if missing) with `opts` plus `device=` for every present member but the
    /// first. Leaving members out needs `degraded` in `opts`; it is not added, so that a test
    /// can see a mount without it fail. With `ro` the loop devices are read-only too.
    ///
    /// After mounting, checks through /sys/fs/btrfs/FSID/devinfo that exactly the members
    /// left out are missing: a member still registered from elsewhere (a leaked loop device)
    /// would otherwise make a "degraded" test read from all devices.
    pub fn mount(
        images: &[PathBuf],
        present: &[bool],
        mnt: &Path,
        opts: &[&str],
    ) -> io::Result<KernelSet> {
        if images.is_empty() || (!present.is_empty() && present.len() != images.len()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "KernelSet::mount: {} images, {} present flags",
                    images.len(),
                    present.len()
                ),
            ));
        }
        let is_present = |i: usize| present.is_empty() || present[i];
        let fsid = fsid_of(&images[0])?;
        for img in images {
            let f = fsid_of(img)?;
            if f != fsid {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{} belongs to {f}, not to {fsid} like {}",
                        img.display(),
                        images[0].display()
                    ),
                ));
            }
        }
        let read_only = opts.iter().any(|o| o.split(',').any(|x| x == "ro"));
        fs::create_dir_all(mnt)?;
        let mut loops = Vec::with_capacity(images.len());
        for (i, img) in images.iter().enumerate() {
            loops.push(if is_present(i) {
                Some(LoopDevice::attach(img, read_only)?)
            } else {
                None
            });
        }
        let devs: Vec<&Path> = loops.iter().flatten().map(|l| l.path()).collect();
        let Some((first, others)) = devs.split_first() else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "KernelSet::mount: no member present",
            ));
        };
        let mut all: Vec<String> = opts
            .iter()
            .filter(|o| !o.is_empty())
            .map(|o| o.to_string())
            .collect();
        all.extend(others.iter().map(|d| format!("device={}", d.display())));
        run(Command::new("mount")
            .args(["-t", "btrfs", "-o", &all.join(",")])
            .arg(first)
            .arg(mnt))?;
        let set = KernelSet {
            mountpoint: mnt.to_path_buf(),
            fsid,
            loops,
            mounted: true,
        };
        let mut want_missing = Vec::new();
        for (i, img) in images.iter().enumerate() {
            if !is_present(i) {
                want_missing.push(devid_of(img)?);
            }
        }
        want_missing.sort_unstable();
        let missing = set.missing_devids()?;
        if missing != want_missing {
            // `set` drops here: unmounted and detached.
            return Err(io::Error::other(format!(
                "mounted {} but the kernel reports devids {missing:?} missing, expected \
                 {want_missing:?} (a member left out is still registered, or a present one \
                 was not taken)",
                mnt.display()
            )));
        }
        Ok(set)
    }

    /// The mount point.
    pub fn root(&self) -> &Path {
        &self.mountpoint
    }

    /// The loop device of each image, `None` for members left out.
    pub fn devices(&self) -> Vec<Option<&Path>> {
        self.loops
            .iter()
            .map(|l| l.as_ref().map(|l| l.path()))
            .collect()
    }

    /// The devids the mounted filesystem has no device for (sorted), from
    /// /sys/fs/btrfs/FSID/devinfo/DEVID/missing.
    pub fn missing_devids(&self) -> io::Result<Vec<u64>> {
        let dir = Path::new("/sys/fs/btrfs").join(&self.fsid).join("devinfo");
        let mut out = Vec::new();
        for e in fs::read_dir(&dir)? {
            let e = e?;
            let Some(devid) = e.file_name().to_str().and_then(|s| s.parse::<u64>().ok()) else {
                continue;
            };
            if fs::read_to_string(e.path().join("missing"))?.trim() != "0" {
                out.push(devid);
            }
        }
        out.sort_unstable();
        Ok(out)
    }

    /// `btrfs scrub start -B -R` (with `-r`, read-only, unless `repair`): the kernel's
    /// verdict on every copy of every block, for comparison with an engine's scrub.
    pub fn scrub(&self, repair: bool) -> io::Result<ScrubStats> {
        let mut c = Command::new("btrfs");
        c.args(["scrub", "start", "-B", "-R"]);
        if !repair {
            c.arg("-r");
        }
        c.arg(&self.mountpoint);
        // Exit status 3 means uncorrectable errors were found: still a result.
        let out = c.output()?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let fields: BTreeMap<String, u64> = text
            .lines()
            .filter_map(|l| {
                let (k, v) = l.trim().split_once(": ")?;
                Some((k.to_string(), v.trim().parse().ok()?))
            })
            .collect();
        if !fields.contains_key("csum_errors") {
            return Err(io::Error::other(format!(
                "btrfs scrub start -B -R {} ({}): no statistics in {text}{}",
                self.mountpoint.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(ScrubStats { fields })
    }

    /// Unmounts now, then forgets and detaches the loop devices, reporting failure.
    pub fn unmount(mut self) -> io::Result<()> {
        self.mounted = false;
        let r = unmount_retrying(&self.mountpoint);
        self.loops.clear();
        r
    }
}

impl Drop for KernelSet {
    fn drop(&mut self) {
        if self.mounted {
            if let Err(e) = unmount_retrying(&self.mountpoint) {
                eprintln!("oleo-testkit: {e}");
            }
        }
        // The loop devices go after the unmount: forget, then detach.
        self.loops.clear();
    }
}

/// Unmounts `mp`, retrying while busy (a just-closed file can hold it a moment), then lazily.
fn unmount_retrying(mp: &Path) -> io::Result<()> {
    let mut last = String::new();
    for attempt in 0..10u64 {
        if mount_at(mp).is_none() {
            return Ok(());
        }
        match run_with_timeout(&mut command("umount", &[mp]), Duration::from_secs(60)) {
            Ok(st) if st.success() => return Ok(()),
            Ok(st) => last = format!("umount exited with {st}"),
            Err(e) => last = e.to_string(),
        }
        std::thread::sleep(Duration::from_millis(100 * (attempt + 1)));
    }
    let _ = run_with_timeout(
        &mut command("umount", &[OsStr::new("-l"), mp.as_os_str()]),
        Duration::from_secs(10),
    );
    Err(io::Error::other(format!(
        "cannot unmount {}: {last} (detached lazily)",
        mp.display()
    )))
}

/// The raw statistics of `btrfs scrub start -B -R` (`csum_errors`, `corrected_errors`,
/// `uncorrectable_errors`, `data_bytes_scrubbed`, ...), summed over all devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScrubStats {
    pub fields: BTreeMap<String, u64>,
}

impl ScrubStats {
    /// A field by its progs name; 0 when absent.
    pub fn get(&self, name: &str) -> u64 {
        self.fields.get(name).copied().unwrap_or(0)
    }
}

/// What `btrfs check --readonly --check-data-csum` says about an unmounted set.
#[derive(Debug, Clone)]
pub struct OfflineCheck {
    /// Exit 0 and no error or warning printed.
    pub clean: bool,
    /// `(mirror, logical)` of every data block whose csum did not match, as progs prints
    /// `mirror N bytenr X csum ...`. Mirror N is the (N-1)-th entry of [`copies`].
    pub csum_mismatches: Vec<(u32, u64)>,
    pub output: String,
}

/// Runs `btrfs check --readonly --check-data-csum` over the whole set: every image on a
/// read-only loop device (progs finds the other members only among block devices), then
/// forgotten and detached again.
pub fn offline_check(images: &[PathBuf]) -> io::Result<OfflineCheck> {
    let loops = images
        .iter()
        .map(|i| LoopDevice::attach(i, true))
        .collect::<io::Result<Vec<_>>>()?;
    let first = loops
        .first()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "offline_check: no images"))?;
    let out = Command::new("btrfs")
        .args(["check", "--readonly", "--check-data-csum"])
        .arg(first.path())
        .output()?;
    let output = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // progs probes every block device for the other members; a loop device of someone
    // else's that is being set up or torn down answers "ERROR: cannot scan /dev/loopN":
    // not about this set.
    let ours: Vec<String> = loops
        .iter()
        .map(|l| l.path().display().to_string())
        .collect();
    let bad = output.lines().any(|l| {
        let low = l.to_ascii_lowercase();
        let foreign_scan = l
            .strip_prefix("ERROR: cannot scan ")
            .and_then(|r| r.split(':').next())
            .is_some_and(|dev| !ours.iter().any(|o| o == dev));
        !foreign_scan
            && ((low.contains("error") && !low.contains("no error"))
                || low.contains("warning")
                || low.contains("mismatch")
                || low.contains("wrong")
                || (low.starts_with("mirror ") && low.contains(" csum ")))
    });
    let clean = out.status.success() && !bad;
    drop(loops);
    let csum_mismatches = output
        .lines()
        .filter_map(|l| {
            // "mirror 1 bytenr 88145920 csum 0x656bd64e expected csum 0xc30adb0e"
            let w: Vec<&str> = l.split_whitespace().collect();
            match w.as_slice() {
                ["mirror", m, "bytenr", b, "csum", ..] => Some((m.parse().ok()?, b.parse().ok()?)),
                _ => None,
            }
        })
        .collect();
    Ok(OfflineCheck {
        clean,
        csum_mismatches,
        output,
    })
}

// ---- the pattern ------------------------------------------------------------------------

/// Block size of the pattern: one sector.
pub const BLOCK: usize = 4096;

/// The pattern files [`fill`] writes: (file id, path, size). Every 4 KiB block names its file
/// and its index (see [`pattern_block`]), so a misplaced stripe shows which block it is.
/// Sizes span several 64 KiB stripes and several RAID0/10 rows on 4 devices; the odd one
/// ends in a partial block.
pub const PATTERN_FILES: &[(u32, &str, u64)] = &[
    (1, "patterns/p1", 1 << 20),
    (2, "patterns/p2-odd", (3 << 20) + 123),
    (3, "patterns/p3", 16 << 20),
];

/// The sparse file [`fill`] writes: pattern id 4, data only in the blocks of
/// [`SPARSE_BLOCKS`], holes elsewhere (also a trailing one up to 3 MiB).
pub const SPARSE_FILE: (u32, &str, u64) = (4, "sparse", 3 << 20);
/// Block index ranges of [`SPARSE_FILE`] that hold data.
pub const SPARSE_BLOCKS: &[std::ops::Range<u64>] = &[16..32, 257..258];

/// The 4 KiB block `index` of pattern file `file_id`: the 16-byte record
/// `fIIII:bNNNNNNNN\n` repeated (readable in a hex dump of a raw image).
pub fn pattern_block(file_id: u32, index: u64) -> Vec<u8> {
    let rec = format!("f{:04}:b{:08}\n", file_id % 10_000, index % 100_000_000);
    debug_assert_eq!(rec.len(), 16);
    rec.as_bytes().repeat(BLOCK / 16)
}

/// `(file id, block index)` if `block` is a whole [`pattern_block`].
pub fn parse_pattern_block(block: &[u8]) -> Option<(u32, u64)> {
    if block.len() != BLOCK {
        return None;
    }
    let rec = &block[..16];
    if rec[0] != b'f' || &rec[5..7] != b":b" || rec[15] != b'\n' {
        return None;
    }
    let id = std::str::from_utf8(&rec[1..5]).ok()?.parse().ok()?;
    let idx = std::str::from_utf8(&rec[7..15]).ok()?.parse().ok()?;
    block.chunks(16).all(|c| c == rec).then_some((id, idx))
}

/// A short description of a 4 KiB block for difference reports.
fn describe_block(b: &[u8]) -> String {
    if let Some((id, idx)) = parse_pattern_block(b) {
        format!("pattern f{id:04}:b{idx:08}")
    } else if b.iter().all(|&x| x == 0) {
        "zeros".to_string()
    } else if b.iter().all(|&x| x == b[0]) {
        format!("all {:#04x}", b[0])
    } else {
        let n = b.len().min(16);
        let hex: String = b[..n].iter().map(|x| format!("{x:02x}")).collect();
        format!("other data ({hex}..)")
    }
}

// ---- the manifest -----------------------------------------------------------------------

/// One path of a [`Manifest`].
#[derive(Clone, PartialEq, Eq)]
pub struct Entry {
    /// File, Dir or Symlink (anything else is recorded as what stat says).
    pub kind: Kind,
    /// The full contents of a regular file (empty for other kinds).
    pub data: Vec<u8>,
    /// The target of a symlink.
    pub target: Option<PathBuf>,
    /// Every xattr (`llistxattr`), `btrfs.compression` included when set.
    pub xattrs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// For the second and later names of a hard-linked file: the first name (in sorted walk
    /// order) of the same inode.
    pub hard_link_of: Option<PathBuf>,
}

impl fmt::Debug for Entry {
    // Not derived: the data of a 16 MiB file must not end up in a panic message.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let sha: String = Sha256::digest(&self.data)[..8]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        f.debug_struct("Entry")
            .field("kind", &self.kind)
            .field("len", &self.data.len())
            .field("sha256", &format_args!("{sha}.."))
            .field("target", &self.target)
            .field("xattrs", &self.xattrs.len())
            .field("hard_link_of", &self.hard_link_of)
            .finish()
    }
}

/// Everything below a root (the root itself excluded), sorted by relative path.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Manifest {
    pub files: Vec<(PathBuf, Entry)>,
}

impl Manifest {
    /// Reads everything below `root`: kinds, contents, symlink targets, xattrs, hard links.
    /// Fails on the first path that cannot be read.
    pub fn capture(root: &Path) -> io::Result<Manifest> {
        let mut files = Vec::new();
        for (p, e) in walk(root)? {
            files.push((
                p.clone(),
                e.map_err(|why| io::Error::other(format!("{}: {why}", p.display())))?,
            ));
        }
        Ok(Manifest { files })
    }

    /// The entry of a relative path.
    pub fn get(&self, path: impl AsRef<Path>) -> Option<&Entry> {
        let path = path.as_ref();
        self.files.iter().find(|(p, _)| p == path).map(|(_, e)| e)
    }

    /// Compares a mounted tree with this manifest: Err names every difference, one per line
    /// (missing and extra paths, kinds, contents with the first differing block, symlink
    /// targets, xattrs, hard links, read errors).
    pub fn check_dir(&self, root: &Path) -> Result<(), String> {
        let found: BTreeMap<PathBuf, Result<Entry, String>> = walk(root)
            .map_err(|e| format!("{}: cannot read: {e}", root.display()))?
            .into_iter()
            .collect();
        let mut diffs = Vec::new();
        for (p, want) in &self.files {
            match found.get(p) {
                None => diffs.push(format!("{}: missing", p.display())),
                Some(Err(why)) => diffs.push(format!("{}: {why}", p.display())),
                Some(Ok(got)) => diff_entry(p, want, got, &mut diffs),
            }
        }
        let expected: std::collections::HashSet<&PathBuf> =
            self.files.iter().map(|(p, _)| p).collect();
        for p in found.keys().filter(|p| !expected.contains(p)) {
            diffs.push(format!("{}: unexpected", p.display()));
        }
        report(diffs)
    }

    /// Compares the contents of every regular file with what `read(relative path)` returns
    /// (None: cannot be read), e.g. reads through the oleo library instead of a mount.
    /// Only contents are checked; directories, symlinks and xattrs need [`check_dir`].
    ///
    /// [`check_dir`]: Manifest::check_dir
    pub fn check_with(&self, mut read: impl FnMut(&Path) -> Option<Vec<u8>>) -> Result<(), String> {
        let mut diffs = Vec::new();
        for (p, want) in &self.files {
            if want.kind != Kind::File {
                continue;
            }
            match read(p) {
                None => diffs.push(format!("{}: cannot be read", p.display())),
                Some(got) => diff_data(p, &want.data, &got, &mut diffs),
            }
        }
        report(diffs)
    }
}

fn report(diffs: Vec<String>) -> Result<(), String> {
    if diffs.is_empty() {
        Ok(())
    } else {
        Err(diffs.join("\n"))
    }
}

fn diff_entry(p: &Path, want: &Entry, got: &Entry, diffs: &mut Vec<String>) {
    let d = p.display();
    if want.kind != got.kind {
        diffs.push(format!("{d}: kind {:?}, found {:?}", want.kind, got.kind));
        return;
    }
    if want.kind == Kind::File {
        diff_data(p, &want.data, &got.data, diffs);
    }
    if want.target != got.target {
        diffs.push(format!(
            "{d}: symlink target {:?}, found {:?}",
            want.target, got.target
        ));
    }
    if want.hard_link_of != got.hard_link_of {
        diffs.push(format!(
            "{d}: hard link of {:?}, found {:?}",
            want.hard_link_of, got.hard_link_of
        ));
    }
    for (name, v) in &want.xattrs {
        let n = String::from_utf8_lossy(name);
        match got.xattrs.get(name) {
            None => diffs.push(format!("{d}: xattr {n} missing")),
            Some(g) if g != v => diffs.push(format!(
                "{d}: xattr {n} is {:?}, found {:?}",
                String::from_utf8_lossy(v),
                String::from_utf8_lossy(g)
            )),
            Some(_) => {}
        }
    }
    for name in got.xattrs.keys().filter(|n| !want.xattrs.contains_key(*n)) {
        diffs.push(format!(
            "{d}: unexpected xattr {}",
            String::from_utf8_lossy(name)
        ));
    }
}

/// Names the size difference and the first differing 4 KiB block (described as a pattern
/// block when it is one, so a stripe read from the wrong place is recognisable).
fn diff_data(p: &Path, want: &[u8], got: &[u8], diffs: &mut Vec<String>) {
    if want == got {
        return;
    }
    let d = p.display();
    if want.len() != got.len() {
        diffs.push(format!("{d}: size {}, found {}", want.len(), got.len()));
    }
    let common = want.len().min(got.len());
    let Some(first) = (0..common).find(|&i| want[i] != got[i]) else {
        return;
    };
    let blocks = |b: &[u8]| b.chunks(BLOCK).map(<[u8]>::to_vec).collect::<Vec<_>>();
    let (wb, gb) = (blocks(&want[..common]), blocks(&got[..common]));
    let bad = wb.iter().zip(&gb).filter(|(a, b)| a != b).count();
    let i = first / BLOCK;
    diffs.push(format!(
        "{d}: contents differ from byte {first} (block {i}): expected {}, found {}; \
         {bad} of {} blocks differ",
        describe_block(&wb[i]),
        describe_block(&gb[i]),
        wb.len()
    ));
}

/// Every path below `root` in sorted order, with its entry or why it could not be read.
fn walk(root: &Path) -> io::Result<Vec<(PathBuf, Result<Entry, String>)>> {
    let mut out = Vec::new();
    let mut inodes: HashMap<(u64, u64), PathBuf> = HashMap::new();
    walk_dir(root, Path::new(""), &mut inodes, &mut out)?;
    Ok(out)
}

fn walk_dir(
    root: &Path,
    rel: &Path,
    inodes: &mut HashMap<(u64, u64), PathBuf>,
    out: &mut Vec<(PathBuf, Result<Entry, String>)>,
) -> io::Result<()> {
    let mut names: Vec<_> = fs::read_dir(root.join(rel))?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<io::Result<_>>()?;
    names.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
    for name in names {
        let rp = rel.join(&name);
        let entry = observe(&root.join(&rp), &rp, inodes);
        let is_dir = matches!(&entry, Ok(e) if e.kind == Kind::Dir);
        out.push((rp.clone(), entry));
        if is_dir {
            if let Err(e) = walk_dir(root, &rp, inodes, out) {
                out.push((rp.join("*"), Err(format!("readdir: {e}"))));
            }
        }
    }
    Ok(())
}

fn observe(
    path: &Path,
    rel: &Path,
    inodes: &mut HashMap<(u64, u64), PathBuf>,
) -> Result<Entry, String> {
    let md = fs::symlink_metadata(path).map_err(|e| format!("lstat: {e}"))?;
    let kind = Kind::from_mode(md.mode());
    let mut e = Entry {
        kind,
        data: Vec::new(),
        target: None,
        xattrs: read_xattrs(path).map_err(|e| format!("xattrs: {e}"))?,
        hard_link_of: None,
    };
    match kind {
        Kind::File => {
            e.data = fs::read(path).map_err(|e| format!("read: {e}"))?;
            if md.nlink() > 1 {
                let first = inodes
                    .entry((md.dev(), md.ino()))
                    .or_insert_with(|| rel.to_path_buf());
                if first != rel {
                    e.hard_link_of = Some(first.clone());
                }
            }
        }
        Kind::Symlink => {
            e.target = Some(fs::read_link(path).map_err(|e| format!("readlink: {e}"))?)
        }
        _ => {}
    }
    Ok(e)
}

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

/// Calls a listxattr/getxattr-style function with a buffer of the size it asks for.
fn sized(mut f: impl FnMut(*mut u8, usize) -> isize) -> io::Result<Vec<u8>> {
    loop {
        let need = f(std::ptr::null_mut(), 0);
        if need < 0 {
            return Err(io::Error::last_os_error());
        }
        let mut buf = vec![0u8; need as usize];
        let n = f(buf.as_mut_ptr(), buf.len());
        if n >= 0 {
            buf.truncate(n as usize);
            return Ok(buf);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ERANGE) {
            return Err(e);
        }
        // Grew in between: ask again.
    }
}

fn read_xattrs(path: &Path) -> io::Result<BTreeMap<Vec<u8>, Vec<u8>>> {
    let c = cpath(path)?;
    // SAFETY: valid C string; the buffer pointer/length pair is valid or null/0.
    let names = match sized(|p, n| unsafe { libc::llistxattr(c.as_ptr(), p.cast(), n) }) {
        Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return Ok(BTreeMap::new()),
        r => r?,
    };
    let mut out = BTreeMap::new();
    for name in names.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let cn = CString::new(name).expect("split on NUL");
        // SAFETY: as above.
        let v = sized(|p, n| unsafe { libc::lgetxattr(c.as_ptr(), cn.as_ptr(), p.cast(), n) })?;
        out.insert(name.to_vec(), v);
    }
    Ok(out)
}

// ---- filling ----------------------------------------------------------------------------

const FS_NOCOMP_FL: libc::c_long = 0x0000_0400;

/// `chattr +m`: never compress this file, so that its blocks lie 1:1 at their logical
/// addresses (a `compress=` mount option would otherwise scramble the pattern; only
/// `compress-force` overrides it, and [`fill`] then fails).
fn set_nocompress(f: &File) -> io::Result<()> {
    let mut cur: libc::c_long = 0;
    // SAFETY: valid fd; both ioctls take a pointer to a long.
    unsafe {
        if libc::ioctl(f.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut cur) < 0 {
            return Err(io::Error::last_os_error());
        }
        cur |= FS_NOCOMP_FL;
        if libc::ioctl(f.as_raw_fd(), libc::FS_IOC_SETFLAGS, &cur) < 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

fn write_pattern_file(
    p: &Path,
    id: u32,
    size: u64,
    blocks: &[std::ops::Range<u64>],
) -> io::Result<()> {
    let f = OpenOptions::new().write(true).create_new(true).open(p)?;
    set_nocompress(&f)?;
    for r in blocks {
        let mut buf = Vec::with_capacity(((r.end - r.start) as usize) * BLOCK);
        for i in r.clone() {
            buf.extend(pattern_block(id, i));
        }
        let off = r.start * BLOCK as u64;
        let end = (off + buf.len() as u64).min(size);
        f.write_all_at(&buf[..(end - off) as usize], off)?;
    }
    f.set_len(size)
}

fn ctx<T>(r: io::Result<T>, what: &str) -> io::Result<T> {
    r.map_err(|e| io::Error::new(e.kind(), format!("fill: {what}: {e}")))
}

/// Writes, through a kernel mount at `root` (of an empty filesystem), a bit of everything
/// a multi-device reader must place right, and returns its [`Manifest`] (read back through
/// the mount):
/// - `patterns/`: [`PATTERN_FILES`] (1 MiB, 3 MiB + 123 bytes, 16 MiB), never compressed;
/// - `sparse`: [`SPARSE_FILE`], pattern blocks between holes;
/// - `small/inline-100` (an inline extent), `small/sector-3000` (past max_inline), `empty`;
/// - `xattrs/file` and the `xattrs` directory with user xattrs (one binary);
/// - `links/`: a relative symlink, a dangling one, a 1000-byte target, a hard link to p1;
/// - `tree/`: a four-level directory chain and 300 small files in one directory;
/// - `compressed/words`: 512 KiB of text with `btrfs.compression=zstd` (checked compressed).
///
/// `seed` varies the non-pattern contents. Everything is synced; unmount to have it on disk.
pub fn fill(root: &Path, seed: u64) -> io::Result<Manifest> {
    let mut rng = StdRng::seed_from_u64(seed);
    for d in [
        "patterns",
        "small",
        "xattrs",
        "links",
        "tree/a/b/c/d",
        "tree/many",
        "compressed",
    ] {
        ctx(fs::create_dir_all(root.join(d)), d)?;
    }
    for &(id, name, size) in PATTERN_FILES {
        let blocks = size.div_ceil(BLOCK as u64);
        ctx(
            write_pattern_file(
                &root.join(name),
                id,
                size,
                std::slice::from_ref(&(0..blocks)),
            ),
            name,
        )?;
    }
    let (sid, sname, ssize) = SPARSE_FILE;
    ctx(
        write_pattern_file(&root.join(sname), sid, ssize, SPARSE_BLOCKS),
        sname,
    )?;

    ctx(
        write_file(&root.join("small/inline-100"), &random_bytes(&mut rng, 100)),
        "small/inline-100",
    )?;
    ctx(
        write_file(
            &root.join("small/sector-3000"),
            &random_bytes(&mut rng, 3000),
        ),
        "small/sector-3000",
    )?;
    ctx(write_file(&root.join("empty"), b""), "empty")?;

    let xf = root.join("xattrs/file");
    ctx(write_file(&xf, b"a file with xattrs\n"), "xattrs/file")?;
    ctx(set_xattr(&xf, "user.alpha", b"1"), "xattrs/file")?;
    ctx(
        set_xattr(&xf, "user.seed", seed.to_string().as_bytes()),
        "xattrs/file",
    )?;
    let mut bin = random_bytes(&mut rng, 200);
    bin[7] = 0; // a NUL inside a value
    ctx(set_xattr(&xf, "user.binary", &bin), "xattrs/file")?;
    ctx(
        set_xattr(&root.join("xattrs"), "user.dir", b"yes"),
        "xattrs",
    )?;

    let links = root.join("links");
    ctx(
        std::os::unix::fs::symlink("../patterns/p1", links.join("to-p1")),
        "links/to-p1",
    )?;
    ctx(
        std::os::unix::fs::symlink("nowhere/at/all", links.join("dangling")),
        "links/dangling",
    )?;
    ctx(
        std::os::unix::fs::symlink("long/".repeat(200), links.join("long")),
        "links/long",
    )?;
    ctx(
        fs::hard_link(root.join("patterns/p1"), links.join("p1-hard")),
        "links/p1-hard",
    )?;

    ctx(
        write_file(
            &root.join("tree/a/b/c/d/leaf"),
            &random_bytes(&mut rng, 1024),
        ),
        "tree leaf",
    )?;
    ctx(
        write_file(
            &root.join("tree/a/file"),
            format!("seed {seed}\n").as_bytes(),
        ),
        "tree/a/file",
    )?;
    for i in 0..300 {
        let p = root.join(format!("tree/many/f{i:03}"));
        ctx(
            write_file(&p, format!("{seed}:{i}\n").as_bytes()),
            "tree/many",
        )?;
    }

    // The property must be set while the file is empty: it applies to later writes.
    let cf = root.join("compressed/words");
    ctx(write_file(&cf, b""), "compressed/words")?;
    ctx(
        set_xattr(&cf, "btrfs.compression", b"zstd"),
        "compressed/words",
    )?;
    let mut f = ctx(OpenOptions::new().write(true).open(&cf), "compressed/words")?;
    ctx(
        f.write_all(&compressible(&mut rng, 512 << 10)),
        "compressed/words",
    )?;
    drop(f);

    ctx(syncfs(root), "syncfs")?;

    // The fixture must hold what it promises.
    for name in PATTERN_FILES.iter().map(|p| p.1).chain([SPARSE_FILE.1]) {
        let ext = ctx(fiemap(&root.join(name)), name)?;
        if ext.iter().any(|e| e.flags & FIEMAP_EXTENT_ENCODED != 0) {
            return Err(io::Error::other(format!(
                "fill: {name} was compressed despite chattr +m (compress-force?): its \
                 pattern no longer lies 1:1 at its logical addresses"
            )));
        }
    }
    let ext = ctx(fiemap(&cf), "compressed/words")?;
    if !ext.iter().any(|e| e.flags & FIEMAP_EXTENT_ENCODED != 0) {
        return Err(io::Error::other(format!(
            "fill: compressed/words has no compressed extent: {ext:?}"
        )));
    }
    ctx(Manifest::capture(root), "reading back")
}

// ---- where the data is ------------------------------------------------------------------

/// Block group type and profile bits (`btrfs_block_group_item.flags`, chunk `type`).
pub const BG_DATA: u64 = 1 << 0;
pub const BG_SYSTEM: u64 = 1 << 1;
pub const BG_METADATA: u64 = 1 << 2;
pub const BG_RAID0: u64 = 1 << 3;
pub const BG_RAID1: u64 = 1 << 4;
pub const BG_DUP: u64 = 1 << 5;
pub const BG_RAID10: u64 = 1 << 6;
pub const BG_RAID5: u64 = 1 << 7;
pub const BG_RAID6: u64 = 1 << 8;
pub const BG_RAID1C3: u64 = 1 << 9;
pub const BG_RAID1C4: u64 = 1 << 10;

const BG_NAMES: &[(&str, u64)] = &[
    ("DATA", BG_DATA),
    ("SYSTEM", BG_SYSTEM),
    ("METADATA", BG_METADATA),
    ("RAID0", BG_RAID0),
    ("RAID1", BG_RAID1),
    ("DUP", BG_DUP),
    ("RAID10", BG_RAID10),
    ("RAID5", BG_RAID5),
    ("RAID6", BG_RAID6),
    ("RAID1C3", BG_RAID1C3),
    ("RAID1C4", BG_RAID1C4),
];

/// One chunk item of the chunk tree: `length` bytes of logical address space from
/// `logical`, laid out on `stripes` as `(devid, physical offset)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub logical: u64,
    pub length: u64,
    /// Type and profile bits (`BG_*`).
    pub flags: u64,
    pub stripes: Vec<(u64, u64)>,
    pub stripe_len: u64,
    pub sub_stripes: u64,
}

impl Chunk {
    /// The profile as mkfs spells it.
    pub fn profile(&self) -> &'static str {
        [
            (BG_RAID0, "raid0"),
            (BG_RAID1, "raid1"),
            (BG_DUP, "dup"),
            (BG_RAID10, "raid10"),
            (BG_RAID5, "raid5"),
            (BG_RAID6, "raid6"),
            (BG_RAID1C3, "raid1c3"),
            (BG_RAID1C4, "raid1c4"),
        ]
        .iter()
        .find(|(b, _)| self.flags & b != 0)
        .map_or("single", |(_, n)| n)
    }

    pub fn contains(&self, logical: u64) -> bool {
        logical >= self.logical && logical - self.logical < self.length
    }
}

/// The chunks of the set `image` belongs to, from `btrfs inspect-internal dump-tree -t chunk
/// --noscan IMAGE`. One member is enough when the system chunk is mirrored (single, dup,
/// raid1*); with a striped one (raid0/10/5/6) use [`chunk_map_all`].
pub fn chunk_map(image: &Path) -> io::Result<Vec<Chunk>> {
    chunk_map_all(&[image.to_path_buf()])
}

/// [`chunk_map`] reading from every image of the set (`--noscan`: only these images, never a
/// block device that happens to carry the same fsid).
pub fn chunk_map_all(images: &[PathBuf]) -> io::Result<Vec<Chunk>> {
    let text = run_stdout(
        Command::new("btrfs")
            .args(["inspect-internal", "dump-tree", "-t", "chunk", "--noscan"])
            .args(images),
    )?;
    let chunks = parse_chunk_tree(&text)?;
    if chunks.is_empty() {
        return Err(io::Error::other(format!(
            "no chunk items in dump-tree -t chunk of {images:?}"
        )));
    }
    Ok(chunks)
}

/// Parses the CHUNK_ITEMs of a `dump-tree -t chunk` listing:
/// ```text
/// item 4 key (FIRST_CHUNK_TREE CHUNK_ITEM 63963136) itemoff 15751 itemsize 112
///     length 67108864 owner 2 stripe_len 65536 type DATA|RAID1
///     ...
///     num_stripes 2 sub_stripes 1
///         stripe 0 devid 1 offset 63963136
/// ```
pub fn parse_chunk_tree(text: &str) -> io::Result<Vec<Chunk>> {
    let bad = |l: &str| io::Error::other(format!("dump-tree: cannot parse {l:?}"));
    let num = |s: Option<&&str>, l: &str| -> io::Result<u64> {
        s.and_then(|s| s.trim_end_matches(')').parse().ok())
            .ok_or_else(|| bad(l))
    };
    let mut out: Vec<Chunk> = Vec::new();
    let mut cur: Option<Chunk> = None;
    for line in text.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if w.first() == Some(&"item") {
            out.extend(cur.take());
            if let Some(i) = w.iter().position(|x| *x == "CHUNK_ITEM") {
                cur = Some(Chunk {
                    logical: num(w.get(i + 1), line)?,
                    length: 0,
                    flags: 0,
                    stripes: Vec::new(),
                    stripe_len: 0,
                    sub_stripes: 1,
                });
            }
            continue;
        }
        let Some(c) = cur.as_mut() else { continue };
        match w.first().copied() {
            Some("length") => {
                let at = |k: &str| w.iter().position(|x| *x == k).map(|i| i + 1);
                c.length = num(w.get(1), line)?;
                c.stripe_len = num(at("stripe_len").and_then(|i| w.get(i)), line)?;
                let ty = at("type").and_then(|i| w.get(i)).ok_or_else(|| bad(line))?;
                for name in ty.split('|') {
                    if name.eq_ignore_ascii_case("single") {
                        continue;
                    }
                    let bit = BG_NAMES
                        .iter()
                        .find(|(n, _)| *n == name)
                        .ok_or_else(|| bad(line))?;
                    c.flags |= bit.1;
                }
            }
            Some("num_stripes") => {
                let i = w
                    .iter()
                    .position(|x| *x == "sub_stripes")
                    .ok_or_else(|| bad(line))?;
                c.sub_stripes = num(w.get(i + 1), line)?;
            }
            Some("stripe") if w.get(2) == Some(&"devid") => {
                c.stripes.push((num(w.get(3), line)?, num(w.get(5), line)?));
            }
            _ => {}
        }
    }
    out.extend(cur);
    Ok(out)
}

/// Where the byte at `logical` is stored, as `(devid, physical)`, in the kernel's order
/// (entry i is mirror i+1 in kernel and progs messages). Empty if no chunk holds it.
/// - single, dup, raid1, raid1c3, raid1c4: every copy;
/// - raid0: the one 64 KiB stripe holding it (stripe_nr = off / 64K on device
///   stripe_nr % n at row stripe_nr / n);
/// - raid10: its `sub_stripes` mirrors (slot (stripe_nr % (n / sub)) * sub + mirror);
/// - raid5/raid6: the data block only (the parity that can rebuild it is not listed);
///   rows rotate as in the kernel: device (row + stripe_nr % ndata) % n.
pub fn copies(chunks: &[Chunk], logical: u64) -> Vec<(u64, u64)> {
    let Some(c) = chunks.iter().find(|c| c.contains(logical)) else {
        return Vec::new();
    };
    let off = logical - c.logical;
    let n = c.stripes.len() as u64;
    let sl = c.stripe_len.max(1);
    let (nr, in_stripe) = (off / sl, off % sl);
    let at = |slot: u64, row: u64| {
        let (devid, start) = c.stripes[slot as usize];
        (devid, start + row * sl + in_stripe)
    };
    if c.flags & BG_RAID0 != 0 {
        vec![at(nr % n, nr / n)]
    } else if c.flags & BG_RAID10 != 0 {
        let sub = c.sub_stripes.max(1);
        let factor = n / sub;
        let first = (nr % factor) * sub;
        (0..sub).map(|m| at(first + m, nr / factor)).collect()
    } else if c.flags & (BG_RAID5 | BG_RAID6) != 0 {
        let ndata = n - if c.flags & BG_RAID6 != 0 { 2 } else { 1 };
        let row = nr / ndata;
        vec![at((row + nr % ndata) % n, row)]
    } else {
        c.stripes.iter().map(|&(d, p)| (d, p + off)).collect()
    }
}

// FIEMAP (linux/fiemap.h).
const FS_IOC_FIEMAP: libc::c_ulong = 0xC020_660B;
const FIEMAP_FLAG_SYNC: u32 = 0x1;
pub const FIEMAP_EXTENT_LAST: u32 = 0x1;
pub const FIEMAP_EXTENT_UNKNOWN: u32 = 0x2;
pub const FIEMAP_EXTENT_DELALLOC: u32 = 0x4;
pub const FIEMAP_EXTENT_ENCODED: u32 = 0x8;
pub const FIEMAP_EXTENT_NOT_ALIGNED: u32 = 0x100;
pub const FIEMAP_EXTENT_DATA_INLINE: u32 = 0x200;
pub const FIEMAP_EXTENT_UNWRITTEN: u32 = 0x800;
pub const FIEMAP_EXTENT_SHARED: u32 = 0x2000;

/// One FIEMAP record; on btrfs `physical` is the btrfs *logical* address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FiemapExtent {
    pub file_offset: u64,
    pub physical: u64,
    pub len: u64,
    pub flags: u32,
}

/// FS_IOC_FIEMAP (with FIEMAP_FLAG_SYNC, so delayed allocation is written first): what
/// `filefrag -v` shows, in bytes.
pub fn fiemap(path: &Path) -> io::Result<Vec<FiemapExtent>> {
    const HDR: usize = 32; // struct fiemap
    const EXT: usize = 56; // struct fiemap_extent
    const N: usize = 256;
    let f = File::open(path)?;
    let mut out = Vec::new();
    let mut start = 0u64;
    loop {
        // u64 words: the kernel structs are 8-byte aligned.
        let mut buf = vec![0u64; (HDR + N * EXT) / 8];
        buf[0] = start; // fm_start
        buf[1] = u64::MAX - start; // fm_length
        let words = &mut buf[2..4];
        // fm_flags, fm_mapped_extents | fm_extent_count, fm_reserved (little endian u32s)
        words[0] = FIEMAP_FLAG_SYNC as u64;
        words[1] = N as u64;
        // SAFETY: valid fd and a buffer as large as the header plus N extents.
        if unsafe { libc::ioctl(f.as_raw_fd(), FS_IOC_FIEMAP as _, buf.as_mut_ptr()) } < 0 {
            return Err(io::Error::new(
                io::Error::last_os_error().kind(),
                format!("FIEMAP {}: {}", path.display(), io::Error::last_os_error()),
            ));
        }
        let mapped = (buf[2] >> 32) as usize;
        let mut last = false;
        for i in 0..mapped.min(N) {
            let e = &buf[(HDR + i * EXT) / 8..(HDR + (i + 1) * EXT) / 8];
            let x = FiemapExtent {
                file_offset: e[0],
                physical: e[1],
                len: e[2],
                flags: e[5] as u32,
            };
            last |= x.flags & FIEMAP_EXTENT_LAST != 0;
            start = x.file_offset + x.len;
            out.push(x);
        }
        if mapped == 0 || last {
            return Ok(out);
        }
    }
}

/// `(file offset, logical, len)` of every extent of a file on a kernel mount whose bytes
/// lie unchanged at its logical address. Inline, compressed (encoded), preallocated and
/// not-yet-allocated extents are left out: there is nothing 1:1 to damage there.
pub fn file_logical_extents(kernel_mounted_file: &Path) -> io::Result<Vec<(u64, u64, u64)>> {
    const SKIP: u32 = FIEMAP_EXTENT_UNKNOWN
        | FIEMAP_EXTENT_DELALLOC
        | FIEMAP_EXTENT_ENCODED
        | FIEMAP_EXTENT_NOT_ALIGNED
        | FIEMAP_EXTENT_DATA_INLINE
        | FIEMAP_EXTENT_UNWRITTEN;
    Ok(fiemap(kernel_mounted_file)?
        .into_iter()
        .filter(|e| e.flags & SKIP == 0)
        .map(|e| (e.file_offset, e.physical, e.len))
        .collect())
}

/// Overwrites `len` bytes of an (unmounted) image at `physical` with `byte`, and syncs.
pub fn overwrite(image: &Path, physical: u64, len: usize, byte: u8) -> io::Result<()> {
    let f = OpenOptions::new().write(true).open(image)?;
    f.write_all_at(&vec![byte; len], physical)?;
    f.sync_data()
}

/// Reads `len` bytes of an image at `physical`.
pub fn read_image(image: &Path, physical: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    File::open(image)?.read_exact_at(&mut buf, physical)?;
    Ok(buf)
}

/// Reads a file on a kernel mount once per mirror, returning each read's contents (index =
/// mirror slot). The kernel picks the mirror of a raid1*/raid10 read by the reading thread's
/// id (`pid % copies`, read_policy "pid"), so this reads from threads until every residue
/// was used, dropping the page cache of the file before each read; reading every copy is
/// what makes the kernel notice (and repair, on a writable mount) a damaged one.
pub fn read_from_every_mirror(path: &Path, copies: usize) -> io::Result<Vec<Vec<u8>>> {
    let copies = copies.max(1);
    let mut got: Vec<Option<Vec<u8>>> = vec![None; copies];
    for _ in 0..64 * copies {
        if got.iter().all(Option::is_some) {
            break;
        }
        let p = path.to_path_buf();
        let want: Vec<bool> = got.iter().map(Option::is_none).collect();
        let r = std::thread::spawn(move || -> io::Result<Option<(usize, Vec<u8>)>> {
            // SAFETY: gettid has no preconditions.
            let slot = unsafe { libc::gettid() } as usize % want.len();
            if !want[slot] {
                return Ok(None);
            }
            let f = File::open(&p)?;
            let drop_cache = |f: &File| {
                // SAFETY: valid fd.
                unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
            };
            drop_cache(&f);
            let data = fs::read(&p)?;
            drop_cache(&f);
            Ok(Some((slot, data)))
        })
        .join()
        .map_err(|_| io::Error::other("reader thread panicked"))??;
        if let Some((slot, data)) = r {
            got[slot] = Some(data);
        }
    }
    got.into_iter()
        .map(|g| g.ok_or_else(|| io::Error::other("no reader thread got every pid residue")))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::require_root;
    use crate::tempdir::TempDir;

    const MIB: u64 = 1 << 20;

    #[test]
    fn pattern_blocks_round_trip() {
        let b = pattern_block(3, 17);
        assert_eq!(b.len(), BLOCK);
        assert_eq!(&b[..16], b"f0003:b00000017\n");
        assert_eq!(parse_pattern_block(&b), Some((3, 17)));
        let mut c = b.clone();
        c[100] = b'x';
        assert_eq!(parse_pattern_block(&c), None);
        assert_eq!(describe_block(&vec![0; BLOCK]), "zeros");
    }

    #[test]
    fn chunk_tree_dump_is_parsed() {
        let text = "\
chunk tree
leaf 22036480 items 5 free space 15626 generation 6 owner CHUNK_TREE
\titem 1 key (DEV_ITEMS DEV_ITEM 2) itemoff 16087 itemsize 98
\t\tdevid 2 total_bytes 268435456 bytes_used 109051904
\titem 2 key (FIRST_CHUNK_TREE CHUNK_ITEM 22020096) itemoff 15975 itemsize 112
\t\tlength 8388608 owner 2 stripe_len 65536 type SYSTEM|RAID1
\t\tio_align 65536 io_width 65536 sector_size 4096
\t\tnum_stripes 2 sub_stripes 1
\t\t\tstripe 0 devid 1 offset 22020096
\t\t\tdev_uuid 8b49aa00-c611-4359-b29e-23e89c2eec59
\t\t\tstripe 1 devid 2 offset 1048576
\t\t\tdev_uuid 2c36add3-5279-4ba6-ae63-2d264494ba02
\titem 4 key (FIRST_CHUNK_TREE CHUNK_ITEM 63963136) itemoff 15751 itemsize 112
\t\tlength 134217728 owner 2 stripe_len 65536 type DATA|RAID10
\t\tnum_stripes 4 sub_stripes 2
\t\t\tstripe 0 devid 1 offset 59768832
\t\t\tstripe 1 devid 2 offset 38797312
\t\t\tstripe 2 devid 3 offset 38797312
\t\t\tstripe 3 devid 4 offset 38797312
\titem 5 key (FIRST_CHUNK_TREE CHUNK_ITEM 200000000) itemoff 15751 itemsize 80
\t\tlength 8388608 owner 2 stripe_len 65536 type DATA
\t\tnum_stripes 1 sub_stripes 1
\t\t\tstripe 0 devid 2 offset 9000000
";
        let c = parse_chunk_tree(text).unwrap();
        assert_eq!(c.len(), 3);
        assert_eq!(c[0].logical, 22020096);
        assert_eq!(c[0].flags, BG_SYSTEM | BG_RAID1);
        assert_eq!(c[0].stripes, vec![(1, 22020096), (2, 1048576)]);
        assert_eq!(c[1].profile(), "raid10");
        assert_eq!((c[1].sub_stripes, c[1].stripe_len), (2, 65536));
        assert_eq!(c[2].profile(), "single");
        assert_eq!(c[2].flags, BG_DATA);
    }

    fn chunk(flags: u64, n: u64, sub: u64) -> Chunk {
        Chunk {
            logical: 1 << 30,
            length: 1 << 30,
            flags: BG_DATA | flags,
            stripes: (0..n).map(|i| (i + 1, (i + 1) * 1000 * 65536)).collect(),
            stripe_len: 65536,
            sub_stripes: sub,
        }
    }

    #[test]
    fn copies_follow_the_kernel_layout() {
        let k = 65536u64;
        let base = 1u64 << 30;
        let s = |d: u64| d * 1000 * k; // stripe start of devid d
                                       // raid1: both copies at the same offset.
        let c = [chunk(BG_RAID1, 2, 1)];
        assert_eq!(copies(&c, base + 5), vec![(1, s(1) + 5), (2, s(2) + 5)]);
        assert!(copies(&c, base - 1).is_empty());
        // raid0 on 4: stripe 5 = device slot 1, row 1.
        let c = [chunk(BG_RAID0, 4, 1)];
        assert_eq!(copies(&c, base + 5 * k + 7), vec![(2, s(2) + k + 7)]);
        // raid10 on 4 (factor 2): stripe 3 = slots 2,3, row 1.
        let c = [chunk(BG_RAID10, 4, 2)];
        assert_eq!(
            copies(&c, base + 3 * k + 9),
            vec![(3, s(3) + k + 9), (4, s(4) + k + 9)]
        );
        // raid5 on 3 (2 data): stripe 3 = row 1, data index 1, device (1+1)%3 = slot 2.
        let c = [chunk(BG_RAID5, 3, 1)];
        assert_eq!(copies(&c, base + 3 * k), vec![(3, s(3) + k)]);
        // raid6 on 4 (2 data): stripe 4 = row 2, data index 0, device slot 2.
        let c = [chunk(BG_RAID6, 4, 1)];
        assert_eq!(copies(&c, base + 4 * k + 1), vec![(3, s(3) + 2 * k + 1)]);
    }

    #[test]
    fn manifest_checks_name_differences() {
        let file = |d: &[u8]| Entry {
            kind: Kind::File,
            data: d.to_vec(),
            target: None,
            xattrs: BTreeMap::new(),
            hard_link_of: None,
        };
        let mut p = Vec::new();
        for i in 0..4 {
            p.extend(pattern_block(9, i));
        }
        let m = Manifest {
            files: vec![
                (PathBuf::from("a"), file(b"hello")),
                (PathBuf::from("p"), file(&p)),
            ],
        };
        let mut swapped = p.clone();
        swapped[BLOCK * 2..BLOCK * 3].copy_from_slice(&pattern_block(9, 3));
        let err = m
            .check_with(|path| match path.to_str() {
                Some("a") => None,
                _ => Some(swapped.clone()),
            })
            .unwrap_err();
        assert!(err.contains("a: cannot be read"), "{err}");
        assert!(
            err.contains("p: contents differ from byte 8206 (block 2): expected pattern f0009:b00000002, found pattern f0009:b00000003; 1 of 4 blocks differ"),
            "{err}"
        );
        assert!(m
            .check_with(|path| Some(if path == Path::new("a") {
                b"hello".to_vec()
            } else {
                p.clone()
            }))
            .is_ok());
    }

    fn mnt_opts() -> &'static [&'static str] {
        &["rw", "noatime"]
    }

    /// Builds a set, fills it, then checks that every block of every pattern file lies at
    /// each place [`copies`] names, on the raw images; remounts read-only and checks the
    /// manifest.
    fn layout_matches(profile: &str, meta: &str, ndevs: usize, ncopies: usize) {
        let what = format!("multi_device layout {profile}");
        if !require_root(&what) {
            return;
        }
        let tmp = TempDir::new(&format!("md-{profile}")).unwrap();
        let images = mkfs_set(tmp.path(), profile, ndevs, 256 * MIB, profile, meta).unwrap();
        let mnt = tmp.subdir("mnt").unwrap();
        let set = KernelSet::mount(&images, &[], &mnt, mnt_opts()).unwrap();
        let manifest = fill(set.root(), 7).unwrap();
        let mut extents = Vec::new();
        for name in PATTERN_FILES.iter().map(|p| p.1).chain([SPARSE_FILE.1]) {
            for e in file_logical_extents(&set.root().join(name)).unwrap() {
                extents.push((name, e));
            }
        }
        set.unmount().unwrap();

        let chunks = chunk_map_all(&images).unwrap();
        for c in chunks.iter().filter(|c| c.flags & BG_DATA != 0) {
            assert_eq!(c.profile(), profile, "{c:?}");
        }
        let by_devid: HashMap<u64, PathBuf> = images
            .iter()
            .map(|i| (devid_of(i).unwrap(), i.clone()))
            .collect();
        let mut blocks = 0;
        let mut seen_devids = std::collections::BTreeSet::new();
        for (name, (fo, logical, len)) in extents {
            let data = &manifest.get(name).unwrap().data;
            for k in (0..len).step_by(BLOCK) {
                let off = (fo + k) as usize;
                if off >= data.len() {
                    break;
                }
                let mut want = data[off..(off + BLOCK).min(data.len())].to_vec();
                want.resize(BLOCK, 0);
                let cps = copies(&chunks, logical + k);
                assert_eq!(cps.len(), ncopies, "{name} @{off}: {cps:?}");
                for (devid, phys) in cps {
                    seen_devids.insert(devid);
                    let got = read_image(&by_devid[&devid], phys, BLOCK).unwrap();
                    assert!(
                        got == want,
                        "{profile}: {name} block {} (logical {}) on devid {devid} at {phys}: \
                         expected {}, found {}",
                        off / BLOCK,
                        logical + k,
                        describe_block(&want),
                        describe_block(&got)
                    );
                }
                blocks += 1;
            }
        }
        assert!(blocks >= 5000, "only {blocks} blocks checked");
        assert_eq!(seen_devids.len(), ndevs, "data on devids {seen_devids:?}");

        let set = KernelSet::mount(&images, &[], &mnt, &["ro", "noatime"]).unwrap();
        manifest.check_dir(set.root()).unwrap();
        set.unmount().unwrap();
    }

    #[test]
    fn layout_raid0() {
        layout_matches("raid0", "raid0", 4, 1);
    }

    #[test]
    fn layout_raid10() {
        layout_matches("raid10", "raid1", 4, 2);
    }

    #[test]
    fn layout_raid1c3() {
        layout_matches("raid1c3", "raid1c3", 3, 3);
    }

    #[test]
    fn layout_dup() {
        layout_matches("dup", "dup", 1, 2);
    }

    #[test]
    fn layout_raid5() {
        layout_matches("raid5", "raid1", 3, 1);
    }

    #[test]
    fn layout_raid6() {
        layout_matches("raid6", "raid1c3", 4, 1);
    }

    /// Whether the kernel knows every member of the fsid of `dev` (`btrfs device ready`).
    fn device_ready(dev: &Path) -> bool {
        Command::new("btrfs")
            .args(["device", "ready"])
            .arg(dev)
            .status()
            .unwrap()
            .success()
    }

    #[test]
    fn raid1_damaged_copy_is_seen_and_healed() {
        if !require_root("multi_device raid1 self-heal") {
            return;
        }
        let tmp = TempDir::new("md-heal").unwrap();
        let images = mkfs_set(tmp.path(), "r1", 2, 256 * MIB, "raid1", "raid1").unwrap();
        let mnt = tmp.subdir("mnt").unwrap();

        let set = KernelSet::mount(&images, &[], &mnt, mnt_opts()).unwrap();
        let manifest = fill(set.root(), 11).unwrap();
        // FIEMAP agrees with filefrag (whose "physical" is the btrfs logical address).
        let p3 = set.root().join("patterns/p3");
        let ext = file_logical_extents(&p3).unwrap();
        let ff = run_stdout(Command::new("filefrag").args(["-v", "-b4096"]).arg(&p3)).unwrap();
        let ff: Vec<(u64, u64, u64)> = ff
            .lines()
            .filter_map(|l| {
                let n: Vec<u64> = l
                    .split(|c: char| !c.is_ascii_digit())
                    .filter(|s| !s.is_empty())
                    .filter_map(|s| s.parse().ok())
                    .collect();
                (l.trim_start().chars().next()?.is_ascii_digit() && n.len() >= 6)
                    .then(|| (n[1] * 4096, n[3] * 4096, n[5] * 4096))
            })
            .collect();
        assert_eq!(ext, ff, "FIEMAP vs filefrag -v -b4096");
        set.unmount().unwrap();

        // The kernel forgot the members: one attached alone is not "ready".
        let lone = LoopDevice::attach(&images[0], true).unwrap();
        assert!(
            !device_ready(lone.path()),
            "the kernel still remembers the other member after unmount"
        );
        drop(lone);

        let clean = offline_check(&images).unwrap();
        assert!(clean.clean, "before damage:\n{}", clean.output);

        // Damage two blocks of devid 1's copy at p3 offset 5 MiB.
        let target = 5 * MIB;
        let &(fo, lo, _) = ext
            .iter()
            .find(|(fo, _, len)| (*fo..fo + len).contains(&target))
            .unwrap();
        let logical = lo + (target - fo);
        let chunks = chunk_map(&images[0]).unwrap(); // one member: the system chunk is raid1
        let cps = copies(&chunks, logical);
        assert_eq!(cps.len(), 2, "{cps:?}");
        let want = pattern_block(3, target / BLOCK as u64);
        for &(devid, phys) in &cps {
            let img = image_of_devid(&images, devid).unwrap();
            assert_eq!(
                read_image(&img, phys, BLOCK).unwrap(),
                want,
                "devid {devid}"
            );
        }
        let slot = cps.iter().position(|c| c.0 == 1).unwrap();
        let (_, phys1) = cps[slot];
        let img1 = image_of_devid(&images, 1).unwrap();
        overwrite(&img1, phys1, 2 * BLOCK, 0xAA).unwrap();

        let damaged = offline_check(&images).unwrap();
        assert!(!damaged.clean, "btrfs check missed the damage");
        let mirror = slot as u32 + 1;
        assert_eq!(
            damaged.csum_mismatches,
            vec![(mirror, logical), (mirror, logical + BLOCK as u64)],
            "{}",
            damaged.output
        );

        // The kernel reads correct data from either mirror and rewrites the bad copy.
        let set = KernelSet::mount(&images, &[], &mnt, mnt_opts()).unwrap();
        let p3data = &manifest.get("patterns/p3").unwrap().data;
        for (i, got) in read_from_every_mirror(&set.root().join("patterns/p3"), 2)
            .unwrap()
            .iter()
            .enumerate()
        {
            assert!(got == p3data, "read with pid residue {i} differs");
        }
        manifest.check_dir(set.root()).unwrap();
        manifest
            .check_with(|p| fs::read(set.root().join(p)).ok())
            .unwrap();
        let scrub = set.scrub(false).unwrap();
        assert_eq!(scrub.get("csum_errors"), 0, "not healed: {scrub:?}");
        assert!(scrub.get("data_bytes_scrubbed") > 20 * MIB, "{scrub:?}");

        // A changed tree is reported, every difference named.
        let r = set.root();
        fs::write(r.join("small/inline-100"), b"changed").unwrap();
        fs::write(r.join("empty"), b"x").unwrap();
        fs::remove_file(r.join("links/dangling")).unwrap();
        fs::write(r.join("new"), b"").unwrap();
        let err = manifest.check_dir(r).unwrap_err();
        for p in [
            "small/inline-100: size 100, found 7",
            "empty: size 0, found 1",
            "links/dangling: missing",
            "new: unexpected",
        ] {
            assert!(err.contains(p), "{p} not in:\n{err}");
        }
        set.unmount().unwrap();

        assert_eq!(
            read_image(&img1, phys1, BLOCK).unwrap(),
            want,
            "devid 1 copy not repaired"
        );
    }

    #[test]
    fn raid1_degraded_mount_reads_everything() {
        if !require_root("multi_device raid1 degraded") {
            return;
        }
        let tmp = TempDir::new("md-degraded").unwrap();
        let images = mkfs_set(tmp.path(), "r1", 2, 256 * MIB, "raid1", "raid1").unwrap();
        assert_eq!(devid_of(&images[0]).unwrap(), 1);
        assert_eq!(devid_of(&images[1]).unwrap(), 2);
        let sb = run_stdout(
            Command::new("btrfs")
                .args(["inspect-internal", "dump-super"])
                .arg(&images[1]),
        )
        .unwrap();
        assert!(sb.contains("dev_item.devid\t\t2"), "{sb}");
        assert!(sb.contains(&fsid_of(&images[1]).unwrap()), "{sb}");

        let mnt = tmp.subdir("mnt").unwrap();
        let set = KernelSet::mount(&images, &[], &mnt, mnt_opts()).unwrap();
        assert_eq!(set.missing_devids().unwrap(), Vec::<u64>::new());
        let manifest = fill(set.root(), 5).unwrap();
        set.unmount().unwrap();

        // Without `degraded` a member short fails: the kernel kept no stale member.
        let err = KernelSet::mount(&images, &[true, false], &mnt, &["ro"])
            .err()
            .expect("mount without the second member and without degraded");
        assert!(err.to_string().contains("mount"), "{err}");

        for (present, missing) in [([true, false], 2), ([false, true], 1)] {
            let set =
                KernelSet::mount(&images, &present, &mnt, &["ro", "degraded", "noatime"]).unwrap();
            assert_eq!(set.missing_devids().unwrap(), vec![missing]);
            manifest
                .check_dir(set.root())
                .unwrap_or_else(|e| panic!("degraded, devid {missing} missing:\n{e}"));
            set.unmount().unwrap();
        }
    }
}

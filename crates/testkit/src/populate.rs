//! Filling a freshly made btrfs (mounted by the kernel) with everything a reader must get
//! right: inline, regular, prealloc and compressed extents, holes, shared extents, links,
//! special files, odd names, xattrs and ACLs, modes, owners, nanosecond timestamps,
//! subvolumes and snapshots.
//!
//! Everything random comes from a seeded RNG, one stream per step (derived from the image
//! seed and the step's name), so turning a step off does not change what the others write.
//! The tree's *shape* is fixed; the RNG varies contents, some sizes and timestamps.

use std::ffi::{CString, OsStr};
use std::fs::{self, File, OpenOptions};
use std::io::{self, Seek, SeekFrom, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};

use crate::cmd::run;
use crate::mount::{syncfs, KernelMount};

/// Which kinds of content [`populate`] creates. See [`PopulateSpec::full`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PopulateSpec {
    /// `files/`: regular files of many sizes: empty, tiny (inline), around the 2048 (default
    /// max_inline) and 4096 (sector) boundaries, several MiB of random data, truncated and
    /// extended files.
    pub files: bool,
    /// `sparse/`: holes from seek+write and from truncating up, an all-hole file, punched holes.
    pub sparse: bool,
    /// `prealloc/`: fallocate'd (unwritten) extents, KEEP_SIZE beyond EOF, partly written
    /// prealloc, zero-range.
    pub prealloc: bool,
    /// `reflink/`: `cp --reflink=always`, FICLONERANGE of a sub-range, clones within a file,
    /// a clone overwritten afterwards.
    pub reflinks: bool,
    /// `overwrite/`: committed extents overwritten in the middle, so they are split and
    /// referenced partially (extent offset != 0).
    pub overwrites: bool,
    /// `compress/<alg>/...`: for each algorithm (`zlib`, `lzo`, `zstd`, optionally with a
    /// level like `zstd:9`): files written under `compress=ALG`, `compress-force=ALG`, and in
    /// a directory with `btrfs property set ... compression ALG`; plus one `chattr +c`
    /// directory. Inline compressed files, multi-extent files (128 KiB compressed extents),
    /// incompressible and mixed data, partial overwrites of compressed extents.
    pub compression: Vec<String>,
    /// `links/`: hard links (several per inode, across directories, one inode with hundreds
    /// of links so that extended refs appear), symlinks (short, long up to ~4000 bytes,
    /// dangling, non-UTF-8), hard links to a symlink and to a fifo.
    pub links: bool,
    /// `special/`: fifo, unix socket, char and block device nodes.
    pub special: bool,
    /// `names/`: 255-byte names (ASCII and multi-byte UTF-8), non-UTF-8 bytes, control
    /// characters, leading dashes and dots.
    pub names: bool,
    /// `xattr/`: user.* small, empty and large (up to ~3900 bytes), many per inode,
    /// security.*, trusted.*, on files, directories, symlinks and special files.
    pub xattrs: bool,
    /// `acl/`: POSIX access and default ACLs via setfacl, and files inheriting them.
    pub acls: bool,
    /// `attrs/`: setuid/setgid/sticky and odd permission bits, arbitrary uid/gid, and
    /// timestamps with nanoseconds in the past (also before 1970) and the future. Also a
    /// final pass that gives a sample of the whole tree random timestamps.
    pub attrs: bool,
    /// Subvolumes `sv1`, `sv2`, nested `sv1/nested` and `sv1/dir/deep`, and a deleted one.
    pub subvolumes: bool,
    /// Snapshots under `snaps/` (needs `subvolumes`): rw and read-only snapshots of `sv1`
    /// (which contains nested subvolumes, so the snapshots show placeholder directories), a
    /// snapshot of the top level and one of a snapshot; then `sv1` and the rw snapshot are
    /// changed.
    pub snapshots: bool,
    /// `bigdir/` with this many empty files (0: none).
    pub big_dir: usize,
    /// `large/data.bin` with this many MiB of random data (0: none).
    pub large_file_mb: u64,
}

impl PopulateSpec {
    /// Nothing at all (an empty filesystem).
    pub fn none() -> Self {
        PopulateSpec {
            files: false,
            sparse: false,
            prealloc: false,
            reflinks: false,
            overwrites: false,
            compression: Vec::new(),
            links: false,
            special: false,
            names: false,
            xattrs: false,
            acls: false,
            attrs: false,
            subvolumes: false,
            snapshots: false,
            big_dir: 0,
            large_file_mb: 0,
        }
    }

    /// Everything, with a modest directory of 1000 entries and no large file.
    pub fn full() -> Self {
        PopulateSpec {
            files: true,
            sparse: true,
            prealloc: true,
            reflinks: true,
            overwrites: true,
            compression: ["zlib", "lzo", "zstd"].map(String::from).to_vec(),
            links: true,
            special: true,
            names: true,
            xattrs: true,
            acls: true,
            attrs: true,
            subvolumes: true,
            snapshots: true,
            big_dir: 1000,
            large_file_mb: 0,
        }
    }

    /// `full()` without compression, subvolumes and the big directory: quick to build.
    pub fn basic() -> Self {
        PopulateSpec {
            compression: Vec::new(),
            subvolumes: false,
            snapshots: false,
            big_dir: 0,
            ..PopulateSpec::full()
        }
    }
}

/// Fills the filesystem mounted by `mount` (read-write) according to `spec`.
/// `base_opts` are the options it was mounted with, restored after compression remounts.
pub fn populate(
    mount: &KernelMount,
    base_opts: &[String],
    spec: &PopulateSpec,
    seed: u64,
) -> io::Result<()> {
    let mut p = Populator {
        root: mount.path().to_path_buf(),
        mount,
        base_opts,
        seed,
    };
    let steps = [
        ("files", spec.files),
        ("sparse", spec.sparse),
        ("prealloc", spec.prealloc),
        ("reflinks", spec.reflinks),
        ("overwrites", spec.overwrites),
        ("links", spec.links),
        ("special", spec.special),
        ("names", spec.names),
        ("xattrs", spec.xattrs),
        ("acls", spec.acls),
        ("attrs", spec.attrs),
        ("subvolumes", spec.subvolumes),
    ];
    for (name, on) in steps {
        if on {
            let mut rng = p.rng(name);
            let r = match name {
                "files" => p.files(&mut rng),
                "sparse" => p.sparse(&mut rng),
                "prealloc" => p.prealloc(&mut rng),
                "reflinks" => p.reflinks(&mut rng),
                "overwrites" => p.overwrites(&mut rng),
                "links" => p.links(&mut rng),
                "special" => p.special(&mut rng),
                "names" => p.names(&mut rng),
                "xattrs" => p.xattrs(&mut rng),
                "acls" => p.acls(&mut rng),
                "attrs" => p.attrs(&mut rng),
                "subvolumes" => p.subvolumes(&mut rng),
                _ => unreachable!(),
            };
            r.map_err(|e| context(e, name))?;
        }
    }
    if !spec.compression.is_empty() {
        let mut rng = p.rng("compression");
        p.compression(&mut rng, &spec.compression)
            .map_err(|e| context(e, "compression"))?;
    }
    if spec.big_dir > 0 {
        let mut rng = p.rng("big_dir");
        p.big_dir(&mut rng, spec.big_dir)
            .map_err(|e| context(e, "big_dir"))?;
    }
    if spec.large_file_mb > 0 {
        let mut rng = p.rng("large_file");
        p.large_file(&mut rng, spec.large_file_mb)
            .map_err(|e| context(e, "large_file"))?;
    }
    // Timestamps last (every later step would move directory mtimes again), but before the
    // snapshots, so the snapshots carry them too.
    if spec.attrs {
        let mut rng = p.rng("times");
        p.random_times(&mut rng).map_err(|e| context(e, "times"))?;
    }
    if spec.subvolumes && spec.snapshots {
        let mut rng = p.rng("snapshots");
        p.snapshots(&mut rng).map_err(|e| context(e, "snapshots"))?;
    }
    syncfs(&p.root)
}

fn context(e: io::Error, step: &str) -> io::Error {
    io::Error::new(e.kind(), format!("populate step {step}: {e}"))
}

fn with_path(e: io::Error, what: &str, p: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", p.display()))
}

struct Populator<'a> {
    root: PathBuf,
    mount: &'a KernelMount,
    base_opts: &'a [String],
    seed: u64,
}

const KIB: u64 = 1024;
const MIB: u64 = 1024 * 1024;

/// FS_COMPR_FL, the `chattr +c` inode flag (not exported by the libc crate).
const FS_COMPR_FL: libc::c_long = 0x4;

impl Populator<'_> {
    fn rng(&self, step: &str) -> StdRng {
        // FNV-1a over the step name, mixed with the seed: independent, stable streams.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in step.bytes() {
            h = (h ^ b as u64).wrapping_mul(0x100_0000_01b3);
        }
        StdRng::seed_from_u64(self.seed ^ h)
    }

    fn dir(&self, rel: &str) -> io::Result<PathBuf> {
        let p = self.root.join(rel);
        fs::create_dir_all(&p).map_err(|e| with_path(e, "mkdir", &p))?;
        Ok(p)
    }

    fn sync(&self) -> io::Result<()> {
        syncfs(&self.root)
    }

    // ---- regular files ------------------------------------------------------------------

    fn files(&mut self, rng: &mut StdRng) -> io::Result<()> {
        let d = self.dir("files")?;
        let sizes: &[u64] = &[
            0,
            1,
            7,
            100,
            1000,
            2047,
            2048,
            2049,
            3000,
            4095,
            4096,
            4097,
            8191,
            8192,
            8193,
            12289,
            65536,
            128 * KIB + 3,
            1_000_000,
        ];
        for &n in sizes {
            write_file(&d.join(format!("size-{n}")), &random_bytes(rng, n as usize))?;
        }
        // Text-like (compressible, but this step is not compressed) and all-zero content.
        write_file(&d.join("text-5000"), &compressible(rng, 5000))?;
        write_file(&d.join("zeros-70000"), &vec![0u8; 70000])?;
        // Multi-MiB random data with a random tail.
        let n = 2 * MIB + rng.random_range(0..MIB);
        write_file(&d.join("multi-mib"), &random_bytes(rng, n as usize))?;
        // Written in two transactions: an inline extent that later grows into a regular one.
        let grow = d.join("inline-then-grown");
        write_file(&grow, &random_bytes(rng, 300))?;
        self.sync()?;
        append(&grow, &random_bytes(rng, 20000))?;
        // Truncated down inside an extent (the extent stays longer than the file).
        let t = d.join("truncated-down");
        write_file(&t, &random_bytes(rng, 300_000))?;
        self.sync()?;
        File::options().write(true).open(&t)?.set_len(123_457)?;
        // Truncated down to inline size after being large.
        let t = d.join("truncated-small");
        write_file(&t, &random_bytes(rng, 50_000))?;
        self.sync()?;
        File::options().write(true).open(&t)?.set_len(10)?;
        // Many small writes in separate transactions: many small extents.
        let frag = d.join("fragmented");
        let mut f = File::create(&frag)?;
        for _ in 0..20 {
            let n = 4096 + rng.random_range(0..3) * 4096;
            f.write_all(&random_bytes(rng, n))?;
            f.sync_data()?;
            self.sync()?;
        }
        Ok(())
    }

    fn sparse(&mut self, rng: &mut StdRng) -> io::Result<()> {
        let d = self.dir("sparse")?;
        // Data, hole, data at an unaligned offset, then a trailing hole from truncate-up.
        let mut f = File::create(d.join("holes"))?;
        f.write_all(&random_bytes(rng, 4096))?;
        f.seek(SeekFrom::Start(MIB + 123))?;
        f.write_all(&random_bytes(rng, 5000))?;
        f.set_len(8 * MIB)?;
        drop(f);
        // Only a hole.
        File::create(d.join("all-hole"))?.set_len(10 * MIB + 1)?;
        // Hole at the start.
        let mut f = File::create(d.join("hole-first"))?;
        f.seek(SeekFrom::Start(3 * MIB))?;
        f.write_all(&random_bytes(rng, 10000))?;
        drop(f);
        // Small data, then a hole, within the first few blocks.
        let mut f = File::create(d.join("small-gap"))?;
        f.write_all(b"head")?;
        f.seek(SeekFrom::Start(3 * 4096 + 17))?;
        f.write_all(b"tail")?;
        drop(f);
        // Truncate up then write past the old end (hole in the middle).
        let p = d.join("extended");
        write_file(&p, &random_bytes(rng, 10000))?;
        self.sync()?;
        let mut f = File::options().write(true).open(&p)?;
        f.set_len(500_000)?;
        f.seek(SeekFrom::Start(700_001))?;
        f.write_all(&random_bytes(rng, 999))?;
        drop(f);
        // A punched hole in committed data.
        let p = d.join("punched");
        write_file(&p, &random_bytes(rng, 512 * KIB as usize))?;
        self.sync()?;
        let f = File::options().write(true).open(&p)?;
        fallocate(
            &f,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            100 * KIB,
            200 * KIB,
        )?;
        // Punch unaligned: partial blocks are zeroed, whole ones deallocated.
        fallocate(
            &f,
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            400 * KIB + 10,
            9000,
        )?;
        Ok(())
    }

    fn prealloc(&mut self, rng: &mut StdRng) -> io::Result<()> {
        let d = self.dir("prealloc")?;
        // Plain preallocation: size grows, extents are unwritten.
        let f = File::create(d.join("fallocated"))?;
        fallocate(&f, 0, 0, MIB)?;
        // KEEP_SIZE beyond EOF: st_blocks counts more than st_size.
        let p = d.join("keep-size");
        write_file(&p, &random_bytes(rng, 10000))?;
        let f = File::options().write(true).open(&p)?;
        fallocate(&f, libc::FALLOC_FL_KEEP_SIZE, 0, 2 * MIB)?;
        // Only KEEP_SIZE prealloc, size 0.
        let f = File::create(d.join("keep-size-empty"))?;
        fallocate(&f, libc::FALLOC_FL_KEEP_SIZE, 0, 256 * KIB)?;
        // Partly written prealloc: unwritten / written / unwritten.
        let p = d.join("partly-written");
        let mut f = File::create(&p)?;
        fallocate(&f, 0, 0, MIB)?;
        f.sync_all()?;
        self.sync()?;
        f.seek(SeekFrom::Start(256 * KIB))?;
        f.write_all(&random_bytes(rng, 8192))?;
        f.seek(SeekFrom::Start(600 * KIB + 100))?;
        f.write_all(&random_bytes(rng, 5000))?;
        drop(f);
        // Prealloc in the middle of data, and zero-range over data.
        let p = d.join("zero-range");
        write_file(&p, &random_bytes(rng, 300 * KIB as usize))?;
        self.sync()?;
        let f = File::options().write(true).open(&p)?;
        fallocate(&f, libc::FALLOC_FL_ZERO_RANGE, 64 * KIB, 64 * KIB)?;
        fallocate(
            &f,
            libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE,
            290 * KIB,
            64 * KIB,
        )?;
        // Preallocation past EOF of a file that then grows into it.
        let p = d.join("grow-into");
        let mut f = File::create(&p)?;
        fallocate(&f, libc::FALLOC_FL_KEEP_SIZE, 0, 512 * KIB)?;
        self.sync()?;
        f.write_all(&random_bytes(rng, 100 * KIB as usize + 7))?;
        Ok(())
    }

    fn reflinks(&mut self, rng: &mut StdRng) -> io::Result<()> {
        let d = self.dir("reflink")?;
        let src = d.join("source");
        write_file(&src, &random_bytes(rng, (MIB + 5000) as usize))?;
        self.sync()?;
        run(Command::new("cp")
            .arg("--reflink=always")
            .arg(&src)
            .arg(d.join("full-clone")))?;
        // Sub-range clone into the middle of another file.
        let dst = d.join("range-clone");
        write_file(&dst, &random_bytes(rng, 512 * KIB as usize))?;
        let (s, t) = (File::open(&src)?, File::options().write(true).open(&dst)?);
        clone_range(&s, 128 * KIB, 256 * KIB, &t, 64 * KIB)?;
        // Clone to past EOF (creates a hole before it), and the unaligned tail up to EOF.
        clone_range(&s, 0, 64 * KIB, &t, 1024 * KIB)?;
        let len = s.metadata()?.len();
        clone_range(&s, MIB, len - MIB, &t, 2048 * KIB)?;
        drop(t);
        // Clone within one file.
        let selfc = d.join("self-clone");
        write_file(&selfc, &random_bytes(rng, 256 * KIB as usize))?;
        let f = File::options().read(true).write(true).open(&selfc)?;
        clone_range(&f, 0, 64 * KIB, &f, 192 * KIB)?;
        drop(f);
        // A clone later overwritten in part: the shared extent is referenced partially.
        let ow = d.join("clone-overwritten");
        run(Command::new("cp")
            .arg("--reflink=always")
            .arg(&src)
            .arg(&ow))?;
        self.sync()?;
        overwrite_at(&ow, 300_000, &random_bytes(rng, 10000))?;
        // A clone of an inline-sized file (the kernel copies inline data or refuses).
        let tiny = d.join("tiny");
        write_file(&tiny, b"tiny reflink source")?;
        let _ = Command::new("cp")
            .arg("--reflink=auto")
            .arg(&tiny)
            .arg(d.join("tiny-clone"))
            .status();
        Ok(())
    }

    fn overwrites(&mut self, rng: &mut StdRng) -> io::Result<()> {
        let d = self.dir("overwrite")?;
        let p = d.join("middle");
        write_file(&p, &random_bytes(rng, MIB as usize))?;
        self.sync()?;
        overwrite_at(&p, 300_001, &random_bytes(rng, 8192))?;
        self.sync()?;
        overwrite_at(&p, 700 * KIB, &random_bytes(rng, 4096))?;
        overwrite_at(&p, 0, &random_bytes(rng, 100))?;
        // Overwrite across the end: extends the file.
        let p = d.join("across-end");
        write_file(&p, &random_bytes(rng, 200 * KIB as usize))?;
        self.sync()?;
        overwrite_at(&p, 190 * KIB, &random_bytes(rng, 30 * KIB as usize))?;
        // Many overwrites of one block range in separate transactions.
        let p = d.join("rewritten");
        write_file(&p, &random_bytes(rng, 64 * KIB as usize))?;
        for i in 0..5 {
            self.sync()?;
            overwrite_at(&p, i * 4096 + 1000, &random_bytes(rng, 6000))?;
        }
        Ok(())
    }

    // ---- compression --------------------------------------------------------------------

    fn compression(&mut self, rng: &mut StdRng, algs: &[String]) -> io::Result<()> {
        for alg in algs {
            let name = alg.replace(':', "-");
            self.sync()?;
            self.mount.remount(&[&format!("compress={alg}")])?;
            let d = self.dir(&format!("compress/{name}"))?;
            self.compressed_files(rng, &d)?;
            self.sync()?;
            self.mount.remount(&[&format!("compress-force={alg}")])?;
            let d = self.dir(&format!("compress/force-{name}"))?;
            write_file(&d.join("mixed"), &mixed(rng, 640 * KIB as usize))?;
            write_file(&d.join("random"), &random_bytes(rng, 200 * KIB as usize))?;
            write_file(&d.join("small"), &compressible(rng, 1500))?;
            write_file(&d.join("text"), &compressible(rng, 300 * KIB as usize))?;
            self.sync()?;
            self.restore_opts()?;
            // Per-directory compression property, inherited by new files.
            let d = self.dir(&format!("compress/prop-{name}"))?;
            let prop_alg = alg.split(':').next().unwrap_or(alg);
            run(Command::new("btrfs")
                .args(["property", "set"])
                .arg(&d)
                .args(["compression", prop_alg]))?;
            write_file(&d.join("text"), &compressible(rng, 400 * KIB as usize))?;
            write_file(&d.join("small"), &compressible(rng, 3000))?;
            self.sync()?;
        }
        // chattr +c on a directory: new files get the compress flag.
        let d = self.dir("compress/chattr-c")?;
        set_inode_flags(&d, FS_COMPR_FL)?;
        write_file(&d.join("text"), &compressible(rng, 300 * KIB as usize))?;
        write_file(&d.join("small"), &compressible(rng, 2500))?;
        self.sync()
    }

    /// The files written under one `compress=ALG` mount.
    fn compressed_files(&mut self, rng: &mut StdRng, d: &Path) -> io::Result<()> {
        // Small compressible files: inline compressed extents where they fit.
        for n in [50usize, 1000, 2000, 3000, 4000, 4096] {
            write_file(&d.join(format!("small-{n}")), &compressible(rng, n))?;
        }
        // Several 128 KiB compressed extents, with an odd tail.
        let n = MIB as usize + rng.random_range(0..10000);
        write_file(&d.join("text-1m"), &compressible(rng, n))?;
        write_file(
            &d.join("text-600k"),
            &compressible(rng, 600 * KIB as usize + 777),
        )?;
        write_file(&d.join("zeros"), &vec![0u8; 512 * KIB as usize])?;
        // Incompressible: stored uncompressed (and the inode may be marked NOCOMPRESS).
        write_file(&d.join("random"), &random_bytes(rng, 256 * KIB as usize))?;
        write_file(&d.join("mixed"), &mixed(rng, MIB as usize))?;
        // Overwrite inside a compressed extent: the rest is referenced with an offset.
        let p = d.join("overwritten");
        write_file(&p, &compressible(rng, 512 * KIB as usize))?;
        self.sync()?;
        overwrite_at(&p, 200 * KIB + 13, &compressible(rng, 4096))?;
        overwrite_at(&p, 400 * KIB, &random_bytes(rng, 8192))?;
        // Sparse compressed file.
        let mut f = File::create(d.join("sparse"))?;
        f.seek(SeekFrom::Start(MIB))?;
        f.write_all(&compressible(rng, 256 * KIB as usize))?;
        f.set_len(3 * MIB)?;
        drop(f);
        // Inline compressed, then appended in a later transaction.
        let p = d.join("appended");
        write_file(&p, &compressible(rng, 900))?;
        self.sync()?;
        append(&p, &compressible(rng, 300 * KIB as usize))?;
        // Reflink of a compressed file, and a sub-range of it.
        self.sync()?;
        run(Command::new("cp")
            .arg("--reflink=always")
            .arg(d.join("text-1m"))
            .arg(d.join("text-1m-clone")))?;
        let dst = d.join("range-clone");
        write_file(&dst, &random_bytes(rng, 64 * KIB as usize))?;
        clone_range(
            &File::open(d.join("text-600k"))?,
            128 * KIB,
            256 * KIB,
            &File::options().write(true).open(&dst)?,
            32 * KIB,
        )?;
        Ok(())
    }

    fn restore_opts(&self) -> io::Result<()> {
        self.mount.remount(&["compress=no"])?;
        if !self.base_opts.is_empty() {
            let opts: Vec<&str> = self.base_opts.iter().map(String::as_str).collect();
            self.mount.remount(&opts)?;
        }
        Ok(())
    }

    // ---- links, special files, names ----------------------------------------------------

    fn links(&mut self, rng: &mut StdRng) -> io::Result<()> {
        let d = self.dir("links")?;
        let (d1, d2) = (self.dir("links/d1")?, self.dir("links/d2/deeper")?);
        // One inode, four names in three directories.
        let a = d.join("a");
        write_file(&a, &random_bytes(rng, 5000))?;
        fs::hard_link(&a, d1.join("a-link"))?;
        fs::hard_link(&a, d2.join("a-link"))?;
        fs::hard_link(&a, d.join("a-second"))?;
        // Two names in one directory, inline data.
        let b = d.join("b");
        write_file(&b, b"bbbb")?;
        fs::hard_link(&b, d.join("b-link"))?;
        // Many names for one inode, long enough to overflow an INODE_REF item into extended
        // refs (INODE_EXTREF) on every node size.
        let many = self.dir("links/many")?;
        let m = many.join("m");
        write_file(&m, b"many links")?;
        for i in 0..400 {
            fs::hard_link(&m, many.join(format!("{i:04}-{}", "x".repeat(40))))?;
        }
        // A link whose other name is removed again (nlink goes back down).
        let gone = d.join("was-linked");
        write_file(&gone, b"x")?;
        fs::hard_link(&gone, d.join("temp-link"))?;
        self.sync()?;
        fs::remove_file(d.join("temp-link"))?;

        // Symlinks.
        let s = self.dir("links/sym")?;
        symlink(b"../a", &s.join("short"))?;
        symlink(b"/etc/passwd", &s.join("absolute"))?;
        symlink(b"does/not/exist", &s.join("dangling"))?;
        symlink(b"../d1", &s.join("to-dir"))?;
        symlink(b"target-\xff\xfe-not-utf8", &s.join("non-utf8"))?;
        symlink(b"x", &s.join("one-byte"))?;
        let t1000: Vec<u8> = (0..1000).map(|i| b'a' + (i % 26) as u8).collect();
        symlink(&t1000, &s.join("len-1000"))?;
        // ~4000 bytes: the kernel caps a target at what fits inline in one leaf (3949 with
        // 4 KiB nodes), so fall back until it is accepted.
        let mut made = false;
        for len in [4000usize, 3949, 3900, 3000] {
            let t: Vec<u8> = (0..len)
                .map(|i| {
                    if i % 100 == 99 {
                        b'/'
                    } else {
                        b'a' + (i % 26) as u8
                    }
                })
                .collect();
            match symlink(&t, &s.join("long")) {
                Ok(()) => {
                    made = true;
                    break;
                }
                Err(e) if e.raw_os_error() == Some(libc::ENAMETOOLONG) => continue,
                Err(e) => return Err(e),
            }
        }
        if !made {
            return Err(io::Error::other("no long symlink could be made"));
        }
        // Hard link to a symlink (link(2) does not follow) and to a fifo.
        hard_link_nofollow(&s.join("short"), &d.join("hardlink-to-symlink"))?;
        mkfifo(&d.join("fifo"), 0o644)?;
        fs::hard_link(d.join("fifo"), d1.join("fifo-link"))?;
        Ok(())
    }

    fn special(&mut self, _rng: &mut StdRng) -> io::Result<()> {
        let d = self.dir("special")?;
        mkfifo(&d.join("fifo"), 0o600)?;
        mkfifo(&d.join("fifo-odd-mode"), 0o4751)?;
        // A socket inode stays after the listener is gone.
        drop(std::os::unix::net::UnixListener::bind(d.join("socket"))?);
        mknod(&d.join("null"), libc::S_IFCHR | 0o666, libc::makedev(1, 3))?;
        mknod(&d.join("tty0"), libc::S_IFCHR | 0o620, libc::makedev(4, 0))?;
        mknod(
            &d.join("loop-blk"),
            libc::S_IFBLK | 0o660,
            libc::makedev(7, 200),
        )?;
        // Large major/minor numbers (minor above 255 uses the split encoding).
        mknod(
            &d.join("big-numbers"),
            libc::S_IFBLK | 0o600,
            libc::makedev(259, 65537),
        )?;
        mknod(&d.join("zero-zero"), libc::S_IFCHR, libc::makedev(0, 0))?;
        Ok(())
    }

    fn names(&mut self, rng: &mut StdRng) -> io::Result<()> {
        let d = self.dir("names")?;
        let mut names: Vec<Vec<u8>> = vec![
            vec![b'L'; 255],
            "\u{e9}".repeat(127).into_bytes(), // 254 bytes of 2-byte UTF-8
            [b"\xf0\x9f\xa6\x80".repeat(63), b"abc".to_vec()].concat(), // 255 bytes, 4-byte chars
            b"\xff\xfe\x80raw".to_vec(),
            b"latin1-caf\xe9".to_vec(),
            b"new\nline".to_vec(),
            b"tab\there".to_vec(),
            b"back\\slash".to_vec(),
            b"  spaces  ".to_vec(),
            b"-dash".to_vec(),
            b".hidden".to_vec(),
            b"...".to_vec(),
            b"a".to_vec(),
            b"\x01\x1f".to_vec(),
            "\u{4e2d}\u{6587}\u{540d}".as_bytes().to_vec(),
        ];
        names.push((0..200).map(|_| rng.random_range(0x80u8..=0xff)).collect());
        for n in &names {
            write_file(&d.join(OsStr::from_bytes(n)), n)?;
        }
        // A directory with a 255-byte name, and a non-UTF-8 directory, each with content.
        let long = d.join(OsStr::from_bytes(&[b'D'; 255]));
        fs::create_dir(&long)?;
        write_file(&long.join(OsStr::from_bytes(&[b'f'; 255])), b"deep")?;
        let raw = d.join(OsStr::from_bytes(b"dir-\xc3\x28"));
        fs::create_dir(&raw)?;
        write_file(&raw.join("inside"), b"x")?;
        Ok(())
    }

    // ---- xattrs and ACLs ----------------------------------------------------------------

    fn xattrs(&mut self, rng: &mut StdRng) -> io::Result<()> {
        let d = self.dir("xattr")?;
        let f = d.join("file");
        write_file(&f, b"has xattrs")?;
        set_xattr(&f, "user.small", b"value")?;
        set_xattr(&f, "user.empty", b"")?;
        set_xattr(&f, "user.binary", &[0, 1, 2, 0, 255, 0])?;
        set_xattr_shrinking(&f, "user.large", &random_bytes(rng, 3900))?;
        set_xattr(&f, &format!("user.{}", "n".repeat(250)), b"long name")?;
        set_xattr(&f, "security.oleo-test", b"sec")?;
        set_xattr(&f, "trusted.oleo-test", b"trusted value")?;
        // Many xattrs on one inode (spread over leaves on small node sizes).
        let many = d.join("many");
        write_file(&many, b"")?;
        for i in 0..100 {
            let n = rng.random_range(0..200);
            let v = random_bytes(rng, n);
            set_xattr(&many, &format!("user.attr{i:03}"), &v)?;
        }
        // Directory, symlink, fifo: user.* is only allowed on files and directories.
        let sub = self.dir("xattr/dir")?;
        set_xattr(&sub, "user.on-dir", b"d")?;
        symlink(b"file", &d.join("sym"))?;
        set_xattr(&d.join("sym"), "trusted.on-symlink", b"s")?;
        mkfifo(&d.join("fifo"), 0o644)?;
        set_xattr(&d.join("fifo"), "trusted.on-fifo", b"f")?;
        // An xattr removed again, and one replaced by a shorter value.
        set_xattr(&f, "user.removed", b"gone soon")?;
        set_xattr(&f, "user.replaced", &random_bytes(rng, 1000))?;
        self.sync()?;
        remove_xattr(&f, "user.removed")?;
        set_xattr(&f, "user.replaced", b"short")?;
        // A file with a large xattr and a compressed-looking name.
        let big = d.join("big-values");
        write_file(&big, &random_bytes(rng, 3000))?;
        for i in 0..3 {
            set_xattr_shrinking(&big, &format!("user.big{i}"), &random_bytes(rng, 3500))?;
        }
        Ok(())
    }

    fn acls(&mut self, _rng: &mut StdRng) -> io::Result<()> {
        let d = self.dir("acl")?;
        let f = d.join("file");
        write_file(&f, b"acl")?;
        setfacl(
            &[
                "-m",
                "u:1001:rwx,u:2002:r--,g:3003:r-x,g::rw-,m::rwx,o::r--",
            ],
            &f,
        )?;
        let md = d.join("minimal-extended");
        write_file(&md, b"")?;
        setfacl(&["-m", "u:65534:---"], &md)?;
        // Default ACL on a directory: new files and subdirectories inherit it.
        let dd = self.dir("acl/default-dir")?;
        setfacl(&["-m", "u:1001:rwx,g:3003:rx"], &dd)?;
        setfacl(
            &[
                "-d",
                "-m",
                "u:1001:rwx,u:4004:r,g::r-x,g:3003:rwx,m::rwx,o::---",
            ],
            &dd,
        )?;
        write_file(&dd.join("inherits"), b"inherited acl")?;
        fs::create_dir(dd.join("subdir"))?;
        write_file(&dd.join("subdir/deeper"), b"x")?;
        // Only a default ACL.
        let od = self.dir("acl/only-default")?;
        setfacl(&["-d", "-m", "u:7:rw"], &od)?;
        Ok(())
    }

    // ---- modes, owners, timestamps ------------------------------------------------------

    fn attrs(&mut self, rng: &mut StdRng) -> io::Result<()> {
        let d = self.dir("attrs")?;
        // chown first: chown clears setuid/setgid, so modes are applied after it.
        let owners: &[(u32, u32)] = &[
            (0, 0),
            (1000, 1000),
            (65534, 65534),
            (123_456, 654_321),
            (4_000_000_000, 7),
        ];
        let modes: &[u32] = &[
            0o4755, 0o2755, 0o6711, 0o1644, 0o7777, 0o0000, 0o0617, 0o0444, 0o0200, 0o4000,
        ];
        for (i, &m) in modes.iter().enumerate() {
            let p = d.join(format!("mode-{m:04o}"));
            write_file(&p, &random_bytes(rng, i * 10))?;
            let (u, g) = owners[i % owners.len()];
            lchown(&p, u, g)?;
            fs::set_permissions(&p, fs::Permissions::from_mode(m))?;
        }
        for (i, m) in [0o1777u32, 0o2775, 0o0700, 0o0555, 0o3711]
            .into_iter()
            .enumerate()
        {
            let p = d.join(format!("dir-{m:04o}"));
            fs::create_dir(&p)?;
            let (u, g) = owners[(i + 1) % owners.len()];
            lchown(&p, u, g)?;
            fs::set_permissions(&p, fs::Permissions::from_mode(m))?;
        }
        // A file created in a setgid directory inherits its group.
        write_file(&d.join("dir-2775/inherits-gid"), b"g")?;
        // Owner of a symlink itself.
        symlink(b"mode-4755", &d.join("owned-symlink"))?;
        lchown(&d.join("owned-symlink"), 4242, 2424)?;

        // Timestamps: (atime, mtime) pairs including pre-1970, far future, 0 and max nsec.
        let t = self.dir("attrs/times")?;
        let cases: [(i64, i64, i64, i64); 7] = [
            (0, 0, 0, 0),
            (1, 999_999_999, 2, 1),
            (-315_619_200, 123_456_789, -1, 999_999_999), // 1960, and just before the epoch
            (946_684_799, 500_000_000, 946_684_800, 1),   // around 2000
            (4_102_444_800, 42, 4_102_444_801, 999_999_998), // 2100
            (16_725_225_600, 7, 253_402_300_799, 999_999_999), // 2500, 9999-12-31
            (2_147_483_647, 1, 2_147_483_648, 2),         // around the 32-bit rollover
        ];
        for (i, (asec, ans, msec, mns)) in cases.into_iter().enumerate() {
            let p = t.join(format!("t{i}"));
            write_file(&p, &random_bytes(rng, 17))?;
            set_times(&p, (asec, ans), (msec, mns))?;
        }
        symlink(b"t0", &t.join("symlink-times"))?;
        set_times(
            &t.join("symlink-times"),
            (1_234_567_890, 111),
            (1_234_567_891, 222),
        )?;
        mkfifo(&t.join("fifo-times"), 0o600)?;
        set_times(
            &t.join("fifo-times"),
            (1_500_000_000, 333),
            (1_600_000_000, 444),
        )?;
        Ok(())
    }

    /// Random atime/mtime on every directory and on a sample of other paths.
    fn random_times(&mut self, rng: &mut StdRng) -> io::Result<()> {
        let mut paths = Vec::new();
        collect_paths(&self.root, &self.root.join("bigdir"), &mut paths)?;
        // Children before parents: setting a child's times does not touch the parent, but
        // keep the order stable and simple anyway.
        paths.sort();
        paths.reverse();
        for (p, is_dir) in paths {
            if p.starts_with(self.root.join("attrs/times")) {
                continue; // hand-picked above
            }
            if !is_dir && !rng.random_bool(0.3) {
                continue;
            }
            let mut t = || {
                let sec = rng.random_range(-1_000_000_000i64..5_000_000_000);
                (sec, rng.random_range(0..1_000_000_000i64))
            };
            let (a, m) = (t(), t());
            set_times(&p, a, m)?;
        }
        Ok(())
    }

    // ---- subvolumes and snapshots -------------------------------------------------------

    fn subvolumes(&mut self, rng: &mut StdRng) -> io::Result<()> {
        let r = self.root.clone();
        btrfs(&["subvolume", "create"], &[&r.join("sv1")])?;
        write_file(
            &r.join("sv1/file-a"),
            &random_bytes(rng, 100 * KIB as usize),
        )?;
        write_file(&r.join("sv1/small"), b"small file in sv1")?;
        write_file(
            &r.join("sv1/to-be-changed"),
            &random_bytes(rng, 64 * KIB as usize),
        )?;
        fs::create_dir(r.join("sv1/dir"))?;
        write_file(&r.join("sv1/dir/x"), &random_bytes(rng, 3000))?;
        fs::hard_link(r.join("sv1/file-a"), r.join("sv1/dir/link-to-a"))?;
        set_xattr(&r.join("sv1/file-a"), "user.in-subvol", b"yes")?;
        symlink(b"../file-a", &r.join("sv1/dir/sym"))?;
        // Nested subvolumes: directly inside, and deeper below a plain directory.
        btrfs(&["subvolume", "create"], &[&r.join("sv1/nested")])?;
        write_file(&r.join("sv1/nested/inner"), &random_bytes(rng, 20000))?;
        btrfs(&["subvolume", "create"], &[&r.join("sv1/dir/deep")])?;
        write_file(&r.join("sv1/dir/deep/f"), b"deep")?;
        btrfs(&["subvolume", "create"], &[&r.join("sv1/nested/nested2")])?;
        btrfs(&["subvolume", "create"], &[&r.join("sv2")])?;
        write_file(&r.join("sv2/only"), &compressible(rng, 10000))?;
        // A subvolume deleted again: its tree is dropped in the background and may still be
        // on disk (orphaned) when the image is unmounted; the kernel does not show it.
        btrfs(&["subvolume", "create"], &[&r.join("deleted")])?;
        write_file(&r.join("deleted/f"), &random_bytes(rng, 50000))?;
        self.sync()?;
        btrfs(&["subvolume", "delete"], &[&r.join("deleted")])?;
        Ok(())
    }

    fn snapshots(&mut self, rng: &mut StdRng) -> io::Result<()> {
        let r = self.root.clone();
        self.dir("snaps")?;
        self.sync()?;
        btrfs(
            &["subvolume", "snapshot"],
            &[&r.join("sv1"), &r.join("snaps/sv1-rw")],
        )?;
        btrfs(
            &["subvolume", "snapshot", "-r"],
            &[&r.join("sv1"), &r.join("snaps/sv1-ro")],
        )?;
        btrfs(
            &["subvolume", "snapshot", "-r"],
            &[&r.join("snaps/sv1-ro"), &r.join("snaps/snap-of-snap")],
        )?;
        // The top level: contains placeholders for sv1, sv2 and the snapshots in snaps/.
        btrfs(&["subvolume", "snapshot"], &[&r, &r.join("snaps/top")])?;
        // Change the source after the snapshots: shared extents diverge.
        overwrite_at(
            &r.join("sv1/to-be-changed"),
            10000,
            &random_bytes(rng, 5000),
        )?;
        fs::remove_file(r.join("sv1/small"))?;
        write_file(&r.join("sv1/new-after-snapshot"), b"new")?;
        fs::rename(r.join("sv1/dir/x"), r.join("sv1/dir/x-renamed"))?;
        fs::set_permissions(r.join("sv1/file-a"), fs::Permissions::from_mode(0o600))?;
        set_xattr(&r.join("sv1/file-a"), "user.after", b"snapshot")?;
        // And the rw snapshot.
        append(&r.join("snaps/sv1-rw/file-a"), &random_bytes(rng, 7000))?;
        fs::remove_file(r.join("snaps/sv1-rw/dir/link-to-a"))?;
        write_file(&r.join("snaps/sv1-rw/only-in-snapshot"), b"s")?;
        Ok(())
    }

    // ---- size ---------------------------------------------------------------------------

    fn big_dir(&mut self, rng: &mut StdRng, n: usize) -> io::Result<()> {
        let d = self.dir("bigdir")?;
        // Plain creates in a loop are fast on btrfs (delayed dir index items).
        for i in 0..n {
            let extra = rng.random_range(0..24usize);
            let name = format!("e{i:07}-{}", "z".repeat(extra));
            File::create(d.join(name))?;
        }
        Ok(())
    }

    fn large_file(&mut self, rng: &mut StdRng, mb: u64) -> io::Result<()> {
        let d = self.dir("large")?;
        let mut f = File::create(d.join("data.bin"))?;
        let mut buf = vec![0u8; MIB as usize];
        for _ in 0..mb {
            rng.fill_bytes(&mut buf);
            f.write_all(&buf)?;
        }
        f.sync_all()
    }
}

// ---- data generators --------------------------------------------------------------------

pub(crate) fn random_bytes(rng: &mut StdRng, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rng.fill_bytes(&mut v);
    v
}

/// Text-like data that every algorithm compresses well but not trivially.
pub(crate) fn compressible(rng: &mut StdRng, n: usize) -> Vec<u8> {
    const WORDS: &[&str] = &[
        "btrfs",
        "extent",
        "inode",
        "subvolume",
        "snapshot",
        "checksum",
        "leaf",
        "node",
        "tree",
        "commit",
        "generation",
        "compress",
        "zstd",
        "lzo",
        "zlib",
        "oleo",
        "kernel",
        "fuse",
    ];
    let mut v = Vec::with_capacity(n + 32);
    while v.len() < n {
        v.extend_from_slice(WORDS[rng.random_range(0..WORDS.len())].as_bytes());
        if rng.random_bool(0.1) {
            v.extend_from_slice(format!(" {}", rng.random_range(0..1000)).as_bytes());
        }
        v.push(if rng.random_bool(0.08) { b'\n' } else { b' ' });
    }
    v.truncate(n);
    v
}

/// Alternating 64 KiB runs of compressible and random data.
pub(crate) fn mixed(rng: &mut StdRng, n: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(n);
    let mut text = true;
    while v.len() < n {
        let run = (64 * 1024).min(n - v.len());
        v.extend(if text {
            compressible(rng, run)
        } else {
            random_bytes(rng, run)
        });
        text = !text;
    }
    v
}

// ---- syscalls ---------------------------------------------------------------------------

fn cpath(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
}

fn check(r: libc::c_int, what: &str, p: &Path) -> io::Result<()> {
    if r < 0 {
        Err(with_path(io::Error::last_os_error(), what, p))
    } else {
        Ok(())
    }
}

pub(crate) fn write_file(p: &Path, data: &[u8]) -> io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(p)
        .map_err(|e| with_path(e, "create", p))?;
    f.write_all(data)
}

fn append(p: &Path, data: &[u8]) -> io::Result<()> {
    OpenOptions::new().append(true).open(p)?.write_all(data)
}

fn overwrite_at(p: &Path, off: u64, data: &[u8]) -> io::Result<()> {
    let mut f = OpenOptions::new().write(true).open(p)?;
    f.seek(SeekFrom::Start(off))?;
    f.write_all(data)
}

fn symlink(target: &[u8], link: &Path) -> io::Result<()> {
    std::os::unix::fs::symlink(OsStr::from_bytes(target), link)
}

fn hard_link_nofollow(src: &Path, dst: &Path) -> io::Result<()> {
    let (s, d) = (cpath(src)?, cpath(dst)?);
    // SAFETY: valid C strings; flags 0 = do not follow a final symlink.
    check(
        unsafe { libc::linkat(libc::AT_FDCWD, s.as_ptr(), libc::AT_FDCWD, d.as_ptr(), 0) },
        "link",
        dst,
    )
}

fn mkfifo(p: &Path, mode: u32) -> io::Result<()> {
    let c = cpath(p)?;
    // SAFETY: valid C string.
    check(
        unsafe { libc::mkfifo(c.as_ptr(), mode as libc::mode_t) },
        "mkfifo",
        p,
    )?;
    // The umask applies to mkfifo; set the exact mode (including odd bits).
    fs::set_permissions(p, fs::Permissions::from_mode(mode))
}

fn mknod(p: &Path, mode: u32, dev: libc::dev_t) -> io::Result<()> {
    let c = cpath(p)?;
    // SAFETY: valid C string.
    check(
        unsafe { libc::mknod(c.as_ptr(), mode as libc::mode_t, dev) },
        "mknod",
        p,
    )?;
    fs::set_permissions(p, fs::Permissions::from_mode(mode & 0o7777))
}

fn lchown(p: &Path, uid: u32, gid: u32) -> io::Result<()> {
    let c = cpath(p)?;
    // SAFETY: valid C string.
    check(unsafe { libc::lchown(c.as_ptr(), uid, gid) }, "lchown", p)
}

/// utimensat without following symlinks; (seconds, nanoseconds) pairs.
pub(crate) fn set_times(p: &Path, atime: (i64, i64), mtime: (i64, i64)) -> io::Result<()> {
    let c = cpath(p)?;
    let ts = [
        libc::timespec {
            tv_sec: atime.0,
            tv_nsec: atime.1,
        },
        libc::timespec {
            tv_sec: mtime.0,
            tv_nsec: mtime.1,
        },
    ];
    // SAFETY: valid C string and a two-element timespec array.
    check(
        unsafe {
            libc::utimensat(
                libc::AT_FDCWD,
                c.as_ptr(),
                ts.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
            )
        },
        "utimensat",
        p,
    )
}

pub(crate) fn set_xattr(p: &Path, name: &str, value: &[u8]) -> io::Result<()> {
    let (c, n) = (cpath(p)?, CString::new(name).expect("xattr name"));
    // SAFETY: valid C strings and buffer.
    let r = unsafe {
        libc::lsetxattr(
            c.as_ptr(),
            n.as_ptr(),
            value.as_ptr().cast(),
            value.len(),
            0,
        )
    };
    check(r, &format!("setxattr {name}"), p)
}

/// Sets a large xattr, shrinking it until it fits in one leaf (the limit depends on the node
/// size: about 3900 bytes with 4 KiB nodes).
fn set_xattr_shrinking(p: &Path, name: &str, value: &[u8]) -> io::Result<()> {
    let mut len = value.len();
    loop {
        match set_xattr(p, name, &value[..len]) {
            Err(e)
                if matches!(
                    e.raw_os_error(),
                    Some(libc::ENOSPC) | Some(libc::E2BIG) | Some(libc::ERANGE)
                ) && len > 1000 =>
            {
                len -= 100;
            }
            r => return r,
        }
    }
}

fn remove_xattr(p: &Path, name: &str) -> io::Result<()> {
    let (c, n) = (cpath(p)?, CString::new(name).expect("xattr name"));
    // SAFETY: valid C strings.
    check(
        unsafe { libc::lremovexattr(c.as_ptr(), n.as_ptr()) },
        "removexattr",
        p,
    )
}

fn fallocate(f: &File, mode: libc::c_int, off: u64, len: u64) -> io::Result<()> {
    // SAFETY: valid fd.
    let r = unsafe { libc::fallocate(f.as_raw_fd(), mode, off as libc::off_t, len as libc::off_t) };
    if r < 0 {
        return Err(io::Error::new(
            io::Error::last_os_error().kind(),
            format!(
                "fallocate mode {mode:#x} {off}+{len}: {}",
                io::Error::last_os_error()
            ),
        ));
    }
    Ok(())
}

/// FICLONERANGE: share `len` bytes of `src` at `src_off` into `dst` at `dst_off`.
fn clone_range(src: &File, src_off: u64, len: u64, dst: &File, dst_off: u64) -> io::Result<()> {
    let arg = libc::file_clone_range {
        src_fd: src.as_raw_fd() as i64,
        src_offset: src_off,
        src_length: len,
        dest_offset: dst_off,
    };
    // SAFETY: valid fds and a properly laid out argument.
    let r = unsafe { libc::ioctl(dst.as_raw_fd(), libc::FICLONERANGE, &arg) };
    if r < 0 {
        let e = io::Error::last_os_error();
        return Err(io::Error::new(
            e.kind(),
            format!("FICLONERANGE {src_off}+{len} -> {dst_off}: {e}"),
        ));
    }
    Ok(())
}

/// `chattr +FLAGS` (FS_IOC_SETFLAGS, adding to the current flags).
fn set_inode_flags(p: &Path, flags: libc::c_long) -> io::Result<()> {
    let f = File::open(p)?;
    let mut cur: libc::c_long = 0;
    // SAFETY: valid fd, pointer to a long as the ioctl expects.
    unsafe {
        if libc::ioctl(f.as_raw_fd(), libc::FS_IOC_GETFLAGS, &mut cur) < 0 {
            return Err(with_path(io::Error::last_os_error(), "FS_IOC_GETFLAGS", p));
        }
        cur |= flags;
        if libc::ioctl(f.as_raw_fd(), libc::FS_IOC_SETFLAGS, &cur) < 0 {
            return Err(with_path(io::Error::last_os_error(), "FS_IOC_SETFLAGS", p));
        }
    }
    Ok(())
}

fn setfacl(args: &[&str], p: &Path) -> io::Result<()> {
    run(Command::new("setfacl").args(args).arg(p)).map(|_| ())
}

fn btrfs(args: &[&str], paths: &[&Path]) -> io::Result<()> {
    let mut c = Command::new("btrfs");
    c.args(args);
    for p in paths {
        c.arg(p);
    }
    run(&mut c).map(|_| ())
}

/// `dir` and every path below it, with is-directory flags,
/// skipping the children of `skip_children_of`.
fn collect_paths(
    dir: &Path,
    skip_children_of: &Path,
    out: &mut Vec<(PathBuf, bool)>,
) -> io::Result<()> {
    out.push((dir.to_path_buf(), true));
    if dir == skip_children_of {
        return Ok(());
    }
    for e in fs::read_dir(dir)? {
        let e = e?;
        let ft = e.file_type()?;
        if ft.is_dir() {
            collect_paths(&e.path(), skip_children_of, out)?;
        } else {
            out.push((e.path(), false));
        }
    }
    Ok(())
}

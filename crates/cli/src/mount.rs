//! `oleo mount`: open the filesystem, then serve it through FUSE, in the background by
//! default. Errors in the image are reported before daemonizing, so a failed mount says why
//! on the terminal that asked for it.

use crate::common::logging;
use oleo::{Filesystem, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

// The field docs are --help text (clap), where `[:LEVEL]` is an optional part, not a link.
#[allow(rustdoc::broken_intra_doc_links)]
#[derive(clap::Args)]
pub struct MountArgs {
    /// Comma-separated mount options: ro, rw (the default), commit=SECONDS (default 30),
    /// max_inline=BYTES (default 2048), compress[=zlib|lzo|zstd][:LEVEL], compress-force[=...]
    /// (compression of new data, as btrfs), nodatacow, nodatasum, subvol=PATH, subvolid=ID,
    /// cache_size=SIZE
    /// (tree-block cache, e.g. 256M), threads=N, readahead=KIB (default 4096), log=PATH,
    /// fuse_uring=on|off (FUSE over io_uring where the kernel offers it; default on),
    /// FUSE's allow_other, allow_root, default_permissions, auto_unmount, fsname=NAME, plus
    /// the generic ones mount(8) passes.
    #[arg(short = 'o', value_name = "OPTIONS")]
    options: Vec<String>,
    /// Stay in the foreground (logs to stderr).
    #[arg(short = 'f', long)]
    foreground: bool,
    /// Say where a background mount logs.
    #[arg(short = 'v', long)]
    verbose: bool,
    /// Image files or block devices of the filesystem (several for a multi-device one, as
    /// `-o device=` gives them), then the mount point.
    #[arg(required = true, num_args = 2.., value_name = "DEVICE... MOUNTPOINT")]
    paths: Vec<PathBuf>,
}

struct Plan {
    open: OpenOptions,
    threads: usize,
    readahead_kib: u32,
    /// None: read-write if the filesystem allows it, else read-only with a warning.
    writable: Option<bool>,
    commit_secs: u64,
    /// Other users may enter (FUSE's allow_other); None: yes for root's mounts.
    allow_other: Option<bool>,
    /// Only root besides the owner (libfuse's allow_root).
    allow_root: bool,
    auto_unmount: bool,
    uring: bool,
    /// The source shown in /proc/mounts (default: the image's path).
    fsname: Option<String>,
    /// Where a background mount logs (default: syslog, else a file it names).
    log: Option<PathBuf>,
    /// `mount -o remount,...` of an existing mount.
    remount: bool,
    /// The kernel's VFS flags asked for.
    vfs: crate::daemon::vfs_flags::VfsFlags,
    /// Their names as given, in order (a remount applies them to the mount's own).
    vfs_names: Vec<String>,
    /// The keys of `shared_options` that the options given name: a second mount of an image
    /// already mounted must agree with the first on these.
    given: Vec<&'static str>,
}

/// Which of `shared_options`'s keys an option given sets (None: a per-mount option, or
/// one that changes nothing).
fn shared_key(name: &str) -> Option<&'static str> {
    Some(match name {
        "compress" | "compress-force" => "compress",
        "nodatacow" | "datacow" => "datacow",
        "nodatasum" | "datasum" => "datasum",
        "max_inline" => "max_inline",
        "commit" => "commit",
        "cache_size" => "cache_size",
        "threads" => "threads",
        "readahead" => "readahead",
        "fuse_uring" => "fuse_uring",
        "degraded" => "degraded",
        "device" => "device",
        "nologreplay" | "norecovery" | "usebackuproot" | "recovery" | "rescue" | "sb" => "rescue",
        "allow_other" | "allow_root" => "access",
        "auto_unmount" => "auto_unmount",
        "fsname" => "fsname",
        "log" => "log",
        _ => return None,
    })
}

/// The options that hold for the whole filesystem and its one FUSE connection, not for one
/// mount point: as `key=value` pairs, the form the server hands back to a second mount
/// (`subvol_ioctl::GET_SERVER_OPTIONS`). The atime and sync flags travel apart, as the
/// server's `MountFlags`.
fn shared_options(p: &Plan) -> Vec<(&'static str, String)> {
    let o = &p.open;
    // SAFETY: geteuid cannot fail.
    let is_root = unsafe { libc::geteuid() } == 0;
    let compress = match &o.compress {
        None => "no".to_string(),
        Some(c) => format!(
            "{}:{}{}",
            format!("{:?}", c.kind).to_lowercase(),
            c.level,
            if c.force { ",force" } else { "" }
        ),
    };
    let mut rescue = o.rescue.names().join(":");
    if !o.log_replay {
        rescue.push_str(";nologreplay");
    }
    if let Some(n) = o.rescue.super_copy {
        rescue.push_str(&format!(";sb={n}"));
    }
    let devices: Vec<String> = o
        .devices
        .iter()
        .map(|d| {
            std::fs::canonicalize(d)
                .unwrap_or_else(|_| d.clone())
                .display()
                .to_string()
        })
        .collect();
    vec![
        ("compress", compress),
        ("datacow", (!o.nodatacow).to_string()),
        ("datasum", (!o.nodatasum).to_string()),
        ("max_inline", o.max_inline.to_string()),
        ("commit", p.commit_secs.to_string()),
        ("cache_size", o.cache_bytes.to_string()),
        ("threads", p.threads.to_string()),
        ("readahead", p.readahead_kib.to_string()),
        ("fuse_uring", if p.uring { "on" } else { "off" }.to_string()),
        ("degraded", o.degraded.to_string()),
        ("device", devices.join(":")),
        ("rescue", rescue),
        (
            "access",
            format!(
                "allow_other={},allow_root={}",
                p.allow_other.unwrap_or(is_root) || p.allow_root,
                p.allow_root && p.allow_other != Some(true)
            ),
        ),
        ("auto_unmount", p.auto_unmount.to_string()),
        ("fsname", p.fsname.clone().unwrap_or_default()),
        (
            "log",
            p.log
                .as_ref()
                .map(|l| l.display().to_string())
                .unwrap_or_default(),
        ),
    ]
}

/// Options of mount(8) and fstab that are mount(8)'s own, not the filesystem's or the
/// kernel's: mount(8) has acted on them before it runs the helper (`defaults` stands for
/// the kernel's defaults, which apply unless another flag says otherwise).
const MOUNT8_OWN: &[&str] = &[
    "defaults", "auto", "noauto", "nouser", "nofail", "_netdev", "silent", "loud",
];

/// mount(8)'s options that let users mount an fstab entry, and the flags each implies
/// unless a later option overrides them (mount(8): `user` implies noexec, nosuid and
/// nodev; `owner` and `group` imply nosuid and nodev).
const USER_MOUNT: &[(&str, &[&str])] = &[
    ("user", &["noexec", "nosuid", "nodev"]),
    ("users", &["noexec", "nosuid", "nodev"]),
    ("owner", &["nosuid", "nodev"]),
    ("group", &["nosuid", "nodev"]),
];

/// btrfs's mount options that change nothing oleo stores or promises: they tune the
/// kernel's allocator, threads, discards or debugging, or ask for what oleo always does
/// (`barrier`, `acl`, `treelog`, `noflushoncommit`). Accepted so that an fstab line written
/// for the kernel works; each is logged. Options with a value are matched by name.
const BTRFS_HINTS: &[&str] = &[
    "ssd",
    "nossd",
    "ssd_spread",
    "nossd_spread",
    "discard",
    "nodiscard",
    "space_cache",
    "nospace_cache",
    "clear_cache",
    "autodefrag",
    "noautodefrag",
    "skip_balance",
    "acl",
    "barrier",
    "noflushoncommit",
    "thread_pool",
    "metadata_ratio",
    "fatal_errors",
    "enospc_debug",
    "noenospc_debug",
    "treelog",
];

/// btrfs's mount options that change what the kernel promises and that oleo does not do:
/// refused, with why, rather than dropped.
const BTRFS_REFUSED: &[(&str, &str)] = &[
    ("noacl", "oleo always enforces POSIX ACLs"),
    ("nobarrier", "oleo always flushes the device at each commit"),
    (
        "flushoncommit",
        "with FUSE's writeback cache the kernel holds dirty data oleo cannot flush at a commit; use fsync or sync",
    ),
    ("notreelog", "oleo always makes fsync durable through the log tree"),
    (
        "user_subvol_rm_allowed",
        "users cannot delete subvolumes through an oleo mount",
    ),
];

fn parse_size(s: &str) -> Option<u64> {
    let (num, mult) = match s.chars().last()?.to_ascii_uppercase() {
        'K' => (&s[..s.len() - 1], 1u64 << 10),
        'M' => (&s[..s.len() - 1], 1 << 20),
        'G' => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mult)
}

/// `rw_is_explicit`: false for mount(8)'s helper, which adds "rw" to every mount.
fn plan(options: &[String], rw_is_explicit: bool) -> Result<Plan, String> {
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(2);
    let mut p = Plan {
        open: OpenOptions::default(),
        // Requests that wait (an fsync's commit) hold a worker: enough of them that many
        // fsyncs can wait together and share one commit.
        threads: (cores * 2).max(16),
        readahead_kib: 4096,
        writable: None,
        commit_secs: 30,
        allow_other: None,
        allow_root: false,
        auto_unmount: false,
        uring: true,
        fsname: None,
        log: None,
        remount: false,
        vfs: Default::default(),
        vfs_names: Vec::new(),
        given: Vec::new(),
    };
    for opt in options
        .iter()
        .flat_map(|o| o.split(','))
        .filter(|o| !o.is_empty())
    {
        let (name, value) = opt
            .split_once('=')
            .map_or((opt, None), |(n, v)| (n, Some(v)));
        if let Some(k) = shared_key(name) {
            if !p.given.contains(&k) {
                p.given.push(k);
            }
        }
        if value.is_none() && p.vfs.apply(name) {
            p.vfs_names.push(name.to_string());
            continue;
        }
        if let Some((_, implied)) = USER_MOUNT.iter().find(|(n, _)| *n == name) {
            for f in implied.iter() {
                p.vfs.apply(f);
                p.vfs_names.push(f.to_string());
            }
            continue;
        }
        match (name, value) {
            ("ro", None) => p.writable = Some(false),
            ("device", Some(v)) => p.open.devices.push(PathBuf::from(v)),
            ("degraded", None) => p.open.degraded = true,
            // The kernel's old spellings, deprecated there but still taken.
            ("nologreplay" | "norecovery", None) => p.open.log_replay = false,
            ("usebackuproot" | "recovery", None) => p.open.rescue.use_backup_root = true,
            ("rescue", Some(v)) => {
                if p.open.rescue.add(v)? {
                    p.open.log_replay = false;
                }
            }
            ("sb", Some(v)) => {
                p.open.rescue.super_copy = Some(
                    v.parse()
                        .ok()
                        .filter(|&n: &usize| n <= 2)
                        .ok_or(format!("sb={v}: a superblock copy, 0, 1 or 2"))?,
                )
            }
            // As in the kernel: nodatacow implies nodatasum and ends compression, datasum
            // implies datacow, compression implies both.
            ("nodatacow", None) => {
                p.open.nodatacow = true;
                p.open.nodatasum = true;
                p.open.compress = None;
            }
            ("datacow", None) => p.open.nodatacow = false,
            ("nodatasum", None) => p.open.nodatasum = true,
            ("datasum", None) => {
                p.open.nodatasum = false;
                p.open.nodatacow = false;
            }
            ("compress" | "compress-force", v) => {
                p.open.compress = oleo::compression::Compress::parse(v, name == "compress-force")
                    .map_err(|e| format!("{opt}: {e}"))?;
                if p.open.compress.is_some() {
                    p.open.nodatacow = false;
                    p.open.nodatasum = false;
                }
            }
            ("rw", None) if rw_is_explicit => p.writable = Some(true),
            ("rw", None) => {}
            ("commit", Some(v)) => {
                p.commit_secs = v
                    .parse()
                    .ok()
                    .filter(|&n: &u64| n >= 1)
                    .ok_or(format!("commit={v}: seconds, at least 1"))?
            }
            ("max_inline", Some(v)) => {
                p.open.max_inline = parse_size(v).ok_or(format!("max_inline={v}: not a size"))?
            }
            ("subvol", Some(v)) => {
                p.open.subvol = Some(v.trim_start_matches('/').as_bytes().to_vec())
            }
            ("subvolid", Some(v)) => {
                p.open.subvolid = Some(
                    v.parse()
                        .map_err(|_| format!("subvolid={v}: not a number"))?,
                )
            }
            ("cache_size", Some(v)) => {
                p.open.cache_bytes = parse_size(v).ok_or(format!("cache_size={v}: not a size"))?
            }
            ("readahead", Some(v)) => {
                p.readahead_kib = v
                    .parse()
                    .map_err(|_| format!("readahead={v}: KiB as a number"))?
            }
            ("threads", Some(v)) => {
                p.threads = v
                    .parse()
                    .ok()
                    .filter(|&n: &usize| (1..=256).contains(&n))
                    .ok_or(format!("threads={v}: 1..256"))?
            }
            ("fuse_uring", Some("on")) => p.uring = true,
            ("fuse_uring", Some("off")) => p.uring = false,
            ("fuse_uring", Some(v)) => return Err(format!("fuse_uring={v}: on or off")),
            ("remount", None) => p.remount = true,
            ("allow_other", None) => p.allow_other = Some(true),
            ("allow_root", None) => p.allow_root = true,
            ("auto_unmount", None) => p.auto_unmount = true,
            // oleo's server never checks permissions itself: the kernel always does.
            ("default_permissions", None) => {}
            ("fsname", Some(v)) => p.fsname = Some(v.to_string()),
            // The type is always fuse.oleo.
            ("subtype", Some(_)) => {}
            ("log", Some(v)) => p.log = Some(PathBuf::from(v)),
            // The kernel's FUSE options, which mount(8) repeats on a remount: set by oleo.
            ("user_id" | "group_id" | "rootmode" | "max_read" | "blksize" | "fd", Some(_)) => {}
            _ if MOUNT8_OWN.contains(&opt) || name.starts_with("x-") || name == "comment" => {}
            _ if BTRFS_HINTS.contains(&name) => {
                log::info!("{opt}: a tuning of the kernel's btrfs that changes nothing in oleo")
            }
            _ => {
                if let Some((_, why)) = BTRFS_REFUSED.iter().find(|(n, _)| *n == name) {
                    return Err(format!("mount option {opt} is not supported: {why}"));
                }
                return Err(format!("unknown mount option {opt:?}"));
            }
        }
    }
    // As in the kernel, a rescue mount is read-only; oleo also keeps usebackuproot and
    // sb= read-only (writing from an older root would reuse blocks newer roots hold).
    if p.open.rescue.any() || !p.open.log_replay {
        if p.writable == Some(true) {
            let mut names = p.open.rescue.names();
            if !p.open.log_replay {
                names.push("nologreplay");
            }
            if p.open.rescue.super_copy.is_some() {
                names.push("sb=");
            }
            return Err(format!(
                "{} must be used with ro mount option",
                names.join(", ")
            ));
        }
        p.writable = Some(false);
    }
    Ok(p)
}

pub fn run(args: MountArgs) -> ExitCode {
    let mut paths = args.paths;
    let mountpoint = paths.pop().expect("clap asks for two paths at least");
    let image = paths.remove(0);
    finish(mount(
        &image,
        &paths,
        &mountpoint,
        &args.options,
        Mode {
            foreground: args.foreground,
            verbose: args.verbose,
        },
        true,
    ))
}

/// How the command was asked to run.
#[derive(Clone, Copy)]
struct Mode {
    foreground: bool,
    verbose: bool,
}

/// `SOURCE TARGET [-o OPTIONS]` as mount(8) and mount.fuse3 pass them. mount(8) adds "rw"
/// whenever "ro" is not asked for, so here "rw" only means "not explicitly read-only".
pub fn run_helper(args: &[String]) -> ExitCode {
    let mut positional = Vec::new();
    let mut options = Vec::new();
    let mut mode = Mode {
        foreground: false,
        verbose: false,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "-o" => options.extend(it.next().cloned()),
            "-f" => mode.foreground = true,
            "-v" => mode.verbose = true,
            "-n" | "-s" => {}
            s if s.starts_with("-o") => options.push(s[2..].to_string()),
            _ => positional.push(a.clone()),
        }
    }
    if positional.len() != 2 {
        eprintln!("oleo: usage as a mount helper: mount.fuse.oleo SOURCE MOUNTPOINT [-o OPTIONS]");
        return ExitCode::FAILURE;
    }
    finish(mount(
        Path::new(&positional[0]),
        &[],
        Path::new(&positional[1]),
        &options,
        mode,
        false,
    ))
}

fn finish(r: Result<(), String>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("oleo: {e}");
            ExitCode::FAILURE
        }
    }
}

fn mount(
    image: &Path,
    devices: &[PathBuf],
    mountpoint: &Path,
    options: &[String],
    mode: Mode,
    refuse_rw: bool,
) -> Result<(), String> {
    let mut plan = plan(options, refuse_rw)?;
    // The other devices given as arguments, as if by device=.
    plan.open.devices.extend(devices.iter().cloned());
    if plan.remount {
        // The mount exists: its read-only flag and VFS flags change, the ones named and no
        // others (the server refuses writes by itself if it was mounted read-only).
        let writable = plan.writable != Some(false);
        // mount(8) hands its helper the whole set the mount is to have (the mount's own
        // merged with the ones asked for); `oleo mount -o remount,...` names changes only.
        let mut vfs = if refuse_rw {
            crate::daemon::vfs_flags::VfsFlags::of_mount(mountpoint)?
        } else {
            crate::daemon::vfs_flags::VfsFlags::default()
        };
        for n in &plan.vfs_names {
            vfs.apply(n);
        }
        let was = crate::daemon::vfs_flags::VfsFlags::of_mount(mountpoint)?;
        if (was.ms ^ vfs.ms) & libc::MS_DIRSYNC != 0 {
            return Err(format!(
                "{}: dirsync cannot change on a remount (the kernel keeps a superblock's \
                 dirsync from its mount): unmount and mount again",
                mountpoint.display()
            ));
        }
        // The kernel keeps atime rules per mount, oleo's server one set for all mounts of
        // it (a second mount of the image is a bind mount of the first, daemon/twice.rs):
        // changing them through one mount while others are there would change theirs too.
        let (old_rules, new_rules) = (was.server(), vfs.server());
        if (old_rules.atime, old_rules.nodiratime) != (new_rules.atime, new_rules.nodiratime) {
            let canonical = std::fs::canonicalize(mountpoint)
                .map_err(|e| format!("{}: {e}", mountpoint.display()))?;
            let others: Vec<String> = crate::daemon::stop::connection_of(&canonical)
                .map(crate::daemon::stop::points_of)
                .unwrap_or_default()
                .into_iter()
                .filter(|p| *p != canonical)
                .map(|p| p.display().to_string())
                .collect();
            if !others.is_empty() {
                return Err(format!(
                    "{}: its atime rules are those of its server, which also serves {}:                      they cannot change for one mount only (unmount the others first)",
                    mountpoint.display(),
                    others.join(", ")
                ));
            }
        }
        crate::daemon::fuse_mount::remount(mountpoint, writable, vfs.ms)?;
        // The server acts on the new atime and sync flags from now on.
        if let Err(e) = crate::daemon::fuse_mount::tell_server_flags(mountpoint, &vfs) {
            log::warn!(
                "{}: the server keeps its old mount flags: {e}",
                mountpoint.display()
            );
        }
        if mode.verbose {
            eprintln!(
                "oleo: {} remounted {}",
                mountpoint.display(),
                crate::daemon::vfs_flags::effective(mountpoint)?
            );
        }
        if !writable {
            // Read-only from now: what was written should be on disk now, not at the next
            // periodic commit.
            crate::daemon::fuse_mount::ask_server_to_commit(mountpoint);
        }
        return Ok(());
    }
    // SAFETY: geteuid cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        plan.vfs.check_user_may()?;
    }
    check_mountpoint(mountpoint, image)?;
    // Resolved now: once mounted, touching the path would wait on this very server.
    let mountpoint =
        &std::fs::canonicalize(mountpoint).map_err(|e| format!("{}: {e}", mountpoint.display()))?;
    // An image a live oleo mount serves: one filesystem, mounted here a second time (the
    // kernel's btrfs gives such a mount the superblock it has).
    let asked = crate::daemon::twice::Asked {
        options: shared_options(&plan),
        given: &plan.given,
        vfs: &plan.vfs,
        vfs_names: &plan.vfs_names,
        writable: plan.writable,
        subvol: plan.open.subvol.as_deref(),
        subvolid: plan.open.subvolid,
    };
    if crate::daemon::twice::mount_again(image, mountpoint, &asked, mode.verbose)? {
        return Ok(());
    }
    let (fs, writable) = open(image, &plan)?;
    let source = plan.fsname.clone().unwrap_or_else(|| {
        std::fs::canonicalize(image)
            .unwrap_or_else(|_| image.to_path_buf())
            .display()
            .to_string()
    });
    // SAFETY: geteuid cannot fail.
    let is_root = unsafe { libc::geteuid() } == 0;
    let allow_other = plan.allow_other.unwrap_or(is_root) || plan.allow_root;
    // Without allow_other the kernel itself keeps everyone but the owner out.
    let access = if plan.allow_root && plan.allow_other != Some(true) {
        oleo_fuse::Access::RootAndOwner
    } else {
        oleo_fuse::Access::All
    };
    let start = Start {
        options: crate::daemon::fuse_mount::FuseOptions {
            source,
            writable,
            allow_other,
            default_permissions: true,
            auto_unmount: plan.auto_unmount,
            vfs: plan.vfs.clone(),
        },
        threads: plan.threads,
        access,
        readahead_kib: plan.readahead_kib,
        dirty: None,
    };
    let settings = oleo_fuse::MountSettings {
        writable,
        commit_interval: std::time::Duration::from_secs(plan.commit_secs),
        uring: plan.uring,
        flags: plan.vfs.server(),
        // Mounted with default_permissions (above), which the kernel wants for an idmap;
        // allow_root's gate needs every caller's uid, which the idmap's requests omit.
        allow_idmap: access == oleo_fuse::Access::All,
        options: crate::daemon::twice::encode(&shared_options(&plan)),
    };
    // A sixty-fourth of the filesystem may sit dirty in the kernel (at least 8 MiB): small
    // images then keep their writes cached until nearly full (see oleo_fuse::DirtyCap). The
    // margin the server keeps free is about twice the cap: with a sixteenth (64 MiB, a
    // 144 MiB margin on 1 GiB) a writer filling 800 MiB of a fresh 1 GiB filesystem
    // (generic/102) could meet that margin before its last write(2) when write-back kept up
    // with it, and got ENOSPC with 100 MiB free.
    let dirty_cap = (fs.superblock().total_bytes / 64).max(8 << 20);
    let server = oleo_fuse::OleoFuse::new(fs, settings);
    let start = Start {
        dirty: Some((server.dirty_cap(), dirty_cap)),
        ..start
    };
    if mode.foreground {
        let _ = crate::daemon::stop::block();
        commit_on_sigusr1();
        let serving = start.begin(server, mountpoint, image)?;
        if mode.verbose {
            say_flags(mountpoint);
        }
        let r = serving.run();
        crate::umount::record_exit(&r);
        return r;
    }
    let log = logging::background_target(plan.log.as_deref(), image)?;
    daemonize_and_serve(server, mountpoint, image, &start, &log, mode.verbose)
}

/// Refuses a mount point that is not a directory, and says what to do about a FUSE mount
/// whose server is gone ("Transport endpoint is not connected"); one that served this very
/// image is taken away here.
fn check_mountpoint(mountpoint: &Path, image: &Path) -> Result<(), String> {
    let e = match std::fs::metadata(mountpoint) {
        Ok(m) if m.is_dir() => return Ok(()),
        Ok(_) => {
            return Err(format!(
                "{}: mount point is not a directory",
                mountpoint.display()
            ))
        }
        Err(e) => e,
    };
    // ECONNABORTED where the connection was aborted rather than closed; ECANCELED for a
    // request the dying server's io_uring queue dropped.
    if !matches!(
        e.raw_os_error(),
        Some(libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED)
    ) {
        return Err(format!("{}: {e}", mountpoint.display()));
    }
    let dead = crate::daemon::fuse_mount::dead_mount(mountpoint);
    let ours = dead.as_ref().is_some_and(|(fstype, source)| {
        fstype == "fuse.oleo" && std::fs::canonicalize(image).is_ok_and(|i| Path::new(source) == i)
    });
    if ours {
        log::warn!(
            "{}: the oleo that served {} here is gone; unmounting its dead mount",
            mountpoint.display(),
            image.display()
        );
        crate::daemon::fuse_mount::unmount(mountpoint);
        if std::fs::metadata(mountpoint).is_ok_and(|m| m.is_dir()) {
            return Ok(());
        }
    }
    let how = if unsafe { libc::geteuid() } == 0 {
        "umount"
    } else {
        "fusermount3 -u"
    };
    let what = match &dead {
        Some((fstype, source)) => format!(" ({fstype} of {source})"),
        None => String::new(),
    };
    Err(format!(
        "{mp}: a FUSE mount whose server is gone{what} ({e}); unmount it first: {how} {mp}",
        mp = mountpoint.display()
    ))
}

/// What it takes to mount and start serving.
struct Start {
    options: crate::daemon::fuse_mount::FuseOptions,
    /// FUSE worker threads.
    threads: usize,
    access: oleo_fuse::Access,
    readahead_kib: u32,
    /// The kernel dirty limit to set once mounted.
    dirty: Option<(oleo_fuse::DirtyCap, u64)>,
}

impl Start {
    /// Mounts and makes the session that will serve it (its `run` shakes hands).
    fn session(
        &self,
        server: oleo_fuse::OleoFuse,
        mountpoint: &Path,
    ) -> Result<
        (
            oleo_fuse::Session<oleo_fuse::OleoFuse>,
            crate::daemon::fuse_mount::Keeper,
        ),
        String,
    > {
        let slot = server.notifier_slot();
        let mounted = crate::daemon::fuse_mount::mount(mountpoint, &self.options)?;
        let session = oleo_fuse::Session::from_fd(server, mounted.fd, self.threads, self.access);
        let _ = slot.set(session.notifier());
        tune(mountpoint, self.readahead_kib);
        if let Some((cap, bytes)) = &self.dirty {
            if let Err(e) = cap.apply(mountpoint, *bytes) {
                log::info!("could not cap the kernel's dirty data at {bytes} bytes: {e}");
            }
        }
        Ok((session, mounted.keeper))
    }

    /// Mounts and gets ready to serve: the image guard, and the thread that stops the
    /// server on a signal (blocked by now in this thread, see `stop::block`).
    fn begin(
        &self,
        server: oleo_fuse::OleoFuse,
        mountpoint: &Path,
        image: &Path,
    ) -> Result<Serving, String> {
        let (session, keeper) = self.session(server, mountpoint)?;
        let conn = crate::daemon::stop::connection_of(mountpoint);
        // For `oleo umount`: the record it finds this server by (see umount.rs).
        crate::umount::announce(conn);
        let image = &std::fs::canonicalize(image).unwrap_or_else(|_| image.to_path_buf());
        let guard = if self.options.writable {
            crate::daemon::guard::start(image, conn)
        } else {
            None
        };
        crate::daemon::stop::spawn(crate::daemon::stop::Mount {
            mountpoint: mountpoint.to_path_buf(),
            conn,
            on_stop: guard.as_ref().map(|g| {
                let f: std::sync::Arc<dyn Fn() + Send + Sync> = std::sync::Arc::new(g.stopping());
                f
            }),
        });
        Ok(Serving {
            session,
            keeper,
            guard,
            mountpoint: mountpoint.to_path_buf(),
            image: image.to_path_buf(),
        })
    }
}

/// A mount being served.
struct Serving {
    session: oleo_fuse::Session<oleo_fuse::OleoFuse>,
    keeper: crate::daemon::fuse_mount::Keeper,
    guard: Option<crate::daemon::guard::Guard>,
    mountpoint: PathBuf,
    image: PathBuf,
}

impl Serving {
    /// Serves until unmounted or stopped by a signal; returns once the final commit is on
    /// disk and the image is closed.
    fn run(self) -> Result<(), String> {
        let mp = self.mountpoint.display().to_string();
        let r = self.session.run();
        drop(self.keeper);
        if let Some(g) = self.guard {
            wait_closed(&self.image);
            g.finish();
        }
        if let Err(e) = r {
            // A session that failed leaves a dead mount behind: take it away.
            crate::daemon::fuse_mount::unmount(&self.mountpoint);
            return Err(format!("FUSE session: {e}"));
        }
        match crate::daemon::stop::stopped_by() {
            Some(sig) => log::warn!("stopped by {sig}: {mp} unmounted, image released"),
            None => log::info!("{mp} unmounted, image released"),
        }
        Ok(())
    }
}

/// Waits (a while at most) until this process no longer has `image` open for writing: the
/// session ends with the server dropped, but a committer thread may still hold it a moment.
fn wait_closed(image: &Path) {
    use std::os::unix::fs::MetadataExt;
    let Ok(want) = std::fs::metadata(image) else {
        return;
    };
    let open_rw = || {
        std::fs::read_dir("/proc/self/fd").is_ok_and(|fds| {
            fds.flatten().any(|fd| {
                let same = std::fs::metadata(fd.path()).is_ok_and(|m| {
                    m.dev() == want.dev() && m.ino() == want.ino() && m.rdev() == want.rdev()
                });
                let name = fd.file_name();
                same && std::fs::read_to_string(format!(
                    "/proc/self/fdinfo/{}",
                    name.to_string_lossy()
                ))
                .is_ok_and(|info| {
                    info.lines()
                        .find_map(|l| l.strip_prefix("flags:"))
                        .and_then(|f| i32::from_str_radix(f.trim(), 8).ok())
                        .is_some_and(|f| f & libc::O_ACCMODE != libc::O_RDONLY)
                })
            })
        })
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while open_rw() {
        if std::time::Instant::now() > deadline {
            log::warn!("{} is still open after the final commit", image.display());
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Opens read-write unless asked for read-only; a filesystem oleo cannot write (features,
/// a pending log tree, a read-only device) mounts read-only with a warning unless rw was
/// asked for explicitly.
fn open(image: &Path, plan: &Plan) -> Result<(Filesystem, bool), String> {
    let show = |e: oleo::Error| match e {
        // These name the image themselves.
        oleo::Error::Busy(m) => m,
        e => format!("{}: {e}", image.display()),
    };
    if plan.writable == Some(false) {
        return Ok((
            Filesystem::open(image, plan.open.clone()).map_err(show)?,
            false,
        ));
    }
    let why_not = match Filesystem::open_rw(image, plan.open.clone()) {
        Ok(fs) => match fs.can_write() {
            Ok(()) => return Ok((fs, true)),
            Err(e) => e,
        },
        // The image or device itself is read-only to us.
        Err(oleo::Error::Io(e))
            if matches!(
                e.raw_os_error(),
                Some(libc::EACCES | libc::EROFS | libc::EPERM)
            ) =>
        {
            oleo::Error::Io(e)
        }
        // What oleo cannot write (a device smaller than the filesystem) it may still read.
        Err(e @ oleo::Error::Unsupported(_)) => e,
        Err(e) => return Err(show(e)),
    };
    if plan.writable == Some(true) {
        return Err(format!(
            "{}: cannot mount read-write: {why_not}",
            image.display()
        ));
    }
    log::warn!("{}: mounting read-only: {why_not}", image.display());
    Ok((
        Filesystem::open(image, plan.open.clone()).map_err(show)?,
        false,
    ))
}

fn tune(mountpoint: &Path, readahead_kib: u32) {
    if let Err(e) = oleo_fuse::set_readahead(mountpoint, readahead_kib) {
        log::info!("could not set readahead to {readahead_kib} KiB: {e}");
    }
}

/// Forks; the child mounts and tells the parent over a pipe whether it worked, then serves.
/// Forking happens before any thread exists, which is what makes it safe.
fn daemonize_and_serve(
    server: oleo_fuse::OleoFuse,
    mountpoint: &Path,
    image: &Path,
    start: &Start,
    log: &logging::Target,
    verbose: bool,
) -> Result<(), String> {
    let mut fds = [0i32; 2];
    // SAFETY: fds is a valid two-element array.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(format!("pipe: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: both descriptors were just created and are owned here only.
    let (read_end, write_end) =
        unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    // Blocked before the fork: a stop signal sent to the new server at once is taken by
    // its signal thread, not the default action.
    let mask = crate::daemon::stop::block();
    // SAFETY: single-threaded at this point (no FUSE threads yet).
    match unsafe { libc::fork() } {
        -1 => {
            crate::daemon::stop::restore(mask);
            Err(format!("fork: {}", std::io::Error::last_os_error()))
        }
        0 => {
            drop(read_end);
            let mut report = std::fs::File::from(write_end);
            stay_in_session();
            commit_on_sigusr1();
            let serving = match start.begin(server, mountpoint, image) {
                Ok(s) => s,
                Err(e) => {
                    let _ = write!(report, "{e}");
                    std::process::exit(1);
                }
            };
            let _ = report.write_all(b"OK");
            drop(report);
            detach_stdio();
            logging::switch_to(log);
            log::info!(
                "serving {} on {}",
                start.options.source,
                mountpoint.display()
            );
            let r = serving.run();
            crate::umount::record_exit(&r);
            if let Err(e) = r {
                log::error!("{e}");
                std::process::exit(1);
            }
            std::process::exit(0);
        }
        _child => {
            crate::daemon::stop::restore(mask);
            // The filesystem is the child's now. The parent's copy must not be dropped: a
            // drop commits, and two processes committing one image from the same state
            // would write two different generations N+1.
            std::mem::forget(server);
            drop(write_end);
            let mut msg = String::new();
            let _ = std::fs::File::from(read_end).read_to_string(&mut msg);
            if msg == "OK" {
                // Silent as mount(8) is; -v says where the log goes and the flags in force.
                if verbose {
                    say_flags(mountpoint);
                    match log {
                        logging::Target::File(path) => {
                            eprintln!("oleo: logging to {}", path.display())
                        }
                        logging::Target::Syslog => eprintln!("oleo: logging to syslog"),
                    }
                }
                Ok(())
            } else if msg.is_empty() {
                Err("the mount process died before mounting".into())
            } else {
                Err(msg)
            }
        }
    }
}

/// `-v`: the flags the kernel shows for the new mount, as /proc/mounts has them.
fn say_flags(mountpoint: &Path) {
    match crate::daemon::vfs_flags::effective(mountpoint) {
        Ok(f) => eprintln!("oleo: mounted on {} with {f}", mountpoint.display()),
        Err(e) => eprintln!("oleo: {e}"),
    }
}

/// `kill -USR1 PID` makes a serving oleo commit at once (the remount helper uses it).
fn commit_on_sigusr1() {
    extern "C" fn on_usr1(_: libc::c_int) {
        oleo_fuse::request_commit();
    }
    // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
    unsafe { libc::signal(libc::SIGUSR1, on_usr1 as *const () as libc::sighandler_t) };
}

/// Leaves the caller's job (a Ctrl-C or a hang-up of its terminal reaches the job's process
/// group, not this one) without leaving its session. With sched_autogroup, on by default in most distributions,
/// each session is a CPU group of its own, and every request handed from a caller in one
/// group to a server thread in another costs both sides about twice the CPU: `tar -x` of 50k
/// files took 23 s against 9 s with the server in the caller's session (io_uring).
fn stay_in_session() {
    // SAFETY: plain syscalls in the single-threaded child; SIG_IGN needs no handler.
    unsafe {
        libc::setpgid(0, 0);
        // Still on the caller's terminal until stdio is detached, from a background group.
        libc::signal(libc::SIGTTOU, libc::SIG_IGN);
    }
}

fn detach_stdio() {
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        use std::os::fd::AsRawFd;
        for fd in 0..3 {
            // SAFETY: dup2 onto the standard descriptors.
            unsafe { libc::dup2(null.as_raw_fd(), fd) };
        }
    }
}

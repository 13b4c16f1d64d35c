//! `oleo filesystem show | df | usage`: what `btrfs filesystem show | df | usage`
//! (btrfs-progs 6.2) print, character for character, for an image set (`--image`, each
//! member once) or for a mounted oleo filesystem (a path on it; the daemon answers the
//! `FS_USAGE` ioctl of `oleo_fuse::subvol_ioctl`).
//!
//! progs reads a mounted filesystem through the kernel: SPACE_INFO (per block group type
//! and profile, then the global reserve), FS_INFO/DEV_INFO (devices), a TREE_SEARCH of the
//! chunk tree (per-device shares) and statfs(2). Here the same numbers come from the
//! devices and chunks the engine reports, and what only the kernel knows is computed as it
//! computes it:
//! - the global reserve, as `btrfs_update_global_block_rsv` sets it at mount (see
//!   `oleo_fuse::subvol_ioctl::global_reserve`); its "used" is 0, as after a mount;
//! - statfs's available blocks ("Free (statfs, df)"), as `btrfs_statfs` and
//!   `btrfs_calc_avail_data_space` compute them with every present device writable (a
//!   kernel mount on read-only block devices marks every block group read-only and
//!   reports less: see `statfs_available`).
//!
//! `show` on images prints what progs prints for an unmounted filesystem (the
//! superblock's bytes used, the devices found, "*** Some devices missing"); on a mount,
//! what it prints for a mounted one (the bytes used of the space infos, "MISSING" devices).

use crate::common::on_mount;
use crate::common::units::Units;
use oleo::format::bytes::uuid_string;
use oleo::format::items::block_group as bg;
use oleo::{Filesystem, OpenOptions};
use oleo_fuse::subvol_ioctl::{FsChunk, FsDevice, FsUsage};
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct FilesystemArgs {
    #[command(subcommand)]
    verb: Verb,
}

#[derive(clap::Subcommand)]
enum Verb {
    /// Show the devices of a filesystem and their use (`btrfs filesystem show`).
    #[command(args_override_self = true)]
    Show(ShowArgs),
    /// Show the space of each block group type and profile (`btrfs filesystem df`).
    #[command(disable_help_flag = true, args_override_self = true)]
    Df(DfArgs),
    /// Show the space of the filesystem overall and per device (`btrfs filesystem usage`).
    #[command(disable_help_flag = true, args_override_self = true)]
    Usage(UsageArgs),
}

/// Where the filesystem is: images, or a path on a mount.
#[derive(clap::Args)]
struct Source {
    /// An image file or block device of the filesystem (not mounted); once per member of a
    /// multi-device filesystem. Members left out are reported missing.
    #[arg(long = "image", value_name = "IMG")]
    images: Vec<PathBuf>,
}

/// Unit options of `df` and `usage`. clap only checks them: `Units::from_args` reads them
/// from the command line, in order.
#[derive(clap::Args)]
#[allow(dead_code)]
struct UnitArgs {
    /// Raw numbers in bytes.
    #[arg(short = 'b', long = "raw")]
    raw: bool,
    /// Human friendly numbers, base 1024 (default).
    #[arg(short = 'h', long = "human-readable")]
    human: bool,
    /// Human friendly numbers, base 1000.
    #[arg(short = 'H')]
    human_si: bool,
    /// Use 1024 as a base (KiB, MiB, GiB, TiB).
    #[arg(long)]
    iec: bool,
    /// Use 1000 as a base (kB, MB, GB, TB).
    #[arg(long)]
    si: bool,
    /// Show sizes in KiB, or kB with --si.
    #[arg(short = 'k', long = "kbytes")]
    kbytes: bool,
    /// Show sizes in MiB, or MB with --si.
    #[arg(short = 'm', long = "mbytes")]
    mbytes: bool,
    /// Show sizes in GiB, or GB with --si.
    #[arg(short = 'g', long = "gbytes")]
    gbytes: bool,
    /// Show sizes in TiB, or TB with --si.
    #[arg(short = 't', long = "tbytes")]
    tbytes: bool,
    /// Print help.
    #[arg(long, action = clap::ArgAction::Help)]
    help: Option<bool>,
}

/// Unit options of `show` (long ones only, as in progs), read as those of `UnitArgs`.
#[derive(clap::Args)]
#[allow(dead_code)]
struct LongUnitArgs {
    /// Raw numbers in bytes.
    #[arg(long = "raw")]
    raw: bool,
    /// Human friendly numbers, base 1024 (default).
    #[arg(long = "human-readable")]
    human: bool,
    /// Use 1024 as a base (KiB, MiB, GiB, TiB).
    #[arg(long)]
    iec: bool,
    /// Use 1000 as a base (kB, MB, GB, TB).
    #[arg(long)]
    si: bool,
    /// Show sizes in KiB, or kB with --si.
    #[arg(long = "kbytes")]
    kbytes: bool,
    /// Show sizes in MiB, or MB with --si.
    #[arg(long = "mbytes")]
    mbytes: bool,
    /// Show sizes in GiB, or GB with --si.
    #[arg(long = "gbytes")]
    gbytes: bool,
    /// Show sizes in TiB, or TB with --si.
    #[arg(long = "tbytes")]
    tbytes: bool,
}

#[derive(clap::Args)]
struct ShowArgs {
    #[command(flatten)]
    source: Source,
    #[command(flatten)]
    units: LongUnitArgs,
    /// A path on a mounted oleo filesystem, or an image or device (as --image).
    path: Option<PathBuf>,
}

#[derive(clap::Args)]
struct DfArgs {
    #[command(flatten)]
    source: Source,
    #[command(flatten)]
    units: UnitArgs,
    /// A path on a mounted oleo filesystem, or an image or device (as --image).
    path: Option<PathBuf>,
}

#[derive(clap::Args)]
struct UsageArgs {
    #[command(flatten)]
    source: Source,
    #[command(flatten)]
    units: UnitArgs,
    /// Show the per-device part as a table.
    #[arg(short = 'T')]
    tabular: bool,
    /// Paths on mounted oleo filesystems, or an image or device (as --image).
    paths: Vec<PathBuf>,
}

/// The arguments after `filesystem VERB`, for the unit options in their order (clap keeps
/// only which were given). The value of `--image` is not an option.
fn verb_args() -> Vec<String> {
    let all: Vec<String> = std::env::args().collect();
    let Some(at) = all.iter().position(|a| a == "filesystem") else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut rest = all.into_iter().skip(at + 2);
    while let Some(a) = rest.next() {
        if a == "--image" {
            rest.next();
        } else if !a.starts_with("--image=") {
            out.push(a);
        }
    }
    out
}

pub fn run(a: &FilesystemArgs) -> Result<(), String> {
    let args = verb_args();
    match &a.verb {
        Verb::Show(s) => {
            let units = Units::from_args(args.iter().map(String::as_str), false);
            let (u, mounted) = load(&s.source.images, s.path.as_deref())?;
            print!("{}", show_text(&u, units, mounted));
            Ok(())
        }
        Verb::Df(d) => {
            let units = Units::from_args(args.iter().map(String::as_str), true);
            let (u, _) = load(&d.source.images, d.path.as_deref())?;
            let spaces = space_infos(&u);
            print!("{}", df_text(&spaces, units));
            eprint!("{}", multiple_profiles_warning(&spaces));
            Ok(())
        }
        Verb::Usage(us) => {
            let units = Units::from_args(args.iter().map(String::as_str), true);
            let targets: Vec<Option<&Path>> = if us.paths.is_empty() {
                vec![None]
            } else {
                us.paths.iter().map(|p| Some(p.as_path())).collect()
            };
            for (i, t) in targets.into_iter().enumerate() {
                let (u, _) = load(&us.source.images, t)?;
                if i > 0 {
                    println!();
                }
                print!("{}", usage_text(&u, units, us.tabular)?);
            }
            Ok(())
        }
    }
}

/// The report of the filesystem the arguments name, and whether it is mounted.
fn load(images: &[PathBuf], path: Option<&Path>) -> Result<(FsUsage, bool), String> {
    match (images, path) {
        ([], None) => Err("give a path on a mounted oleo filesystem, or --image IMAGE".into()),
        ([_, ..], Some(_)) => Err("give either --image or a path, not both".into()),
        ([], Some(p)) if p.is_dir() => Ok((on_mount::fs_usage(p)?, true)),
        ([], Some(p)) => Ok((image_report(&[p.to_path_buf()])?, false)),
        (images, None) => Ok((image_report(images)?, false)),
    }
}

/// Opens the set read-only (degraded: a member left out is reported missing, as progs
/// reports devices it did not find) and reads its report.
fn image_report(images: &[PathBuf]) -> Result<FsUsage, String> {
    let opts = OpenOptions {
        devices: images[1..].to_vec(),
        degraded: true,
        ..OpenOptions::default()
    };
    let fs =
        Filesystem::open(&images[0], opts).map_err(|e| format!("{}: {e}", images[0].display()))?;
    FsUsage::from_engine(&fs).map_err(|e| format!("{}: {e}", images[0].display()))
}

// ---- block group types and profiles, as progs and the kernel name and order them ----

/// SPACE_INFO's flag for the global block reserve.
const GLOBAL_RSV: u64 = 1 << 49;
/// The extended profile bit for "single" (progs's BTRFS_AVAIL_ALLOC_BIT_SINGLE).
const SINGLE: u64 = 1 << 48;
const RAID1_MASK: u64 = bg::RAID1 | bg::RAID1C3 | bg::RAID1C4;
const RAID56_MASK: u64 = bg::RAID5 | bg::RAID6;

/// The profile of `flags` as progs's `btrfs_bg_flags_to_raid_index` picks it (the first of
/// these bits set), 0 for single.
fn profile(flags: u64) -> u64 {
    [
        bg::RAID10,
        bg::RAID1,
        bg::RAID1C3,
        bg::RAID1C4,
        bg::DUP,
        bg::RAID0,
        bg::RAID5,
        bg::RAID6,
    ]
    .into_iter()
    .find(|&p| flags & p != 0)
    .unwrap_or(0)
}

/// What progs's raid table says of a profile: (upper name, lower name, copies, parity
/// stripes, sub-stripes).
fn raid_attr(profile: u64) -> (&'static str, &'static str, u64, u64, u64) {
    match profile {
        bg::RAID10 => ("RAID10", "raid10", 2, 0, 2),
        bg::RAID1 => ("RAID1", "raid1", 2, 0, 1),
        bg::RAID1C3 => ("RAID1C3", "raid1c3", 3, 0, 1),
        bg::RAID1C4 => ("RAID1C4", "raid1c4", 4, 0, 1),
        bg::DUP => ("DUP", "dup", 2, 0, 1),
        bg::RAID0 => ("RAID0", "raid0", 1, 0, 1),
        bg::RAID5 => ("RAID5", "raid5", 1, 1, 1),
        bg::RAID6 => ("RAID6", "raid6", 1, 2, 1),
        _ => ("single", "single", 1, 0, 1),
    }
}

fn ncopies(flags: u64) -> u64 {
    raid_attr(profile(flags)).2
}

/// `btrfs_group_type_str`.
fn type_str(flags: u64) -> &'static str {
    match flags & (bg::TYPE_MASK | GLOBAL_RSV) {
        bg::DATA => "Data",
        bg::SYSTEM => "System",
        bg::METADATA => "Metadata",
        f if f == bg::DATA | bg::METADATA => "Data+Metadata",
        GLOBAL_RSV => "GlobalReserve",
        _ => "unknown",
    }
}

/// `btrfs_group_profile_str`.
fn profile_str(flags: u64) -> &'static str {
    let f = flags & !(bg::TYPE_MASK | SINGLE | GLOBAL_RSV);
    if f & !bg::PROFILE_MASK != 0 {
        return "UNKNOWN";
    }
    raid_attr(profile(f)).0
}

/// One line of SPACE_INFO: a block group type and profile, or the global reserve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Space {
    flags: u64,
    total: u64,
    used: u64,
}

/// What the kernel's SPACE_INFO ioctl answers: per type (data, system, metadata, mixed),
/// per profile in the kernel's raid index order (single, then by profile bit), the sum of
/// the block groups' lengths and use; then the global reserve.
fn space_infos(u: &FsUsage) -> Vec<Space> {
    let mut out = Vec::new();
    let types = [bg::DATA, bg::SYSTEM, bg::METADATA, bg::DATA | bg::METADATA];
    let profiles = [
        0,
        bg::RAID0,
        bg::RAID1,
        bg::DUP,
        bg::RAID10,
        bg::RAID5,
        bg::RAID6,
        bg::RAID1C3,
        bg::RAID1C4,
    ];
    for t in types {
        for p in profiles {
            let mut found = None::<Space>;
            for c in u.chunks.iter().filter(|c| {
                c.flags & bg::TYPE_MASK == t && kernel_profile(c.flags & bg::PROFILE_MASK) == p
            }) {
                let s = found.get_or_insert(Space {
                    flags: c.flags,
                    total: 0,
                    used: 0,
                });
                s.total += c.length;
                s.used += c.used;
            }
            out.extend(found);
        }
    }
    out.push(Space {
        flags: GLOBAL_RSV,
        total: u.global_reserve,
        used: 0,
    });
    out
}

/// The kernel's raid index of a profile, as the profile bit it stands for: the highest bit
/// set (`btrfs_bg_flags_to_raid_index` takes the log of the bits).
fn kernel_profile(p: u64) -> u64 {
    if p == 0 {
        0
    } else {
        1 << (63 - p.leading_zeros())
    }
}

/// progs's `cmp_chunk_block_group`: data, then metadata, then mixed, system last; the same
/// type by profile bits.
fn cmp_block_group(f1: u64, f2: u64) -> std::cmp::Ordering {
    let mask = if f1 & bg::TYPE_MASK == f2 & bg::TYPE_MASK {
        bg::PROFILE_MASK
    } else if f2 & bg::SYSTEM != 0 {
        return std::cmp::Ordering::Less;
    } else if f1 & bg::SYSTEM != 0 {
        return std::cmp::Ordering::Greater;
    } else {
        bg::TYPE_MASK
    };
    (f1 & mask).cmp(&(f2 & mask))
}

// ---- show ----

fn path_text(p: &[u8]) -> String {
    String::from_utf8_lossy(p).into_owned()
}

fn label_text(u: &FsUsage) -> String {
    if u.label.is_empty() {
        "Label: none ".to_string()
    } else {
        format!("Label: '{}' ", String::from_utf8_lossy(&u.label))
    }
}

/// `btrfs filesystem show`: `print_one_fs` for a mount, `print_one_uuid` for images.
fn show_text(u: &FsUsage, units: Units, mounted: bool) -> String {
    let mut s = label_text(u);
    let used = if mounted {
        space_infos(u).iter().map(|sp| sp.used).sum()
    } else {
        u.bytes_used
    };
    s += &format!(
        " uuid: {}\n\tTotal devices {} FS bytes used {}\n",
        uuid_string(&u.fsid),
        u.num_devices,
        units.size(used)
    );
    let mut found = 0u64;
    let mut devices: Vec<&FsDevice> = u.devices.iter().collect();
    devices.sort_by_key(|d| d.devid);
    for d in devices {
        match (&d.path, mounted) {
            (None, true) => {
                s += &format!("\tdevid {:4} size 0 used 0 path  MISSING\n", d.devid);
            }
            (None, false) => {}
            (Some(p), _) => {
                let shown = if mounted { canonical(p) } else { path_text(p) };
                s += &format!(
                    "\tdevid {:4} size {} used {} path {}\n",
                    d.devid,
                    units.size(d.total_bytes),
                    units.size(d.bytes_used),
                    shown
                );
                found += 1;
            }
        }
    }
    if !mounted && found < u.num_devices {
        s += "\t*** Some devices missing\n";
    }
    s + "\n"
}

/// progs shows a mounted filesystem's device paths canonicalized.
fn canonical(p: &[u8]) -> String {
    use std::os::unix::ffi::OsStrExt;
    let path = Path::new(std::ffi::OsStr::from_bytes(p));
    std::fs::canonicalize(path)
        .map(|c| c.display().to_string())
        .unwrap_or_else(|_| path_text(p))
}

// ---- df ----

/// `print_df_text`.
fn df_text(spaces: &[Space], units: Units) -> String {
    spaces
        .iter()
        .map(|sp| {
            format!(
                "{}, {}: total={}, used={}\n",
                type_str(sp.flags),
                profile_str(sp.flags),
                units.size(sp.total),
                units.size(sp.used)
            )
        })
        .collect()
}

/// Profiles per type, as `btrfs_get_string_for_multiple_profiles` gathers them: (data,
/// metadata, mixed, system), each the extended profile bits seen.
fn profiles_per_type(spaces: &[Space]) -> [u64; 4] {
    let mut p = [0u64; 4];
    let mixed = bg::DATA | bg::METADATA;
    for sp in spaces {
        let mut f = sp.flags;
        if f & bg::PROFILE_MASK == 0 {
            f |= SINGLE;
        }
        let slot = if f & mixed == mixed {
            2
        } else if f & bg::DATA != 0 {
            0
        } else if f & bg::METADATA != 0 {
            1
        } else if f & bg::SYSTEM != 0 {
            3
        } else {
            continue;
        };
        p[slot] |= f;
    }
    p.map(|x| x & (bg::PROFILE_MASK | SINGLE))
}

/// `sprint_profiles`: "single, raid1" when more than one profile is seen.
fn profile_list(profiles: u64) -> Option<String> {
    if profiles.count_ones() <= 1 {
        return None;
    }
    let mut names = Vec::new();
    if profiles & SINGLE != 0 {
        names.push("single");
    }
    // progs's raid index order.
    for p in [
        bg::RAID10,
        bg::RAID1,
        bg::DUP,
        bg::RAID0,
        bg::RAID5,
        bg::RAID6,
        bg::RAID1C3,
        bg::RAID1C4,
    ] {
        if profiles & p != 0 {
            names.push(raid_attr(p).1);
        }
    }
    Some(names.join(", "))
}

const TYPE_NAMES: [(&str, &str); 4] = [
    ("data", "Data"),
    ("metadata", "Metadata"),
    ("data+metadata", "Data+Metadata"),
    ("system", "System"),
];

/// `btrfs_warn_multiple_profiles` (what `df` prints to stderr after its lines).
fn multiple_profiles_warning(spaces: &[Space]) -> String {
    let lists = profiles_per_type(spaces).map(profile_list);
    if lists.iter().all(Option::is_none) {
        return String::new();
    }
    let mut s = "WARNING: Multiple block group profiles detected, see 'man btrfs(5)'\n".to_string();
    for (list, (_, name)) in lists.iter().zip(TYPE_NAMES) {
        if let Some(l) = list {
            s += &format!("WARNING:    {name}: {l}\n");
        }
    }
    s
}

/// `btrfs_test_for_multiple_profiles`: the types with more than one profile, or "".
fn multiple_profiles_types(spaces: &[Space]) -> String {
    let lists = profiles_per_type(spaces).map(profile_list);
    lists
        .iter()
        .zip(TYPE_NAMES)
        .filter(|(l, _)| l.is_some())
        .map(|(_, (name, _))| name)
        .collect::<Vec<_>>()
        .join(", ")
}

// ---- usage ----

/// progs's `struct chunk_info`: the chunks of one type with one number of stripes, on one
/// device; `size` sums their logical lengths, once per stripe there.
struct ChunkShare {
    flags: u64,
    devid: u64,
    num_stripes: u64,
    size: u64,
}

/// `load_chunk_info`'s list.
fn chunk_shares(u: &FsUsage) -> Vec<ChunkShare> {
    let mut out: Vec<ChunkShare> = Vec::new();
    for c in &u.chunks {
        let n = c.stripes.len() as u64;
        for &devid in &c.stripes {
            match out
                .iter_mut()
                .find(|s| s.flags == c.flags && s.devid == devid && s.num_stripes == n)
            {
                Some(s) => s.size += c.length,
                None => out.push(ChunkShare {
                    flags: c.flags,
                    devid,
                    num_stripes: n,
                    size: c.length,
                }),
            }
        }
    }
    out
}

/// `calc_chunk_size`: the bytes of the device these chunks take.
fn share_on_device(s: &ChunkShare) -> u64 {
    if s.flags & (RAID1_MASK | bg::DUP) != 0 {
        return s.size;
    }
    let (_, _, _, nparity, sub) = raid_attr(profile(s.flags));
    let div = s.num_stripes.saturating_sub(nparity) / sub;
    s.size.checked_div(div).unwrap_or(0)
}

/// progs's `struct device_info`.
struct DevInfo {
    devid: u64,
    path: String,
    /// DEV_INFO total_bytes.
    size: u64,
    /// The block device's (or file's) size; 0 for a missing one.
    device_size: u64,
}

fn dev_infos(u: &FsUsage) -> Vec<DevInfo> {
    let mut v: Vec<DevInfo> = u
        .devices
        .iter()
        .map(|d| DevInfo {
            devid: d.devid,
            path: d
                .path
                .as_deref()
                .map_or_else(|| "missing".to_string(), path_text),
            size: d.total_bytes,
            device_size: if d.path.is_some() { d.device_size } else { 0 },
        })
        .collect();
    v.sort_by_key(|d| d.devid);
    v
}

/// `calc_slack_size` (a u64 difference, as in progs).
fn slack(d: &DevInfo) -> u64 {
    if d.device_size > 0 {
        d.device_size.wrapping_sub(d.size)
    } else {
        0
    }
}

/// The kernel's attributes of the profile `btrfs_calc_avail_data_space` allocates with:
/// (devs_min, dev_stripes, copies).
fn kernel_raid(profile: u64) -> (u64, u64, u64) {
    match profile {
        bg::RAID10 => (2, 1, 2),
        bg::RAID1 => (2, 1, 2),
        bg::RAID1C3 => (3, 1, 3),
        bg::RAID1C4 => (4, 1, 4),
        bg::DUP => (1, 2, 2),
        bg::RAID5 => (2, 1, 1),
        bg::RAID6 => (3, 1, 1),
        _ => (1, 1, 1), // single, RAID0
    }
}

/// statfs(2)'s f_bavail × f_bsize as the kernel's `btrfs_statfs` computes it right after
/// a mount with every present device writable: the free space inside data block groups
/// that are not read-only, plus what `btrfs_calc_avail_data_space` finds unallocated, both
/// divided by the copies of the data profile. The kernel marks read-only at mount the
/// block groups of a chunk with more stripes on missing devices than its profile
/// tolerates (`btrfs_chunk_writeable`), and the single and RAID0
/// ones of a type whose allocation profile is mirrored (`btrfs_read_block_groups`). The
/// metadata exhaustion check (`space_info->full`) never holds right after a mount and is
/// left out. (On read-only block devices every block group is read-only and the profile
/// reduces to single: the kernel then reports less than this.)
fn statfs_available(u: &FsUsage) -> u64 {
    const STRIPE_LEN: u64 = 64 << 10;
    const RESERVED: u64 = 1 << 20;
    let data: Vec<_> = u
        .chunks
        .iter()
        .filter(|c| c.flags & bg::DATA != 0)
        .collect();
    let present: Vec<&FsDevice> = u.devices.iter().filter(|d| d.path.is_some()).collect();
    let missing = |devid: u64| !present.iter().any(|d| d.devid == devid);
    let alloc = data_alloc_profile(&data, present.len() as u64);
    let (devs_min, dev_stripes, copies) = kernel_raid(alloc);
    let mirrored = alloc & (bg::RAID10 | RAID1_MASK | RAID56_MASK | bg::DUP) != 0;
    let kernel_copies = |flags: u64| kernel_raid(kernel_profile(flags & bg::PROFILE_MASK)).2;
    // The copies of the last non-empty profile in the kernel's raid index order.
    let factor = data
        .iter()
        .map(|c| kernel_profile(c.flags & bg::PROFILE_MASK))
        .max()
        .map_or(1, |p| kernel_raid(p).2);
    let free_data: u64 = data
        .iter()
        .filter(|c| {
            let unmirrored = c.flags & (bg::PROFILE_MASK & !bg::RAID0) == 0;
            let lost = c.stripes.iter().filter(|&&d| missing(d)).count() as u64;
            !(mirrored && unmirrored) && lost <= tolerated_failures(c.flags)
        })
        .map(|c| (c.length - c.used.min(c.length)) * kernel_copies(c.flags))
        .sum();
    let n = present.len() as u64;
    let mut num_stripes = match alloc {
        bg::RAID0 => n,
        p if p & RAID1_MASK != 0 => copies,
        bg::RAID10 => 4,
        _ => 1,
    };
    let min_stripe = dev_stripes * STRIPE_LEN;
    let mut avail: Vec<u64> = present
        .iter()
        .filter_map(|d| {
            let a = d.total_bytes.saturating_sub(d.bytes_used) / STRIPE_LEN * STRIPE_LEN;
            (a > RESERVED + min_stripe).then(|| a - RESERVED)
        })
        .collect();
    avail.sort_unstable_by(|a, b| b.cmp(a));
    let mut nr = avail.len() as u64;
    let mut total = 0u64;
    while nr >= devs_min && nr > 0 {
        num_stripes = num_stripes.min(nr);
        let i = (nr - 1) as usize;
        if avail[i] >= min_stripe {
            let size = avail[i];
            total += size * num_stripes;
            for a in &mut avail[(i + 1 - num_stripes as usize)..=i] {
                *a -= size;
            }
        }
        nr -= 1;
    }
    let bits = u.sectorsize.max(1).trailing_zeros();
    ((free_data / factor + total / factor) >> bits) << bits
}

/// The kernel's `tolerated_failures` of a profile.
fn tolerated_failures(flags: u64) -> u64 {
    match kernel_profile(flags & bg::PROFILE_MASK) {
        bg::RAID1 | bg::RAID10 | bg::RAID5 => 1,
        bg::RAID1C3 | bg::RAID6 => 2,
        bg::RAID1C4 => 3,
        _ => 0,
    }
}

/// `btrfs_data_alloc_profile`: the profiles data block groups have, reduced to those
/// `rw_devices` devices allow, the most redundant first (0: single).
fn data_alloc_profile(data: &[&FsChunk], rw_devices: u64) -> u64 {
    let seen = data.iter().fold(0, |a, c| a | (c.flags & bg::PROFILE_MASK));
    let possible = [
        bg::RAID0,
        bg::RAID1,
        bg::DUP,
        bg::RAID10,
        bg::RAID5,
        bg::RAID6,
        bg::RAID1C3,
        bg::RAID1C4,
    ]
    .into_iter()
    .filter(|&p| rw_devices >= kernel_raid(p).0)
    .fold(0, |a, p| a | p);
    let allowed = possible & seen;
    [
        bg::RAID1C4,
        bg::RAID6,
        bg::RAID1C3,
        bg::RAID5,
        bg::RAID10,
        bg::RAID1,
        bg::DUP,
        bg::RAID0,
    ]
    .into_iter()
    .find(|&p| allowed & p != 0)
    .unwrap_or(0)
}

/// `btrfs filesystem usage` of one filesystem: `print_filesystem_usage_overall`, a blank
/// line, then `_cmd_filesystem_usage_linear` or `_tabular`.
fn usage_text(u: &FsUsage, units: Units, tabular: bool) -> Result<String, String> {
    let mut spaces = space_infos(u);
    spaces.sort_by(|a, b| cmp_block_group(a.flags, b.flags));
    let shares = chunk_shares(u);
    let devs = dev_infos(u);
    let mut s = overall_text(u, &spaces, &shares, &devs, units)?;
    s.push('\n');
    s += &if tabular {
        tabular_text(&spaces, &shares, &devs, units)
    } else {
        linear_text(&spaces, &shares, &devs, units)
    };
    Ok(s)
}

fn overall_text(
    u: &FsUsage,
    spaces: &[Space],
    shares: &[ChunkShare],
    devs: &[DevInfo],
    units: Units,
) -> Result<String, String> {
    let r_total_size: u64 = devs.iter().map(|d| d.size).sum();
    let r_total_slack = devs.iter().fold(0u64, |a, d| a.wrapping_add(slack(d)));
    let r_total_missing: u64 = devs
        .iter()
        .filter(|d| d.device_size == 0)
        .map(|d| d.size)
        .sum();
    if r_total_size == 0 {
        return Err("cannot get space info: no device has a size".into());
    }
    let (mut r_data_chunks, mut r_data_used, mut l_data_chunks) = (0u64, 0u64, 0u64);
    let (mut r_meta_chunks, mut r_meta_used, mut l_meta_chunks) = (0u64, 0u64, 0u64);
    let (mut r_sys_chunks, mut r_sys_used) = (0u64, 0u64);
    let mut max_data_ratio = 1.0f64;

    // get_raid56_space_info: RAID5/6 chunks count by their data stripes, their use in
    // proportion to their profile's use.
    let logical_ratio = |profile: u64, t: u64| {
        let (used, total) = spaces
            .iter()
            .filter(|sp| sp.flags & profile != 0)
            .filter(|sp| {
                let f = sp.flags;
                match t {
                    bg::DATA => f & bg::DATA != 0,
                    bg::METADATA => f & bg::DATA == 0 && f & bg::METADATA != 0,
                    _ => f & (bg::DATA | bg::METADATA) == 0 && f & bg::SYSTEM != 0,
                }
            })
            .fold((0u64, 0u64), |(u, t), sp| (u + sp.used, t + sp.total));
        if total == 0 {
            -1.0
        } else {
            used as f64 / total as f64
        }
    };
    for ci in shares {
        let p = if ci.flags & bg::RAID5 != 0 {
            bg::RAID5
        } else if ci.flags & bg::RAID6 != 0 {
            bg::RAID6
        } else {
            continue;
        };
        let nparity = raid_attr(profile(ci.flags)).3;
        let data_stripes = ci.num_stripes.saturating_sub(nparity).max(1);
        let rt = ci.num_stripes as f64 / data_stripes as f64;
        if rt > max_data_ratio {
            max_data_ratio = rt;
        }
        let size = ci.size / data_stripes;
        let add = |acc: &mut u64, ratio: f64| *acc = (*acc as f64 + size as f64 * ratio) as u64;
        if ci.flags & bg::DATA != 0 {
            r_data_chunks += size;
            add(&mut r_data_used, logical_ratio(p, bg::DATA));
        } else if ci.flags & bg::METADATA != 0 {
            r_meta_chunks += size;
            add(&mut r_meta_used, logical_ratio(p, bg::METADATA));
        } else if ci.flags & bg::SYSTEM != 0 {
            r_sys_chunks += size;
            add(&mut r_sys_used, logical_ratio(p, bg::SYSTEM));
        }
    }

    let (mut l_global_reserve, mut l_global_reserve_used) = (0u64, 0u64);
    let mut mixed = false;
    for sp in spaces {
        let f = sp.flags;
        let ratio = if f & RAID56_MASK != 0 { 0 } else { ncopies(f) };
        if ratio as f64 > max_data_ratio {
            max_data_ratio = ratio as f64;
        }
        if f & GLOBAL_RSV != 0 {
            l_global_reserve = sp.total;
            l_global_reserve_used = sp.used;
        }
        if f & (bg::DATA | bg::METADATA) == bg::DATA | bg::METADATA {
            mixed = true;
        }
        if f & bg::DATA != 0 {
            r_data_used += sp.used * ratio;
            r_data_chunks += sp.total * ratio;
            l_data_chunks += sp.total;
        }
        if f & bg::METADATA != 0 {
            r_meta_used += sp.used * ratio;
            r_meta_chunks += sp.total * ratio;
            l_meta_chunks += sp.total;
        }
        if f & bg::SYSTEM != 0 {
            r_sys_used += sp.used * ratio;
            r_sys_chunks += sp.total * ratio;
        }
    }
    let mut r_total_chunks = r_data_chunks + r_sys_chunks;
    let mut r_total_used = r_data_used + r_sys_used;
    if !mixed {
        r_total_chunks += r_meta_chunks;
        r_total_used += r_meta_used;
    }
    let r_total_unused = r_total_size.wrapping_sub(r_total_chunks);
    let data_ratio = r_data_chunks as f64 / l_data_chunks as f64;
    let metadata_ratio = if mixed {
        data_ratio
    } else {
        r_meta_chunks as f64 / l_meta_chunks as f64
    };
    let mut free_estimated = (r_data_chunks.wrapping_sub(r_data_used) as f64 / data_ratio) as u64;
    if mixed {
        free_estimated =
            free_estimated.wrapping_sub(l_global_reserve.wrapping_sub(l_global_reserve_used));
    }
    let mut free_min = free_estimated;
    if r_total_unused >= 16 << 20 {
        free_estimated = (free_estimated as f64 + r_total_unused as f64 / data_ratio) as u64;
        free_min = (free_min as f64 + r_total_unused as f64 / max_data_ratio) as u64;
    }
    let w = if units.is_default() { 10 } else { 18 };
    let multiple = multiple_profiles_types(spaces);
    let mut s = String::from("Overall:\n");
    s += &format!("    Device size:\t\t{:>w$}\n", units.size(r_total_size));
    s += &format!(
        "    Device allocated:\t\t{:>w$}\n",
        units.size(r_total_chunks)
    );
    s += &format!(
        "    Device unallocated:\t\t{:>w$}\n",
        units.signed(r_total_unused)
    );
    s += &format!(
        "    Device missing:\t\t{:>w$}\n",
        units.size(r_total_missing)
    );
    s += &format!("    Device slack:\t\t{:>w$}\n", units.size(r_total_slack));
    s += &format!("    Used:\t\t\t{:>w$}\n", units.size(r_total_used));
    s += &format!(
        "    Free (estimated):\t\t{:>w$}\t(min: {})\n",
        units.size(free_estimated),
        units.size(free_min)
    );
    s += &format!(
        "    Free (statfs, df):\t\t{:>w$}\n",
        units.size(statfs_available(u))
    );
    s += &format!("    Data ratio:\t\t\t{}\n", ratio_text(data_ratio, w));
    s += &format!("    Metadata ratio:\t\t{}\n", ratio_text(metadata_ratio, w));
    s += &format!(
        "    Global reserve:\t\t{:>w$}\t(used: {})\n",
        units.size(l_global_reserve),
        units.size(l_global_reserve_used)
    );
    if multiple.is_empty() {
        s += &format!("    Multiple profiles:\t\t{:>w$}\n", "no");
    } else {
        s += &format!("    Multiple profiles:\t\t{:>w$}\t({multiple})\n", "yes");
    }
    Ok(s)
}

/// `%*.2f` of a ratio (glibc spells a NaN "-nan" or "nan"; a filesystem without data
/// chunks has one).
fn ratio_text(r: f64, w: usize) -> String {
    let t = if r.is_nan() {
        if r.is_sign_negative() {
            "-nan".to_string()
        } else {
            "nan".to_string()
        }
    } else if r.is_infinite() {
        if r < 0.0 { "-inf" } else { "inf" }.to_string()
    } else {
        format!("{r:.2}")
    };
    format!("{t:>w$}")
}

/// The share of the device `devid` taken by chunks of exactly `flags`.
fn device_share(shares: &[ChunkShare], flags: u64, devid: u64) -> u64 {
    shares
        .iter()
        .filter(|c| c.flags == flags && c.devid == devid)
        .map(share_on_device)
        .sum()
}

/// `_cmd_filesystem_usage_linear`.
fn linear_text(spaces: &[Space], shares: &[ChunkShare], devs: &[DevInfo], units: Units) -> String {
    let mut s = String::new();
    for sp in spaces.iter().filter(|sp| sp.flags & GLOBAL_RSV == 0) {
        let pct = 100.0f32 * sp.used as f32 / sp.total.wrapping_add(1) as f32;
        s += &format!(
            "{},{}: Size:{}, Used:{} ({:.2}%)\n",
            type_str(sp.flags),
            profile_str(sp.flags),
            units.size(sp.total),
            units.size(sp.used),
            f64::from(pct)
        );
        for d in devs {
            let total = device_share(shares, sp.flags, d.devid);
            if total > 0 {
                s += &format!("   {}\t{:>10}\n", d.path, units.size(total));
            }
        }
        s.push('\n');
    }
    if !shares.is_empty() {
        s += "Unallocated:\n";
        for d in devs {
            let taken: u64 = shares
                .iter()
                .filter(|c| c.devid == d.devid)
                .map(share_on_device)
                .sum();
            s += &format!(
                "   {}\t{:>10}\n",
                d.path,
                units.signed(d.size.wrapping_sub(taken))
            );
        }
    }
    s
}

/// progs's string table (common/string-table.c): cells start with '<' (left-aligned), '>'
/// (right-aligned) or '*' (a rule of the next character); columns as wide as their widest
/// cell, one space apart.
struct Table {
    cols: usize,
    cells: Vec<Option<String>>,
}

impl Table {
    fn new(cols: usize, rows: usize) -> Table {
        Table {
            cols,
            cells: vec![None; cols * rows],
        }
    }

    fn set(&mut self, col: usize, row: usize, cell: String) {
        self.cells[row * self.cols + col] = Some(cell);
    }

    fn dump(&self) -> String {
        let rows = self.cells.len() / self.cols;
        let mut widths = vec![0usize; self.cols];
        for (i, c) in self.cells.iter().enumerate() {
            if let Some(c) = c {
                let len = c.len().saturating_sub(1);
                if len > 0 && !c.starts_with('*') {
                    widths[i % self.cols] = widths[i % self.cols].max(len);
                }
            }
        }
        let mut out = String::new();
        for r in 0..rows {
            for (col, &w) in widths.iter().enumerate() {
                match self.cells[r * self.cols + col].as_deref() {
                    None | Some("") => out += &" ".repeat(w),
                    Some(c) if c.starts_with('*') && c.len() > 1 => {
                        out += &c[1..2].repeat(w);
                    }
                    Some(c) => {
                        let text = &c[1..];
                        let pad = " ".repeat(w.saturating_sub(text.len()));
                        if c.starts_with('<') {
                            out += text;
                            out += &pad;
                        } else {
                            out += &pad;
                            out += text;
                        }
                    }
                }
                if col + 1 != self.cols {
                    out.push(' ');
                }
            }
            out.push('\n');
        }
        out
    }
}

/// `_cmd_filesystem_usage_tabular`.
fn tabular_text(spaces: &[Space], shares: &[ChunkShare], devs: &[DevInfo], units: Units) -> String {
    let shown: Vec<&Space> = spaces
        .iter()
        .filter(|s| s.flags & GLOBAL_RSV == 0)
        .collect();
    let ncols = 5 + shown.len();
    let first = 2;
    let top = 3;
    let n = devs.len();
    let mut t = Table::new(ncols, top + n + 3);
    for (k, sp) in shown.iter().enumerate() {
        t.set(first + k, 0, format!("<{}", type_str(sp.flags)));
        t.set(first + k, 1, format!("<{}", profile_str(sp.flags)));
    }
    let unalloc_col = first + shown.len();
    let (total_col, slack_col) = (unalloc_col + 1, unalloc_col + 2);
    t.set(0, 1, "<Id".into());
    t.set(1, 1, "<Path".into());
    t.set(unalloc_col, 1, "<Unallocated".into());
    t.set(total_col, 1, "<Total".into());
    t.set(slack_col, 1, "<Slack".into());
    let (mut total_unused, mut total_total, mut total_slack) = (0u64, 0u64, 0u64);
    for (i, d) in devs.iter().enumerate() {
        let row = top + i;
        t.set(0, row, format!(">{}", d.devid));
        t.set(1, row, format!("<{}", d.path));
        let mut allocated = 0u64;
        for (k, sp) in shown.iter().enumerate() {
            let size = device_share(shares, sp.flags, d.devid);
            t.set(
                first + k,
                row,
                if size > 0 {
                    format!(">{}", units.size(size))
                } else {
                    ">-".into()
                },
            );
            allocated += size;
        }
        let unused = d.size.wrapping_sub(allocated);
        t.set(unalloc_col, row, format!(">{}", units.signed(unused)));
        t.set(total_col, row, format!(">{}", units.signed(d.size)));
        let sl = slack(d);
        t.set(
            slack_col,
            row,
            if sl > 0 {
                format!(">{}", units.signed(sl))
            } else {
                ">-".into()
            },
        );
        total_unused = total_unused.wrapping_add(unused);
        total_slack = total_slack.wrapping_add(sl);
        total_total = total_total.wrapping_add(d.size);
    }
    for col in 0..ncols {
        t.set(col, top - 1, "*-".into());
        t.set(col, top + n, "*-".into());
    }
    t.set(1, top + n + 1, "<Total".into());
    for (k, sp) in shown.iter().enumerate() {
        t.set(first + k, top + n + 1, format!(">{}", units.size(sp.total)));
        t.set(first + k, top + n + 2, format!(">{}", units.size(sp.used)));
    }
    t.set(
        unalloc_col,
        top + n + 1,
        format!(">{}", units.signed(total_unused)),
    );
    t.set(
        total_col,
        top + n + 1,
        format!(">{}", units.signed(total_total)),
    );
    t.set(
        slack_col,
        top + n + 1,
        format!(">{}", units.signed(total_slack)),
    );
    t.set(1, top + n + 2, "<Used".into());
    t.dump()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The 2 × 1 GiB RAID1 of docs/design/multi-device.md section 7, with 20 MiB of data.
    fn raid1_sample() -> FsUsage {
        let mib = 1u64 << 20;
        let chunk = |logical: u64, length: u64, flags: u64, used: u64| FsChunk {
            logical,
            length,
            flags,
            used,
            stripes: vec![1, 2],
        };
        let dev = |devid: u64, path: &str| FsDevice {
            devid,
            uuid: [devid as u8; 16],
            total_bytes: 1 << 30,
            bytes_used: 223_084_544,
            device_size: 1 << 30,
            path: Some(path.as_bytes().to_vec()),
        };
        FsUsage {
            label: Vec::new(),
            fsid: [0x11; 16],
            num_devices: 2,
            total_bytes: 2 << 30,
            bytes_used: 21_151_744,
            sectorsize: 4096,
            nodesize: 16384,
            global_reserve: 5632 << 10,
            devices: vec![dev(1, "/dev/loop0"), dev(2, "/dev/loop1")],
            chunks: vec![
                chunk(22 * mib, 8 * mib, bg::SYSTEM | bg::RAID1, 16384),
                chunk(30 * mib, 107_347_968, bg::METADATA | bg::RAID1, 163_840),
                chunk(
                    30 * mib + 107_347_968,
                    107_347_968,
                    bg::DATA | bg::RAID1,
                    20 * mib,
                ),
            ],
        }
    }

    #[test]
    fn df_of_the_raid1_sample_is_progs() {
        let u = raid1_sample();
        assert_eq!(
            df_text(&space_infos(&u), Units::HUMAN),
            "Data, RAID1: total=102.38MiB, used=20.00MiB\n\
             System, RAID1: total=8.00MiB, used=16.00KiB\n\
             Metadata, RAID1: total=102.38MiB, used=160.00KiB\n\
             GlobalReserve, single: total=5.50MiB, used=0.00B\n"
        );
        assert_eq!(multiple_profiles_warning(&space_infos(&u)), "");
    }

    #[test]
    fn usage_of_the_raid1_sample_is_progs() {
        let u = raid1_sample();
        let want = "Overall:
    Device size:\t\t   2.00GiB
    Device allocated:\t\t 425.50MiB
    Device unallocated:\t\t   1.58GiB
    Device missing:\t\t     0.00B
    Device slack:\t\t     0.00B
    Used:\t\t\t  40.34MiB
    Free (estimated):\t\t 893.62MiB\t(min: 893.62MiB)
    Free (statfs, df):\t\t 892.62MiB
    Data ratio:\t\t\t      2.00
    Metadata ratio:\t\t      2.00
    Global reserve:\t\t   5.50MiB\t(used: 0.00B)
    Multiple profiles:\t\t        no

Data,RAID1: Size:102.38MiB, Used:20.00MiB (19.54%)
   /dev/loop0\t 102.38MiB
   /dev/loop1\t 102.38MiB

Metadata,RAID1: Size:102.38MiB, Used:160.00KiB (0.15%)
   /dev/loop0\t 102.38MiB
   /dev/loop1\t 102.38MiB

System,RAID1: Size:8.00MiB, Used:16.00KiB (0.20%)
   /dev/loop0\t   8.00MiB
   /dev/loop1\t   8.00MiB

Unallocated:
   /dev/loop0\t 811.25MiB
   /dev/loop1\t 811.25MiB
";
        assert_eq!(usage_text(&u, Units::HUMAN, false).unwrap(), want);
        let table = "              Data      Metadata  System                            
Id Path       RAID1     RAID1     RAID1    Unallocated Total   Slack
-- ---------- --------- --------- -------- ----------- ------- -----
 1 /dev/loop0 102.38MiB 102.38MiB  8.00MiB   811.25MiB 1.00GiB     -
 2 /dev/loop1 102.38MiB 102.38MiB  8.00MiB   811.25MiB 1.00GiB     -
-- ---------- --------- --------- -------- ----------- ------- -----
   Total      102.38MiB 102.38MiB  8.00MiB     1.58GiB 2.00GiB 0.00B
   Used        20.00MiB 160.00KiB 16.00KiB                          
";
        let t = usage_text(&u, Units::HUMAN, true).unwrap();
        assert!(t.ends_with(&format!("no\n\n{table}")), "{t}");
        let raw = usage_text(&u, Units::from_args(["-b"], true), false).unwrap();
        assert!(
            raw.contains("    Device size:\t\t        2147483648\n"),
            "{raw}"
        );
        assert!(
            raw.contains("    Data ratio:\t\t\t              2.00\n"),
            "{raw}"
        );
        assert!(raw.contains("   /dev/loop0\t 850657280\n"), "{raw}");
    }

    #[test]
    fn show_of_the_raid1_sample_is_progs() {
        let mut u = raid1_sample();
        let head = "Label: none  uuid: 11111111-1111-1111-1111-111111111111\n\
                    \tTotal devices 2 FS bytes used 20.17MiB\n";
        assert_eq!(
            show_text(&u, Units::HUMAN, false),
            format!(
                "{head}\tdevid    1 size 1.00GiB used 212.75MiB path /dev/loop0\n\
                 \tdevid    2 size 1.00GiB used 212.75MiB path /dev/loop1\n\n"
            )
        );
        u.devices[1].path = None;
        u.label = b"L".to_vec();
        let text = show_text(&u, Units::HUMAN, false);
        assert!(text.starts_with("Label: 'L'  uuid: "), "{text}");
        assert!(
            text.ends_with("path /dev/loop0\n\t*** Some devices missing\n\n"),
            "{text}"
        );
    }

    #[test]
    fn profiles_order_and_mix_as_progs_and_the_kernel() {
        let mut u = raid1_sample();
        u.chunks.push(FsChunk {
            logical: 1 << 30,
            length: 1 << 30,
            flags: bg::DATA,
            used: 0,
            stripes: vec![1],
        });
        let spaces = space_infos(&u);
        let names: Vec<String> = spaces
            .iter()
            .map(|s| format!("{},{}", type_str(s.flags), profile_str(s.flags)))
            .collect();
        assert_eq!(
            names,
            [
                "Data,single",
                "Data,RAID1",
                "System,RAID1",
                "Metadata,RAID1",
                "GlobalReserve,single"
            ]
        );
        assert_eq!(
            multiple_profiles_warning(&spaces),
            "WARNING: Multiple block group profiles detected, see 'man btrfs(5)'\n\
             WARNING:    Data: single, raid1\n"
        );
        assert_eq!(multiple_profiles_types(&spaces), "data");
    }
}

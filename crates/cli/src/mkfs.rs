//! `oleo mkfs`: create a new btrfs on one or several image files or block devices, with
//! mkfs.btrfs's defaults and profiles, and print the summary mkfs.btrfs prints.

use oleo::format::bytes::uuid_string;
use oleo::format::items::block_group as bg;
use oleo::format::CsumType;
use oleo::mkfs::{self, MkfsOptions, MkfsReport, Profile};
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct MkfsArgs {
    /// Size of each device (bytes, or with a K/M/G/T suffix). A missing file is created
    /// with it, a shorter one extended; default: each file's or device's size.
    #[arg(short = 'b', long = "size", value_name = "SIZE")]
    size: Option<String>,
    /// Checksum algorithm: crc32c, xxhash, sha256 or blake2.
    #[arg(long = "csum", alias = "checksum", default_value = "crc32c")]
    csum: String,
    /// Tree block size: a power of two from 4096 to 65536.
    #[arg(short = 'n', long, default_value = "16K")]
    nodesize: String,
    /// Sector size (only 4096 is supported).
    #[arg(short = 's', long, default_value = "4096")]
    sectorsize: String,
    /// Features, comma separated, `^name` to turn one off: no-holes, free-space-tree,
    /// skinny-metadata, extref, block-group-tree.
    #[arg(short = 'O', long = "features", value_name = "LIST")]
    features: Vec<String>,
    /// Metadata (and system) profile: single, dup, raid0, raid1, raid1c3, raid1c4, raid10,
    /// raid5 or raid6. Default: dup on one device, raid1 on several.
    #[arg(short = 'm', long = "metadata", value_name = "PROFILE")]
    metadata: Option<String>,
    /// Data profile, the same choice. Default: single.
    #[arg(short = 'd', long = "data", value_name = "PROFILE")]
    data: Option<String>,
    #[arg(short = 'L', long)]
    label: Option<String>,
    /// Filesystem UUID instead of a random one.
    #[arg(short = 'U', long)]
    uuid: Option<String>,
    /// Print nothing on success.
    #[arg(short = 'q', long)]
    quiet: bool,
    /// Overwrite a target that holds a filesystem or another signature. A mounted target,
    /// or one open in oleo, is refused even then.
    #[arg(short = 'f', long)]
    force: bool,
    /// Fill the new filesystem from this directory (files, directories, symlinks, hard
    /// links, devices, xattrs, holes). Without --size, a missing image is made big enough.
    /// One device only, as with mkfs.btrfs.
    #[arg(short = 'r', long, value_name = "DIR")]
    rootdir: Option<PathBuf>,
    /// Image files or block devices: device ids 1, 2, ... in this order.
    #[arg(required = true, num_args = 1..)]
    targets: Vec<PathBuf>,
}

/// Parses `123`, `64K`, `256M`, `1G`, `2T` (binary units).
fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                'P' => 50,
                _ => return Err(format!("bad size `{s}`")),
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    let n: u64 = num.parse().map_err(|_| format!("bad size `{s}`"))?;
    n.checked_mul(1u64 << shift)
        .ok_or_else(|| format!("size `{s}` is too large"))
}

fn parse_csum(s: &str) -> Result<CsumType, String> {
    CsumType::parse(s)
        .ok_or_else(|| format!("unknown checksum `{s}` (crc32c, xxhash, sha256, blake2)"))
}

fn parse_profile(s: &str, what: &str) -> Result<Profile, String> {
    Profile::parse(s).ok_or_else(|| {
        format!(
            "unknown {what} profile {s} (single, dup, raid0, raid1, raid1c3, raid1c4, raid10, \
             raid5, raid6)"
        )
    })
}

fn options(a: &MkfsArgs) -> Result<MkfsOptions, String> {
    let defaults = MkfsOptions::for_devices(a.targets.len());
    let mut o = MkfsOptions {
        size: a.size.as_deref().map(parse_size).transpose()?,
        csum: parse_csum(&a.csum)?,
        nodesize: u32::try_from(parse_size(&a.nodesize)?).map_err(|e| e.to_string())?,
        sectorsize: u32::try_from(parse_size(&a.sectorsize)?).map_err(|e| e.to_string())?,
        metadata_profile: match &a.metadata {
            Some(m) => parse_profile(m, "metadata")?,
            None => defaults.metadata_profile,
        },
        data_profile: match &a.data {
            Some(d) => parse_profile(d, "data")?,
            None => defaults.data_profile,
        },
        label: a.label.clone(),
        fsid: a
            .uuid
            .as_deref()
            .map(mkfs::parse_uuid)
            .transpose()
            .map_err(|e| e.to_string())?,
        // The root directory belongs to whoever makes the filesystem, as with mkfs.btrfs.
        // SAFETY: getuid/getgid cannot fail.
        root_owner: unsafe { (libc::getuid(), libc::getgid()) },
        force: a.force,
        ..defaults
    };
    for list in &a.features {
        o.features.apply_list(list).map_err(|e| e.to_string())?;
    }
    Ok(o)
}

/// A size as btrfs-progs prints it (`pretty_size`): binary units, two decimals.
fn pretty_size(bytes: u64) -> String {
    const UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut unit = 0;
    let mut value = bytes as f64;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.2}{}", UNITS[unit])
}

/// mkfs.btrfs's "SSD detected": the first device is a block device whose queue says it
/// does not rotate.
fn ssd(path: &Path) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let Ok(m) = std::fs::metadata(path) else {
        return false;
    };
    if !m.file_type().is_block_device() {
        return false;
    }
    let rdev = m.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let base = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    // A partition has no queue of its own: its disk's is one level up.
    [
        base.join("queue/rotational"),
        base.join("../queue/rotational"),
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok())
    .is_some_and(|v| v.trim() == "0")
}

/// What mkfs.btrfs 6.2 prints once it is done, line for line (without its version banner
/// and its note about the 5.15 defaults).
fn summary(r: &MkfsReport, ssd: bool) -> String {
    let mut o = String::new();
    let mut line = |k: &str, v: &str| {
        if k == "Devices:" {
            // The heading of the device table: nothing after it.
            o.push_str(&format!("{k}\n"));
        } else {
            o.push_str(&format!("{k:<20}{v}\n"));
        }
    };
    line(
        "Label:",
        if r.label.is_empty() {
            "(null)"
        } else {
            &r.label
        },
    );
    line("UUID:", &uuid_string(&r.fsid));
    line("Node size:", &r.nodesize.to_string());
    line("Sector size:", &r.sectorsize.to_string());
    line("Filesystem size:", &pretty_size(r.total_bytes));
    line("Block group profiles:", "");
    let total = |kind: u64| -> u64 {
        r.chunks
            .iter()
            .filter(|c| c.flags & bg::TYPE_MASK == kind)
            .map(|c| c.length)
            .sum()
    };
    for (name, kind, profile, always) in [
        ("Data", bg::DATA, r.data_profile, false),
        ("Metadata", bg::METADATA, r.metadata_profile, false),
        ("System", bg::SYSTEM, r.metadata_profile, true),
    ] {
        let bytes = total(kind);
        if bytes > 0 || always {
            line(
                &format!("  {name}:"),
                &format!("{:<8} {:>16}", profile.name(), pretty_size(bytes)),
            );
        }
    }
    line("SSD detected:", if ssd { "yes" } else { "no" });
    line("Zoned device:", "no");
    let (runtime, incompat): (Vec<&str>, Vec<&str>) = r
        .features
        .iter()
        .partition(|&&f| f == "free-space-tree" || f == "quota");
    line("Incompat features:", &incompat.join(", "));
    line("Runtime features:", &runtime.join(", "));
    line("Checksum:", r.csum.name());
    line("Number of devices:", &r.devices.len().to_string());
    line("Devices:", "");
    o.push_str("   ID        SIZE  PATH\n");
    for d in &r.devices {
        o.push_str(&format!(
            "  {:>3}  {:>10}  {}\n",
            d.devid,
            pretty_size(d.total_bytes),
            d.path.display()
        ));
    }
    o.push('\n');
    if r.csum == CsumType::Sha256 {
        o.push_str(
            "NOTE: you may need to manually load kernel module implementing accelerated \
             SHA256 in case\n      the generic implementation is built-in, before mount. \
             Check lsmod or /proc/crypto\n\n",
        );
    }
    o
}

pub fn run(args: &MkfsArgs) -> Result<(), String> {
    if args.rootdir.is_some() && args.targets.len() > 1 {
        // mkfs.btrfs's own limit; oleo also cannot open a multi-device filesystem for
        // writing yet, which the copy needs.
        return Err("the option -r is limited to a single device".into());
    }
    let mut opts = options(args)?;
    let target = &args.targets[0];
    let existed = target.exists();
    if let Some(src) = &args.rootdir {
        if opts.size.is_none() && !existed {
            opts.size = Some(crate::rootdir::size_for(src)?);
        }
    }
    let report = mkfs::mkfs_devices(&args.targets, &opts).map_err(|e| e.to_string())?;
    for w in &report.warnings {
        eprintln!("WARNING: {w}");
    }
    if let Some(src) = &args.rootdir {
        if let Err(e) = crate::rootdir::fill(target, src, args.quiet) {
            if !existed {
                // Half a copy is no image: leave nothing behind.
                let _ = std::fs::remove_file(target);
            }
            return Err(e);
        }
    }
    if !args.quiet {
        print!("{}", summary(&report, ssd(target)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_print_as_progs_prints_them() {
        assert_eq!(pretty_size(0), "0.00B");
        assert_eq!(pretty_size(1 << 30), "1.00GiB");
        assert_eq!(pretty_size(107347968), "102.38MiB");
        assert_eq!(pretty_size(8 << 20), "8.00MiB");
        assert_eq!(pretty_size(3 << 30), "3.00GiB");
    }
}

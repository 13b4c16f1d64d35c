//! `oleo mkfs`: create a new btrfs on an image file or block device, with mkfs.btrfs's
//! defaults, and print a summary like mkfs.btrfs does.

use oleo::format::bytes::uuid_string;
use oleo::format::CsumType;
use oleo::mkfs::{self, MkfsOptions, MkfsReport, Profile};
use std::path::PathBuf;

#[derive(clap::Args)]
pub struct MkfsArgs {
    /// Filesystem size (bytes, or with a K/M/G/T suffix). A missing file is created with
    /// it, a shorter one extended; default: the file's or device's size.
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
    /// Metadata profile: dup (default) or single.
    #[arg(short = 'm', long = "metadata", default_value = "dup")]
    metadata: String,
    /// Data profile: single (default) or dup.
    #[arg(short = 'd', long = "data", default_value = "single")]
    data: String,
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
    #[arg(short = 'r', long, value_name = "DIR")]
    rootdir: Option<PathBuf>,
    /// Image file or block device (one: multi-device filesystems are not supported).
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
    Ok(match s.to_ascii_lowercase().as_str() {
        "crc32c" => CsumType::Crc32c,
        "xxhash" | "xxhash64" => CsumType::Xxhash64,
        "sha256" => CsumType::Sha256,
        "blake2" | "blake2b" => CsumType::Blake2b,
        _ => {
            return Err(format!(
                "unknown checksum `{s}` (crc32c, xxhash, sha256, blake2)"
            ))
        }
    })
}

fn parse_profile(s: &str) -> Result<Profile, String> {
    match s.to_ascii_lowercase().as_str() {
        "single" => Ok(Profile::Single),
        "dup" => Ok(Profile::Dup),
        other => Err(format!(
            "profile `{other}` is not supported on one device (single, dup)"
        )),
    }
}

fn options(a: &MkfsArgs) -> Result<MkfsOptions, String> {
    let mut o = MkfsOptions {
        size: a.size.as_deref().map(parse_size).transpose()?,
        csum: parse_csum(&a.csum)?,
        nodesize: u32::try_from(parse_size(&a.nodesize)?).map_err(|e| e.to_string())?,
        sectorsize: u32::try_from(parse_size(&a.sectorsize)?).map_err(|e| e.to_string())?,
        metadata_profile: parse_profile(&a.metadata)?,
        data_profile: parse_profile(&a.data)?,
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
        ..MkfsOptions::default()
    };
    for list in &a.features {
        o.features.apply_list(list).map_err(|e| e.to_string())?;
    }
    Ok(o)
}

fn mib(bytes: u64) -> String {
    format!("{:.2}MiB", bytes as f64 / (1u64 << 20) as f64)
}

fn summary(r: &MkfsReport, target: &std::path::Path) -> String {
    let mut o = String::new();
    let mut line = |k: &str, v: String| o.push_str(&format!("{k:<20}{v}\n"));
    line(
        "Label:",
        if r.label.is_empty() {
            "(null)".into()
        } else {
            r.label.clone()
        },
    );
    line("UUID:", uuid_string(&r.fsid));
    line("Node size:", r.nodesize.to_string());
    line("Sector size:", r.sectorsize.to_string());
    line("Filesystem size:", mib(r.total_bytes));
    line("Block group profiles:", String::new());
    for c in &r.chunks {
        let desc = c.describe();
        let (kind, profile) = desc.split_once('|').unwrap_or((&desc, ""));
        let mut chars = kind.chars();
        let kind: String = chars
            .next()
            .into_iter()
            .chain(chars.flat_map(char::to_lowercase))
            .collect();
        line(
            &format!("  {kind}:"),
            format!(
                "{profile:<12} {:>10}  at logical {} (physical {})",
                mib(c.length),
                c.logical,
                c.stripes
                    .iter()
                    .map(u64::to_string)
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
    line("Features:", r.features.join(", "));
    line("Checksum:", r.csum.name().to_string());
    line("Number of devices:", "1".into());
    line(
        "Devices:",
        format!(
            "1  {}  {}  (bytes used {})",
            mib(r.total_bytes),
            target.display(),
            r.device_bytes_used
        ),
    );
    o
}

pub fn run(args: &MkfsArgs) -> Result<(), String> {
    let [target] = &args.targets[..] else {
        return Err(format!(
            "{} devices given: oleo mkfs makes single-device filesystems only",
            args.targets.len()
        ));
    };
    let mut opts = options(args)?;
    let existed = target.exists();
    if let Some(src) = &args.rootdir {
        if opts.size.is_none() && !existed {
            opts.size = Some(crate::rootdir::size_for(src)?);
        }
    }
    let report = mkfs::mkfs(target, &opts).map_err(|e| e.to_string())?;
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
        print!("{}", summary(&report, target));
    }
    Ok(())
}

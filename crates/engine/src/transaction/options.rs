//! Mount options: what [`OpenOptions`] asks of an open, and the `compress=` /
//! `compress-force=` values (the kernel parses them in super.c).

use oleo_format::compression::effective_level;
use oleo_format::items::Compression;

/// How to open a filesystem: the mount options oleo supports. `Default` is a read-only
/// open of the default subvolume with a 256 MiB cache, as a plain `mount -o ro` would.
#[derive(Clone, Debug)]
pub struct OpenOptions {
    /// False opens the device read-write, for transactions (see `Filesystem::open_rw`).
    pub read_only: bool,
    /// Open this subvolume (path from the top level), like btrfs's `subvol=`.
    pub subvol: Option<Vec<u8>>,
    /// Open this subvolume id, like btrfs's `subvolid=`.
    pub subvolid: Option<u64>,
    /// Upper bound for the tree-block cache, in bytes. The inode and decompressed-extent
    /// caches are sized from it too (an eighth each). Dirty tree blocks are committed
    /// before they exceed half of it.
    pub cache_bytes: u64,
    /// Files up to this size (and below one sector) are stored in the tree, like the
    /// kernel's max_inline mount option.
    pub max_inline: u64,
    /// Replay a pending log tree at open (the kernel's default): committed when writable,
    /// in memory only when read-only. False keeps the last committed state, like
    /// `rescue=nologreplay`.
    pub log_replay: bool,
    /// New regular files get NODATACOW and NODATASUM (mount option `nodatacow`).
    pub nodatacow: bool,
    /// New regular files get NODATASUM (mount option `nodatasum`).
    pub nodatasum: bool,
    /// New data is compressed (mount options `compress=`, `compress-force=`; see
    /// [`Compress::parse`]).
    pub compress: Option<Compress>,
    /// The filesystem's other devices (the kernel's `device=`), beside the path given to
    /// open: matched by fsid and devid, in any order.
    pub devices: Vec<std::path::PathBuf>,
    /// Open even with devices missing, when every chunk keeps a copy (`degraded`).
    pub degraded: bool,
    /// The kernel's `rescue=` options and `sb=N`; any of them needs `read_only`.
    pub rescue: crate::io::rescue::Rescue,
    /// Device writes go to a thread of their own, in order, and every read, flush and
    /// commit waits for them (`io::write_behind`): for one thread filling an image
    /// (`oleo cp`, `oleo tar -x`), whose data writes then run beside its tree work. A
    /// failed write fails the next commit. Ignored by a read-only open.
    pub write_behind: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            read_only: true,
            subvol: None,
            subvolid: None,
            cache_bytes: 256 << 20,
            max_inline: 2048,
            log_replay: true,
            nodatacow: false,
            nodatasum: false,
            compress: None,
            devices: Vec::new(),
            degraded: false,
            rescue: Default::default(),
            write_behind: false,
        }
    }
}

/// The mount options `compress=` and `compress-force=`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Compress {
    /// The algorithm: zlib, lzo or zstd.
    pub kind: Compression,
    /// As given; 0 is the algorithm's default (see `effective_level`).
    pub level: i32,
    /// compress-force: no heuristic, and incompressible data never marks the file.
    pub force: bool,
}

impl Compress {
    /// Parses the value of `compress` (`force` false) or `compress-force` as the kernel
    /// does: none means zlib, `no`/`none` turn compression off (None), a level after `:`
    /// is clamped to the algorithm's range, LZO ignores one.
    pub fn parse(value: Option<&str>, force: bool) -> std::result::Result<Option<Self>, String> {
        let Some(v) = value else {
            return Ok(Some(Compress {
                kind: Compression::Zlib,
                level: 0,
                force,
            }));
        };
        if v == "no" || v == "none" {
            return Ok(None);
        }
        let bad = || {
            format!("unrecognized compression value '{v}' (zlib[:1-9], lzo, zstd[:-15..15], no)")
        };
        let (name, level) = match v.split_once(':') {
            Some((n, l)) => (n, Some(l.parse::<i32>().map_err(|_| bad())?)),
            None => (v, None),
        };
        let kind = match name {
            "zlib" => Compression::Zlib,
            "lzo" => Compression::Lzo,
            "zstd" => Compression::Zstd,
            _ => return Err(bad()),
        };
        let level = effective_level(kind, level.unwrap_or(0));
        Ok(Some(Compress { kind, level, force }))
    }

    /// How /proc/mounts would show it.
    pub fn option_string(&self) -> String {
        let name = if self.force {
            "compress-force"
        } else {
            "compress"
        };
        match self.kind {
            Compression::Lzo => format!("{name}=lzo"),
            k => format!("{name}={}:{}", type_name(k), effective_level(k, self.level)),
        }
    }
}

/// The property's name for an algorithm.
pub fn type_name(kind: Compression) -> &'static str {
    match kind {
        Compression::None => "",
        Compression::Zlib => "zlib",
        Compression::Lzo => "lzo",
        Compression::Zstd => "zstd",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_values_as_the_kernel_parses_them() {
        let p = |v: Option<&str>| Compress::parse(v, false);
        assert_eq!(p(None).unwrap().unwrap().kind, Compression::Zlib);
        assert_eq!(p(Some("zstd:20")).unwrap().unwrap().level, 15);
        assert_eq!(p(Some("zstd:-20")).unwrap().unwrap().level, -15);
        assert_eq!(p(Some("zlib:0")).unwrap().unwrap().level, 3);
        assert_eq!(p(Some("lzo:3")).unwrap().unwrap().level, 0);
        assert_eq!(p(Some("no")).unwrap(), None);
        for bad in ["foo", "zlib:x", "zstd:", "ZSTD", "zstdx"] {
            assert!(p(Some(bad)).is_err(), "{bad}");
        }
        assert_eq!(
            Compress::parse(None, true)
                .unwrap()
                .unwrap()
                .option_string(),
            "compress-force=zlib:3"
        );
    }
}

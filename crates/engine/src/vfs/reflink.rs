//! Sharing data without copying it: a reflink that may cross subvolumes (what a received
//! CLONE needs; the kernel's reflink.c), and the checks before an encoded write
//! (data/encoded.rs). Both say `Error::Unsupported` when only a copy could do it, before
//! changing anything, so the caller can copy instead, as btrfs receive falls back.

use crate::data::encoded::{Encoded, MAX_COMPRESSED};
use crate::error::{Error, Result};
use crate::transaction::fs::{FileKind, FsCore, InodeId};
use crate::transaction::space::reservation::Reserve;
use oleo_format::items::{Compression, INODE_FLAG_NODATASUM};

fn unsupported(why: &str) -> Error {
    Error::Unsupported(why.into())
}

impl FsCore {
    /// Makes `[dst_off, dst_off + len)` of `dst` share the extents of `src` from
    /// `src_off`, within one subvolume or across two. The offsets must be sector-aligned,
    /// and `len` too unless the range ends at the source's EOF and at or past the
    /// destination's (as the kernel's clone checks).
    pub(crate) fn reflink(
        &mut self,
        src: InodeId,
        src_off: u64,
        dst: InodeId,
        dst_off: u64,
        len: u64,
    ) -> Result<()> {
        self.check_subvol_writable(dst.subvol)?;
        self.check_not_immutable(dst)?;
        let sa = self.getattr(src)?;
        let da = self.getattr(dst)?;
        if sa.kind != FileKind::File || da.kind != FileKind::File {
            return Err(Error::InvalidArgument("not a regular file".into()));
        }
        let src_end = src_off.checked_add(len).filter(|&e| e <= sa.size);
        let dst_end = dst_off.checked_add(len).ok_or(Error::FileTooBig)?;
        let Some(src_end) = src_end else {
            return Err(Error::InvalidArgument(format!(
                "{len} bytes at {src_off} run past the source's end ({})",
                sa.size
            )));
        };
        if len == 0 {
            return Ok(());
        }
        if src == dst && src_off < dst_end && dst_off < src_end {
            return Err(unsupported("overlapping ranges of one file"));
        }
        let sector = u64::from(self.sb.sectorsize);
        let tail_ok = src_end == sa.size && dst_end >= da.size;
        if !src_off.is_multiple_of(sector)
            || !dst_off.is_multiple_of(sector)
            || !(len.is_multiple_of(sector) || tail_ok)
        {
            return Err(unsupported("the range is not whole sectors"));
        }
        // A checksummed file must not take extents without sums, nor the other way.
        if (sa.flags ^ da.flags) & INODE_FLAG_NODATASUM != 0 {
            return Err(unsupported("one file has checksums and the other not"));
        }
        if self.file_extents(src)?.iter().any(|x| x.inline) {
            return Err(unsupported("the source's data is inline"));
        }
        let clone_len = len.next_multiple_of(sector);
        let size = dst_end.max(da.size);
        let extents = clone_len / (1 << 20) + 2;
        self.write_op(
            Reserve::items(10).bulk(extents * 200).data(2 * sector),
            |t| {
                t.clone_range(src, src_off, dst, dst_off, clone_len, false)?;
                // Whole sectors were shared: the size ends where the data does.
                let mut i = t.read_inode(dst)?;
                i.size = size;
                t.write_inode(dst, &mut i)
            },
        )
    }

    /// Stores `e` in regular file `id` as one compressed extent. Unsupported where the
    /// kernel's encoded write refuses too (an unaligned range inside the file, a
    /// NODATASUM file, data that does not shrink) or where the data belongs inline.
    pub(crate) fn write_encoded(&mut self, id: InodeId, e: &Encoded<'_>) -> Result<()> {
        self.check_subvol_writable(id.subvol)?;
        self.check_may_modify(id)?;
        let a = self.getattr(id)?;
        if a.kind != FileKind::File {
            return Err(Error::InvalidArgument("not a regular file".into()));
        }
        let sector = u64::from(self.sb.sectorsize);
        let end = e.offset.checked_add(e.len).ok_or(Error::FileTooBig)?;
        let data_len = e.data.len() as u64;
        if e.compression == Compression::None {
            return Err(unsupported("the data is not compressed"));
        }
        if e.len == 0
            || data_len == 0
            || data_len > MAX_COMPRESSED
            || e.unencoded_len > MAX_COMPRESSED
            || data_len >= e.unencoded_len
            || e.unencoded_offset
                .checked_add(e.len)
                .is_none_or(|x| x > e.unencoded_len)
        {
            return Err(Error::InvalidArgument(format!(
                "an encoded extent of {data_len} bytes holding {} of {} bytes at {}",
                e.len, e.unencoded_len, e.unencoded_offset
            )));
        }
        if !e.offset.is_multiple_of(sector)
            || !e.unencoded_offset.is_multiple_of(sector)
            || (end < a.size && !end.is_multiple_of(sector))
        {
            return Err(unsupported("the range is not whole sectors"));
        }
        if a.flags & INODE_FLAG_NODATASUM != 0 {
            return Err(unsupported("the file has no checksums"));
        }
        // A small whole file is stored inline: the caller's plain write makes it so.
        if e.offset == 0 && end >= a.size && e.len < sector {
            return Err(unsupported("the data belongs inline"));
        }
        let disk_len = data_len.next_multiple_of(sector);
        self.write_op(
            Reserve::items(10).bulk(400).data(disk_len + 2 * sector),
            |t| t.write_encoded(id, e, disk_len),
        )
    }
}

#[cfg(test)]
mod tests {
    use crate::{Error, Filesystem, InodeId, NewInode, OpenOptions};
    use oleo_format::items::Compression;

    fn pattern(seed: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    /// A fresh image in its own directory, opened writable.
    fn fresh(name: &str) -> (std::path::PathBuf, Filesystem) {
        let dir = std::env::temp_dir().join(format!("oleo-reflink-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let img = dir.join("r.img");
        let opts = crate::mkfs::MkfsOptions {
            size: Some(256 << 20),
            ..Default::default()
        };
        crate::mkfs::mkfs(&img, &opts).unwrap();
        let rw = OpenOptions {
            read_only: false,
            ..Default::default()
        };
        let fs = Filesystem::open_rw(&img, rw).unwrap();
        (img, fs)
    }

    /// `btrfs check --check-data-csum` of the closed image, a failure if not clean.
    fn check(img: &std::path::Path, what: &str) {
        if oleo_testkit::env::find_in_path("btrfs").is_none() {
            oleo_testkit::env::skip(what, "needs `btrfs` (btrfs-progs) to check the image");
            return;
        }
        if let Err(text) = oleo_testkit::btrfs_check(img, true) {
            panic!("{what}: btrfs check:\n{text}");
        }
    }

    fn file_in(fs: &Filesystem, subvol: u64, name: &[u8]) -> InodeId {
        let root = InodeId { subvol, ino: 256 };
        fs.mknod(root, name, &NewInode::file(0o644)).unwrap().id
    }

    fn disk_extents(fs: &Filesystem, id: InodeId) -> Vec<(u64, u64, u64)> {
        let x = fs.file_extents(id).unwrap();
        x.iter()
            .map(|x| (x.file_offset, x.disk_bytenr, x.extent_offset))
            .collect()
    }

    /// A clone from one subvolume into another shares the disk extent: both files read
    /// the data, the extent's backrefs name both, and once the source is gone the copy
    /// still holds it, with btrfs check clean at each step.
    #[test]
    fn a_reflink_across_subvolumes_shares_the_extent() {
        let what = "a_reflink_across_subvolumes_shares_the_extent";
        let (img, fs) = fresh("across");
        let top = fs.root();
        let s1 = fs.create_subvolume(top, b"s1", 0, 0).unwrap();
        let s2 = fs.create_subvolume(top, b"s2", 0, 0).unwrap();
        let len = (1 << 20) + 1000;
        let data = pattern(3, len);
        let a = file_in(&fs, s1, b"a");
        fs.write(a, 0, &data).unwrap();
        fs.sync().unwrap();
        let b = file_in(&fs, s2, b"b");
        fs.reflink(a, 0, b, 0, len as u64).unwrap();
        let c = file_in(&fs, s2, b"c");
        fs.reflink(a, 65536, c, 8192, 131072).unwrap();
        assert_eq!(fs.read(b, 0, len as u32 + 10).unwrap(), data);
        let got_c = fs.read(c, 0, 1 << 20).unwrap();
        assert_eq!(got_c.len(), 8192 + 131072);
        assert!(got_c[..8192].iter().all(|&x| x == 0));
        assert_eq!(got_c[8192..], data[65536..65536 + 131072]);
        assert_eq!(fs.getattr(b).unwrap().size, len as u64);
        let xa = fs.file_extents(a).unwrap();
        let (xb, xc) = (disk_extents(&fs, b), disk_extents(&fs, c));
        assert_eq!(xb[0].1, xa[0].disk_bytenr, "b does not share a's extent");
        assert_eq!(
            (xc[0].0, xc[0].1, xc[0].2),
            (8192, xa[0].disk_bytenr, 65536)
        );
        fs.sync().unwrap();
        let users = fs
            .extent_users(
                xa[0].disk_bytenr,
                xa[0].disk_num_bytes,
                xa[0].ram_bytes,
                &[s1, s2],
            )
            .unwrap()
            .expect("the extent's refs");
        let mut who: Vec<(u64, u64, u64)> = users
            .iter()
            .map(|u| (u.root, u.ino, u.file_offset))
            .collect();
        who.sort_unstable();
        assert_eq!(who, vec![(s1, a.ino, 0), (s2, b.ino, 0), (s2, c.ino, 8192)]);
        drop(fs);
        check(&img, what);

        // The source goes; the clones keep the extent.
        let fs = Filesystem::open_rw(
            &img,
            OpenOptions {
                read_only: false,
                ..Default::default()
            },
        )
        .unwrap();
        fs.unlink(
            InodeId {
                subvol: s1,
                ino: 256,
            },
            b"a",
        )
        .unwrap();
        fs.sync().unwrap();
        assert_eq!(fs.read(b, 0, len as u32).unwrap(), data);
        drop(fs);
        check(&img, what);
        std::fs::remove_dir_all(img.parent().unwrap()).unwrap();
    }

    /// A snapshot holds its source's extents through shared leaves, with no ref of its
    /// own until a leaf is copied (then the refs may become the leaves' shared refs): its
    /// files are found as users before and after.
    #[test]
    fn extent_users_finds_a_snapshots_files() {
        let what = "extent_users_finds_a_snapshots_files";
        let (img, fs) = fresh("users");
        let top = fs.root();
        let s1 = fs.create_subvolume(top, b"s1", 0, 0).unwrap();
        let a = file_in(&fs, s1, b"a");
        fs.write(a, 0, &pattern(5, 300_000)).unwrap();
        for i in 0..40u8 {
            let f = file_in(&fs, s1, &[b'f', b'0' + i / 10, b'0' + i % 10]);
            fs.write(f, 0, &pattern(i, 8192)).unwrap();
        }
        fs.sync().unwrap();
        let snap = fs.snapshot(s1, top, b"snap", true).unwrap();
        let x = fs.file_extents(a).unwrap()[0].clone();
        let users = |fs: &Filesystem| {
            let u = fs
                .extent_users(x.disk_bytenr, x.disk_num_bytes, x.ram_bytes, &[s1, snap])
                .unwrap()
                .expect("refs");
            let mut w: Vec<(u64, u64)> = u.iter().map(|u| (u.root, u.ino)).collect();
            w.sort_unstable();
            w
        };
        assert_eq!(users(&fs), vec![(s1, a.ino), (snap, a.ino)]);
        // Writes to s1 copy its leaves away from the snapshot's.
        let b = file_in(&fs, s1, b"b");
        fs.reflink(a, 0, b, 0, 300_000).unwrap();
        fs.write(a, 0, &pattern(6, 4096)).unwrap();
        fs.sync().unwrap();
        assert_eq!(users(&fs), vec![(s1, a.ino), (s1, b.ino), (snap, a.ino)]);
        drop(fs);
        check(&img, what);
        std::fs::remove_dir_all(img.parent().unwrap()).unwrap();
    }

    /// What only a copy could do is refused before anything changes.
    #[test]
    fn unaligned_and_inline_reflinks_are_refused_untouched() {
        let what = "unaligned_and_inline_reflinks_are_refused_untouched";
        let (img, fs) = fresh("refused");
        let top = fs.root();
        let s1 = fs.create_subvolume(top, b"s1", 0, 0).unwrap();
        let a = file_in(&fs, s1, b"a");
        fs.write(a, 0, &pattern(1, 100_000)).unwrap();
        let small = file_in(&fs, s1, b"small");
        fs.write(small, 0, b"inline data").unwrap();
        let b = file_in(&fs, top.subvol, b"b");
        fs.write(b, 0, &pattern(2, 50_000)).unwrap();
        let before = fs.read(b, 0, 1 << 20).unwrap();
        for (src, off, dst_off, len) in [(a, 100, 0, 4096), (a, 0, 4096, 5000), (small, 0, 0, 11)] {
            let r = fs.reflink(src, off, b, dst_off, len);
            assert!(
                matches!(r, Err(Error::Unsupported(_))),
                "{off} {dst_off} {len}: {r:?}"
            );
        }
        assert_eq!(fs.read(b, 0, 1 << 20).unwrap(), before);
        drop(fs);
        check(&img, what);
        std::fs::remove_dir_all(img.parent().unwrap()).unwrap();
    }

    /// An encoded write stores the compressed bytes as they came: the file reads the
    /// decoded data, its extent is compressed, its raw bytes are the ones given.
    #[test]
    fn an_encoded_write_stores_the_compressed_extent() {
        let what = "an_encoded_write_stores_the_compressed_extent";
        let (img, fs) = fresh("encoded");
        let root = fs.root();
        let f = file_in(&fs, root.subvol, b"f");
        let plain: Vec<u8> = b"a compressible line\n".repeat(6554)[..131072].to_vec();
        for (i, kind) in [Compression::Zstd, Compression::Zlib, Compression::Lzo]
            .into_iter()
            .enumerate()
        {
            let z = oleo_format::compression::compress(kind, 0, &plain, 4096).unwrap();
            let at = i as u64 * 131072;
            // The second half of the extent only, as a cloned-then-cut extent is sent.
            fs.write_encoded(f, at, 65536, 131072, 65536, kind, &z)
                .unwrap();
            let x = fs.file_extents(f).unwrap();
            let x = x.iter().find(|x| x.file_offset == at).unwrap();
            assert_eq!(
                (x.compression, x.extent_offset, x.len),
                (kind, 65536, 65536)
            );
            let mut raw = z.clone();
            raw.resize(z.len().next_multiple_of(4096), 0);
            assert_eq!(
                fs.read_extent_raw(f, x.disk_bytenr, x.disk_num_bytes)
                    .unwrap(),
                raw
            );
            assert_eq!(fs.read(f, at, 65536).unwrap(), plain[65536..]);
        }
        // Unaligned inside the file, or not smaller than the data: refused untouched.
        let z = oleo_format::compression::compress(Compression::Zstd, 0, &plain, 4096).unwrap();
        let r = fs.write_encoded(f, 4096, 1000, 131072, 0, Compression::Zstd, &z);
        assert!(matches!(r, Err(Error::Unsupported(_))), "{r:?}");
        let r = fs.write_encoded(f, 0, 4096, 4096, 0, Compression::Zstd, &[0; 5000]);
        assert!(matches!(r, Err(Error::InvalidArgument(_))), "{r:?}");
        assert_eq!(fs.getattr(f).unwrap().size, 2 * 131072 + 65536);
        drop(fs);
        check(&img, what);
        std::fs::remove_dir_all(img.parent().unwrap()).unwrap();
    }
}

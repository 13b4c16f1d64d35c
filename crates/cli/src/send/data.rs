//! A file's data in the stream: CLONEs of extents the receiver already has, ENCODED_WRITEs
//! of compressed extents (`--compressed-data`), WRITEs of the rest, zeros or FALLOCATE for
//! preallocated ranges, TRUNCATE for a trailing hole.
//!
//! An extent is cloned, as the kernel's find_extent_clone does, when the extent tree's
//! backrefs name another range of it that the receiver has: in a file of this stream whose
//! data is all sent, earlier in the same file, or in a clone source (`-c`). Only whole
//! sectors are cloned (or a tail ending at both files' ends); inline data never is.

use super::{show, snapshot, Sender, Snap, StreamOptions, BIG_READ};
use oleo::format::items::Compression;
use oleo::format::send_stream::Command;
use oleo::{ExtentInfo, Filesystem, InodeId};
use std::collections::HashMap;
use std::io::Write;

/// A subvolume whose extents the stream may clone, as a CLONE names it.
struct CloneRoot {
    subvol: u64,
    uuid: [u8; 16],
    ctransid: u64,
}

/// What lets the stream share data instead of sending it.
pub(super) struct Sharing {
    /// The snapshot being sent, then the clone sources.
    roots: Vec<CloneRoot>,
    /// Files of this stream whose data the receiver has whole: the path they were sent
    /// at (paths of a full stream never change once made).
    sent: HashMap<u64, Vec<u8>>,
    /// `--compressed-data`.
    compressed: bool,
}

/// Where a clone comes from and how much of it.
struct Source {
    root: usize,
    ino: u64,
    offset: u64,
    len: u64,
}

/// The clone sources (`-c`): read-only subvolumes, each named in the error otherwise.
fn clone_roots(fs: &Filesystem, paths: &[String]) -> Result<Vec<CloneRoot>, String> {
    paths
        .iter()
        .map(|p| match snapshot(fs, p) {
            Ok(s) => Ok(CloneRoot {
                subvol: s.subvol,
                uuid: s.uuid,
                ctransid: s.ctransid,
            }),
            Err(e) => Err(format!("clone source: {e}")),
        })
        .collect()
}

/// Refuses clone sources that are not read-only subvolumes.
pub(super) fn check_clone_sources(fs: &Filesystem, paths: &[String]) -> Result<(), String> {
    clone_roots(fs, paths).map(|_| ())
}

impl Sharing {
    /// For a stream with options `o`, from `parent` if it is incremental: the clone
    /// sources, then the parent (whose files the receiver has as they are), are cloned
    /// from; `start` names each snapshot sent.
    pub(super) fn new(
        fs: &Filesystem,
        o: &StreamOptions,
        parent: Option<&Snap>,
    ) -> Result<Sharing, String> {
        let mut roots = vec![CloneRoot {
            subvol: 0,
            uuid: [0; 16],
            ctransid: 0,
        }];
        roots.extend(clone_roots(fs, &o.clone_sources)?);
        if let Some(p) = parent {
            roots.push(CloneRoot {
                subvol: p.subvol,
                uuid: p.uuid,
                ctransid: p.ctransid,
            });
        }
        Ok(Sharing {
            roots,
            sent: HashMap::new(),
            compressed: o.compressed,
        })
    }

    /// The snapshot whose commands follow: its files sent so far are clone sources (an
    /// incremental stream sends data only once every rename is done, so the paths they
    /// were sent at stay right until its END).
    pub(super) fn start(&mut self, snap: &Snap) {
        self.roots[0] = CloneRoot {
            subvol: snap.subvol,
            uuid: snap.uuid,
            ctransid: snap.ctransid,
        };
        self.sent.clear();
    }
}

/// BTRFS_ENCODED_IO_COMPRESSION_* of an extent (LZO is numbered by its sector size).
fn encoded_compression(c: Compression, sector: u64) -> Option<u32> {
    match c {
        Compression::Zlib => Some(1),
        Compression::Zstd => Some(2),
        Compression::Lzo if (4096..=65536).contains(&sector) => {
            Some(3 + sector.trailing_zeros() - 12)
        }
        _ => None,
    }
}

impl<W: Write> Sender<'_, W> {
    /// The file's data: WRITEs of what its extents hold, zeros or FALLOCATE for
    /// preallocated ranges, nothing for holes; a TRUNCATE when the last range sent does
    /// not end at the size. The file may then be a clone source.
    pub(super) fn data(&mut self, id: InodeId, path: &[u8], size: u64) -> Result<(), String> {
        let end_sent = self.data_range(id, path, 0, size, size)?;
        if end_sent != size {
            self.cmd(&Command::Truncate {
                path: path.to_vec(),
                size,
            })?;
        }
        self.sharing.sent.insert(id.ino, path.to_vec());
        Ok(())
    }

    /// The data of `[from, to)` of a file of `size` bytes, as `data` sends it, without the
    /// TRUNCATE: holes in it are skipped (the receiver must already have them as holes or
    /// zeros). Returns the end of the last range sent (`from` if none).
    pub(super) fn data_range(
        &mut self,
        id: InodeId,
        path: &[u8],
        from: u64,
        to: u64,
        size: u64,
    ) -> Result<u64, String> {
        let err = |e: oleo::Error| format!("{}: {e}", show(path));
        let extents = self.fs.file_extents(id).map_err(err)?;
        let to = to.min(size);
        let mut end_sent = from;
        for x in extents {
            let start = x.file_offset.max(end_sent);
            let end = x.file_offset.saturating_add(x.len).min(to);
            if start >= end {
                continue;
            }
            if x.prealloc {
                self.prealloc(path, start, end)?;
            } else if x.inline || x.disk_bytenr == 0 {
                self.write(id, path, start, end, size)?;
            } else {
                self.extent(id, path, &x, start, end, size)?;
            }
            end_sent = end;
        }
        Ok(end_sent)
    }

    fn prealloc(&mut self, path: &[u8], start: u64, end: u64) -> Result<(), String> {
        self.zeros(path, start, end, 0)
    }

    /// Makes `[start, end)` read zeros: FALLOCATE with `mode` in protocol 2, WRITEs of
    /// zeros in 1 (which has no FALLOCATE).
    pub(super) fn zeros(
        &mut self,
        path: &[u8],
        start: u64,
        end: u64,
        mode: u32,
    ) -> Result<(), String> {
        if self.w.version() >= 2 {
            return self.cmd(&Command::Fallocate {
                path: path.to_vec(),
                mode,
                offset: start,
                len: end - start,
            });
        }
        let zeros = vec![0u8; self.read_size];
        let mut off = start;
        while off < end {
            let n = (end - off).min(self.read_size as u64) as usize;
            self.cmd(&Command::Write {
                path: path.to_vec(),
                offset: off,
                data: zeros[..n].to_vec(),
            })?;
            off += n as u64;
        }
        Ok(())
    }

    /// WRITEs of the file's bytes `[start, end)`.
    fn write(
        &mut self,
        id: InodeId,
        path: &[u8],
        start: u64,
        end: u64,
        size: u64,
    ) -> Result<(), String> {
        let err = |e: oleo::Error| format!("{}: {e}", show(path));
        let mut off = start;
        while off < end {
            let want = (end - off).min(BIG_READ) as u32;
            let buf = self.fs.read(id, off, want).map_err(err)?;
            if buf.is_empty() {
                return Err(format!(
                    "{}: no data at offset {off} of a {size}-byte file",
                    show(path)
                ));
            }
            for (i, chunk) in buf.chunks(self.read_size).enumerate() {
                self.cmd(&Command::Write {
                    path: path.to_vec(),
                    offset: off + (i * self.read_size) as u64,
                    data: chunk.to_vec(),
                })?;
            }
            off += buf.len() as u64;
        }
        Ok(())
    }

    /// `[start, end)` of the file, all in disk extent `x`: cloned where the receiver has
    /// the extent, the rest sent.
    fn extent(
        &mut self,
        id: InodeId,
        path: &[u8],
        x: &ExtentInfo,
        start: u64,
        end: u64,
        size: u64,
    ) -> Result<(), String> {
        let err = |e: oleo::Error| format!("{}: {e}", show(path));
        let roots: Vec<u64> = self.sharing.roots.iter().map(|r| r.subvol).collect();
        // Ranges the receiver has: in a clone source, in a file of this stream already
        // sent, or in this file (earlier ranges only, checked below).
        let users: Vec<_> = self
            .fs
            .extent_users(x.disk_bytenr, x.disk_num_bytes, x.ram_bytes, &roots)
            .map_err(err)?
            .unwrap_or_default()
            .into_iter()
            .filter(|u| {
                u.root != roots[0] || u.ino == id.ino || self.sharing.sent.contains_key(&u.ino)
            })
            .collect();
        let sector = u64::from(self.fs.superblock().sectorsize);
        let flags = self.fs.getattr(id).map_err(err)?.flags;
        // Where in the file each byte of the extent is.
        // Image values: saturating, so a hostile item cannot overflow them.
        let at = |eo: u64| x.file_offset.saturating_add(eo - x.extent_offset);
        let mut pos = start;
        while pos < end {
            let eo = x.extent_offset.saturating_add(pos - x.file_offset);
            let mut found = None;
            for u in &users {
                if u.extent_offset > eo || u.extent_offset.saturating_add(u.len) <= eo {
                    continue;
                }
                let Some(root) = roots.iter().position(|&r| r == u.root) else {
                    continue;
                };
                let offset = u.file_offset.saturating_add(eo - u.extent_offset);
                let mut len = (u.extent_offset.saturating_add(u.len) - eo).min(end - pos);
                if root == 0 && u.ino == id.ino {
                    // Earlier in this file, never overlapping where it goes.
                    if offset.saturating_add(len) > pos {
                        len = pos.saturating_sub(offset);
                    }
                }
                let src = InodeId {
                    subvol: u.root,
                    ino: u.ino,
                };
                let Ok(sa) = self.fs.getattr(src) else {
                    continue;
                };
                if (sa.flags ^ flags) & oleo::format::items::INODE_FLAG_NODATASUM != 0 {
                    continue;
                }
                len = len.min(sa.size.saturating_sub(offset));
                // Whole sectors, or a tail that ends both files.
                let tail = pos + len == size && offset + len == sa.size;
                if !tail {
                    len -= len % sector;
                }
                if len > 0 {
                    found = Some(Source {
                        root,
                        ino: u.ino,
                        offset,
                        len,
                    });
                    break;
                }
            }
            if let Some(s) = found {
                self.clone_cmd(path, pos, &s)?;
                pos += s.len;
                continue;
            }
            // Sent up to where another range of the extent could be cloned from.
            let next = users
                .iter()
                .filter(|u| u.extent_offset > eo)
                .map(|u| at(u.extent_offset))
                .filter(|&p| p > pos)
                .min()
                .unwrap_or(end)
                .min(end);
            self.send_part(id, path, x, pos, next, size, sector)?;
            pos = next;
        }
        Ok(())
    }

    fn clone_cmd(&mut self, path: &[u8], offset: u64, s: &Source) -> Result<(), String> {
        let r = &self.sharing.roots[s.root];
        let clone_path = if s.root == 0 {
            match self.sharing.sent.get(&s.ino) {
                Some(p) => p.clone(),
                None => path.to_vec(),
            }
        } else {
            let src = InodeId {
                subvol: r.subvol,
                ino: s.ino,
            };
            self.fs
                .inode_path(src)
                .map_err(|e| format!("{}: clone source inode {}: {e}", show(path), s.ino))?
        };
        let c = Command::Clone {
            path: path.to_vec(),
            offset,
            len: s.len,
            clone_uuid: r.uuid,
            clone_ctransid: r.ctransid,
            clone_path,
            clone_offset: s.offset,
        };
        self.cmd(&c)
    }

    /// `[start, end)` of extent `x` as data: an ENCODED_WRITE of the extent as it is on
    /// disk with `--compressed-data` when it is compressed and the range is whole sectors
    /// (or ends the file), WRITEs otherwise.
    #[allow(clippy::too_many_arguments)]
    fn send_part(
        &mut self,
        id: InodeId,
        path: &[u8],
        x: &ExtentInfo,
        start: u64,
        end: u64,
        size: u64,
        sector: u64,
    ) -> Result<(), String> {
        let compression = encoded_compression(x.compression, sector);
        let whole = start.is_multiple_of(sector) && (end.is_multiple_of(sector) || end == size);
        let (Some(compression), true, true) = (compression, self.sharing.compressed, whole) else {
            return self.write(id, path, start, end, size);
        };
        let data = self
            .fs
            .read_extent_raw(id, x.disk_bytenr, x.disk_num_bytes)
            .map_err(|e| format!("{}: {e}", show(path)))?;
        self.cmd(&Command::EncodedWrite {
            path: path.to_vec(),
            offset: start,
            unencoded_file_len: end - start,
            unencoded_len: x.ram_bytes,
            unencoded_offset: x.extent_offset.saturating_add(start - x.file_offset),
            compression: Some(compression),
            encryption: Some(0),
            data,
        })
    }
}

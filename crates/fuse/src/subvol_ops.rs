//! Serving `subvol_ioctl`'s commands: subvolumes made, snapshotted, listed and flagged on
//! the mounted filesystem, then the kernel told that the parent directory changed; a file's
//! extents; the devices and chunks `oleo filesystem` reports.

use crate::subvol_ioctl as cmd;
use crate::transport::{Errno, Request};
use crate::{errno, OleoFuse};

impl OleoFuse {
    /// True for the commands of `subvol_ioctl`.
    pub(crate) fn is_subvol_ioctl(c: u32) -> bool {
        [
            cmd::SUBVOL_OF,
            cmd::CREATE,
            cmd::SNAPSHOT,
            cmd::SET_FLAGS,
            cmd::NEXT_SUBVOL,
            cmd::DELETE,
            cmd::SET_DEFAULT,
            cmd::GET_DEFAULT,
            cmd::EXTENTS,
            cmd::FS_USAGE,
        ]
        .contains(&c)
    }

    /// Runs command `c` on `node` with the input `data`; the output bytes.
    pub(crate) fn subvol_ioctl(
        &self,
        req: &Request,
        node: u64,
        c: u32,
        data: &[u8],
    ) -> Result<Vec<u8>, Errno> {
        let id = self.id(node)?;
        match c {
            cmd::SUBVOL_OF => {
                let ro = self.fs.subvolume_readonly(id.subvol).map_err(errno)?;
                Ok(cmd::SubvolOf {
                    id: id.subvol,
                    ino: id.ino,
                    flags: if ro { cmd::RO } else { 0 },
                }
                .to_bytes())
            }
            cmd::CREATE => {
                let name = cmd::parse_create_arg(data);
                self.mutate(|fs| fs.create_subvolume(id, name, req.uid, req.gid))?;
                self.entry_changed(node, name);
                Ok(Vec::new())
            }
            cmd::SNAPSHOT => {
                let a = cmd::SnapshotArgs::parse(data);
                self.mutate(|fs| fs.snapshot(a.source, id, &a.name, a.flags & cmd::RO != 0))?;
                self.entry_changed(node, &a.name);
                Ok(Vec::new())
            }
            cmd::DELETE => {
                let name = cmd::parse_create_arg(data);
                self.mutate(|fs| fs.delete_subvolume(id, name))?;
                self.entry_changed(node, name);
                // The cleaner drops its tree soon (after the deletion is committed).
                crate::request_commit();
                Ok(Vec::new())
            }
            cmd::SET_DEFAULT => {
                let target = cmd::u64_arg(data);
                self.mutate(|fs| fs.set_default_subvolume(target))?;
                Ok(Vec::new())
            }
            cmd::GET_DEFAULT => Ok(self
                .fs
                .default_subvolume()
                .map_err(errno)?
                .to_le_bytes()
                .to_vec()),
            cmd::SET_FLAGS => {
                if id.ino != oleo::format::key::objectid::FIRST_FREE {
                    return Err(Errno(libc::EINVAL));
                }
                let flags = cmd::u64_arg(data);
                self.mutate(|fs| {
                    fs.set_subvolume_readonly(
                        id.subvol,
                        flags & cmd::RO != 0,
                        flags & cmd::FORCE != 0,
                    )
                })?;
                Ok(Vec::new())
            }
            cmd::NEXT_SUBVOL => {
                let min = cmd::u64_arg(data);
                let mut all = self.fs.list_subvolumes().map_err(errno)?;
                all.sort_by_key(|s| s.id);
                let s = all
                    .into_iter()
                    .find(|s| s.id >= min)
                    .ok_or(Errno(libc::ENOENT))?;
                cmd::SubvolInfo::from_engine(s)
                    .to_bytes()
                    .ok_or(Errno(libc::ENAMETOOLONG))
            }
            cmd::EXTENTS => {
                let from = cmd::u64_arg(data);
                let size = self.fs.getattr(id).map_err(errno)?.size;
                let all = self.fs.file_extents(id).map_err(errno)?;
                let mut after = all.into_iter().filter(|e| e.file_offset + e.len > from);
                let extents: Vec<cmd::Extent> = after
                    .by_ref()
                    .take(cmd::EXTENT_ENTRIES)
                    .map(|e| cmd::Extent {
                        file_offset: e.file_offset,
                        len: e.len,
                        logical: e.logical,
                        flags: if e.inline { cmd::EXTENT_INLINE } else { 0 }
                            | if e.prealloc { cmd::EXTENT_PREALLOC } else { 0 }
                            | if e.compression != oleo::format::items::Compression::None {
                                cmd::EXTENT_ENCODED
                            } else {
                                0
                            },
                    })
                    .collect();
                Ok(cmd::ExtentsPage {
                    size,
                    sectorsize: self.fs.superblock().sectorsize,
                    more: after.next().is_some(),
                    extents,
                }
                .to_bytes())
            }
            cmd::FS_USAGE => {
                let mut report = cmd::FsUsage::from_engine(&self.fs).map_err(errno)?;
                // Device paths as this server opened them, maybe relative to its working
                // directory: absolute for the client.
                for d in &mut report.devices {
                    if let Some(p) = &mut d.path {
                        use std::os::unix::ffi::{OsStrExt, OsStringExt};
                        if let Ok(a) = std::path::absolute(std::ffi::OsStr::from_bytes(p)) {
                            *p = a.into_os_string().into_vec();
                        }
                    }
                }
                Ok(cmd::FsUsagePage::of(&report.encode(), cmd::u64_arg(data)).to_bytes())
            }
            _ => Err(Errno::ENOTTY),
        }
    }

    /// The kernel may hold `name` in `dir` as absent, `dir`'s size and times, and its
    /// listing (CACHE_DIR keeps listings in the directory's page cache): all go.
    fn entry_changed(&self, dir: u64, name: &[u8]) {
        let Some(n) = self.notifier() else {
            return;
        };
        for r in [n.inval_entry(dir, name), n.inval_inode(dir, 0, 0)] {
            if let Err(e) = r {
                if e.raw_os_error() != Some(libc::ENOENT) {
                    log::warn!("cannot tell the kernel that directory {dir} changed: {e}");
                }
            }
        }
    }
}

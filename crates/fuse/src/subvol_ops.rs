//! Serving `subvol_ioctl`'s commands: subvolumes made, snapshotted, listed and flagged on
//! the mounted filesystem, then the kernel told that the parent directory changed; a file's
//! extents; the devices and chunks `oleo filesystem` reports.

use crate::caller::Caller;
use crate::subvol_ioctl as cmd;
use crate::transport::{Errno, Request};
use crate::{errno, OleoFuse};

fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

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
            cmd::SCRUB_START,
            cmd::SCRUB_STATUS,
            cmd::DEV_STATS,
            cmd::SET_MOUNT_FLAGS,
            cmd::GET_SERVER_OPTIONS,
        ]
        .contains(&c)
            || OleoFuse::is_stream_ioctl(c)
    }

    /// Runs command `c` on `node` with the input `data`; the output bytes.
    pub(crate) fn subvol_ioctl(
        &self,
        req: &Request,
        node: u64,
        c: u32,
        data: &[u8],
    ) -> Result<Vec<u8>, Errno> {
        if OleoFuse::is_stream_ioctl(c) {
            return self.stream_ioctl(req, node, c, data);
        }
        let id = self.id(node)?;
        match c {
            cmd::SET_MOUNT_FLAGS => {
                // Only root remounts; a user must not turn sync or atime updates on or off.
                if !Caller::is_root(req) {
                    return Err(Errno(libc::EPERM));
                }
                let flags = crate::MountFlags::from_ms(cmd::u64_arg(data));
                log::info!("mount flags now {flags:?}");
                self.flags.set(flags);
                Ok(Vec::new())
            }
            cmd::GET_SERVER_OPTIONS => {
                if !Caller::is_root(req) {
                    return Err(Errno(libc::EPERM));
                }
                cmd::ServerOptions {
                    flags: self.flags.get().to_ms(),
                    writable: self.settings.writable,
                    options: self.settings.options.as_bytes().to_vec(),
                }
                .to_bytes()
                .ok_or(Errno(libc::ENAMETOOLONG))
            }
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
                // An ioctl's header has no ids under ALLOW_IDMAP: the caller's own, unmapped
                // on an idmapped view (see `caller`).
                let c = Caller::of(req).ok_or(Errno(libc::EOVERFLOW))?;
                self.mutate(|fs| fs.create_subvolume(id, name, c.uid, c.gid))?;
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
                // Not while it is being sent (EPERM, as the kernel).
                if let Ok(target) = self.fs.lookup(id, name) {
                    if crate::stream_ops::is_sending(target.subvol) {
                        return Err(Errno(libc::EPERM));
                    }
                }
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
                if flags & cmd::RO == 0 && crate::stream_ops::is_sending(id.subvol) {
                    return Err(Errno(libc::EPERM));
                }
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
            cmd::SCRUB_START => {
                let flags = cmd::u64_arg(data);
                let limit = data.get(8..16).map_or(0, cmd::u64_arg);
                self.start_scrub(flags & cmd::SCRUB_READONLY != 0, limit)?;
                Ok(Vec::new())
            }
            cmd::SCRUB_STATUS => {
                let mut st = self.scrub.lock().clone();
                if st.state == 1 {
                    st.duration = now().saturating_sub(st.started);
                }
                Ok(st.to_bytes())
            }
            cmd::DEV_STATS => {
                let devices = self
                    .fs
                    .device_stats()
                    .map_err(errno)?
                    .into_iter()
                    .map(|(d, v)| (d.devid, v))
                    .collect();
                if cmd::u64_arg(data) & 1 != 0 {
                    self.mutate(|fs| fs.reset_device_stats())?;
                }
                Ok(cmd::DevStatsReply { devices }.to_bytes())
            }
            _ => Err(Errno::ENOTTY),
        }
    }

    /// Runs a scrub in a thread of its own; its counters go to `self.scrub` as it goes. The
    /// filesystem keeps serving: the scrub takes the lock shared, one batch at a time.
    fn start_scrub(&self, readonly: bool, limit: u64) -> Result<(), Errno> {
        let mut st = self.scrub.lock();
        if st.state == 1 {
            return Err(Errno(libc::EBUSY));
        }
        *st = cmd::ScrubStatus {
            state: 1,
            started: now(),
            duration: 0,
            devices: Vec::new(),
        };
        drop(st);
        let fs = std::sync::Arc::clone(&self.fs);
        let job = std::sync::Arc::clone(&self.scrub);
        let opts = oleo::ScrubOptions {
            readonly: readonly || !self.settings.writable,
            rate_limit: (limit > 0).then_some(limit),
        };
        let spawned = std::thread::Builder::new()
            .name("oleo-scrub".into())
            .spawn(move || {
                let show = |stats: &std::collections::BTreeMap<u64, oleo::ScrubProgress>| {
                    stats
                        .iter()
                        .map(|(&d, p)| (d, cmd::scrub_counters(p)))
                        .collect::<Vec<_>>()
                };
                let r = fs.scrub(&opts, &mut |stats| {
                    let mut st = job.lock();
                    st.devices = show(stats);
                    st.duration = now().saturating_sub(st.started);
                });
                let mut st = job.lock();
                st.duration = now().saturating_sub(st.started);
                match r {
                    Ok(stats) => {
                        st.devices = show(&stats);
                        let bad = stats.values().any(|p| p.uncorrectable_errors > 0);
                        st.state = if bad { 4 } else { 2 };
                        log::info!("scrub finished in {} s", st.duration);
                    }
                    Err(e) => {
                        log::error!("scrub failed: {e}");
                        st.state = 3;
                    }
                }
            });
        if let Err(e) = spawned {
            self.scrub.lock().state = 3;
            log::error!("cannot start the scrub thread: {e}");
            return Err(Errno(libc::EAGAIN));
        }
        Ok(())
    }

    /// The kernel may hold `name` in `dir` as absent, `dir`'s size and times, and its
    /// listing (CACHE_DIR keeps listings in the directory's page cache): all go.
    pub(crate) fn entry_changed(&self, dir: u64, name: &[u8]) {
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

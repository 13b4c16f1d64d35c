//! Subvolumes and snapshots through the handle: `subvolume` under the locks a snapshot
//! needs (in-place writers stopped, then the filesystem lock).

use crate::error::Error;
use crate::error::Result;
use crate::filesystem::Filesystem;
use crate::subvolume::create::SNAPSHOT_ITEMS;
use crate::subvolume::create::SNAPSHOT_REF_BYTES;
use crate::subvolume::drop::STEP_ITEMS;
use crate::transaction::fs::random_uuid;
use crate::transaction::fs::InodeId;
use crate::transaction::space::reservation::Reserve;
use crate::vfs::inode_ops::check_name;
use oleo_format::items::ROOT_SUBVOL_RDONLY;
use oleo_format::key::objectid;

impl Filesystem {
    /// Creates the empty subvolume `name` in directory `parent` (see
    /// `FsCore::create_subvolume`).
    pub fn create_subvolume(
        &self,
        parent: InodeId,
        name: &[u8],
        uid: u32,
        gid: u32,
    ) -> Result<u64> {
        self.core_mut().create_subvolume(parent, name, uid, gid)
    }

    /// Snapshots subvolume `source` as `name` in directory `parent` (read-only with
    /// `readonly`) and commits; returns the snapshot's id. It holds everything written to
    /// `source` before the call; writers wait only while the snapshot is made in memory,
    /// not while the commits are written.
    pub fn snapshot(
        &self,
        source: u64,
        parent: InodeId,
        name: &[u8],
        readonly: bool,
    ) -> Result<u64> {
        // In-place writes to the source finish first, and none starts until the snapshot
        // shares its extents (after that they are older than its last snapshot).
        let _nocow = self.nocow_writers().exclusive();
        let (id, commits) = {
            let mut core = self.core_mut();
            core.check_subvol_writable(parent.subvol)?;
            check_name(name)?;
            if core.subvol_root(source)?.is_none() {
                return Err(Error::InvalidArgument(format!(
                    "no subvolume with id {source}"
                )));
            }
            if core.log_in_memory {
                return Err(Error::Unsupported(
                    "snapshots wait until the log replayed at mount is committed".into(),
                ));
            }
            let uuid = random_uuid()?;
            // What is written so far is the snapshot's content.
            let before = core.close_running()?;
            let need = Reserve::items(SNAPSHOT_ITEMS).bulk(SNAPSHOT_REF_BYTES);
            let id = core.write_op(need, |t| t.snapshot(source, parent, name, readonly, uuid))?;
            let made = core.close_running()?;
            core.subvol_roots.write().remove(&id);
            core.readonly_subvols.lock().insert(id, readonly);
            (id, [before, made])
        };
        for io in commits.into_iter().flatten() {
            io.write()?;
        }
        Ok(id)
    }
}

impl Filesystem {
    /// Makes subvolume `id` (5: the top level) the default; committed with the next commit.
    pub fn set_default_subvolume(&self, id: u64) -> Result<()> {
        let mut core = self.core_mut();
        if core.subvol_root(id)?.is_none() {
            return Err(Error::InvalidArgument(format!("no subvolume with id {id}")));
        }
        core.write_op(Reserve::items(2), |t| t.set_default(id))
    }
}

impl Filesystem {
    /// Deletes the subvolume whose entry is `name` in directory `parent`; returns its id.
    /// Refused (as the kernel refuses) for the default subvolume, a subvolume holding
    /// others and the one this filesystem was opened at. Files still open in it stay open
    /// (as with the kernel), but writes to them are refused from then on.
    pub fn delete_subvolume(&self, parent: InodeId, name: &[u8]) -> Result<u64> {
        // In-place writes into the dying tree's extents finish before they can be freed.
        let _nocow = self.nocow_writers().exclusive();
        let mut core = self.core_mut();
        core.check_subvol_writable(parent.subvol)?;
        let id = match core.lookup(parent, name)? {
            found if found.ino == objectid::FIRST_FREE && found.subvol != parent.subvol => {
                found.subvol
            }
            _ => {
                return Err(Error::InvalidArgument(format!(
                    "{} is not a subvolume",
                    String::from_utf8_lossy(name)
                )))
            }
        };
        if id == core.default_subvolume()? {
            return Err(Error::Busy(format!(
                "subvolume {id} is the default subvolume (set another default first)"
            )));
        }
        if id == core.root().subvol {
            return Err(Error::Busy(format!(
                "subvolume {id} is where this filesystem is mounted"
            )));
        }
        core.write_op(Reserve::items(12), |t| t.unlink_subvolume(parent, name, id))?;
        core.subvol_roots.write().remove(&id);
        core.readonly_subvols.lock().remove(&id);
        Ok(id)
    }
}

impl Filesystem {
    /// Drops part of one deleted subvolume's tree, if one waits, and commits; false when
    /// none waits. The step runs in a transaction of its own, between two commits: a step
    /// that fails on a damaged tree aborts only itself (the filesystem turns read-only, as
    /// the kernel's does), never changes of others waiting for a commit.
    pub fn clean_step(&self) -> Result<bool> {
        let Some(id) = self.core_read().next_dead_root()? else {
            return Ok(false);
        };
        let (before, step, after) = {
            let mut core = self.core_mut();
            let before = core.close_running()?;
            let step = core.write_op(Reserve::items(STEP_ITEMS), |t| t.drop_step(id));
            let after = match step {
                Ok(()) => core.close_running()?,
                Err(_) => None,
            };
            (before, step, after)
        };
        // Written without the lock, in order (the commit pipe orders superblocks).
        for io in [before, after].into_iter().flatten() {
            io.write()?;
        }
        step.map(|()| true)
    }

    /// Drops every deleted subvolume's tree, then commits.
    pub fn clean_all(&self) -> Result<()> {
        while self.clean_step()? {}
        self.sync().map(drop)
    }
}

impl Filesystem {
    /// Whether subvolume `id` is read-only.
    pub fn subvolume_readonly(&self, id: u64) -> Result<bool> {
        let core = self.core_read();
        match core.read_root_item(id)? {
            Some((_, ri)) if ri.refs > 0 && objectid::is_fs_tree(id) => {
                Ok(ri.flags & ROOT_SUBVOL_RDONLY != 0)
            }
            _ => Err(Error::InvalidArgument(format!("no subvolume with id {id}"))),
        }
    }

    /// Makes subvolume `id` read-only or writable, and commits. `force` lets a received
    /// subvolume become writable (its received_uuid is cleared).
    pub fn set_subvolume_readonly(&self, id: u64, readonly: bool, force: bool) -> Result<()> {
        self.subvolume_readonly(id)?;
        {
            let mut core = self.core_mut();
            core.write_op(Reserve::items(4), |t| t.set_readonly(id, readonly, force))?;
            core.readonly_subvols.lock().insert(id, readonly);
        }
        self.sync().map(drop)
    }
}

impl Filesystem {
    /// Records where subvolume `id` was received from, as the kernel's
    /// BTRFS_IOC_SET_RECEIVED_SUBVOL does for `btrfs receive` at a stream's END:
    /// received_uuid `uuid` (the sent subvolume's), `stransid` and `stime` (its ctransid and
    /// send time; btrfs-progs passes a zero stime), rtransid and rtime this transaction and
    /// now; the uuid tree's RECEIVED_SUBVOL item moves with the uuid. Commits. Refused
    /// (`Error::ReadOnly`) on a read-only subvolume, as the kernel refuses. Returns
    /// (rtransid, rtime).
    pub fn set_received_subvol(
        &self,
        id: u64,
        uuid: &[u8; 16],
        stransid: u64,
        stime: crate::Timespec,
    ) -> Result<(u64, crate::Timespec)> {
        self.subvolume_readonly(id)?;
        let stime = oleo_format::items::Timespec {
            sec: stime.sec,
            nsec: stime.nsec,
        };
        let rtime = crate::now();
        let rtransid = self.core_mut().write_op(Reserve::items(3), |t| {
            t.set_received(id, uuid, stransid, stime, rtime)
        })?;
        self.sync()?;
        let rtime = crate::Timespec {
            sec: rtime.sec,
            nsec: rtime.nsec,
        };
        Ok((rtransid, rtime))
    }

    /// Live subvolumes whose own uuid (or, with `received`, received_uuid) is `uuid`, as
    /// (id, transid) in id order. The transid is the one a send stream names the subvolume
    /// by: its ctransid, or for a received uuid its stransid.
    pub fn subvolumes_by_uuid(&self, uuid: &[u8; 16], received: bool) -> Result<Vec<(u64, u64)>> {
        self.core_read().subvolumes_by_uuid(uuid, received)
    }
}

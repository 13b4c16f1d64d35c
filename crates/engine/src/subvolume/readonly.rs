//! A subvolume's read-only flag (`btrfs property set PATH ro true|false`, the kernel's
//! btrfs_ioctl_subvol_setflags): ROOT_ITEM.flags, committed at once. A received subvolume
//! (received_uuid set) stays read-only unless the caller forces it, which first forgets
//! where it was received from, as btrfs-progs does with `-f`.

use crate::error::{Error, Result};
use crate::filesystem::Filesystem;
use crate::inode_item::now;
use crate::reservation::Reserve;
use crate::transaction::Transaction;
use oleo_format::items::ROOT_SUBVOL_RDONLY;
use oleo_format::key::{item, objectid};

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

impl Transaction<'_> {
    fn set_readonly(&mut self, id: u64, readonly: bool, force: bool) -> Result<()> {
        let (key, mut ri) = self.subvol_item(id)?;
        if !readonly && ri.received_uuid != [0; 16] {
            if !force {
                return Err(Error::InvalidArgument(format!(
                    "subvolume {id} was received (it has a received_uuid); making it \
                     writable needs force (-f), which clears that"
                )));
            }
            self.remove_uuid(&ri.received_uuid, item::UUID_KEY_RECEIVED_SUBVOL, id)?;
            ri.received_uuid = [0; 16];
            ri.stransid = 0;
            ri.rtransid = self.transid;
            ri.rtime = now();
        }
        ri.flags &= !ROOT_SUBVOL_RDONLY;
        if readonly {
            ri.flags |= ROOT_SUBVOL_RDONLY;
        }
        self.put_subvol_item(&key, &ri)
    }
}

//! A subvolume's read-only flag (`btrfs property set PATH ro true|false`, the kernel's
//! btrfs_ioctl_subvol_setflags): ROOT_ITEM.flags, committed at once. A received subvolume
//! (received_uuid set) stays read-only unless the caller forces it, which first forgets
//! where it was received from, as btrfs-progs does with `-f`.

use crate::error::{Error, Result};
use crate::inode::inode_item::now;
use crate::transaction::Transaction;
use oleo_format::items::ROOT_SUBVOL_RDONLY;
use oleo_format::key::item;

impl Transaction<'_> {
    pub(crate) fn set_readonly(&mut self, id: u64, readonly: bool, force: bool) -> Result<()> {
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

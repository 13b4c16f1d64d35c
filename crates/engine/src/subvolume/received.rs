//! Where a subvolume was received from (the kernel's BTRFS_IOC_SET_RECEIVED_SUBVOL, which
//! `btrfs receive` calls at a stream's END): received_uuid, stransid, rtransid, stime and
//! rtime in the ROOT_ITEM, and the uuid tree's RECEIVED_SUBVOL item moved with them. Also
//! finding subvolumes by uuid, as receive looks up a stream's parent and clone sources.

use crate::ctree::for_each_in_range;
use crate::error::{Error, Result};
use crate::transaction::fs::FsCore;
use crate::transaction::Transaction;
use oleo_format::items::{RootItem, Timespec, ROOT_SUBVOL_RDONLY};
use oleo_format::key::{item, objectid, Key};
use std::ops::ControlFlow;

impl Transaction<'_> {
    /// Records that subvolume `id` was received as `uuid` (sent at `stransid`, `stime`),
    /// received now (`rtime`, this transaction). Refused on a read-only subvolume, as the
    /// kernel refuses (EROFS). Returns this transaction's id (the rtransid).
    pub(crate) fn set_received(
        &mut self,
        id: u64,
        uuid: &[u8; 16],
        stransid: u64,
        stime: Timespec,
        rtime: Timespec,
    ) -> Result<u64> {
        let (key, mut ri) = self.subvol_item(id)?;
        if ri.flags & ROOT_SUBVOL_RDONLY != 0 {
            return Err(Error::ReadOnly);
        }
        let changed = ri.received_uuid != *uuid;
        if changed && ri.received_uuid != [0; 16] {
            self.remove_uuid(&ri.received_uuid, item::UUID_KEY_RECEIVED_SUBVOL, id)?;
        }
        ri.received_uuid = *uuid;
        ri.stransid = stransid;
        ri.rtransid = self.transid;
        ri.stime = stime;
        ri.rtime = rtime;
        self.put_subvol_item(&key, &ri)?;
        if changed && *uuid != [0; 16] {
            self.add_uuid(uuid, item::UUID_KEY_RECEIVED_SUBVOL, id)?;
        }
        Ok(self.transid)
    }
}

impl FsCore {
    /// Live subvolumes whose own uuid (or, with `received`, received_uuid) is `uuid`, by id,
    /// each with the transid a send stream names it by: its ctransid, or for a received
    /// uuid its stransid. Read from the ROOT_ITEMs, which the uuid tree only indexes.
    pub(crate) fn subvolumes_by_uuid(
        &self,
        uuid: &[u8; 16],
        received: bool,
    ) -> Result<Vec<(u64, u64)>> {
        let mut out = Vec::new();
        if *uuid == [0; 16] {
            return Ok(out);
        }
        let min = Key::new(objectid::FS_TREE, item::ROOT_ITEM, 0);
        let max = Key::new(objectid::LAST_FREE, item::ROOT_ITEM, u64::MAX);
        for_each_in_range(self, &self.root_tree(), min, max, |key, data| {
            if key.item_type != item::ROOT_ITEM || !objectid::is_fs_tree(key.objectid) {
                return Ok(ControlFlow::Continue(()));
            }
            let ri = RootItem::parse(data)
                .map_err(|e| Error::corrupt(0, format!("root item {key:?}: {e}")))?;
            let (have, transid) = if received {
                (ri.received_uuid, ri.stransid)
            } else {
                (ri.uuid, ri.ctransid)
            };
            if ri.refs > 0 && have == *uuid && out.last() != Some(&(key.objectid, transid)) {
                out.push((key.objectid, transid));
            }
            Ok(ControlFlow::Continue(()))
        })?;
        Ok(out)
    }
}

//! The uuid tree (the kernel's uuid-tree.c): from a subvolume's uuid, or the uuid it was
//! received as, to the subvolumes that carry it, so that send and receive find a parent
//! without a scan. Keys are the uuid's two halves (`uuid_key`); a body is a list of ids.

use crate::error::{Error, Result};
use crate::transaction::Transaction;
use oleo_format::items::{uuid_key, UuidItem};
use oleo_format::key::objectid;

impl Transaction<'_> {
    /// The ids under `uuid` and `kind` (UUID_KEY_SUBVOL or UUID_KEY_RECEIVED_SUBVOL).
    fn uuid_ids(&mut self, uuid: &[u8; 16], kind: u8) -> Result<Vec<u64>> {
        let key = uuid_key(uuid, kind);
        match self.lookup(objectid::UUID_TREE, &key) {
            Ok(Some(b)) => Ok(UuidItem::parse(&b)
                .map_err(|e| Error::corrupt(0, format!("uuid item {key:?}: {e}")))?
                .subvol_ids),
            Ok(None) => Ok(Vec::new()),
            Err(Error::NotFound) => Err(Error::Unsupported(
                "the filesystem has no uuid tree (a kernel mount creates it)".into(),
            )),
            Err(e) => Err(e),
        }
    }

    /// Records that subvolume `id` carries `uuid` as `kind`.
    pub(crate) fn add_uuid(&mut self, uuid: &[u8; 16], kind: u8, id: u64) -> Result<()> {
        let mut ids = self.uuid_ids(uuid, kind)?;
        if ids.contains(&id) {
            return Ok(());
        }
        ids.push(id);
        self.put_item(
            objectid::UUID_TREE,
            uuid_key(uuid, kind),
            &UuidItem { subvol_ids: ids }.to_bytes(),
        )
    }

    /// Forgets that subvolume `id` carries `uuid` as `kind`; the item goes with its last id.
    pub(crate) fn remove_uuid(&mut self, uuid: &[u8; 16], kind: u8, id: u64) -> Result<()> {
        let mut ids = self.uuid_ids(uuid, kind)?;
        let Some(pos) = ids.iter().position(|&x| x == id) else {
            return Ok(());
        };
        ids.remove(pos);
        let key = uuid_key(uuid, kind);
        if ids.is_empty() {
            self.delete_item(objectid::UUID_TREE, &key)
        } else {
            self.replace_item(
                objectid::UUID_TREE,
                &key,
                &UuidItem { subvol_ids: ids }.to_bytes(),
            )
        }
    }
}

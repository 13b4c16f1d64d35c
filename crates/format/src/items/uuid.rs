//! UUID tree items (UUID_KEY_SUBVOL / UUID_KEY_RECEIVED_SUBVOL): a subvolume UUID -> ids.

use crate::bytes::{put_u64, u64_at};
use crate::error::Result;
use crate::invalid;
use crate::key::Key;

/// The key of `uuid`'s entry: its two halves read as little-endian u64s.
pub fn uuid_key(uuid: &[u8; 16], item_type: u8) -> Key {
    let mut lo = [0u8; 8];
    let mut hi = [0u8; 8];
    lo.copy_from_slice(&uuid[..8]);
    hi.copy_from_slice(&uuid[8..]);
    Key::new(u64::from_le_bytes(lo), item_type, u64::from_le_bytes(hi))
}

/// The body: the subvolume ids carrying that UUID (normally one).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct UuidItem {
    /// Ids of the subvolumes with that UUID.
    pub subvol_ids: Vec<u64>,
}

impl UuidItem {
    /// Parses an item body: a whole number of u64s.
    pub fn parse(b: &[u8]) -> Result<UuidItem> {
        if !b.len().is_multiple_of(8) {
            invalid!("uuid item of {} bytes is not a list of u64", b.len());
        }
        let subvol_ids = (0..b.len() / 8)
            .map(|i| u64_at(b, i * 8))
            .collect::<Result<Vec<u64>>>()?;
        Ok(UuidItem { subvol_ids })
    }

    /// The item body.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.subvol_ids.len() * 8);
        for &id in &self.subvol_ids {
            put_u64(&mut out, id);
        }
        out
    }
}

//! FUSE node ids <-> (subvolume, inode) pairs; see the crate docs for the encoding.

use oleo::InodeId;
use parking_lot::RwLock;
use std::collections::HashMap;

const INO_BITS: u32 = 48;
const INO_MASK: u64 = (1 << INO_BITS) - 1;
const FUSE_ROOT: u64 = 1;

pub struct NodeIds {
    root: InodeId,
    /// Subvolume ids by index, and the reverse map.
    subvols: RwLock<(Vec<u64>, HashMap<u64, u64>)>,
}

impl NodeIds {
    pub fn new(root: InodeId) -> NodeIds {
        let mut by_id = HashMap::new();
        by_id.insert(root.subvol, 0);
        NodeIds {
            root,
            subvols: RwLock::new((vec![root.subvol], by_id)),
        }
    }

    fn subvol_index(&self, subvol: u64) -> Option<u64> {
        if let Some(&i) = self.subvols.read().1.get(&subvol) {
            return Some(i);
        }
        let mut w = self.subvols.write();
        if let Some(&i) = w.1.get(&subvol) {
            return Some(i);
        }
        let i = w.0.len() as u64;
        if i >= (1 << (64 - INO_BITS)) {
            return None;
        }
        w.0.push(subvol);
        w.1.insert(subvol, i);
        Some(i)
    }

    /// st_ino for an inode: its encoded id (the root keeps its btrfs number, 256).
    pub fn st_ino(&self, id: InodeId) -> Option<u64> {
        if id.ino > INO_MASK {
            return None;
        }
        Some(self.subvol_index(id.subvol)? << INO_BITS | id.ino)
    }

    /// The FUSE node id for an inode; None when it cannot be encoded (inode >= 2^48).
    pub fn encode(&self, id: InodeId) -> Option<u64> {
        if id == self.root {
            return Some(FUSE_ROOT);
        }
        self.st_ino(id)
    }

    pub fn decode(&self, node: u64) -> Option<InodeId> {
        if node == FUSE_ROOT {
            return Some(self.root);
        }
        let subvol = *self.subvols.read().0.get((node >> INO_BITS) as usize)?;
        Some(InodeId {
            subvol,
            ino: node & INO_MASK,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let root = InodeId {
            subvol: 5,
            ino: 256,
        };
        let ids = NodeIds::new(root);
        assert_eq!(ids.encode(root), Some(1));
        assert_eq!(ids.st_ino(root), Some(256));
        let a = InodeId {
            subvol: 5,
            ino: 300,
        };
        let b = InodeId {
            subvol: 257,
            ino: 300,
        };
        assert_eq!(ids.encode(a), Some(300));
        let nb = ids.encode(b).unwrap();
        assert_ne!(nb, 300);
        assert_eq!(ids.decode(nb), Some(b));
        assert_eq!(ids.decode(300), Some(a));
        assert_eq!(
            ids.encode(InodeId {
                subvol: 5,
                ino: 1 << 48
            }),
            None
        );
        assert_eq!(ids.decode(7 << 48), None);
    }
}

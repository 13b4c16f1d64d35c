//! POSIX ACLs, stored as the xattrs system.posix_acl_access and system.posix_acl_default in
//! the kernel's binary form (a version-2 header, then tag/perm/id entries). The kernel's
//! VFS does the ACL bookkeeping for in-kernel filesystems; through FUSE with POSIX ACLs on,
//! the server must: new nodes inherit their parent's default ACL (and then no umask
//! applies), chmod rewrites the access ACL, and setting an access ACL sets the mode.

use crate::error::{Error, Result};

pub(crate) const ACCESS: &[u8] = b"system.posix_acl_access";
pub(crate) const DEFAULT: &[u8] = b"system.posix_acl_default";

const VERSION: u32 = 2;
const USER_OBJ: u16 = 0x01;
const GROUP_OBJ: u16 = 0x04;
const MASK: u16 = 0x10;
const OTHER: u16 = 0x20;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Entry {
    tag: u16,
    perm: u16,
    id: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Acl(Vec<Entry>);

impl Acl {
    pub(crate) fn parse(b: &[u8]) -> Result<Acl> {
        let bad = || Error::InvalidArgument("malformed POSIX ACL".into());
        if b.len() < 4 || !(b.len() - 4).is_multiple_of(8) {
            return Err(bad());
        }
        if u32::from_le_bytes(b[..4].try_into().map_err(|_| bad())?) != VERSION {
            return Err(bad());
        }
        let entries = b[4..]
            .chunks_exact(8)
            .map(|c| Entry {
                tag: u16::from_le_bytes([c[0], c[1]]),
                perm: u16::from_le_bytes([c[2], c[3]]),
                id: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
            })
            .collect();
        Ok(Acl(entries))
    }

    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let mut out = VERSION.to_le_bytes().to_vec();
        for e in &self.0 {
            out.extend_from_slice(&e.tag.to_le_bytes());
            out.extend_from_slice(&e.perm.to_le_bytes());
            out.extend_from_slice(&e.id.to_le_bytes());
        }
        out
    }

    /// True if the ACL says no more than the mode bits (owner, group, other only).
    fn is_minimal(&self) -> bool {
        self.0
            .iter()
            .all(|e| matches!(e.tag, USER_OBJ | GROUP_OBJ | OTHER))
    }

    fn find(&mut self, tag: u16) -> Option<&mut Entry> {
        self.0.iter_mut().find(|e| e.tag == tag)
    }

    /// A new node's ACL from its parent's default ACL and the mode it was created with:
    /// both are narrowed to what the other allows. Returns the mode, and the access ACL to
    /// store (None when the mode says it all).
    pub(crate) fn inherit(mut self, mode: u32) -> (u32, Option<Acl>) {
        let mut mode = mode;
        let mut group_perm = None;
        for e in self.0.iter_mut() {
            match e.tag {
                USER_OBJ => {
                    e.perm &= ((mode >> 6) & 7) as u16;
                    mode &= (u32::from(e.perm) << 6) | !0o700;
                }
                OTHER => {
                    e.perm &= (mode & 7) as u16;
                    mode &= u32::from(e.perm) | !0o007;
                }
                _ => {}
            }
        }
        // The group class is the mask when there is one, else the owning group.
        let class = if self.find(MASK).is_some() {
            MASK
        } else {
            GROUP_OBJ
        };
        if let Some(e) = self.find(class) {
            e.perm &= ((mode >> 3) & 7) as u16;
            group_perm = Some(e.perm);
        }
        if let Some(p) = group_perm {
            mode &= (u32::from(p) << 3) | !0o070;
        }
        let minimal = self.is_minimal();
        (mode, (!minimal).then_some(self))
    }

    /// chmod: the owner, group class and other entries take the new permission bits.
    pub(crate) fn chmod(&mut self, mode: u32) {
        let class = if self.find(MASK).is_some() {
            MASK
        } else {
            GROUP_OBJ
        };
        for e in self.0.iter_mut() {
            match e.tag {
                USER_OBJ => e.perm = ((mode >> 6) & 7) as u16,
                OTHER => e.perm = (mode & 7) as u16,
                t if t == class => e.perm = ((mode >> 3) & 7) as u16,
                _ => {}
            }
        }
    }

    /// The permission bits an access ACL implies, and whether it is needed at all.
    pub(crate) fn mode_bits(&self) -> (u32, bool) {
        let mut acl = self.clone();
        let class = if acl.find(MASK).is_some() {
            MASK
        } else {
            GROUP_OBJ
        };
        let mut bits = 0u32;
        for e in &acl.0 {
            match e.tag {
                USER_OBJ => bits |= u32::from(e.perm & 7) << 6,
                OTHER => bits |= u32::from(e.perm & 7),
                t if t == class => bits |= u32::from(e.perm & 7) << 3,
                _ => {}
            }
        }
        let needed = !acl.is_minimal();
        acl.0.clear();
        (bits, needed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acl(entries: &[(u16, u16, u32)]) -> Acl {
        Acl(entries
            .iter()
            .map(|&(tag, perm, id)| Entry { tag, perm, id })
            .collect())
    }

    #[test]
    fn inherit_narrows_mode_and_mask() {
        // default: u::rwx, u:1000:rwx, g::r-x, m::rwx, o::---
        let d = acl(&[
            (USER_OBJ, 7, 0),
            (0x02, 7, 1000),
            (GROUP_OBJ, 5, 0),
            (MASK, 7, 0),
            (OTHER, 0, 0),
        ]);
        let (mode, access) = d.inherit(0o100644);
        assert_eq!(mode, 0o100640);
        let access = access.expect("named user entry needs an access ACL");
        assert_eq!(
            access.0[3],
            Entry {
                tag: MASK,
                perm: 4,
                id: 0
            }
        );
        assert_eq!(Acl::parse(&access.to_bytes()).unwrap(), access);
    }

    #[test]
    fn minimal_default_gives_no_access_acl() {
        let d = acl(&[(USER_OBJ, 7, 0), (GROUP_OBJ, 5, 0), (OTHER, 5, 0)]);
        let (mode, access) = d.inherit(0o40777);
        assert_eq!(mode, 0o40755);
        assert!(access.is_none());
    }

    #[test]
    fn chmod_sets_mask_not_group() {
        let mut a = acl(&[
            (USER_OBJ, 7, 0),
            (GROUP_OBJ, 7, 0),
            (MASK, 7, 0),
            (OTHER, 7, 0),
        ]);
        a.chmod(0o640);
        assert_eq!(a.mode_bits(), (0o640, true));
        assert_eq!(a.0[1].perm, 7);
    }
}

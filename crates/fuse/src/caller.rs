//! Who made a request, for the few decisions the server takes itself although the kernel
//! checks permissions (default_permissions): whether S_ISGID survives a write, truncate or
//! O_TRUNC open by a caller without CAP_FSETID, the owner check of chown(-1, -1) on a
//! setuid file, and the ioctls that want root (remount flags, send and receive) or own
//! what they make (a new subvolume).
//!
//! Without ALLOW_IDMAP the request's header says who asked. With it (the mount may be
//! idmapped, Linux 6.12+), the header of every request but those that make an inode holds
//! `INVALID_UIDGID`, and the caller is read from `/proc/<tid>/status`: its filesystem uid
//! and gid and its supplementary groups, as the server's user namespace sees them. On a
//! mount that is not idmapped these are the ids the header would have held. On an
//! idmapped view they are the caller's own ids, not mapped through the view's idmap, which
//! no request tells the server: there a decision above compares unmapped ids (see
//! docs/fuse-limits.md).

use crate::transport::{abi, Request};

/// The ids of a request's caller.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Caller {
    /// Filesystem uid.
    pub uid: u32,
    /// Filesystem gid.
    pub gid: u32,
    /// Supplementary groups (none known when the header gave the ids).
    groups: Vec<u32>,
}

impl Caller {
    /// The caller of `req`: from its header, else from /proc; None when neither says (the
    /// caller is gone, or lives in a pid namespace the server cannot see).
    /// Whether the caller of `req` is root (uid 0), as far as anything says: the ioctls that
    /// want CAP_SYS_ADMIN ask this. Never `req.uid` alone: with ALLOW_IDMAP it is
    /// `INVALID_UIDGID` for every such request.
    pub(crate) fn is_root(req: &Request) -> bool {
        Caller::of(req).is_some_and(|c| c.uid == 0)
    }

    pub(crate) fn of(req: &Request) -> Option<Caller> {
        if req.uid != abi::INVALID_UIDGID && req.gid != abi::INVALID_UIDGID {
            return Some(Caller {
                uid: req.uid,
                gid: req.gid,
                groups: Vec::new(),
            });
        }
        if req.pid == 0 {
            return None;
        }
        // A thread's directory answers by its id although /proc does not list it.
        let text = std::fs::read_to_string(format!("/proc/{}/status", req.pid)).ok()?;
        parse_status(&text)
    }

    /// in_group_p: `gid` is the caller's filesystem gid or one of its groups.
    pub(crate) fn in_group(&self, gid: u32) -> bool {
        self.gid == gid || self.groups.contains(&gid)
    }
}

/// The ids a request that makes an inode gives its owner: its header's, which the kernel
/// has mapped through an idmapped mount's idmap. The VFS refuses a creator without a
/// mapping (EOVERFLOW) before asking; a header without ids is refused the same way rather
/// than given an owner of 4294967295.
pub(crate) fn creator(req: &Request) -> Result<(u32, u32), crate::transport::Errno> {
    if req.uid == abi::INVALID_UIDGID || req.gid == abi::INVALID_UIDGID {
        return Err(crate::transport::Errno(libc::EOVERFLOW));
    }
    Ok((req.uid, req.gid))
}

/// Reads the fourth (filesystem) id of the `Uid:` and `Gid:` lines and the `Groups:` line
/// of a /proc status file.
fn parse_status(text: &str) -> Option<Caller> {
    let field = |key: &str| text.lines().find_map(|l| l.strip_prefix(key));
    let fs_id = |key: &str| -> Option<u32> { field(key)?.split_whitespace().nth(3)?.parse().ok() };
    let groups = field("Groups:")
        .map(|g| {
            g.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    Some(Caller {
        uid: fs_id("Uid:")?,
        gid: fs_id("Gid:")?,
        groups,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(uid: u32, gid: u32, pid: u32) -> Request {
        Request {
            unique: 2,
            nodeid: 1,
            uid,
            gid,
            pid,
        }
    }

    #[test]
    fn header_ids_win() {
        let c = Caller::of(&req(1000, 100, 1)).unwrap();
        assert_eq!((c.uid, c.gid), (1000, 100));
        assert!(c.in_group(100) && !c.in_group(0));
    }

    #[test]
    fn status_gives_filesystem_ids_and_groups() {
        let text = "Name:\tx\nUid:\t1000\t1001\t1002\t1003\nGid:\t20\t21\t22\t23\n\
                    Groups:\t4 24 27 \nCapEff:\t0\n";
        let c = parse_status(text).unwrap();
        assert_eq!((c.uid, c.gid), (1003, 23));
        assert!(c.in_group(23) && c.in_group(27) && !c.in_group(20));
        assert_eq!(parse_status("Uid:\t1\t2\n"), None);
    }

    #[test]
    fn invalid_header_reads_proc() {
        // SAFETY: gettid, getuid and getgid cannot fail.
        let (tid, uid, gid) = unsafe { (libc::gettid(), libc::geteuid(), libc::getegid()) };
        let inv = abi::INVALID_UIDGID;
        let c = Caller::of(&req(inv, inv, tid as u32)).unwrap();
        assert_eq!((c.uid, c.gid), (uid, gid));
        assert_eq!(Caller::of(&req(inv, inv, 0)), None);
        assert!(creator(&req(inv, 5, 1)).is_err());
        assert_eq!(creator(&req(7, 5, 1)), Ok((7, 5)));
    }
}

//! The directory-entry format shared by DIR_ITEM, DIR_INDEX and XATTR_ITEM.

use crate::bytes::{put_u16, put_u64, put_u8, slice, u16_at, u64_at, u8_at};
use crate::error::Result;
use crate::key::Key;

/// Size of a dir entry's fixed part (`btrfs_dir_item`): location, transid, data_len,
/// name_len, type.
pub const DIR_ENTRY_HEADER: usize = 30;

/// The `type` byte of a directory entry (`BTRFS_FT_*`): what kind of inode it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileType {
    /// 0, or any value btrfs does not define: invalid on disk.
    Unknown,
    /// 1: a regular file.
    RegFile,
    /// 2: a directory (or a subvolume).
    Dir,
    /// 3: a character device.
    ChrDev,
    /// 4: a block device.
    BlkDev,
    /// 5: a named pipe.
    Fifo,
    /// 6: a Unix socket.
    Sock,
    /// 7: a symbolic link.
    Symlink,
    /// 8: an extended attribute (XATTR_ITEM entries only).
    Xattr,
}

impl FileType {
    /// The type of an on-disk type byte (the ENCRYPTED bit 0x80 ignored).
    pub fn from_raw(t: u8) -> FileType {
        match t & 0x7f {
            1 => FileType::RegFile,
            2 => FileType::Dir,
            3 => FileType::ChrDev,
            4 => FileType::BlkDev,
            5 => FileType::Fifo,
            6 => FileType::Sock,
            7 => FileType::Symlink,
            8 => FileType::Xattr,
            _ => FileType::Unknown,
        }
    }

    /// The on-disk type byte (0 for `Unknown`, which is invalid on disk).
    pub fn raw(self) -> u8 {
        match self {
            FileType::Unknown => 0,
            FileType::RegFile => 1,
            FileType::Dir => 2,
            FileType::ChrDev => 3,
            FileType::BlkDev => 4,
            FileType::Fifo => 5,
            FileType::Sock => 6,
            FileType::Symlink => 7,
            FileType::Xattr => 8,
        }
    }
}

/// One entry of a DIR_ITEM, DIR_INDEX or XATTR_ITEM body (`btrfs_dir_item` and what
/// follows it): a directory entry (location = target's key) or an xattr (data = value).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirEntryItem<'a> {
    /// Key of the target: `(inode, INODE_ITEM, 0)`, `(subvolume id, ROOT_ITEM, 0 or -1)` for a
    /// subvolume, all zero for an xattr.
    pub location: Key,
    /// Transaction id in which the entry was created.
    pub transid: u64,
    /// The raw type byte (see [`DirEntryItem::kind`]).
    pub file_type: u8,
    /// The name (no NUL); an xattr's full name with its namespace prefix.
    pub name: &'a [u8],
    /// An xattr's value; empty for directory entries.
    pub data: &'a [u8],
}

impl DirEntryItem<'_> {
    /// The decoded type byte.
    pub fn kind(&self) -> FileType {
        FileType::from_raw(self.file_type)
    }

    /// On-disk size of this entry (header, name, data).
    pub fn encoded_len(&self) -> usize {
        DIR_ENTRY_HEADER + self.name.len() + self.data.len()
    }

    /// Appends one entry. DIR_ITEM / XATTR_ITEM bodies may hold several entries back to back
    /// (name hash collisions); a DIR_INDEX body holds exactly one.
    pub fn write_into(&self, out: &mut Vec<u8>) -> Result<()> {
        let name_len = crate::items::name_len(self.name)?;
        let data_len = crate::items::name_len(self.data)?;
        out.extend_from_slice(&self.location.to_bytes());
        put_u64(out, self.transid);
        put_u16(out, data_len);
        put_u16(out, name_len);
        put_u8(out, self.file_type);
        out.extend_from_slice(self.name);
        out.extend_from_slice(self.data);
        Ok(())
    }

    /// This entry alone, as an item body (a DIR_INDEX body, or a DIR_ITEM without collisions).
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(self.encoded_len());
        self.write_into(&mut out)?;
        Ok(out)
    }
}

/// Walks the entries packed in one item body; yields an error (once) for a truncated entry.
pub struct DirEntryIter<'a> {
    body: &'a [u8],
    off: usize,
}

impl<'a> DirEntryIter<'a> {
    /// Iterates over the entries of an item body.
    pub fn new(body: &'a [u8]) -> Self {
        DirEntryIter { body, off: 0 }
    }

    fn parse_one(&self) -> Result<(DirEntryItem<'a>, usize)> {
        let b = self.body;
        let o = self.off;
        let location = Key::parse(b, o)?;
        let transid = u64_at(b, o + 17)?;
        let data_len = u16_at(b, o + 25)? as usize;
        let name_len = u16_at(b, o + 27)? as usize;
        let file_type = u8_at(b, o + 29)?;
        let name = slice(b, o + DIR_ENTRY_HEADER, name_len)?;
        let data = slice(b, o + DIR_ENTRY_HEADER + name_len, data_len)?;
        Ok((
            DirEntryItem {
                location,
                transid,
                file_type,
                name,
                data,
            },
            DIR_ENTRY_HEADER + name_len + data_len,
        ))
    }
}

impl<'a> Iterator for DirEntryIter<'a> {
    type Item = Result<DirEntryItem<'a>>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.off >= self.body.len() {
            return None;
        }
        match self.parse_one() {
            Ok((e, len)) => {
                self.off += len;
                Some(Ok(e))
            }
            Err(e) => {
                self.off = self.body.len();
                Some(Err(e))
            }
        }
    }
}

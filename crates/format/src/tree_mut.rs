//! Mutable views over one tree block's bytes: the write-side twin of `TreeBlock`.
//!
//! `LeafMut` and `NodeMut` edit a leaf or node in place and keep what `validate` checks: keys
//! strictly increasing, leaf bodies packed back to back from the end of the block (item 0's
//! body ends at the block end, item i's where item i-1's starts), item headers never
//! overlapping bodies. Every operation checks its arguments and the block's own fields and
//! returns an error instead of panicking, so even a damaged block cannot crash a writer. The
//! checksum goes stale with the first edit: `finalize` recomputes it when the edits are done.

use crate::bytes::{array, put_at, slice, u32_at, u64_at, u8_at};
use crate::csum::CsumType;
use crate::error::{FormatError, Result};
use crate::invalid;
use crate::key::{Key, KEY_SIZE};
use crate::tree_block::{
    write_csum, Header, ItemHeader, KeyPtr, HEADER_SIZE, ITEM_SIZE, KEY_PTR_SIZE,
};

// Header field offsets (format digest 2.1).
const FSID_OFF: usize = 32;
const BYTENR_OFF: usize = 48;
const FLAGS_OFF: usize = 56;
const CHUNK_UUID_OFF: usize = 64;
const GENERATION_OFF: usize = 80;
const OWNER_OFF: usize = 88;
const NRITEMS_OFF: usize = 96;
const LEVEL_OFF: usize = 100;

fn truncated(offset: usize, need: usize, have: usize) -> FormatError {
    FormatError::Truncated { offset, need, have }
}

/// Moves `len` bytes from `src` to `dst` inside `buf` (the ranges may overlap).
fn move_within(buf: &mut [u8], src: usize, dst: usize, len: usize) -> Result<()> {
    let have = buf.len();
    for start in [src, dst] {
        if start.checked_add(len).is_none_or(|end| end > have) {
            return Err(truncated(start, len, have));
        }
    }
    buf.copy_within(src..src + len, dst);
    Ok(())
}

/// Copies `len` bytes from `src[src_off..]` to `dst[dst_off..]`.
fn copy_between(
    src: &[u8],
    src_off: usize,
    dst: &mut [u8],
    dst_off: usize,
    len: usize,
) -> Result<()> {
    put_at(dst, dst_off, slice(src, src_off, len)?)
}

fn zero_range(buf: &mut [u8], off: usize, len: usize) -> Result<()> {
    let have = buf.len();
    off.checked_add(len)
        .and_then(|end| buf.get_mut(off..end))
        .ok_or(truncated(off, len, have))?
        .fill(0);
    Ok(())
}

fn to_u32(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| FormatError::invalid(format!("{what} {v} does not fit 32 bits")))
}

/// Formats `block` as an empty tree block: zeroes it and writes `header` (its nritems is
/// written as given; pass 0 for a fresh block).
pub fn init_block(block: &mut [u8], header: &Header) -> Result<()> {
    if block.len() < HEADER_SIZE {
        return Err(truncated(0, HEADER_SIZE, block.len()));
    }
    block.fill(0);
    header.write_into(block)
}

/// The header of any tree block, for writing. `level` and `nritems` decide how the rest of
/// the block is read, so they can only be set through a view made with `HeaderMut::new` over
/// raw bytes, not through the header of a `LeafMut` or `NodeMut` (whose edits rely on them).
pub struct HeaderMut<'a> {
    data: &'a mut [u8],
    layout_settable: bool,
}

impl<'a> HeaderMut<'a> {
    /// A view of the header of any block (`data` must hold at least a header); level and
    /// nritems may be set through it.
    pub fn new(data: &'a mut [u8]) -> Result<HeaderMut<'a>> {
        slice(data, 0, HEADER_SIZE)?;
        Ok(HeaderMut {
            data,
            layout_settable: true,
        })
    }

    fn of_view(data: &'a mut [u8]) -> HeaderMut<'a> {
        HeaderMut {
            data,
            layout_settable: false,
        }
    }

    fn check_layout_settable(&self) -> Result<()> {
        if !self.layout_settable {
            invalid!("level and nritems of a leaf or node view are managed by the view");
        }
        Ok(())
    }

    /// The parsed header.
    pub fn parse(&self) -> Result<Header> {
        Header::parse(self.data)
    }

    /// The header's logical address the block claims.
    pub fn bytenr(&self) -> Result<u64> {
        u64_at(self.data, BYTENR_OFF)
    }

    /// The header's flags.
    pub fn flags(&self) -> Result<u64> {
        u64_at(self.data, FLAGS_OFF)
    }

    /// The header's generation (transaction id of the write).
    pub fn generation(&self) -> Result<u64> {
        u64_at(self.data, GENERATION_OFF)
    }

    /// The header's owner tree id.
    pub fn owner(&self) -> Result<u64> {
        u64_at(self.data, OWNER_OFF)
    }

    /// The header's level.
    pub fn level(&self) -> Result<u8> {
        u8_at(self.data, LEVEL_OFF)
    }

    /// The header's item or pointer count.
    pub fn nritems(&self) -> Result<u32> {
        u32_at(self.data, NRITEMS_OFF)
    }

    /// The header's fsid.
    pub fn fsid(&self) -> Result<[u8; 16]> {
        array(self.data, FSID_OFF)
    }

    /// Sets the logical address the block claims.
    pub fn set_bytenr(&mut self, v: u64) -> Result<()> {
        put_at(self.data, BYTENR_OFF, &v.to_le_bytes())
    }

    /// Sets the header flags.
    pub fn set_flags(&mut self, v: u64) -> Result<()> {
        put_at(self.data, FLAGS_OFF, &v.to_le_bytes())
    }

    /// Sets the generation (the transaction writing the block).
    pub fn set_generation(&mut self, v: u64) -> Result<()> {
        put_at(self.data, GENERATION_OFF, &v.to_le_bytes())
    }

    /// Sets the owner tree id.
    pub fn set_owner(&mut self, v: u64) -> Result<()> {
        put_at(self.data, OWNER_OFF, &v.to_le_bytes())
    }

    /// Sets the level; refused on the header of a [`LeafMut`] or [`NodeMut`].
    pub fn set_level(&mut self, v: u8) -> Result<()> {
        self.check_layout_settable()?;
        put_at(self.data, LEVEL_OFF, &[v])
    }

    /// Sets the item count; refused on the header of a [`LeafMut`] or [`NodeMut`].
    pub fn set_nritems(&mut self, v: u32) -> Result<()> {
        self.check_layout_settable()?;
        put_at(self.data, NRITEMS_OFF, &v.to_le_bytes())
    }

    /// Sets the fsid.
    pub fn set_fsid(&mut self, v: &[u8; 16]) -> Result<()> {
        put_at(self.data, FSID_OFF, v)
    }

    /// Sets the chunk tree UUID.
    pub fn set_chunk_tree_uuid(&mut self, v: &[u8; 16]) -> Result<()> {
        put_at(self.data, CHUNK_UUID_OFF, v)
    }

    /// Recomputes the checksum over the whole block: call after the last edit.
    pub fn finalize(&mut self, csum: CsumType) -> Result<()> {
        write_csum(self.data, csum)
    }
}

/// The header-level accessors leaves and nodes share (`$what` names the count in errors).
macro_rules! block_common {
    ($ty:ident, $what:literal) => {
        impl $ty<'_> {
            /// The whole block.
            pub fn bytes(&self) -> &[u8] {
                self.data
            }

            /// The block's header, for the fields a view does not manage (level and
            /// nritems stay the view's).
            pub fn header_mut(&mut self) -> HeaderMut<'_> {
                HeaderMut::of_view(self.data)
            }

            /// Recomputes the checksum over the whole block: call after the last edit.
            pub fn finalize(&mut self, csum: CsumType) -> Result<()> {
                write_csum(self.data, csum)
            }

            /// The header's nritems (0 if unreadable).
            pub fn nritems(&self) -> usize {
                u32_at(self.data, NRITEMS_OFF).unwrap_or(0) as usize
            }

            fn set_nritems(&mut self, n: usize) -> Result<()> {
                put_at(self.data, NRITEMS_OFF, &to_u32(n, $what)?.to_le_bytes())
            }
        }
    };
}

block_common!(LeafMut, "item count");
block_common!(NodeMut, "pointer count");

/// A leaf (level 0) open for editing.
pub struct LeafMut<'a> {
    data: &'a mut [u8],
}

impl<'a> LeafMut<'a> {
    /// A view of an existing leaf. Checks the level and that the item headers and bodies are
    /// laid out as `validate` demands, so the edits below can rely on it.
    pub fn new(data: &'a mut [u8]) -> Result<LeafMut<'a>> {
        let leaf = LeafMut::of_leaf(data)?;
        leaf.check_layout()?;
        Ok(leaf)
    }

    /// A view of a leaf whose layout is already known good: it passed `validate` when read,
    /// or only views have changed it since. Checks the size and level alone, so an edit
    /// costs no walk over every item (debug builds still walk).
    pub fn of_checked(data: &'a mut [u8]) -> Result<LeafMut<'a>> {
        let leaf = LeafMut::of_leaf(data)?;
        debug_assert!(leaf.check_layout().is_ok(), "leaf layout broken by an edit");
        Ok(leaf)
    }

    fn of_leaf(data: &'a mut [u8]) -> Result<LeafMut<'a>> {
        if data.len() < HEADER_SIZE + ITEM_SIZE || u32::try_from(data.len()).is_err() {
            invalid!("{} bytes is no tree block size", data.len());
        }
        let leaf = LeafMut { data };
        if u8_at(leaf.data, LEVEL_OFF)? != 0 {
            invalid!("not a leaf (level {})", u8_at(leaf.data, LEVEL_OFF)?);
        }
        Ok(leaf)
    }

    fn check_layout(&self) -> Result<()> {
        let n = self.nritems();
        if n.checked_mul(ITEM_SIZE)
            .is_none_or(|h| h > self.data_size())
        {
            invalid!("leaf claims {n} items, more than fit");
        }
        let mut end = self.data_size();
        for slot in 0..n {
            let it = self.item(slot)?;
            let (off, size) = (it.offset as usize, it.size as usize);
            if off.checked_add(size) != Some(end) || off < n * ITEM_SIZE {
                invalid!(
                    "leaf item {slot} body [{off}, +{size}) is not packed (expected end {end})"
                );
            }
            end = off;
        }
        Ok(())
    }

    /// Bytes after the header, where item headers and bodies live.
    pub fn data_size(&self) -> usize {
        self.data.len() - HEADER_SIZE
    }

    fn check_slot(&self, slot: usize) -> Result<()> {
        if slot >= self.nritems() {
            invalid!("slot {slot} past the {} items of the leaf", self.nritems());
        }
        Ok(())
    }

    /// Item header `slot`.
    pub fn item(&self, slot: usize) -> Result<ItemHeader> {
        self.check_slot(slot)?;
        let off = HEADER_SIZE + slot * ITEM_SIZE;
        Ok(ItemHeader {
            key: Key::parse(self.data, off)?,
            offset: u32_at(self.data, off + KEY_SIZE)?,
            size: u32_at(self.data, off + KEY_SIZE + 4)?,
        })
    }

    /// The key of item `slot`.
    pub fn key(&self, slot: usize) -> Result<Key> {
        Ok(self.item(slot)?.key)
    }

    fn write_item(&mut self, slot: usize, key: &Key, offset: usize, size: usize) -> Result<()> {
        let off = HEADER_SIZE + slot * ITEM_SIZE;
        put_at(self.data, off, &key.to_bytes())?;
        put_at(
            self.data,
            off + KEY_SIZE,
            &to_u32(offset, "item offset")?.to_le_bytes(),
        )?;
        put_at(
            self.data,
            off + KEY_SIZE + 4,
            &to_u32(size, "item size")?.to_le_bytes(),
        )
    }

    fn set_item_offset(&mut self, slot: usize, offset: usize) -> Result<()> {
        let off = HEADER_SIZE + slot * ITEM_SIZE + KEY_SIZE;
        put_at(
            self.data,
            off,
            &to_u32(offset, "item offset")?.to_le_bytes(),
        )
    }

    /// Shifts the body offsets of items `[from, nritems)` by `delta` (positive: up, toward
    /// the block end).
    fn shift_offsets(&mut self, from: usize, delta: isize) -> Result<()> {
        for slot in from..self.nritems() {
            let old = self.item(slot)?.offset as usize;
            let Some(new) = old.checked_add_signed(delta) else {
                invalid!("item {slot} offset {old} shifted by {delta} underflows");
            };
            self.set_item_offset(slot, new)?;
        }
        Ok(())
    }

    /// Where the bodies of items `[slot..]` end: item `slot - 1`'s body start, or the end of
    /// the data area for slot 0.
    fn body_end_before(&self, slot: usize) -> Result<usize> {
        if slot == 0 {
            Ok(self.data_size())
        } else {
            Ok(self.item(slot - 1)?.offset as usize)
        }
    }

    /// The start of the lowest body (the kernel's leaf_data_end).
    fn data_start(&self) -> Result<usize> {
        self.body_end_before(self.nritems())
    }

    /// Item headers plus bodies.
    pub fn used(&self) -> usize {
        let bodies = self.data_size() - self.data_start().unwrap_or(self.data_size());
        self.nritems() * ITEM_SIZE + bodies
    }

    /// Free bytes between the item headers and the bodies.
    pub fn free_space(&self) -> usize {
        self.data_size().saturating_sub(self.used())
    }

    /// The body of item `slot`.
    pub fn item_body(&self, slot: usize) -> Result<&[u8]> {
        let it = self.item(slot)?;
        slice(
            self.data,
            HEADER_SIZE + it.offset as usize,
            it.size as usize,
        )
    }

    /// The body of item `slot`, to edit in place.
    pub fn item_body_mut(&mut self, slot: usize) -> Result<&mut [u8]> {
        let it = self.item(slot)?;
        let (off, len) = (HEADER_SIZE + it.offset as usize, it.size as usize);
        let have = self.data.len();
        off.checked_add(len)
            .and_then(|end| self.data.get_mut(off..end))
            .ok_or(truncated(off, len, have))
    }

    /// Checks that `first..=last` would sit in order between slot `at - 1` and slot `at`.
    fn check_fits_between(&self, at: usize, first: &Key, last: &Key) -> Result<()> {
        if at > 0 && self.key(at - 1)? >= *first {
            invalid!(
                "key {first:?} not after {:?} at slot {}",
                self.key(at - 1)?,
                at - 1
            );
        }
        if at < self.nritems() && self.key(at)? <= *last {
            invalid!("key {last:?} not before {:?} at slot {at}", self.key(at)?);
        }
        Ok(())
    }

    /// Inserts one item with a zeroed body of `len` bytes at `slot`; returns the body.
    pub fn insert_item(&mut self, slot: usize, key: Key, len: usize) -> Result<&mut [u8]> {
        self.insert_items(slot, &[(key, len)])?;
        self.item_body_mut(slot)
    }

    /// Inserts items (sorted keys, body lengths) at `slot` with zeroed bodies, in one move.
    pub fn insert_items(&mut self, slot: usize, items: &[(Key, usize)]) -> Result<()> {
        let n = self.nritems();
        let (Some(first), Some(last)) = (items.first(), items.last()) else {
            return Ok(());
        };
        if slot > n {
            invalid!("insert at slot {slot} past the {n} items of the leaf");
        }
        if items.windows(2).any(|w| w[0].0 >= w[1].0) {
            invalid!("items to insert are not in strictly increasing key order");
        }
        self.check_fits_between(slot, &first.0, &last.0)?;
        let mut bodies = 0usize;
        for (_, len) in items {
            bodies = bodies
                .checked_add(*len)
                .ok_or(FormatError::invalid("item sizes overflow"))?;
        }
        let need = items
            .len()
            .checked_mul(ITEM_SIZE)
            .and_then(|h| h.checked_add(bodies));
        if need.is_none_or(|need| need > self.free_space()) {
            invalid!(
                "{} items with {bodies} body bytes do not fit in {} free bytes",
                items.len(),
                self.free_space()
            );
        }
        // Bodies of items [slot..] move down to open a gap right below item slot-1's body.
        let boundary = self.body_end_before(slot)?;
        let start = self.data_start()?;
        move_within(
            self.data,
            HEADER_SIZE + start,
            HEADER_SIZE + start - bodies,
            boundary - start,
        )?;
        self.shift_offsets(slot, -(bodies as isize))?;
        let k = items.len();
        move_within(
            self.data,
            HEADER_SIZE + slot * ITEM_SIZE,
            HEADER_SIZE + (slot + k) * ITEM_SIZE,
            (n - slot) * ITEM_SIZE,
        )?;
        let mut end = boundary;
        for (i, (key, len)) in items.iter().enumerate() {
            let off = end - len;
            self.write_item(slot + i, key, off, *len)?;
            zero_range(self.data, HEADER_SIZE + off, *len)?;
            end = off;
        }
        self.set_nritems(n + k)
    }

    /// Removes items `[slot, slot + count)` and closes the gap in the bodies.
    pub fn remove_items(&mut self, slot: usize, count: usize) -> Result<()> {
        let n = self.nritems();
        let end = slot.checked_add(count).filter(|&e| e <= n);
        let Some(end) = end else {
            invalid!("remove {count} items at slot {slot} of {n}");
        };
        if count == 0 {
            return Ok(());
        }
        let boundary = self.body_end_before(slot)?;
        let removed_start = self.item(end - 1)?.offset as usize;
        let gap = boundary - removed_start;
        let start = self.data_start()?;
        move_within(
            self.data,
            HEADER_SIZE + start,
            HEADER_SIZE + start + gap,
            removed_start - start,
        )?;
        self.shift_offsets(end, gap as isize)?;
        move_within(
            self.data,
            HEADER_SIZE + end * ITEM_SIZE,
            HEADER_SIZE + slot * ITEM_SIZE,
            (n - end) * ITEM_SIZE,
        )?;
        self.set_nritems(n - count)
    }

    /// Grows (zero-filled) or shrinks the body of item `slot` at its end: the kernel's
    /// extend_item / truncate_item(from_end).
    pub fn resize_item(&mut self, slot: usize, new_len: usize) -> Result<()> {
        let it = self.item(slot)?;
        let (off, old) = (it.offset as usize, it.size as usize);
        let start = self.data_start()?;
        if new_len > old {
            let grow = new_len - old;
            if grow > self.free_space() {
                invalid!(
                    "growing item {slot} by {grow} bytes, only {} free",
                    self.free_space()
                );
            }
            let boundary = off + old;
            move_within(
                self.data,
                HEADER_SIZE + start,
                HEADER_SIZE + start - grow,
                boundary - start,
            )?;
            self.shift_offsets(slot, -(grow as isize))?;
            zero_range(self.data, HEADER_SIZE + boundary - grow, grow)?;
        } else if new_len < old {
            let shrink = old - new_len;
            move_within(
                self.data,
                HEADER_SIZE + start,
                HEADER_SIZE + start + shrink,
                off + new_len - start,
            )?;
            self.shift_offsets(slot, shrink as isize)?;
        } else {
            return Ok(());
        }
        let it = self.item(slot)?;
        self.write_item(slot, &it.key, it.offset as usize, new_len)
    }

    /// Changes the key of item `slot`; it must stay between its neighbours.
    pub fn set_key(&mut self, slot: usize, key: Key) -> Result<()> {
        let it = self.item(slot)?;
        if slot > 0 && self.key(slot - 1)? >= key {
            invalid!("key {key:?} not after its left neighbour");
        }
        if slot + 1 < self.nritems() && self.key(slot + 1)? <= key {
            invalid!("key {key:?} not before its right neighbour");
        }
        self.write_item(slot, &key, it.offset as usize, it.size as usize)
    }

    /// Moves items `[from..]` to the front of `right` (a split, or pushing items to the right
    /// neighbour). `right` may hold items; their keys must all be greater.
    pub fn move_tail_to(&mut self, from: usize, right: &mut LeafMut) -> Result<()> {
        let n = self.nritems();
        if from > n {
            invalid!("move from slot {from} of {n}");
        }
        if right.data_size() != self.data_size() {
            invalid!("leaves of different sizes");
        }
        let count = n - from;
        if count == 0 {
            return Ok(());
        }
        let rn = right.nritems();
        if rn > 0 && self.key(n - 1)? >= right.key(0)? {
            invalid!("moved keys would not precede the right leaf's keys");
        }
        let boundary = self.body_end_before(from)?;
        let start = self.data_start()?;
        let bodies = boundary - start;
        if count * ITEM_SIZE + bodies > right.free_space() {
            invalid!("{count} items do not fit in the right leaf");
        }
        // Open room at the front of `right`: its bodies go down, its headers right.
        let data = right.data_size();
        let rstart = right.data_start()?;
        move_within(
            right.data,
            HEADER_SIZE + rstart,
            HEADER_SIZE + rstart - bodies,
            data - rstart,
        )?;
        right.shift_offsets(0, -(bodies as isize))?;
        move_within(
            right.data,
            HEADER_SIZE,
            HEADER_SIZE + count * ITEM_SIZE,
            rn * ITEM_SIZE,
        )?;
        copy_between(
            self.data,
            HEADER_SIZE + start,
            right.data,
            HEADER_SIZE + data - bodies,
            bodies,
        )?;
        // The moved bodies keep their layout; they just end at the block end now.
        let lift = data - boundary;
        for i in 0..count {
            let it = self.item(from + i)?;
            right.write_item(i, &it.key, it.offset as usize + lift, it.size as usize)?;
        }
        right.set_nritems(rn + count)?;
        self.set_nritems(from)
    }

    /// Moves items `[0, count)` to the end of `left` (pushing items to the left neighbour, or
    /// merging this leaf into it). `left`'s keys must all be smaller.
    pub fn move_head_to(&mut self, count: usize, left: &mut LeafMut) -> Result<()> {
        let n = self.nritems();
        if count > n {
            invalid!("move {count} of {n} items");
        }
        if left.data_size() != self.data_size() {
            invalid!("leaves of different sizes");
        }
        if count == 0 {
            return Ok(());
        }
        let ln = left.nritems();
        if ln > 0 && left.key(ln - 1)? >= self.key(0)? {
            invalid!("moved keys would not follow the left leaf's keys");
        }
        let data = self.data_size();
        let moved_start = self.item(count - 1)?.offset as usize;
        let bodies = data - moved_start;
        if count * ITEM_SIZE + bodies > left.free_space() {
            invalid!("{count} items do not fit in the left leaf");
        }
        let lstart = left.data_start()?;
        copy_between(
            self.data,
            HEADER_SIZE + moved_start,
            left.data,
            HEADER_SIZE + lstart - bodies,
            bodies,
        )?;
        let drop = data - lstart;
        for i in 0..count {
            let it = self.item(i)?;
            left.write_item(ln + i, &it.key, it.offset as usize - drop, it.size as usize)?;
        }
        left.set_nritems(ln + count)?;
        self.remove_items(0, count)
    }
}

/// A node (level >= 1) open for editing.
pub struct NodeMut<'a> {
    data: &'a mut [u8],
}

impl<'a> NodeMut<'a> {
    /// A view of an existing node: checks the level and that the pointer count fits.
    pub fn new(data: &'a mut [u8]) -> Result<NodeMut<'a>> {
        if data.len() < HEADER_SIZE + KEY_PTR_SIZE || u32::try_from(data.len()).is_err() {
            invalid!("{} bytes is no tree block size", data.len());
        }
        let node = NodeMut { data };
        if u8_at(node.data, LEVEL_OFF)? == 0 {
            invalid!("a leaf is not a node");
        }
        if node.nritems() > node.max_ptrs() {
            invalid!(
                "node claims {} pointers, at most {} fit",
                node.nritems(),
                node.max_ptrs()
            );
        }
        Ok(node)
    }

    /// How many child pointers fit in this block.
    pub fn max_ptrs(&self) -> usize {
        (self.data.len() - HEADER_SIZE) / KEY_PTR_SIZE
    }

    /// Child pointer `slot`.
    pub fn key_ptr(&self, slot: usize) -> Result<KeyPtr> {
        if slot >= self.nritems() {
            invalid!(
                "pointer slot {slot} past the {} pointers of the node",
                self.nritems()
            );
        }
        let off = HEADER_SIZE + slot * KEY_PTR_SIZE;
        Ok(KeyPtr {
            key: Key::parse(self.data, off)?,
            blockptr: u64_at(self.data, off + KEY_SIZE)?,
            generation: u64_at(self.data, off + KEY_SIZE + 8)?,
        })
    }

    /// The key of pointer `slot`.
    pub fn key(&self, slot: usize) -> Result<Key> {
        Ok(self.key_ptr(slot)?.key)
    }

    fn write_ptr(&mut self, slot: usize, ptr: &KeyPtr) -> Result<()> {
        put_at(
            self.data,
            HEADER_SIZE + slot * KEY_PTR_SIZE,
            &ptr.to_bytes(),
        )
    }

    fn check_between(&self, slot: usize, next: usize, key: &Key) -> Result<()> {
        if slot > 0 && self.key(slot - 1)? >= *key {
            invalid!("node key {key:?} not after its left neighbour");
        }
        if next < self.nritems() && self.key(next)? <= *key {
            invalid!("node key {key:?} not before its right neighbour");
        }
        Ok(())
    }

    /// Inserts a child pointer at `slot`.
    pub fn insert_ptr(
        &mut self,
        slot: usize,
        key: Key,
        blockptr: u64,
        generation: u64,
    ) -> Result<()> {
        let n = self.nritems();
        if slot > n || n >= self.max_ptrs() {
            invalid!(
                "insert pointer at slot {slot} of {n} (max {})",
                self.max_ptrs()
            );
        }
        self.check_between(slot, slot, &key)?;
        move_within(
            self.data,
            HEADER_SIZE + slot * KEY_PTR_SIZE,
            HEADER_SIZE + (slot + 1) * KEY_PTR_SIZE,
            (n - slot) * KEY_PTR_SIZE,
        )?;
        self.write_ptr(
            slot,
            &KeyPtr {
                key,
                blockptr,
                generation,
            },
        )?;
        self.set_nritems(n + 1)
    }

    /// Removes child pointer `slot`.
    pub fn remove_ptr(&mut self, slot: usize) -> Result<()> {
        let n = self.nritems();
        if slot >= n {
            invalid!("remove pointer {slot} of {n}");
        }
        move_within(
            self.data,
            HEADER_SIZE + (slot + 1) * KEY_PTR_SIZE,
            HEADER_SIZE + slot * KEY_PTR_SIZE,
            (n - slot - 1) * KEY_PTR_SIZE,
        )?;
        self.set_nritems(n - 1)
    }

    /// Points `slot` at another block (its key stays).
    pub fn set_ptr(&mut self, slot: usize, blockptr: u64, generation: u64) -> Result<()> {
        let p = self.key_ptr(slot)?;
        self.write_ptr(
            slot,
            &KeyPtr {
                blockptr,
                generation,
                ..p
            },
        )
    }

    /// Changes the key of `slot`; it must stay between its neighbours.
    pub fn set_key(&mut self, slot: usize, key: Key) -> Result<()> {
        let p = self.key_ptr(slot)?;
        self.check_between(slot, slot + 1, &key)?;
        self.write_ptr(slot, &KeyPtr { key, ..p })
    }

    /// Moves pointers `[from..]` to the front of `right`, whose keys must all be greater.
    pub fn move_tail_to(&mut self, from: usize, right: &mut NodeMut) -> Result<()> {
        let n = self.nritems();
        if from > n {
            invalid!("move from pointer {from} of {n}");
        }
        let count = n - from;
        if count == 0 {
            return Ok(());
        }
        let rn = right.nritems();
        if rn + count > right.max_ptrs() {
            invalid!("{count} pointers do not fit in the right node");
        }
        if rn > 0 && self.key(n - 1)? >= right.key(0)? {
            invalid!("moved keys would not precede the right node's keys");
        }
        move_within(
            right.data,
            HEADER_SIZE,
            HEADER_SIZE + count * KEY_PTR_SIZE,
            rn * KEY_PTR_SIZE,
        )?;
        copy_between(
            self.data,
            HEADER_SIZE + from * KEY_PTR_SIZE,
            right.data,
            HEADER_SIZE,
            count * KEY_PTR_SIZE,
        )?;
        right.set_nritems(rn + count)?;
        self.set_nritems(from)
    }

    /// Moves pointers `[0, count)` to the end of `left`, whose keys must all be smaller.
    pub fn move_head_to(&mut self, count: usize, left: &mut NodeMut) -> Result<()> {
        let n = self.nritems();
        if count > n {
            invalid!("move {count} of {n} pointers");
        }
        if count == 0 {
            return Ok(());
        }
        let ln = left.nritems();
        if ln + count > left.max_ptrs() {
            invalid!("{count} pointers do not fit in the left node");
        }
        if ln > 0 && left.key(ln - 1)? >= self.key(0)? {
            invalid!("moved keys would not follow the left node's keys");
        }
        copy_between(
            self.data,
            HEADER_SIZE,
            left.data,
            HEADER_SIZE + ln * KEY_PTR_SIZE,
            count * KEY_PTR_SIZE,
        )?;
        move_within(
            self.data,
            HEADER_SIZE + count * KEY_PTR_SIZE,
            HEADER_SIZE,
            (n - count) * KEY_PTR_SIZE,
        )?;
        left.set_nritems(ln + count)?;
        self.set_nritems(n - count)
    }
}

#[cfg(test)]
#[path = "tree_mut_tests.rs"]
mod tests;

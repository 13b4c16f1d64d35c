//! An in-memory `BlockStore` for tests: blocks in hash maps, a bump allocator that never
//! reuses an address, and the books to prove the write side leaks nothing, frees nothing
//! twice and never edits a block of an earlier transaction.

use super::search::BlockSource;
use super::store::{finalize_block, BlockStore};
use crate::error::{Error, Result};
use crate::io::disk_io::Block;
use oleo_format::key::Key;
use oleo_format::validate::{check_tree_block, Expect, FsContext};
use oleo_format::{CsumType, TreeBlock};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

pub const FSID: [u8; 16] = [0x5a; 16];
pub const CHUNK_UUID: [u8; 16] = [0xc3; 16];
const FIRST_BYTENR: u64 = 1 << 24;

pub struct MemStore {
    pub nodesize: u32,
    pub transid: u64,
    pub csum: CsumType,
    /// Finalized blocks of earlier transactions. Freed ones stay (pinned until a real
    /// commit would release them), so older roots remain readable.
    pub committed: HashMap<u64, Arc<[u8]>>,
    pub dirty: HashMap<u64, Vec<u8>>,
    /// Allocated (or committed) and not freed: exactly what the trees may reach.
    pub live: HashSet<u64>,
    pub freed: Vec<u64>,
    pub allocs: u64,
    pub cows: u64,
    /// Rules the write side broke that the store can see.
    pub violations: Vec<String>,
    next: u64,
}

impl MemStore {
    pub fn new(nodesize: u32, transid: u64) -> MemStore {
        MemStore {
            nodesize,
            transid,
            csum: CsumType::Crc32c,
            committed: HashMap::new(),
            dirty: HashMap::new(),
            live: HashSet::new(),
            freed: Vec::new(),
            allocs: 0,
            cows: 0,
            violations: Vec::new(),
            next: FIRST_BYTENR,
        }
    }

    pub fn ctx(&self) -> FsContext {
        FsContext {
            nodesize: self.nodesize,
            sectorsize: self.nodesize.min(4096),
            csum_type: self.csum,
            metadata_fsid: FSID,
            super_generation: self.transid - 1,
        }
    }

    /// Ends the transaction: every dirty block is finalized and becomes committed.
    pub fn commit(&mut self) {
        for (bytenr, mut block) in std::mem::take(&mut self.dirty) {
            if let Err(e) = finalize_block(&mut block, self.csum) {
                self.violations.push(format!("finalize {bytenr}: {e}"));
            }
            self.committed.insert(bytenr, block.into());
        }
        self.transid += 1;
    }

    fn level_of(&self, bytenr: u64) -> Option<u8> {
        let block: &[u8] = match self.dirty.get(&bytenr) {
            Some(b) => b,
            None => self.committed.get(&bytenr)?,
        };
        TreeBlock::new(block).ok().map(|tb| tb.level())
    }
}

impl BlockSource for MemStore {
    fn read_tree_block(
        &self,
        bytenr: u64,
        level: Option<u8>,
        generation: Option<u64>,
        first_key: Option<Key>,
    ) -> Result<Block> {
        let expect = Expect {
            bytenr,
            level,
            generation,
            first_key,
        };
        if let Some(block) = self.dirty.get(&bytenr) {
            // Not checksummed yet (`check_tree` checks finalized copies): only what the
            // pointer promises.
            check_promises(block, &expect)?;
            return Ok(block.as_slice().into());
        }
        let block = self
            .committed
            .get(&bytenr)
            .ok_or_else(|| Error::corrupt(bytenr, "no such block"))?;
        check_tree_block(block, &self.ctx(), &expect)
            .map_err(|e| Error::corrupt(bytenr, e.to_string()))?;
        Ok(block.clone())
    }
}

impl BlockStore for MemStore {
    fn nodesize(&self) -> u32 {
        self.nodesize
    }

    fn transid(&self) -> u64 {
        self.transid
    }

    fn fsid(&self) -> [u8; 16] {
        FSID
    }

    fn chunk_tree_uuid(&self) -> [u8; 16] {
        CHUNK_UUID
    }

    fn alloc(&mut self, _owner: u64, _level: u8, _hint: u64) -> Result<u64> {
        let bytenr = self.next;
        self.next += u64::from(self.nodesize);
        self.allocs += 1;
        if !self.live.insert(bytenr) {
            self.violations.push(format!("{bytenr} allocated twice"));
        }
        Ok(bytenr)
    }

    fn free(&mut self, bytenr: u64, _tree: u64, level: u8) -> Result<()> {
        if self.level_of(bytenr) != Some(level) {
            self.violations.push(format!(
                "free of {bytenr} at level {level}, block says {:?}",
                self.level_of(bytenr)
            ));
        }
        if !self.live.remove(&bytenr) {
            self.violations
                .push(format!("free of {bytenr}, which is not live"));
        }
        self.dirty.remove(&bytenr);
        self.freed.push(bytenr);
        Ok(())
    }

    fn on_cow(&mut self, _tree: u64, old: &[u8], _new_bytenr: u64) -> Result<()> {
        self.cows += 1;
        let old = TreeBlock::new(old).map(|tb| tb.bytenr()).unwrap_or(0);
        if self.dirty.contains_key(&old) {
            self.violations
                .push(format!("copied {old}, which is already dirty"));
        }
        Ok(())
    }

    fn dirty_mut(&mut self, bytenr: u64) -> Option<&mut [u8]> {
        self.dirty.get_mut(&bytenr).map(|b| b.as_mut_slice())
    }

    fn insert_dirty(&mut self, bytenr: u64, block: Vec<u8>) -> Result<()> {
        if self.committed.contains_key(&bytenr) {
            self.violations
                .push(format!("{bytenr} of an earlier transaction rewritten"));
        }
        if !self.live.contains(&bytenr) {
            self.violations
                .push(format!("{bytenr} made dirty but not allocated"));
        }
        if block.len() != self.nodesize as usize {
            self.violations
                .push(format!("{bytenr} is {} bytes", block.len()));
        }
        self.dirty.insert(bytenr, block);
        Ok(())
    }
}

fn check_promises(block: &[u8], expect: &Expect) -> Result<()> {
    let bad = |what: &str| {
        Error::corrupt(
            expect.bytenr,
            format!("dirty block: {what} differs from its pointer"),
        )
    };
    let tb = TreeBlock::new(block).map_err(|e| Error::corrupt(expect.bytenr, e.to_string()))?;
    if tb.bytenr() != expect.bytenr {
        return Err(bad("bytenr"));
    }
    if expect.level.is_some_and(|l| l != tb.level()) {
        return Err(bad("level"));
    }
    if expect.generation.is_some_and(|g| g != tb.generation()) {
        return Err(bad("generation"));
    }
    if let Some(first) = expect.first_key {
        if tb.nritems() > 0 && tb.key_at(0).ok() != Some(first) {
            return Err(bad("first key"));
        }
    }
    Ok(())
}

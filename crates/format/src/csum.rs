//! Checksums: the four algorithms a filesystem may use, and the crc32c-based name hashes.

use crate::error::{FormatError, Result};
use blake2::digest::consts::U32;
use blake2::{Blake2b, Digest};

/// Every checksum field on disk is this wide; shorter digests are zero-padded.
pub const CSUM_FIELD_SIZE: usize = 32;

/// The checksum algorithm of a filesystem (the superblock's `csum_type`), used for the
/// superblock, every tree block and every data sector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CsumType {
    /// 0: CRC-32C (Castagnoli), 4 bytes. The mkfs default.
    Crc32c,
    /// 1: XXH64 with seed 0, 8 bytes.
    Xxhash64,
    /// 2: SHA-256, 32 bytes.
    Sha256,
    /// 3: BLAKE2b with a 32-byte digest (BLAKE2b-256), unkeyed.
    Blake2b,
}

impl CsumType {
    /// The algorithm of an on-disk `csum_type` value; [`FormatError::UnknownCsumType`] for
    /// others.
    pub fn from_raw(raw: u16) -> Result<CsumType> {
        match raw {
            0 => Ok(CsumType::Crc32c),
            1 => Ok(CsumType::Xxhash64),
            2 => Ok(CsumType::Sha256),
            3 => Ok(CsumType::Blake2b),
            other => Err(FormatError::UnknownCsumType(other)),
        }
    }

    /// The on-disk `csum_type` value.
    pub fn raw(self) -> u16 {
        match self {
            CsumType::Crc32c => 0,
            CsumType::Xxhash64 => 1,
            CsumType::Sha256 => 2,
            CsumType::Blake2b => 3,
        }
    }

    /// Digest length in bytes (the per-sector size in the csum tree).
    pub fn size(self) -> usize {
        match self {
            CsumType::Crc32c => 4,
            CsumType::Xxhash64 => 8,
            CsumType::Sha256 | CsumType::Blake2b => 32,
        }
    }

    /// The name btrfs-progs uses (`crc32c`, `xxhash64`, `sha256`, `blake2b`).
    pub fn name(self) -> &'static str {
        match self {
            CsumType::Crc32c => "crc32c",
            CsumType::Xxhash64 => "xxhash64",
            CsumType::Sha256 => "sha256",
            CsumType::Blake2b => "blake2b",
        }
    }

    /// The type a name given to mkfs names: btrfs-progs' names and its short ones
    /// (`xxhash`, `blake2`), any case.
    pub fn parse(name: &str) -> Option<CsumType> {
        Some(match name.to_ascii_lowercase().as_str() {
            "crc32c" => CsumType::Crc32c,
            "xxhash" | "xxhash64" => CsumType::Xxhash64,
            "sha256" => CsumType::Sha256,
            "blake2" | "blake2b" => CsumType::Blake2b,
            _ => return None,
        })
    }

    /// The digest of `data`, zero-padded to the 32-byte on-disk field.
    pub fn compute(self, data: &[u8]) -> [u8; CSUM_FIELD_SIZE] {
        let mut out = [0u8; CSUM_FIELD_SIZE];
        match self {
            // crc-fast: folds with VPCLMULQDQ where the CPU has it (several times the
            // crc32 instruction's speed on a data sector).
            CsumType::Crc32c => out[..4].copy_from_slice(
                &(crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, data) as u32)
                    .to_le_bytes(),
            ),
            CsumType::Xxhash64 => {
                out[..8].copy_from_slice(&xxhash_rust::xxh64::xxh64(data, 0).to_le_bytes())
            }
            CsumType::Sha256 => out.copy_from_slice(&sha2::Sha256::digest(data)),
            CsumType::Blake2b => out.copy_from_slice(&Blake2b::<U32>::digest(data)),
        }
        out
    }

    /// True when the digest of `data` equals the first `size()` bytes of `expected`.
    pub fn verify(self, data: &[u8], expected: &[u8]) -> bool {
        let n = self.size();
        expected.len() >= n && self.compute(data)[..n] == expected[..n]
    }
}

/// The kernel's bare crc32c register update (no pre/post inversion), seeded.
fn crc32c_raw(seed: u32, data: &[u8]) -> u32 {
    !crc32c::crc32c_append(!seed, data)
}

/// Hash of a directory entry or xattr name: the DIR_ITEM / XATTR_ITEM key offset.
pub fn name_hash(name: &[u8]) -> u64 {
    crc32c_raw(0xFFFF_FFFE, name) as u64
}

/// The sequence number of an EXTENT_DATA_REF: its keyed item's offset, and the order of
/// inline data refs (descending). Note the shift by 31, not 32.
pub fn extent_data_ref_hash(root: u64, objectid: u64, offset: u64) -> u64 {
    let high = crc32c_raw(0xFFFF_FFFF, &root.to_le_bytes());
    let low = crc32c_raw(0xFFFF_FFFF, &objectid.to_le_bytes());
    let low = crc32c_raw(low, &offset.to_le_bytes());
    ((high as u64) << 31) ^ (low as u64)
}

/// INODE_EXTREF key offset for `name` in directory `parent`.
pub fn extref_hash(parent: u64, name: &[u8]) -> u64 {
    crc32c_raw(parent as u32, name) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back() {
        for t in [
            CsumType::Crc32c,
            CsumType::Xxhash64,
            CsumType::Sha256,
            CsumType::Blake2b,
        ] {
            assert_eq!(CsumType::parse(t.name()), Some(t));
        }
        assert_eq!(CsumType::parse("XXHASH"), Some(CsumType::Xxhash64));
        assert_eq!(CsumType::parse("blake2"), Some(CsumType::Blake2b));
        assert_eq!(CsumType::parse("md5"), None);
    }

    #[test]
    fn crc32c_check_value() {
        assert_eq!(crc32c::crc32c(b"123456789"), 0xE306_9283);
        let c = CsumType::Crc32c.compute(b"123456789");
        assert_eq!(c[..4], 0xE306_9283u32.to_le_bytes());
        let long: Vec<u8> = (0..10_000u32).map(|i| (i * 31 + 7) as u8).collect();
        for n in [0, 1, 15, 64, 255, 4096, 10_000] {
            let d = &long[..n];
            assert_eq!(
                CsumType::Crc32c.compute(d)[..4],
                crc32c::crc32c(d).to_le_bytes()
            );
        }
    }

    #[test]
    fn name_hashes_match_real_images() {
        // Values read from kernel-written images (format digest 4.5).
        assert_eq!(name_hash(b"default"), 2378154706);
        assert_eq!(name_hash(b"small.txt"), 474883676);
        assert_eq!(name_hash(b"user.test"), 103394969);
    }

    #[test]
    fn extent_data_ref_hash_matches_real_images() {
        // Format digest 4.10: inline data refs of one extent shared by trees 257 and 5.
        assert_eq!(extent_data_ref_hash(257, 258, 0), 0x29740e4d3bf5f519);
        assert_eq!(extent_data_ref_hash(5, 258, 0), 0x0dfb591fbbf5f519);
    }

    #[test]
    fn digest_sizes() {
        for (t, n) in [
            (CsumType::Crc32c, 4),
            (CsumType::Xxhash64, 8),
            (CsumType::Sha256, 32),
            (CsumType::Blake2b, 32),
        ] {
            assert_eq!(t.size(), n);
            assert_eq!(CsumType::from_raw(t.raw()).unwrap(), t);
            let d = t.compute(b"abc");
            assert!(d[n..].iter().all(|&b| b == 0));
            assert!(t.verify(b"abc", &d));
            assert!(!t.verify(b"abd", &d));
        }
        assert!(CsumType::from_raw(4).is_err());
    }
}

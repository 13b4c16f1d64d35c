//! What a target already holds: the signatures mkfs looks for before it overwrites
//! anything (as mkfs.btrfs does through libblkid). Each is a magic number at a fixed place;
//! the description names the filesystem and its label where it has one.

/// Reads `len` bytes at `offset`, None past the end.
pub(crate) type ReadAt<'a> = dyn Fn(u64, usize) -> Option<Vec<u8>> + 'a;

/// The first signature found on the target, described for an error message
/// ("an ext4 filesystem (label `data`)").
pub(crate) fn identify(read: &ReadAt<'_>) -> Option<String> {
    let probes: [fn(&ReadAt<'_>) -> Option<String>; 10] = [
        btrfs,
        ext,
        xfs,
        luks,
        swap,
        iso9660,
        squashfs,
        f2fs,
        fat_or_ntfs,
        partition_table,
    ];
    probes.iter().find_map(|p| p(read))
}

fn at(read: &ReadAt<'_>, offset: u64, magic: &[u8]) -> bool {
    read(offset, magic.len()).is_some_and(|b| b == magic)
}

fn label(bytes: &[u8]) -> Option<String> {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    let s = String::from_utf8_lossy(&bytes[..end]).trim().to_string();
    (!s.is_empty()).then_some(s)
}

fn with_label(what: &str, label: Option<String>) -> String {
    match label {
        Some(l) => format!("{what} (label `{l}`)"),
        None => what.to_string(),
    }
}

fn btrfs(read: &ReadAt<'_>) -> Option<String> {
    // The primary superblock, then the backups at 64 MiB and 256 GiB: a filesystem whose
    // primary was wiped can still be recovered from them.
    for (i, sb) in [64u64 << 10, 64 << 20, 256 << 30].into_iter().enumerate() {
        if at(read, sb + 0x40, b"_BHRfS_M") {
            let l = read(sb + 0x12b, 256).and_then(|b| label(&b));
            let what = if i == 0 {
                "a btrfs filesystem".to_string()
            } else {
                format!("a btrfs superblock copy at {sb} bytes")
            };
            return Some(with_label(&what, l));
        }
    }
    None
}

fn ext(read: &ReadAt<'_>) -> Option<String> {
    let sb = read(1024, 256)?;
    if sb[0x38..0x3a] != [0x53, 0xef] {
        return None;
    }
    let le = |o: usize| u32::from_le_bytes(sb[o..o + 4].try_into().unwrap());
    let (compat, incompat) = (le(0x5c), le(0x60));
    // extents, 64bit or flex_bg make it ext4; a journal alone ext3.
    let kind = if incompat & (0x40 | 0x80 | 0x200) != 0 {
        "ext4"
    } else if compat & 0x4 != 0 {
        "ext3"
    } else {
        "ext2"
    };
    Some(with_label(
        &format!("an {kind} filesystem"),
        label(&sb[0x78..0x88]),
    ))
}

fn xfs(read: &ReadAt<'_>) -> Option<String> {
    at(read, 0, b"XFSB")
        .then(|| with_label("an xfs filesystem", read(0x6c, 12).and_then(|b| label(&b))))
}

fn luks(read: &ReadAt<'_>) -> Option<String> {
    at(read, 0, b"LUKS\xba\xbe").then(|| "a LUKS encrypted volume".to_string())
}

fn swap(read: &ReadAt<'_>) -> Option<String> {
    // The signature ends the first page; pages of 4 KiB to 64 KiB.
    [4096u64, 8192, 16384, 65536].into_iter().find_map(|page| {
        (at(read, page - 10, b"SWAPSPACE2") || at(read, page - 10, b"SWAP-SPACE"))
            .then(|| "swap space".to_string())
    })
}

fn iso9660(read: &ReadAt<'_>) -> Option<String> {
    at(read, 32769, b"CD001").then(|| "an ISO 9660 filesystem".to_string())
}

fn squashfs(read: &ReadAt<'_>) -> Option<String> {
    at(read, 0, b"hsqs").then(|| "a squashfs filesystem".to_string())
}

fn f2fs(read: &ReadAt<'_>) -> Option<String> {
    at(read, 1024, &0xf2f5_2010u32.to_le_bytes()).then(|| "an f2fs filesystem".to_string())
}

fn fat_or_ntfs(read: &ReadAt<'_>) -> Option<String> {
    let boot = read(0, 512)?;
    if boot[510..512] != [0x55, 0xaa] {
        return None;
    }
    if &boot[3..11] == b"NTFS    " {
        return Some("an NTFS filesystem".into());
    }
    if &boot[3..11] == b"EXFAT   " {
        return Some("an exFAT filesystem".into());
    }
    if &boot[82..87] == b"FAT32" {
        return Some(with_label("a FAT32 filesystem", label(&boot[71..82])));
    }
    if &boot[54..59] == b"FAT12" || &boot[54..59] == b"FAT16" {
        return Some(with_label("a FAT filesystem", label(&boot[43..54])));
    }
    None
}

fn partition_table(read: &ReadAt<'_>) -> Option<String> {
    if at(read, 512, b"EFI PART") {
        return Some("a GPT partition table".into());
    }
    let boot = read(0, 512)?;
    let used = (0..4).any(|i| boot[446 + i * 16 + 4] != 0);
    (boot[510..512] == [0x55, 0xaa] && used).then(|| "an MBR partition table".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(patches: &[(u64, &[u8])]) -> Vec<u8> {
        let mut v = vec![0u8; 1 << 20];
        for (o, b) in patches {
            v[*o as usize..*o as usize + b.len()].copy_from_slice(b);
        }
        v
    }

    fn probe(v: &[u8]) -> Option<String> {
        identify(&|o: u64, len: usize| {
            let (o, end) = (o as usize, o as usize + len);
            (end <= v.len()).then(|| v[o..end].to_vec())
        })
    }

    #[test]
    fn zeros_hold_nothing() {
        assert_eq!(probe(&image(&[])), None);
    }

    #[test]
    fn names_what_it_finds() {
        let mut ext4 = vec![0u8; 256];
        ext4[0x38..0x3a].copy_from_slice(&[0x53, 0xef]);
        ext4[0x60] = 0x40;
        ext4[0x78..0x7c].copy_from_slice(b"data");
        assert_eq!(
            probe(&image(&[(1024, &ext4)])).as_deref(),
            Some("an ext4 filesystem (label `data`)")
        );
        assert_eq!(
            probe(&image(&[(0x10040, b"_BHRfS_M"), (0x1012b, b"vol")])).as_deref(),
            Some("a btrfs filesystem (label `vol`)")
        );
        assert_eq!(
            probe(&image(&[(0, b"XFSB")])).as_deref(),
            Some("an xfs filesystem")
        );
        assert_eq!(
            probe(&image(&[(4086, b"SWAPSPACE2")])).as_deref(),
            Some("swap space")
        );
        assert_eq!(
            probe(&image(&[(510, &[0x55, 0xaa]), (450, &[0x83])])).as_deref(),
            Some("an MBR partition table")
        );
    }
}

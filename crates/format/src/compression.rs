//! Compressed extents: zlib, LZO (with btrfs's per-sector framing) and zstd, both ways.
//! Decoding never exceeds the caller's bound, so a hostile stream cannot blow up memory.

use crate::bytes::u32_at;
use crate::error::{FormatError, Result};
use crate::items::Compression;
use std::io::Read;

fn err(e: impl std::fmt::Display) -> FormatError {
    FormatError::Decompress(e.to_string())
}

/// Decodes `input` into at most `max_out` bytes. A stream that decodes to fewer bytes is
/// returned as is (the caller zero-fills, as the kernel does).
pub fn decompress(
    kind: Compression,
    input: &[u8],
    max_out: usize,
    sectorsize: usize,
) -> Result<Vec<u8>> {
    match kind {
        Compression::None => Ok(input[..input.len().min(max_out)].to_vec()),
        Compression::Zlib => read_bounded(flate2::read::ZlibDecoder::new(input), max_out),
        Compression::Zstd => {
            let mut dec = zstd::stream::read::Decoder::with_buffer(input).map_err(err)?;
            // The kernel writes windows of at most 2^17 bytes and refuses larger ones; without
            // this limit a hostile frame header makes the decoder allocate up to 128 MiB.
            dec.window_log_max(ZSTD_BTRFS_MAX_WINDOWLOG).map_err(err)?;
            // Trailing zero padding after the frame is normal; the decoder stops at frame end.
            read_bounded(dec.single_frame(), max_out)
        }
        Compression::Lzo => lzo_decompress(input, max_out, sectorsize),
    }
}

/// The kernel's ZSTD_BTRFS_MAX_WINDOWLOG.
const ZSTD_BTRFS_MAX_WINDOWLOG: u32 = 17;

fn read_bounded(mut r: impl Read, max_out: usize) -> Result<Vec<u8>> {
    let mut out = vec![0u8; max_out];
    let mut filled = 0;
    while filled < max_out {
        match r.read(&mut out[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(err(e)),
        }
    }
    out.truncate(filled);
    Ok(out)
}

/// btrfs LZO framing: a u32 total length, then per input sector a u32 segment length and an
/// independent LZO1X block; a segment header never straddles a sector boundary.
fn lzo_decompress(input: &[u8], max_out: usize, sectorsize: usize) -> Result<Vec<u8>> {
    // The framing is per sector: a zero sectorsize would divide by zero, a huge one allocate.
    if !(4096..=65536).contains(&sectorsize) {
        return Err(err(format!("lzo with sectorsize {sectorsize}")));
    }
    let total = u32_at(input, 0)? as usize;
    if total > input.len() || total < 4 {
        return Err(err(format!(
            "lzo total length {total} exceeds the {} stored bytes",
            input.len()
        )));
    }
    let mut out = Vec::with_capacity(max_out);
    let mut seg_buf = vec![0u8; sectorsize];
    let mut off = 4;
    while off < total && out.len() < max_out {
        let to_boundary = sectorsize - off % sectorsize;
        if to_boundary < 4 {
            off += to_boundary;
            if off >= total {
                break;
            }
        }
        let seg_len = u32_at(input, off)? as usize;
        off += 4;
        let seg = input
            .get(off..off.saturating_add(seg_len))
            .filter(|_| off + seg_len <= total)
            .ok_or_else(|| {
                err(format!(
                    "lzo segment of {seg_len} bytes at {off} overruns the stream"
                ))
            })?;
        let n = lzokay::decompress::decompress(seg, &mut seg_buf)
            .map_err(|e| err(format!("lzo: {e:?}")))?;
        let take = n.min(max_out - out.len());
        out.extend_from_slice(&seg_buf[..take]);
        off += seg_len;
    }
    Ok(out)
}

/// Largest input of one compressed extent (the kernel's BTRFS_MAX_UNCOMPRESSED).
pub const MAX_UNCOMPRESSED: usize = 128 << 10;

/// Default, lowest and highest level of each algorithm as the kernel's mount options take
/// them (LZO has no levels).
pub fn level_range(kind: Compression) -> (i32, i32, i32) {
    match kind {
        Compression::Zlib => (3, 1, 9),
        Compression::Zstd => (3, -15, 15),
        Compression::Lzo | Compression::None => (0, 0, 0),
    }
}

/// `level` as the kernel applies it to `kind`: 0 is the default, others are clamped.
pub fn effective_level(kind: Compression, level: i32) -> i32 {
    let (default, lo, hi) = level_range(kind);
    if level == 0 {
        default
    } else {
        level.clamp(lo, hi)
    }
}

thread_local! {
    static ZSTD: std::cell::RefCell<Option<zstd::bulk::Compressor<'static>>> =
        const { std::cell::RefCell::new(None) };
    static LZO_DICT: std::cell::RefCell<Option<Box<lzokay::compress::Dict>>> =
        const { std::cell::RefCell::new(None) };
}

/// Encodes `input` (at most MAX_UNCOMPRESSED bytes) the way the kernel frames `kind` on
/// disk. Whether the result is worth keeping is the caller's call.
pub fn compress(kind: Compression, level: i32, input: &[u8], sectorsize: usize) -> Result<Vec<u8>> {
    let level = effective_level(kind, level);
    match kind {
        Compression::None => Ok(input.to_vec()),
        Compression::Zlib => {
            use std::io::Write;
            let mut enc = flate2::write::ZlibEncoder::new(
                Vec::with_capacity(input.len() / 2),
                flate2::Compression::new(level as u32),
            );
            enc.write_all(input).map_err(err)?;
            enc.finish().map_err(err)
        }
        Compression::Zstd => ZSTD.with(|c| {
            let mut c = c.borrow_mut();
            if c.is_none() {
                let mut z = zstd::bulk::Compressor::new(level).map_err(err)?;
                // Old kernels refuse windows over 2^17 (ZSTD_BTRFS_MAX_WINDOWLOG).
                z.set_parameter(zstd::zstd_safe::CParameter::WindowLog(
                    ZSTD_BTRFS_MAX_WINDOWLOG,
                ))
                .map_err(err)?;
                *c = Some(z);
            }
            let z = c.as_mut().expect("just made");
            z.set_compression_level(level).map_err(err)?;
            z.set_parameter(zstd::zstd_safe::CParameter::WindowLog(
                ZSTD_BTRFS_MAX_WINDOWLOG,
            ))
            .map_err(err)?;
            z.compress(input).map_err(err)
        }),
        Compression::Lzo => lzo_compress(input, sectorsize),
    }
}

/// btrfs LZO framing (see `lzo_decompress`): one independent LZO1X block per input sector,
/// a segment header moved to the next sector boundary when fewer than 4 bytes remain.
fn lzo_compress(input: &[u8], sectorsize: usize) -> Result<Vec<u8>> {
    if !(4096..=65536).contains(&sectorsize) {
        return Err(err(format!("lzo with sectorsize {sectorsize}")));
    }
    LZO_DICT.with(|d| {
        let mut d = d.borrow_mut();
        let dict = d.get_or_insert_with(lzokay::compress::Dict::new);
        let mut out = Vec::with_capacity(input.len() / 2 + 64);
        out.extend_from_slice(&[0; 4]);
        let mut seg = vec![0u8; lzokay::compress::compress_worst_size(sectorsize)];
        for sector in input.chunks(sectorsize) {
            let n = lzokay::compress::compress_no_alloc(sector, &mut seg, dict)
                .map_err(|e| err(format!("lzo: {e:?}")))?;
            let to_boundary = sectorsize - out.len() % sectorsize;
            if to_boundary < 4 {
                out.resize(out.len() + to_boundary, 0);
            }
            out.extend_from_slice(&(n as u32).to_le_bytes());
            out.extend_from_slice(&seg[..n]);
        }
        let total = out.len() as u32;
        out[..4].copy_from_slice(&total.to_le_bytes());
        Ok(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn zlib_roundtrip_and_bound() {
        let data: Vec<u8> = (0..20000u32).map(|i| (i % 7) as u8).collect();
        let mut enc = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::new(3));
        enc.write_all(&data).unwrap();
        let mut z = enc.finish().unwrap();
        z.resize(z.len() + 100, 0); // sector padding
        assert_eq!(
            decompress(Compression::Zlib, &z, 20000, 4096).unwrap(),
            data
        );
        assert_eq!(
            decompress(Compression::Zlib, &z, 100, 4096).unwrap(),
            &data[..100]
        );
    }

    #[test]
    fn zstd_roundtrip_with_padding() {
        let data = vec![42u8; 131072];
        // Like the kernel: the size is pledged, so the window fits ZSTD_BTRFS_MAX_WINDOWLOG.
        let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        enc.set_pledged_src_size(Some(data.len() as u64)).unwrap();
        enc.write_all(&data).unwrap();
        let mut z = enc.finish().unwrap();
        z.resize(4096, 0);
        assert_eq!(
            decompress(Compression::Zstd, &z, 131072, 4096).unwrap(),
            data
        );
    }

    #[test]
    fn zstd_window_larger_than_the_kernels_is_refused() {
        let data = vec![7u8; 1 << 20];
        let mut enc = zstd::stream::write::Encoder::new(Vec::new(), 19).unwrap();
        enc.window_log(22).unwrap();
        enc.write_all(&data).unwrap();
        let z = enc.finish().unwrap();
        assert!(decompress(Compression::Zstd, &z, 1 << 20, 4096).is_err());
    }

    #[test]
    fn every_encoder_roundtrips() {
        let mut data: Vec<u8> = (0..131072u32).map(|i| (i / 7 % 251) as u8).collect();
        data[5000..9000].fill(0);
        for kind in [Compression::Zlib, Compression::Lzo, Compression::Zstd] {
            for len in [1usize, 100, 4095, 4096, 4097, 70000, 131072] {
                let mut z = compress(kind, 0, &data[..len], 4096).unwrap();
                z.resize(z.len().next_multiple_of(4096), 0);
                assert_eq!(
                    decompress(kind, &z, len, 4096).unwrap(),
                    &data[..len],
                    "{kind:?} {len}"
                );
            }
        }
    }

    #[test]
    fn lzo_headers_never_straddle_a_sector() {
        // Incompressible sectors make segments a little longer than a sector, so headers
        // land at every distance from the boundaries.
        let mut x = 0x9e3779b97f4a7c15u64;
        let data: Vec<u8> = (0..131072)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect();
        let z = compress(Compression::Lzo, 0, &data, 4096).unwrap();
        let mut off = 4;
        let total = u32_at(&z, 0).unwrap() as usize;
        assert_eq!(total, z.len());
        while off < total {
            if 4096 - off % 4096 < 4 {
                off = off.next_multiple_of(4096);
            }
            assert!(off % 4096 <= 4092);
            off += 4 + u32_at(&z, off).unwrap() as usize;
        }
        assert_eq!(
            decompress(Compression::Lzo, &z, 131072, 4096).unwrap(),
            data
        );
    }

    #[test]
    fn levels_as_the_kernel_takes_them() {
        assert_eq!(effective_level(Compression::Zlib, 0), 3);
        assert_eq!(effective_level(Compression::Zlib, 12), 9);
        assert_eq!(effective_level(Compression::Zstd, 20), 15);
        assert_eq!(effective_level(Compression::Zstd, -20), -15);
        assert_eq!(effective_level(Compression::Lzo, 3), 0);
    }

    #[test]
    fn garbage_does_not_panic() {
        for kind in [Compression::Zlib, Compression::Zstd, Compression::Lzo] {
            for input in [
                &[][..],
                &[0xff; 3][..],
                &[1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff][..],
                &[0x28, 0xb5, 0x2f, 0xfd, 0, 0][..],
            ] {
                let _ = decompress(kind, input, 4096, 4096);
            }
        }
    }
}

//! Decoding compressed extents: zlib, LZO (with btrfs's per-sector framing) and zstd.
//! Output never exceeds the caller's bound, so a hostile stream cannot blow up memory.

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

//! Parity of btrfs RAID5 and RAID6 rows, and rebuilding lost stripes from it.
//!
//! A row (full stripe) is `n` data stripes `D_0 .. D_{n-1}` followed by P and, for RAID6, Q.
//! The data stripes are in logical order (btrfs sorts a row's stripes by logical address
//! and puts P, then Q, last, whatever device they sit on). P is the XOR of the data
//! stripes; Q is the Reed-Solomon syndrome `sum g^i * D_i` computed bytewise in GF(2^8)
//! with the polynomial `x^8 + x^4 + x^3 + x^2 + 1` (0x11d) and generator `g = 2`. This is
//! the same math as the kernel's `lib/raid6` (Linux md RAID6), which btrfs uses, so rows
//! written by the kernel rebuild here and the other way round. Pure functions, no IO.

use std::fmt;

/// Why a row cannot be rebuilt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RebuildError {
    /// More distinct stripes lost than the row has parity stripes: the data is gone.
    TooManyLost {
        /// How many distinct stripes were listed as lost.
        lost: usize,
        /// How many parity stripes the row has.
        parity: usize,
    },
    /// A lost stripe index that is not in the row.
    BadIndex(usize),
    /// Stripes of different lengths, fewer stripes than `nparity + 1`, or (RAID6) more
    /// than 255 data stripes, past which `g^i` repeats and Q no longer tells them apart.
    Lengths,
    /// A parity count other than 1 (RAID5) or 2 (RAID6).
    BadParity(usize),
}

impl fmt::Display for RebuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RebuildError::TooManyLost { lost, parity } => write!(
                f,
                "{lost} stripes of the row are lost but it has only {parity} parity stripe(s)"
            ),
            RebuildError::BadIndex(i) => write!(f, "lost stripe index {i} is not in the row"),
            RebuildError::Lengths => write!(
                f,
                "row stripes differ in length or their count does not fit the parity"
            ),
            RebuildError::BadParity(n) => write!(
                f,
                "{n} parity stripes per row: only 1 (RAID5) and 2 (RAID6) exist"
            ),
        }
    }
}

impl std::error::Error for RebuildError {}

/// The field polynomial without its `x^8` term: what a carry out of bit 7 folds back to.
const POLY_LOW: u8 = 0x1d;

/// Most data stripes a RAID6 row may have: `g` has order 255, so `g^i` is distinct only
/// for `i < 255`.
const MAX_RAID6_DATA: usize = 255;

/// `EXP[i] = g^i`, doubled in length so that `EXP[log a + log b]` needs no reduction.
static EXP: [u8; 512] = build_exp();
/// `LOG[g^i] = i` for nonzero bytes; `LOG[0]` is unused.
static LOG: [u8; 256] = build_log();

const fn build_exp() -> [u8; 512] {
    let mut t = [0u8; 512];
    let mut x: u16 = 1;
    let mut i = 0;
    while i < 255 {
        t[i] = x as u8;
        t[i + 255] = x as u8;
        x <<= 1;
        if x & 0x100 != 0 {
            x ^= 0x100 | POLY_LOW as u16;
        }
        i += 1;
    }
    // 510 and 511 are never indexed by a sum of two logs (at most 254 + 254 = 508), but
    // keep them consistent anyway.
    t[510] = t[0];
    t[511] = t[1];
    t
}

const fn build_log() -> [u8; 256] {
    let exp = build_exp();
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 255 {
        t[exp[i] as usize] = i as u8;
        i += 1;
    }
    t
}

/// Product in GF(2^8).
fn mul(a: u8, b: u8) -> u8 {
    if a == 0 || b == 0 {
        return 0;
    }
    EXP[LOG[a as usize] as usize + LOG[b as usize] as usize]
}

/// Quotient `a / b` in GF(2^8); `b` must not be 0.
fn div(a: u8, b: u8) -> u8 {
    assert!(b != 0, "division by zero in GF(2^8)");
    if a == 0 {
        return 0;
    }
    EXP[LOG[a as usize] as usize + 255 - LOG[b as usize] as usize]
}

/// `g^e` for any exponent.
fn pow_g(e: usize) -> u8 {
    EXP[e % 255]
}

/// The multiplication table row of `c`: `row[x] = c * x`. Building it costs 256 lookups,
/// after which multiplying a whole buffer by `c` is one lookup per byte.
fn mul_row(c: u8) -> [u8; 256] {
    let mut row = [0u8; 256];
    for (x, r) in row.iter_mut().enumerate() {
        *r = mul(c, x as u8);
    }
    row
}

/// Multiplies each of the 8 bytes packed in `v` by `g = 2`: shift left, and fold the
/// carry out of every byte back in as 0x1d (0x1d fits a byte, so nothing crosses lanes).
fn mul2_u64(v: u64) -> u64 {
    const HIGH: u64 = 0x8080_8080_8080_8080;
    let carry = (v & HIGH) >> 7;
    ((v & !HIGH) << 1) ^ (carry * POLY_LOW as u64)
}

fn load(b: &[u8]) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(b);
    u64::from_ne_bytes(w)
}

/// `dst ^= src`.
fn xor_into(dst: &mut [u8], src: &[u8]) {
    debug_assert_eq!(dst.len(), src.len());
    let mut d = dst.chunks_exact_mut(8);
    let mut s = src.chunks_exact(8);
    for (dw, sw) in d.by_ref().zip(s.by_ref()) {
        let v = load(dw) ^ load(sw);
        dw.copy_from_slice(&v.to_ne_bytes());
    }
    for (db, sb) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *db ^= sb;
    }
}

/// One Horner step of Q: `q = 2 * q ^ d`.
fn mul2_xor_into(q: &mut [u8], d: &[u8]) {
    debug_assert_eq!(q.len(), d.len());
    let mut qc = q.chunks_exact_mut(8);
    let mut dc = d.chunks_exact(8);
    for (qw, dw) in qc.by_ref().zip(dc.by_ref()) {
        let v = mul2_u64(load(qw)) ^ load(dw);
        qw.copy_from_slice(&v.to_ne_bytes());
    }
    for (qb, db) in qc.into_remainder().iter_mut().zip(dc.remainder()) {
        *qb = mul(*qb, 2) ^ db;
    }
}

/// `q = 2 * q` in place (a Horner step past a stripe that counts as zero).
fn mul2_in_place(q: &mut [u8]) {
    let mut qc = q.chunks_exact_mut(8);
    for qw in qc.by_ref() {
        let v = mul2_u64(load(qw));
        qw.copy_from_slice(&v.to_ne_bytes());
    }
    for qb in qc.into_remainder() {
        *qb = mul(*qb, 2);
    }
}

/// One Horner step of P and Q together, so that `d` is read once: `p ^= d; q = 2 * q ^ d`.
fn pq_step(p: &mut [u8], q: &mut [u8], d: &[u8]) {
    let mut pc = p.chunks_exact_mut(8);
    let mut qc = q.chunks_exact_mut(8);
    let mut dc = d.chunks_exact(8);
    for ((pw, qw), dw) in pc.by_ref().zip(qc.by_ref()).zip(dc.by_ref()) {
        let dv = load(dw);
        pw.copy_from_slice(&(load(pw) ^ dv).to_ne_bytes());
        qw.copy_from_slice(&(mul2_u64(load(qw)) ^ dv).to_ne_bytes());
    }
    let tail = pc.into_remainder().iter_mut().zip(qc.into_remainder());
    for ((pb, qb), db) in tail.zip(dc.remainder()) {
        *pb ^= db;
        *qb = mul(*qb, 2) ^ db;
    }
}

/// P: XOR of `data` (all the same length as `p`).
///
/// With no data stripes `p` is zeroed (the XOR of nothing).
///
/// # Panics
///
/// If a data stripe's length differs from `p`'s: a caller bug, not bad disk content.
pub fn gen_p(data: &[&[u8]], p: &mut [u8]) {
    assert!(
        data.iter().all(|d| d.len() == p.len()),
        "raid56::gen_p: stripe lengths differ"
    );
    match data.split_first() {
        None => p.fill(0),
        Some((first, rest)) => {
            p.copy_from_slice(first);
            for d in rest {
                xor_into(p, d);
            }
        }
    }
}

/// P and Q of `data`.
///
/// Q is evaluated by Horner's rule from the last data stripe down, so each stripe costs one
/// multiply-by-2 and one XOR per byte, done 8 bytes at a time. With no data stripes both are
/// zeroed.
///
/// # Panics
///
/// If a data stripe's or `q`'s length differs from `p`'s: a caller bug, not bad disk content.
pub fn gen_pq(data: &[&[u8]], p: &mut [u8], q: &mut [u8]) {
    assert!(
        q.len() == p.len() && data.iter().all(|d| d.len() == p.len()),
        "raid56::gen_pq: stripe lengths differ"
    );
    match data.split_last() {
        None => {
            p.fill(0);
            q.fill(0);
        }
        Some((last, rest)) => {
            p.copy_from_slice(last);
            q.copy_from_slice(last);
            for d in rest.iter().rev() {
                pq_step(p, q, d);
            }
        }
    }
}

/// `out = XOR of stripes[i]` for the `i` in `from`. `out` must not be one of them (the
/// caller has taken it out of `stripes`).
fn xor_of(stripes: &[&mut [u8]], from: impl Iterator<Item = usize>, out: &mut [u8]) {
    out.fill(0);
    for i in from {
        xor_into(out, stripes[i]);
    }
}

/// `out = sum g^i * D_i` over the data stripes `i < ndata` not in `skip` (those count as
/// zero: a partial Q).
fn q_of(stripes: &[&mut [u8]], ndata: usize, skip: &[usize], out: &mut [u8]) {
    let mut started = false;
    for i in (0..ndata).rev() {
        let present = !skip.contains(&i);
        match (started, present) {
            (false, false) => {}
            (false, true) => {
                out.copy_from_slice(stripes[i]);
                started = true;
            }
            (true, true) => mul2_xor_into(out, stripes[i]),
            (true, false) => mul2_in_place(out),
        }
    }
    if !started {
        out.fill(0);
    }
}

/// Rebuilds in place the stripes of one row listed in `lost`. `stripes` holds the data
/// stripes in order, then P, then (nparity == 2) Q; all the same length. `lost` has at most
/// `nparity` distinct indexes; their current content is ignored and overwritten. Every case:
/// RAID5 (nparity 1): any one stripe. RAID6 (nparity 2): any one or two of data/P/Q
/// (data+data, data+P, data+Q, P+Q, one data, P alone, Q alone).
///
/// Repeated indexes in `lost` count once; an empty `lost` is a no-op. On error nothing is
/// written. Lost parity is recomputed from the (possibly rebuilt) data, so after `Ok` the
/// row is consistent.
pub fn rebuild(
    stripes: &mut [&mut [u8]],
    nparity: usize,
    lost: &[usize],
) -> Result<(), RebuildError> {
    if nparity != 1 && nparity != 2 {
        return Err(RebuildError::BadParity(nparity));
    }
    if stripes.len() < nparity + 1 {
        return Err(RebuildError::Lengths);
    }
    let len = stripes[0].len();
    if stripes.iter().any(|s| s.len() != len) {
        return Err(RebuildError::Lengths);
    }
    let ndata = stripes.len() - nparity;
    if nparity == 2 && ndata > MAX_RAID6_DATA {
        return Err(RebuildError::Lengths);
    }
    if let Some(&bad) = lost.iter().find(|&&i| i >= stripes.len()) {
        return Err(RebuildError::BadIndex(bad));
    }
    let mut distinct: Vec<usize> = lost.to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    if distinct.len() > nparity {
        return Err(RebuildError::TooManyLost {
            lost: distinct.len(),
            parity: nparity,
        });
    }

    let p_idx = ndata;
    let q_idx = ndata + 1;
    let lost_data: Vec<usize> = distinct.iter().copied().filter(|&i| i < ndata).collect();
    let lost_p = distinct.contains(&p_idx);
    let lost_q = nparity == 2 && distinct.contains(&q_idx);

    match (lost_data.as_slice(), lost_p) {
        ([], _) => {}
        (&[x], false) => {
            // D_x = P ^ (XOR of the other data stripes).
            let dx = std::mem::take(&mut stripes[x]);
            let others = (0..=p_idx).filter(|&i| i != x);
            xor_of(stripes, others, dx);
            stripes[x] = dx;
        }
        (&[x], true) => {
            // Only Q is left (RAID6; RAID5 cannot lose two): g^x * D_x = Q ^ (partial Q
            // without x), then divide by g^x.
            let dx = std::mem::take(&mut stripes[x]);
            q_of(stripes, ndata, &[x], dx);
            xor_into(dx, stripes[q_idx]);
            let row = mul_row(div(1, pow_g(x)));
            for b in dx.iter_mut() {
                *b = row[*b as usize];
            }
            stripes[x] = dx;
        }
        (&[x, y], _) => {
            // With Pxy = P ^ (XOR of the rest) = D_x ^ D_y and Qxy = Q ^ (partial Q without
            // x, y) = g^x D_x ^ g^y D_y: D_x = (g^y Pxy ^ Qxy) / (g^x ^ g^y), D_y = Pxy ^ D_x.
            // g^x != g^y because x < y < 255.
            let dx = std::mem::take(&mut stripes[x]);
            let dy = std::mem::take(&mut stripes[y]);
            let others = (0..=p_idx).filter(|&i| i != x && i != y);
            xor_of(stripes, others, dx);
            q_of(stripes, ndata, &[x, y], dy);
            xor_into(dy, stripes[q_idx]);
            let (gx, gy) = (pow_g(x), pow_g(y));
            let denom = gx ^ gy;
            let row_p = mul_row(div(gy, denom));
            let row_q = mul_row(div(1, denom));
            for (bx, by) in dx.iter_mut().zip(dy.iter_mut()) {
                let pxy = *bx;
                let d = row_p[pxy as usize] ^ row_q[*by as usize];
                *bx = d;
                *by = pxy ^ d;
            }
            stripes[x] = dx;
            stripes[y] = dy;
        }
        _ => unreachable!("at most nparity <= 2 stripes are lost"),
    }

    if lost_p {
        let p = std::mem::take(&mut stripes[p_idx]);
        xor_of(stripes, 0..ndata, p);
        stripes[p_idx] = p;
    }
    if lost_q {
        let q = std::mem::take(&mut stripes[q_idx]);
        q_of(stripes, ndata, &[], q);
        stripes[q_idx] = q;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Multiplication the slow way (shift and add), independent of the tables.
    fn slow_mul(mut a: u8, mut b: u8) -> u8 {
        let mut r = 0u8;
        while b != 0 {
            if b & 1 != 0 {
                r ^= a;
            }
            let carry = a & 0x80 != 0;
            a <<= 1;
            if carry {
                a ^= 0x1d;
            }
            b >>= 1;
        }
        r
    }

    /// P and Q byte by byte, straight from the definition.
    fn naive_pq(data: &[Vec<u8>], len: usize) -> (Vec<u8>, Vec<u8>) {
        let mut p = vec![0u8; len];
        let mut q = vec![0u8; len];
        for (i, d) in data.iter().enumerate() {
            let gi = pow_g(i);
            for k in 0..len {
                p[k] ^= d[k];
                q[k] ^= slow_mul(gi, d[k]);
            }
        }
        (p, q)
    }

    /// xorshift64*: deterministic filler for stripe contents.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }
        fn bytes(&mut self, len: usize) -> Vec<u8> {
            (0..len).map(|_| self.next() as u8).collect()
        }
    }

    /// A consistent row: `ndata` random data stripes, then P, then Q if `nparity == 2`.
    fn make_row(rng: &mut Rng, ndata: usize, nparity: usize, len: usize) -> Vec<Vec<u8>> {
        let mut row: Vec<Vec<u8>> = (0..ndata).map(|_| rng.bytes(len)).collect();
        let mut p = vec![0u8; len];
        let mut q = vec![0u8; len];
        {
            let data: Vec<&[u8]> = row.iter().map(|d| d.as_slice()).collect();
            if nparity == 1 {
                gen_p(&data, &mut p);
            } else {
                gen_pq(&data, &mut p, &mut q);
            }
        }
        row.push(p);
        if nparity == 2 {
            row.push(q);
        }
        row
    }

    /// Scribbles over the lost stripes, rebuilds, and returns the result.
    fn rebuild_copy(
        row: &[Vec<u8>],
        nparity: usize,
        lost: &[usize],
        rng: &mut Rng,
    ) -> (Result<(), RebuildError>, Vec<Vec<u8>>) {
        let mut work: Vec<Vec<u8>> = row.to_vec();
        for &i in lost {
            if let Some(s) = work.get_mut(i) {
                let len = s.len();
                *s = rng.bytes(len);
            }
        }
        let mut refs: Vec<&mut [u8]> = work.iter_mut().map(|s| s.as_mut_slice()).collect();
        let r = rebuild(&mut refs, nparity, lost);
        (r, work)
    }

    #[test]
    fn gf_known_products() {
        assert_eq!(mul(2, 0x80), 0x1d);
        assert_eq!(mul(0x80, 2), 0x1d);
        assert_eq!(mul(2, 0x8e), 0x01); // 0x8e is the inverse of 2 under 0x11d
        assert_eq!(div(1, 2), 0x8e);
        assert_eq!(mul(0, 0x53), 0);
        assert_eq!(mul(1, 0x53), 0x53);
    }

    #[test]
    fn gf_tables_match_slow_multiplication() {
        for a in 0..=255u8 {
            for b in 0..=255u8 {
                assert_eq!(mul(a, b), slow_mul(a, b), "{a:#x} * {b:#x}");
            }
        }
    }

    #[test]
    fn gf_mul_div_inverse_for_all_pairs() {
        for a in 0..=255u8 {
            for b in 1..=255u8 {
                assert_eq!(div(mul(a, b), b), a, "({a:#x} * {b:#x}) / {b:#x}");
                assert_eq!(mul(div(a, b), b), a, "({a:#x} / {b:#x}) * {b:#x}");
            }
        }
    }

    #[test]
    fn generator_has_order_255() {
        let mut x = 1u8;
        let mut seen = [false; 256];
        for k in 1..=255 {
            assert!(!seen[x as usize], "g^{} repeats", k - 1);
            seen[x as usize] = true;
            x = slow_mul(x, 2);
            assert_eq!(x == 1, k == 255, "g^{k} = {x:#x}");
        }
        assert!(!seen[0]);
        for e in 0..600 {
            assert_eq!(pow_g(e), pow_g(e % 255));
        }
    }

    #[test]
    fn swar_mul2_matches_bytewise() {
        for base in (0..256).step_by(8) {
            let bytes: [u8; 8] = std::array::from_fn(|k| (base + k) as u8);
            let got = mul2_u64(u64::from_ne_bytes(bytes)).to_ne_bytes();
            for k in 0..8 {
                assert_eq!(got[k], mul(bytes[k], 2), "byte {:#x}", bytes[k]);
            }
        }
    }

    #[test]
    fn q_known_answers() {
        let mut p = [0u8; 1];
        let mut q = [0u8; 1];
        // 1 + 2 + 4.
        gen_pq(&[&[1], &[1], &[1]], &mut p, &mut q);
        assert_eq!((p, q), ([1], [7]));
        // 0x80 + 2 * 0x80 = 0x80 ^ 0x1d.
        gen_pq(&[&[0x80], &[0x80]], &mut p, &mut q);
        assert_eq!((p, q), ([0], [0x9d]));
        // g^8 = 0x1d, g^9 = 0x3a: a lone 1 in data stripe 8, then 9.
        let zero = [0u8];
        let one = [1u8];
        let mut data: Vec<&[u8]> = vec![&zero; 10];
        data[8] = &one;
        gen_pq(&data, &mut p, &mut q);
        assert_eq!((p, q), ([1], [0x1d]));
        data[8] = &zero;
        data[9] = &one;
        gen_pq(&data, &mut p, &mut q);
        assert_eq!((p, q), ([1], [0x3a]));
        // Two bytes per stripe, lanes independent: D0 = [3, 0], D1 = [5, 0xff].
        let mut p2 = [0u8; 2];
        let mut q2 = [0u8; 2];
        gen_pq(&[&[3, 0], &[5, 0xff]], &mut p2, &mut q2);
        assert_eq!(p2, [6, 0xff]);
        // 3 ^ 2*5 = 3 ^ 0xa = 9; 2*0xff = 0xfe ^ 0x1d = 0xe3.
        assert_eq!(q2, [9, 0xe3]);
    }

    #[test]
    fn empty_data_gives_zero_parity() {
        let mut p = [9u8; 5];
        let mut q = [9u8; 5];
        gen_pq(&[], &mut p, &mut q);
        assert_eq!((p, q), ([0; 5], [0; 5]));
        let mut p = [9u8; 5];
        gen_p(&[], &mut p);
        assert_eq!(p, [0; 5]);
    }

    #[test]
    fn gen_pq_matches_definition() {
        let mut rng = Rng(0x1234_5678_9abc_def1);
        for ndata in 1..=8 {
            for len in [1, 7, 8, 9, 15, 64, 4096 + 3] {
                let data: Vec<Vec<u8>> = (0..ndata).map(|_| rng.bytes(len)).collect();
                let refs: Vec<&[u8]> = data.iter().map(|d| d.as_slice()).collect();
                let (want_p, want_q) = naive_pq(&data, len);
                let mut p = vec![0u8; len];
                let mut q = vec![0u8; len];
                gen_pq(&refs, &mut p, &mut q);
                assert_eq!(p, want_p, "P ndata {ndata} len {len}");
                assert_eq!(q, want_q, "Q ndata {ndata} len {len}");
                let mut p1 = vec![0u8; len];
                gen_p(&refs, &mut p1);
                assert_eq!(p1, want_p, "gen_p ndata {ndata} len {len}");
            }
        }
    }

    #[test]
    fn raid5_every_single_loss() {
        let mut rng = Rng(0xdead_beef_cafe_f00d);
        for ndata in 1..=6 {
            for len in [1, 7, 64, 4096] {
                let row = make_row(&mut rng, ndata, 1, len);
                for x in 0..row.len() {
                    let (r, got) = rebuild_copy(&row, 1, &[x], &mut rng);
                    assert_eq!(r, Ok(()));
                    assert!(got == row, "RAID5 ndata {ndata} len {len} lost {x}");
                }
            }
        }
    }

    #[test]
    fn raid6_every_single_and_pair_loss() {
        let mut rng = Rng(0x0123_4567_89ab_cdef);
        for ndata in 1..=6 {
            for len in [1, 7, 64, 4096] {
                let row = make_row(&mut rng, ndata, 2, len);
                let n = row.len();
                for x in 0..n {
                    let (r, got) = rebuild_copy(&row, 2, &[x], &mut rng);
                    assert_eq!(r, Ok(()));
                    assert!(got == row, "RAID6 ndata {ndata} len {len} lost {x}");
                    for y in 0..n {
                        if y == x {
                            continue;
                        }
                        // Both orders of `lost`, so order does not matter.
                        let (r, got) = rebuild_copy(&row, 2, &[x, y], &mut rng);
                        assert_eq!(r, Ok(()));
                        assert!(got == row, "RAID6 ndata {ndata} len {len} lost {x},{y}");
                    }
                }
            }
        }
    }

    #[test]
    fn raid6_widest_row() {
        // 255 data stripes: g^0 .. g^254 all distinct, so the farthest pair still rebuilds.
        let mut rng = Rng(77);
        let row = make_row(&mut rng, MAX_RAID6_DATA, 2, 9);
        for lost in [[0, 254], [1, 253], [254, 255], [0, 256], [127, 128]] {
            let (r, got) = rebuild_copy(&row, 2, &lost, &mut rng);
            assert_eq!(r, Ok(()));
            assert!(got == row, "lost {lost:?}");
        }
        // One more and Q cannot tell stripe 0 from stripe 255.
        let row = make_row(&mut rng, MAX_RAID6_DATA + 1, 2, 9);
        let (r, _) = rebuild_copy(&row, 2, &[0, 255], &mut rng);
        assert_eq!(r, Err(RebuildError::Lengths));
    }

    #[test]
    fn duplicates_and_empty_lost() {
        let mut rng = Rng(5);
        let row = make_row(&mut rng, 3, 2, 33);
        let (r, got) = rebuild_copy(&row, 2, &[], &mut rng);
        assert_eq!(r, Ok(()));
        assert!(got == row);
        // Duplicates count once: three entries but two distinct stripes.
        let (r, got) = rebuild_copy(&row, 2, &[1, 1, 4], &mut rng);
        assert_eq!(r, Ok(()));
        assert!(got == row);
        let row5 = make_row(&mut rng, 3, 1, 33);
        let (r, got) = rebuild_copy(&row5, 1, &[2, 2], &mut rng);
        assert_eq!(r, Ok(()));
        assert!(got == row5);
    }

    #[test]
    fn zero_length_stripes() {
        let mut rng = Rng(6);
        let row = make_row(&mut rng, 4, 2, 0);
        let (r, got) = rebuild_copy(&row, 2, &[0, 3], &mut rng);
        assert_eq!(r, Ok(()));
        assert!(got == row);
    }

    /// Runs `rebuild` on a copy and checks it fails with `want` without writing anything.
    fn expect_err(row: &[Vec<u8>], nparity: usize, lost: &[usize], want: RebuildError) {
        let mut work = row.to_vec();
        let mut refs: Vec<&mut [u8]> = work.iter_mut().map(|s| s.as_mut_slice()).collect();
        assert_eq!(rebuild(&mut refs, nparity, lost), Err(want));
        assert!(work == row, "rebuild wrote on error");
    }

    #[test]
    fn errors() {
        let mut rng = Rng(99);
        let r6 = make_row(&mut rng, 4, 2, 16);
        let r5 = make_row(&mut rng, 4, 1, 16);
        let tml = |lost, parity| RebuildError::TooManyLost { lost, parity };
        expect_err(&r6, 2, &[0, 1, 2], tml(3, 2));
        expect_err(&r6, 2, &[0, 4, 5], tml(3, 2));
        expect_err(&r5, 1, &[0, 1], tml(2, 1));
        expect_err(&r5, 1, &[4, 0], tml(2, 1));
        expect_err(&r6, 2, &[6], RebuildError::BadIndex(6));
        expect_err(&r5, 1, &[0, 99], RebuildError::BadIndex(99));
        expect_err(&r6, 3, &[0], RebuildError::BadParity(3));
        expect_err(&r6, 0, &[], RebuildError::BadParity(0));
        // Fewer stripes than a row needs.
        expect_err(&r6[..2], 2, &[0], RebuildError::Lengths);
        expect_err(&r5[..1], 1, &[0], RebuildError::Lengths);
        expect_err(&[], 1, &[], RebuildError::Lengths);
        // A short stripe.
        let mut ragged = r6.clone();
        ragged[2].pop();
        expect_err(&ragged, 2, &[0], RebuildError::Lengths);
    }

    #[test]
    fn error_messages() {
        let all = [
            RebuildError::TooManyLost { lost: 3, parity: 2 },
            RebuildError::BadIndex(7),
            RebuildError::Lengths,
            RebuildError::BadParity(3),
        ];
        for e in all {
            let s = e.to_string();
            assert!(!s.is_empty());
            let _: &dyn std::error::Error = &e;
        }
        assert!(RebuildError::BadIndex(7).to_string().contains('7'));
    }

    #[test]
    #[should_panic(expected = "lengths differ")]
    fn gen_pq_panics_on_ragged_input() {
        let mut p = [0u8; 4];
        let mut q = [0u8; 4];
        gen_pq(&[&[1, 2, 3]], &mut p, &mut q);
    }

    proptest! {
        #[test]
        fn rebuild_roundtrip(
            ndata in 1usize..12,
            nparity in 1usize..=2,
            len in 0usize..300,
            seed in any::<u64>(),
            a in any::<usize>(),
            b in any::<usize>(),
        ) {
            let mut rng = Rng(seed | 1);
            let row = make_row(&mut rng, ndata, nparity, len);
            let n = row.len();
            let lost = if nparity == 1 { vec![a % n] } else { vec![a % n, b % n] };
            let (r, got) = rebuild_copy(&row, nparity, &lost, &mut rng);
            prop_assert_eq!(r, Ok(()));
            prop_assert!(got == row, "lost {:?}", lost);
        }
    }
}

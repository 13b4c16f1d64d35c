//! Sizes as btrfs-progs prints them (`pretty_size_mode` and the unit options of
//! common/units.c), so that oleo's reports read character for character like btrfs's.
//!
//! A mode is a base (bytes, KiB, MiB, ... or 0: pick the largest unit below the size) and a
//! kind (raw bytes, powers of 1024, powers of 1000). The fraction is computed in single
//! precision after integer divisions, as progs does: "102.38MiB" is 104836 KiB / 1024 in
//! `float`, not the exact size / 2^20, and the two differ in the last digit now and then.

/// Base: the size in bytes, with a "B".
const BYTES: u32 = 1;
/// Base: KiB or kB.
const KBYTES: u32 = 2;
/// Base: MiB or MB.
const MBYTES: u32 = 3;
/// Base: GiB or GB.
const GBYTES: u32 = 4;
/// Base: TiB or TB.
const TBYTES: u32 = 5;
/// The bits of the base.
const BASE_MASK: u32 = 0xff;
/// Kind: the number of bytes, no unit.
const RAW: u32 = 1 << 8;
/// Kind: powers of 1024.
const BINARY: u32 = 2 << 8;
/// Kind: powers of 1000.
const DECIMAL: u32 = 3 << 8;
/// Flag: the value may be negative (a u64 holding a wrapped difference).
const NEGATIVE: u32 = 4 << 8;

const BINARY_SUFFIX: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
const DECIMAL_SUFFIX: [&str; 7] = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];

/// How sizes are printed: progs's `unit_mode`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Units(u32);

impl Default for Units {
    fn default() -> Self {
        Units::HUMAN
    }
}

impl Units {
    /// The default: powers of 1024, the largest unit that keeps the number at least 1.
    pub const HUMAN: Units = Units(BINARY);

    fn set_kind(&mut self, kind: u32) {
        self.0 = (self.0 & BASE_MASK) | kind;
    }

    fn set_base(&mut self, base: u32) {
        self.0 = (self.0 & !BASE_MASK) | base;
    }

    /// The mode the unit options among `args` select, read in order as progs's
    /// `get_unit_mode_from_arg` reads them (a later option overrides or refines an earlier
    /// one: `--raw` and `-h` start over, `--si` keeps a base given before it). The long
    /// options always count; the short ones (`-b -h -H -k -m -g -t`) only with `short`
    /// (`df` and `usage`; `show` has other meanings for them). Clustered short flags
    /// (`-bT`) are taken apart. Scanning stops at `--`.
    pub fn from_args<'a>(args: impl IntoIterator<Item = &'a str>, short: bool) -> Units {
        let mut u = Units::HUMAN;
        for a in args {
            match a {
                "--" => break,
                "--raw" => u = Units(RAW),
                "--human-readable" => u = Units::HUMAN,
                "--iec" => u.set_kind(BINARY),
                "--si" => u.set_kind(DECIMAL),
                "--kbytes" => u.set_base(KBYTES),
                "--mbytes" => u.set_base(MBYTES),
                "--gbytes" => u.set_base(GBYTES),
                "--tbytes" => u.set_base(TBYTES),
                s if short && s.len() > 1 && s.starts_with('-') && !s.starts_with("--") => {
                    for c in s[1..].chars() {
                        match c {
                            'b' => u = Units(RAW),
                            'h' => u = Units::HUMAN,
                            'H' => u = Units(DECIMAL),
                            'k' => u.set_base(KBYTES),
                            'm' => u.set_base(MBYTES),
                            'g' => u.set_base(GBYTES),
                            't' => u.set_base(TBYTES),
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        u
    }

    /// True for the default mode, where progs pads its summary values to 10 columns (18
    /// for every other mode).
    pub fn is_default(self) -> bool {
        self == Units::HUMAN
    }

    /// `size` as progs prints it in this mode ("0.00B", "16.00KiB", "102.38MiB", "4096").
    pub fn size(self, size: u64) -> String {
        pretty(size, self.0)
    }

    /// `size` read as a signed number (a difference that may have gone below zero).
    pub fn signed(self, size: u64) -> String {
        pretty(size, self.0 | NEGATIVE)
    }
}

fn pretty(size: u64, mode: u32) -> String {
    let negative = mode & NEGATIVE != 0;
    let mode = mode & !NEGATIVE;
    let kind = mode & !BASE_MASK;
    if kind == RAW {
        return if negative {
            (size as i64).to_string()
        } else {
            size.to_string()
        };
    }
    let (mult, suffix) = match kind {
        BINARY => (1024u64, &BINARY_SUFFIX),
        DECIMAL => (1000u64, &DECIMAL_SUFFIX),
        _ => return String::new(),
    };
    let (mut base, mut divs, mut last) = (mult, 0usize, size);
    let fixed = match mode & BASE_MASK {
        TBYTES => Some(4),
        GBYTES => Some(3),
        MBYTES => Some(2),
        KBYTES => Some(1),
        BYTES => Some(0),
        _ => None,
    };
    match fixed {
        Some(n) => {
            divs = n;
            base = mult.pow(n as u32);
        }
        None if negative => {
            let mut s = size as i64;
            let mut last_s = s;
            while s.unsigned_abs() >= mult {
                last_s = s;
                s /= mult as i64;
                divs += 1;
            }
            last = last_s as u64;
            if divs == 0 {
                base = 1;
            }
        }
        None => {
            let mut s = size;
            while s >= mult {
                last = s;
                s /= mult;
                divs += 1;
            }
            if divs == 0 {
                base = 1;
            }
        }
    }
    let Some(unit) = suffix.get(divs) else {
        return String::new();
    };
    // Single precision, as progs's `float fraction`.
    let fraction = if negative {
        (last as i64) as f32 / base as f32
    } else {
        last as f32 / base as f32
    };
    format!("{:.2}{unit}", f64::from(fraction))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn units(args: &[&str], short: bool) -> Units {
        Units::from_args(args.iter().copied(), short)
    }

    #[test]
    fn sizes_print_as_progs_prints_them() {
        let h = Units::HUMAN;
        assert_eq!(h.size(0), "0.00B");
        assert_eq!(h.size(1023), "1023.00B");
        assert_eq!(h.size(16384), "16.00KiB");
        assert_eq!(h.size(107_347_968), "102.38MiB");
        assert_eq!(h.size(5_767_168), "5.50MiB");
        assert_eq!(h.size(2 << 30), "2.00GiB");
        assert_eq!(h.size(1_701_314_560), "1.58GiB");
        assert_eq!(h.size(u64::MAX), "16.00EiB");
        assert_eq!(h.signed(0u64.wrapping_sub(1 << 20)), "-1.00MiB");
        let raw = units(&["--raw"], false);
        assert_eq!(raw.size(4096), "4096");
        assert_eq!(raw.signed(u64::MAX), "-1");
        let k = units(&["-k"], true);
        assert_eq!(k.size(107_347_968), "104832.00KiB");
        assert_eq!(k.size(0), "0.00KiB");
        let si = units(&["-H"], true);
        assert_eq!(si.size(2_147_483_648), "2.15GB");
        assert_eq!(si.size(163_840), "163.84kB");
        assert_eq!(si.size(0), "0.00B");
        assert_eq!(
            units(&["--si", "--mbytes"], false).size(2_000_000),
            "2.00MB"
        );
        assert_eq!(units(&["-b"], true).size(42), "42");
    }

    #[test]
    fn options_are_read_in_order() {
        assert_eq!(units(&[], true), Units::HUMAN);
        assert_eq!(units(&["-m", "--si"], true), units(&["--si", "-m"], true));
        assert_eq!(units(&["-m", "-h"], true), Units::HUMAN);
        assert_eq!(units(&["--raw", "--iec"], true), Units::HUMAN);
        assert_eq!(units(&["-b"], false), Units::HUMAN);
        assert_eq!(units(&["-bT"], true), units(&["-b"], true));
        assert_eq!(units(&["--", "-b"], true), Units::HUMAN);
        assert!(!units(&["-k"], true).is_default());
        assert!(units(&["--iec"], true).is_default());
        assert!(!units(&["-H"], true).is_default());
    }
}

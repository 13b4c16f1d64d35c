//! Manual use of the kit, for poking at an image by hand:
//!
//! ```text
//! cargo run -p oleo-testkit --example testkit -- build OUT.img [SEED] [--pending-log] [--basic] [MKFS ARGS...]
//! cargo run -p oleo-testkit --example testkit -- dump DIR          # one line per path
//! cargo run -p oleo-testkit --example testkit -- diff KERNEL_DIR OLEO_DIR [--all]
//! cargo run -p oleo-testkit --example testkit -- stats IMAGE       # extent kinds on disk
//! ```

use std::path::Path;
use std::process::ExitCode;

use oleo_testkit::*;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: testkit build OUT.img [SEED] [--pending-log] [--basic] [MKFS ARGS...] | dump DIR | diff KERNEL_DIR OLEO_DIR [--all] | stats IMAGE";
    let result = match args.first().map(String::as_str) {
        Some("build") if args.len() >= 2 => {
            let out = Path::new(&args[1]);
            let mut rest = &args[2..];
            let mut seed = 1;
            if let Some(s) = rest.first().and_then(|s| s.parse().ok()) {
                seed = s;
                rest = &rest[1..];
            }
            let pending = rest.iter().any(|a| a == "--pending-log");
            let basic = rest.iter().any(|a| a == "--basic");
            let mkfs: Vec<&str> = rest
                .iter()
                .map(String::as_str)
                .filter(|a| *a != "--pending-log" && *a != "--basic")
                .collect();
            let mut spec = ImageSpec::new("manual", seed).mkfs(&mkfs);
            if basic {
                spec = spec.populate(PopulateSpec::basic());
            }
            if pending {
                build_image_with_pending_log(&spec, out)
            } else {
                build_image(&spec, out)
            }
        }
        Some("dump") if args.len() == 2 => {
            Manifest::capture(Path::new(&args[1])).map(|m| print!("{}", m.dump()))
        }
        Some("diff") if args.len() >= 3 => (|| {
            let k = Manifest::capture(Path::new(&args[1]))?;
            let o = Manifest::capture(Path::new(&args[2]))?;
            // --all: also the comparisons that are off by default (data map, statfs).
            let all = args[3..].iter().any(|a| a == "--all");
            let rules = CompareRules {
                compare_data_map: all,
                compare_statfs: all,
                ..CompareRules::default()
            };
            let d = Manifest::diff(&k, &o, &rules);
            for l in &d {
                println!("{l}");
            }
            eprintln!("{} differences", d.len());
            Ok(())
        })(),
        Some("stats") if args.len() == 2 => image_stats(Path::new(&args[1])).map(|s| {
            for (k, v) in s.counts {
                println!("{k:20} {v}");
            }
        }),
        _ => {
            eprintln!("{usage}");
            return ExitCode::FAILURE;
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("testkit: {e}");
            ExitCode::FAILURE
        }
    }
}

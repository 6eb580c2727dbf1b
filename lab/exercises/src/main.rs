//! `cargo xtask lab list | check N [--solution] | reset N`.

use anyhow::{bail, Result};
use leaklab_exercises::Version;

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let number = |i: usize| -> Result<usize> {
        args.get(i).and_then(|a| a.parse().ok()).ok_or_else(|| anyhow::anyhow!("which exercise? e.g. `cargo xtask lab check 1`"))
    };
    match args.first().map(String::as_str) {
        Some("list") | None => {
            for e in &leaklab_exercises::EXERCISES {
                println!("{}  {:<6} lab/exercises/src/{:<13} {}", e.number, e.name, e.file, e.symptom);
            }
            println!("\nFix one, then `cargo xtask lab check N`; `cargo xtask lab reset N` starts it over. Hints: lab/README.md");
        }
        Some("check") => {
            leaklab_probe::cpu::install()?;
            let n = number(1)?;
            let version = if args.iter().any(|a| a == "--solution") { Version::Solution } else { Version::Learner };
            let mut service = leaklab_exercises::service(n, version)?;
            let outcome = leaklab_exercises::check(n, service.as_mut())?;
            print!("{}", outcome.text);
            if !outcome.passed {
                std::process::exit(1);
            }
        }
        Some("reset") => {
            let n = number(1)?;
            leaklab_exercises::reset(n)?;
            println!("exercise {n} restored to its starting state");
        }
        Some(other) => bail!("unknown lab command `{other}`: use list, check N, reset N"),
    }
    Ok(())
}

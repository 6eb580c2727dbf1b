//! `cargo xtask lab list | check N|incident [--solution] | reset N|incident | reveal`, and the
//! incident drill's plumbing (`incident prepare`, `incident serve --original NAME`). The
//! learner's incident handler is not compiled in here: `leaklab-incident` serves and checks it.

use anyhow::{bail, Result};
use clap::{Parser, Subcommand};
use leaklab_exercises::drill::{self, serve};
use leaklab_exercises::{Kind, Version};

#[derive(Parser)]
#[command(
    name = "leaklab-exercises",
    about = "The workshop: exercises 1 to 6 and the incident drill"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// The exercises and the drill.
    List,
    /// Runs an exercise (1 to 6) under the leak check and against the true outputs; `incident`
    /// with --solution runs the drill's reference fix (the learner's copy: `leaklab-incident check`).
    Check {
        which: Which,
        #[arg(long)]
        solution: bool,
    },
    /// Restores an exercise, or the incident in progress, to its starting state.
    Reset { which: Which },
    /// The drill's plumbing, run by `cargo xtask lab incident`.
    #[command(subcommand)]
    Incident(IncidentCommand),
    /// Names the incident in progress (or --incident NAME), its lines and its runbook step.
    Reveal {
        #[arg(long)]
        incident: Option<String>,
        #[arg(long)]
        json: bool,
        /// The Python drill's incident (`pyincident`) instead of the Rust one.
        #[arg(long)]
        python: bool,
    },
    /// The Python drill: picks (or resumes) an incident, writes the learner's copy
    /// (lab/exercises/python/incident.py), prints the briefing and serves the copy.
    Pyincident {
        /// Start another incident, even with one in progress.
        #[arg(long)]
        new: bool,
        /// Pick the incident by this seed.
        #[arg(long)]
        seed: Option<u64>,
    },
}

#[derive(Subcommand)]
enum IncidentCommand {
    /// Picks an incident (with --new or --seed) and writes the learner's copy and the traffic,
    /// or keeps the one in progress.
    Prepare(drill::serve::IncidentArgs),
    /// Writes the captured request bodies into a folder, for `leaklab scan --body`.
    Traffic {
        #[arg(long)]
        out: std::path::PathBuf,
    },
    /// Serves an incident's handler as shipped, for tests and instructors.
    Serve {
        #[arg(long)]
        original: String,
        #[command(flatten)]
        args: drill::serve::IncidentArgs,
    },
}

fn main() -> Result<()> {
    match Cli::parse().command.unwrap_or(Command::List) {
        Command::List => {
            for e in &leaklab_exercises::EXERCISES {
                let folder = if e.kind == Kind::Python {
                    "python"
                } else {
                    "src"
                };
                let path = format!("lab/exercises/{folder}/{}", e.file);
                println!("{}  {:<7} {path:<36} {}", e.number, e.name, e.symptom);
            }
            println!("   incident lab/exercises/src/incident.rs  an unknown cause: `cargo xtask lab incident` (after the six)");
            println!("   pyincident lab/exercises/python/incident.py  an unknown cause in a FastAPI service: `cargo xtask lab pyincident`");
            println!("\nFix one, then `cargo xtask lab check N`; `cargo xtask lab reset N` starts it over. Hints: lab/README.md");
        }
        Command::Check {
            which: Which::PyIncident,
            solution,
        } => {
            let outcome = drill::python::check(solution)?;
            print!("{}", outcome.text);
            std::process::exit(i32::from(!outcome.passed));
        }
        Command::Check {
            which: Which::Incident,
            solution,
        } => {
            if !solution {
                bail!("the learner's incident is checked by `cargo xtask lab check incident`");
            }
            // One reference fix serves every incident: the template with every fix in.
            let outcome = drill::check::check(
                drill::service(&drill::INCIDENTS[0], Version::Solution)?.as_mut(),
            );
            print!("{}", outcome.text);
            std::process::exit(i32::from(!outcome.passed));
        }
        Command::Check {
            which: Which::Exercise(n),
            solution,
        } => {
            let version = if solution {
                Version::Solution
            } else {
                Version::Learner
            };
            if leaklab_exercises::info(n)?.kind == Kind::Python {
                let outcome = leaklab_exercises::python::check(n, version)?;
                print!("{}", outcome.text);
                std::process::exit(i32::from(!outcome.passed));
            }
            leaklab_probe::cpu::install()?;
            let mut service = leaklab_exercises::service(n, version)?;
            let outcome = leaklab_exercises::check(n, service.as_mut())?;
            print!("{}", outcome.text);
            std::process::exit(i32::from(!outcome.passed));
        }
        Command::Reset {
            which: Which::PyIncident,
        } => {
            drill::python::reset()?;
            println!(
                "{} restored to the incident's starting state",
                drill::python::learner_file().display()
            );
        }
        Command::Reset {
            which: Which::Incident,
        } => {
            drill::reset()?;
            println!(
                "{} restored to the incident's starting state",
                drill::learner_file().display()
            );
        }
        Command::Reset {
            which: Which::Exercise(n),
        } => {
            leaklab_exercises::reset(n)?;
            println!("exercise {n} restored to its starting state");
        }
        Command::Incident(IncidentCommand::Prepare(args)) => {
            println!("{}", drill::prepare(args.new, args.seed)?)
        }
        Command::Incident(IncidentCommand::Traffic { out }) => {
            std::fs::create_dir_all(&out)?;
            drill::traffic::write_dir(&out)?;
        }
        Command::Incident(IncidentCommand::Serve { original, args }) => {
            let incident = drill::incident(&original)?;
            serve::run(
                drill::service(incident, Version::Original)?,
                &args,
                |addr| println!("leaklab-exercises incident {original} listening on http://{addr}"),
            )?;
        }
        Command::Reveal {
            incident,
            python: true,
            ..
        } => {
            let (incident, seed) = match incident {
                Some(name) => (drill::python::incident(&name)?, None),
                None => match drill::python::current()? {
                    Some((incident, seed)) => (incident, Some(seed)),
                    None => bail!("no Python incident in progress: `cargo xtask lab pyincident` starts one (or `reveal --python --incident NAME`)"),
                },
            };
            print!("{}", drill::python::reveal(incident, seed));
        }
        Command::Pyincident { new, seed } => {
            println!("{}\n", drill::python::prepare(new, seed)?);
            print!("{}", drill::python::briefing());
            let status = std::process::Command::new(leaklab_exercises::python::python())
                .arg(leaklab_exercises::python::folder().join("_check.py"))
                .args(["serve", "6"])
                .arg(drill::python::learner_file())
                .status()?;
            std::process::exit(status.code().unwrap_or(1));
        }
        Command::Reveal { incident, json, .. } => {
            let (incident, seed) = match incident {
                Some(name) => (drill::incident(&name)?, None),
                None => match drill::current()? {
                    Some((incident, seed)) => (incident, Some(seed)),
                    None => bail!("no incident in progress: `cargo xtask lab incident` starts one (or `reveal --incident NAME`)"),
                },
            };
            let reveal = drill::reveal(incident, seed);
            if json {
                println!("{}", serde_json::to_string_pretty(&reveal)?);
            } else {
                print!("{reveal}");
            }
        }
    }
    Ok(())
}

/// What `check` and `reset` act on: an exercise by its number, or the incident drill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Which {
    Exercise(usize),
    Incident,
    /// The Python drill's.
    PyIncident,
}

impl std::str::FromStr for Which {
    type Err = String;
    fn from_str(s: &str) -> Result<Which, String> {
        match s {
            "incident" => Ok(Which::Incident),
            "pyincident" => Ok(Which::PyIncident),
            n => n
                .parse()
                .ok()
                .filter(|n| leaklab_exercises::info(*n).is_ok())
                .map(Which::Exercise)
                .ok_or_else(|| {
                    format!(
                        "which exercise? 1 to {}, `incident` or `pyincident`; got `{s}`",
                        leaklab_exercises::EXERCISES.len()
                    )
                }),
        }
    }
}

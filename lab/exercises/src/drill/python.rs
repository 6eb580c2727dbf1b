//! The Python incident drill: a FastAPI service whose cause the learner is not told, found from
//! outside with `leaklab scan --agent` (the census names the holder), fixed in the learner's
//! copy, and checked by the scan and the answers, as exercises 5 and 6 are.
//!
//! Every incident is a cause of the zoo (`lab/zoo/<zoo>.py`, where its public reports are
//! cited), rendered from one template (`lab/exercises/incidents/service.py`, tagged as the Rust
//! drill's is: [`render`]) on exercise 6's model, requests and answers (`_contract.py`), so the
//! check is exercise 6's: 20 + 200 requests under its budget, then 20 answers verified on inputs
//! the scan never sent. A seed, kept where the learner does not look, picks the incident; the
//! learner's copy (`lab/exercises/python/incident.py`, not in git) is the only file they edit.

use super::render;
use crate::{python as exercise, Outcome};
use anyhow::{bail, Context, Result};
use serde::Serialize;
use std::path::{Path, PathBuf};

/// The template, as compiled in.
pub const TEMPLATE: &str = include_str!("../../incidents/service.py");

/// One incident of the Python drill.
#[derive(Debug, Serialize)]
pub struct PyIncident {
    pub name: &'static str,
    /// The zoo's cause it reproduces (`lab/zoo/<zoo>.py`): the tag of its lines in the template.
    pub zoo: &'static str,
    pub title: &'static str,
    /// What happened, for `reveal`.
    pub story: &'static str,
    /// What `leaklab scan --agent`'s census names as the holder (a part of its words).
    pub holder: &'static str,
}

pub const INCIDENTS: [PyIncident; 3] = [
    PyIncident {
        name: "hook",
        zoo: "forward_hook",
        title: "a forward hook registered on every request and never removed",
        story: "Each request registered a forward hook on the hidden layer to read its activations, and kept the handle to remove it later; later never came. Every hook's closure kept the list of every activation it saw (16 kB a pass), and every later pass ran every hook.",
        holder: "watch",
    },
    PyIncident {
        name: "exceptions",
        zoo: "exceptions_kept",
        title: "exceptions kept for a debug page, with their tracebacks",
        story: "Inputs beyond the training range raised OutOfDistribution, which the handler caught and kept in a list for /debug/ood. An exception keeps its traceback, and the traceback every frame it passed through with their locals: the request's input, its hidden activations and its answer (about 20 kB a request).",
        holder: "ood",
    },
    PyIncident {
        name: "cycles",
        zoo: "gc_disabled_cycles",
        title: "reference cycles with the collector switched off",
        story: "The service switched the garbage collector off at start-up for steadier latency. Each request's trace held its spans and each span pointed back at its trace: a reference cycle holding the request's input and hidden activations, which reference counting never frees and only the collector would have.",
        holder: "cycle",
    },
];

/// The incident called `name`.
pub fn incident(name: &str) -> Result<&'static PyIncident> {
    INCIDENTS.iter().find(|i| i.name == name).with_context(|| {
        format!(
            "no Python incident `{name}`; there are {}",
            INCIDENTS.map(|i| i.name).join(", ")
        )
    })
}

/// The service's source: `incident`'s as shipped, or with `None` the reference fix (every fix in).
pub fn text(incident: Option<&PyIncident>) -> String {
    render::learner_text(&render::render(TEMPLATE, incident.map(|i| i.name)))
}

/// The learner's copy.
pub fn learner_file() -> PathBuf {
    super::workspace_root().join("lab/exercises/python/incident.py")
}

/// Where the drill keeps its seed (not shown to the learner), the scan's body and its report.
pub fn state_dir() -> PathBuf {
    super::workspace_root().join("target/leaklab/py-incident")
}

/// The incident in progress and its seed, if one was started.
pub fn current() -> Result<Option<(&'static PyIncident, u64)>> {
    let seed = super::seed_in(&state_dir(), "pyincident")?;
    Ok(seed.map(|seed| (&INCIDENTS[(seed % INCIDENTS.len() as u64) as usize], seed)))
}

/// Readies the drill: with `new` or a `seed`, picks an incident (a random seed unless given) and
/// writes the learner's copy; otherwise keeps the one in progress, the learner's edits included.
/// Says what it did, without naming the incident.
pub fn prepare(new: bool, seed: Option<u64>) -> Result<String> {
    let file = learner_file();
    if !new && seed.is_none() {
        match current()? {
            Some(_) if file.exists() => return Ok(format!("Resuming the incident in progress, with {} as it is now (`--new` starts another).", file.display())),
            Some(_) => {
                reset()?;
                return Ok(format!("Resuming the incident in progress; {} was gone and is restored as it started.", file.display()));
            }
            None if file.exists() => bail!("{} exists but no incident is recorded (was target/ cleaned?): `cargo xtask lab pyincident --new` replaces it", file.display()),
            None => {}
        }
    }
    let seed = seed.unwrap_or_else(super::random_seed);
    std::fs::create_dir_all(state_dir())?;
    std::fs::write(state_dir().join("seed"), format!("{seed}\n"))?;
    reset()?;
    Ok(format!(
        "A new incident: {} is the service that is paging.",
        file.display()
    ))
}

/// Restores the learner's copy of the incident in progress.
pub fn reset() -> Result<()> {
    let (incident, _) =
        current()?.context("no incident in progress: `cargo xtask lab pyincident` starts one")?;
    let file = learner_file();
    std::fs::write(&file, text(Some(incident)))
        .with_context(|| format!("cannot write {}", file.display()))
}

/// The briefing printed before the learner's copy is served: what pages, and the commands.
pub fn briefing() -> String {
    format!(
        "The service in {file} is paging: its memory climbs with its traffic, and nobody knows
what keeps it. It is served below (exercise 6's model: POST /predict with 8 rows of 64
features), with leaklab's agent at /debug/leaklab. With PID and URL from its line below,
in another terminal:

  python3 lab/exercises/python/_check.py bodies 6 {state}/bodies 1
  target/debug/leaklab scan URL/predict --body {state}/bodies/000000.json \\
      --header 'content-type: application/json' --pid PID --agent URL/debug/leaklab

The census in its report names what holds the memory. Fix {file}, stop the service (Ctrl-C),
then `cargo xtask lab check pyincident`; `cargo xtask lab reveal --python` tells the answer.
",
        file = learner_file().display(),
        state = state_dir().display()
    )
}

/// Checks the service in `path` as the drill does: exercise 6's scan and answers.
pub fn check_file(path: &Path, kept: Option<PathBuf>) -> Result<Outcome> {
    exercise::check_service(6, path, "The incident's service", kept)
}

/// Checks the learner's copy (its scan report kept in the drill's folder), or with `solution`
/// the reference fix.
pub fn check(solution: bool) -> Result<Outcome> {
    if solution {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("incident_fixed.py");
        std::fs::write(&path, text(None))?;
        return check_file(&path, None);
    }
    let file = learner_file();
    if !file.exists() {
        bail!("no incident in progress: `cargo xtask lab pyincident` starts one");
    }
    check_file(&file, Some(state_dir().join("report")))
}

/// What `reveal --python` says: the incident, its zoo cause, the lines that kept the memory as
/// shipped and the reference fix's lines in their place.
pub fn reveal(incident: &PyIncident, seed: Option<u64>) -> String {
    let lines = |rendered: Vec<render::Line>, leak: bool| -> Vec<String> {
        rendered
            .iter()
            .enumerate()
            .filter(|(_, l)| {
                l.tag
                    .is_some_and(|t| t.cause == incident.zoo && t.leak == leak)
            })
            .map(|(n, l)| format!("    {:>3} | {}", n + 1, l.code.trim()))
            .collect()
    };
    let seed = seed.map_or(String::new(), |s| format!(" (seed {s})"));
    format!(
        "The incident: {}{seed}.\n  {}\n  The zoo's cause: lab/zoo/{}.py (its reports are cited there); the census names `{}` in the holder.\n\n  The lines that kept it, in {}:\n{}\n\n  The reference fix has instead (`cargo xtask lab check pyincident --solution` runs it):\n{}\n",
        incident.title,
        incident.story,
        incident.zoo,
        incident.holder,
        learner_file().display(),
        lines(render::render(TEMPLATE, Some(incident.name)), true).join("\n"),
        lines(render::render(TEMPLATE, None), false).join("\n"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_incident_is_a_zoo_cause_tagged_in_the_template() {
        let mut names: Vec<&str> = INCIDENTS.iter().map(|i| i.name).collect();
        let mut tagged = render::tagged_incidents(TEMPLATE);
        names.sort();
        tagged.sort();
        assert_eq!(tagged, names);
        for i in &INCIDENTS {
            let zoo = super::super::workspace_root().join(format!("lab/zoo/{}.py", i.zoo));
            assert!(
                zoo.is_file(),
                "{} has no zoo entry at {}",
                i.name,
                zoo.display()
            );
            let tags: Vec<_> = render::render(TEMPLATE, Some(i.name))
                .into_iter()
                .filter_map(|l| l.tag)
                .filter(|t| t.incident == i.name)
                .collect();
            assert!(
                !tags.is_empty() && tags.iter().all(|t| t.leak && t.cause == i.zoo),
                "{}'s lines carry its zoo cause",
                i.name
            );
        }
    }

    #[test]
    fn the_learners_copy_names_no_cause_and_each_differs_from_the_fix() {
        let fixed = text(None);
        for i in &INCIDENTS {
            let copy = text(Some(i));
            // (The zoo's names are not looked for: `register_forward_hook` is the code itself.)
            for word in ["LEAK(", "FIX(", "##", "lab/zoo"] {
                assert!(!copy.contains(word), "{}'s copy says {word}", i.name);
            }
            assert_ne!(copy, fixed, "{}'s copy is the fix", i.name);
        }
        assert!(
            reveal(&INCIDENTS[1], Some(7)).contains("ood.append(e)"),
            "{}",
            reveal(&INCIDENTS[1], Some(7))
        );
    }
}

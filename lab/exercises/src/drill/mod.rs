//! The incident drill: a service whose cause the learner does not know, diagnosed with the
//! instrument (`leaklab scan`, its snapshot endpoint, `leaklab snapshot diff`) and then fixed.
//!
//! Every incident's handler comes from one template ([`render`]): the same service, with an
//! answers cache, a drift monitor, a mean-output gauge, a dead-letter list for refused requests
//! and a payload-logging hook, in which one part keeps memory (or, for `bounded-cache`, none
//! does). A random seed, stored where the learner does not look, picks the incident; the
//! learner's copy (`lab/exercises/src/incident.rs`, not in git) is compiled into the
//! `leaklab-incident` binary only, so a half-edited copy never breaks the workspace. The
//! originals and the reference fix are compiled into this library for the tests.

pub mod check;
pub mod python;
pub mod render;
pub mod serve;
pub mod traffic;

use crate::Version;
use anyhow::{bail, Context, Result};
use leaklab_model::Mlp;
use leaklab_vocab::Cause;
use serde::Serialize;
use std::path::PathBuf;

/// Features per input row (the lab model's input width).
pub const FEATURES: i64 = 512;

/// What every incident's handler implements.
pub trait Incident: Send {
    /// Serves one request of `rows` rows, row-major: its answers, row-major, or why it was refused.
    fn handle(&mut self, model: &Mlp, rows: usize, values: &[f32]) -> Result<Vec<f32>, String>;
    /// The gauges the service exports about itself.
    fn stats(&self) -> Stats;
}

/// A handler's own gauges (its `/metrics`); the check holds them to the truth.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Stats {
    pub served: u64,
    pub rejected: u64,
    /// The mean of every answer's mean.
    pub mean_output: f64,
    /// The same over the last [`check::DRIFT_WINDOW`] answers (the drift monitor).
    pub recent_mean: f64,
    pub cache_entries: usize,
}

/// One incident of the drill.
#[derive(Debug, Serialize)]
pub struct IncidentInfo {
    pub name: &'static str,
    /// What it was, in a line.
    pub title: &'static str,
    /// `None`: nothing leaks.
    pub cause: Option<Cause>,
    /// What happened, for `reveal`.
    pub story: &'static str,
    pub runbook: &'static str,
    /// The template tag whose lines `reveal` shows (the bounded cache shows its bound).
    pub lines_of: &'static str,
    /// Code on the line where the held tensors are born: what a snapshot names first.
    pub born_at: &'static str,
}

pub const INCIDENTS: [IncidentInfo; 6] = [
    IncidentInfo {
        name: "graph",
        title: "autograd graphs kept alive",
        cause: Some(Cause::Graph),
        story: "The forward pass ran outside inference mode, so every answer carried an autograd graph that saved the request's features and hidden activations (80 kB per request); the mean-output gauge summed the answers as a tensor, which linked each request's graph to the next, so none was ever freed.",
        runbook: "docs/runbook.md, step 1 (Enforce inference contexts: eval + inference mode)",
        lines_of: "graph",
        born_at: "model.forward(&features)",
    },
    IncidentInfo {
        name: "drift",
        title: "dangling references: the drift monitor kept every answer",
        cause: Some(Cause::Refs),
        story: "The drift monitor kept each answer as a tensor (16 kB per request) to average its last 256, and never trimmed the list: a metrics history of tensors instead of numbers.",
        runbook: "docs/runbook.md, step 2 (Detach and extract primitives)",
        lines_of: "drift",
        born_at: "model.forward(&features)",
    },
    IncidentInfo {
        name: "cache",
        title: "an uncollected cache: the answers cache had no bound",
        cause: Some(Cause::Cache),
        story: "The answers cache was a plain map: every new input added a 16 kB answer that was never evicted. Repeated inputs added nothing, which is why a scan without --vary looks flat.",
        runbook: "docs/runbook.md, step 3 (Bound caches, and release what they held)",
        lines_of: "cache",
        born_at: "model.forward(&features)",
    },
    IncidentInfo {
        name: "error-path",
        title: "a leak on the error path only: refused requests kept as dead letters",
        cause: Some(Cause::Refs),
        story: "Every request the service refused (raw features, 64 rows, 128 kB each) was pushed onto a dead-letter list that nothing ever drained: memory grew on the refused requests only, one in eight of the traffic, and not at all under a load of good requests.",
        runbook: "docs/runbook.md, step 2 (Detach and extract primitives; error paths keep references too)",
        lines_of: "error-path",
        born_at: "Tensor::from_slice(values)",
    },
    IncidentInfo {
        name: "hook",
        title: "memory kept by a logging hook",
        cause: Some(Cause::Refs),
        story: "The payload-logging hook, a closure built at start-up, kept every request's features (16 kB) to summarise them later, and later never came. Nothing else in the service can see what a closure holds: only the snapshot's allocating line (standardise, called from handle) leads to it.",
        runbook: "docs/runbook.md, step 2 (Detach and extract primitives; hooks and closures keep references too)",
        lines_of: "hook",
        born_at: "(x - mean) / (std + 1e-6)",
    },
    IncidentInfo {
        name: "bounded-cache",
        title: "no leak: a bounded cache filling up",
        cause: None,
        story: "Nothing leaked. The answers cache grew by 16 kB per new input until it held its bound (2 MiB), then evicted as fast as it added: a plateau. A short scan, or the first minutes of a graph, show it climbing like a leak; a longer scan shows it level off. The right fix was none, and removing the cache would have cost a forward pass on every retry.",
        runbook: "docs/runbook.md, step 0 (a plateau is not a leak) and step 3 (what a bounded cache looks like)",
        lines_of: "cache",
        born_at: "model.forward(&features)",
    },
];

/// The incident called `name`.
pub fn incident(name: &str) -> Result<&'static IncidentInfo> {
    INCIDENTS.iter().find(|i| i.name == name).with_context(|| {
        format!(
            "no incident `{name}`; there are {}",
            INCIDENTS.map(|i| i.name).join(", ")
        )
    })
}

/// The incident a seed picks.
pub fn pick(seed: u64) -> &'static IncidentInfo {
    &INCIDENTS[(seed % INCIDENTS.len() as u64) as usize]
}

macro_rules! rendered {
    ($($module:ident),*) => {$(
        pub mod $module {
            include!(concat!(env!("OUT_DIR"), "/incidents/", stringify!($module), ".rs"));
        }
    )*};
}

/// Every incident's handler as shipped, rendered by build.rs from the template.
pub mod originals {
    rendered!(graph, drift, cache, error_path, hook);
}

/// The handler with every fix in: every incident's reference fix, and `bounded-cache` as shipped.
pub mod reference_fix {
    include!(concat!(env!("OUT_DIR"), "/incidents/fixed.rs"));
}

/// `incident`'s handler in `version` (the learner's is compiled into `leaklab-incident` only).
pub fn service(incident: &IncidentInfo, version: Version) -> Result<Box<dyn Incident>> {
    Ok(match (version, incident.name) {
        (Version::Learner, _) => bail!("the learner's handler is compiled into `leaklab-incident` only: run `cargo xtask lab check incident`"),
        (Version::Solution, _) | (Version::Original, "bounded-cache") => Box::new(reference_fix::Service::new()),
        (Version::Original, "graph") => Box::new(originals::graph::Service::new()),
        (Version::Original, "drift") => Box::new(originals::drift::Service::new()),
        (Version::Original, "cache") => Box::new(originals::cache::Service::new()),
        (Version::Original, "error-path") => Box::new(originals::error_path::Service::new()),
        (Version::Original, "hook") => Box::new(originals::hook::Service::new()),
        (Version::Original, other) => bail!("no compiled original for incident `{other}`"),
    })
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The learner's copy of the incident's handler.
pub fn learner_file() -> PathBuf {
    root().join("src/incident.rs")
}

/// The repository's root, without `..` in it.
pub fn workspace_root() -> PathBuf {
    let workspace = root().join("../..");
    workspace.canonicalize().unwrap_or(workspace)
}

/// Where the drill keeps its state: the seed (not shown to the learner) and the traffic.
pub fn state_dir() -> PathBuf {
    workspace_root().join("target/leaklab/incident")
}

/// The folder of captured request bodies the briefing hands to `leaklab scan --body`.
pub fn traffic_dir() -> PathBuf {
    state_dir().join("traffic")
}

/// The incident in progress and its seed, if one was started.
pub fn current() -> Result<Option<(&'static IncidentInfo, u64)>> {
    Ok(seed_in(&state_dir(), "incident")?.map(|seed| (pick(seed), seed)))
}

/// The seed a drill's incident in progress was picked with (`dir/seed`), if one was started;
/// `drill` is its `cargo xtask lab` command, for the way out of a file that holds no seed.
pub(crate) fn seed_in(dir: &std::path::Path, drill: &str) -> Result<Option<u64>> {
    let path = dir.join("seed");
    match std::fs::read_to_string(&path) {
        Ok(text) => text.trim().parse().map(Some).with_context(|| {
            format!(
                "{} is not a seed; start anew with `cargo xtask lab {drill} --new`",
                path.display()
            )
        }),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).with_context(|| format!("cannot read {}", path.display())),
    }
}

/// `incident`'s handler as shipped (the bounded cache's is the one with every fix in).
fn shipped(incident: &IncidentInfo) -> Vec<render::Line<'static>> {
    render::render(render::TEMPLATE, incident.cause.map(|_| incident.name))
}

/// The learner's copy of `incident` as shipped.
pub fn learner_text(incident: &IncidentInfo) -> String {
    render::learner_text(&shipped(incident))
}

/// Readies an incident for `leaklab-incident serve`: with `new` or a `seed`, picks one (a
/// random seed unless given) and writes the learner's copy and the traffic; otherwise keeps
/// the one in progress, the learner's edits included. Says what it did, without naming it.
pub fn prepare(new: bool, seed: Option<u64>) -> Result<String> {
    let file = learner_file();
    if !new && seed.is_none() {
        match current()? {
            Some(_) if file.exists() => return Ok(format!("Resuming the incident in progress, with {} as it is now (`--new` starts another).", file.display())),
            Some(_) => {
                reset()?;
                return Ok(format!("Resuming the incident in progress; {} was gone and is restored as it started.", file.display()));
            }
            None if file.exists() => bail!("{} exists but no incident is recorded (was target/ cleaned?): `cargo xtask lab incident --new` replaces it", file.display()),
            None => {}
        }
    }
    let seed = seed.unwrap_or_else(random_seed);
    let incident = pick(seed);
    std::fs::create_dir_all(traffic_dir())?;
    traffic::write_dir(&traffic_dir())?;
    std::fs::write(&file, learner_text(incident))
        .with_context(|| format!("cannot write {}", file.display()))?;
    std::fs::write(state_dir().join("seed"), format!("{seed}\n"))?;
    Ok(format!(
        "A new incident: {} is the handler of the service that is paging.",
        file.display()
    ))
}

/// Restores the learner's copy of the incident in progress.
pub fn reset() -> Result<()> {
    let (incident, _) =
        current()?.context("no incident in progress: `cargo xtask lab incident` starts one")?;
    std::fs::write(learner_file(), learner_text(incident))?;
    Ok(())
}

/// A seed nobody chose: the clock and the process id, mixed.
pub(crate) fn random_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    leaklab_vocab::SeededRng::new(nanos ^ (u64::from(std::process::id()) << 32)).next_u64()
}

/// One line of the handler, by its number in the file.
#[derive(Debug, Clone, Serialize)]
pub struct NumberedLine {
    pub line: usize,
    pub code: String,
}

/// What `reveal` says.
#[derive(Debug, Serialize)]
pub struct Reveal {
    pub incident: &'static IncidentInfo,
    pub seed: Option<u64>,
    pub file: String,
    /// The line where the held tensors were born: what a snapshot's "first frame" names.
    pub born: NumberedLine,
    /// The lines that held the memory (for `bounded-cache`, the cache's bound), as shipped.
    pub lines: Vec<NumberedLine>,
    /// What the reference fix has in their place (none where nothing leaked).
    pub fix: Vec<NumberedLine>,
}

/// Names the incident, its lines and its runbook step.
pub fn reveal(incident: &'static IncidentInfo, seed: Option<u64>) -> Reveal {
    let numbered = |lines: Vec<render::Line>, leak: bool| -> Vec<NumberedLine> {
        lines
            .into_iter()
            .enumerate()
            .filter(|(_, l)| {
                l.tag
                    .is_some_and(|t| t.incident == incident.lines_of && t.leak == leak)
            })
            .map(|(i, l)| NumberedLine {
                line: i + 1,
                code: l.code.trim().to_string(),
            })
            .collect()
    };
    let shipped = shipped(incident);
    let born = shipped
        .iter()
        .position(|l| l.code.contains(incident.born_at))
        .map_or(
            NumberedLine {
                line: 0,
                code: incident.born_at.into(),
            },
            |i| NumberedLine {
                line: i + 1,
                code: shipped[i].code.trim().to_string(),
            },
        );
    let (lines, fix) = if incident.cause.is_some() {
        (
            numbered(shipped, true),
            numbered(render::render(render::TEMPLATE, None), false),
        )
    } else {
        (numbered(shipped, false), Vec::new())
    };
    Reveal {
        incident,
        seed,
        file: "lab/exercises/src/incident.rs".into(),
        born,
        lines,
        fix,
    }
}

impl std::fmt::Display for Reveal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let i = self.incident;
        let seed = self.seed.map_or(String::new(), |s| format!(" (seed {s})"));
        writeln!(f, "The incident: {}{seed}.", i.title)?;
        writeln!(f, "  {}", i.story)?;
        let cause = match i.cause {
            Some(Cause::Graph) => "autograd graphs kept alive",
            Some(Cause::Refs) => "dangling references",
            Some(Cause::Cache) => "an uncollected cache",
            Some(Cause::Conv) => "a native per-shape cache",
            None => "none, nothing leaked",
        };
        writeln!(f, "  Cause: {cause}. Runbook: {}.", i.runbook)?;
        let width = self
            .lines
            .iter()
            .chain(&self.fix)
            .chain([&self.born])
            .map(|l| l.line.to_string().len())
            .max()
            .unwrap_or(1);
        writeln!(f, "\n  Where the held tensors were born (the first frame in your code a snapshot names), in {}:", self.file)?;
        writeln!(f, "    {:>width$} | {}", self.born.line, self.born.code)?;
        let heading = if i.cause.is_some() {
            "The lines that kept them"
        } else {
            "The lines that bound the cache"
        };
        writeln!(f, "\n  {heading}, as the incident started:")?;
        for l in &self.lines {
            writeln!(f, "    {:>width$} | {}", l.line, l.code)?;
        }
        if i.cause.is_some() {
            writeln!(f, "\n  The reference fix has instead (`cargo xtask lab check incident --solution` runs it):")?;
            for l in &self.fix {
                writeln!(f, "    {:>width$} | {}", l.line, l.code)?;
            }
        } else {
            writeln!(f, "\n  Nothing to fix: `cargo xtask lab check incident` passes the file as shipped, and fails it if the cache is dropped.")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_catalogue_and_the_templates_tags_name_the_same_incidents() {
        let mut tagged = render::tagged_incidents(render::TEMPLATE);
        tagged.sort();
        let mut leaking: Vec<&str> = INCIDENTS
            .iter()
            .filter(|i| i.cause.is_some())
            .map(|i| i.name)
            .collect();
        leaking.sort();
        assert_eq!(
            tagged, leaking,
            "every leaking incident has tagged lines in the template, and only they do"
        );
        for i in &INCIDENTS {
            assert!(
                tagged.contains(&i.lines_of),
                "{}: its lines come from `{}`, which the template does not tag",
                i.name,
                i.lines_of
            );
            let r = reveal(i, None);
            assert!(!r.lines.is_empty(), "{}: no lines to reveal", i.name);
            assert!(
                r.born.line > 0,
                "{}: `{}` is on no line of its handler",
                i.name,
                i.born_at
            );
            assert_eq!(
                r.fix.is_empty(),
                i.cause.is_none(),
                "{}: a fix exactly where something leaks",
                i.name
            );
        }
    }

    #[test]
    fn every_seed_picks_an_incident_and_each_incident_has_seeds() {
        for (n, i) in INCIDENTS.iter().enumerate() {
            assert_eq!(pick(n as u64).name, i.name);
            assert_eq!(pick(n as u64 + 6 * 1_000_003).name, i.name);
        }
    }

    #[test]
    fn every_leak_line_has_a_reason_and_its_fix_twin_in_the_same_cause() {
        for (_, t) in render::TEMPLATE.lines().filter_map(render::tag) {
            assert!(
                ["graph", "refs", "cache"].contains(&t.cause),
                "unknown cause {t:?}"
            );
            let twin = render::TEMPLATE
                .lines()
                .filter_map(render::tag)
                .any(|(_, o)| o.leak != t.leak && o.incident == t.incident && o.cause == t.cause);
            assert!(twin, "{t:?} has no twin of the other kind");
        }
    }

    #[test]
    fn the_learners_copy_gives_nothing_away() {
        for i in &INCIDENTS {
            let text = learner_text(i);
            for giveaway in ["LEAK(", "FIX(", "//#"] {
                assert!(
                    !text.contains(giveaway),
                    "{}: the learner's copy contains {giveaway}",
                    i.name
                );
            }
            assert!(
                text.starts_with("//!") && text.ends_with("}\n"),
                "{}",
                i.name
            );
        }
    }
}

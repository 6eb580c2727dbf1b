//! Workshop exercises: one leaky service per cause, plus the seed container with all three, and
//! two Python services drawn from the zoo (a per-shape native cache; grad mode across threads).
//!
//! The learner edits `src/exN_*.rs`; `cargo xtask lab check N` runs that code under the leak
//! check and against the model's true outputs. The pristine copies in `original/` and the
//! reference solutions in `lab/solutions/` are compiled beside them, so the tests prove both
//! halves (every untouched exercise fails its check, every solution passes it) without ever
//! running the learner's files: a learner's fix cannot turn the test suite red.

// Every exercise's `Service::new()` builds the model it serves: a `Default` beside it would be a
// second way to say the same thing in code a learner reads.
#![allow(clippy::new_without_default)]

use leaklab_detect::Verdict;
use leaklab_model::{Mlp, Scale};
use leaklab_probe::guard::TorchLeakCheck;
use leaklab_report::human_bytes;
use std::cell::RefCell;
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use tch::{Device, Tensor};

pub mod ex1_graph;
pub mod ex2_refs;
pub mod ex3_cache;
pub mod ex4_seed;

/// Exercises 5 and 6: Python services drawn from the zoo, served and scanned from outside.
pub mod python;

/// The incident drill (its handlers name this crate as `leaklab_exercises`, wherever they are compiled).
pub mod drill;
extern crate self as leaklab_exercises;

/// The exercises as shipped, compiled from lab/exercises/original/.
#[path = "../original/mod.rs"]
pub mod original;

/// The reference solutions, compiled from lab/solutions/.
#[path = "../../solutions/mod.rs"]
pub mod solutions;

/// What every exercise implements: serve one request.
pub trait Exercise {
    /// Runs the model on a batch of inputs and returns the outputs, row-major.
    fn handle(&mut self, model: &Mlp, x: &Tensor) -> Vec<f32>;
    /// A statistic the service keeps across requests (a mean, a peak or a count, depending on
    /// the exercise); it must stay a finite number after the fix.
    fn statistic(&self) -> f64;
}

pub struct Info {
    pub number: usize,
    pub name: &'static str,
    pub file: &'static str,
    pub symptom: &'static str,
    pub kind: Kind,
}

/// What an exercise is written in, and so how it is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A service in `src/`, checked in-process by the exact allocator (`check`).
    Rust,
    /// A FastAPI service in `python/`, served and scanned from outside (`python::check`).
    Python,
}

pub const EXERCISES: [Info; 6] = [
    Info {
        number: 1,
        name: "graph",
        file: "ex1_graph.rs",
        symptom: "memory climbs by a forward pass's activations on every request",
        kind: Kind::Rust,
    },
    Info {
        number: 2,
        name: "refs",
        file: "ex2_refs.rs",
        symptom: "memory climbs by one output per request",
        kind: Kind::Rust,
    },
    Info {
        number: 3,
        name: "cache",
        file: "ex3_cache.rs",
        symptom: "memory climbs by one output per new input, forever",
        kind: Kind::Rust,
    },
    Info {
        number: 4,
        name: "seed",
        file: "ex4_seed.rs",
        symptom: "the container of the story: all three at once",
        kind: Kind::Rust,
    },
    Info {
        number: 5,
        name: "shapes",
        file: "ex5_shapes.py",
        symptom:
            "a conv service's memory climbs with every new image size; no Python object holds it",
        kind: Kind::Python,
    },
    Info {
        number: 6,
        name: "threads",
        file: "ex6_threads.py",
        symptom: "memory climbs on every request though the model runs under no_grad()",
        kind: Kind::Python,
    },
];

pub fn info(n: usize) -> anyhow::Result<&'static Info> {
    EXERCISES.iter().find(|e| e.number == n).ok_or_else(|| {
        anyhow::anyhow!(
            "no exercise {n}; `cargo xtask lab list` shows 1 to {}",
            EXERCISES.len()
        )
    })
}

/// Which copy of an exercise to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// The learner's working copy in `src/` (what `cargo xtask lab check N` runs).
    Learner,
    /// The pristine copy in `original/` (what the tests run).
    Original,
    /// The reference solution in `lab/solutions/`.
    Solution,
}

/// Exercise `n` in the given version.
pub fn service(n: usize, version: Version) -> anyhow::Result<Box<dyn Exercise>> {
    if info(n)?.kind == Kind::Python {
        anyhow::bail!("exercise {n} is a Python service: `python::check` runs it");
    }
    Ok(match (version, n) {
        (Version::Learner, 1) => Box::new(ex1_graph::Service::new()),
        (Version::Learner, 2) => Box::new(ex2_refs::Service::new()),
        (Version::Learner, 3) => Box::new(ex3_cache::Service::new()),
        (Version::Learner, _) => Box::new(ex4_seed::Service::new()),
        (Version::Original, 1) => Box::new(original::ex1_graph::Service::new()),
        (Version::Original, 2) => Box::new(original::ex2_refs::Service::new()),
        (Version::Original, 3) => Box::new(original::ex3_cache::Service::new()),
        (Version::Original, _) => Box::new(original::ex4_seed::Service::new()),
        (Version::Solution, 1) => Box::new(solutions::ex1_graph::Service::new()),
        (Version::Solution, 2) => Box::new(solutions::ex2_refs::Service::new()),
        (Version::Solution, 3) => Box::new(solutions::ex3_cache::Service::new()),
        (Version::Solution, _) => Box::new(solutions::ex4_seed::Service::new()),
    })
}

/// A key for a batch of inputs (the exercises' caches use it).
pub fn input_key(x: &Tensor) -> u64 {
    let values = Vec::<f32>::try_from(x.flatten(0, -1)).expect("f32 input");
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for v in values {
        v.to_bits().hash(&mut h);
    }
    h.finish()
}

const ROWS: i64 = 8;
const WARMUP: usize = 10;
const ITERATIONS: usize = 200;

/// Request `i`'s input: new for most requests; every fifth repeats an earlier one, so a cache
/// is exercised (hits must return the right outputs too).
fn input(i: usize) -> Tensor {
    let seed = if i % 5 == 4 { i - 3 } else { i } as u64;
    let mut rng = leaklab_vocab::SeededRng::new(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let values: Vec<f32> = (0..ROWS * 512).map(|_| rng.symmetric() as f32).collect();
    Tensor::from_slice(&values).view([ROWS, 512])
}

/// The true answer to request `i` of a check's replay (`replay`: the exercises' inputs or the
/// incident's traffic), computed by `compute` once a process: every check of a replay sends the
/// same requests to the same reference model, and the tests run up to nine checks in a process,
/// where the truth's forward passes were about half of each check's CPU. Kept as plain floats,
/// outside the allocator the leak check reads.
pub(crate) fn truth_once(
    replay: &'static str,
    i: usize,
    compute: impl FnOnce() -> Vec<f32>,
) -> Arc<Vec<f32>> {
    type Truths = BTreeMap<(&'static str, usize), Arc<Vec<f32>>>;
    static TRUTHS: Mutex<Truths> = Mutex::new(BTreeMap::new());
    let known = TRUTHS
        .lock()
        .expect("no check panics holding it")
        .get(&(replay, i))
        .cloned();
    known.unwrap_or_else(|| {
        let want = Arc::new(compute());
        TRUTHS
            .lock()
            .expect("no check panics holding it")
            .insert((replay, i), Arc::clone(&want));
        want
    })
}

pub struct Outcome {
    pub passed: bool,
    pub text: String,
}

/// Runs exercise `n`'s service under the leak check and against the true outputs, and says in
/// plain words how it went.
pub fn check(n: usize, service: &mut dyn Exercise) -> anyhow::Result<Outcome> {
    let info = info(n)?;
    let model = reference_model();
    let wrong = RefCell::new(Vec::<String>::new());
    let report = TorchLeakCheck::new(WARMUP, ITERATIONS).run(|i| {
        let x = input(i);
        // The reference model's answer to request `i`, the same in every check.
        let want = truth_once("exercise", i, || {
            Vec::<f32>::try_from(leaklab_probe::inference_mode(|| model.forward(&x)).flatten(0, -1))
                .expect("f32")
        });
        let got = service.handle(&model, &x);
        if let Err(e) = compare(&got, &want) {
            wrong.borrow_mut().push(format!("request {i}: {e}"));
        }
    });
    let mut text = format!(
        "Exercise {n} ({}), {} warm-up + {} requests of {ROWS} rows:\n",
        info.name, WARMUP, ITERATIONS
    );
    let (leaks, memory) = memory_finding(&report);
    text.push_str(&memory);
    let wrong = wrong.into_inner();
    if wrong.is_empty() {
        text.push_str("  Outputs are correct on every request.\n");
    } else {
        text.push_str(&format!(
            "  Outputs are WRONG on {} requests, e.g. {}.\n",
            wrong.len(),
            wrong[0]
        ));
    }
    let statistic = service.statistic();
    if !statistic.is_finite() {
        text.push_str("  The service's statistic is not a finite number: keep it working.\n");
    }
    let passed = !leaks && wrong.is_empty() && statistic.is_finite();
    text.push_str(if passed {
        "  PASS: the leak is gone and the service still answers right.\n"
    } else {
        "  NOT YET: see above; lab/README.md has hints.\n"
    });
    Ok(Outcome { passed, text })
}

/// Whether answers match the true outputs, to f32 rounding; what differs first if not.
pub fn compare(got: &[f32], want: &[f32]) -> Result<(), String> {
    if got.len() != want.len() {
        return Err(format!(
            "{} output values, expected {}",
            got.len(),
            want.len()
        ));
    }
    match got
        .iter()
        .zip(want)
        .position(|(a, b)| (a - b).abs() > 1e-4 * (1.0 + b.abs()))
    {
        Some(j) => Err(format!("output {j} is {}, expected {}", got[j], want[j])),
        None => Ok(()),
    }
}

/// The lab model, its weights in a memory context of their own: built while another check
/// runs (the tests run in parallel), they must not count as that check's memory.
pub fn reference_model() -> Mlp {
    let _ctx = leaklab_probe::MemoryContext::named("reference model").enter();
    Mlp::new(Scale::Default.config(), Device::Cpu)
}

/// What a leak check's exact allocator found, in plain words: whether `handle()` still leaks,
/// and the lines that say so.
pub fn memory_finding(report: &leaklab_detect::LeakReport) -> (bool, String) {
    let probe = &report.probes[0];
    let mut text = String::new();
    let leaks = match &probe.judgement {
        Ok(j) if j.verdict == Verdict::Leak => {
            text.push_str(&format!(
                "  It still leaks: {} per request stays allocated after handle() returns.\n",
                human_bytes(j.slope.bytes_per_request)
            ));
            if let Some(p) = probe.projection {
                text.push_str(&format!(
                    "  At that rate an 80 GB card that starts at 12 GB is full after {} requests: {:.0} hours at one request every 32 s.\n",
                    p.requests,
                    p.hours()
                ));
            }
            text.push_str("  Memory born in handle() is being kept: look for tensors that outlive the request.\n");
            true
        }
        Ok(j) => {
            let how = if j.verdict == Verdict::Plateau {
                "grows to a bound and stops (a bounded cache)"
            } else {
                "stays flat"
            };
            text.push_str(&format!(
                "  Memory {how}: {} per request after warm-up.\n",
                human_bytes(j.slope.bytes_per_request)
            ));
            false
        }
        Err(e) => {
            text.push_str(&format!("  No verdict: {e}\n"));
            true
        }
    };
    (leaks, text)
}

/// Restores exercise `n` to its starting state (from lab/exercises/original/).
pub fn reset(n: usize) -> anyhow::Result<()> {
    let info = info(n)?;
    if info.kind == Kind::Python {
        std::fs::copy(
            python::file(info, Version::Original),
            python::file(info, Version::Learner),
        )?;
        return Ok(());
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    std::fs::copy(
        root.join("original").join(info.file),
        root.join("src").join(info.file),
    )?;
    Ok(())
}

//! The Python exercises (5 and 6): each untouched original fails its check, each reference
//! solution passes it, and a "fix" that answers nothing fails. Real services on loopback,
//! scanned by the `leaklab` binary; like tests/check.rs, never the learner's copies.
//!
//! Needs a python with torch and FastAPI (`LEAKLAB_PYTHON`, set by the xtask) and the `leaklab`
//! binary (`target/debug/leaklab`, built by `cargo xtask test`; or `LEAKLAB_BIN`). Without
//! them the tests say so and return; under CI=true they fail.

use leaklab_exercises::drill::python as drill;
use leaklab_exercises::python::{check, check_file, file, leaklab_bin, python};
use leaklab_exercises::{info, Kind, Version, EXERCISES};

/// Whether the tests can run here; under CI=true a missing python, torch or binary fails.
fn ready() -> bool {
    let ci = std::env::var("CI").is_ok_and(|v| v == "true");
    // Found, not imported: importing torch costs 2-2.5 s of CPU a test, and the services
    // import it anyway.
    let torch = std::process::Command::new(python())
        .args([
            "-c",
            "import importlib.util as u, sys; \
            sys.exit(any(u.find_spec(m) is None for m in ('torch', 'fastapi', 'uvicorn')))",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    let missing = match (torch, leaklab_bin().is_file()) {
        (false, _) => format!("{} with torch, fastapi and uvicorn", python().display()),
        (true, false) => format!("the leaklab binary at {}", leaklab_bin().display()),
        (true, true) => return true,
    };
    assert!(
        !ci,
        "CI=true and no {missing}: the Python exercises cannot be checked"
    );
    eprintln!("SKIPPED: no {missing} (CI=true makes this a failure)");
    false
}

// Measured with `target/debug/leaklab-exercises check 5 [--solution]` on this project's 2-core
// machine (shared with builds), 3 runs each, the whole check (serve, 220 requests scanned, 20
// answers verified): original NOT YET 3 of 3, read `plateau` at 288-293 kB a request, rising
// 49.4-50.9 MB over the 200 new sizes (the 10 MB bound fails it), answers right, 7.9-8.0 s;
// solution PASS 3 of 3, flat, 0 B a request, rise 0 B, 7.6-8.2 s. (The caches' knobs instead
// of buckets, one scan: flat, 1.5 kB a request, rise -0.4 MB, answers right.)
#[test]
fn exercise_5_original_fails_and_solution_passes() {
    original_fails_and_solution_passes(5, "still grows with every new size");
}

// `check 6 [--solution]`, 3 runs each: original NOT YET 3 of 3, `leak` at 70.8-70.9 kB a
// request (rise 12.5 MB), answers right, 8.7-11.4 s; solution PASS 3 of 3, flat, 0-73 B a
// request (rise 8-16 kB), 6.4-7.2 s.
#[test]
fn exercise_6_original_fails_and_solution_passes() {
    original_fails_and_solution_passes(6, "It still leaks");
}

/// Exercise `n` untouched fails its check saying `still` (its answers right), and its reference
/// solution passes.
fn original_fails_and_solution_passes(n: usize, still: &str) {
    if !ready() {
        return;
    }
    let untouched = check(n, Version::Original).unwrap();
    assert!(
        !untouched.passed,
        "exercise {n} passes untouched:\n{}",
        untouched.text
    );
    assert!(untouched.text.contains(still), "{}", untouched.text);
    assert!(
        untouched.text.contains("Answers are right"),
        "{}",
        untouched.text
    );
    let solved = check(n, Version::Solution).unwrap();
    assert!(
        solved.passed,
        "the solution of exercise {n} fails:\n{}",
        solved.text
    );
}

#[test]
fn the_python_exercises_have_something_to_fix() {
    for e in EXERCISES.iter().filter(|e| e.kind == Kind::Python) {
        let original = std::fs::read_to_string(file(e, Version::Original)).unwrap();
        let solution = std::fs::read_to_string(file(e, Version::Solution)).unwrap();
        assert_ne!(
            original, solution,
            "exercise {}'s solution is its original",
            e.number
        );
        assert!(
            original.contains("LEAK(") && !original.contains("FIX("),
            "exercise {}",
            e.number
        );
        assert!(
            solution.contains("FIX("),
            "exercise {}'s solution marks no FIX",
            e.number
        );
    }
    assert!(info(7).is_err());
}

/// Writes `source` as a service file in `dir` and checks it as exercise `n`.
fn check_source(n: usize, source: &str) -> leaklab_exercises::Outcome {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fix.py");
    std::fs::write(&path, source).unwrap();
    check_file(n, &path).unwrap()
}

#[test]
fn a_fix_that_answers_nothing_fails() {
    if !ready() {
        return;
    }
    // Memory flat (the model never runs), answers empty.
    let outcome = check_source(
        6,
        "from typing import Any\n\
         def make_app() -> Any:\n\
         \x20   from fastapi import FastAPI, Request\n\
         \x20   app = FastAPI()\n\
         \x20   @app.post('/predict')\n\
         \x20   async def predict(request: Request) -> dict[str, Any]:\n\
         \x20       return {'outputs': [], 'mean_norm': 0.0}\n\
         \x20   return app\n",
    );
    assert!(!outcome.passed, "{}", outcome.text);
    assert!(
        outcome.text.contains("Memory no longer grows"),
        "{}",
        outcome.text
    );
    assert!(
        outcome.text.contains("Answers are WRONG on 20 of 20"),
        "{}",
        outcome.text
    );
}

#[test]
fn padding_without_cropping_back_fails() {
    if !ready() {
        return;
    }
    // The tempting half-fix of exercise 5: memory flat, answers averaged over the padding.
    let solution = std::fs::read_to_string(file(info(5).unwrap(), Version::Solution)).unwrap();
    let uncropped = "y = net(padded)\n";
    let source = solution.replace("y = net(padded)[..., : h - TRIM, : w - TRIM]\n", uncropped);
    assert!(
        source.contains(uncropped),
        "the solution no longer crops where this test expects"
    );
    let outcome = check_source(5, &source);
    assert!(!outcome.passed, "{}", outcome.text);
    assert!(
        outcome.text.contains("Memory no longer grows"),
        "{}",
        outcome.text
    );
    assert!(
        outcome.text.contains("Answers are WRONG"),
        "{}",
        outcome.text
    );
}

/// The Python drill's incident `name`, as shipped, fails its check (its answers right), and the
/// check's census names its holder (what `leaklab scan --agent` shows the learner).
fn incident_untouched_fails(name: &str) {
    if !ready() {
        return;
    }
    let incident = drill::incident(name).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("incident.py");
    std::fs::write(&path, drill::text(Some(incident))).unwrap();
    let outcome = drill::check_file(&path, None).unwrap();
    assert!(
        !outcome.passed,
        "{name} passes untouched:\n{}",
        outcome.text
    );
    for words in ["It still leaks", "Answers are right", incident.holder] {
        assert!(
            outcome.text.contains(words),
            "{name}: no {words:?} in\n{}",
            outcome.text
        );
    }
}

#[test]
fn the_python_incident_hook_untouched_fails() {
    incident_untouched_fails("hook");
}

#[test]
fn the_python_incident_exceptions_untouched_fails() {
    incident_untouched_fails("exceptions");
}

#[test]
fn the_python_incident_cycles_untouched_fails() {
    incident_untouched_fails("cycles");
}

#[test]
fn the_python_incidents_reference_fix_passes() {
    if !ready() {
        return;
    }
    let outcome = drill::check(true).unwrap();
    assert!(outcome.passed, "{}", outcome.text);
}

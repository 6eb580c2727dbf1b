//! Every untouched exercise fails its check; every reference solution passes it; a "fix" that
//! answers nothing fails. These run the pristine `original/` copies, never the learner's
//! `src/`, so a learner's fix (or a half-done one) cannot turn `cargo xtask test` red.

use leaklab_exercises::{check, service, Exercise, Kind, Version, EXERCISES};
use leaklab_model::Mlp;
use tch::Tensor;

#[test]
fn untouched_exercises_fail_and_solutions_pass() {
    leaklab_probe::cpu::install().unwrap();
    // The Python exercises (5, 6) are checked from outside: tests/python.rs.
    for e in EXERCISES.iter().filter(|e| e.kind == Kind::Rust) {
        let untouched = check(
            e.number,
            service(e.number, Version::Original).unwrap().as_mut(),
        )
        .unwrap();
        assert!(
            !untouched.passed,
            "exercise {} passes untouched:\n{}",
            e.number, untouched.text
        );
        assert!(
            untouched.text.contains("It still leaks"),
            "{}",
            untouched.text
        );
        assert!(
            untouched.text.contains("hours at one request every 32 s"),
            "{}",
            untouched.text
        );
        let solved = check(
            e.number,
            service(e.number, Version::Solution).unwrap().as_mut(),
        )
        .unwrap();
        assert!(
            solved.passed,
            "the solution of exercise {} fails:\n{}",
            e.number, solved.text
        );
    }
}

struct AnswersNothing;

impl Exercise for AnswersNothing {
    fn handle(&mut self, _: &Mlp, _: &Tensor) -> Vec<f32> {
        Vec::new()
    }
    fn statistic(&self) -> f64 {
        0.0
    }
}

#[test]
fn a_fix_that_answers_nothing_fails() {
    leaklab_probe::cpu::install().unwrap();
    let outcome = check(2, &mut AnswersNothing).unwrap();
    assert!(!outcome.passed);
    assert!(
        outcome.text.contains("Outputs are WRONG"),
        "{}",
        outcome.text
    );
}

#[test]
fn no_test_runs_the_learners_files() {
    // What makes a learner's fix unable to turn the suite red: the tests name only the
    // pristine copies and the solutions. (The exercises' binary, `cargo xtask lab check N`, is
    // what runs the learner's files.)
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    // The incident drill's learner copy is compiled into its own binary only (behind a
    // feature), never into the library the tests link: no test may name it or that binary.
    let learner = [
        ["Version::", "Learner"].concat(),
        ["learner", "_file"].concat(),
        ["src/", "incident.rs"].concat(),
        ["leaklab-", "incident"].concat(),
    ];
    for test in std::fs::read_dir(root.join("tests")).unwrap().flatten() {
        let text = std::fs::read_to_string(test.path()).unwrap();
        for name in &learner {
            assert!(
                !text.contains(name.as_str()),
                "{} names {name}: it would run the learner's files",
                test.path().display()
            );
        }
    }
    let lib = std::fs::read_to_string(root.join("src/lib.rs")).unwrap();
    assert!(
        !lib.contains("mod incident;"),
        "the library must not compile the learner's incident copy"
    );
    for e in EXERCISES.iter().filter(|e| e.kind == Kind::Rust) {
        let original = std::fs::read_to_string(root.join("original").join(e.file)).unwrap();
        let solution = std::fs::read_to_string(root.join("../solutions").join(e.file)).unwrap();
        assert_ne!(
            original, solution,
            "exercise {}'s solution is its original, unchanged: there is nothing to fix",
            e.number
        );
    }
}

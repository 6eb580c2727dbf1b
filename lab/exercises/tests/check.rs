//! Every untouched exercise fails its check; every reference solution passes it; a "fix" that
//! answers nothing fails; the files `reset` restores are the ones shipped.

use leaklab_exercises::{check, service, Exercise, EXERCISES};
use leaklab_model::Mlp;
use tch::Tensor;

#[test]
fn untouched_exercises_fail_and_solutions_pass() {
    leaklab_probe::cpu::install().unwrap();
    for e in &EXERCISES {
        let untouched = check(e.number, service(e.number, false).unwrap().as_mut()).unwrap();
        assert!(!untouched.passed, "exercise {} passes untouched:\n{}", e.number, untouched.text);
        assert!(untouched.text.contains("It still leaks"), "{}", untouched.text);
        assert!(untouched.text.contains("hours at one request every 32 s"), "{}", untouched.text);
        let solved = check(e.number, service(e.number, true).unwrap().as_mut()).unwrap();
        assert!(solved.passed, "the solution of exercise {} fails:\n{}", e.number, solved.text);
    }
}

struct AnswersNothing;

impl Exercise for AnswersNothing {
    fn handle(&mut self, _: &Mlp, _: &Tensor) -> Vec<f32> {
        Vec::new()
    }
    fn mean_output(&self) -> f64 {
        0.0
    }
}

#[test]
fn a_fix_that_answers_nothing_fails() {
    leaklab_probe::cpu::install().unwrap();
    let outcome = check(2, &mut AnswersNothing).unwrap();
    assert!(!outcome.passed);
    assert!(outcome.text.contains("Outputs are WRONG"), "{}", outcome.text);
}

#[test]
fn the_shipped_exercises_are_their_originals() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    for e in &EXERCISES {
        let shipped = std::fs::read_to_string(root.join("src").join(e.file)).unwrap();
        let original = std::fs::read_to_string(root.join("original").join(e.file)).unwrap();
        assert_eq!(shipped, original, "lab/exercises/src/{} differs from original/ (run `cargo xtask lab reset {}` or update original/)", e.file, e.number);
    }
}

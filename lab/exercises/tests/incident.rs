//! The incident drill's check, on every incident as shipped and on the "fixes" a learner might
//! try: every leaking incident fails untouched and passes with the reference fix; the bounded
//! cache passes untouched and fails when the cache is dropped, the answers change, or raw inputs
//! are answered. Only the compiled originals and the reference fix run here, never the
//! learner's copy.

use leaklab_exercises::drill::{self, check::check, Incident, Stats, INCIDENTS};
use leaklab_exercises::Version;
use leaklab_model::Mlp;
use std::collections::VecDeque;
use tch::{Kind, Tensor};

fn shipped(name: &str) -> Box<dyn Incident> {
    drill::service(drill::incident(name).unwrap(), Version::Original).unwrap()
}

#[test]
fn every_leaking_incident_fails_untouched_on_its_memory_alone_and_the_reference_fix_passes() {
    for incident in INCIDENTS.iter().filter(|i| i.cause.is_some()) {
        let outcome = check(shipped(incident.name).as_mut());
        assert!(
            !outcome.passed,
            "{} passes untouched:\n{}",
            incident.name, outcome.text
        );
        // The leak is the only thing wrong with it: the check must not fail it for anything else.
        for fine in [
            "It still leaks",
            "Answers: right",
            "Cache: all",
            "Gauges: ",
            ": right.",
        ] {
            assert!(
                outcome.text.contains(fine),
                "{}: expected {fine:?} in\n{}",
                incident.name,
                outcome.text
            );
        }
    }
    let fixed = check(
        drill::service(&INCIDENTS[0], Version::Solution)
            .unwrap()
            .as_mut(),
    );
    assert!(fixed.passed, "the reference fix fails:\n{}", fixed.text);
}

#[test]
fn the_bounded_cache_passes_untouched_because_it_levels_off() {
    let outcome = check(shipped("bounded-cache").as_mut());
    assert!(outcome.passed, "{}", outcome.text);
    assert!(
        outcome.text.contains("grows to a bound and stops"),
        "the cache fills inside the window and then stops:\n{}",
        outcome.text
    );
}

/// The bounded-cache incident "fixed" by taking the cache out: right answers and gauges, no
/// leak, and a forward pass on every retry.
#[derive(Default)]
struct NoCache {
    stats: Option<Stats>,
    sum: f64,
    recent: VecDeque<f64>,
}

impl Incident for NoCache {
    fn handle(&mut self, model: &Mlp, rows: usize, values: &[f32]) -> Result<Vec<f32>, String> {
        let stats = self.stats.get_or_insert(Stats {
            served: 0,
            rejected: 0,
            mean_output: 0.0,
            recent_mean: 0.0,
            cache_entries: 0,
        });
        let x = Tensor::from_slice(values).view([rows as i64, drill::FEATURES]);
        if x.abs().max().double_value(&[]) > 50.0 {
            stats.rejected += 1;
            return Err("raw features".into());
        }
        let features =
            (&x - x.mean_dim(-1, true, Kind::Float)) / (x.std_dim(-1, false, true) + 1e-6);
        let answer = leaklab_probe::inference_mode(|| model.forward(&features));
        let mean = answer.mean(Kind::Float).double_value(&[]);
        self.sum += mean;
        self.recent.push_back(mean);
        if self.recent.len() > drill::check::DRIFT_WINDOW {
            self.recent.pop_front();
        }
        stats.served += 1;
        stats.mean_output = self.sum / stats.served as f64;
        stats.recent_mean = self.recent.iter().sum::<f64>() / self.recent.len() as f64;
        Ok(Vec::<f32>::try_from(answer.flatten(0, -1)).unwrap())
    }
    fn stats(&self) -> Stats {
        self.stats.unwrap()
    }
}

/// The shipped handler with its answers rounded to two decimals.
struct Rounded(Box<dyn Incident>);

impl Incident for Rounded {
    fn handle(&mut self, model: &Mlp, rows: usize, values: &[f32]) -> Result<Vec<f32>, String> {
        self.0
            .handle(model, rows, values)
            .map(|a| a.into_iter().map(|v| (v * 100.0).round() / 100.0).collect())
    }
    fn stats(&self) -> Stats {
        self.0.stats()
    }
}

/// The shipped handler answering zeros where it should refuse.
struct RefusesNothing(Box<dyn Incident>);

impl Incident for RefusesNothing {
    fn handle(&mut self, model: &Mlp, rows: usize, values: &[f32]) -> Result<Vec<f32>, String> {
        Ok(self
            .0
            .handle(model, rows, values)
            .unwrap_or_else(|_| vec![0.0; rows * 512]))
    }
    fn stats(&self) -> Stats {
        self.0.stats()
    }
}

#[test]
fn the_bounded_cache_fails_when_the_cache_is_fixed_away_or_the_answers_change() {
    let outcome = check(&mut NoCache::default());
    assert!(!outcome.passed, "{}", outcome.text);
    assert!(
        outcome
            .text
            .contains("of 108 repeated inputs ran the model again")
            && outcome.text.contains("Answers: right"),
        "{}",
        outcome.text
    );

    let outcome = check(&mut Rounded(shipped("bounded-cache")));
    assert!(
        !outcome.passed && outcome.text.contains("Answers are WRONG"),
        "{}",
        outcome.text
    );

    let outcome = check(&mut RefusesNothing(shipped("bounded-cache")));
    assert!(
        !outcome.passed && outcome.text.contains("were answered instead of refused"),
        "{}",
        outcome.text
    );
}

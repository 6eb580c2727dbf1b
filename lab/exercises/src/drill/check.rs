//! `cargo xtask lab check incident`: is the leak gone, are the answers still right, and is the
//! answers cache still there?
//!
//! It replays the drill's traffic ([`super::traffic`]) through a handler under the exact
//! allocator's leak check, long enough for the 2 MiB answers cache to fill before the middle
//! of the window (so a bounded cache reads as a plateau, not a leak), and holds the handler to
//! the truth: every good request answered with the model's outputs, every raw one refused,
//! every repeated input answered without running the model, and the gauges right.

use super::traffic::{self, Kind};
use super::Incident;
use crate::{compare, memory_finding, reference_model, Outcome};
use leaklab_model::Mlp;
use leaklab_probe::guard::TorchLeakCheck;
use std::collections::VecDeque;
use tch::{Kind as Dtype, Tensor};

pub const WARMUP: usize = 20;
pub const REQUESTS: usize = 600;
/// The answers the drift monitor averages over, as the service's spec has it.
pub const DRIFT_WINDOW: usize = 256;

/// What the handler should have answered for request `r`: standardised rows through the model.
fn truth(model: &Mlp, r: &traffic::Request) -> Vec<f32> {
    leaklab_probe::inference_mode(|| {
        let x = Tensor::from_slice(&r.values).view([r.rows as i64, super::FEATURES]);
        let features =
            (&x - x.mean_dim(-1, true, Dtype::Float)) / (x.std_dim(-1, false, true) + 1e-6);
        Vec::<f32>::try_from(model.forward(&features).flatten(0, -1)).expect("f32 answers")
    })
}

#[derive(Default)]
struct Tally {
    good: u64,
    raw: u64,
    wrong: Vec<String>,
    repeats: u64,
    repeats_that_ran_the_model: u64,
    sum_of_means: f64,
    recent_means: VecDeque<f64>,
}

impl Tally {
    fn answered(&mut self, want: &[f32]) {
        let mean = want.iter().map(|&v| f64::from(v)).sum::<f64>() / want.len() as f64;
        self.good += 1;
        self.sum_of_means += mean;
        self.recent_means.push_back(mean);
        if self.recent_means.len() > DRIFT_WINDOW {
            self.recent_means.pop_front();
        }
    }
}

/// Replays the traffic through `service` and says in plain words how it went.
pub fn check(service: &mut dyn Incident) -> Outcome {
    let model = reference_model();
    let mut tally = Tally::default();
    let report = TorchLeakCheck::new(WARMUP, REQUESTS).run(|i| {
        let r = traffic::request(i);
        let before = model.forward_calls();
        let got = service.handle(&model, r.rows, &r.values);
        let ran_model = model.forward_calls() > before;
        match (r.kind, got) {
            (Kind::Raw, Err(_)) => tally.raw += 1,
            (Kind::Raw, Ok(_)) => tally.wrong.push(format!(
                "request {i}: raw features (values up to 1000) were answered instead of refused"
            )),
            (_, Err(e)) => tally
                .wrong
                .push(format!("request {i}: a good request was refused: {e}")),
            (kind, Ok(answers)) => {
                // The reference model's answer to request `i`, the same in every check.
                let want = crate::truth_once("incident", i, || truth(&model, &r));
                if let Err(e) = compare(&answers, &want) {
                    tally.wrong.push(format!("request {i}: {e}"));
                }
                tally.answered(&want);
                if kind == Kind::Repeat {
                    tally.repeats += 1;
                    tally.repeats_that_ran_the_model += u64::from(ran_model);
                }
            }
        }
    });
    let mut text = format!(
        "The incident's handler, {WARMUP} warm-up + {REQUESTS} requests (1 in 8 raw features to refuse, 1 in 5 good inputs repeated):\n"
    );
    let (leaks, memory) = memory_finding(&report);
    text.push_str(&memory);

    let answers_right = tally.wrong.is_empty();
    if answers_right {
        text.push_str(&format!(
            "  Answers: right on all {} good requests, and all {} raw ones refused.\n",
            tally.good, tally.raw
        ));
    } else {
        text.push_str(&format!(
            "  Answers are WRONG on {} requests, e.g. {}.\n",
            tally.wrong.len(),
            tally.wrong[0]
        ));
    }

    let cache_kept = tally.repeats_that_ran_the_model == 0 && tally.repeats > 0;
    if cache_kept {
        text.push_str(&format!(
            "  Cache: all {} repeated inputs were answered without running the model.\n",
            tally.repeats
        ));
    } else {
        text.push_str(&format!(
            "  Cache: {} of {} repeated inputs ran the model again: the answers cache is gone or holds too little. It saves a forward pass on every retry, and a cache with a bound levels off: it is no leak. Keep it, bounded.\n",
            tally.repeats_that_ran_the_model, tally.repeats
        ));
    }

    let stats = service.stats();
    let want_mean = tally.sum_of_means / tally.good.max(1) as f64;
    let want_recent =
        tally.recent_means.iter().sum::<f64>() / tally.recent_means.len().max(1) as f64;
    let close = |got: f64, want: f64| (got - want).abs() <= 1e-5 + 1e-3 * want.abs();
    let gauges_right = stats.served == tally.good
        && stats.rejected == tally.raw
        && close(stats.mean_output, want_mean)
        && close(stats.recent_mean, want_recent);
    if gauges_right {
        text.push_str(&format!(
            "  Gauges: {} served, {} refused, mean answer {:.5}, drift window mean {:.5}: right.\n",
            stats.served, stats.rejected, stats.mean_output, stats.recent_mean
        ));
    } else {
        text.push_str(&format!(
            "  Gauges are WRONG: {} served (expected {}), {} refused (expected {}), mean answer {:.5} (expected {want_mean:.5}), drift window mean {:.5} (expected {want_recent:.5}): the service's metrics must keep working.\n",
            stats.served, tally.good, stats.rejected, tally.raw, stats.mean_output, stats.recent_mean
        ));
    }

    let passed = !leaks && answers_right && cache_kept && gauges_right;
    text.push_str(if passed {
        "  PASS: no leak, the same answers, the cache kept. `cargo xtask lab reveal` tells what it was.\n"
    } else {
        "  NOT YET: see above. lab/README.md, \"The incident drill\", has the steps.\n"
    });
    Outcome { passed, text }
}

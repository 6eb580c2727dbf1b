//! Cause 1: autograd graphs kept alive.
//!
//! The weights of a `tch::nn` model require grad. A forward pass outside inference mode records
//! a graph that saves the input and every hidden activation for a backward pass that never comes.
//! That alone is freed with the output, but fold the output into a running statistic *as a
//! tensor* (`acc = acc + y.mean()`) and every request's graph hangs off the statistic for good.

use leaklab_model::Mlp;
use leaklab_probe::inference_mode;
use leaklab_vocab::Mode;
use tch::{Kind, Tensor};

/// The forward pass, in the mode the variant asks for.
pub fn forward(model: &Mlp, x: &Tensor, mode: Mode) -> Tensor {
    match mode {
        // LEAK(graph): no inference mode, no no_grad: autograd records the graph and saves the
        // input and the hidden activations for backward.
        Mode::Leaky => model.forward(x),
        // FIX(graph): inference mode: nothing is recorded and the output is an inference tensor,
        // which can never join a graph, however it is stored later.
        Mode::Fixed => inference_mode(|| model.forward(x)),
    }
}

/// The mean output over all requests, a statistic the service reports.
pub enum RunningMean {
    // LEAK(graph): the running sum is a tensor; each `acc + y.mean()` links this request's graph
    // into the chain, so no graph since start-up is ever freed.
    Leaky { acc: Option<Tensor>, count: u64 },
    // FIX(graph): the running sum is an f64, read out of the output with `double_value`.
    Fixed { sum: f64, count: u64 },
}

impl RunningMean {
    pub fn new(mode: Mode) -> RunningMean {
        match mode {
            Mode::Leaky => RunningMean::Leaky {
                acc: None,
                count: 0,
            },
            Mode::Fixed => RunningMean::Fixed { sum: 0.0, count: 0 },
        }
    }

    pub fn record(&mut self, y: &Tensor) {
        match self {
            RunningMean::Leaky { acc, count } => {
                let mean = y.mean(Kind::Float);
                // LEAK(graph): `acc + mean` keeps `mean`'s grad_fn, and through it y's graph.
                *acc = Some(match acc.take() {
                    Some(a) => a + mean,
                    None => mean,
                });
                *count += 1;
            }
            RunningMean::Fixed { sum, count } => {
                // FIX(graph): a primitive; the tensor and its graph die with this request.
                *sum += y.mean(Kind::Float).double_value(&[]);
                *count += 1;
            }
        }
    }

    pub fn mean(&self) -> f64 {
        match self {
            RunningMean::Leaky {
                acc: Some(acc),
                count,
            } => acc.double_value(&[]) / *count as f64,
            RunningMean::Fixed { sum, count } if *count > 0 => sum / *count as f64,
            _ => 0.0,
        }
    }
}

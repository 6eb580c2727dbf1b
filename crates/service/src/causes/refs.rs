//! Cause 2: dangling references.
//!
//! A metrics history that stores output tensors instead of numbers keeps every output's storage
//! (on the GPU, in the reference scenario) alive for as long as the history lives.

use leaklab_vocab::Mode;
use std::collections::VecDeque;
use tch::{Device, Tensor};

/// The per-request history behind the service's "peak activation" metric.
pub enum History {
    // LEAK(refs): each request's output tensor is pushed and never dropped.
    Leaky(Vec<Tensor>),
    // FIX(refs): detached, moved to the CPU, reduced to an f64, and the history bounded.
    Fixed {
        values: VecDeque<f64>,
        capacity: usize,
    },
}

impl History {
    pub fn new(mode: Mode, capacity: usize) -> History {
        match mode {
            Mode::Leaky => History::Leaky(Vec::new()),
            Mode::Fixed => History::Fixed {
                values: VecDeque::with_capacity(capacity),
                capacity,
            },
        }
    }

    pub fn record(&mut self, y: &Tensor) {
        match self {
            // LEAK(refs): a new handle on the output's storage, kept forever.
            History::Leaky(outputs) => outputs.push(y.shallow_clone()),
            History::Fixed { values, capacity } => {
                // FIX(refs): only a number survives the request.
                let peak = y
                    .detach()
                    .to_device(Device::Cpu)
                    .abs()
                    .max()
                    .double_value(&[]);
                if values.len() == *capacity {
                    values.pop_front();
                }
                values.push_back(peak);
            }
        }
    }

    pub fn len(&self) -> usize {
        match self {
            History::Leaky(outputs) => outputs.len(),
            History::Fixed { values, .. } => values.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The largest |activation| among the requests kept.
    pub fn peak(&self) -> f64 {
        match self {
            History::Leaky(outputs) => outputs
                .iter()
                .map(|y| y.abs().max().double_value(&[]))
                .fold(0.0, f64::max),
            History::Fixed { values, .. } => values.iter().copied().fold(0.0, f64::max),
        }
    }
}

//! Exercise 2, solved: keep a number per request, in a bounded history.

use crate::Exercise;
use leaklab_model::Mlp;
use std::collections::VecDeque;
use tch::{Device, Tensor};

pub struct Service {
    history: VecDeque<f64>,
}

impl Service {
    pub fn new() -> Service {
        Service {
            history: VecDeque::with_capacity(1024),
        }
    }
}

impl Exercise for Service {
    fn handle(&mut self, model: &Mlp, x: &Tensor) -> Vec<f32> {
        let y = leaklab_probe::inference_mode(|| model.forward(x));
        // Detach, move to the CPU, reduce to an f64: no handle on the output survives.
        let peak = y
            .detach()
            .to_device(Device::Cpu)
            .abs()
            .max()
            .double_value(&[]);
        if self.history.len() == 1024 {
            self.history.pop_front();
        }
        self.history.push_back(peak);
        Vec::<f32>::try_from(y.flatten(0, -1)).expect("f32 output")
    }

    fn statistic(&self) -> f64 {
        self.history.iter().copied().fold(0.0, f64::max)
    }
}

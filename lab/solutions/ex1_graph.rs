//! Exercise 1, solved: inference mode for the forward pass, and the statistic as an f64.

use crate::Exercise;
use leaklab_model::Mlp;
use tch::{Kind, Tensor};

pub struct Service {
    total: f64,
    count: i64,
}

impl Service {
    pub fn new() -> Service {
        Service {
            total: 0.0,
            count: 0,
        }
    }
}

impl Exercise for Service {
    fn handle(&mut self, model: &Mlp, x: &Tensor) -> Vec<f32> {
        // Inference mode: no graph is recorded, so nothing is saved for a backward pass.
        let y = leaklab_probe::inference_mode(|| model.forward(x));
        // A primitive: the tensor dies with this request.
        self.total += y.mean(Kind::Float).double_value(&[]);
        self.count += 1;
        Vec::<f32>::try_from(y.flatten(0, -1)).expect("f32 output")
    }

    fn statistic(&self) -> f64 {
        self.total / self.count.max(1) as f64
    }
}

//! Exercise 4, solved: all three fixes together.

use crate::Exercise;
use leaklab_model::Mlp;
use lru::LruCache;
use std::collections::VecDeque;
use tch::{Device, Kind, Tensor};

const CAPACITY_BYTES: usize = 512 * 1024;

pub struct Service {
    total: f64,
    count: i64,
    history: VecDeque<f64>,
    results: LruCache<u64, Tensor>,
    bytes: usize,
}

impl Service {
    pub fn new() -> Service {
        Service {
            total: 0.0,
            count: 0,
            history: VecDeque::with_capacity(1024),
            results: LruCache::unbounded(),
            bytes: 0,
        }
    }
}

fn size(t: &Tensor) -> usize {
    t.numel() * t.kind().elt_size_in_bytes()
}

impl Exercise for Service {
    fn handle(&mut self, model: &Mlp, x: &Tensor) -> Vec<f32> {
        let key = crate::input_key(x);
        let y = match self.results.get(&key) {
            Some(y) => y.shallow_clone(),
            None => {
                let y = leaklab_probe::inference_mode(|| model.forward(x));
                self.bytes += size(&y);
                self.results.put(key, y.shallow_clone());
                while self.bytes > CAPACITY_BYTES {
                    match self.results.pop_lru() {
                        Some((_, old)) => self.bytes -= size(&old),
                        None => break,
                    }
                }
                y
            }
        };
        self.total += y.mean(Kind::Float).double_value(&[]);
        self.count += 1;
        if self.history.len() == 1024 {
            self.history.pop_front();
        }
        self.history.push_back(
            y.detach()
                .to_device(Device::Cpu)
                .abs()
                .max()
                .double_value(&[]),
        );
        Vec::<f32>::try_from(y.flatten(0, -1)).expect("f32 output")
    }

    fn statistic(&self) -> f64 {
        self.total / self.count.max(1) as f64
    }
}

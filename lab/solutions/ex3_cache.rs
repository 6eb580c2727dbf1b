//! Exercise 3, solved: the cache bounded by bytes, least recently used entries evicted.

use crate::Exercise;
use leaklab_model::Mlp;
use lru::LruCache;
use tch::Tensor;

const CAPACITY_BYTES: usize = 512 * 1024;

pub struct Service {
    results: LruCache<u64, Tensor>,
    bytes: usize,
}

impl Service {
    pub fn new() -> Service {
        Service {
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
        Vec::<f32>::try_from(y.flatten(0, -1)).expect("f32 output")
    }

    fn statistic(&self) -> f64 {
        self.results.len() as f64
    }
}

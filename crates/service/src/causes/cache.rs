//! Cause 3: uncollected caches.
//!
//! A feature cache keyed by the input saves the preprocessing of repeated inputs. Without a
//! bound, every new input adds an entry that is never evicted. On CUDA a second growth hides
//! behind it: the caching allocator keeps freed blocks reserved, and varied batch shapes keep
//! asking for new block sizes, so reserved memory climbs while allocated memory does not.

use leaklab_vocab::Mode;
use lru::LruCache;
use std::collections::HashMap;
use tch::Tensor;

pub enum FeatureCache {
    // LEAK(cache): unbounded; each distinct input adds a tensor that stays forever.
    Leaky(HashMap<u64, Tensor>),
    // FIX(cache): least-recently-used entries are evicted once the cache holds `capacity_bytes`.
    Fixed {
        entries: LruCache<u64, Tensor>,
        bytes: usize,
        capacity_bytes: usize,
    },
}

pub fn tensor_bytes(t: &Tensor) -> usize {
    t.numel() * t.kind().elt_size_in_bytes()
}

impl FeatureCache {
    pub fn new(mode: Mode, capacity_bytes: usize) -> FeatureCache {
        match mode {
            Mode::Leaky => FeatureCache::Leaky(HashMap::new()),
            Mode::Fixed => FeatureCache::Fixed {
                entries: LruCache::unbounded(),
                bytes: 0,
                capacity_bytes,
            },
        }
    }

    pub fn get(&mut self, key: u64) -> Option<Tensor> {
        match self {
            FeatureCache::Leaky(map) => map.get(&key).map(Tensor::shallow_clone),
            FeatureCache::Fixed { entries, .. } => entries.get(&key).map(Tensor::shallow_clone),
        }
    }

    pub fn insert(&mut self, key: u64, features: &Tensor) {
        match self {
            FeatureCache::Leaky(map) => {
                // LEAK(cache): nothing ever leaves this map.
                map.insert(key, features.shallow_clone());
            }
            FeatureCache::Fixed {
                entries,
                bytes,
                capacity_bytes,
            } => {
                let size = tensor_bytes(features);
                if size > *capacity_bytes {
                    return;
                }
                if let Some((_, old)) = entries.push(key, features.shallow_clone()) {
                    *bytes -= tensor_bytes(&old);
                }
                *bytes += size;
                // FIX(cache): evict until the bound holds again.
                while *bytes > *capacity_bytes {
                    match entries.pop_lru() {
                        Some((_, old)) => *bytes -= tensor_bytes(&old),
                        None => break,
                    }
                }
            }
        }
    }

    pub fn len(&self) -> usize {
        match self {
            FeatureCache::Leaky(map) => map.len(),
            FeatureCache::Fixed { entries, .. } => entries.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn bytes(&self) -> usize {
        match self {
            FeatureCache::Leaky(map) => map.values().map(tensor_bytes).sum(),
            FeatureCache::Fixed { bytes, .. } => *bytes,
        }
    }
}

/// FIX(cache), CUDA half: rows padded up to a power of two, so the allocator sees a handful of
/// block sizes instead of one per batch size.
pub fn bucket_rows(rows: i64) -> i64 {
    (rows.max(1) as u64).next_power_of_two() as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    fn t(rows: i64) -> Tensor {
        Tensor::zeros([rows, 256], (Kind::Float, Device::Cpu))
    }

    #[test]
    fn the_fixed_cache_holds_its_byte_bound() {
        let mut cache = FeatureCache::new(Mode::Fixed, 3 * 1024);
        for key in 0..10 {
            cache.insert(key, &t(1));
            assert!(cache.bytes() <= 3 * 1024);
        }
        assert_eq!(cache.len(), 3);
        assert!(cache.get(9).is_some() && cache.get(0).is_none());
    }

    #[test]
    fn the_leaky_cache_keeps_everything() {
        let mut cache = FeatureCache::new(Mode::Leaky, 0);
        for key in 0..10 {
            cache.insert(key, &t(1));
        }
        assert_eq!(cache.len(), 10);
        assert_eq!(cache.bytes(), 10 * 1024);
    }

    #[test]
    fn buckets_are_powers_of_two() {
        assert_eq!([1, 3, 8, 9, 500].map(bucket_rows), [1, 4, 8, 16, 512]);
    }
}

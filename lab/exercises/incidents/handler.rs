//! The inference handler of the service you are on call for tonight: its pods' memory climbs
//! through the day, and nobody knows why yet. Diagnose it with the instrument (`leaklab scan`,
//! the snapshot at /debug/memory/snapshot, `leaklab snapshot diff`), fix this file, then run
//! `cargo xtask lab check incident`. lab/README.md, "The incident drill", walks through it.
//# The template of every incident's handler, not compiled as it stands: `drill::render` makes
//# one handler per incident from it. A line tagged `LEAK(cause) name` is in incident `name`'s
//# handler only, its `FIX(cause) name` twin in every other one, untagged lines in all of them;
//# `//#` lines (these) in none. The learner's copy has the tags taken out as well.

use leaklab_exercises::drill::{Incident, Stats, FEATURES};
use leaklab_model::Mlp;
use lru::LruCache; // FIX(cache) cache: the answers cache evicts
use std::collections::HashMap; // LEAK(cache) cache: the answers cache is a plain map
use std::collections::VecDeque;
use std::hash::{Hash, Hasher};
use tch::{Kind, Tensor};

/// The model takes standardised features; a value past this is a client sending raw ones.
const INPUT_LIMIT: f64 = 50.0;
/// Bytes of answers the cache keeps: retries and popular inputs skip the model.
const CACHE_BYTES: usize = 2 << 20; // FIX(cache) cache: the bound
/// Requests the drift monitor averages over.
const DRIFT_WINDOW: usize = 256;
const LOG_LINES: usize = 256; // FIX(refs) hook: the crash report's log keeps lines of text, a bounded number

pub struct Service {
    /// Answers by input.
    cache: LruCache<u64, Tensor>, // FIX(cache) cache: least recently used answers go first
    cache_bytes: usize, // FIX(cache) cache: what the cache holds, against CACHE_BYTES
    cache: HashMap<u64, Tensor>, // LEAK(cache) cache: every new input adds an answer that is never evicted
    served: u64,
    /// The sum of every answer's mean, for the mean output gauge.
    output_sum: f64, // FIX(graph) graph: a number
    output_sum: Tensor, // LEAK(graph) graph: a tensor sum holds each answer's autograd graph, so every request's graph stays reachable
    /// Recent answers, for the drift monitor.
    recent: VecDeque<f64>, // FIX(refs) drift: each answer's mean, as a number, in a bounded window
    recent: Vec<Tensor>, // LEAK(refs) drift: whole answers, kept as tensors, never trimmed
    rejected: u64,
    last_rejection: String, // FIX(refs) error-path: the reason, as text
    /// Refused requests, for the on-call to look at. // LEAK(refs) error-path
    dead_letters: Vec<Tensor>, // LEAK(refs) error-path: every refused request's input stays here for good
    /// Called with every request's features.
    log_payload: Box<dyn FnMut(&Tensor) + Send>,
}

impl Service {
    pub fn new() -> Service {
        Service {
            cache: LruCache::unbounded(), // FIX(cache) cache
            cache_bytes: 0, // FIX(cache) cache
            cache: HashMap::new(), // LEAK(cache) cache
            served: 0,
            output_sum: 0.0, // FIX(graph) graph
            output_sum: Tensor::zeros([], (Kind::Float, tch::Device::Cpu)), // LEAK(graph) graph
            recent: VecDeque::with_capacity(DRIFT_WINDOW + 1), // FIX(refs) drift
            recent: Vec::new(), // LEAK(refs) drift
            rejected: 0,
            last_rejection: String::new(), // FIX(refs) error-path
            dead_letters: Vec::new(), // LEAK(refs) error-path
            log_payload: payload_logger(),
        }
    }

    fn remember(&mut self, key: u64, answer: &Tensor) {
        self.cache_bytes += bytes(answer); // FIX(cache) cache
        if let Some(old) = self.cache.put(key, answer.shallow_clone()) { // FIX(cache) cache
            self.cache_bytes -= bytes(&old); // FIX(cache) cache
        } // FIX(cache) cache
        while self.cache_bytes > CACHE_BYTES { // FIX(cache) cache: evict until the bound holds
            match self.cache.pop_lru() { // FIX(cache) cache
                Some((_, old)) => self.cache_bytes -= bytes(&old), // FIX(cache) cache
                None => break, // FIX(cache) cache
            } // FIX(cache) cache
        } // FIX(cache) cache
        self.cache.insert(key, answer.shallow_clone()); // LEAK(cache) cache: nothing ever leaves
    }
}

impl Incident for Service {
    fn handle(&mut self, model: &Mlp, rows: usize, values: &[f32]) -> Result<Vec<f32>, String> {
        let x = Tensor::from_slice(values).view([rows as i64, FEATURES]);
        let largest = x.abs().max().double_value(&[]);
        if largest > INPUT_LIMIT {
            self.rejected += 1;
            let reason = format!("inputs must be standardised features (|x| <= {INPUT_LIMIT}); the largest is {largest:.1}");
            self.last_rejection = reason.clone(); // FIX(refs) error-path: a line of text, not the request
            self.dead_letters.push(x); // LEAK(refs) error-path: the refused input is kept, 128 kB a time
            return Err(reason);
        }
        let features = standardise(&x);
        (self.log_payload)(&features);
        let key = key(values);
        let answer = match self.cache.get(&key) {
            Some(answer) => answer.shallow_clone(),
            None => {
                let answer = leaklab_probe::inference_mode(|| model.forward(&features)); // FIX(graph) graph: inference mode records no graph
                let answer = model.forward(&features); // LEAK(graph) graph: the weights require grad, so this records a graph that saves the features and the hidden activations
                self.remember(key, &answer);
                answer
            }
        };
        let mean = answer.mean(Kind::Float).double_value(&[]);
        self.output_sum += mean; // FIX(graph) graph
        self.output_sum = &self.output_sum + answer.mean(Kind::Float); // LEAK(graph) graph: the new sum's graph links to this answer's
        self.recent.push_back(mean); // FIX(refs) drift
        if self.recent.len() > DRIFT_WINDOW { // FIX(refs) drift
            self.recent.pop_front(); // FIX(refs) drift
        } // FIX(refs) drift
        self.recent.push(answer.shallow_clone()); // LEAK(refs) drift: every answer is kept
        self.served += 1;
        Vec::<f32>::try_from(answer.detach().flatten(0, -1)).map_err(|e| e.to_string())
    }

    fn stats(&self) -> Stats {
        let recent_mean = self.recent.iter().sum::<f64>() / self.recent.len().max(1) as f64; // FIX(refs) drift
        let window = &self.recent[self.recent.len().saturating_sub(DRIFT_WINDOW)..]; // LEAK(refs) drift
        let recent_mean = window.iter().map(|a| a.mean(Kind::Float).double_value(&[])).sum::<f64>() / window.len().max(1) as f64; // LEAK(refs) drift
        Stats {
            served: self.served,
            rejected: self.rejected,
            mean_output: self.output_sum / self.served.max(1) as f64, // FIX(graph) graph
            mean_output: self.output_sum.double_value(&[]) / self.served.max(1) as f64, // LEAK(graph) graph
            recent_mean,
            cache_entries: self.cache.len(),
        }
    }
}

/// Each row to zero mean and unit variance: what the model was trained on.
fn standardise(x: &Tensor) -> Tensor {
    let mean = x.mean_dim(-1, true, Kind::Float);
    let std = x.std_dim(-1, false, true);
    (x - mean) / (std + 1e-6)
}

/// The cache key of an input.
fn key(values: &[f32]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    values.iter().for_each(|v| v.to_bits().hash(&mut h));
    h.finish()
}

fn bytes(t: &Tensor) -> usize { // FIX(cache) cache
    t.numel() * t.kind().elt_size_in_bytes() // FIX(cache) cache
} // FIX(cache) cache

/// The payload hook: a summary of each request's features, for the crash report.
fn payload_logger() -> Box<dyn FnMut(&Tensor) + Send> {
    let mut lines = VecDeque::with_capacity(LOG_LINES + 1); // FIX(refs) hook: a bounded log of numbers
    Box::new(move |features: &Tensor| { // FIX(refs) hook
        lines.push_back(format!("rows={} max|x|={:.2}", features.size()[0], features.abs().max().double_value(&[]))); // FIX(refs) hook
        if lines.len() > LOG_LINES { // FIX(refs) hook
            lines.pop_front(); // FIX(refs) hook
        } // FIX(refs) hook
    }) // FIX(refs) hook
    let mut pending: Vec<Tensor> = Vec::new(); // LEAK(refs) hook: features kept to summarise "later", which never comes
    Box::new(move |features: &Tensor| pending.push(features.shallow_clone())) // LEAK(refs) hook
}

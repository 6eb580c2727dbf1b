//! Cause 4, the zoo's below c10's allocator: a native per-shape cache.
//!
//! On CPU libtorch runs a conv through oneDNN, which JIT-compiles a primitive for every new input
//! shape and keeps it in an LRU cache (1,024 entries by default; ideep keeps its own beside it),
//! so that the next request of that shape skips the compilation. A service whose requests come
//! in many sizes (spectrograms of any length, images of any size, dynamic batches) grows with
//! every size it has not seen, until the cache is full, then holds; repeats add nothing. That
//! memory is oneDNN's (malloc and JIT code pages), never c10's: the exact allocator probe,
//! its stages and its snapshot see nothing while RSS climbs (pytorch/pytorch#27971, #98688).
//!
//! The fix here is bucketing: pad every request up to a multiple of [`BUCKET_ROWS`] rows, so
//! the cache only ever sees a few shapes. The knobs do it without touching code
//! (`ONEDNN_PRIMITIVE_CACHE_CAPACITY=0 LRU_CACHE_CAPACITY=1`, set before libtorch loads: no
//! cache at all, and a compilation on every request); docs/zoo.md has both, measured.

use leaklab_model::{ConvFrontEnd, Mlp};
use leaklab_probe::inference_mode;
use leaklab_vocab::Mode;
use tch::Tensor;

/// The row multiple requests are padded to by the fix: 1 to 128 frames make four shapes.
pub const BUCKET_ROWS: i64 = 32;

/// `x` (`rows × features`, one spectrogram a request) through the conv front-end and the MLP,
/// in inference mode (the graph cause is not this variant's).
pub fn forward(conv: &ConvFrontEnd, model: &Mlp, x: &Tensor, mode: Mode) -> Tensor {
    inference_mode(|| match mode {
        // LEAK(conv): the image is exactly the request's size, so each length not seen before
        // makes oneDNN compile and cache new primitives, in memory no tensor owns.
        Mode::Leaky => model.forward(&conv.forward(x)),
        // FIX(conv): padded up to the next multiple of BUCKET_ROWS rows (the padding masked, so
        // the answer is the same), through the convs and the MLP, then cropped: four shapes in
        // all, compiled once each, and four sizes of activations for the heap.
        Mode::Fixed => {
            let rows = x.size()[0];
            model
                .forward(&conv.forward_padded(x, bucket(rows)))
                .narrow(0, 0, rows)
        }
    })
}

/// `rows` rounded up to the next multiple of [`BUCKET_ROWS`].
pub fn bucket(rows: i64) -> i64 {
    (rows.max(1) + BUCKET_ROWS - 1) / BUCKET_ROWS * BUCKET_ROWS
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::{Device, Kind};

    #[test]
    fn buckets_are_multiples_of_32_and_both_modes_answer_the_same() {
        assert_eq!([1, 32, 33, 100, 128].map(bucket), [32, 32, 64, 128, 128]);
        let config = leaklab_vocab::ModelConfig {
            input: 64,
            hidden: 32,
            depth: 1,
            output: 8,
            seed: 42,
        };
        let (conv, model) = (
            ConvFrontEnd::new(42, Device::Cpu),
            Mlp::new(config, Device::Cpu),
        );
        let x = Tensor::randn([37, 64], (Kind::Float, Device::Cpu));
        let (leaky, fixed) = (
            forward(&conv, &model, &x, Mode::Leaky),
            forward(&conv, &model, &x, Mode::Fixed),
        );
        assert_eq!(fixed.size(), [37, 8]);
        let gap = (&leaky - &fixed).abs().max().double_value(&[]);
        assert!(gap < 1e-5, "the fix changed the answer by {gap}");
    }
}

//! The lab's model: an MLP built with `tch::nn` from a fixed seed, so every run (and the Python
//! twin, through the exported weights) computes the same function without downloading anything;
//! and [`ConvFrontEnd`], the small conv net the conv cause runs in front of it.
//!
//! It knows nothing about HTTP, probes or leaks: the service's variants wrap it, they don't fork it.

use leaklab_vocab::SeededRng;
use std::sync::atomic::{AtomicU64, Ordering};
use tch::nn::{self, Module};
use tch::{Device, Tensor};

pub use leaklab_vocab::{ModelConfig, Scale};

/// The model with its weights.
#[derive(Debug)]
pub struct Mlp {
    pub config: ModelConfig,
    pub vs: nn::VarStore,
    layers: nn::Sequential,
    /// Forward passes run so far: what a cache in front of the model saves shows here.
    forward_calls: AtomicU64,
}

impl Mlp {
    /// Builds the weights on the CPU from `config.seed` (so they are the same on every device),
    /// then moves them to `device`.
    pub fn new(config: ModelConfig, device: Device) -> Mlp {
        let mut vs = nn::VarStore::new(Device::Cpu);
        let root = vs.root();
        let mut layers = nn::seq()
            .add(nn::linear(
                &root / "l0",
                config.input,
                config.hidden,
                Default::default(),
            ))
            .add_fn(|x| x.relu());
        for i in 1..config.depth {
            layers = layers
                .add(nn::linear(
                    &root / format!("l{i}"),
                    config.hidden,
                    config.hidden,
                    Default::default(),
                ))
                .add_fn(|x| x.relu());
        }
        layers = layers.add(nn::linear(
            &root / format!("l{}", config.depth),
            config.hidden,
            config.output,
            Default::default(),
        ));
        fill_seeded(&vs, config.seed);
        vs.set_device(device);
        Mlp {
            config,
            vs,
            layers,
            forward_calls: AtomicU64::new(0),
        }
    }

    pub fn device(&self) -> Device {
        self.vs.device()
    }

    /// The forward pass, recording autograd or not as the caller's mode decides.
    pub fn forward(&self, x: &Tensor) -> Tensor {
        self.forward_calls.fetch_add(1, Ordering::Relaxed);
        self.layers.forward(x)
    }

    /// How many times [`Mlp::forward`] has run on this model.
    pub fn forward_calls(&self) -> u64 {
        self.forward_calls.load(Ordering::Relaxed)
    }

    /// Writes the weights as safetensors, for the Python twin.
    pub fn save_safetensors(&self, path: &std::path::Path) -> Result<(), tch::TchError> {
        self.vs.save(path)
    }
}

/// A conv front-end over a request seen as one image, `1 × 1 × rows × features` (a spectrogram:
/// a row a frame): six 3×3 convs, 1→4→8→12→16→8→1 channels (each a primitive of its own: two convs of one shape would share one), padding 1, ReLU between. Its weights are
/// plain tensors drawn from the model seed (no autograd); its convs have no bias, so rows of
/// zeros stay zero, which [`ConvFrontEnd::forward_padded`] relies on.
#[derive(Debug)]
pub struct ConvFrontEnd {
    weights: Vec<Tensor>,
}

impl ConvFrontEnd {
    const CHANNELS: [i64; 7] = [1, 4, 8, 12, 16, 8, 1];

    /// Builds the weights on the CPU from `seed`, then moves them to `device`.
    pub fn new(seed: i64, device: Device) -> ConvFrontEnd {
        let weights = Self::CHANNELS
            .windows(2)
            .enumerate()
            .map(|(i, c)| {
                let bound = 1.0 / ((c[0] * 9) as f64).sqrt();
                let mut rng = SeededRng::named(seed as u64, &format!("conv{i}.weight"));
                let values: Vec<f32> = (0..c[1] * c[0] * 9)
                    .map(|_| (rng.symmetric() * bound) as f32)
                    .collect();
                Tensor::from_slice(&values)
                    .view([c[1], c[0], 3, 3])
                    .to_device(device)
            })
            .collect();
        ConvFrontEnd { weights }
    }

    /// `x` (`rows × features`) through the convs, as one image of exactly its size.
    pub fn forward(&self, x: &Tensor) -> Tensor {
        let (rows, features) = (x.size()[0], x.size()[1]);
        let mut y = x.view([1, 1, rows, features]);
        for (i, w) in self.weights.iter().enumerate() {
            y = y.conv2d::<Tensor>(w, None, [1, 1], [1, 1], [1, 1], 1);
            if i + 1 < self.weights.len() {
                y = y.relu();
            }
        }
        y.view([rows, features])
    }

    /// The same function on `x` padded with rows of zeros up to `rows_to`, so that the convs see
    /// an image of `rows_to` rows: its first `x.size()[0]` rows are [`ConvFrontEnd::forward`]'s
    /// answer, the rest zeros. After each conv the padding rows are zeroed again, so what they
    /// picked up from the last real row never reaches a real one.
    pub fn forward_padded(&self, x: &Tensor, rows_to: i64) -> Tensor {
        let (rows, features) = (x.size()[0], x.size()[1]);
        let pad = (rows_to - rows).max(0);
        let mask =
            Tensor::ones([1, 1, rows, 1], (x.kind(), x.device())).constant_pad_nd([0, 0, 0, pad]);
        let mut y = x
            .constant_pad_nd([0, 0, 0, pad])
            .view([1, 1, rows + pad, features]);
        for (i, w) in self.weights.iter().enumerate() {
            y = y.conv2d::<Tensor>(w, None, [1, 1], [1, 1], [1, 1], 1);
            if i + 1 < self.weights.len() {
                y = y.relu();
            }
            y *= &mask;
        }
        y.view([rows + pad, features])
    }
}

/// Writes the weights of `scale`'s model as safetensors at `out`, and its shapes (with the
/// batch a client sends) as JSON at `<out>.json`: what the Python twin loads.
pub fn export_weights(out: &std::path::Path, scale: Scale) -> Result<(), ExportError> {
    let config = scale.config();
    let model = Mlp::new(config, Device::Cpu);
    if let Some(dir) = out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    model.save_safetensors(out)?;
    let shapes = format!(
        "{{\n  \"input\": {},\n  \"hidden\": {},\n  \"depth\": {},\n  \"output\": {},\n  \"seed\": {},\n  \"batch\": {}\n}}\n",
        config.input, config.hidden, config.depth, config.output, config.seed, scale.batch()
    );
    std::fs::write(format!("{}.json", out.display()), shapes)?;
    Ok(())
}

/// Why the weights could not be exported.
#[derive(Debug, thiserror::Error)]
pub enum ExportError {
    #[error("cannot write the weights: {0}")]
    Io(#[from] std::io::Error),
    #[error("libtorch could not save the weights: {0}")]
    Torch(#[from] tch::TchError),
}

/// Overwrites every variable with values drawn from its own seeded generator, with PyTorch's
/// `nn.Linear` bounds (U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases).
///
/// libtorch's global RNG would do, were it not global: another thread drawing from it while a
/// model is built (parallel tests, a second service in-process) would change the weights. A
/// generator per variable, seeded from the model seed and the variable's name, cannot be raced.
fn fill_seeded(vs: &nn::VarStore, seed: i64) {
    let variables = vs.variables();
    let mut names: Vec<_> = variables.keys().cloned().collect();
    names.sort();
    let fan_in = |name: &str| {
        let weight = &variables[&name.replace(".bias", ".weight")];
        weight.size()[1] as f64
    };
    tch::no_grad(|| {
        for name in names {
            let mut var = variables[&name].shallow_clone();
            let bound = 1.0 / fan_in(&name).sqrt();
            let mut rng = SeededRng::named(seed as u64, &name);
            let values: Vec<f32> = (0..var.numel())
                .map(|_| (rng.symmetric() * bound) as f32)
                .collect();
            var.copy_(&Tensor::from_slice(&values).view(var.size().as_slice()));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use tch::Kind;

    #[test]
    fn the_same_seed_builds_the_same_function() {
        let config = ModelConfig {
            input: 16,
            hidden: 32,
            depth: 2,
            output: 8,
            seed: 7,
        };
        let x = Tensor::randn([4, 16], (Kind::Float, Device::Cpu));
        let a = Mlp::new(config, Device::Cpu);
        // Another draw from libtorch's global RNG in between must not change the next model.
        let _ = Tensor::randn([1000], (Kind::Float, Device::Cpu));
        let b = Mlp::new(config, Device::Cpu);
        let (ya, yb) = tch::no_grad(|| (a.forward(&x), b.forward(&x)));
        assert_eq!(ya.size(), [4, 8]);
        assert!(ya.equal(&yb));
        let other = Mlp::new(ModelConfig { seed: 8, ..config }, Device::Cpu);
        assert!(!tch::no_grad(|| other.forward(&x)).equal(&ya));
        let w = a.vs.variables()["l0.weight"].abs().max().double_value(&[]);
        assert!(w > 0.2 && w <= 0.25, "weights within 1/sqrt(16): {w}");
    }

    #[test]
    fn the_padded_conv_answers_as_the_unpadded_one() {
        let conv = ConvFrontEnd::new(42, Device::Cpu);
        let x = Tensor::randn([5, 16], (Kind::Float, Device::Cpu));
        let (plain, padded, unmasked) = tch::no_grad(|| {
            (
                conv.forward(&x),
                conv.forward_padded(&x, 32),
                conv.forward(&x.constant_pad_nd([0, 0, 0, 27]))
                    .narrow(0, 0, 5),
            )
        });
        assert_eq!(padded.size(), [32, 16]);
        assert_eq!(padded.narrow(0, 5, 27).abs().max().double_value(&[]), 0.0);
        let padded = padded.narrow(0, 0, 5);
        let gap = |a: &Tensor, b: &Tensor| (a - b).abs().max().double_value(&[]);
        assert!(gap(&plain, &padded) < 1e-5, "{}", gap(&plain, &padded));
        // Padding alone is not the same function: the last real row reads what the padding
        // rows picked up from it.
        assert!(gap(&plain, &unmasked) > 1e-4, "{}", gap(&plain, &unmasked));
    }

    #[test]
    fn parameter_count_matches_the_var_store() {
        let config = Scale::Default.config();
        let m = Mlp::new(config, Device::Cpu);
        let counted: i64 =
            m.vs.trainable_variables()
                .iter()
                .map(|t| t.numel() as i64)
                .sum();
        assert_eq!(counted, config.parameters());
    }
}

//! The lab's model: an MLP built with `tch::nn` from a fixed seed, so every run (and the Python
//! twin, through the exported weights) computes the same function without downloading anything.
//!
//! It knows nothing about HTTP, probes or leaks: the service's variants wrap it, they don't fork it.

use serde::{Deserialize, Serialize};
use tch::nn::{self, Module};
use tch::{Device, Tensor};

/// Shapes of the MLP: `input → hidden (→ hidden)* → output`, ReLU between layers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelConfig {
    pub input: i64,
    pub hidden: i64,
    /// Number of hidden layers (each followed by a ReLU).
    pub depth: i64,
    pub output: i64,
    pub seed: i64,
}

/// How big the lab runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Scale {
    /// Small enough for CPU and CI: 512 → 2048 → 512; a batch of 8 leaks tens of kB a request.
    Default,
    /// The reference scenario's container: 1024 → 8192 ×3 → 1024 (151 M parameters); with a
    /// batch of 512 the graph cause keeps 50 MiB (52.4 MB) per request alive.
    Seed,
}

impl Scale {
    pub fn config(self) -> ModelConfig {
        match self {
            Scale::Default => ModelConfig { input: 512, hidden: 2048, depth: 1, output: 512, seed: 42 },
            Scale::Seed => ModelConfig { input: 1024, hidden: 8192, depth: 3, output: 1024, seed: 42 },
        }
    }

    /// The batch a client sends at this scale.
    pub fn batch(self) -> i64 {
        match self {
            Scale::Default => 8,
            Scale::Seed => 512,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Scale::Default => "default",
            Scale::Seed => "seed",
        }
    }
}

impl std::str::FromStr for Scale {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "default" => Ok(Scale::Default),
            "seed" => Ok(Scale::Seed),
            other => Err(format!("unknown scale `{other}`: use `default` or `seed`")),
        }
    }
}

impl ModelConfig {
    /// Bytes an f32 forward pass saves for backward when autograd records it: the input (saved
    /// by the first linear layer for its weight gradient) and every hidden ReLU output (saved by
    /// ReLU and by the next linear layer, one storage). The graph leak keeps exactly this alive.
    pub fn graph_bytes_per_request(&self, batch: i64) -> i64 {
        4 * batch * (self.input + self.depth * self.hidden)
    }

    /// Bytes of one output batch in f32.
    pub fn output_bytes(&self, batch: i64) -> i64 {
        4 * batch * self.output
    }

    /// Bytes of one input batch in f32.
    pub fn input_bytes(&self, batch: i64) -> i64 {
        4 * batch * self.input
    }

    /// An upper estimate of the bytes one request of `rows` needs while it runs: the raw,
    /// standardised and temporary inputs, two hidden activations per layer, the output and its
    /// copy. Admission control compares it with the memory budget before allocating anything.
    pub fn request_bytes_estimate(&self, rows: i64) -> i64 {
        4 * rows * (3 * self.input + 2 * self.depth * self.hidden + 2 * self.output)
    }

    pub fn parameters(&self) -> i64 {
        let first = self.input * self.hidden + self.hidden;
        let middle = (self.depth - 1) * (self.hidden * self.hidden + self.hidden);
        let last = self.hidden * self.output + self.output;
        first + middle + last
    }
}

/// The model with its weights.
#[derive(Debug)]
pub struct Mlp {
    pub config: ModelConfig,
    pub vs: nn::VarStore,
    layers: nn::Sequential,
}

impl Mlp {
    /// Builds the weights on the CPU from `config.seed` (so they are the same on every device),
    /// then moves them to `device`.
    pub fn new(config: ModelConfig, device: Device) -> Mlp {
        let mut vs = nn::VarStore::new(Device::Cpu);
        let root = vs.root();
        let mut layers = nn::seq().add(nn::linear(&root / "l0", config.input, config.hidden, Default::default())).add_fn(|x| x.relu());
        for i in 1..config.depth {
            layers = layers.add(nn::linear(&root / format!("l{i}"), config.hidden, config.hidden, Default::default())).add_fn(|x| x.relu());
        }
        layers = layers.add(nn::linear(&root / format!("l{}", config.depth), config.hidden, config.output, Default::default()));
        fill_seeded(&vs, config.seed);
        vs.set_device(device);
        Mlp { config, vs, layers }
    }

    pub fn device(&self) -> Device {
        self.vs.device()
    }

    /// The forward pass, recording autograd or not as the caller's mode decides.
    pub fn forward(&self, x: &Tensor) -> Tensor {
        self.layers.forward(x)
    }

    /// Writes the weights as safetensors, for the Python twin.
    pub fn save_safetensors(&self, path: &std::path::Path) -> Result<(), tch::TchError> {
        self.vs.save(path)
    }
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
            let mut state = name.bytes().fold(seed as u64 ^ 0xCBF2_9CE4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01B3)) | 1;
            let values: Vec<f32> = (0..var.numel())
                .map(|_| {
                    state ^= state >> 12;
                    state ^= state << 25;
                    state ^= state >> 27;
                    let unit = (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40) as f64 / (1u64 << 24) as f64;
                    ((unit * 2.0 - 1.0) * bound) as f32
                })
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
        let config = ModelConfig { input: 16, hidden: 32, depth: 2, output: 8, seed: 7 };
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
    fn parameter_count_matches_the_var_store() {
        let config = Scale::Default.config();
        let m = Mlp::new(config, Device::Cpu);
        let counted: i64 = m.vs.trainable_variables().iter().map(|t| t.numel() as i64).sum();
        assert_eq!(counted, config.parameters());
    }

    #[test]
    fn the_seed_scale_keeps_about_fifty_megabytes_per_request_in_the_graph() {
        let c = Scale::Seed.config();
        let bytes = c.graph_bytes_per_request(Scale::Seed.batch());
        // 4 B × 512 × (1024 + 3 × 8192) = 50 MiB: the "about 50 MB per request" of the story.
        assert_eq!(bytes, 50 * 1024 * 1024);
    }
}

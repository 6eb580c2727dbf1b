//! The model's shapes, as numbers: what the service builds and what a client must send.

use serde::{Deserialize, Serialize};

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
            Scale::Default => ModelConfig {
                input: 512,
                hidden: 2048,
                depth: 1,
                output: 512,
                seed: 42,
            },
            Scale::Seed => ModelConfig {
                input: 1024,
                hidden: 8192,
                depth: 3,
                output: 1024,
                seed: 42,
            },
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

/// JSON text the service accepts per input value: generous, since a client may print a float
/// with all its digits ("-0.123456789e-10,"). The body limit is sized from it.
pub const JSON_BYTES_PER_VALUE: usize = 24;

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

    /// The largest JSON body a batch of `rows` may need, at [`JSON_BYTES_PER_VALUE`].
    pub fn json_body_bytes(&self, rows: usize) -> usize {
        rows * self.input as usize * JSON_BYTES_PER_VALUE
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_seed_scale_keeps_about_fifty_megabytes_per_request_in_the_graph() {
        let c = Scale::Seed.config();
        // 4 B × 512 × (1024 + 3 × 8192) = 50 MiB: the "about 50 MB per request" of the story.
        assert_eq!(
            c.graph_bytes_per_request(Scale::Seed.batch()),
            50 * 1024 * 1024
        );
    }
}

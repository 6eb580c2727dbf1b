//! One request, four stages: preprocess → forward → postprocess → telemetry.
//!
//! Each stage runs under a memory context of its own name, so the counting allocator knows in
//! which stage every live block was born. The pipeline is synchronous and runs on one thread per
//! request (inside `spawn_blocking`): inference mode and memory contexts are thread-local.

use crate::api::{Batch, InferError, Inference};
use crate::causes::cache::{bucket_rows, FeatureCache};
use crate::causes::conv;
use crate::causes::graph::{self, RunningMean};
use crate::causes::refs::History;
use crate::http::Handler;
use crate::sampler::{SampleDepth, Sampler};
use leaklab_model::{ConvFrontEnd, Mlp, ModelConfig};
use leaklab_probe::{cpu, cuda, MemoryContext, Probes};
use leaklab_vocab::{Device, Mode, RequestSample, Stage, StageBytes, Variant};
use serde::{Deserialize, Serialize};
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::panic::{catch_unwind, AssertUnwindSafe};
use tch::{Kind, Tensor};

/// A stage's memory context, interned once (this is on every request's path).
pub fn stage_context(stage: Stage) -> MemoryContext {
    static CONTEXTS: std::sync::OnceLock<[MemoryContext; 4]> = std::sync::OnceLock::new();
    CONTEXTS.get_or_init(|| Stage::ALL.map(|s| MemoryContext::named(s.name())))[stage as usize]
}

impl Batch {
    fn key(&self) -> u64 {
        let mut h = DefaultHasher::new();
        self.rows.hash(&mut h);
        for v in &self.values {
            v.to_bits().hash(&mut h);
        }
        h.finish()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct PipelineConfig {
    pub model: ModelConfig,
    pub device: Device,
    /// Entries the fixed history keeps.
    pub history_capacity: usize,
    /// Bytes the fixed feature cache may hold.
    pub cache_capacity_bytes: usize,
    /// On CUDA, reserved minus allocated bytes above which the fixed cache path calls `empty_cache`.
    pub cuda_slack_watermark_bytes: usize,
}

/// The tch device that `device` names (the first GPU for CUDA).
pub fn tch_device(device: Device) -> tch::Device {
    match device {
        Device::Cpu => tch::Device::Cpu,
        Device::Cuda => tch::Device::Cuda(0),
    }
}

impl PipelineConfig {
    pub fn new(model: ModelConfig, device: Device) -> PipelineConfig {
        PipelineConfig {
            model,
            device,
            history_capacity: 1024,
            cache_capacity_bytes: 4 << 20,
            cuda_slack_watermark_bytes: 256 << 20,
        }
    }
}

pub struct Pipeline {
    pub variant: Variant,
    pub config: PipelineConfig,
    model: Mlp,
    /// The conv cause's front-end; `None` for the variants without it.
    conv: Option<(ConvFrontEnd, Mode)>,
    stats: RunningMean,
    history: Option<History>,
    cache: Option<FeatureCache>,
    sampler: Sampler,
    requests: u64,
}

impl Pipeline {
    /// Fails only when CUDA is asked for and not available.
    pub fn new(variant: Variant, config: PipelineConfig) -> Result<Pipeline, leaklab_probe::Error> {
        cpu::install()?;
        let probes = match config.device {
            Device::Cpu => Probes::cpu(),
            Device::Cuda => Probes::cuda(0)?,
        };
        let model = Mlp::new(config.model, tch_device(config.device));
        let conv = variant.conv().map(|mode| {
            (
                ConvFrontEnd::new(config.model.seed, tch_device(config.device)),
                mode,
            )
        });
        Ok(Pipeline {
            variant,
            config,
            model,
            conv,
            stats: RunningMean::new(variant.graph()),
            history: variant
                .refs()
                .map(|m| History::new(m, config.history_capacity)),
            cache: variant
                .cache()
                .map(|m| FeatureCache::new(m, config.cache_capacity_bytes)),
            sampler: Sampler::new(probes),
            requests: 0,
        })
    }

    pub fn requests(&self) -> u64 {
        self.requests
    }

    pub fn probes(&self) -> &Probes {
        self.sampler.probes()
    }

    pub fn mean_output(&self) -> f64 {
        self.stats.mean()
    }

    pub fn history_len(&self) -> usize {
        self.history.as_ref().map_or(0, History::len)
    }

    pub fn cache_entries(&self) -> usize {
        self.cache.as_ref().map_or(0, FeatureCache::len)
    }

    /// Runs one request through the four stages.
    pub fn infer(&mut self, batch: &Batch) -> Result<Inference, InferError> {
        let want = self.config.model.input as usize;
        if batch.features != want {
            return Err(InferError::Shape {
                got: batch.features,
                want,
            });
        }
        let device = self.model.device();
        // libtorch reports errors (such as an allocation failure) by panicking through tch;
        // each stage is caught so a failed request frees what it made and the service goes on.
        let (x, cached) = stage(Stage::Preprocess, || self.preprocess(batch, device))?;
        let y = stage(Stage::Forward, || self.forward(&x, batch.rows as i64))?;
        let outputs = stage(Stage::Postprocess, || postprocess(&y))?;
        stage(Stage::Telemetry, || self.telemetry(&y))?;
        self.requests += 1;
        Ok(Inference {
            request: self.requests,
            outputs,
            cached,
        })
    }

    fn preprocess(&mut self, batch: &Batch, device: tch::Device) -> (Tensor, bool) {
        let key = batch.key();
        if let Some(x) = self.cache.as_mut().and_then(|c| c.get(key)) {
            return (x, true);
        }
        let raw =
            Tensor::from_slice(&batch.values).view([batch.rows as i64, batch.features as i64]);
        // Standardise each row: the "feature extraction" that the cache saves.
        let mean = raw.mean_dim(-1, true, Kind::Float);
        let std = raw.std_dim(-1, false, true);
        let x = ((raw - mean) / (std + 1e-6)).to_device(device);
        if let Some(cache) = self.cache.as_mut() {
            cache.insert(key, &x);
        }
        (x, false)
    }

    fn forward(&mut self, x: &Tensor, rows: i64) -> Tensor {
        if let Some((front, mode)) = &self.conv {
            return conv::forward(front, &self.model, x, *mode);
        }
        let on_cuda = self.model.device().is_cuda();
        if on_cuda && self.cache.is_some() && self.variant.cache() == Some(Mode::Fixed) {
            // FIX(cache), CUDA half: pad to a bucket so the allocator reuses a few block sizes,
            // and hand cached-but-unused memory back once the slack passes a watermark.
            let padded = x.constant_pad_nd([0, 0, 0, bucket_rows(rows) - rows]);
            let y = graph::forward(&self.model, &padded, self.variant.graph()).narrow(0, 0, rows);
            if let Ok(s) = cuda::stats(0) {
                if (s.reserved_bytes - s.allocated_bytes) as usize
                    > self.config.cuda_slack_watermark_bytes
                {
                    let _ = cuda::empty_cache();
                }
            }
            return y;
        }
        graph::forward(&self.model, x, self.variant.graph())
    }

    fn telemetry(&mut self, y: &Tensor) {
        self.stats.record(y);
        if let Some(history) = self.history.as_mut() {
            history.record(y);
        }
    }

    /// The per-stage live bytes and the allocators, read now; at [`SampleDepth::Full`] also
    /// RSS, the malloc heap and NVML (slow: read them every N requests), else those carried
    /// from the last full sample ([`Sampler`]).
    pub fn sample(&mut self, latency_us: u64, depth: SampleDepth) -> RequestSample {
        let by_context = cpu::live_by_context();
        let stage_live_bytes = StageBytes::from_fn(|s| {
            let ctx = stage_context(s);
            by_context
                .iter()
                .find(|(c, _)| *c == ctx)
                .map_or(0, |(_, b)| *b)
        });
        let memory = self.sampler.memory(depth);
        RequestSample {
            request: self.requests,
            latency_us,
            stage_live_bytes,
            memory,
        }
    }
}

fn stage<T>(stage: Stage, body: impl FnOnce() -> T) -> Result<T, InferError> {
    let _ctx = stage_context(stage).enter();
    catch_unwind(AssertUnwindSafe(body)).map_err(|panic| InferError::Torch {
        stage,
        message: crate::api::panic_message(panic.as_ref()),
    })
}

fn postprocess(y: &Tensor) -> Vec<Vec<f32>> {
    let y = y
        .detach()
        .to_device(tch::Device::Cpu)
        .to_kind(Kind::Float)
        .contiguous();
    let cols = y.size()[1] as usize;
    let flat = Vec::<f32>::try_from(y.flatten(0, -1)).expect("a float tensor converts to Vec<f32>");
    flat.chunks(cols).map(<[f32]>::to_vec).collect()
}

/// What `GET /debug/memory` says about the pipeline, beside the sample.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PipelineState {
    pub history_len: usize,
    pub cache_entries: usize,
    pub mean_output: f64,
}

/// The lab's service behind the HTTP layer: the pipeline of its variant.
impl Handler for Pipeline {
    type State = PipelineState;

    fn name(&self) -> &'static str {
        self.variant.name()
    }

    fn model(&self) -> ModelConfig {
        self.config.model
    }

    fn infer(&mut self, batch: &Batch) -> Result<Inference, InferError> {
        Pipeline::infer(self, batch)
    }

    fn requests(&self) -> u64 {
        self.requests
    }

    fn probes(&self) -> &Probes {
        self.sampler.probes()
    }

    fn sample(&mut self, latency_us: u64, depth: SampleDepth) -> RequestSample {
        Pipeline::sample(self, latency_us, depth)
    }

    fn stages(&self) -> bool {
        true
    }

    fn state(&self) -> PipelineState {
        PipelineState {
            history_len: self.history_len(),
            cache_entries: self.cache_entries(),
            mean_output: self.mean_output(),
        }
    }
}

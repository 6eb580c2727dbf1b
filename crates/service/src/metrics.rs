//! Prometheus metrics: request counts, latency, every probe's memory gauge, what each memory may
//! grow to, and a handler's own gauges.
//!
//! The memory gauges are refreshed from a fresh sample at each scrape, so `predict_linear` over
//! them sees the same figures the lab's detector does. Every label value is a type with one
//! name per value (`Outcome`, `MemorySeries`, `Capacity`, the vocabulary's `Stage`), never a
//! string written at the call site.

use leaklab_vocab::{Probe, RequestSample, Stage};
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::fmt::Write;
use std::sync::atomic::AtomicU64;

/// Writes a label value by its one name.
macro_rules! label_value {
    ($type:ty) => {
        impl EncodeLabelValue for $type {
            fn encode(&self, encoder: &mut LabelValueEncoder) -> Result<(), std::fmt::Error> {
                encoder.write_str(self.name())
            }
        }
    };
}

/// How a request to `/v1/infer` ended: the `outcome` label of `leaklab_requests_total`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Outcome {
    /// Answered 2xx.
    Ok,
    /// Refused 4xx: the request was wrong.
    ClientError,
    /// Failed 5xx: the service could not serve it.
    ServerError,
}

impl Outcome {
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::ClientError => "client_error",
            Outcome::ServerError => "server_error",
        }
    }
}

label_value!(Outcome);

/// A `probe` label value of `leaklab_memory_bytes`: a probe's series, or one of three figures
/// beside them that are not series of their own.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum MemorySeries {
    Probe(Probe),
    /// The counting allocator's peak live bytes.
    CpuAllocatorPeak,
    /// Allocations the CUDA caching allocator could not satisfy.
    CudaNumOoms,
    /// The whole GPU's use, every process included (NVML).
    NvmlDeviceUsed,
}

impl MemorySeries {
    pub fn name(self) -> &'static str {
        match self {
            MemorySeries::Probe(p) => p.name(),
            MemorySeries::CpuAllocatorPeak => "cpu_allocator_peak",
            MemorySeries::CudaNumOoms => "cuda_num_ooms",
            MemorySeries::NvmlDeviceUsed => "nvml_device_used",
        }
    }
}

label_value!(MemorySeries);

/// The `memory` label of `leaklab_memory_capacity_bytes`.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Capacity {
    /// The machine's memory, or the cgroup's limit when lower.
    Host,
    /// The device's memory.
    Gpu,
}

impl Capacity {
    pub fn name(self) -> &'static str {
        match self {
            Capacity::Host => "host",
            Capacity::Gpu => "gpu",
        }
    }
}

label_value!(Capacity);

/// The `stage` label of `leaklab_stage_live_bytes` (the vocabulary's stage, by its name).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct StageLabel(pub Stage);

impl StageLabel {
    fn name(self) -> &'static str {
        self.0.name()
    }
}

label_value!(StageLabel);

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub variant: &'static str,
    pub outcome: Outcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeLabels {
    pub variant: &'static str,
    pub probe: MemorySeries,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    pub variant: &'static str,
    pub stage: StageLabel,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CapacityLabels {
    pub variant: &'static str,
    pub memory: Capacity,
}

/// A gauge a handler exports about itself (the drill's served and refused counts, its cache's
/// entries), read at every scrape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OwnGauge {
    /// The name after `leaklab_`.
    pub name: &'static str,
    pub help: &'static str,
    pub value: f64,
}

pub struct Metrics {
    registry: Registry,
    variant: &'static str,
    /// What each memory may grow to: the alert rules' capacity comes from a series, never a constant.
    capacity: Family<CapacityLabels, Gauge>,
    host_capacity: Option<i64>,
    requests: Family<OutcomeLabels, Counter>,
    pub latency: Histogram,
    memory: Family<ProbeLabels, Gauge>,
    stage_memory: Family<StageLabels, Gauge>,
    own: Vec<(&'static str, Gauge<f64, AtomicU64>)>,
}

impl Metrics {
    /// The metrics of the service called `variant`, with the handler's own gauges registered
    /// under the names `own` gives them.
    pub fn new(variant: &'static str, own: &[OwnGauge]) -> Metrics {
        let mut registry = Registry::with_prefix("leaklab");
        let requests = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "requests",
            "Requests answered, by outcome (ok, client_error, server_error)",
            requests.clone(),
        );
        let latency = Histogram::new(exponential_buckets(0.0005, 2.0, 16));
        registry.register(
            "request_duration_seconds",
            "Time spent serving /v1/infer",
            latency.clone(),
        );
        let memory = Family::<ProbeLabels, Gauge>::default();
        registry.register(
            "memory_bytes",
            format!(
                "Memory as each probe sees it ({} is exact)",
                Probe::CpuAllocator.name()
            ),
            memory.clone(),
        );
        let stage_memory = Family::<StageLabels, Gauge>::default();
        registry.register(
            "stage_live_bytes",
            "Live CPU allocator bytes by the request stage that allocated them",
            stage_memory.clone(),
        );
        let capacity = Family::<CapacityLabels, Gauge>::default();
        registry.register("memory_capacity_bytes", "What each memory may grow to: host (the machine, or the cgroup limit when lower) and gpu (the device)", capacity.clone());
        let own = own
            .iter()
            .map(|g| {
                let gauge = Gauge::<f64, AtomicU64>::default();
                registry.register(g.name, g.help, gauge.clone());
                (g.name, gauge)
            })
            .collect();
        let host_capacity = leaklab_proc::host_capacity().map(|b| b as i64);
        Metrics {
            registry,
            variant,
            requests,
            latency,
            memory,
            stage_memory,
            capacity,
            host_capacity,
            own,
        }
    }

    pub fn count(&self, outcome: Outcome) {
        self.requests
            .get_or_create(&OutcomeLabels {
                variant: self.variant,
                outcome,
            })
            .inc();
    }

    /// Sets every memory gauge from `sample`; the per-stage gauges only when `stages` (the
    /// handler runs its requests under the stage contexts, so those bytes mean something).
    pub fn record(&self, sample: &RequestSample, stages: bool) {
        let m = &sample.memory;
        let mut gauges: Vec<(MemorySeries, i64)> = Probe::ALL
            .iter()
            .filter_map(|&p| p.read(m).map(|v| (MemorySeries::Probe(p), v)))
            .collect();
        gauges.push((MemorySeries::CpuAllocatorPeak, m.cpu.peak_bytes));
        if let Some(c) = m.cuda {
            gauges.push((MemorySeries::CudaNumOoms, c.num_ooms));
        }
        if let Some(n) = m.nvml {
            gauges.push((MemorySeries::NvmlDeviceUsed, n.device_used_bytes as i64));
        }
        for (probe, value) in gauges {
            self.memory
                .get_or_create(&ProbeLabels {
                    variant: self.variant,
                    probe,
                })
                .set(value);
        }
        let capacities = [
            (Capacity::Host, self.host_capacity),
            (Capacity::Gpu, m.nvml.map(|n| n.device_total_bytes as i64)),
        ];
        for (memory, bytes) in capacities
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k, v)))
        {
            self.capacity
                .get_or_create(&CapacityLabels {
                    variant: self.variant,
                    memory,
                })
                .set(bytes);
        }
        if stages {
            for (stage, bytes) in sample.stage_live_bytes.iter() {
                self.stage_memory
                    .get_or_create(&StageLabels {
                        variant: self.variant,
                        stage: StageLabel(stage),
                    })
                    .set(bytes);
            }
        }
    }

    /// Sets the handler's own gauges (those registered by [`Metrics::new`]; others are ignored).
    pub fn record_own(&self, gauges: &[OwnGauge]) {
        for g in gauges {
            if let Some((_, gauge)) = self.own.iter().find(|(name, _)| *name == g.name) {
                gauge.set(g.value);
            }
        }
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .expect("writing to a String cannot fail");
        out
    }
}

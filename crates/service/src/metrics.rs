//! Prometheus metrics: request counts, latency, and every probe's memory gauge.
//!
//! The memory gauges are refreshed from a fresh sample at each scrape, so `predict_linear` over
//! them sees the same figures the lab's detector does.

use leaklab_vocab::{Probe, RequestSample};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub variant: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProbeLabels {
    pub variant: String,
    pub probe: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StageLabels {
    pub variant: String,
    pub stage: String,
}

pub struct Metrics {
    registry: Registry,
    variant: String,
    pub requests: Family<OutcomeLabels, Counter>,
    pub latency: Histogram,
    memory: Family<ProbeLabels, Gauge>,
    stage_memory: Family<StageLabels, Gauge>,
}

impl Metrics {
    pub fn new(variant: &str) -> Metrics {
        let mut registry = Registry::with_prefix("leaklab");
        let requests = Family::<OutcomeLabels, Counter>::default();
        registry.register("requests", "Requests answered, by outcome (ok, client_error, server_error)", requests.clone());
        let latency = Histogram::new(exponential_buckets(0.0005, 2.0, 16));
        registry.register("request_duration_seconds", "Time spent serving /v1/infer", latency.clone());
        let memory = Family::<ProbeLabels, Gauge>::default();
        registry.register("memory_bytes", "Memory as each probe sees it (cpu_allocator_live is exact)", memory.clone());
        let stage_memory = Family::<StageLabels, Gauge>::default();
        registry.register("stage_live_bytes", "Live CPU allocator bytes by the request stage that allocated them", stage_memory.clone());
        Metrics { registry, variant: variant.to_string(), requests, latency, memory, stage_memory }
    }

    pub fn count(&self, outcome: &str) {
        self.requests.get_or_create(&OutcomeLabels { variant: self.variant.clone(), outcome: outcome.into() }).inc();
    }

    pub fn record(&self, sample: &RequestSample) {
        let m = &sample.memory;
        // Every probe series the sample carries, under its one name, and three figures beside
        // them that are not series of their own (peaks, OOM count, the whole GPU's use).
        let mut gauges: Vec<(&str, i64)> = Probe::ALL.iter().filter_map(|p| p.read(m).map(|v| (p.name(), v))).collect();
        gauges.push(("cpu_allocator_peak", m.cpu.peak_bytes));
        if let Some(c) = m.cuda {
            gauges.push(("cuda_num_ooms", c.num_ooms));
        }
        if let Some(n) = m.nvml {
            gauges.push(("nvml_device_used", n.device_used_bytes as i64));
        }
        for (probe, value) in gauges {
            self.memory.get_or_create(&ProbeLabels { variant: self.variant.clone(), probe: probe.into() }).set(value);
        }
        for (stage, bytes) in sample.stage_live_bytes.iter() {
            self.stage_memory.get_or_create(&StageLabels { variant: self.variant.clone(), stage: stage.name().into() }).set(bytes);
        }
    }

    pub fn encode(&self) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

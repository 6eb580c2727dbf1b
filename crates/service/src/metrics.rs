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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CapacityLabels {
    pub variant: String,
    /// `host` (the machine's memory, or the cgroup's limit when lower) or `gpu` (the device's).
    pub memory: String,
}

pub struct Metrics {
    registry: Registry,
    variant: String,
    /// What each memory may grow to: the alert rules' capacity comes from a series, never a constant.
    capacity: Family<CapacityLabels, Gauge>,
    host_capacity: Option<i64>,
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
        let capacity = Family::<CapacityLabels, Gauge>::default();
        registry.register("memory_capacity_bytes", "What each memory may grow to: host (the machine, or the cgroup limit when lower) and gpu (the device)", capacity.clone());
        Metrics { registry, variant: variant.to_string(), requests, latency, memory, stage_memory, capacity, host_capacity: host_capacity() }
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
        let capacities = [("host", self.host_capacity), ("gpu", m.nvml.map(|n| n.device_total_bytes as i64))];
        for (memory, bytes) in capacities.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))) {
            self.capacity.get_or_create(&CapacityLabels { variant: self.variant.clone(), memory: memory.into() }).set(bytes);
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

/// The machine's memory, or this process's cgroup limit (v2 or v1) when lower.
fn host_capacity() -> Option<i64> {
    let number = |path: &str| std::fs::read_to_string(path).ok().and_then(|t| t.trim().parse::<i64>().ok());
    let total = std::fs::read_to_string("/proc/meminfo").ok()?.lines().find_map(|l| l.strip_prefix("MemTotal:")).and_then(|r| r.split_whitespace().next()?.parse::<i64>().ok())? * 1024;
    let limit = number("/sys/fs/cgroup/memory.max").or_else(|| number("/sys/fs/cgroup/memory/memory.limit_in_bytes"));
    Some(limit.map_or(total, |l| l.min(total)))
}

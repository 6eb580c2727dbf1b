//! What a black box shows from outside: a process tree's memory, a container's cgroup, the
//! GPU's per-process memory, and the service's own Prometheus gauges. Each [`Signal`] reads
//! one or more named series; a read that fails says why in words a user can act on.

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// What kind of memory a series measures: decides its capacity and the diagnosis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Host memory of the process tree or container.
    Host,
    /// GPU memory as the driver sees it (NVML).
    Gpu,
    /// Bytes held by live tensors (`torch.cuda.memory_allocated()`).
    TorchAllocated,
    /// Bytes the caching allocator holds (`torch.cuda.memory_reserved()`).
    TorchReserved,
    /// Any other gauge the user named.
    Other,
}

/// One reading of one series.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub series: String,
    pub kind: Kind,
    pub bytes: i64,
}

/// A source of memory series.
pub enum Signal {
    /// `/proc/PID/smaps_rollup` of a process and all its descendants (uvicorn and gunicorn
    /// workers are children): `rss` and `anonymous` (which ignores mapped files, the better
    /// leak signal).
    Process { pid: u32 },
    /// A cgroup folder, v2 (`memory.current`, `memory.max`) or v1 (`memory.usage_in_bytes`,
    /// `memory.limit_in_bytes`): the working set (usage less inactive file cache) is what the
    /// OOM killer judges.
    Cgroup { dir: PathBuf },
    /// NVML: the GPU memory of the process tree, and the device's use.
    Gpu { pid: u32, nvml: Box<nvml_wrapper::Nvml> },
    /// A Prometheus text endpoint and the series to read from it.
    Metrics { url: String, series: Vec<String>, client: reqwest::Client },
}

impl Signal {
    pub fn describe(&self) -> String {
        match self {
            Signal::Process { pid } => format!("process {pid} and its children"),
            Signal::Cgroup { dir } => format!("cgroup {}", dir.display()),
            Signal::Gpu { pid, .. } => format!("GPU memory of process {pid} (NVML)"),
            Signal::Metrics { url, .. } => format!("metrics at {url}"),
        }
    }

    /// Opens NVML for process `pid`; without a driver, a clear "NVML unavailable".
    pub fn gpu(pid: u32) -> Result<Signal> {
        let nvml = nvml_wrapper::Nvml::init().map_err(|e| anyhow!("NVML unavailable: {e} (no NVIDIA driver on this machine?)"))?;
        Ok(Signal::Gpu { pid, nvml: Box::new(nvml) })
    }

    /// Checks the cgroup folder holds a memory controller's files.
    pub fn cgroup(dir: &Path) -> Result<Signal> {
        if !dir.join("memory.current").exists() && !dir.join("memory.usage_in_bytes").exists() {
            bail!("{} is not a cgroup with a memory controller: it has neither memory.current (v2) nor memory.usage_in_bytes (v1)", dir.display());
        }
        Ok(Signal::Cgroup { dir: dir.to_path_buf() })
    }

    pub async fn read(&self) -> Result<Vec<Reading>> {
        match self {
            Signal::Process { pid } => read_process(*pid),
            Signal::Cgroup { dir } => read_cgroup(dir),
            Signal::Gpu { pid, nvml } => read_gpu(*pid, nvml),
            Signal::Metrics { url, series, client } => read_metrics(client, url, series).await,
        }
    }

    /// The most this signal's memory can reach, when the signal knows it: the cgroup's limit,
    /// the GPU's total.
    pub fn capacity(&self) -> Option<(Kind, u64)> {
        match self {
            Signal::Cgroup { dir } => cgroup_limit(dir).map(|l| (Kind::Host, l)),
            Signal::Gpu { nvml, .. } => nvml.device_by_index(0).ok().and_then(|d| d.memory_info().ok()).map(|m| (Kind::Gpu, m.total)),
            _ => None,
        }
    }
}

/// `pid` and every descendant, from each process's `children` list.
pub fn process_tree(pid: u32) -> Vec<u32> {
    let mut tree = vec![pid];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) {
            for task in tasks.flatten() {
                if let Ok(text) = std::fs::read_to_string(task.path().join("children")) {
                    for child in text.split_whitespace().filter_map(|c| c.parse::<u32>().ok()) {
                        if !tree.contains(&child) {
                            tree.push(child);
                        }
                    }
                }
            }
        }
        i += 1;
    }
    tree
}

/// `Rss:` and `Anonymous:` of one `smaps_rollup`, in bytes.
pub fn parse_smaps_rollup(text: &str) -> (i64, i64) {
    let field = |name: &str| text.lines().find_map(|l| l.strip_prefix(name)).and_then(|r| r.split_whitespace().next()).and_then(|kb| kb.parse::<i64>().ok()).unwrap_or(0) * 1024;
    (field("Rss:"), field("Anonymous:"))
}

fn read_process(pid: u32) -> Result<Vec<Reading>> {
    let root = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).map_err(|e| anyhow!("process {pid} is gone or unreadable ({e}): it exited, or it is not yours (run as its user or root)"))?;
    let (mut rss, mut anon) = parse_smaps_rollup(&root);
    for child in process_tree(pid).into_iter().skip(1) {
        // A child may exit between listing and reading: it simply no longer counts.
        if let Ok(text) = std::fs::read_to_string(format!("/proc/{child}/smaps_rollup")) {
            let (r, a) = parse_smaps_rollup(&text);
            rss += r;
            anon += a;
        }
    }
    Ok(vec![Reading { series: "anonymous".into(), kind: Kind::Host, bytes: anon }, Reading { series: "rss".into(), kind: Kind::Host, bytes: rss }])
}

fn read_number(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

fn cgroup_limit(dir: &Path) -> Option<u64> {
    // v2 says "max" for no limit, v1 a number near 2^63: neither is a capacity.
    read_number(&dir.join("memory.max")).or_else(|| read_number(&dir.join("memory.limit_in_bytes"))).filter(|&l| l < 1 << 60)
}

fn read_cgroup(dir: &Path) -> Result<Vec<Reading>> {
    let (usage, stat, inactive_key) = if dir.join("memory.current").exists() {
        (dir.join("memory.current"), dir.join("memory.stat"), "inactive_file ")
    } else {
        (dir.join("memory.usage_in_bytes"), dir.join("memory.stat"), "total_inactive_file ")
    };
    let usage = read_number(&usage).with_context(|| format!("cannot read {}: the cgroup is gone?", usage.display()))?;
    let inactive = std::fs::read_to_string(&stat).ok().and_then(|t| t.lines().find_map(|l| l.strip_prefix(inactive_key)).and_then(|v| v.trim().parse::<u64>().ok())).unwrap_or(0);
    Ok(vec![
        Reading { series: "cgroup_working_set".into(), kind: Kind::Host, bytes: usage.saturating_sub(inactive) as i64 },
        Reading { series: "cgroup_usage".into(), kind: Kind::Host, bytes: usage as i64 },
    ])
}

fn read_gpu(pid: u32, nvml: &nvml_wrapper::Nvml) -> Result<Vec<Reading>> {
    use nvml_wrapper::enums::device::UsedGpuMemory;
    let tree = process_tree(pid);
    let count = nvml.device_count().map_err(|e| anyhow!("NVML query failed: {e}"))?;
    let (mut process, mut used) = (0u64, 0u64);
    for i in 0..count {
        let device = nvml.device_by_index(i).map_err(|e| anyhow!("NVML query failed: {e}"))?;
        used += device.memory_info().map_err(|e| anyhow!("NVML query failed: {e}"))?.used;
        // NVML reports host PIDs: inside a container, run the scan on the host or with hostPID.
        for p in device.running_compute_processes().map_err(|e| anyhow!("NVML query failed: {e}"))? {
            if tree.contains(&p.pid) {
                if let UsedGpuMemory::Used(bytes) = p.used_gpu_memory {
                    process += bytes;
                }
            }
        }
    }
    Ok(vec![Reading { series: "gpu_process".into(), kind: Kind::Gpu, bytes: process as i64 }, Reading { series: "gpu_device_used".into(), kind: Kind::Gpu, bytes: used as i64 }])
}

/// The kind of a gauge, from its name: PyTorch's allocator figures by their usual names.
pub fn kind_of(series: &str) -> Kind {
    let s = series.to_ascii_lowercase();
    if s.contains("allocated") {
        Kind::TorchAllocated
    } else if s.contains("reserved") {
        Kind::TorchReserved
    } else if s.contains("resident") || s.contains("rss") || s.contains("working_set") {
        Kind::Host
    } else {
        Kind::Other
    }
}

/// The value of `selector` (a metric name, optionally with `{label="value",...}`) in a
/// Prometheus text exposition; several matching samples are summed (one per worker, say).
pub fn pick(text: &str, selector: &str) -> Result<f64> {
    let (name, labels) = match selector.split_once('{') {
        Some((n, rest)) => (n, rest.trim_end_matches('}')),
        None => (selector, ""),
    };
    let wanted: Vec<(&str, &str)> = labels.split(',').filter(|l| !l.trim().is_empty()).filter_map(|l| l.split_once('=')).map(|(k, v)| (k.trim(), v.trim().trim_matches('"'))).collect();
    let scrape = prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).map_err(|e| anyhow!("the metrics endpoint did not answer in the Prometheus text format: {e}"))?;
    let mut found = None;
    for sample in scrape.samples.iter().filter(|s| s.metric == name && wanted.iter().all(|(k, v)| s.labels.get(k) == Some(*v))) {
        let value = match sample.value {
            prometheus_parse::Value::Gauge(v) | prometheus_parse::Value::Untyped(v) | prometheus_parse::Value::Counter(v) => v,
            _ => bail!("`{selector}` is a histogram or summary, not a gauge of bytes"),
        };
        if !value.is_finite() {
            bail!("`{selector}` is {value}, not a number of bytes");
        }
        *found.get_or_insert(0.0) += value;
    }
    found.ok_or_else(|| {
        let mut names: Vec<&str> = scrape.samples.iter().map(|s| s.metric.as_str()).filter(|m| m.contains("memory") || m.contains("bytes")).collect();
        names.dedup();
        anyhow!("the metrics have no series `{selector}`; memory-like series there: {}", if names.is_empty() { "none".into() } else { names.join(", ") })
    })
}

async fn read_metrics(client: &reqwest::Client, url: &str, series: &[String]) -> Result<Vec<Reading>> {
    let text = client.get(url).send().await.and_then(|r| r.error_for_status()).with_context(|| format!("cannot scrape {url}"))?.text().await?;
    series.iter().map(|s| Ok(Reading { series: s.clone(), kind: kind_of(s), bytes: pick(&text, s)? as i64 })).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smaps_rollup_fields_are_read_in_bytes() {
        let text = "55d0-7ff [rollup]\nRss:              123456 kB\nPss:              100000 kB\nAnonymous:         65536 kB\n";
        assert_eq!(parse_smaps_rollup(text), (123_456 * 1024, 65_536 * 1024));
    }

    #[test]
    fn series_are_picked_by_name_and_labels_and_bad_text_is_an_error() {
        let text = "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes 1.5e+08\n# TYPE mem gauge\nmem{gpu=\"0\"} 10\nmem{gpu=\"1\"} 20\n";
        assert_eq!(pick(text, "process_resident_memory_bytes").unwrap(), 1.5e8);
        assert_eq!(pick(text, "mem").unwrap(), 30.0);
        assert_eq!(pick(text, "mem{gpu=\"1\"}").unwrap(), 20.0);
        assert!(pick(text, "nope").unwrap_err().to_string().contains("process_resident_memory_bytes"));
        assert!(pick("mem NaN\n", "mem").unwrap_err().to_string().contains("not a number"));
        assert_eq!(kind_of("torch_cuda_memory_allocated_bytes"), Kind::TorchAllocated);
        assert_eq!(kind_of("torch_cuda_memory_reserved_bytes"), Kind::TorchReserved);
    }

    #[test]
    fn this_process_is_its_own_tree_and_reads() {
        let me = std::process::id();
        assert_eq!(process_tree(me)[0], me);
        let r = read_process(me).unwrap();
        assert!(r[1].bytes >= r[0].bytes && r[0].bytes > 0, "{r:?}");
        assert!(read_process(u32::MAX - 1).unwrap_err().to_string().contains("gone"));
    }
}

//! What a black box shows from outside: a process tree's memory, a container's cgroup, the
//! GPU's per-process memory, and the service's own Prometheus gauges. Each [`Signal`] reads
//! one or more named series; a read that fails says why in words a user can act on.

use crate::tree::TreeReading;
use anyhow::{anyhow, bail, Context, Result};
use leaklab_proc::Cgroup;
use leaklab_vocab::Probe;
use std::path::Path;

pub use leaklab_judge::evidence::Kind;

/// One reading of one series.
#[derive(Debug, Clone, PartialEq)]
pub struct Reading {
    pub series: String,
    pub kind: Kind,
    pub bytes: i64,
}

/// A source of memory series.
pub enum Signal {
    /// The resident memory of a process and all its descendants (uvicorn and gunicorn
    /// workers are children): `rss` and `anonymous` (which ignores mapped files, the better
    /// leak signal), summed from one walk of the tree ([`crate::tree::try_read`], cheap where
    /// the kernel allows), the walk the diagnosis's per-process reading comes from too.
    Process { pid: u32 },
    /// A cgroup folder, v2 (`memory.current`, `memory.max`) or v1 (`memory.usage_in_bytes`,
    /// `memory.limit_in_bytes`): the working set (usage less inactive file cache) is what the
    /// OOM killer judges.
    Cgroup(Cgroup),
    /// NVML: the GPU memory of the process tree, and the device's use.
    Gpu {
        pid: u32,
        nvml: Box<nvml_wrapper::Nvml>,
    },
    /// A Prometheus text endpoint and the series to read from it.
    Metrics {
        url: String,
        series: Vec<String>,
        client: reqwest::Client,
    },
}

impl Signal {
    pub fn describe(&self) -> String {
        match self {
            Signal::Process { pid } => format!("process {pid} and its children"),
            Signal::Cgroup(c) => format!("cgroup {}", c.dir.display()),
            Signal::Gpu { pid, .. } => format!("GPU memory of process {pid} (NVML)"),
            Signal::Metrics { url, .. } => format!("metrics at {url}"),
        }
    }

    /// Opens NVML for process `pid`; without a driver, a clear "NVML unavailable".
    pub fn gpu(pid: u32) -> Result<Signal> {
        let nvml = nvml_wrapper::Nvml::init()
            .map_err(|e| anyhow!("NVML unavailable: {e} (no NVIDIA driver on this machine?)"))?;
        Ok(Signal::Gpu {
            pid,
            nvml: Box::new(nvml),
        })
    }

    /// Checks the cgroup folder holds a memory controller's files.
    pub fn cgroup(dir: &Path) -> Result<Signal> {
        Cgroup::open(dir).map(Signal::Cgroup).map_err(|e| {
            anyhow!(
                "{} is not a cgroup with a memory controller: {e}",
                dir.display()
            )
        })
    }

    pub async fn read(&self) -> Result<Vec<Reading>> {
        Ok(self.read_with_tree(false).await?.0)
    }

    /// One read of the signal and, for a process tree, the tree process by process from that
    /// same read (one walk of `/proc`, so the series and the diagnosis see one instant);
    /// `private`: the children's private dirty memory too (costly: see [`crate::tree::try_read`]).
    pub async fn read_with_tree(
        &self,
        private: bool,
    ) -> Result<(Vec<Reading>, Option<TreeReading>)> {
        let readings = match self {
            Signal::Process { pid } => {
                let tree = read_process(*pid, private)?;
                return Ok((process_series(tree.total), Some(tree)));
            }
            Signal::Cgroup(c) => read_cgroup(c),
            Signal::Gpu { pid, nvml } => read_gpu(*pid, nvml),
            Signal::Metrics {
                url,
                series,
                client,
            } => read_metrics(client, url, series).await,
        };
        Ok((readings?, None))
    }

    /// The most this signal's memory can reach, when the signal knows it: the cgroup's limit,
    /// the watched GPUs' total (summed over the same devices as their use, see [`watched`]).
    pub fn capacity(&self) -> Option<(Kind, u64)> {
        match self {
            Signal::Cgroup(c) => c.limit().map(|l| (Kind::Host, l)),
            Signal::Gpu { pid, nvml } => gpu_totals(*pid, nvml).ok().map(|t| (Kind::Gpu, t)),
            _ => None,
        }
    }
}

fn read_process(pid: u32, private: bool) -> Result<TreeReading> {
    crate::tree::try_read(pid, private).map_err(|e| anyhow!("process {pid} is gone or unreadable ({e}): it exited, or it is not yours (run as its user or root)"))
}

/// The tree's summed memory as its two series.
fn process_series(total: leaklab_proc::Rollup) -> Vec<Reading> {
    vec![
        Reading {
            series: "anonymous".into(),
            kind: Kind::Host,
            bytes: total.anonymous as i64,
        },
        Reading {
            series: "rss".into(),
            kind: Kind::Host,
            bytes: total.rss as i64,
        },
    ]
}

fn read_cgroup(cgroup: &Cgroup) -> Result<Vec<Reading>> {
    let now = cgroup.usage().with_context(|| {
        format!(
            "cannot read the cgroup {}: is it gone?",
            cgroup.dir.display()
        )
    })?;
    Ok(vec![
        Reading {
            series: "cgroup_working_set".into(),
            kind: Kind::Host,
            bytes: now.working_set as i64,
        },
        Reading {
            series: "cgroup_usage".into(),
            kind: Kind::Host,
            bytes: now.usage as i64,
        },
    ])
}

/// One GPU as NVML reports it, seen from the process tree being scanned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct GpuMemory {
    used: u64,
    total: u64,
    /// The tree's bytes on this device; `None` when none of its processes runs on it.
    tree: Option<u64>,
}

fn gpus(pid: u32, nvml: &nvml_wrapper::Nvml) -> Result<Vec<GpuMemory>> {
    use nvml_wrapper::enums::device::UsedGpuMemory;
    let failed = |e: nvml_wrapper::error::NvmlError| anyhow!("NVML query failed: {e}");
    let tree = leaklab_proc::process_tree(pid);
    let mut devices = Vec::new();
    for i in 0..nvml.device_count().map_err(failed)? {
        let device = nvml.device_by_index(i).map_err(failed)?;
        let memory = device.memory_info().map_err(failed)?;
        // NVML reports host PIDs: inside a container, run the scan on the host or with hostPID.
        let mine: Vec<_> = device
            .running_compute_processes()
            .map_err(failed)?
            .into_iter()
            .filter(|p| tree.contains(&p.pid))
            .collect();
        let bytes = mine
            .iter()
            .map(|p| {
                if let UsedGpuMemory::Used(b) = p.used_gpu_memory {
                    b
                } else {
                    0
                }
            })
            .sum();
        devices.push(GpuMemory {
            used: memory.used,
            total: memory.total,
            tree: (!mine.is_empty()).then_some(bytes),
        });
    }
    Ok(devices)
}

/// The devices a scan of the tree watches: those its processes run on, or every device while it
/// runs on none (a service that has not touched CUDA yet). Use and capacity are both summed
/// over these, so a process on one GPU of eight is judged against that GPU's memory.
fn watched(devices: &[GpuMemory]) -> Vec<GpuMemory> {
    let on: Vec<GpuMemory> = devices
        .iter()
        .copied()
        .filter(|d| d.tree.is_some())
        .collect();
    if on.is_empty() {
        devices.to_vec()
    } else {
        on
    }
}

/// The tree's GPU bytes and the watched devices' use and total.
fn gpu_sums(devices: &[GpuMemory]) -> (u64, u64, u64) {
    watched(devices)
        .iter()
        .fold((0, 0, 0), |(tree, used, total), d| {
            (tree + d.tree.unwrap_or(0), used + d.used, total + d.total)
        })
}

fn gpu_totals(pid: u32, nvml: &nvml_wrapper::Nvml) -> Result<u64> {
    Ok(gpu_sums(&gpus(pid, nvml)?).2)
}

fn read_gpu(pid: u32, nvml: &nvml_wrapper::Nvml) -> Result<Vec<Reading>> {
    let (tree, used, _) = gpu_sums(&gpus(pid, nvml)?);
    Ok(vec![
        Reading {
            series: "gpu_process".into(),
            kind: Kind::Gpu,
            bytes: tree as i64,
        },
        Reading {
            series: "gpu_device_used".into(),
            kind: Kind::Gpu,
            bytes: used as i64,
        },
    ])
}

/// The kind of a gauge, from its name: leaklab's exact CPU allocator gauge, and PyTorch's
/// allocator figures by their usual names.
pub fn kind_of(series: &str) -> Kind {
    let s = series.to_ascii_lowercase();
    if s.contains(Probe::CpuAllocator.name()) {
        Kind::CpuTensors
    } else if s.contains("allocated") {
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
    let wanted: Vec<(&str, &str)> = labels
        .split(',')
        .filter(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_once('='))
        .map(|(k, v)| (k.trim(), v.trim().trim_matches('"')))
        .collect();
    let scrape =
        prometheus_parse::Scrape::parse(text.lines().map(|l| Ok(l.to_string()))).map_err(|e| {
            anyhow!("the metrics endpoint did not answer in the Prometheus text format: {e}")
        })?;
    // The parser skips lines it cannot read: an answer with no sample at all (JSON, a page) is
    // not an exposition, whatever series is asked for.
    if scrape.samples.is_empty() {
        let start: String = text.trim().chars().take(80).collect();
        bail!("the metrics endpoint did not answer in the Prometheus text format: no `name value` sample in its answer (it starts `{start}`)");
    }
    let mut found = None;
    for sample in scrape
        .samples
        .iter()
        .filter(|s| s.metric == name && wanted.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
    {
        let value = match sample.value {
            prometheus_parse::Value::Gauge(v)
            | prometheus_parse::Value::Untyped(v)
            | prometheus_parse::Value::Counter(v) => v,
            _ => bail!("`{selector}` is a histogram or summary, not a gauge of bytes"),
        };
        if !value.is_finite() {
            bail!("`{selector}` is {value}, not a number of bytes");
        }
        *found.get_or_insert(0.0) += value;
    }
    found.ok_or_else(|| {
        let mut names: Vec<&str> = scrape
            .samples
            .iter()
            .map(|s| s.metric.as_str())
            .filter(|m| m.contains("memory") || m.contains("bytes"))
            .collect();
        names.dedup();
        anyhow!(
            "the metrics have no series `{selector}`; memory-like series there: {}",
            if names.is_empty() {
                "none".into()
            } else {
                names.join(", ")
            }
        )
    })
}

async fn read_metrics(
    client: &reqwest::Client,
    url: &str,
    series: &[String],
) -> Result<Vec<Reading>> {
    let text = client
        .get(url)
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .with_context(|| format!("cannot scrape {url}"))?
        .text()
        .await?;
    series
        .iter()
        .map(|s| {
            Ok(Reading {
                series: s.clone(),
                kind: kind_of(s),
                bytes: pick(&text, s)? as i64,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_are_picked_by_name_and_labels_and_bad_text_is_an_error() {
        let text = "# TYPE process_resident_memory_bytes gauge\nprocess_resident_memory_bytes 1.5e+08\n# TYPE mem gauge\nmem{gpu=\"0\"} 10\nmem{gpu=\"1\"} 20\n";
        assert_eq!(pick(text, "process_resident_memory_bytes").unwrap(), 1.5e8);
        assert_eq!(pick(text, "mem").unwrap(), 30.0);
        assert_eq!(pick(text, "mem{gpu=\"1\"}").unwrap(), 20.0);
        assert!(pick(text, "nope")
            .unwrap_err()
            .to_string()
            .contains("process_resident_memory_bytes"));
        assert!(pick("mem NaN\n", "mem")
            .unwrap_err()
            .to_string()
            .contains("not a number"));
        assert!(pick("{\"cpu\": {\"live_bytes\": 3}}\n", "x")
            .unwrap_err()
            .to_string()
            .contains("did not answer in the Prometheus text format"));
        assert_eq!(
            kind_of("torch_cuda_memory_allocated_bytes"),
            Kind::TorchAllocated
        );
        assert_eq!(
            kind_of("torch_cuda_memory_reserved_bytes"),
            Kind::TorchReserved
        );
        // leaklab's exact gauge counts live CPU tensors: the drill's "tensors are kept alive".
        assert_eq!(
            kind_of("leaklab_memory_bytes{probe=\"cpu_allocator_live\"}"),
            Kind::CpuTensors
        );
        assert_eq!(kind_of("process_resident_memory_bytes"), Kind::Host);
    }

    #[test]
    fn gpu_use_and_capacity_are_summed_over_the_same_devices() {
        let gpu = |used: u64, tree: Option<u64>| GpuMemory {
            used: used << 30,
            total: 80 << 30,
            tree: tree.map(|t| t << 30),
        };
        // On one GPU of three: that GPU's use and its 80 GiB, not the machine's 240 GiB.
        assert_eq!(
            gpu_sums(&[gpu(5, None), gpu(12, Some(10)), gpu(7, None)]),
            (10 << 30, 12 << 30, 80 << 30)
        );
        // On two: both, use and capacity alike.
        assert_eq!(
            gpu_sums(&[gpu(5, Some(4)), gpu(12, Some(10)), gpu(7, None)]),
            (14 << 30, 17 << 30, 160 << 30)
        );
        // On none yet (no CUDA context): every device.
        assert_eq!(
            gpu_sums(&[gpu(5, None), gpu(12, None)]),
            (0, 17 << 30, 160 << 30)
        );
        assert_eq!(gpu_sums(&[]), (0, 0, 0));
    }

    #[test]
    fn this_process_reads_and_a_gone_one_says_so() {
        let me = std::process::id();
        let r = process_series(read_process(me, false).unwrap().total);
        assert!(r[1].bytes >= r[0].bytes && r[0].bytes > 0, "{r:?}");
        assert!(read_process(u32::MAX - 1, false)
            .unwrap_err()
            .to_string()
            .contains("gone"));
    }
}

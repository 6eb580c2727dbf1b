//! One look at the service every interval: its own request count and its memory, from the
//! agent's `stats` route (summed over the workers that share a folder), the service's Prometheus
//! counter, and the scan's signals (process tree, cgroup, GPU). Nothing is sent to the service's
//! own routes: the agent's routes and `/metrics` are not counted as requests.

use anyhow::{anyhow, bail, Result};
pub use leaklab_judge::watch::looks::Point;
use leaklab_scan::agent::Collector;
use leaklab_scan::signals::{kind_of, pick, Kind, Signal};
use leaklab_scan::tree::TreeReading;
use serde::Deserialize;
use std::collections::BTreeMap;

/// Where the request count comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Counter {
    /// The agent's base (`…/debug/leaklab`): `GET {base}/stats`.
    Agent(String),
    /// A Prometheus text endpoint and the counter of requests in it (summed over its labels).
    Metrics { url: String, series: String },
}

/// The agent's `stats` document, the fields the watch reads (schema `leaklab.stats/1`).
#[derive(Debug, Deserialize)]
struct Stats {
    pid: u32,
    process: Figures,
    /// Absent in agents older than the request counts.
    requests: Option<Counts>,
    cuda: Option<Cuda>,
    /// The collector's state (absent in older agents).
    #[serde(default)]
    collector: Option<Collector>,
    /// Present where the workers share a folder (`workers_dir`): the whole server's figures.
    #[serde(default)]
    workers: Option<Workers>,
}

#[derive(Debug, Deserialize)]
struct Figures {
    rss_bytes: Option<u64>,
    anonymous_bytes: Option<u64>,
}

#[derive(Debug, Deserialize)]
struct Counts {
    started: u64,
    answered: u64,
}

#[derive(Debug, Deserialize)]
struct Cuda {
    devices: Vec<CudaDevice>,
}

#[derive(Debug, Deserialize)]
struct CudaDevice {
    allocated_bytes: u64,
    reserved_bytes: u64,
}

#[derive(Debug, Deserialize)]
struct Workers {
    pids: Vec<u32>,
    requests: Counts,
    process: Figures,
    /// PID -> the agent a worker serves of its own (`leaklab.serve_agent()`).
    #[serde(default)]
    agents: BTreeMap<String, String>,
}

/// The sources of one watch, read together at every look.
pub struct Sampler {
    pub client: reqwest::Client,
    pub counter: Counter,
    /// Memory read from outside: the process tree of `--pid`, the cgroup, the GPU.
    pub signals: Vec<Signal>,
    /// `--series`: memory gauges read from the same Prometheus text as the counter.
    pub gauges: Vec<String>,
    /// Each series' kind, as first seen.
    pub kinds: BTreeMap<String, Kind>,
    /// The agent's collector state at the last look that read it.
    pub collector: Option<Collector>,
    /// The agents the workers serve of their own, by PID, as the looks found them.
    pub agents: BTreeMap<u32, String>,
}

impl Sampler {
    /// The watched PID, where `--pid` was given.
    fn pid(&self) -> Option<u32> {
        self.signals.iter().find_map(|s| match s {
            Signal::Process { pid } => Some(*pid),
            _ => None,
        })
    }

    /// One look. An error is a look that failed (the service restarting, the agent busy): the
    /// watch says it and looks again at the next interval. `notes` gets what changed (a PID
    /// followed). With `--pid`, the process tree process by process besides (for the axis: which process
    /// grew), read at the same moment, with its root.
    pub async fn look(
        &mut self,
        t: f64,
        notes: &mut Vec<String>,
    ) -> Result<(Point, Option<(u32, TreeReading)>)> {
        let mut memory = BTreeMap::new();
        let (answered, started, mut pids, new_process) = match self.counter.clone() {
            Counter::Agent(base) => {
                let stats = self.stats(&base).await?;
                if stats.collector.is_some() {
                    self.collector.clone_from(&stats.collector);
                }
                if let Some(w) = &stats.workers {
                    self.agents.extend(
                        w.agents
                            .iter()
                            .filter_map(|(pid, url)| Some((pid.parse().ok()?, url.clone()))),
                    );
                }
                let (counts, figures, pids) = match &stats.workers {
                    Some(w) => {
                        let mut pids = w.pids.clone();
                        pids.sort_unstable();
                        (&w.requests, &w.process, pids)
                    }
                    None => (
                        stats.requests.as_ref().ok_or_else(|| anyhow!("the agent at {base} counts no requests (its stats have no `requests`): upgrade leaklab in the service"))?,
                        &stats.process,
                        vec![stats.pid],
                    ),
                };
                // Memory from the agent only where nothing outside is watched: the process tree
                // or the cgroup, read by this machine, are the better witnesses.
                if self.signals.is_empty() {
                    if let Some(b) = figures.anonymous_bytes {
                        memory.insert("agent_anonymous".to_string(), (Kind::Host, b as i64));
                    }
                    if let Some(b) = figures.rss_bytes {
                        memory.insert("agent_rss".to_string(), (Kind::Host, b as i64));
                    }
                }
                if let Some(cuda) = &stats.cuda {
                    let sum = |f: fn(&CudaDevice) -> u64| cuda.devices.iter().map(f).sum::<u64>();
                    memory.insert(
                        "torch_allocated".to_string(),
                        (Kind::TorchAllocated, sum(|d| d.allocated_bytes) as i64),
                    );
                    memory.insert(
                        "torch_reserved".to_string(),
                        (Kind::TorchReserved, sum(|d| d.reserved_bytes) as i64),
                    );
                }
                // The process to follow after a restart: the one worker, or the workers' parent.
                let serving = match &stats.workers {
                    Some(w) if w.pids.len() > 1 => w.pids.first().and_then(|p| parent(*p)),
                    _ => Some(stats.pid),
                };
                (counts.answered, Some(counts.started), pids, serving)
            }
            Counter::Metrics { url, series } => {
                let text = self.scrape(&url).await?;
                let count = pick(&text, &series)?;
                if count < 0.0 {
                    bail!("the counter `{series}` is negative ({count})");
                }
                for gauge in &self.gauges {
                    memory.insert(gauge.clone(), (kind_of(gauge), pick(&text, gauge)? as i64));
                }
                (count.round() as u64, None, Vec::new(), None)
            }
        };
        // The process tree comes with the process signal's own read: one walk of /proc a look.
        let mut tree = None;
        for i in 0..self.signals.len() {
            let (readings, walked) = match self.signals[i].read_with_tree(false).await {
                Ok(r) => r,
                Err(e) => {
                    // The watched process is gone: follow the new one where the agent names it.
                    let (Signal::Process { pid: old }, Some(new)) = (&self.signals[i], new_process)
                    else {
                        return Err(e);
                    };
                    if *old == new || !std::path::Path::new(&format!("/proc/{new}")).exists() {
                        return Err(e);
                    }
                    notes.push(format!("process {old} is gone; the agent is answered by process {new} now, which the watch follows from {t:.0} s"));
                    self.signals[i] = Signal::Process { pid: new };
                    self.signals[i].read_with_tree(false).await?
                }
            };
            if let (Signal::Process { pid }, Some(walked)) = (&self.signals[i], walked) {
                tree = Some((*pid, walked));
            }
            for r in readings {
                memory.insert(r.series, (r.kind, r.bytes));
            }
        }
        if pids.is_empty() {
            pids.extend(self.pid());
        }
        if pids.is_empty() {
            pids = self.cgroup_processes();
        }
        let mut bytes = BTreeMap::new();
        for (name, (kind, b)) in memory {
            self.kinds.entry(name.clone()).or_insert(kind);
            bytes.insert(name, b);
        }
        Ok((
            Point {
                t,
                answered,
                started,
                pids,
                memory: bytes,
            },
            tree,
        ))
    }

    /// The processes of the watched cgroup (`cgroup.procs`, v1 and v2 alike), sorted: with
    /// neither the agent nor `--pid`, they are the serving processes, and one replaced inside
    /// the cgroup is a restart. Empty where unreadable.
    fn cgroup_processes(&self) -> Vec<u32> {
        let Some(dir) = self.signals.iter().find_map(|s| match s {
            Signal::Cgroup(c) => Some(&c.dir),
            _ => None,
        }) else {
            return Vec::new();
        };
        let text = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
        let mut pids: Vec<u32> = text.lines().filter_map(|l| l.trim().parse().ok()).collect();
        pids.sort_unstable();
        pids
    }

    async fn get(&self, url: &str) -> Result<Vec<u8>> {
        // Once more on a connection the server closed as it was reused: uvicorn closes an idle
        // keep-alive connection after 5 s, the default interval (8 of 365 looks of a 30-minute
        // watch of the twin failed so before this retry).
        let response = match self.client.get(url).send().await {
            Err(e) if !e.is_timeout() => self.client.get(url).send().await,
            sent => sent,
        }
        .map_err(|e| anyhow!("{url} does not answer: {}", leaklab_client::describe(&e)))?;
        let status = response.status();
        let body = response.bytes().await?.to_vec();
        if let Some(refused) = leaklab_client::refused(url, status, &body) {
            bail!("{refused}");
        }
        if !status.is_success() {
            bail!(
                "{url} answered {status}: {}",
                String::from_utf8_lossy(&body[..body.len().min(200)]).trim()
            );
        }
        Ok(body)
    }

    async fn stats(&self, base: &str) -> Result<Stats> {
        let url = format!("{}/stats", base.trim_end_matches('/'));
        let body = self.get(&url).await?;
        serde_json::from_slice(&body).map_err(|e| {
            anyhow!("{url} did not answer with the agent's stats ({e}): is --agent the base of the agent's routes, e.g. http://127.0.0.1:8000/debug/leaklab?")
        })
    }

    async fn scrape(&self, url: &str) -> Result<String> {
        let body = self.get(url).await?;
        Ok(String::from_utf8_lossy(&body).into_owned())
    }
}

/// The parent of `pid` (`/proc/PID/stat`'s fourth field), unless it is init.
fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may hold spaces: the fields after its last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    let ppid: u32 = rest.split_whitespace().nth(1)?.parse().ok()?;
    (ppid > 1).then_some(ppid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_parent_of_this_process_is_read_and_a_gone_one_has_none() {
        let me = std::process::id();
        assert_eq!(
            parent(me),
            Some(std::os::unix::process::parent_id()).filter(|p| *p > 1)
        );
        assert_eq!(parent(u32::MAX - 1), None);
    }

    #[test]
    fn the_stats_of_one_worker_and_of_a_shared_folder_are_read() {
        let one: Stats = serde_json::from_str(r#"{"schema":"leaklab.stats/1","pid":7,"process":{"rss_bytes":10,"anonymous_bytes":5,"source":"x"},"cuda":null,"requests":{"started":3,"answered":2}}"#).unwrap();
        assert_eq!((one.pid, one.requests.unwrap().answered), (7, 2));
        assert!(one.workers.is_none());
        let many: Stats = serde_json::from_str(r#"{"pid":7,"process":{"rss_bytes":10,"anonymous_bytes":5},"requests":{"started":3,"answered":2},"workers":{"pids":[8,7],"requests":{"started":9,"answered":9},"process":{"rss_bytes":20,"anonymous_bytes":11}}}"#).unwrap();
        let w = many.workers.unwrap();
        assert_eq!(
            (w.pids, w.requests.answered, w.process.anonymous_bytes),
            (vec![8, 7], 9, Some(11))
        );
    }
}

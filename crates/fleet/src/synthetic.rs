//! A deterministic synthetic fleet with every dirty pattern a real one has, for the tests
//! against a real Prometheus (backfilled with `promtool tsdb create-blocks-from openmetrics`)
//! and the speed benchmark. Each group carries the verdict it must get.
//!
//! GPU pods report like NVIDIA's DCGM exporter (`DCGM_FI_DEV_FB_USED` and `_FREE` in MiB, an
//! 80 GB card: 81,559 MiB of which 480 reserved); CPU pods like cAdvisor
//! (`container_memory_working_set_bytes`) with their limit from kube-state-metrics
//! (`kube_pod_container_resource_limits{resource="memory"}`). Expectations are for a budget of
//! three days (`--fail-if-oom-within 3d`).

use leaklab_detect::Verdict;
use std::fmt::Write;

pub const GPU_MIB: f64 = 81_559.0;
/// DCGM's FB_USED + FB_FREE: the card less what the driver reserves.
pub const GPU_USABLE_MIB: f64 = GPU_MIB - 480.0;
pub const HOST_LIMIT_BYTES: f64 = 16.0 * 1024.0 * 1024.0 * 1024.0;
const GIB_IN_MIB: f64 = 1024.0;
const HOUR: f64 = 3600.0;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pattern {
    /// 14 GiB and allocator jitter.
    Flat,
    /// 60 MiB an hour: a real leak, weeks from the OOM.
    SlowLeak,
    /// The story: 12 GiB at the start, about 5.4 GiB an hour, out of memory within the day.
    SeedLeak,
    /// 500 MiB an hour from 20 GiB: runs out in four to five days.
    ModerateLeak,
    /// 8 to 12 GiB an hour: OOM-killed, back at 12 GiB, climbing again.
    OomRestarts,
    /// A cache filled for 40 minutes and emptied on a timer.
    Sawtooth,
    /// The same with troughs creeping up 400 MiB an hour: a leak under the teeth.
    SawtoothLeak,
    /// A cache filling 2 GiB an hour for four hours, then full.
    Plateau,
    /// Flat with ten-minute scrape gaps every two hours and NaN samples.
    Gaps,
    /// Restarted by a deploy at nine hours: back from 0.5 GiB with the load ramping over 20 min.
    DeployRamp,
    /// Restarted 20 minutes before the end, still ramping.
    JustRestarted,
    /// 16 GiB with 6 GiB bursts on one sample in twenty.
    Bursty,
    /// Replaced at six hours: the old pod's series stops...
    ReplacedOld,
    /// ...and the new one's starts.
    ReplacedNew,
    /// Host memory (cAdvisor) leaking 200 MiB an hour from 3 GiB under a 16 GiB limit.
    HostLeak,
    /// Host memory flat at 3 GiB with GC noise.
    HostFlat,
    /// Host memory filling a bounded cache then stopping.
    HostPlateau,
}

impl Pattern {
    pub const GPU: [Pattern; 14] = [
        Pattern::Flat,
        Pattern::SlowLeak,
        Pattern::SeedLeak,
        Pattern::ModerateLeak,
        Pattern::OomRestarts,
        Pattern::Sawtooth,
        Pattern::SawtoothLeak,
        Pattern::Plateau,
        Pattern::Gaps,
        Pattern::DeployRamp,
        Pattern::JustRestarted,
        Pattern::Bursty,
        Pattern::ReplacedOld,
        Pattern::ReplacedNew,
    ];
    pub const HOST: [Pattern; 3] = [Pattern::HostLeak, Pattern::HostFlat, Pattern::HostPlateau];

    pub fn name(self) -> &'static str {
        match self {
            Pattern::Flat => "flat",
            Pattern::SlowLeak => "slow-leak",
            Pattern::SeedLeak => "seed-leak",
            Pattern::ModerateLeak => "moderate-leak",
            Pattern::OomRestarts => "oom-restarts",
            Pattern::Sawtooth => "sawtooth",
            Pattern::SawtoothLeak => "sawtooth-leak",
            Pattern::Plateau => "plateau",
            Pattern::Gaps => "gaps",
            Pattern::DeployRamp => "deploy-ramp",
            Pattern::JustRestarted => "just-restarted",
            Pattern::Bursty => "bursty",
            Pattern::ReplacedOld => "replaced-old",
            Pattern::ReplacedNew => "replaced-new",
            Pattern::HostLeak => "host-leak",
            Pattern::HostFlat => "host-flat",
            Pattern::HostPlateau => "host-plateau",
        }
    }

    /// The verdict the group must get (`None`: gone, never judged for an alarm), and whether it
    /// runs out within three days.
    pub fn expected(self) -> (Option<Verdict>, bool) {
        use Verdict::*;
        match self {
            Pattern::Flat
            | Pattern::Sawtooth
            | Pattern::Gaps
            | Pattern::Bursty
            | Pattern::ReplacedNew
            | Pattern::HostFlat
            | Pattern::JustRestarted
            | Pattern::DeployRamp => (Some(Flat), false),
            Pattern::SlowLeak | Pattern::ModerateLeak | Pattern::SawtoothLeak => {
                (Some(Leak), false)
            }
            Pattern::SeedLeak | Pattern::OomRestarts | Pattern::HostLeak => (Some(Leak), true),
            Pattern::Plateau | Pattern::HostPlateau => (Some(Plateau), false),
            Pattern::ReplacedOld => (None, false),
        }
    }

    pub fn is_gpu(self) -> bool {
        !Pattern::HOST.contains(&self)
    }
}

/// A cheap deterministic hash in [0, 1): the same fleet on every run and every machine.
fn unit(a: u64, b: u64) -> f64 {
    let mut x = a.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ b.wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    x ^= x >> 31;
    x = x.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x ^= x >> 29;
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// One sample of pattern `p` for pod `k` at `t` seconds into the range of `span` seconds: MiB
/// used for GPU patterns, bytes for host ones. `None`: no sample (a gap, a pod not running).
fn value(p: Pattern, k: u64, t: f64, i: u64, span: f64) -> Option<f64> {
    let jitter = 64.0 * unit(k, i);
    let gib = GIB_IN_MIB;
    let ramp = |since: f64, from: f64, to: f64| {
        if since < 1200.0 {
            from + (to - from) * since / 1200.0
        } else {
            to
        }
    };
    Some(match p {
        Pattern::Flat => 14.0 * gib + jitter,
        Pattern::SlowLeak => 14.0 * gib + 60.0 * t / HOUR + jitter,
        Pattern::SeedLeak => 12.0 * gib + (5.2 + 0.4 * unit(k, 1)) * gib * t / HOUR + jitter,
        Pattern::ModerateLeak => 20.0 * gib + 500.0 * t / HOUR + jitter,
        Pattern::OomRestarts => {
            let rate = (8.0 + 4.0 * unit(k, 2)) * gib / HOUR;
            let life = (GPU_USABLE_MIB * 0.995 - 12.0 * gib) / rate;
            let phase = (t + unit(k, 3) * life) % (life + 60.0);
            if phase > life {
                0.0 // the dead minute before the container is back
            } else {
                12.0 * gib + rate * phase + jitter
            }
        }
        Pattern::Sawtooth | Pattern::SawtoothLeak => {
            let creep = if p == Pattern::SawtoothLeak {
                400.0 * t / HOUR
            } else {
                0.0
            };
            let period = 2400.0;
            let phase = (t + unit(k, 4) * period) % period;
            20.0 * gib + creep + 12.0 * gib * phase / period + jitter
        }
        Pattern::Plateau => 16.0 * gib + 2.0 * gib * (t.min(4.0 * HOUR)) / HOUR + jitter,
        Pattern::Gaps => {
            if t % (2.0 * HOUR) > 1.5 * HOUR && t % (2.0 * HOUR) < 1.5 * HOUR + 600.0 {
                return None;
            }
            if i % 37 == 5 {
                f64::NAN
            } else {
                18.0 * gib + jitter
            }
        }
        Pattern::DeployRamp => {
            let deploy = 9.0 * HOUR;
            match t {
                t if t < deploy => 25.0 * gib + jitter,
                t if t < deploy + 60.0 => return None,
                t => ramp(t - deploy - 60.0, 0.5 * gib, 25.0 * gib) + jitter,
            }
        }
        Pattern::JustRestarted => {
            let deploy = span - 1200.0;
            match t {
                t if t < deploy => 22.0 * gib + jitter,
                t if t < deploy + 60.0 => return None,
                t => ramp(t - deploy - 60.0, 0.5 * gib, 22.0 * gib) * 0.8 + jitter,
            }
        }
        Pattern::Bursty => {
            16.0 * gib
                + if unit(k, i + 1_000_000) < 0.05 {
                    6.0 * gib
                } else {
                    0.0
                }
                + jitter
        }
        Pattern::ReplacedOld => {
            if t >= 6.0 * HOUR {
                return None;
            }
            15.0 * gib + jitter
        }
        Pattern::ReplacedNew => {
            if t < 6.0 * HOUR + 120.0 {
                return None;
            }
            15.0 * gib + jitter
        }
        Pattern::HostLeak => (3.0 * gib + 200.0 * t / HOUR + jitter / 2.0) * 1024.0 * 1024.0,
        Pattern::HostFlat => {
            (3.0 * gib + jitter / 2.0 + if i.is_multiple_of(10) { 300.0 } else { 0.0 })
                * 1024.0
                * 1024.0
        }
        Pattern::HostPlateau => {
            (3.0 * gib + 1.5 * gib * (t.min(3.0 * HOUR)) / HOUR + jitter / 2.0) * 1024.0 * 1024.0
        }
    })
}

/// One synthetic pod: its name, pattern and samples `(unix seconds, value)` (NaN kept).
#[derive(Debug, Clone)]
pub struct Pod {
    pub name: String,
    pub pattern: Pattern,
    pub samples: Vec<(f64, f64)>,
}

/// `per_pattern` pods of each pattern over `[end - span, end]` at `step` seconds.
pub fn fleet(per_pattern: usize, end: f64, span: f64, step: f64) -> Vec<Pod> {
    let start = end - span;
    let mut pods = Vec::new();
    let mut k = 0u64;
    for pattern in Pattern::GPU.iter().chain(Pattern::HOST.iter()).copied() {
        for n in 0..per_pattern {
            k += 1;
            let points = (span / step).floor() as u64 + 1;
            let samples = (0..points).filter_map(|i| {
                let t = i as f64 * step;
                value(pattern, k, t, i, span).map(|v| (start + t, v))
            });
            pods.push(Pod {
                name: format!("{}-{n:03}", pattern.name()),
                pattern,
                samples: samples.collect(),
            });
        }
    }
    pods
}

fn labels(pod: &Pod, gpu: usize) -> String {
    if pod.pattern.is_gpu() {
        format!("gpu=\"{}\",UUID=\"GPU-{:08x}\",modelName=\"NVIDIA H100 80GB HBM3\",Hostname=\"node-{}\",namespace=\"serving\",pod=\"{}\",container=\"server\"", gpu % 8, gpu * 2_654_435_761 % 0xffff_ffff, gpu / 8, pod.name)
    } else {
        format!(
            "namespace=\"serving\",pod=\"{}\",container=\"server\"",
            pod.name
        )
    }
}

fn number(v: f64) -> String {
    if v.is_nan() {
        "NaN".into()
    } else {
        format!("{v}")
    }
}

/// The fleet as an OpenMetrics text exposition with timestamps, what `promtool tsdb
/// create-blocks-from openmetrics` backfills: each family contiguous, each series in time order.
pub fn openmetrics(pods: &[Pod]) -> String {
    let mut out = String::new();
    let gpu: Vec<(usize, &Pod)> = pods
        .iter()
        .filter(|p| p.pattern.is_gpu())
        .enumerate()
        .collect();
    let host: Vec<&Pod> = pods.iter().filter(|p| !p.pattern.is_gpu()).collect();
    let family = |out: &mut String,
                  name: &str,
                  help: &str,
                  rows: &mut dyn Iterator<Item = (String, f64, f64)>| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
        for (labels, t, v) in rows {
            let _ = writeln!(out, "{name}{{{labels}}} {} {t}", number(v));
        }
    };
    family(
        &mut out,
        "DCGM_FI_DEV_FB_USED",
        "Framebuffer memory used (in MiB).",
        &mut gpu.iter().flat_map(|&(g, p)| {
            p.samples
                .iter()
                .map(move |&(t, v)| (labels(p, g), t, v.round()))
        }),
    );
    family(
        &mut out,
        "DCGM_FI_DEV_FB_FREE",
        "Framebuffer memory free (in MiB).",
        &mut gpu.iter().flat_map(|&(g, p)| {
            p.samples.iter().map(move |&(t, v)| {
                (
                    labels(p, g),
                    t,
                    if v.is_nan() {
                        v
                    } else {
                        (GPU_USABLE_MIB - v.round()).max(0.0)
                    },
                )
            })
        }),
    );
    family(
        &mut out,
        "container_memory_working_set_bytes",
        "Current working set of the container in bytes",
        &mut host.iter().flat_map(|p| {
            p.samples
                .iter()
                .map(move |&(t, v)| (labels(p, 0), t, v.round()))
        }),
    );
    family(
        &mut out,
        "kube_pod_container_resource_limits",
        "The number of requested limit resource by a container.",
        &mut host.iter().flat_map(|p| {
            p.samples.iter().step_by(5).map(move |&(t, _)| {
                (
                    format!("{},resource=\"memory\",unit=\"byte\"", labels(p, 0)),
                    t,
                    HOST_LIMIT_BYTES,
                )
            })
        }),
    );
    out.push_str("# EOF\n");
    out
}

/// The fleet as `query_range` would return it, without a server: the bench's input.
pub fn series(pods: &[Pod]) -> Vec<crate::prometheus::Series> {
    pods.iter()
        .map(|p| crate::prometheus::Series {
            labels: [("pod".to_string(), p.name.clone())].into_iter().collect(),
            points: p
                .samples
                .iter()
                .copied()
                .filter(|s| s.1.is_finite())
                .collect(),
            dropped: p.samples.iter().filter(|s| !s.1.is_finite()).count(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{judge_fleet, JudgeConfig};
    use leaklab_detect::budget::Budget;

    /// Every pattern gets its verdict from the judging alone (the server tests then check the
    /// same through Prometheus), at a 60 s and a 15 s step.
    #[test]
    fn every_synthetic_group_gets_its_verdict() {
        for step in [60.0, 15.0] {
            let end = 1_700_000_000.0;
            let pods = fleet(3, end, 12.0 * HOUR, step);
            let series = series(&pods);
            let config = JudgeConfig {
                range: crate::prometheus::Range {
                    start: end - 12.0 * HOUR,
                    end,
                    step,
                },
                unit_bytes: 1.0,
                warmup_s: 1800.0,
                budget: Budget {
                    steps_per_second: 1.0,
                    seconds: 3.0 * 86400.0,
                },
            };
            // MiB for the GPU pods, bytes for the host ones: judged in two groups as a user would.
            let (gpu, host): (Vec<_>, Vec<_>) = series.into_iter().partition(|s| {
                pods.iter()
                    .any(|p| p.name == s.labels["pod"] && p.pattern.is_gpu())
            });
            let mut results = judge_fleet(
                &gpu,
                &Default::default(),
                Some((GPU_USABLE_MIB * 1024.0 * 1024.0) as u64),
                &Default::default(),
                &JudgeConfig {
                    unit_bytes: 1024.0 * 1024.0,
                    ..config
                },
            );
            results.extend(judge_fleet(
                &host,
                &Default::default(),
                Some(HOST_LIMIT_BYTES as u64),
                &Default::default(),
                &config,
            ));
            for r in &results {
                let pattern = pods
                    .iter()
                    .find(|p| p.name == r.labels["pod"])
                    .unwrap()
                    .pattern;
                let (verdict, fails) = pattern.expected();
                if verdict.is_none() {
                    assert!(r.gone && r.ops.is_none(), "{} at {step}: {r:?}", r.name);
                    continue;
                }
                assert_eq!(
                    r.verdict(),
                    verdict,
                    "{} at {step}: {:?} {:?}",
                    r.name,
                    r.judged,
                    r.why_not_judged
                );
                assert_eq!(
                    r.ops.is_some_and(|o| o.fails()),
                    fails,
                    "{} at {step}: {:?} in {:?} s",
                    r.name,
                    r.ops,
                    r.seconds_to_oom
                );
            }
        }
    }
}

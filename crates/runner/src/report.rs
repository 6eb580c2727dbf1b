//! The lab's outputs: the verdict table, `report.md`, `report.json`, plots and snapshots.

use crate::driver::{RunOptions, VariantRun};
use crate::expect::describe;
use crate::files::write_atomic;
use crate::judge::{series, VariantResult};
use crate::plot;
use anyhow::Result;
use leaklab_detect::human_bytes;
use leaklab_vocab::{Device, Probe, Scale};
use serde::{Deserialize, Serialize};
use std::path::Path;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LabReport {
    pub scale: Scale,
    pub device: Device,
    pub warmup: usize,
    pub requests: usize,
    pub concurrency: usize,
    pub cores: usize,
    pub seconds: f64,
    pub passed: bool,
    pub variants: Vec<VariantResult>,
}

impl LabReport {
    pub fn new(options: &RunOptions, variants: Vec<VariantResult>, seconds: f64) -> LabReport {
        LabReport {
            scale: options.scale,
            device: options.device,
            warmup: options.warmup,
            requests: options.requests,
            concurrency: options.concurrency,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            seconds,
            passed: variants.iter().all(|v| v.passed),
            variants,
        }
    }

    fn rows(&self) -> Vec<[String; 9]> {
        self.variants
            .iter()
            .map(|v| {
                let j = v.primary().map(|p| &p.judgement);
                let slope = j.map_or("-".into(), |j| format!("{} ± {}", human_bytes(j.slope.bytes_per_request), human_bytes(j.slope.half_width())));
                let stage = v.stages.first().map_or("-", |s| s.stage.name());
                let oom = v.projection.map_or("never".into(), |p| format!("{} req, {:.1} h", p.requests, p.hours()));
                let rss = v.probes().iter().find(|o| o.probe == Probe::Rss).map_or("-".into(), |o| o.judgement.verdict.to_string());
                let pass = if v.passed { "pass" } else { "FAIL" };
                [v.variant.to_string(), v.cause_label().into(), v.verdict_label(), slope, stage.into(), oom, rss, describe(&v.expected), pass.into()]
            })
            .collect()
    }

    const HEADER: [&'static str; 9] = ["variant", "cause", "verdict", "bytes/request", "growing stage", "OOM (reference)", "RSS", "expected", "result"];

    /// The verdict table for the terminal.
    pub fn table(&self) -> String {
        aligned_table(&Self::HEADER, &self.rows())
    }

    /// The table's stable parts (no byte counts), for regression snapshots.
    pub fn stable_table(&self) -> String {
        self.rows().iter().map(|r| format!("{:<12} {:<10} {:<8} expected {:<16} {}", r[0], r[1], r[2], r[7], r[8])).collect::<Vec<_>>().join("\n")
    }

    pub fn markdown(&self) -> String {
        let mut md = String::new();
        md.push_str("# leaklab report\n\n");
        md.push_str(&format!(
            "Scale `{}`, device `{}`, {} warm-up + {} measured requests per variant at concurrency {}, {} cores; {:.1} s in all. Overall: **{}**.\n\n",
            self.scale.name(), self.device, self.warmup, self.requests, self.concurrency, self.cores, self.seconds, if self.passed { "every verdict as expected" } else { "UNEXPECTED VERDICTS" }
        ));
        md.push_str("The verdict comes from the primary probe (the exact CPU allocator; CUDA allocated bytes on CUDA). OOM (reference): requests and hours until an 80 GB card that starts at 12 GB is full at this slope, one request every 32 s.\n\n");
        md.push_str(&markdown_table(&Self::HEADER, &self.rows()));
        md.push_str("\n![all variants](overlay.svg)\n\n## Variants\n");
        for v in &self.variants {
            md.push_str(&format!("\n### {}\n\n", v.variant));
            if let Some(f) = v.failure() {
                md.push_str(&format!("Run failed: {f}\n"));
                continue;
            }
            for p in v.probes() {
                let j = &p.judgement;
                md.push_str(&format!(
                    "- `{}`: **{}**, {} per request, {} → {}\n",
                    p.probe,
                    j.verdict,
                    j.slope.with_bounds(),
                    human_bytes(j.first.1 as f64),
                    human_bytes(j.last.1 as f64)
                ));
            }
            for s in &v.stages {
                md.push_str(&format!("- memory born in stage `{}` does not come back: {} at {}/request\n", s.stage, s.verdict, human_bytes(s.bytes_per_request)));
            }
            md.push_str(&format!("- {} requests in {:.1} s, {} errors\n\n![{}]({}.svg)\n", v.requests, v.seconds, v.errors, v.variant, v.variant));
            if !v.holders.is_empty() {
                md.push_str(&format!("\nWho holds the memory the run kept: allocated during the run and never freed (from `{}.pickle`; `leaklab snapshot explain --since 0` for more):\n\n", v.variant));
                md.push_str(&leaklab_snapshot::render::holder_table(&v.holders, 5));
            }
        }
        md
    }

    /// Writes report.md, report.json, a plot per variant, the overlay and the snapshots into `dir`.
    pub fn write(&self, dir: &Path, runs: &[VariantRun]) -> Result<()> {
        write_atomic(&dir.join("report.json"), &serde_json::to_vec_pretty(self)?)?;
        write_atomic(&dir.join("report.md"), self.markdown().as_bytes())?;
        let mut overlay = Vec::new();
        for run in runs {
            let name = run.variant.name();
            let probe = self.device.primary_probe();
            let primary = series(&run.samples, probe).unwrap_or_default();
            let rss = series(&run.samples, Probe::Rss).unwrap_or_default();
            let lines = vec![(probe.to_string(), growth(&primary)), (Probe::Rss.to_string(), growth(&rss))];
            // A run that failed is drawn and titled as failed, whatever samples it brought back.
            let verdict = self.variants.iter().find(|v| v.variant == run.variant).map_or("FAILED".into(), VariantResult::verdict_label);
            plot::write_chart(dir, name, &format!("{name}: {verdict} (growth since the first request, MB)"), &lines, self.warmup)?;
            overlay.push((name.to_string(), growth(&primary)));
            if let Some(snapshot) = &run.snapshot {
                write_atomic(&dir.join(format!("{name}.pickle")), snapshot)?;
            }
        }
        plot::write_chart(dir, "overlay", "All variants: primary probe, growth since the first request (MB)", &overlay, self.warmup)?;
        Ok(())
    }
}

/// Bytes above the first sample, in MB, for plotting.
fn growth(series: &[(u64, i64)]) -> Vec<(f64, f64)> {
    let base = series.first().map_or(0, |s| s.1);
    series.iter().map(|(x, y)| (*x as f64, (y - base) as f64 / 1e6)).collect()
}

/// A table for the terminal: columns padded to their widest cell, a rule under the header,
/// two spaces between columns (run-lab's verdicts, scan's series, the fleet's groups).
pub fn aligned_table<R: AsRef<[String]>>(header: &[&str], rows: &[R]) -> String {
    let widths: Vec<usize> = (0..header.len()).map(|c| rows.iter().map(|r| r.as_ref()[c].chars().count()).chain([header[c].chars().count()]).max().unwrap_or(0)).collect();
    let line = |cells: Vec<&str>| cells.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect::<Vec<_>>().join("  ").trim_end().to_string();
    let mut out = vec![line(header.to_vec()), widths.iter().map(|w| "-".repeat(*w)).collect::<Vec<_>>().join("  ")];
    out.extend(rows.iter().map(|r| line(r.as_ref().iter().map(String::as_str).collect())));
    out.join("\n")
}

/// The same table in markdown, for report.md.
pub fn markdown_table<R: AsRef<[String]>>(header: &[&str], rows: &[R]) -> String {
    let mut md = format!("| {} |\n|{}\n", header.join(" | "), "---|".repeat(header.len()));
    for r in rows {
        md.push_str(&format!("| {} |\n", r.as_ref().join(" | ")));
    }
    md
}

//! The lab's outputs: the verdict table, `report.md`, `report.json`, `report.html`, plots and
//! snapshots, all through the one [`Report`] shape of `leaklab-report`.

use crate::driver::{RunOptions, VariantRun};
use crate::judge::{series, VariantResult};
use leaklab_report::page::{Page, Section, Summary};
use leaklab_report::plot::Chart;
use leaklab_report::{human_bytes, Attachment, Cell, Outcome, Report, Table, Tone};
use leaklab_vocab::{Device, Probe, Scale};
use serde::{Deserialize, Serialize};

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

const HEADER: [&str; 9] = [
    "variant",
    "cause",
    "verdict",
    "bytes/request",
    "growing stage",
    "OOM (reference)",
    "RSS",
    "expected",
    "result",
];

/// How the verdicts are decided, and what the reference scenario is: said under the table.
const HOW: &str = "The verdict comes from the primary probe (the exact CPU allocator; CUDA allocated bytes on CUDA). OOM (reference): requests and hours until an 80 GB card that starts at 12 GB is full at this slope, one request every 32 s.";

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

    fn rows(&self) -> Vec<Vec<Cell>> {
        self.variants
            .iter()
            .map(|v| {
                let j = v.primary().map(|p| &p.judgement);
                let verdict = match j {
                    Some(j) => Cell::new(v.verdict_label()).tone(j.verdict),
                    None => Cell::new(v.verdict_label()).tone(Tone::Bad),
                };
                let slope = j.map_or("-".into(), |j| {
                    format!(
                        "{} ± {}",
                        human_bytes(j.slope.bytes_per_request),
                        human_bytes(j.slope.half_width())
                    )
                });
                let stage = v.stages.first().map_or("-", |s| s.stage.name());
                let oom = v.projection.map_or("never".into(), |p| {
                    format!("{} req, {:.1} h", p.requests, p.hours())
                });
                let rss = v
                    .probes()
                    .into_iter()
                    .find(|o| o.probe == Probe::Rss)
                    .map_or(Cell::new("-"), |o| {
                        Cell::new(o.judgement.verdict.to_string()).tone(o.judgement.verdict)
                    });
                let pass = if v.passed {
                    Cell::new("pass").tone(Tone::Good)
                } else {
                    Cell::new("FAIL").tone(Tone::Bad)
                };
                vec![
                    Cell::new(v.variant.to_string()),
                    Cell::new(v.cause_label()),
                    verdict,
                    Cell::new(slope),
                    Cell::new(stage),
                    Cell::new(oom),
                    rss,
                    Cell::new(v.expectation()),
                    pass,
                ]
            })
            .collect()
    }

    fn verdicts(&self) -> Table {
        Table::new(HEADER).numeric(&[3, 5]).rows(self.rows())
    }

    /// The verdict table for the terminal.
    pub fn table(&self) -> String {
        self.verdicts().text()
    }

    /// The table's stable parts (no byte counts), for regression snapshots.
    pub fn stable_table(&self) -> String {
        self.rows()
            .iter()
            .map(|r| {
                format!(
                    "{:<12} {:<10} {:<8} expected {:<16} {}",
                    r[0].text, r[1].text, r[2].text, r[7].text, r[8].text
                )
            })
            .collect::<Vec<_>>()
            .join("\n")
    }

    fn context(&self) -> String {
        format!(
            "Scale `{}`, device `{}`, {} warm-up + {} measured requests per variant at concurrency {}, {} cores; {:.1} s in all.",
            self.scale.name(),
            self.device,
            self.warmup,
            self.requests,
            self.concurrency,
            self.cores,
            self.seconds
        )
    }

    pub fn markdown(&self) -> String {
        let mut md = String::new();
        md.push_str("# leaklab report\n\n");
        md.push_str(&format!(
            "{} Overall: **{}**.\n\n",
            self.context(),
            if self.passed {
                "every verdict as expected"
            } else {
                "UNEXPECTED VERDICTS"
            }
        ));
        md.push_str(HOW);
        md.push_str("\n\n");
        md.push_str(&self.verdicts().markdown());
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
                md.push_str(&format!(
                    "- memory born in stage `{}` does not come back: {} at {}/request\n",
                    s.stage,
                    s.verdict,
                    human_bytes(s.bytes_per_request)
                ));
            }
            md.push_str(&format!(
                "- {} requests in {:.1} s, {} errors\n\n![{}]({}.svg)\n",
                v.requests, v.seconds, v.errors, v.variant, v.variant
            ));
            if !v.holders.is_empty() {
                md.push_str(&format!("\nWho holds the memory the run kept: allocated during the run and never freed (from `{}.pickle`; `leaklab snapshot explain --since 0` for more):\n\n", v.variant));
                md.push_str(&leaklab_snapshot::render::holder_table(&v.holders, 5));
            }
        }
        md
    }

    /// The verdict box: pass or fail, what was unexpected, and the steepest leak's figures.
    fn summary(&self) -> Summary {
        let unexpected: Vec<String> = self
            .variants
            .iter()
            .filter(|v| !v.passed)
            .map(|v| match v.failure() {
                Some(_) => format!("{} (its run failed)", v.variant),
                None => format!(
                    "{} ({}, rss {}, expected {})",
                    v.variant,
                    v.verdict_label(),
                    v.rss().map_or("-".into(), |r| r.to_string()),
                    v.expectation()
                ),
            })
            .collect();
        let headline = if unexpected.is_empty() {
            "Every verdict as expected: each leaky variant leaks (the conv cause's on RSS alone), each fixed one does not."
                .to_string()
        } else {
            format!("Unexpected: {}.", unexpected.join("; "))
        };
        let leaks = self
            .variants
            .iter()
            .filter(|v| {
                v.primary()
                    .is_some_and(|p| p.judgement.verdict == leaklab_detect::Verdict::Leak)
            })
            .count();
        let mut figures = vec![(
            "variants".to_string(),
            format!("{} run, {leaks} leaking", self.variants.len()),
        )];
        let steepest = self
            .variants
            .iter()
            .filter_map(|v| v.primary().map(|p| (v, p)))
            .filter(|(_, p)| p.judgement.verdict == leaklab_detect::Verdict::Leak)
            .max_by(|a, b| {
                a.1.judgement
                    .slope
                    .bytes_per_request
                    .total_cmp(&b.1.judgement.slope.bytes_per_request)
            });
        if let Some((v, p)) = steepest {
            figures.push((
                "steepest leak".into(),
                format!(
                    "{}: {} per request",
                    v.variant,
                    human_bytes(p.judgement.slope.bytes_per_request)
                ),
            ));
            if let Some(oom) = v.projection {
                figures.push((
                    "its OOM (reference)".into(),
                    format!("{} requests, {:.1} h", oom.requests, oom.hours()),
                ));
            }
        }
        figures.push((
            "requests".into(),
            format!("{} warm-up + {} per variant", self.warmup, self.requests),
        ));
        figures.push((
            "time".into(),
            format!("{:.1} s on {} cores", self.seconds, self.cores),
        ));
        let outcome = Outcome::pass_if(self.passed);
        Summary {
            tone: outcome.into(),
            answer: outcome.answer().into(),
            headline,
            figures,
            text: vec![HOW.into()],
        }
    }
}

/// Bytes above the first sample, in MB, for plotting.
fn growth(series: &[(u64, i64)]) -> Vec<(f64, f64)> {
    let base = series.first().map_or(0, |s| s.1);
    series
        .iter()
        .map(|(x, y)| (*x as f64, (y - base) as f64 / 1e6))
        .collect()
}

/// A run of the lab: the report, and what the variants brought back (their samples for the
/// charts, their snapshots for the pickles beside the report).
#[derive(Debug, Clone, Serialize)]
#[serde(transparent)]
pub struct LabRun {
    pub report: LabReport,
    #[serde(skip)]
    pub runs: Vec<VariantRun>,
}

impl LabRun {
    /// One chart per variant (its primary probe and RSS), then the overlay of every variant.
    fn charts(&self) -> Vec<Chart> {
        let probe = self.report.device.primary_probe();
        let mut overlay = Vec::new();
        let mut charts = Vec::new();
        for run in &self.runs {
            let name = run.variant.name();
            let primary = series(&run.samples, probe).unwrap_or_default();
            let rss = series(&run.samples, Probe::Rss).unwrap_or_default();
            let lines = vec![
                (probe.to_string(), growth(&primary)),
                (Probe::Rss.to_string(), growth(&rss)),
            ];
            // A run that failed is drawn and titled as failed, whatever samples it brought back.
            let verdict = self
                .result(run)
                .map_or("FAILED".into(), VariantResult::verdict_label);
            charts.push(Chart::new(
                name,
                format!("{name}: {verdict} (growth since the first request, MB)"),
                lines,
                self.report.warmup,
            ));
            overlay.push((name.to_string(), growth(&primary)));
        }
        charts.push(Chart::new(
            "overlay",
            "All variants: primary probe, growth since the first request (MB)",
            overlay,
            self.report.warmup,
        ));
        charts
    }

    fn result(&self, run: &VariantRun) -> Option<&VariantResult> {
        self.report
            .variants
            .iter()
            .find(|v| v.variant == run.variant)
    }

    fn variant_section(
        &self,
        v: &VariantResult,
        chart: Option<&Chart>,
    ) -> leaklab_report::Result<Section> {
        let expected = if v.passed {
            "as expected"
        } else {
            "UNEXPECTED"
        };
        let mut section =
            Section::new(format!("{}: {} ({expected})", v.variant, v.verdict_label()));
        if let Some(f) = v.failure() {
            return Ok(section.text(format!("Run failed: {f}")));
        }
        let probes = v.probes().into_iter().map(|p| {
            let j = &p.judgement;
            vec![
                Cell::code(p.probe.to_string()),
                Cell::new(j.verdict.to_string()).tone(j.verdict),
                Cell::new(human_bytes(j.slope.bytes_per_request)),
                Cell::new(format!(
                    "{} .. {}",
                    human_bytes(j.slope.low),
                    human_bytes(j.slope.high)
                )),
                Cell::new(format!(
                    "{} → {}",
                    human_bytes(j.first.1 as f64),
                    human_bytes(j.last.1 as f64)
                )),
            ]
        });
        section = section.table(
            Table::new(["probe", "verdict", "bytes/request", "bound", "first → last"])
                .numeric(&[2, 3, 4])
                .rows(probes)
                .caption(format!("The first probe decides; the others are measured beside it. Slopes are Theil–Sen over the {} requests after the warm-up, the bound Sen's interval widened by the probe's noise.", v.requests.saturating_sub(self.report.warmup))),
        );
        if !v.stages.is_empty() {
            let stages = v.stages.iter().map(|s| {
                vec![
                    Cell::code(s.stage.name()),
                    Cell::new(s.verdict.to_string()).tone(s.verdict),
                    Cell::new(human_bytes(s.bytes_per_request)),
                ]
            });
            section = section.table(Table::new(["stage the memory was born in", "verdict", "bytes/request"]).numeric(&[2]).rows(stages).caption("Memory that does not come back, by the pipeline stage that allocated it (the exact allocator's per-stage counts)."));
        }
        if let Some(chart) = chart {
            section = section.chart(
                chart.svg()?,
                format!("{} and RSS after every request, MB above the first sample; the grey line marks the end of the {}-request warm-up, which is not judged. {} requests in {:.1} s, {} errors.", self.report.device.primary_probe(), self.report.warmup, v.requests, v.seconds, v.errors),
            );
        }
        if !v.holders.is_empty() {
            section = section
                .text(format!("Who holds the memory the run kept: allocated during the run and never freed, from the service's snapshot ({}.pickle beside this page; `leaklab snapshot explain --since 0` for more).", v.variant))
                .table(leaklab_snapshot::report::holders_table(&v.holders, 5));
        }
        Ok(section)
    }
}

impl Report for LabRun {
    fn outcome(&self) -> Outcome {
        Outcome::pass_if(self.report.passed)
    }

    fn text(&self) -> String {
        self.report.table()
    }

    fn markdown(&self) -> String {
        self.report.markdown()
    }

    fn page(&self) -> Option<Page> {
        let r = &self.report;
        let charts = self.charts();
        let chart = |name: &str| charts.iter().find(|c| c.name == name);
        let mut page = Page::new(
            "leaklab run-lab",
            format!(
                "{} variants of the lab's service, scale {}, device {}",
                r.variants.len(),
                r.scale.name(),
                r.device
            ),
            r.summary(),
        )
        .section(Section::new("Verdicts").table(r.verdicts().caption(r.context())));
        if let Some(Ok(overlay)) = chart("overlay").map(Chart::svg) {
            page = page.section(Section::new("All variants").chart(
                overlay,
                format!("The primary probe ({}) of every variant after every request, MB above its first sample; the grey line marks the end of the warm-up. Leaks climb in a straight line, fixed variants stay flat or stop at their bound.", r.device.primary_probe()),
            ));
        }
        for v in &r.variants {
            // A chart that cannot be drawn leaves its section without it rather than the page unwritten.
            let section = self
                .variant_section(v, chart(v.variant.name()))
                .or_else(|_| self.variant_section(v, None))
                .ok()?;
            page = page.section(section);
        }
        Some(page.section(Section::new("How this was measured").facts(vec![
            ("scale".into(), r.scale.name().into()),
            ("device".into(), r.device.to_string()),
            ("requests".into(), format!("{} warm-up (not judged) + {} measured, per variant, at concurrency {}", r.warmup, r.requests, r.concurrency)),
            ("probes".into(), "the service samples itself after every request: its exact CPU allocator (and CUDA allocator), RSS, malloc heap".into()),
            ("detector".into(), "Theil–Sen slope with Sen's interval and the probe's noise; flat, plateau (grew, then stopped) or leak (keeps growing)".into()),
            ("machine".into(), format!("{} cores; {:.1} s in all", r.cores, r.seconds)),
        ])))
    }

    fn attachments(&self) -> leaklab_report::Result<Vec<Attachment>> {
        let mut files = Vec::new();
        for chart in self.charts() {
            files.extend(chart.files()?);
        }
        for run in &self.runs {
            if let Some(snapshot) = &run.snapshot {
                files.push(Attachment::new(
                    format!("{}.pickle", run.variant.name()),
                    snapshot.clone(),
                ));
            }
        }
        Ok(files)
    }
}

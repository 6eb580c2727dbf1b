//! The scan's answer for people (a table with its evidence), for reports (markdown and plots,
//! drawn by the same code as run-lab's) and for programs (`--json`).

use crate::verdict::Ops;
use crate::{Outcome, ScanReport, SeriesResult};
use anyhow::Result;
use leaklab_detect::{human_bytes, human_duration as duration};
use leaklab_runner::files::write_atomic;
use leaklab_runner::plot;
use leaklab_runner::report::{aligned_table, markdown_table};
use std::path::Path;

fn row(s: &SeriesResult) -> [String; 7] {
    let Some(j) = &s.judgement else {
        return [s.series.clone(), "-".into(), s.why_not_judged.clone().unwrap_or_default(), "-".into(), "-".into(), "-".into(), "cannot judge".into()];
    };
    let oom = match (s.capacity_bytes, s.seconds_to_oom) {
        (None, _) => "no capacity known".into(),
        (Some(c), None) => format!("never (of {})", human_bytes(c as f64)),
        (Some(c), Some(t)) => format!("{} (of {})", duration(t), human_bytes(c as f64)),
    };
    let result = s.ops.map_or("-", Ops::label);
    [
        s.series.clone(),
        j.verdict.to_string(),
        format!("{} ± {}", human_bytes(j.slope.bytes_per_request), human_bytes(j.slope.half_width())),
        human_bytes(j.noise_bytes),
        human_bytes(j.floor_now as f64),
        oom,
        result.into(),
    ]
}

const HEADER: [&str; 7] = ["series", "verdict", "bytes/request", "noise", "floor now", "time to OOM", "result"];

impl ScanReport {
    pub fn table(&self) -> String {
        let rows: Vec<[String; 7]> = self.series.iter().map(row).collect();
        let mut out = vec![aligned_table(&HEADER, &rows)];
        if let Some(c) = &self.census {
            out.push(String::new());
            out.push(format!("Who holds it (the agent's tensor census after the warm-up and at the end):\n{}", c.text(5, "request")));
        }
        if let Some(d) = &self.who_holds {
            out.push(String::new());
            out.push(format!("Who holds it (snapshots after the warm-up and at the end):
{}", leaklab_snapshot::render::difference_text(d, 5, false).trim_end()));
        }
        out.push(String::new());
        out.push(self.summary());
        out.join("\n")
    }

    /// The verdict with its evidence, as hyperfine states what it measured.
    pub fn summary(&self) -> String {
        let outcome = match self.outcome {
            Outcome::Pass => "PASS: nothing runs out within the budget",
            Outcome::Fail => "FAIL: memory runs out within the budget",
            Outcome::CannotJudge => "CANNOT JUDGE: too little to go on",
        };
        let mut text = format!(
            "{outcome} ({} at {:.3} requests/s).\n{}\nEvidence: {} requests ({} warm-up, not judged) in {:.1} s, {} errors; each series judged on its floor (the minimum of each window of samples), with its noise estimated from the series itself.",
            duration(self.budget.seconds),
            self.budget.steps_per_second,
            self.diagnosis,
            self.requests_sent,
            self.warmup,
            self.seconds,
            self.errors
        );
        for note in &self.notes {
            text.push_str(&format!("\nNote: {note}"));
        }
        text
    }

    pub fn markdown(&self) -> String {
        let mut md = format!("# leaklab scan of {}\n\n**{}**\n\n", self.url, self.summary().replace('\n', "\n\n"));
        md.push_str(&markdown_table(&HEADER, &self.series.iter().map(row).collect::<Vec<_>>()));
        md.push('\n');
        if let Some(c) = &self.census {
            md.push_str(&c.markdown(20, "request"));
        }
        if let Some(d) = &self.who_holds {
            md.push_str(&leaklab_snapshot::render::difference_markdown("Who holds the memory the judged requests left live", d, 10));
            md.push('\n');
        }
        for s in self.series.iter().filter(|s| s.judgement.is_some()) {
            md.push_str(&format!("![{}]({}.svg)\n", s.series, file_name(&s.series)));
        }
        md
    }

    /// report.md, report.json and a plot per series (the samples and their floor), atomically.
    pub fn write(&self, dir: &Path) -> Result<()> {
        write_atomic(&dir.join("report.json"), &serde_json::to_vec_pretty(self)?)?;
        write_atomic(&dir.join("report.md"), self.markdown().as_bytes())?;
        for s in &self.series {
            let Some(j) = &s.judgement else { continue };
            let base = s.samples.first().map_or(0, |p| p.1);
            let mb = |points: &[(u64, i64)]| points.iter().map(|&(x, y)| (x as f64, (y - base) as f64 / 1e6)).collect::<Vec<_>>();
            let lines = vec![(s.series.clone(), mb(&s.samples)), ("floor".to_string(), mb(&j.floor))];
            plot::write_chart(dir, &file_name(&s.series), &format!("{}: {} (growth since the first request, MB)", s.series, j.verdict), &lines, self.warmup)?;
        }
        Ok(())
    }
}

/// A file name for a series (metric selectors carry braces and quotes).
fn file_name(series: &str) -> String {
    series.chars().map(|c| if c.is_ascii_alphanumeric() || c == '_' || c == '-' { c } else { '_' }).collect()
}

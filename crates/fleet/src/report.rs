//! The fleet's answer: a table of the most urgent groups with their evidence, a summary line
//! per verdict, report.md and report.json.

use crate::history::Basis;
use crate::{FleetReport, PodResult};
use anyhow::Result;
use leaklab_detect::budget::{Ops, Outcome};
use leaklab_detect::{human_bytes, human_duration};
use leaklab_runner::files::write_atomic;
use leaklab_runner::report::{aligned_table, markdown_table};
use std::path::Path;

const HEADER: [&str; 8] = ["group", "verdict", "growth/hour", "per request", "now", "judged on", "time to OOM", "result"];

fn clock(unix: f64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(unix.max(0.0));
    humantime::format_rfc3339_seconds(t).to_string()
}

fn row(p: &PodResult) -> [String; 8] {
    let kills = match p.oom_kills() {
        0 => String::new(),
        1 => ", 1 OOM kill".into(),
        n => format!(", {n} OOM kills"),
    };
    let Some(j) = &p.judged else {
        let why = if p.gone { format!("gone since {}", clock(p.last_seen)) } else { p.why_not_judged.clone().unwrap_or_default() };
        return [p.name.clone(), "-".into(), "-".into(), "-".into(), "-".into(), why, "-".into(), "cannot judge".into()];
    };
    let basis = match j.basis {
        Basis::CurrentLife { since } if p.resets.is_empty() => format!("whole range from {}", clock(since)),
        Basis::CurrentLife { since } => format!("current life from {}{kills}", clock(since)),
        Basis::PreviousLife { from, to } => format!("life before the restart, {} to {}{kills}", clock(from), clock(to)),
        Basis::Troughs { teeth, period_s } => format!("troughs of a sawtooth ({teeth} drops, teeth up to {})", human_duration(period_s)),
    };
    let per_hour = p.bytes_per_hour.unwrap_or(0.0);
    let oom = match (p.gone, p.capacity_bytes, p.seconds_to_oom) {
        (true, ..) => format!("gone since {}", clock(p.last_seen)),
        (_, None, _) => "no capacity known".into(),
        (_, Some(c), None) => format!("never (of {})", human_bytes(c as f64)),
        (_, Some(c), Some(t)) => format!("{} (of {})", human_duration(t), human_bytes(c as f64)),
    };
    let result = p.ops.map_or("-", Ops::label);
    [
        p.name.clone(),
        j.judgement.verdict.to_string(),
        format!("{} ± {}", human_bytes(per_hour), human_bytes(j.judgement.slope.half_width() * 3600.0)),
        p.bytes_per_request.map_or("-".into(), human_bytes),
        human_bytes(j.level_now),
        basis,
        oom,
        result.into(),
    ]
}

impl FleetReport {
    /// The `top` most urgent groups and the summary.
    pub fn table(&self, top: usize) -> String {
        let rows: Vec<[String; 8]> = self.pods.iter().take(top).map(row).collect();
        let mut out = vec![aligned_table(&HEADER, &rows)];
        if self.pods.len() > top {
            out.push(format!("... and {} more (--top N, or --json for all)", self.pods.len() - top));
        }
        out.push(String::new());
        out.push(self.summary());
        out.join("\n")
    }

    pub fn summary(&self) -> String {
        let count = |f: &dyn Fn(&PodResult) -> bool| self.pods.iter().filter(|p| f(p)).count();
        let verdict = |v: leaklab_detect::Verdict| move |p: &PodResult| !p.gone && p.verdict() == Some(v);
        let outcome = match self.outcome {
            Outcome::Fail => format!("FAIL: {} group(s) run out within {}", count(&|p| p.ops.is_some_and(Ops::fails)), human_duration(self.budget.seconds)),
            Outcome::Pass => format!("PASS: nothing runs out within {}", human_duration(self.budget.seconds)),
            Outcome::CannotJudge => "CANNOT JUDGE: no series had enough samples".into(),
        };
        let mut text = format!(
            "{outcome}.\n{} groups from `{}` over {} at {} s steps: {} leak, {} plateau, {} flat, {} not judged, {} gone (replaced or deleted, not alarmed). Queried in {:.2} s, judged in {:.2} s.",
            self.pods.len(),
            self.query,
            human_duration(self.end - self.start),
            self.step,
            count(&verdict(leaklab_detect::Verdict::Leak)),
            count(&verdict(leaklab_detect::Verdict::Plateau)),
            count(&verdict(leaklab_detect::Verdict::Flat)),
            count(&|p: &PodResult| !p.gone && p.judged.is_none()),
            count(&|p: &PodResult| p.gone),
            self.query_seconds,
            self.judge_seconds,
        );
        for note in &self.notes {
            text.push_str(&format!("\nNote: {note}"));
        }
        text
    }

    pub fn markdown(&self) -> String {
        let mut md = format!("# leaklab fleet scan of {}\n\n**{}**\n\n", self.prometheus, self.summary().replace('\n', "\n\n"));
        md.push_str(&markdown_table(&HEADER, &self.pods.iter().map(row).collect::<Vec<_>>()));
        md
    }

    /// report.md and report.json, atomically.
    pub fn write(&self, dir: &Path) -> Result<()> {
        write_atomic(&dir.join("report.json"), &serde_json::to_vec_pretty(self)?)?;
        write_atomic(&dir.join("report.md"), self.markdown().as_bytes())?;
        Ok(())
    }
}

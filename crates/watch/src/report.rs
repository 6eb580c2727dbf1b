//! The watch's answer for people (a table per run, the idle finding, the verdict with its
//! evidence), for reports (markdown, report.html and its charts, drawn by `leaklab-report` as
//! the scan's are) and for programs (`--json`, every look included).

use crate::WatchReport;
use leaklab_detect::budget::Ops;
use leaklab_judge::watch::looks::{IdleFinding, RunResult};
use leaklab_report::page::{Page, Section, Summary};
use leaklab_report::plot::Chart;
use leaklab_report::{human_bytes, human_duration, Attachment, Outcome, Report, Table};
use leaklab_scan::report::{file_name, series_row, time_to_oom, SERIES_HEADER};
use leaklab_scan::SeriesResult;

/// How each series is judged, said under its table.
fn method() -> String {
    format!("No request is sent: the watch reads the service's own request count and its memory every interval. Each run (the looks between two restarts) is judged apart, per request, on the looks where the count moved, after the run's warm-up; each series on its floor (the minimum of each window of looks) with its noise estimated from the series itself (at least {} for host memory). Looks with no request between them are judged apart, per hour of idle time; a growth proven there is a growth by the clock, whose rate times the time since the run's first look is taken out of the per-request series before it is judged. Times to OOM are at the budget's rate, or without one at the run's own rate.", human_bytes(leaklab_judge::thresholds::HOST_NOISE_FLOOR))
}

/// One sentence per series on what memory did while no request arrived.
fn idle_line(f: &IdleFinding) -> String {
    match (&f.judgement, f.bytes_per_hour) {
        (Some(j), Some((rate, low, high))) => {
            let verdict = if f.fails() { "FAIL" } else { "ok" };
            let oom = f.seconds_to_oom.map_or(String::new(), |t| {
                format!("; idle from now on, it runs out in {}", human_duration(t))
            });
            format!(
                "{verdict}: while idle ({} over {} looks), {} is {} at {}/hour (bound {} .. {}){oom}",
                human_duration(f.idle_seconds),
                j.samples,
                f.series,
                j.verdict,
                human_bytes(rate),
                human_bytes(low),
                human_bytes(high)
            )
        }
        _ => format!(
            "while idle ({}), {} not judged: {}",
            human_duration(f.idle_seconds),
            f.series,
            f.why_not_judged.as_deref().unwrap_or("no idle looks")
        ),
    }
}

/// A run's heading: its index, why it began, its PIDs, requests and looks.
fn heading(run: &RunResult) -> String {
    let pids = run
        .pids
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    let who = if pids.is_empty() {
        String::new()
    } else {
        format!(", PID {pids}")
    };
    let why = run
        .restart
        .as_ref()
        .map_or(String::new(), |r| format!(" after a restart ({r})"));
    format!(
        "Run {}{why}{who}: {} requests at {:.2}/s from {:.0} s to {:.0} s, {} looks",
        run.index,
        run.requests,
        run.requests_per_second,
        run.from_seconds,
        run.to_seconds,
        run.looks
    )
}

/// A run's series, one row each.
fn table(run: &RunResult) -> Table {
    Table::new(SERIES_HEADER)
        .numeric(&[2, 3, 4, 5])
        .rows(run.series.iter().map(series_row))
}

impl WatchReport {
    fn outcome_words(&self) -> (&'static str, &'static str) {
        match (self.outcome, self.budget) {
            (Outcome::Pass, Some(_)) => ("PASS", "nothing runs out within the budget"),
            (Outcome::Pass, None) => ("PASS", "no leak proven"),
            (Outcome::Fail, Some(_)) => ("FAIL", "memory runs out within the budget"),
            (Outcome::Fail, None) => ("FAIL", "a leak is proven"),
            (Outcome::CannotJudge, _) => ("NO VERDICT YET", "too few requests seen to judge"),
        }
    }

    fn budget_words(&self) -> String {
        match self.budget {
            Some(b) => format!("{} at {:.3} requests/s", human_duration(b.seconds), b.steps_per_second),
            None => "no budget: any growth proven is a leak; times to OOM at each run's own request rate, --rate sets a budget".into(),
        }
    }

    fn requests_seen(&self) -> u64 {
        self.runs.iter().map(|r| r.requests).sum()
    }

    fn evidence(&self) -> String {
        let restarts = self.runs.len().saturating_sub(1);
        format!(
            "{} looks every {} over {} ({} missed), {} requests seen and none sent, {} run(s) ({restarts} restart(s)), a warm-up of {} requests per run; the watch ended: {}.",
            self.points.len(),
            interval(self.interval_seconds),
            human_duration(self.seconds),
            self.missed_looks,
            self.requests_seen(),
            self.runs.len(),
            self.warmup,
            self.stop
        )
    }

    pub fn summary(&self) -> String {
        let (answer, words) = self.outcome_words();
        let mut text = format!(
            "{answer}: {words} ({}).\n{}\nEvidence: {}",
            self.budget_words(),
            self.diagnosis,
            self.evidence()
        );
        for note in &self.notes {
            text.push_str(&format!("\nNote: {note}"));
        }
        text
    }

    /// The report's first lines: verdict, axis, owner, mechanism and fix.
    pub fn first_lines(&self) -> Vec<String> {
        let (answer, words) = self.outcome_words();
        let deciding = self.deciding_series().map_or(String::new(), |(s, j)| {
            format!(
                " ({} {}, {} a request)",
                s.series,
                j.verdict,
                human_bytes(j.slope.bytes_per_request)
            )
        });
        leaklab_judge::watch::diagnosis::first_lines(
            &format!("{answer}: {words}{deciding}"),
            self.axis.as_ref(),
            self.owner.as_ref(),
        )
    }

    /// The deciding run's deciding series: the first that fails, else the first judged.
    fn deciding_series(&self) -> Option<(&SeriesResult, &leaklab_detect::NoisyJudgement)> {
        let run = self.deciding.map(|i| &self.runs[i])?;
        let s = run
            .series
            .iter()
            .find(|s| s.ops.is_some_and(Ops::fails))
            .or_else(|| run.series.iter().find(|s| s.judgement.is_some()))?;
        Some((s, s.judgement.as_ref()?))
    }

    /// The census at the end alone (where the two could not be compared), largest holders.
    fn census_lines(&self, top: usize) -> Vec<String> {
        self.census_at_end.as_ref().map_or(Vec::new(), |c| {
            c.holders
                .iter()
                .take(top)
                .map(|h| {
                    format!(
                        "{} ({}): {} tensors, {}",
                        h.holder,
                        h.kind,
                        h.tensors,
                        human_bytes(h.held_bytes() as f64)
                    )
                })
                .collect()
        })
    }

    pub fn table(&self) -> String {
        let mut out = self.first_lines();
        out.push(String::new());
        for run in &self.runs {
            out.push(heading(run));
            out.push(table(run).text());
            for f in &run.idle {
                out.push(format!("  {}", idle_line(f)));
            }
            out.push(String::new());
        }
        if let Some(c) = &self.census {
            out.push(format!("Who holds it (the agent's tensor census at the watch's start and at its end, {} requests apart):\n{}\n", c.steps, c.text(5, "request")));
        }
        let census = self.census_lines(5);
        if !census.is_empty() {
            out.push(
                "Who holds it (the agent's tensor census at the end, largest holders):".into(),
            );
            out.extend(census.into_iter().map(|l| format!("  {l}")));
            out.push(String::new());
        }
        if let Some(f) = &self.snapshot_file {
            out.push(format!("The CUDA snapshot at the end is {f} beside the report: `leaklab snapshot explain {f}` names the lines.\n"));
        }
        out.push(self.summary());
        out.join("\n")
    }

    /// A chart per judged series of each run: its looks per request and their floor.
    fn charts(&self) -> Vec<(&RunResult, &SeriesResult, Chart)> {
        let mut charts = Vec::new();
        for run in &self.runs {
            for s in &run.series {
                let Some(j) = &s.judgement else { continue };
                let base = s.samples.first().map_or(0, |p| p.1);
                let mb = |points: &[(u64, i64)]| {
                    points
                        .iter()
                        .map(|&(x, y)| (x as f64, (y - base) as f64 / 1e6))
                        .collect::<Vec<_>>()
                };
                let chart = Chart::new(
                    format!("run{}-{}", run.index, file_name(&s.series)),
                    format!(
                        "run {}, {}: {} (growth over the requests seen, MB)",
                        run.index, s.series, j.verdict
                    ),
                    vec![
                        (s.series.clone(), mb(&s.samples)),
                        ("floor".into(), mb(&j.floor)),
                    ],
                    0,
                );
                charts.push((run, s, chart));
            }
        }
        charts
    }

    fn page_summary(&self) -> Summary {
        let (answer, words) = self.outcome_words();
        let mut figures = Vec::new();
        if let Some(run) = self.deciding.map(|i| &self.runs[i]) {
            figures.push(("deciding run".to_string(), heading(run)));
            let s = run
                .series
                .iter()
                .find(|s| s.ops.is_some_and(Ops::fails))
                .or_else(|| run.series.iter().find(|s| s.judgement.is_some()));
            if let Some((s, j)) = s.and_then(|s| s.judgement.as_ref().map(|j| (s, j))) {
                figures.push(("series".into(), s.series.clone()));
                figures.push(("verdict".into(), j.verdict.to_string()));
                figures.push((
                    "bytes/request".into(),
                    format!(
                        "{} ± {}",
                        human_bytes(j.slope.bytes_per_request),
                        human_bytes(j.slope.half_width())
                    ),
                ));
                figures.push(("time to OOM".into(), time_to_oom(s)));
            }
        }
        figures.push(("budget".into(), self.budget_words()));
        figures.push((
            "requests seen (none sent)".into(),
            self.requests_seen().to_string(),
        ));
        Summary {
            tone: self.outcome.into(),
            answer: answer.into(),
            headline: format!("{}{}.", &words[..1].to_uppercase(), &words[1..]),
            figures,
            text: self
                .first_lines()
                .into_iter()
                .chain(std::iter::once(self.diagnosis.clone()))
                .collect(),
        }
    }

    pub fn markdown(&self) -> String {
        let mut md = format!(
            "# leaklab watch of {}\n\n```text\n{}\n```\n\n**{}**\n\n",
            self.target,
            self.first_lines().join("\n"),
            self.summary().replace('\n', "\n\n")
        );
        for run in &self.runs {
            md.push_str(&format!("## {}\n\n", heading(run)));
            md.push_str(&table(run).markdown());
            md.push('\n');
            for f in &run.idle {
                md.push_str(&format!("- {}\n", idle_line(f)));
            }
            md.push('\n');
        }
        if let Some(c) = &self.census {
            md.push_str(&c.markdown(10, "request"));
        }
        let census = self.census_lines(10);
        if !census.is_empty() {
            md.push_str("## Who holds it (the agent's tensor census at the end)\n\n");
            for l in census {
                md.push_str(&format!("- `{l}`\n"));
            }
            md.push('\n');
        }
        for (_, _, chart) in self.charts() {
            md.push_str(&format!("![{}]({}.svg)\n", chart.title, chart.name));
        }
        md
    }
}

impl Report for WatchReport {
    fn outcome(&self) -> Outcome {
        self.outcome
    }

    fn text(&self) -> String {
        self.table()
    }

    fn markdown(&self) -> String {
        WatchReport::markdown(self)
    }

    fn page(&self) -> Option<Page> {
        let mut page = Page::new("leaklab watch", &self.target, self.page_summary());
        let charts = self.charts();
        for run in &self.runs {
            let idle: Vec<String> = run.idle.iter().map(idle_line).collect();
            let mut section = Section::new(heading(run))
                .table(table(run).caption(method()))
                .notes(&idle);
            for (_, s, chart) in charts.iter().filter(|(r, _, _)| r.index == run.index) {
                let (Some(j), Ok(svg)) = (&s.judgement, chart.svg()) else {
                    continue;
                };
                section = section.chart(
                    svg,
                    format!(
                        "{}: the looks of run {} on an even grid of request counts (the first look at each count, the grid's points on the lines between them), and its floor, in MB above the first judged point. {}, {} per request, noise {}.",
                        s.series,
                        run.index,
                        j.verdict,
                        j.slope.with_bounds(),
                        human_bytes(j.noise_bytes)
                    ),
                );
            }
            page = page.section(section);
        }
        if let Some(c) = &self.census {
            let mut section = Section::new(format!(
                "Who holds it: the agent's tensor census at the watch's start and at its end, {} requests apart",
                c.steps
            ));
            section = if c.grown.is_empty() {
                section.text(c.text(20, "request"))
            } else {
                section.table(c.table(20, "request").caption(c.totals("request")))
            };
            page = page.section(section.notes(&c.notes));
        }
        let census = self.census_lines(20);
        if !census.is_empty() {
            let mut section = Section::new("Who holds it: the agent's tensor census at the end");
            for l in census {
                section = section.text(l);
            }
            page = page.section(section);
        }
        Some(
            page.section(
                Section::new("How this was measured")
                    .facts(vec![
                        ("target".into(), self.target.clone()),
                        ("looks".into(), self.evidence()),
                        ("budget".into(), self.budget_words()),
                        ("method".into(), method()),
                    ])
                    .notes(&self.notes),
            ),
        )
    }

    fn attachments(&self) -> leaklab_report::Result<Vec<Attachment>> {
        let mut files = Vec::new();
        for (_, _, chart) in self.charts() {
            files.extend(chart.files()?);
        }
        if let (Some(name), Some(bytes)) = (&self.snapshot_file, &self.snapshot) {
            files.push(Attachment::new(name.clone(), bytes.clone()));
        }
        if let Some(recording) = &self.recording {
            // What the judgement read, to re-judge with `leaklab judge --evidence`.
            let json = serde_json::to_vec(recording).expect("a recording serialises");
            files.push(leaklab_scan::recording::attachment(json));
        }
        Ok(files)
    }

    fn problem(&self) -> Option<String> {
        (self.outcome == Outcome::CannotJudge).then(|| {
            "no verdict yet: too few requests at distinct counts were seen; watch longer"
                .to_string()
        })
    }
}

/// The interval between looks: milliseconds below a second (`200 ms`), else as durations are said.
pub(crate) fn interval(seconds: f64) -> String {
    if seconds < 1.0 {
        format!("{:.0} ms", seconds * 1000.0)
    } else {
        human_duration(seconds)
    }
}

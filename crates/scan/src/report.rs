//! The scan's answer for people (a table with its evidence), for reports (markdown, the page
//! and its charts, drawn by `leaklab-report` as every command's are) and for programs (`--json`).

use crate::{Outcome, ScanReport, SeriesResult};
use leaklab_report::page::{Page, Section, Summary};
use leaklab_report::plot::Chart;
use leaklab_report::{
    human_bytes, human_duration as duration, Attachment, Cell, Report, Table, Tone,
};

/// A judged series as a row under [`SERIES_HEADER`] (the scan's table, and the watch's per run).
pub fn series_row(s: &SeriesResult) -> Vec<Cell> {
    let Some(j) = &s.judgement else {
        return vec![
            Cell::code(&s.series),
            "-".into(),
            s.why_not_judged.clone().unwrap_or_default().into(),
            "-".into(),
            "-".into(),
            "-".into(),
            Cell::new("cannot judge").tone(Tone::Warn),
        ];
    };
    // No ops verdict on a judged series: the target failed, and nothing of it can pass.
    let result = s
        .ops
        .map_or(Cell::new("cannot judge").tone(Tone::Warn), |o| {
            Cell::new(o.label()).tone(o)
        });
    vec![
        Cell::code(&s.series),
        Cell::new(j.verdict.to_string()).tone(j.verdict),
        format!(
            "{} ± {}",
            human_bytes(j.slope.bytes_per_request),
            human_bytes(j.slope.half_width())
        )
        .into(),
        human_bytes(j.noise_bytes).into(),
        human_bytes(j.floor_now as f64).into(),
        time_to_oom(s).into(),
        result,
    ]
}

/// A series' time to OOM in words, with the capacity it runs out of.
pub fn time_to_oom(s: &SeriesResult) -> String {
    match (s.capacity_bytes, s.seconds_to_oom) {
        (None, _) => "no capacity known".into(),
        (Some(c), None) => format!("never (of {})", human_bytes(c as f64)),
        (Some(c), Some(t)) => format!("{} (of {})", duration(t), human_bytes(c as f64)),
    }
}

/// The columns of [`series_row`].
pub const SERIES_HEADER: [&str; 7] = [
    "series",
    "verdict",
    "bytes/request",
    "noise",
    "floor now",
    "time to OOM",
    "result",
];

/// How each series is judged, said under its table and its charts.
fn method() -> String {
    format!("Each series is judged on its floor (the minimum of each window of samples), with its noise estimated from the series itself (at least {} for host memory, which moves in allocator steps); the time to OOM is at the budget's request rate (without a budget, at the rate the scan drove), from the floor now to the series' capacity.", human_bytes(leaklab_judge::thresholds::HOST_NOISE_FLOOR))
}

impl ScanReport {
    fn series_table(&self) -> Table {
        Table::new(SERIES_HEADER)
            .numeric(&[2, 3, 4, 5])
            .rows(self.series.iter().map(series_row))
    }

    /// The diagnosis's first lines: verdict, axis, owner, mechanism and fix (none where no
    /// series could be judged).
    pub fn first_lines(&self) -> Vec<String> {
        let (answer, words) = self.outcome_words();
        let garbage = self.garbage();
        let deciding = self.deciding().and_then(|s| {
            let j = s.judgement.as_ref()?;
            let verdict = if garbage {
                "grew".to_string() // and full collections gave it back: not a leak
            } else {
                j.verdict.to_string()
            };
            Some(format!(
                " ({} {verdict}, {} a request)",
                s.series,
                human_bytes(j.slope.bytes_per_request)
            ))
        });
        let verdict = format!("{answer}: {words}{}", deciding.unwrap_or_default());
        match (&self.explained.axis, &self.explained.owner) {
            (Some(axis), Some(owner)) => crate::diagnosis::first_lines(&verdict, axis, owner),
            _ if self.series.iter().any(|s| s.judgement.is_some()) => vec![
                format!("verdict:   {verdict}"),
                "axis:      none: no series grows".to_string(),
            ],
            _ => vec![format!("verdict:   {verdict}")],
        }
    }

    /// The evidence behind the axis: each process of the tree, the native trace's stacks.
    fn axis_evidence(&self) -> Vec<String> {
        let mut out = Vec::new();
        if let Some(axis) = &self.explained.axis {
            if axis.processes.len() > 1 {
                out.push("The process tree, process by process (anonymous memory over the judged requests):".to_string());
                out.extend(axis.processes.iter().map(|p| format!("  {}", p.line())));
            }
        }
        if let Some(native) = &self.explained.native {
            out.push(format!(
                "The agent's native trace ({} requests, {:.1} s): {} left live; top stacks:",
                native.requests,
                native.seconds,
                human_bytes(native.live_bytes as f64)
            ));
            out.extend(native.stack_lines(5).into_iter().map(|l| format!("  {l}")));
        }
        if let Some(t) = &self.explained.python_trace {
            out.push(format!(
                "The agent's Python trace ({} requests, {:.1} s{}): {} kept; top lines:",
                t.requests,
                t.seconds,
                if t.between_requests {
                    ", snapshots between requests"
                } else {
                    ""
                },
                human_bytes(t.kept_bytes as f64)
            ));
            out.extend(t.top.iter().take(5).map(|l| {
                format!(
                    "  {} at {}:{} ({} blocks)",
                    human_bytes(l.bytes as f64),
                    l.file,
                    l.line,
                    l.blocks
                )
            }));
        }
        out
    }

    pub fn table(&self) -> String {
        let mut out = self.first_lines();
        out.push(String::new());
        out.push(self.series_table().text());
        let evidence = self.axis_evidence();
        if !evidence.is_empty() {
            out.push(String::new());
            out.extend(evidence);
        }
        if let Some(c) = &self.census {
            out.push(String::new());
            out.push(format!("Who holds it (the agent's tensor census, taken twice {} requests apart after the judged ones):\n{}", c.steps, c.text(5, "request")));
        }
        if let Some(d) = &self.who_holds {
            out.push(String::new());
            out.push(format!(
                "Who holds it (snapshots after the warm-up and at the end):\n{}",
                leaklab_snapshot::render::difference_text(d, 5, false).trim_end()
            ));
        }
        out.push(String::new());
        out.push(self.summary());
        out.join("\n")
    }

    /// "PASS: nothing runs out within the budget" and its words apart.
    fn outcome_words(&self) -> (&'static str, &'static str) {
        if self.outcome == Outcome::Pass && self.garbage() {
            return ("PASS", "the growth is the collector's garbage");
        }
        match (self.outcome, self.budget) {
            (Outcome::Pass, Some(_)) => ("PASS", "nothing runs out within the budget"),
            (Outcome::Pass, None) => ("PASS", "no leak proven"),
            (Outcome::Fail, Some(_)) => ("FAIL", "memory runs out within the budget"),
            (Outcome::Fail, None) => ("FAIL", "a leak is proven"),
            (Outcome::CannotJudge, _) if self.failing_from.is_some() => (
                "CANNOT JUDGE",
                "the target failed, and no leak was proven before it did",
            ),
            (Outcome::CannotJudge, _) => ("CANNOT JUDGE", "too little to go on"),
        }
    }

    /// The axis says full collections gave the growth back.
    fn garbage(&self) -> bool {
        self.explained
            .axis
            .as_ref()
            .is_some_and(|a| a.axis == crate::diagnosis::Axis::Garbage)
    }

    /// The budget, or the rule without one (the pytest plugin's words) and the rate of the times.
    fn budget_words(&self) -> String {
        match self.budget {
            Some(b) => format!("{} at {:.3} requests/s", duration(b.seconds), b.steps_per_second),
            None => format!("no budget: any growth proven is a leak; times to OOM at the {:.1} requests/s measured, --rate sets a budget", self.requests_per_second_measured),
        }
    }

    /// The requests and which were judged: the warm-up, and those between the looks inside, are not.
    fn requests_words(&self) -> String {
        let mut parts = vec![format!("{} warm-up", self.warmup)];
        if let Some(r) = self
            .explained
            .axis
            .as_ref()
            .and_then(|a| a.repeats.as_ref())
        {
            parts.push(format!(
                "{} repeats of inputs already seen (the axis)",
                r.requests
            ));
        }
        if self.looked_requests > 0 {
            parts.push(format!("{} between the looks inside", self.looked_requests));
        }
        if let Some(n) = &self.explained.native {
            parts.push(format!(
                "those of the native trace ({} counted)",
                n.requests
            ));
        }
        if let Some(t) = &self.explained.python_trace {
            parts.push(format!(
                "those of the Python trace ({} counted)",
                t.requests
            ));
        }
        let last = parts.pop().unwrap_or_default();
        let listed = if parts.is_empty() {
            last
        } else {
            format!("{} and {last}", parts.join(", "))
        };
        format!("{} requests ({listed}, not judged)", self.requests_sent)
    }

    fn evidence(&self) -> String {
        format!("{} in {:.1} s, {} errors; each series judged on its floor (the minimum of each window of samples), with its noise estimated from the series itself ({} at least for host memory, which moves in allocator steps).", self.requests_words(), self.seconds, self.errors, human_bytes(crate::HOST_NOISE_FLOOR))
    }

    /// The verdict with its evidence, as hyperfine states what it measured.
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

    pub fn markdown(&self) -> String {
        let mut md = format!("# leaklab scan of {}\n\n", self.url);
        for line in self.first_lines() {
            md.push_str(&format!("- {line}\n"));
        }
        md.push_str(&format!(
            "\n**{}**\n\n",
            self.summary().replace('\n', "\n\n")
        ));
        for line in self.axis_evidence() {
            md.push_str(&format!("{line}\n"));
        }
        md.push('\n');
        md.push_str(&self.series_table().markdown());
        md.push('\n');
        if let Some(c) = &self.census {
            md.push_str(&c.markdown(20, "request"));
        }
        if let Some(d) = &self.who_holds {
            md.push_str(&leaklab_snapshot::render::difference_markdown(
                "Who holds the memory the judged requests left live",
                d,
                10,
            ));
            md.push('\n');
        }
        for s in self.series.iter().filter(|s| s.judgement.is_some()) {
            md.push_str(&format!("![{}]({}.svg)\n", s.series, file_name(&s.series)));
        }
        md
    }

    /// A chart per judged series: its samples and their floor.
    fn charts(&self) -> Vec<(&SeriesResult, Chart)> {
        self.series
            .iter()
            .filter_map(|s| {
                let j = s.judgement.as_ref()?;
                let base = s.samples.first().map_or(0, |p| p.1);
                let mb = |points: &[(u64, i64)]| {
                    points
                        .iter()
                        .map(|&(x, y)| (x as f64, (y - base) as f64 / 1e6))
                        .collect::<Vec<_>>()
                };
                let lines = vec![
                    (s.series.clone(), mb(&s.samples)),
                    ("floor".to_string(), mb(&j.floor)),
                ];
                Some((
                    s,
                    Chart::new(
                        file_name(&s.series),
                        format!(
                            "{}: {} (growth since the first request, MB)",
                            s.series, j.verdict
                        ),
                        lines,
                        self.warmup,
                    ),
                ))
            })
            .collect()
    }

    fn page_summary(&self) -> Summary {
        let (answer, words) = self.outcome_words();
        let mut figures = Vec::new();
        if let Some(s) = self.deciding() {
            figures.push(("deciding series".to_string(), s.series.clone()));
            if let Some(j) = &s.judgement {
                figures.push(("verdict".into(), j.verdict.to_string()));
                figures.push((
                    "bytes/request".into(),
                    format!(
                        "{} ± {}",
                        human_bytes(j.slope.bytes_per_request),
                        human_bytes(j.slope.half_width())
                    ),
                ));
            }
            let oom = match (s.capacity_bytes, s.seconds_to_oom) {
                (None, _) => "no capacity known".into(),
                (Some(c), None) => format!("never (of {})", human_bytes(c as f64)),
                (Some(c), Some(t)) => format!("{} (of {})", duration(t), human_bytes(c as f64)),
            };
            figures.push(("time to OOM".into(), oom));
        }
        figures.push(("budget".into(), self.budget_words()));
        figures.push((
            "requests".into(),
            format!("{}, {} errors", self.requests_words(), self.errors),
        ));
        let headline = match (self.outcome, self.deciding(), self.budget) {
            (Outcome::Fail, Some(s), Some(_)) => match (s.seconds_to_oom, s.capacity_bytes) {
                (Some(t), Some(c)) => format!("{} runs out in {} (of {}), within the budget of {}.", s.series, duration(t), human_bytes(c as f64), self.budget_words()),
                _ => format!("{} runs out within the budget of {}.", s.series, self.budget_words()),
            },
            (Outcome::Fail, Some(s), None) => match (s.seconds_to_oom, s.capacity_bytes) {
                (Some(t), Some(c)) => format!("{} leaks: it runs out in {} (of {}) at the {:.1} requests/s measured; no budget, so any growth proven is a leak.", s.series, duration(t), human_bytes(c as f64), self.requests_per_second_measured),
                _ => format!("{} leaks; no budget, so any growth proven is a leak.", s.series),
            },
            (Outcome::Pass, _, Some(_)) => format!("Nothing runs out within the budget of {}.", self.budget_words()),
            _ => format!("{}{}.", &words[..1].to_uppercase(), &words[1..]),
        };
        Summary {
            tone: self.outcome.into(),
            answer: answer.into(),
            headline,
            figures,
            text: self
                .first_lines()
                .into_iter()
                .chain(std::iter::once(self.diagnosis.clone()))
                .collect(),
        }
    }
}

impl Report for ScanReport {
    fn outcome(&self) -> Outcome {
        self.outcome
    }

    fn text(&self) -> String {
        self.table()
    }

    fn markdown(&self) -> String {
        ScanReport::markdown(self)
    }

    fn page(&self) -> Option<Page> {
        let mut page = Page::new("leaklab scan", &self.url, self.page_summary()).section(
            Section::new("Series")
                .table(self.series_table().caption(method()))
                .notes(&self.notes),
        );
        if let Some(c) = &self.census {
            let census = c.table(20, "request").caption("The holders whose tensors grew between the agent's two censuses, taken after the judged requests and again a quarter as many requests later: tensors gained, bytes gained (their storages plus what their autograd graphs save), per request between the censuses, and autograd graph nodes gained.");
            let mut section = Section::new(format!(
                "Who holds it: the agent's tensor census, {} requests apart",
                c.steps
            ))
            .table(census)
            .text(c.totals("request"));
            section = section.notes(&c.notes);
            page = page.section(section);
        }
        if let Some(d) = &self.who_holds {
            page = page.section(leaklab_snapshot::report::difference_section(
                "Who holds it: the memory the judged requests left live, by allocating line",
                d,
                10,
            ));
        }
        let charts = self.charts();
        if !charts.is_empty() {
            let mut section = Section::new("Memory over the requests");
            for (s, chart) in &charts {
                let (Some(j), Ok(svg)) = (&s.judgement, chart.svg()) else {
                    continue;
                };
                let caption = format!(
                    "{}: what the scan read after every answer, and its floor, in MB above the first sample; the grey line marks the end of the {}-request warm-up (not judged). {}, {} per request, noise {}.",
                    s.series,
                    self.warmup,
                    j.verdict,
                    j.slope.with_bounds(),
                    human_bytes(j.noise_bytes)
                );
                section = section.chart(svg, caption);
            }
            page = page.section(section);
        }
        let mut errors: Vec<String> = self
            .error_kinds
            .iter()
            .map(|(kind, n)| format!("{n} × {kind}"))
            .collect();
        if errors.is_empty() {
            errors.push("none".into());
        }
        Some(
            page.section(Section::new("How this was measured").facts(vec![
                ("target".into(), self.url.clone()),
                ("requests".into(), self.requests_words()),
                (
                    "time".into(),
                    format!(
                        "{:.1} s, {:.1} requests/s",
                        self.seconds, self.requests_per_second_measured
                    ),
                ),
                ("errors".into(), errors.join(", ")),
                (
                    "budget".into(),
                    match self.budget {
                        Some(_) => {
                            format!("fail when memory runs out within {}", self.budget_words())
                        }
                        None => self.budget_words(),
                    },
                ),
                ("method".into(), method()),
            ])),
        )
    }

    fn attachments(&self) -> leaklab_report::Result<Vec<Attachment>> {
        let mut files = Vec::new();
        for (_, chart) in self.charts() {
            files.extend(chart.files()?);
        }
        if let Some(recording) = &self.recording {
            // What the judgement read, to re-judge with `leaklab judge --evidence`.
            let json = serde_json::to_vec(recording).expect("a recording serialises");
            files.push(crate::recording::attachment(json));
        }
        Ok(files)
    }
}

pub use crate::recording::EVIDENCE_FILE;

/// A file name for a series (metric selectors carry braces and quotes).
pub fn file_name(series: &str) -> String {
    series
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

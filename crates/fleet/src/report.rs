//! The fleet's answer: a table of the most urgent groups with their evidence, a summary line
//! per verdict, report.md, report.json and report.html.

use crate::history::Basis;
use crate::{FleetReport, Outcome, PodResult};
use leaklab_detect::budget::Ops;
use leaklab_report::page::{Page, Section, Summary};
use leaklab_report::{human_bytes, human_duration, Cell, Report, Table, Tone};

const HEADER: [&str; 8] = [
    "group",
    "verdict",
    "growth/hour",
    "per request",
    "now",
    "judged on",
    "time to OOM",
    "result",
];

fn clock(unix: f64) -> String {
    let t = std::time::UNIX_EPOCH + std::time::Duration::from_secs_f64(unix.max(0.0));
    humantime::format_rfc3339_seconds(t).to_string()
}

fn row(p: &PodResult) -> Vec<Cell> {
    let kills = match p.oom_kills() {
        0 => String::new(),
        1 => ", 1 OOM kill".into(),
        n => format!(", {n} OOM kills"),
    };
    let Some(j) = &p.judged else {
        let why = if p.gone {
            format!("gone since {}", clock(p.last_seen))
        } else {
            p.why_not_judged.clone().unwrap_or_default()
        };
        let result = if p.gone {
            Cell::new("cannot judge")
        } else {
            Cell::new("cannot judge").tone(Tone::Warn)
        };
        return vec![
            Cell::code(&p.name),
            "-".into(),
            "-".into(),
            "-".into(),
            "-".into(),
            why.into(),
            "-".into(),
            result,
        ];
    };
    let basis = match j.basis {
        Basis::CurrentLife { since } if p.resets.is_empty() => {
            format!("whole range from {}", clock(since))
        }
        Basis::CurrentLife { since } => format!("current life from {}{kills}", clock(since)),
        Basis::PreviousLife { from, to } => format!(
            "life before the restart, {} to {}{kills}",
            clock(from),
            clock(to)
        ),
        Basis::Troughs { teeth, period_s } => format!(
            "troughs of a sawtooth ({teeth} drops, teeth up to {})",
            human_duration(period_s)
        ),
    };
    let per_hour = p.bytes_per_hour.unwrap_or(0.0);
    let oom = match (p.gone, p.capacity_bytes, p.seconds_to_oom) {
        (true, ..) => format!("gone since {}", clock(p.last_seen)),
        (_, None, _) => "no capacity known".into(),
        (_, Some(c), None) => format!("never (of {})", human_bytes(c as f64)),
        (_, Some(c), Some(t)) => format!("{} (of {})", human_duration(t), human_bytes(c as f64)),
    };
    let result = p
        .ops
        .map_or(Cell::new("-"), |o| Cell::new(o.label()).tone(o));
    vec![
        Cell::code(&p.name),
        Cell::new(j.judgement.verdict.to_string()).tone(j.judgement.verdict),
        format!(
            "{} ± {}",
            human_bytes(per_hour),
            human_bytes(j.judgement.slope.half_width() * 3600.0)
        )
        .into(),
        p.bytes_per_request.map_or("-".into(), human_bytes).into(),
        human_bytes(j.level_now).into(),
        basis.into(),
        oom.into(),
        result,
    ]
}

fn groups<'a>(pods: impl IntoIterator<Item = &'a PodResult>) -> Table {
    Table::new(HEADER)
        .numeric(&[2, 3, 4, 6])
        .rows(pods.into_iter().map(row))
}

impl FleetReport {
    /// The `top` most urgent groups and the summary.
    pub fn table(&self, top: usize) -> String {
        let mut out = vec![groups(self.pods.iter().take(top)).text()];
        if self.pods.len() > top {
            out.push(format!(
                "... and {} more (--top N, or --json for all)",
                self.pods.len() - top
            ));
        }
        out.push(String::new());
        out.push(self.summary());
        out.join("\n")
    }

    /// Which groups fail: those that run out within the budget, and (the rule without a budget)
    /// those that leak with no capacity known.
    fn failing_words(&self) -> String {
        let failing = |known: bool| {
            self.pods
                .iter()
                .filter(|p| p.ops.is_some_and(Ops::fails) && p.capacity_bytes.is_some() == known)
                .count()
        };
        let mut words = Vec::new();
        if failing(true) > 0 {
            words.push(format!(
                "{} group(s) run out within {}",
                failing(true),
                human_duration(self.budget.seconds)
            ));
        }
        if failing(false) > 0 {
            words.push(format!(
                "{} group(s) leak with no capacity known (no budget: any growth proven is a leak)",
                failing(false)
            ));
        }
        words.join("; ")
    }

    pub fn summary(&self) -> String {
        let count = |f: &dyn Fn(&PodResult) -> bool| self.pods.iter().filter(|p| f(p)).count();
        let verdict =
            |v: leaklab_detect::Verdict| move |p: &PodResult| !p.gone && p.verdict() == Some(v);
        let outcome = match self.outcome {
            Outcome::Fail => format!("FAIL: {}", self.failing_words()),
            Outcome::Pass => format!(
                "PASS: nothing runs out within {}",
                human_duration(self.budget.seconds)
            ),
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
        let mut md = format!(
            "# leaklab fleet scan of {}\n\n**{}**\n\n",
            self.prometheus,
            self.summary().replace('\n', "\n\n")
        );
        md.push_str(&groups(&self.pods).markdown());
        md
    }
}

impl Report for FleetReport {
    fn outcome(&self) -> Outcome {
        self.outcome
    }

    fn text(&self) -> String {
        self.table(self.top)
    }

    fn markdown(&self) -> String {
        FleetReport::markdown(self)
    }

    fn page(&self) -> Option<Page> {
        let count = |f: &dyn Fn(&PodResult) -> bool| self.pods.iter().filter(|p| f(p)).count();
        let verdict =
            |v: leaklab_detect::Verdict| move |p: &PodResult| !p.gone && p.verdict() == Some(v);
        let failing = count(&|p| p.ops.is_some_and(Ops::fails));
        let headline = match self.outcome {
            Outcome::Fail => format!(
                "{failing} of {} groups fail: {}.",
                self.pods.len(),
                self.failing_words()
            ),
            Outcome::Pass => format!(
                "No group runs out of memory within {}.",
                human_duration(self.budget.seconds)
            ),
            Outcome::CannotJudge => "No series had enough samples to judge.".into(),
        };
        let mut figures = vec![
            ("groups".to_string(), self.pods.len().to_string()),
            (
                "leak".into(),
                count(&verdict(leaklab_detect::Verdict::Leak)).to_string(),
            ),
            (
                "plateau".into(),
                count(&verdict(leaklab_detect::Verdict::Plateau)).to_string(),
            ),
            (
                "flat".into(),
                count(&verdict(leaklab_detect::Verdict::Flat)).to_string(),
            ),
            (
                "not judged".into(),
                count(&|p: &PodResult| !p.gone && p.judged.is_none()).to_string(),
            ),
            (
                "gone (not alarmed)".into(),
                count(&|p: &PodResult| p.gone).to_string(),
            ),
        ];
        if let Some(first) = self.pods.first().filter(|p| p.ops.is_some_and(Ops::fails)) {
            let when = first.seconds_to_oom.map_or("now".into(), human_duration);
            figures.insert(
                0,
                (
                    "most urgent".into(),
                    format!("{}: OOM in {when}", first.name),
                ),
            );
        }
        let summary = Summary {
            tone: self.outcome.into(),
            answer: self.outcome.answer().into(),
            headline,
            figures,
            text: Vec::new(),
        };
        let range = format!(
            "{} to {} ({}) at {} s steps",
            clock(self.start),
            clock(self.end),
            human_duration(self.end - self.start),
            self.step
        );
        Some(
            Page::new("leaklab scan --prometheus", &self.prometheus, summary)
                .section(
                    Section::new("Groups, most urgent first")
                        .table(groups(&self.pods).caption("Growth per hour with its bound (Theil–Sen on the stretch named under \"judged on\"); time to OOM from the level now to the group's capacity at that growth."))
                        .notes(&self.notes),
                )
                .section(Section::new("How this was measured").facts(vec![
                    ("server".into(), self.prometheus.clone()),
                    ("query".into(), self.query.clone()),
                    ("range".into(), range),
                    ("budget".into(), format!("fail when a group runs out within {}", human_duration(self.budget.seconds))),
                    ("method".into(), "each series split into lives at its resets (restarts, OOM kills told by the capacity); the current life judged after its warm-up, or the life before a restart, or a sawtooth on its troughs; each with the noisy-signal detector of `leaklab scan`".into()),
                    ("time".into(), format!("queried in {:.2} s, judged in {:.2} s", self.query_seconds, self.judge_seconds)),
                ])),
        )
    }
}

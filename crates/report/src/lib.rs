//! What every leaklab command writes, and how it ends.
//!
//! A command is its flags, one library call that returns a [`Report`], and [`finish`]: print
//! the table (or the JSON with `--json`), write the files (report.md, report.json, report.html
//! and the report's attachments, each atomically), and exit with the [`Outcome`]'s code (0 pass,
//! 1 a problem found, 2 could not judge; an error is 2 too, said on stderr).
//!
//! The parts: [`units`] (bytes and durations as every report writes them), [`table`] (one set
//! of rows for the terminal, markdown and the page), [`files`] (atomic writes), [`page`] (the
//! self-contained report.html), [`plot`] (charts, SVG and PNG) and [`progress`] (the bars on
//! stderr). Without features the crate is units and tables only: what the detector takes.
//!
//! No libtorch, and nothing of what is measured: reports bring their own words.

pub mod table;
pub mod units;

#[cfg(feature = "output")]
pub mod files;
#[cfg(feature = "output")]
pub mod page;
#[cfg(feature = "plot")]
pub mod plot;
#[cfg(feature = "output")]
pub mod progress;

pub use table::{Cell, Table, Tone};
pub use units::{human_bytes, human_duration, signed_bytes};

use serde::{Deserialize, Serialize};

/// How a command ended: what its exit code says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// Nothing runs out within the budget; every verdict as expected; the question answered.
    Pass,
    /// A problem found: memory runs out within the budget, a leak, an unexpected verdict.
    Fail,
    /// Too little to judge (a dead target, too few samples, no signal, runs that failed).
    CannotJudge,
}

impl Outcome {
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Pass => 0,
            Outcome::Fail => 1,
            Outcome::CannotJudge => 2,
        }
    }

    /// The answer in capitals, as the reports say it.
    pub fn answer(self) -> &'static str {
        match self {
            Outcome::Pass => "PASS",
            Outcome::Fail => "FAIL",
            Outcome::CannotJudge => "CANNOT JUDGE",
        }
    }

    /// Pass when `ok`, else fail.
    pub fn pass_if(ok: bool) -> Outcome {
        if ok {
            Outcome::Pass
        } else {
            Outcome::Fail
        }
    }
}

impl From<Outcome> for Tone {
    fn from(outcome: Outcome) -> Tone {
        match outcome {
            Outcome::Pass => Tone::Good,
            Outcome::Fail => Tone::Bad,
            Outcome::CannotJudge => Tone::Warn,
        }
    }
}

#[cfg(feature = "output")]
pub use output::*;

#[cfg(feature = "output")]
mod output {
    use super::Outcome;
    use crate::files::write_atomic;
    use crate::human_bytes;
    use crate::page::Page;
    use serde::Serialize;
    use std::io::Write;
    use std::path::{Path, PathBuf};
    use std::process::ExitCode;

    #[derive(Debug, thiserror::Error)]
    pub enum Error {
        #[error("cannot write {path}: {source}")]
        Write {
            path: PathBuf,
            source: std::io::Error,
        },
        #[error("cannot draw the chart {chart}: {reason}")]
        Plot { chart: String, reason: String },
        #[error("cannot serialise the report: {0}")]
        Json(#[from] serde_json::Error),
    }

    pub type Result<T> = std::result::Result<T, Error>;

    /// A file written beside the report: a chart, a snapshot pickle.
    #[derive(Debug, Clone, PartialEq)]
    pub struct Attachment {
        /// Its name in the report's folder.
        pub name: String,
        pub bytes: Vec<u8>,
    }

    impl Attachment {
        pub fn new(name: impl Into<String>, bytes: impl Into<Vec<u8>>) -> Attachment {
            Attachment {
                name: name.into(),
                bytes: bytes.into(),
            }
        }
    }

    /// What a command answers with: one value that prints, serialises and writes itself, and
    /// says how the command ended.
    pub trait Report: Serialize {
        /// The answer, which [`finish`] turns into the exit code.
        fn outcome(&self) -> Outcome;

        /// What the terminal shows without `--json`: the table with its evidence.
        fn text(&self) -> String;

        /// report.md.
        fn markdown(&self) -> String;

        /// report.html, for the reports a person opens.
        fn page(&self) -> Option<Page> {
            None
        }

        /// Files beside the report (charts, snapshots).
        fn attachments(&self) -> Result<Vec<Attachment>> {
            Ok(Vec::new())
        }

        /// The `--json` document: every field, stable names.
        fn json(&self) -> Result<String> {
            Ok(serde_json::to_string_pretty(self)?)
        }

        /// What went wrong in a report that could not judge, said on stderr after it.
        fn problem(&self) -> Option<String> {
            None
        }
    }

    /// Where a report goes.
    #[derive(Debug, Clone, Default, PartialEq)]
    pub struct Output {
        /// `--json`: the JSON document alone on stdout.
        pub json: bool,
        /// The report's markdown file: the JSON and the page go beside it under the same stem
        /// (report.json, report.html), the attachments into its folder. None: no files.
        pub markdown: Option<PathBuf>,
    }

    impl Output {
        /// report.md, report.json and report.html in `dir`.
        pub fn folder(dir: &Path, json: bool) -> Output {
            Output {
                json,
                markdown: Some(dir.join("report.md")),
            }
        }

        /// Printed only.
        pub fn stdout(json: bool) -> Output {
            Output {
                json,
                markdown: None,
            }
        }
    }

    /// Writes every file of `report` next to `markdown`, each atomically; the file a person
    /// opens (the page, else the markdown).
    pub fn write<R: Report>(report: &R, markdown: &Path) -> Result<PathBuf> {
        write_atomic(&markdown.with_extension("json"), report.json()?.as_bytes())?;
        write_atomic(markdown, report.markdown().as_bytes())?;
        let dir = markdown.parent().unwrap_or(Path::new("."));
        for a in report.attachments()? {
            if a.bytes.len() >= 32 << 20 {
                // A second or more each: said, so that a terminal never goes quiet for long.
                eprintln!(
                    "leaklab: writing {} ({})",
                    a.name,
                    human_bytes(a.bytes.len() as f64)
                );
            }
            write_atomic(&dir.join(&a.name), &a.bytes)?;
        }
        match report.page() {
            Some(page) => {
                let html = markdown.with_extension("html");
                write_atomic(&html, page.render().as_bytes())?;
                Ok(html)
            }
            None => Ok(markdown.to_path_buf()),
        }
    }

    /// Prints the text, then writes the files and says where the report is; or writes the
    /// files, then prints the JSON. The text comes first because the files can take seconds
    /// (a report's attachments: memory snapshots, charts). Files that cannot be written are an
    /// error said after the report is printed, so what was measured is never lost.
    pub fn deliver<R: Report>(
        report: &R,
        output: &Output,
        stdout: &mut dyn Write,
    ) -> anyhow::Result<Outcome> {
        if !output.json {
            let text = report.text();
            write!(stdout, "{text}")?;
            if !text.ends_with('\n') {
                writeln!(stdout)?;
            }
            stdout.flush()?;
        }
        let written = output
            .markdown
            .as_deref()
            .map(|md| write(report, md).map_err(|e| (md, e)));
        if output.json {
            writeln!(stdout, "{}", report.json()?)?;
        } else if let Some(Ok(path)) = &written {
            writeln!(stdout, "\nreport: {}", path.display())?;
        }
        stdout.flush()?;
        if let Some(Err((md, e))) = written {
            let dir = md.parent().unwrap_or(Path::new("."));
            return Err(anyhow::Error::new(e)
                .context(format!("cannot write the report to {}", dir.display())));
        }
        Ok(report.outcome())
    }

    /// The end of every `leaklab` subcommand: the report delivered, its problem said, and the
    /// exit code (an error is said as `leaklab COMMAND: ...` on stderr, exit 2).
    pub fn finish<R: Report>(
        command: &str,
        result: anyhow::Result<R>,
        output: &Output,
    ) -> ExitCode {
        let delivered = result.and_then(|report| {
            let outcome = deliver(&report, output, &mut std::io::stdout().lock())?;
            if let Some(problem) = report.problem() {
                eprintln!("leaklab {command}: {problem}");
            }
            Ok(outcome)
        });
        match delivered {
            Ok(outcome) => ExitCode::from(outcome.exit_code()),
            Err(e) => {
                eprintln!("leaklab {command}: {e:#}");
                ExitCode::from(2)
            }
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::page::{Section, Summary};
        use crate::table::Table;

        #[derive(Serialize)]
        struct Toy {
            outcome: Outcome,
            rows: Vec<[String; 2]>,
            page: bool,
        }

        impl Report for Toy {
            fn outcome(&self) -> Outcome {
                self.outcome
            }
            fn text(&self) -> String {
                self.table().text()
            }
            fn markdown(&self) -> String {
                format!("# toy\n\n{}", self.table().markdown())
            }
            fn page(&self) -> Option<Page> {
                self.page.then(|| {
                    Page::new(
                        "leaklab toy",
                        "a toy",
                        Summary {
                            tone: self.outcome.into(),
                            answer: self.outcome.answer().into(),
                            ..Summary::default()
                        },
                    )
                    .section(Section::new("rows").table(self.table()))
                })
            }
            fn attachments(&self) -> Result<Vec<Attachment>> {
                Ok(vec![Attachment::new("toy.svg", "<svg/>")])
            }
        }

        impl Toy {
            fn table(&self) -> Table {
                Table::new(["series", "verdict"]).rows(self.rows.clone())
            }
        }

        fn toy(outcome: Outcome, page: bool) -> Toy {
            Toy {
                outcome,
                rows: vec![["anonymous".into(), "leak".into()]],
                page,
            }
        }

        fn deliver_to_string(report: &Toy, output: &Output) -> (anyhow::Result<Outcome>, String) {
            let mut out = Vec::new();
            let outcome = deliver(report, output, &mut out);
            (outcome, String::from_utf8(out).unwrap())
        }

        #[test]
        fn a_report_is_written_whole_then_printed_with_where_it_is() {
            let dir = tempfile::tempdir().unwrap();
            let (outcome, printed) = deliver_to_string(
                &toy(Outcome::Fail, true),
                &Output::folder(dir.path(), false),
            );
            assert_eq!(outcome.unwrap(), Outcome::Fail);
            assert_eq!(
                printed,
                format!(
                    "series     verdict\n---------  -------\nanonymous  leak\n\nreport: {}\n",
                    dir.path().join("report.html").display()
                )
            );
            let mut names: Vec<String> = std::fs::read_dir(dir.path())
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            names.sort();
            assert_eq!(
                names,
                ["report.html", "report.json", "report.md", "toy.svg"]
            );
            let json: serde_json::Value =
                serde_json::from_slice(&std::fs::read(dir.path().join("report.json")).unwrap())
                    .unwrap();
            assert_eq!(json["outcome"], "fail");
            assert!(std::fs::read_to_string(dir.path().join("report.html"))
                .unwrap()
                .contains("<td>anonymous</td>"));
        }

        #[test]
        fn json_is_the_document_alone_and_a_report_without_a_page_points_at_its_markdown() {
            let dir = tempfile::tempdir().unwrap();
            let (_, printed) = deliver_to_string(
                &toy(Outcome::Pass, false),
                &Output::folder(dir.path(), true),
            );
            let json: serde_json::Value = serde_json::from_str(&printed).unwrap();
            assert_eq!(json["outcome"], "pass");
            let (_, printed) = deliver_to_string(
                &toy(Outcome::Pass, false),
                &Output::folder(dir.path(), false),
            );
            assert!(
                printed.ends_with(&format!(
                    "report: {}\n",
                    dir.path().join("report.md").display()
                )),
                "{printed}"
            );
            assert!(!dir.path().join("report.html").exists());
            let (_, printed) =
                deliver_to_string(&toy(Outcome::Pass, false), &Output::stdout(false));
            assert!(!printed.contains("report:"), "{printed}");
        }

        #[test]
        fn a_folder_that_cannot_be_written_is_an_error_after_the_report_is_printed() {
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("taken"), b"").unwrap();
            let (outcome, printed) = deliver_to_string(
                &toy(Outcome::Pass, true),
                &Output::folder(&dir.path().join("taken"), false),
            );
            assert!(
                printed.contains("anonymous  leak"),
                "what was measured is printed: {printed}"
            );
            let err = format!("{:#}", outcome.unwrap_err());
            assert!(
                err.starts_with(&format!(
                    "cannot write the report to {}",
                    dir.path().join("taken").display()
                )),
                "{err}"
            );
        }

        #[test]
        fn each_outcome_has_its_exit_code_and_its_json_name() {
            for (outcome, code, name) in [
                (Outcome::Pass, 0, "\"pass\""),
                (Outcome::Fail, 1, "\"fail\""),
                (Outcome::CannotJudge, 2, "\"cannot_judge\""),
            ] {
                assert_eq!(outcome.exit_code(), code);
                assert_eq!(serde_json::to_string(&outcome).unwrap(), name);
            }
        }
    }
}

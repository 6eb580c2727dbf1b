//! Every kind of report.html opened in a real browser (Debian's chromium, headless), as the
//! person the page is for opens it: run-lab's and a snapshot explanation of its own pickle, as
//! the binary writes them, and a scan (with the agent's census and a snapshot difference) and a
//! fleet whose names carry markup, written by the same code from the libraries' own types. Each
//! page must load with nothing on the browser's console (its Content-Security-Policy turns any
//! fetch into a console error), show its verdict before any table, keep every table and chart
//! in the rendered DOM, render names as text, never as markup, and draw a first screen that is
//! not blank, with the verdict's colour on it.
//!
//! One test, so that the browser starts once a page (DOM, console and screenshot together) and
//! the pages render side by side. Without chromium (not installed and not installable) it fails
//! under CI and says SKIPPED loudly elsewhere; `cargo xtask test` installs it. The screenshots stay in the test's target folder: look at them.

mod common;

use common::{leaklab, skip_missing};
use leaklab_report::Output;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A name as a Prometheus label or a Python holder can carry it: a page that lets it through
/// as markup would run it.
const HOSTILE: &str = "<script>alert('x')</script><img src=x onerror=alert(1)>&";
const HOSTILE_AS_TEXT: &str =
    "&lt;script&gt;alert('x')&lt;/script&gt;&lt;img src=x onerror=alert(1)&gt;&amp;";

fn browser() -> Option<PathBuf> {
    ["/usr/bin/chromium", "chromium"]
        .into_iter()
        .map(PathBuf::from)
        .find(|c| {
            Command::new(c)
                .arg("--version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
}

/// One page to open, and what it must show.
struct Expect {
    name: &'static str,
    html: PathBuf,
    /// The verdict box's answer, its colour (the box's left rule) and the table headers it must
    /// keep.
    answer: String,
    rule: [u8; 3],
    headers: Vec<&'static str>,
    charts: usize,
    hostile: bool,
}

/// Chromium on `page` with `args`, its own throwaway profile and console logging: stdout, stderr.
fn chromium(exe: &Path, page: &Path, args: &[&str]) -> (String, String) {
    let profile = tempfile::tempdir().unwrap();
    let mut child = Command::new(exe)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut out, &mut s).unwrap();
        s
    });
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut err, &mut stderr).unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!(
                "chromium did not finish {} in 90 s: {stderr}",
                page.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    (reader.join().unwrap(), stderr)
}

/// Opens the page (its DOM on stdout, its first screen as a PNG, its console on stderr) and
/// checks all three; the screenshot's path.
fn check(exe: &Path, e: &Expect, shots: &Path) -> PathBuf {
    let source = std::fs::read_to_string(&e.html).unwrap();
    let shot = shots.join(format!("{}.png", e.name));
    let (dom, log) = chromium(
        exe,
        &e.html,
        &[
            "--dump-dom",
            &format!("--screenshot={}", shot.display()),
            "--window-size=1280,900",
            "--hide-scrollbars",
        ],
    );
    let console: Vec<&str> = log.lines().filter(|l| l.contains(":CONSOLE")).collect();
    assert!(
        console.is_empty(),
        "{}: the browser's console says {console:#?}",
        e.name
    );
    // The verdict, first.
    let verdict = format!(
        "aria-label=\"verdict\"><p class=\"answer\">{}</p>",
        e.answer
    );
    let at = dom
        .find(&verdict)
        .unwrap_or_else(|| panic!("{}: no verdict `{}` in the rendered page", e.name, e.answer));
    let first_table = dom
        .find("<table>")
        .unwrap_or_else(|| panic!("{}: no table rendered", e.name));
    assert!(
        at < first_table,
        "{}: the verdict comes after the evidence",
        e.name
    );
    // Every table and chart the page holds is rendered, with its headers.
    assert_eq!(
        dom.matches("<table>").count(),
        source.matches("<table>").count(),
        "{}: tables lost in the browser",
        e.name
    );
    assert_eq!(
        dom.matches("<figure><svg").count(),
        e.charts,
        "{}: charts",
        e.name
    );
    for header in &e.headers {
        assert!(
            dom.contains(&format!(">{header}</th>")),
            "{}: no `{header}` column in the rendered page",
            e.name
        );
    }
    // Names from outside are text: no element was made of them, and they read as written.
    assert!(
        !dom.contains("<script") && !dom.contains("<img"),
        "{}: markup from a name reached the DOM",
        e.name
    );
    if e.hostile {
        assert!(
            dom.contains(HOSTILE_AS_TEXT),
            "{}: the hostile name is not shown as text",
            e.name
        );
    }
    assert!(shot.exists(), "{}: no screenshot: {log}", e.name);
    let image = image::open(&shot).unwrap().to_rgb8();
    assert_eq!(image.dimensions(), (1280, 900));
    // Not blank: text and rules cover a few per cent of the first screen in many shades.
    let inked = image
        .pixels()
        .filter(|p| p.0.iter().any(|&c| c < 200))
        .count();
    let colours: HashSet<[u8; 3]> = image.pixels().map(|p| p.0.map(|c| c & 0xf0)).collect();
    assert!(
        inked as f64 > 0.02 * 1280.0 * 900.0,
        "{}: only {inked} dark pixels on the first screen",
        e.name
    );
    assert!(
        colours.len() > 20,
        "{}: {} colours on the first screen",
        e.name,
        colours.len()
    );
    // The verdict's colour is on the first screen (its box's rule, drawn solid).
    let ruled = image
        .enumerate_pixels()
        .filter(|(_, y, p)| *y < 600 && p.0.iter().zip(e.rule).all(|(&c, r)| c.abs_diff(r) <= 6))
        .count();
    assert!(
        ruled > 500,
        "{}: the verdict's colour {:?} is not on the first screen ({ruled} pixels)",
        e.name,
        e.rule
    );
    shot
}

const BAD: [u8; 3] = [0xdc, 0x26, 0x26];
const GOOD: [u8; 3] = [0x16, 0xa3, 0x4a];
const PLAIN: [u8; 3] = [0x64, 0x74, 0x8b];

#[test]
fn every_report_page_renders_in_a_real_browser_with_its_verdict_first_and_every_table() {
    let Some(exe) = browser() else {
        skip_missing("the report pages in a browser", "chromium (apt-get install --no-install-recommends chromium; `cargo xtask test` installs it as root)");
        return;
    };
    let started = Instant::now();
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("html");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    let mut pages = Vec::new();

    // run-lab, as the binary writes it: a leak and its fix, each with its snapshot.
    let lab = root.join("run-lab");
    let output = common::lab()
        .args([
            "run-lab",
            "--device",
            "cpu",
            "--variant",
            "refs-leaky",
            "--variant",
            "refs-fixed",
            "--warmup",
            "5",
            "--requests",
            "30",
            "--memory-history",
            "3000",
            "--out",
        ])
        .arg(&lab)
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "run-lab: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(String::from_utf8_lossy(&output.stdout)
        .contains(&format!("report: {}", lab.join("report.html").display())));
    pages.push(Expect {
        name: "run-lab",
        html: lab.join("report.html"),
        answer: "PASS".into(),
        rule: GOOD,
        headers: vec![
            "growing stage",
            "OOM (reference)",
            "probe",
            "first frame in your code",
        ],
        charts: 3,
        hostile: false,
    });

    // snapshot explain of the leak's own pickle, since the first event.
    let explain = root.join("explain");
    let output = leaklab()
        .args(["snapshot", "explain", "--since", "0", "--out"])
        .arg(&explain)
        .arg(lab.join("refs-leaky.pickle"))
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "explain: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let allocated = serde_json::from_slice::<serde_json::Value>(
        &std::fs::read(explain.join("report.json")).unwrap(),
    )
    .unwrap()["allocated_bytes"]
        .as_f64()
        .unwrap();
    pages.push(Expect {
        name: "explain",
        html: explain.join("report.html"),
        answer: format!("{} allocated", leaklab_report::human_bytes(allocated)),
        rule: PLAIN,
        headers: vec!["first frame in your code", "called from"],
        charts: 0,
        hostile: false,
    });

    // A scan and a fleet whose names carry markup, written as the binary writes them.
    let scan = root.join("scan");
    leaklab_report::write(
        &hostile::scan(),
        &Output::folder(&scan, false).markdown.unwrap(),
    )
    .unwrap();
    pages.push(Expect {
        name: "scan",
        html: scan.join("report.html"),
        answer: "FAIL".into(),
        rule: BAD,
        headers: vec!["holder", "graph nodes", "first frame in your code"],
        charts: 2,
        hostile: true,
    });
    let fleet = root.join("fleet");
    leaklab_report::write(
        &hostile::fleet(),
        &Output::folder(&fleet, false).markdown.unwrap(),
    )
    .unwrap();
    pages.push(Expect {
        name: "fleet",
        html: fleet.join("report.html"),
        answer: "FAIL".into(),
        rule: BAD,
        headers: vec!["group", "judged on", "time to OOM"],
        charts: 0,
        hostile: true,
    });
    let written = started.elapsed();

    let shots = root.join("screenshots");
    std::fs::create_dir_all(&shots).unwrap();
    let opened = Instant::now();
    let taken: Vec<PathBuf> = std::thread::scope(|s| {
        pages
            .iter()
            .map(|e| s.spawn(|| check(&exe, e, &shots)))
            .collect::<Vec<_>>()
            .into_iter()
            .map(|h| h.join().unwrap())
            .collect()
    });
    for (e, shot) in pages.iter().zip(&taken) {
        let size = std::fs::metadata(&e.html).unwrap().len();
        eprintln!(
            "{}: {} ({} kB), first screen {}",
            e.name,
            e.html.display(),
            size / 1000,
            shot.display()
        );
    }
    eprintln!(
        "pages written in {:.1} s, opened in chromium in {:.1} s",
        written.as_secs_f64(),
        opened.elapsed().as_secs_f64()
    );
}

/// Reports whose names come from outside and carry markup.
mod hostile {
    use super::HOSTILE;
    use leaklab_detect::{judge_noisy, NoisyConfig};
    use leaklab_scan::agent::{self, Census, GraphStats, Holder, Totals};
    use leaklab_scan::signals::Kind;
    use leaklab_scan::verdict::{Budget, Ops};
    use leaklab_scan::{Outcome, ScanReport, SeriesResult};
    use std::collections::BTreeMap;

    fn census(holders: &[(&str, u64, u64)]) -> Census {
        let holders: Vec<Holder> = holders
            .iter()
            .map(|&(name, tensors, bytes)| Holder {
                holder: name.into(),
                kind: "module global".into(),
                tensors,
                bytes,
                devices: BTreeMap::new(),
                dtypes: BTreeMap::new(),
                shapes: vec![vec![8, 512]],
                graph: GraphStats {
                    tensors: 0,
                    nodes: tensors * 3,
                    saved_tensors: 0,
                    saved_bytes: 0,
                },
                identity: None,
            })
            .collect();
        let totals = Totals {
            tensors: holders.iter().map(|h| h.tensors).sum(),
            bytes: holders.iter().map(|h| h.bytes).sum(),
            graph_nodes: 0,
            graph_saved_bytes: 0,
        };
        Census {
            schema: agent::SCHEMA.into(),
            pid: 1,
            taken_at: 0.0,
            seconds: 0.2,
            complete: true,
            stopped_early: None,
            objects: 100_000,
            totals,
            holders,
            holders_omitted: 0,
            heap: None,
        }
    }

    /// One series of a leak of 16 kB a request, over `base` bytes, with page-sized noise.
    fn series(name: String, base: i64, budget: Budget) -> SeriesResult {
        let samples: Vec<(u64, i64)> = (0..650u64)
            .map(|i| {
                (
                    i,
                    base + 16_384 * i as i64 + ((i * 7919) % 13) as i64 * 4096,
                )
            })
            .collect();
        let judgement = judge_noisy(&samples, &NoisyConfig::new(50)).unwrap();
        let (ops, seconds_to_oom) = leaklab_scan::verdict::ops(&judgement, Some(2 << 30), budget);
        assert_eq!(ops, Ops::Fail);
        SeriesResult {
            series: name,
            kind: Kind::Host,
            samples,
            judgement: Some(judgement),
            why_not_judged: None,
            capacity_bytes: Some(2 << 30),
            seconds_to_oom,
            ops: Some(ops),
        }
    }

    /// A leak of 16 kB a request in anonymous memory, the holder that keeps it named `<script>…`.
    pub fn scan() -> ScanReport {
        let budget = Budget {
            steps_per_second: 10.0,
            seconds: 7.0 * 86400.0,
        };
        let before = census(&[(HOSTILE, 50, 819_200), ("model.weights", 4, 4_000_000)]);
        let after = census(&[
            (HOSTILE, 650, 10_649_600),
            ("model.weights", 4, 4_000_000),
            ("app.state.cache", 32, 131_072),
        ]);
        let holder = leaklab_snapshot::Holder {
            site: format!("app.py:41 in predict {HOSTILE}"),
            bytes: 9_830_400,
            blocks: 600,
            stack: vec![
                "uvicorn/protocols.py:12 in run".into(),
                "app.py:80 in handler".into(),
            ],
        };
        let who_holds = leaklab_snapshot::Difference {
            bytes: 9_830_400,
            blocks: 600,
            bytes_per_request: Some(16_384.0),
            holders: vec![holder],
            before_bytes: 5_000_000,
            after_bytes: 14_830_400,
        };
        ScanReport {
            url: format!("http://127.0.0.1:8000/predict?q={HOSTILE}"),
            outcome: Outcome::Fail,
            diagnosis: "Host memory grows while the GPU does not (or is not watched).".into(),
            requests_sent: 800,
            warmup: 50,
            looked_requests: 150,
            errors: 2,
            error_kinds: [(format!("HTTP 500 {HOSTILE}"), 2)].into_iter().collect(),
            seconds: 11.6,
            requests_per_second_measured: 56.0,
            budget: Some(budget),
            series: vec![
                series("rss".into(), 520_000_000, budget),
                series(
                    format!("anonymous{{pod=\"{HOSTILE}\"}}"),
                    300_000_000,
                    budget,
                ),
            ],
            who_holds: Some(who_holds),
            census: Some(agent::diff(&before, &after, 150)),
            notes: vec![format!(
                "stopped reading metrics at {HOSTILE} after request 12"
            )],
            failing_from: None,
            explained: Default::default(),
            recording: None,
        }
    }

    /// The synthetic fleet, one group of each pattern, one of them named `<script>…`.
    pub fn fleet() -> leaklab_fleet::FleetReport {
        let end = 1_700_000_000.0;
        let span = 12.0 * 3600.0;
        let pods = leaklab_fleet::synthetic::fleet(1, end, span, 60.0);
        let mut series: Vec<_> = leaklab_fleet::synthetic::series(&pods)
            .into_iter()
            .filter(|s| {
                pods.iter()
                    .any(|p| p.name == s.labels["pod"] && p.pattern.is_gpu())
            })
            .collect();
        series[0].labels.insert("pod".into(), HOSTILE.into());
        let budget = leaklab_detect::budget::Budget {
            steps_per_second: 1.0,
            seconds: 3.0 * 86400.0,
        };
        let config = leaklab_fleet::JudgeConfig {
            range: leaklab_fleet::prometheus::Range {
                start: end - span,
                end,
                step: 60.0,
            },
            unit_bytes: 1024.0 * 1024.0,
            warmup_s: 1800.0,
            budget,
        };
        let pods = leaklab_fleet::judge_fleet(
            &series,
            &Default::default(),
            Some(80 << 30),
            &Default::default(),
            &config,
        );
        let outcome = if pods.iter().any(|p| p.ops.is_some_and(Ops::fails)) {
            Outcome::Fail
        } else {
            Outcome::Pass
        };
        leaklab_fleet::FleetReport {
            prometheus: format!("https://prometheus.internal:9090/{HOSTILE}"),
            query: "sum by (pod) (DCGM_FI_DEV_FB_USED)".into(),
            start: end - span,
            end,
            step: 60.0,
            outcome,
            budget,
            pods,
            query_seconds: 0.4,
            judge_seconds: 0.02,
            notes: Vec::new(),
            top: 20,
        }
    }
}

//! The README's "Scan your own service" example, run as written: its FastAPI app (extracted
//! from the README) under uvicorn, its request file made by its own one-liner, and its
//! `leaklab scan` command with its flags. The example must show what it teaches: the planted
//! leak fails the budget the README states, at about the figure the README prints. Then the
//! same service behind TLS (uvicorn's own, with a certificate made here): `https://` with the
//! right CA, and a clear refusal with the wrong one.

mod common;

use common::{leaklab, python};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn readme() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../../README.md")).unwrap()
}

/// The section's fenced blocks of `lang`, in order.
fn blocks<'a>(section: &'a str, lang: &str) -> Vec<&'a str> {
    let fence = format!("```{lang}\n");
    section.split(fence.as_str()).skip(1).map(|b| b.split("```").next().unwrap()).collect()
}

struct Example {
    app: String,
    /// The shell lines, backslash continuations joined.
    commands: Vec<String>,
    /// The bytes per request the README's output shows for `anonymous`.
    shown_bytes_per_request: f64,
}

fn example() -> Example {
    let text = readme();
    let section = text.split("## Scan your own service").nth(1).expect("the README has the section").split("\n## ").next().unwrap();
    let app = blocks(section, "python")[0].to_string();
    let commands = blocks(section, "sh")[0].replace("\\\n", " ").lines().map(str::to_string).collect();
    let output = blocks(section, "text")[0];
    let row = output.lines().find(|l| l.starts_with("anonymous")).expect("the output shows the anonymous series");
    let cells: Vec<&str> = row.split_whitespace().collect();
    let unit = match cells[3] {
        "kB" => 1e3,
        "MB" => 1e6,
        other => panic!("unit {other}"),
    };
    Example { app, commands, shown_bytes_per_request: cells[2].parse::<f64>().unwrap() * unit }
}

/// uvicorn serving the README's app on a free loopback port, with TLS when given a key pair.
struct Uvicorn {
    child: Child,
    port: u16,
}

impl Uvicorn {
    fn start(dir: &Path, tls: Option<(&Path, &Path)>) -> Uvicorn {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut c = Command::new(python());
        c.current_dir(dir).args(["-m", "uvicorn", "app:app", "--host", "127.0.0.1", "--port", &port.to_string(), "--log-level", "warning"]);
        if let Some((cert, key)) = tls {
            c.arg("--ssl-certfile").arg(cert).arg("--ssl-keyfile").arg(key);
        }
        let child = c.stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "uvicorn did not listen within 60 s");
            std::thread::sleep(Duration::from_millis(100));
        }
        Uvicorn { child, port }
    }
}

impl Drop for Uvicorn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The README's `leaklab scan` line as arguments, with the example's own PID and address
/// replaced by the test's, and `extra` flags after them.
fn scan_args(example: &Example, server: &Uvicorn, scheme: &str, extra: &[&str]) -> Vec<String> {
    let line = example.commands.iter().find(|l| l.trim_start().starts_with("leaklab scan")).expect("the example runs leaklab scan");
    let words = shlex::split(line).expect("the command is valid shell");
    assert_eq!(&words[..2], ["leaklab", "scan"]);
    let pid = server.child.id().to_string();
    let mut args: Vec<String> = words[1..].iter().map(|w| w.replace("$!", &pid).replace("http://127.0.0.1:8000", &format!("{scheme}://127.0.0.1:{}", server.port))).collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

fn run(dir: &Path, args: &[String]) -> (i32, serde_json::Value, String) {
    let out = leaklab().current_dir(dir).args(args).output().unwrap();
    let report = serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
    (out.status.code().unwrap_or(-1), report, String::from_utf8_lossy(&out.stderr).into_owned())
}

fn anonymous(report: &serde_json::Value) -> &serde_json::Value {
    report["series"].as_array().unwrap().iter().find(|s| s["series"] == "anonymous").unwrap_or_else(|| panic!("no anonymous series: {report}"))
}

fn prepare() -> (tempfile::TempDir, Example) {
    let dir = tempfile::tempdir().unwrap();
    let example = example();
    std::fs::write(dir.path().join("app.py"), &example.app).unwrap();
    // The README's own one-liner writes the request body.
    let maker = example.commands.iter().find(|l| l.contains("> request.json")).expect("the example makes request.json");
    let status = Command::new("sh").current_dir(dir.path()).args(["-c", maker]).status().unwrap();
    assert!(status.success() && dir.path().join("request.json").exists(), "{maker}");
    (dir, example)
}

#[test]
fn the_readme_scan_example_fails_its_budget_at_the_figure_it_prints() {
    let (dir, example) = prepare();
    let server = Uvicorn::start(dir.path(), None);
    let out: PathBuf = dir.path().join("report");
    let args = scan_args(&example, &server, "http", &["--json", "--out", out.to_str().unwrap()]);
    let (code, report, stderr) = run(dir.path(), &args);
    assert_eq!(code, 1, "the README says this example fails: {report}\n{stderr}");
    let anon = anonymous(&report);
    assert_eq!(anon["judgement"]["verdict"], "leak", "{anon}");
    assert_eq!(anon["ops"], "fail", "{anon}");
    // Measured 7.12 and 7.24 kB per request in two runs on the 2-core machine: the README's
    // figure holds within 10 %.
    let measured = anon["judgement"]["slope"]["bytes_per_request"].as_f64().unwrap();
    let shown = example.shown_bytes_per_request;
    assert!((measured - shown).abs() < 0.10 * shown, "the README shows {shown} B/request, the example measured {measured}");
}

#[test]
fn the_example_behind_tls_is_scanned_over_https_with_the_right_ca_and_refused_with_the_wrong_one() {
    let (dir, example) = prepare();
    let certs = common::tls::make(dir.path());
    let server = Uvicorn::start(dir.path(), Some((&certs.cert, &certs.key)));
    let out = dir.path().join("report");
    let short = ["--json", "--out", out.to_str().unwrap(), "--requests", "200", "--warmup", "20"];
    let ca = certs.ca.to_str().unwrap();
    let (code, report, stderr) = run(dir.path(), &scan_args(&example, &server, "https", &[&short[..], &["--ca-cert", ca]].concat()));
    assert_eq!(code, 1, "over https the leak is the same leak: {report}\n{stderr}");
    assert_eq!(anonymous(&report)["judgement"]["verdict"], "leak");
    assert_eq!(report["errors"], 0, "{report}");

    for (flags, expected) in [(vec!["--ca-cert", certs.wrong_ca.to_str().unwrap()], "certificate is not trusted"), (vec![], "certificate is not trusted")] {
        let (code, _, stderr) = run(dir.path(), &scan_args(&example, &server, "https", &[&short[..], &flags[..]].concat()));
        assert_eq!(code, 2, "{flags:?}: {stderr}");
        assert!(stderr.contains(expected) && stderr.contains("--ca-cert"), "{flags:?}: {stderr}");
    }
    let (code, _, stderr) = run(dir.path(), &scan_args(&example, &server, "http", &short));
    assert_eq!(code, 2, "plain HTTP to a TLS port: {stderr}");
    assert!(stderr.contains("does not answer"), "{stderr}");
}

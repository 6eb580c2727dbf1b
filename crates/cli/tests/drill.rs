//! The incident drill, diagnosed with the instrument as a learner would: each incident's
//! service as shipped (never the learner's copy), the traffic the briefing hands out, and
//! `leaklab scan` with the briefing's flags and its snapshot endpoint. Every leaking incident
//! fails its budget on the service's exact gauge at the size of what it keeps, and the snapshots
//! point at the line of the incident's handler where the held tensors were born (the line
//! `lab reveal` names), and the diagnosis says tensors are kept alive; the bounded cache
//! passes. The drill answers as the lab's service does: it is served by the same HTTP layer.

mod common;

use common::{exercises_exe, leaklab, made_once, Service};
use std::process::Command;

const EXACT: &str = "leaklab_memory_bytes{probe=\"cpu_allocator_live\"}";

/// Scans incident `name` as shipped; `per_request` is what its exact gauge must grow by (0 for
/// none), within 10 %.
fn check(name: &str, per_request: f64) {
    let dir = tempfile::tempdir().unwrap();
    // The same sixteen bodies for every incident: written once per build (0.4 s of CPU a test).
    let traffic = made_once(&exercises_exe(), "drill-traffic", |folder| {
        assert!(Command::new(exercises_exe())
            .args(["incident", "traffic", "--out"])
            .arg(folder.join("traffic"))
            .status()
            .unwrap()
            .success());
    })
    .join("traffic");
    let reveal = Command::new(exercises_exe())
        .args(["reveal", "--json", "--incident", name])
        .output()
        .unwrap();
    let reveal: serde_json::Value = serde_json::from_slice(&reveal.stdout).unwrap();
    let born = format!(
        "incidents/{}.rs:{}",
        if per_request > 0.0 {
            name.replace('-', "_")
        } else {
            "fixed".into()
        },
        reveal["born"]["line"]
    );

    // A short history: any turns on the native stacks, and each live block keeps its own stack,
    // which is all the who-holds table reads. The history only sets how many alloc/free events
    // the snapshot's trace repeats, each with its whole stack: 50,000 made each look a 290 MB
    // pickle to write and read (measured after 400 requests).
    let mut c = Command::new(exercises_exe());
    c.args([
        "incident",
        "serve",
        "--original",
        name,
        "--port",
        "0",
        "--history",
        "1000",
    ]);
    let service = Service::start(c);
    let (pid, base) = (service.pid(), service.base.clone());
    // A leaking incident gets the briefing's 600 judged requests (its default). With 400 the
    // exact gauge still read each one's figure exactly, but what accumulated between the two
    // looks (100 requests, not 150) was outweighed by the service's own allocations, a holder
    // whose frames name no incident, in 3 of 27 runs (drift, cache, error-path; load 11 to 16,
    // 2026-12-06). The bounded cache, which names no holder, is full by request 154 and reads
    // level after it (a plateau, tail slope 0 ± 128 B) at 400 as at 600: it passed 11 runs of
    // 11 at 400 (three beside two busy loops), for 7.1-9.2 s of CPU against 10.5 s at 600.
    let judged = if per_request > 0.0 { "600" } else { "400" };
    let output = leaklab()
        .args([
            "scan",
            &format!("{base}/v1/infer"),
            "--header",
            "content-type: application/json",
            "--vary",
            "--json",
            "--pid",
            &pid,
            "--requests",
            judged,
        ])
        .args([
            "--metrics",
            &format!("{base}/metrics"),
            "--series",
            EXACT,
            "--capacity",
            "16GiB",
            "--rate",
            "40",
        ])
        .args([
            "--snapshot",
            &format!("{base}/debug/memory/snapshot"),
            "--body",
        ])
        .arg(&traffic)
        .arg("--out")
        .arg(dir.path().join("scan"))
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|_| panic!("{name}: {}", String::from_utf8_lossy(&output.stderr)));
    let exact = report["series"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["series"] == EXACT)
        .unwrap();
    let verdict = exact["judgement"]["verdict"].as_str().unwrap();
    let slope = exact["judgement"]["slope"]["bytes_per_request"]
        .as_f64()
        .unwrap();
    let refused = report["error_kinds"]["HTTP 422"].as_u64().unwrap_or(0);
    eprintln!(
        "{name}: exit {:?}, exact gauge {verdict} at {slope:.0} B/request, {refused} refused",
        output.status.code()
    );
    // Body `i` of the sixteen goes out as request `i`, `i + 16`, ... (one at a time), and every
    // eighth is raw features, which every incident refuses: exactly one in eight of the requests
    // sent, the judged ones and those between the looks inside alike (measured: 137 of 1,100 in
    // each of the six).
    let sent = report["requests_sent"].as_u64().unwrap();
    assert_eq!(
        refused,
        sent / 8,
        "{name}: {refused} answers 422 of {sent}, not every eighth"
    );
    if per_request == 0.0 {
        assert_eq!(output.status.code(), Some(0), "{name} must pass: {report}");
        assert_ne!(verdict, "leak", "{name}");
        return;
    }
    assert_eq!(
        output.status.code(),
        Some(1),
        "{name} must fail its budget: {report}"
    );
    assert_eq!(verdict, "leak", "{name}");
    assert!(
        (slope / per_request - 1.0).abs() < 0.1,
        "{name}: {slope:.0} B/request, expected {per_request:.0}"
    );
    // The exact gauge counts live tensors, so the diagnosis says what it is: tensors kept alive.
    let diagnosis = report["diagnosis"].as_str().unwrap_or_default();
    assert!(
        diagnosis.starts_with("Tensors are being kept alive"),
        "{name}: {diagnosis}"
    );
    let top = &report["who_holds"]["holders"][0];
    let frames: Vec<&str> = std::iter::once(&top["site"])
        .chain(top["stack"].as_array().unwrap())
        .filter_map(|f| f.as_str())
        .collect();
    assert!(
        frames.iter().any(|f| f.contains(&born)),
        "{name}: the largest holder's frames {frames:?} do not name {born}"
    );
}

/// Seven good requests in eight, all new under --vary.
const GOOD: f64 = 7.0 / 8.0;

#[test]
fn graph_keeps_features_and_activations() {
    check("graph", GOOD * 81_920.0);
}

#[test]
fn drift_keeps_every_answer() {
    check("drift", GOOD * 16_384.0);
}

#[test]
fn cache_keeps_every_new_answer() {
    check("cache", GOOD * 16_384.0);
}

#[test]
fn error_path_keeps_every_refused_input() {
    check("error-path", 131_072.0 / 8.0);
}

#[test]
fn hook_keeps_every_requests_features() {
    check("hook", GOOD * 16_384.0);
}

#[test]
fn the_bounded_cache_passes() {
    check("bounded-cache", 0.0);
}

/// One HTTP/1.1 exchange on loopback: the status code and the body.
fn http(base: &str, method: &str, path: &str, content_type: &str, body: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(base.trim_start_matches("http://")).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    write!(stream, "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len()).unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (
        status,
        answer
            .split_once("\r\n\r\n")
            .map_or(String::new(), |(_, b)| b.to_string()),
    )
}

/// The drill is served by the lab service's own HTTP layer: the same validation, error bodies
/// and answer body. A malformed request keeps nothing, even on the error-path incident (whose
/// handler keeps what it refuses); too many rows is the service's 413, not a 422.
#[test]
fn the_drill_answers_as_the_service_does_and_bad_requests_keep_nothing() {
    let mut c = Command::new(exercises_exe());
    c.args([
        "incident",
        "serve",
        "--original",
        "error-path",
        "--port",
        "0",
    ]);
    let service = Service::start(c);
    let live = || {
        let (_, text) = http(&service.base, "GET", "/metrics", "text/plain", "");
        // The series carries the service's labels too (variant="incident"): match as a selector does.
        let line = text
            .lines()
            .find(|l| {
                l.starts_with("leaklab_memory_bytes{")
                    && l.contains("probe=\"cpu_allocator_live\"}")
            })
            .unwrap_or_else(|| panic!("no exact gauge in\n{text}"));
        line.rsplit_once(' ').unwrap().1.parse::<f64>().unwrap()
    };
    let before = live();
    let json = "application/json";
    let row = format!("[{}]", vec!["0.5"; 512].join(","));
    let too_many = format!("{{\"inputs\": [{}]}}", vec![row.as_str(); 1025].join(","));
    for (content_type, body, status, says) in [
        (json, "not json", 400, "Failed to parse"),
        (json, r#"{"inputs": []}"#, 422, "`inputs` is empty"),
        (json, r#"{"inputs": [[1, 2]]}"#, 422, "the model takes 512"),
        (json, r#"{"wrong": 1}"#, 422, "unknown field"),
        (json, too_many.as_str(), 413, "exceeds the limit of 1024"),
        ("text/plain", "{}", 415, "Content-Type"),
    ] {
        let (got, answer) = http(&service.base, "POST", "/v1/infer", content_type, body);
        assert_eq!(got, status, "{}: {answer}", &body[..body.len().min(40)]);
        assert!(
            answer.contains("\"error\"") && answer.contains(says),
            "{}: {answer}",
            &body[..body.len().min(40)]
        );
    }
    assert_eq!(
        live(),
        before,
        "a refused malformed request keeps no tensor, even on the error-path incident"
    );
    // A good request gets the service's answer body; the same input again comes from the
    // handler's answers cache, without a forward pass.
    let good = format!("{{\"inputs\": [{row}]}}");
    for (request, cached) in [(1, false), (2, true)] {
        let (got, answer) = http(&service.base, "POST", "/v1/infer", json, &good);
        let answer: serde_json::Value = serde_json::from_str(&answer).unwrap();
        assert_eq!(got, 200, "{answer}");
        assert_eq!(
            (
                answer["request"].as_u64(),
                answer["cached"].as_bool(),
                answer["variant"].as_str()
            ),
            (Some(request), Some(cached), Some("incident")),
            "{answer}"
        );
        assert_eq!(
            answer["outputs"][0].as_array().map(Vec::len),
            Some(512),
            "{answer}"
        );
    }
}

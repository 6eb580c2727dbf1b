//! `leaklab scan` as a user runs it, against real services on loopback: the Python twin
//! (FastAPI + PyTorch) as a black box by PID and by its /metrics, the Rust service by PID
//! against its own exact allocator, a real v1 cgroup, the zoo's oneDNN cause through the agent's
//! native trace, and every kind of bad target.

mod common;

use common::{body, leaklab, python, rust, service_exe, skip_missing, twin, Service};
use std::path::Path;
use std::process::Command;

/// `leaklab scan` with the test's common flags; its exit code and JSON report.
fn scan(url: &str, body: &Path, out: &Path, extra: &[&str]) -> (i32, serde_json::Value, String) {
    let output = leaklab()
        .args([
            "scan",
            url,
            "--header",
            "content-type: application/json",
            "--vary",
            "--json",
            "--out",
        ])
        .arg(out)
        .arg("--body")
        .arg(body)
        .args(extra)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let report = serde_json::from_slice(&output.stdout).unwrap_or(serde_json::Value::Null);
    (output.status.code().unwrap_or(-1), report, stderr)
}

fn series<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["series"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["series"] == name)
        .unwrap_or_else(|| panic!("no series {name} in {report}"))
}

/// A budget that separates a real leak from the twin's own slow growth (its bounded sample
/// buffer filling, about 1 to 3 kB per request): 8 GiB at 5 requests/s for 2 days is about
/// 9.5 kB per request.
const BUDGET: [&str; 6] = [
    "--capacity",
    "8GiB",
    "--rate",
    "5",
    "--fail-if-oom-within",
    "2d",
];

// Every leaky twin variant fails and every fixed one passes, by PID and by its /metrics: a
// test per variant, so the pool runs them side by side.
#[test]
fn the_twin_graph_leaky_fails_by_pid_and_by_metrics() {
    twin_by_pid_and_metrics("graph-leaky", true);
}

#[test]
fn the_twin_refs_leaky_fails_by_pid_and_by_metrics() {
    twin_by_pid_and_metrics("refs-leaky", true);
}

#[test]
fn the_twin_cache_leaky_fails_by_pid_and_by_metrics() {
    twin_by_pid_and_metrics("cache-leaky", true);
}

#[test]
fn the_twin_graph_fixed_passes_by_pid_and_by_metrics() {
    twin_by_pid_and_metrics("graph-fixed", false);
}

#[test]
fn the_twin_refs_fixed_passes_by_pid_and_by_metrics() {
    twin_by_pid_and_metrics("refs-fixed", false);
}

#[test]
fn the_twin_baseline_passes_by_pid_and_by_metrics() {
    twin_by_pid_and_metrics("baseline", false);
}

fn twin_by_pid_and_metrics(variant: &str, leaky: bool) {
    let dir = tempfile::tempdir().unwrap();
    let body = body(dir.path());
    {
        let service = twin(variant, dir.path(), &[]);
        let (pid, metrics) = (service.pid(), format!("{}/metrics", service.base));
        let mut flags = vec![
            "--pid",
            &pid,
            "--metrics",
            &metrics,
            "--series",
            "process_resident_memory_bytes",
            "--requests",
            "400",
            "--warmup",
            "50",
        ];
        flags.extend(BUDGET);
        let out = dir.path().join(variant);
        let (code, report, stderr) =
            scan(&format!("{}/v1/infer", service.base), &body, &out, &flags);
        let anon = series(&report, "anonymous");
        let rss_metric = series(&report, "process_resident_memory_bytes");
        eprintln!(
            "{variant}: exit {code}, anonymous {} {:.0} B/request, /metrics RSS {} {:.0} B/request",
            anon["judgement"]["verdict"],
            anon["judgement"]["slope"]["bytes_per_request"]
                .as_f64()
                .unwrap_or(0.0),
            rss_metric["judgement"]["verdict"],
            rss_metric["judgement"]["slope"]["bytes_per_request"]
                .as_f64()
                .unwrap_or(0.0)
        );
        if leaky {
            assert_eq!(code, 1, "{variant} must fail: {report}\n{stderr}");
            assert_eq!(anon["judgement"]["verdict"], "leak", "{variant} by PID");
            assert_eq!(
                rss_metric["judgement"]["verdict"], "leak",
                "{variant} by its /metrics"
            );
        } else {
            assert_eq!(code, 0, "{variant} must pass: {report}\n{stderr}");
        }
        assert!(out.join("report.md").exists() && out.join("anonymous.svg").exists());
    }
}

#[test]
fn the_rust_service_by_pid_agrees_with_its_own_exact_allocator() {
    let dir = tempfile::tempdir().unwrap();
    let body = body(dir.path());
    // What anonymous memory keeps per request against the exact allocator, per variant. Nine
    // runs of this test (a debug build of the service recording 50,000 allocation events with
    // their stacks, 400 judged requests, a 2-core machine shared with other builds) read
    // graph-leaky 1.61 eight times and 1.08 once, and refs-leaky 1.02, 1.05, 1.11, 1.13 and
    // 1.20 in five runs, 2.04, 2.52, 2.53 and 2.57 in the other four; a later CI rehearsal and
    // six scans of the same build by hand read refs-leaky 4.03 or 4.04 every time, as the
    // release build does over 1,000 requests (docs/scan.md: 1.11 and 4.03). Where malloc places
    // refs-leaky's small tensors decides which: their multiple is malloc's, not the scan's. So
    // refs-leaky's bound is its range of real readings (the floor, in steps of a few pages, may
    // read a little low), and graph-leaky's narrow one is what catches a scan that counts the
    // process twice; both catch a unit slip (pages, kB) or the wrong process.
    for (variant, ratios) in [("graph-leaky", 1.0..1.75), ("refs-leaky", 0.95..4.5)] {
        let service = common::rust_with(variant, &["--memory-history", "50000"]);
        let snapshot = format!("{}/debug/memory/snapshot", service.base);
        let pid = service.pid();
        let mut flags = vec![
            "--pid",
            &pid,
            "--requests",
            "400",
            "--warmup",
            "50",
            "--snapshot",
            &snapshot,
        ];
        flags.extend(BUDGET);
        // The test's own reading of what the scan reads, just before it: the same figure.
        let before = anonymous_bytes(&pid);
        let (code, report, stderr) = scan(
            &format!("{}/v1/infer", service.base),
            &body,
            &dir.path().join(variant),
            &flags,
        );
        assert_eq!(code, 1, "{variant} leaks tens of kB a request from outside: it must fail the budget: {report}\n{stderr}");
        let samples: Vec<serde_json::Value> = serde_json::from_str(&reqwest_get(&format!(
            "{}/debug/memory/samples?since=100",
            service.base
        )))
        .unwrap();
        let (first, last) = (&samples[0], &samples[samples.len() - 1]);
        let exact = (last["memory"]["cpu"]["live_bytes"].as_f64().unwrap()
            - first["memory"]["cpu"]["live_bytes"].as_f64().unwrap())
            / (last["request"].as_f64().unwrap() - first["request"].as_f64().unwrap());
        let anon = series(&report, "anonymous")["judgement"]["slope"]["bytes_per_request"]
            .as_f64()
            .unwrap();
        let ratio = anon / exact;
        eprintln!("{variant}: anonymous {anon:.0} B/request from outside, exact allocator {exact:.0}: ratio {ratio:.2}");
        // From outside the process sees the tensors plus what malloc holds beside them
        // (autograd nodes, freed chunks it cannot return between kept tensors).
        assert!(
            ratios.contains(&ratio),
            "{variant}: ratio {ratio}, outside {ratios:?}"
        );
        // What the ratio cannot catch for refs-leaky (malloc spreads it over 1.02 to 4.04): a
        // reading doubled (the process counted twice), in other units, or of another process.
        // The scan's first reading, one request after the test's own, is that reading's level.
        let first = series(&report, "anonymous")["samples"][0][1]
            .as_f64()
            .unwrap();
        let level = first / before;
        eprintln!("{variant}: the scan's first reading {first:.0} B, the test's own just before {before:.0} B: {level:.3}");
        assert!(
            LEVEL.contains(&level),
            "{variant}: the scan read {first} B where the process held {before} B"
        );
        // The snapshots after the warm-up and at the end name the line, and what accumulated
        // between them is the exact allocator's growth.
        let held = &report["who_holds"];
        let site = held["holders"][0]["site"]
            .as_str()
            .unwrap_or_else(|| panic!("{variant}: no who-holds-it in {}", report["notes"]));
        // The kept tensors were born in the model's forward (a closure built in `Mlp::new`) or in
        // the cause's own file, as the issue's oracle allows.
        assert!(
            site.contains("crates/model/src/lib.rs:")
                || site.contains("crates/service/src/causes/"),
            "{variant}: {site}"
        );
        let per_request = held["bytes_per_request"].as_f64().unwrap();
        assert!(
            (per_request / exact - 1.0).abs() < 0.1,
            "{variant}: snapshots {per_request:.0} B/request, allocator {exact:.0}"
        );
        let md = std::fs::read_to_string(dir.path().join(variant).join("report.md")).unwrap();
        assert!(
            md.contains("Who holds the memory the judged requests left live"),
            "{md}"
        );
    }
}

/// The scan's first reading over the test's own just before it: 1.021 to 1.022 in eight
/// readings (4 runs, graph-leaky and refs-leaky: the first request's own 4.3 MB); a doubled
/// reading is 2, one in pages or kB thousands apart, another process's far off.
const LEVEL: std::ops::Range<f64> = 1.0..1.1;

/// `Anonymous:` of `/proc/PID/smaps_rollup`, in bytes (the kernel writes kB).
fn anonymous_bytes(pid: &str) -> f64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    let kb = text
        .lines()
        .find_map(|l| l.strip_prefix("Anonymous:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok());
    kb.expect("smaps_rollup has Anonymous:") * 1024.0
}

fn reqwest_get(url: &str) -> String {
    let out = Command::new(python()).args(["-c", "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())", url]).output().unwrap();
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn a_real_v1_cgroup_is_read_with_its_limit() {
    let parent = Path::new("/sys/fs/cgroup/memory");
    let test = "a_real_v1_cgroup_is_read_with_its_limit";
    if !parent.join("memory.usage_in_bytes").exists() {
        return skip_missing(
            test,
            &format!("a cgroup v1 memory controller at {}", parent.display()),
        );
    }
    let group = parent.join(format!("leaklab-test-{}", std::process::id()));
    if let Err(e) = std::fs::create_dir(&group) {
        return skip_missing(
            test,
            &format!(
                "a child cgroup of {} (root, to create it: {e})",
                parent.display()
            ),
        );
    }
    std::fs::write(group.join("memory.limit_in_bytes"), "2147483648").unwrap();
    let service = rust("refs-leaky");
    std::fs::write(group.join("cgroup.procs"), service.pid()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let body = body(dir.path());
    let (code, report, stderr) = scan(
        &format!("{}/v1/infer", service.base),
        &body,
        dir.path(),
        &[
            "--cgroup",
            group.to_str().unwrap(),
            "--requests",
            "300",
            "--warmup",
            "30",
            "--rate",
            "50",
        ],
    );
    drop(service);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let _ = std::fs::remove_dir(&group);
    // Tens of kB a request at 50 a second fill 2 GiB within the hour: far inside a week.
    assert_eq!(
        code, 1,
        "a leak that fills the cgroup within the hour must fail the scan: {report}\n{stderr}"
    );
    let ws = series(&report, "cgroup_working_set");
    assert_eq!(
        ws["capacity_bytes"], 2147483648u64,
        "the cgroup's limit is the capacity"
    );
    assert_eq!(ws["judgement"]["verdict"], "leak", "{ws}");
}

#[test]
fn bad_targets_get_clear_messages_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let body = body(dir.path());
    let me = std::process::id().to_string();
    // Nothing listens there.
    let free = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let (code, _, stderr) = scan(
        &format!("http://{free}/v1/infer"),
        &body,
        dir.path(),
        &["--pid", &me],
    );
    assert_eq!(code, 2);
    assert!(stderr.contains("does not answer"), "{stderr}");
    // No signal, a dead PID, a cgroup that does not exist.
    let (code, _, stderr) = scan(&format!("http://{free}/"), &body, dir.path(), &[]);
    assert!(
        code == 2 && stderr.contains("no memory signal to watch"),
        "{stderr}"
    );
    let (code, _, stderr) = scan(
        &format!("http://{free}/"),
        &body,
        dir.path(),
        &["--pid", "999999999"],
    );
    assert!(
        code == 2 && stderr.contains("gone or unreadable"),
        "{stderr}"
    );
    let (code, _, stderr) = scan(
        &format!("http://{free}/"),
        &body,
        dir.path(),
        &["--cgroup", "/sys/fs/cgroup/memory/no-such-group"],
    );
    assert!(
        code == 2 && stderr.contains("not a cgroup with a memory controller"),
        "{stderr}"
    );
    // A pace that no clock can keep.
    for pace in ["0", "-3", "inf", "fast"] {
        let (code, _, stderr) = scan(
            &format!("http://{free}/"),
            &body,
            dir.path(),
            &["--pid", &me, &format!("--pace={pace}")],
        );
        assert!(
            code == 2 && stderr.contains("is not a rate"),
            "--pace {pace}: {stderr}"
        );
    }
    // A metrics endpoint without the series, and one that is not Prometheus text.
    let service = rust("baseline");
    let (code, _, stderr) = scan(
        &format!("{}/v1/infer", service.base),
        &body,
        dir.path(),
        &[
            "--metrics",
            &format!("{}/metrics", service.base),
            "--series",
            "no_such_series",
        ],
    );
    assert!(
        code == 2
            && stderr.contains("no series `no_such_series`")
            && stderr.contains("leaklab_memory_bytes"),
        "{stderr}"
    );
    let (code, _, stderr) = scan(
        &format!("{}/v1/infer", service.base),
        &body,
        dir.path(),
        &[
            "--metrics",
            &format!("{}/debug/memory", service.base),
            "--series",
            "x",
        ],
    );
    // JSON, not an exposition: said as such, whatever series was asked for.
    assert!(
        code == 2 && stderr.contains("did not answer in the Prometheus text format"),
        "{stderr}"
    );
    // A 4xx storm (a body the service refuses): the scan stops, says why, keeps its report.
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, br#"{"inputs": [[1.0, 2.0]]}"#).unwrap();
    let out = dir.path().join("storm");
    let output = leaklab()
        .args([
            "scan",
            &format!("{}/v1/infer", service.base),
            "--header",
            "content-type: application/json",
            "--json",
            "--pid",
            &service.pid(),
            "--out",
        ])
        .arg(&out)
        .arg("--body")
        .arg(&bad)
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(
        output.status.code(),
        Some(2),
        "too few good answers to judge"
    );
    assert!(
        report["notes"][0].as_str().unwrap().contains("were errors"),
        "{report}"
    );
    assert_eq!(
        report["error_kinds"]["HTTP 422"].as_u64().unwrap() as usize,
        report["errors"].as_u64().unwrap() as usize
    );
    assert!(
        out.join("report.json").exists(),
        "the partial report is kept"
    );
    // What the service said, and what usually causes a 422.
    let said = first_error(&report);
    assert_eq!(said, "the first error answer was HTTP 422 Unprocessable Entity, with `{\"error\":\"row 0 has 2 features; the model takes 512\"}`: the service could not read the body as the endpoint expects: check its shape (the fields and types the endpoint declares) and its content type (content type application/json was sent; --header 'content-type: …' sets another)");
}

/// One rule for a budget: without --rate any leak the scan proves fails (as `leak_check` and
/// `leaklab judge` fail it), with its time to OOM at the rate the scan drove; the lab's reference
/// scenario is a budget asked for by name; a time without a rate is refused.
#[test]
fn without_a_rate_any_proven_leak_fails_and_the_seed_budget_is_asked_for_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let body = body(dir.path());
    let service = rust("refs-leaky");
    let (pid, url) = (service.pid(), format!("{}/v1/infer", service.base));
    let short = ["--pid", &pid, "--requests", "200", "--warmup", "30"];
    let out = dir.path().join("no-budget");
    let (code, report, stderr) = scan(&url, &body, &out, &short);
    assert_eq!(
        code, 1,
        "a proven leak with no budget fails: {report}\n{stderr}"
    );
    assert_eq!(report["budget"], serde_json::Value::Null);
    let anon = series(&report, "anonymous");
    assert_eq!(
        (&anon["judgement"]["verdict"], &anon["ops"]),
        (&serde_json::json!("leak"), &serde_json::json!("fail")),
        "{anon}"
    );
    // Its time to OOM is at the measured rate, from the floor now to the capacity.
    let (j, f) = (&anon["judgement"], |v: &serde_json::Value| {
        v.as_f64().unwrap()
    });
    let at_measured = (f(&anon["capacity_bytes"]) - f(&j["floor_now"]))
        / f(&j["slope"]["bytes_per_request"])
        / f(&report["requests_per_second_measured"]);
    assert!(
        (f(&anon["seconds_to_oom"]) / at_measured - 1.0).abs() < 1e-9,
        "{} s, not {at_measured} s",
        anon["seconds_to_oom"]
    );
    let md = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(
        md.contains("FAIL: a leak is proven (no budget: any growth proven is a leak;"),
        "{md}"
    );
    // The seed's scenario, by name: tens of kB a request at one request every 32 s last months.
    let (code, report, stderr) = scan(
        &url,
        &body,
        &dir.path().join("seed"),
        &[&short[..], &["--budget", "seed"]].concat(),
    );
    assert_eq!(code, 0, "{report}\n{stderr}");
    assert_eq!(
        report["budget"],
        serde_json::json!({"steps_per_second": 1.0 / 32.0, "seconds": 7.0 * 86400.0})
    );
    assert_eq!(series(&report, "anonymous")["ops"], "pass");
    // A time to OOM within which memory must last, with no rate to reach it at: refused.
    let (code, _, stderr) = scan(
        &url,
        &body,
        &dir.path().join("refused"),
        &[&short[..], &["--fail-if-oom-within", "3d"]].concat(),
    );
    assert!(
        code == 2 && stderr.contains("give the production rate with --rate too"),
        "{stderr}"
    );
}

/// Requests as users write them: a JSON body with no `--header` goes as `application/json`
/// (axum, like FastAPI, refuses JSON without it); a content type the service refuses is a 415
/// whose words are in the report, with what to do.
#[test]
fn a_json_body_goes_as_json_and_a_refused_content_type_is_said_with_the_services_words() {
    let dir = tempfile::tempdir().unwrap();
    let body = body(dir.path());
    let service = rust("baseline");
    let url = format!("{}/v1/infer", service.base);
    let run = |extra: &[&str]| {
        let out = dir.path().join("out");
        let output = leaklab()
            .args([
                "scan",
                &url,
                "--json",
                "--pid",
                &service.pid(),
                "--requests",
                "60",
                "--warmup",
                "10",
                "--out",
            ])
            .arg(&out)
            .arg("--body")
            .arg(&body)
            .args(extra)
            .output()
            .unwrap();
        let report: serde_json::Value = serde_json::from_slice(&output.stdout)
            .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&output.stderr)));
        (output.status.code().unwrap_or(-1), report)
    };
    // Every answer a success, so the scan judges (its verdict on 60 requests is beside the point:
    // one took a 5.7 MB arena step at request 45 and read as a leak).
    let (code, report) = run(&[]);
    assert_eq!(
        report["errors"], 0,
        "as written, with no --header: {report}"
    );
    assert_eq!(report["requests_sent"], 70, "{report}");
    assert_ne!(code, 2, "{report}");
    let (code, report) = run(&["--header", "content-type: text/plain"]);
    assert_eq!(code, 2, "every answer refused: {report}");
    let said = first_error(&report);
    assert_eq!(said, "the first error answer was HTTP 415 Unsupported Media Type, with `{\"error\":\"expected `Content-Type: application/json`\"}`: the service refuses the body's content type (content type text/plain was sent): give the one it expects with --header 'content-type: …'");
}

/// The report's note on the first answer that was not a success.
fn first_error(report: &serde_json::Value) -> &str {
    let notes = report["notes"].as_array().unwrap();
    notes
        .iter()
        .filter_map(|n| n.as_str())
        .find(|n| n.starts_with("the first error answer"))
        .unwrap_or_else(|| panic!("no note on the first error answer: {report}"))
}

#[test]
fn a_service_that_dies_mid_scan_leaves_a_report_of_what_was_measured() {
    let dir = tempfile::tempdir().unwrap();
    let body = body(dir.path());
    let mut c = Command::new(service_exe());
    c.env("LEAKLAB_CRASH_AFTER", "refs-leaky:220").args([
        "serve",
        "--variant",
        "refs-leaky",
        "--port",
        "0",
        "--threads",
        "1",
    ]);
    let service = Service::start(c);
    let out = dir.path().join("died");
    let pid = service.pid();
    let mut flags = vec!["--pid", &pid, "--requests", "400", "--warmup", "20"];
    flags.extend(BUDGET);
    let (code, report, stderr) = scan(&format!("{}/v1/infer", service.base), &body, &out, &flags);
    assert_eq!(
        code, 1,
        "the 200 judged requests before the crash show the leak: {report}\n{stderr}"
    );
    let notes = report["notes"].to_string();
    // The first answer after the crash is a refused connection, and the reading after it finds
    // the process gone: the signal stops before errors can reach half the answers.
    assert!(notes.contains("stopped reading process"), "{notes}");
    assert!(out.join("report.md").exists());
}

/// A listener that accepts and never answers: each request times out, and the scan says so.
#[test]
fn a_hanging_target_times_out_per_request_and_stops() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming().take(64) {
            held.push(s);
        }
        std::thread::sleep(std::time::Duration::from_secs(60));
    });
    let dir = tempfile::tempdir().unwrap();
    let body = body(dir.path());
    let (code, _, stderr) = scan(
        &format!("http://{addr}/v1/infer"),
        &body,
        dir.path(),
        &[
            "--pid",
            &std::process::id().to_string(),
            "--timeout",
            "300ms",
        ],
    );
    assert_eq!(code, 2);
    assert!(
        stderr.contains("does not answer") && stderr.contains("timed out"),
        "{stderr}"
    );
}

/// `--native` end to end, on the zoo's real mechanism: a conv net fed a new image size per
/// request (lab/zoo/onednn_cache.py) grows oneDNN's primitive cache, which no Python object
/// holds. The census finds nothing, so the owner is native; the agent's memray window then
/// names the cache from its frames, and the fix carries its two knobs. Measured here: 12.7 s
/// of scan (300 judged, their repeats and the 100 traced), the window 2.5 s.
#[test]
fn the_native_trace_names_onednns_primitive_cache_and_its_knobs() {
    let python = python();
    let memray = Command::new(&python)
        .args(["-c", "import memray"])
        .status()
        .unwrap();
    if !memray.success() {
        return skip_missing(
            "the native trace's scan test",
            "memray (pip install 'leaklab[native]')",
        );
    }
    let serve = concat!(env!("CARGO_MANIFEST_DIR"), "/../../lab/zoo/serve.py");
    let dir = tempfile::tempdir().unwrap();
    let bodies = dir.path().join("bodies");
    assert!(Command::new(&python)
        .args([serve, "onednn_cache", "--bodies"])
        .arg(&bodies)
        .args(["--count", "320"])
        .status()
        .unwrap()
        .success());
    let mut command = Command::new(&python);
    command.args([
        serve,
        "onednn_cache",
        "--variant",
        "leaky",
        "--native-seconds",
        "60",
    ]);
    let service = Service::start(command);
    let output = leaklab()
        .args(["scan", &format!("{}/predict", service.base), "--body"])
        .arg(&bodies)
        .args([
            "--pid",
            &service.pid(),
            "--header",
            "content-type: application/json",
        ])
        .args([
            "--requests",
            "300",
            "--warmup",
            "20",
            "--capacity",
            "1GiB",
            "--rate",
            "1",
        ])
        .args([
            "--agent",
            &format!("{}/debug/leaklab", service.base),
            "--native",
        ])
        .arg("--json")
        .arg("--out")
        .arg(dir.path().join("scan"))
        .output()
        .unwrap();
    let report: serde_json::Value = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|_| panic!("no report: {}", String::from_utf8_lossy(&output.stderr)));
    let (owner, native) = (&report["owner"], &report["native"]);
    assert_eq!(
        report["axis"]["axis"], "per-new-input",
        "{}",
        report["axis"]
    );
    assert_eq!(owner["owner"], "native", "{owner}");
    // The window is the agent's: it counts the answers it saw (100 asked; 101 measured once,
    // one answered as it began), so the count is a floor.
    let (holders, note) = (&native["holders"], &native["note"]);
    assert_eq!(native["traced"], true, "{note}");
    assert!(
        native["requests"].as_u64().unwrap() >= 100,
        "{}",
        native["requests"]
    );
    assert_eq!(
        holders[0]["mechanism"], "onednn_primitive_cache",
        "{holders}"
    );
    let (mechanism, fix) = (
        owner["mechanism"].as_str().unwrap(),
        owner["fix"].as_str().unwrap(),
    );
    assert!(
        mechanism.starts_with("oneDNN's primitive cache"),
        "{mechanism}"
    );
    assert!(
        fix.contains("ONEDNN_PRIMITIVE_CACHE_CAPACITY") && fix.contains("LRU_CACHE_CAPACITY"),
        "{fix}"
    );
}

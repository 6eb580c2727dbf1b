//! `leaklab scan` as a user runs it, against real services on loopback: the Python twin
//! (FastAPI + PyTorch) as a black box by PID and by its /metrics, the Rust service by PID
//! against its own exact allocator, a real v1 cgroup, and every kind of bad target.

mod common;

use common::{body, leaklab, python, rust, service_exe, twin, Service};
use std::path::Path;
use std::process::Command;

/// `leaklab scan` with the test's common flags; its exit code and JSON report.
fn scan(url: &str, body: &Path, out: &Path, extra: &[&str]) -> (i32, serde_json::Value, String) {
    let output = leaklab()
        .args(["scan", url, "--header", "content-type: application/json", "--vary", "--json", "--out"])
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
    report["series"].as_array().unwrap().iter().find(|s| s["series"] == name).unwrap_or_else(|| panic!("no series {name} in {report}"))
}

/// A budget that separates a real leak from the twin's own slow growth (its bounded sample
/// buffer filling, about 1 to 3 kB per request): 8 GiB at 5 requests/s for 2 days is about
/// 9.5 kB per request.
const BUDGET: [&str; 6] = ["--capacity", "8GiB", "--rate", "5", "--fail-if-oom-within", "2d"];

#[test]
fn every_leaky_twin_variant_fails_and_every_fixed_one_passes_by_pid_and_by_metrics() {
    let dir = tempfile::tempdir().unwrap();
    let body = body(dir.path());
    let mut seen = Vec::new();
    for (variant, leaky) in [("graph-leaky", true), ("refs-leaky", true), ("cache-leaky", true), ("graph-fixed", false), ("refs-fixed", false), ("baseline", false)] {
        let service = twin(variant, dir.path(), &[]);
        let (pid, metrics) = (service.pid(), format!("{}/metrics", service.base));
        let mut flags = vec!["--pid", &pid, "--metrics", &metrics, "--series", "process_resident_memory_bytes", "--requests", "400", "--warmup", "50"];
        flags.extend(BUDGET);
        let out = dir.path().join(variant);
        let (code, report, stderr) = scan(&format!("{}/v1/infer", service.base), &body, &out, &flags);
        let anon = series(&report, "anonymous");
        let rss_metric = series(&report, "process_resident_memory_bytes");
        seen.push(format!("{variant}: exit {code}, anonymous {} {:.0} B/request, /metrics RSS {} {:.0} B/request", anon["judgement"]["verdict"], anon["judgement"]["slope"]["bytes_per_request"].as_f64().unwrap_or(0.0), rss_metric["judgement"]["verdict"], rss_metric["judgement"]["slope"]["bytes_per_request"].as_f64().unwrap_or(0.0)));
        if leaky {
            assert_eq!(code, 1, "{variant} must fail: {report}\n{stderr}");
            assert_eq!(anon["judgement"]["verdict"], "leak", "{variant} by PID");
            assert_eq!(rss_metric["judgement"]["verdict"], "leak", "{variant} by its /metrics");
        } else {
            assert_eq!(code, 0, "{variant} must pass: {report}\n{stderr}");
        }
        assert!(out.join("report.md").exists() && out.join("anonymous.svg").exists());
    }
    eprintln!("{}", seen.join("\n"));
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
        let mut flags = vec!["--pid", &pid, "--requests", "400", "--warmup", "50", "--snapshot", &snapshot];
        flags.extend(BUDGET);
        let (code, report, stderr) = scan(&format!("{}/v1/infer", service.base), &body, &dir.path().join(variant), &flags);
        assert_eq!(code, 1, "{variant} leaks tens of kB a request from outside: it must fail the budget: {report}\n{stderr}");
        let samples: Vec<serde_json::Value> = serde_json::from_str(&reqwest_get(&format!("{}/debug/memory/samples?since=100", service.base))).unwrap();
        let (first, last) = (&samples[0], &samples[samples.len() - 1]);
        let exact = (last["memory"]["cpu"]["live_bytes"].as_f64().unwrap() - first["memory"]["cpu"]["live_bytes"].as_f64().unwrap()) / (last["request"].as_f64().unwrap() - first["request"].as_f64().unwrap());
        let anon = series(&report, "anonymous")["judgement"]["slope"]["bytes_per_request"].as_f64().unwrap();
        let ratio = anon / exact;
        eprintln!("{variant}: anonymous {anon:.0} B/request from outside, exact allocator {exact:.0}: ratio {ratio:.2}");
        // From outside the process sees the tensors plus what malloc holds beside them
        // (autograd nodes, freed chunks it cannot return between kept tensors).
        assert!(ratios.contains(&ratio), "{variant}: ratio {ratio}, outside {ratios:?}");
        // The snapshots after the warm-up and at the end name the line, and what accumulated
        // between them is the exact allocator's growth.
        let held = &report["who_holds"];
        let site = held["holders"][0]["site"].as_str().unwrap_or_else(|| panic!("{variant}: no who-holds-it in {}", report["notes"]));
        // The kept tensors were born in the model's forward (a closure built in `Mlp::new`) or in
        // the cause's own file, as the issue's oracle allows.
        assert!(site.contains("crates/model/src/lib.rs:") || site.contains("crates/service/src/causes/"), "{variant}: {site}");
        let per_request = held["bytes_per_request"].as_f64().unwrap();
        assert!((per_request / exact - 1.0).abs() < 0.1, "{variant}: snapshots {per_request:.0} B/request, allocator {exact:.0}");
        let md = std::fs::read_to_string(dir.path().join(variant).join("report.md")).unwrap();
        assert!(md.contains("Who holds the memory the judged requests left live"), "{md}");
    }
}

fn reqwest_get(url: &str) -> String {
    let out = Command::new(python()).args(["-c", "import sys, urllib.request; sys.stdout.write(urllib.request.urlopen(sys.argv[1]).read().decode())", url]).output().unwrap();
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn a_real_v1_cgroup_is_read_with_its_limit() {
    let parent = Path::new("/sys/fs/cgroup/memory");
    if !parent.join("memory.usage_in_bytes").exists() {
        eprintln!("SKIPPED: no cgroup v1 memory controller at {}", parent.display());
        return;
    }
    let group = parent.join(format!("leaklab-test-{}", std::process::id()));
    if std::fs::create_dir(&group).is_err() {
        eprintln!("SKIPPED: cannot create a child cgroup (not root?)");
        return;
    }
    std::fs::write(group.join("memory.limit_in_bytes"), "2147483648").unwrap();
    let service = rust("refs-leaky");
    std::fs::write(group.join("cgroup.procs"), service.pid()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let body = body(dir.path());
    let (code, report, stderr) = scan(&format!("{}/v1/infer", service.base), &body, dir.path(), &["--cgroup", group.to_str().unwrap(), "--requests", "300", "--warmup", "30", "--rate", "50"]);
    drop(service);
    std::thread::sleep(std::time::Duration::from_millis(300));
    let _ = std::fs::remove_dir(&group);
    // Tens of kB a request at 50 a second fill 2 GiB within the hour: far inside the default week.
    assert_eq!(code, 1, "a leak that fills the cgroup within the hour must fail the scan: {report}\n{stderr}");
    let ws = series(&report, "cgroup_working_set");
    assert_eq!(ws["capacity_bytes"], 2147483648u64, "the cgroup's limit is the capacity");
    assert_eq!(ws["judgement"]["verdict"], "leak", "{ws}");
}

#[test]
fn bad_targets_get_clear_messages_and_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let body = body(dir.path());
    let me = std::process::id().to_string();
    // Nothing listens there.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let (code, _, stderr) = scan(&format!("http://{free}/v1/infer"), &body, dir.path(), &["--pid", &me]);
    assert_eq!(code, 2);
    assert!(stderr.contains("does not answer"), "{stderr}");
    // No signal, a dead PID, a cgroup that does not exist.
    let (code, _, stderr) = scan(&format!("http://{free}/"), &body, dir.path(), &[]);
    assert!(code == 2 && stderr.contains("no memory signal to watch"), "{stderr}");
    let (code, _, stderr) = scan(&format!("http://{free}/"), &body, dir.path(), &["--pid", "999999999"]);
    assert!(code == 2 && stderr.contains("gone or unreadable"), "{stderr}");
    let (code, _, stderr) = scan(&format!("http://{free}/"), &body, dir.path(), &["--cgroup", "/sys/fs/cgroup/memory/no-such-group"]);
    assert!(code == 2 && stderr.contains("not a cgroup with a memory controller"), "{stderr}");
    // A pace that no clock can keep.
    for pace in ["0", "-3", "inf", "fast"] {
        let (code, _, stderr) = scan(&format!("http://{free}/"), &body, dir.path(), &["--pid", &me, &format!("--pace={pace}")]);
        assert!(code == 2 && stderr.contains("is not a rate"), "--pace {pace}: {stderr}");
    }
    // A metrics endpoint without the series, and one that is not Prometheus text.
    let service = rust("baseline");
    let (code, _, stderr) = scan(&format!("{}/v1/infer", service.base), &body, dir.path(), &["--metrics", &format!("{}/metrics", service.base), "--series", "no_such_series"]);
    assert!(code == 2 && stderr.contains("no series `no_such_series`") && stderr.contains("leaklab_memory_bytes"), "{stderr}");
    let (code, _, stderr) = scan(&format!("{}/v1/infer", service.base), &body, dir.path(), &["--metrics", &format!("{}/debug/memory", service.base), "--series", "x"]);
    assert!(code == 2 && (stderr.contains("Prometheus text") || stderr.contains("no series")), "{stderr}");
    // A 4xx storm (a body the service refuses): the scan stops, says why, keeps its report.
    let bad = dir.path().join("bad.json");
    std::fs::write(&bad, br#"{"inputs": [[1.0, 2.0]]}"#).unwrap();
    let out = dir.path().join("storm");
    let output = leaklab().args(["scan", &format!("{}/v1/infer", service.base), "--header", "content-type: application/json", "--json", "--pid", &service.pid(), "--out"]).arg(&out).arg("--body").arg(&bad).output().unwrap();
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(output.status.code(), Some(2), "too few good answers to judge");
    assert!(report["notes"][0].as_str().unwrap().contains("were errors"), "{report}");
    assert_eq!(report["error_kinds"]["HTTP 422"].as_u64().unwrap() as usize, report["errors"].as_u64().unwrap() as usize);
    assert!(out.join("report.json").exists(), "the partial report is kept");
}

#[test]
fn a_service_that_dies_mid_scan_leaves_a_report_of_what_was_measured() {
    let dir = tempfile::tempdir().unwrap();
    let body = body(dir.path());
    let mut c = Command::new(service_exe());
    c.env("LEAKLAB_CRASH_AFTER", "refs-leaky:220").args(["serve", "--variant", "refs-leaky", "--port", "0", "--threads", "1"]);
    let service = Service::start(c);
    let out = dir.path().join("died");
    let pid = service.pid();
    let mut flags = vec!["--pid", &pid, "--requests", "400", "--warmup", "20"];
    flags.extend(BUDGET);
    let (code, report, stderr) = scan(&format!("{}/v1/infer", service.base), &body, &out, &flags);
    assert_eq!(code, 1, "the 200 judged requests before the crash show the leak: {report}\n{stderr}");
    let notes = report["notes"].to_string();
    assert!(notes.contains("stopped reading process") || notes.contains("were errors"), "{notes}");
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
    let (code, _, stderr) = scan(&format!("http://{addr}/v1/infer"), &body, dir.path(), &["--pid", &std::process::id().to_string(), "--timeout", "300ms"]);
    assert_eq!(code, 2);
    assert!(stderr.contains("does not answer") && stderr.contains("timed out"), "{stderr}");
}

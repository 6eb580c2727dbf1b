//! `leaklab scan` as a user runs it, against real services on loopback: the Python twin
//! (FastAPI + PyTorch) in one scan per variant, as a black box by PID and by its /metrics and from
//! inside by the census of the agent it mounts (and a wrong `--agent`), the Rust service by PID
//! against its own exact allocator, a real v1 cgroup, the zoo's oneDNN cause through the agent's
//! native trace, and every kind of bad target.

mod common;

use common::{
    assert_rejudged_alike, body, leaklab, python, rust, rust_faulty, skip_missing, twin, Service,
};
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

// Every twin variant scanned once, by PID, by its /metrics and from inside by the agent it
// mounts: each leaky one fails both ways and its census names the holder with its exact growth,
// each fixed one passes and its census names none. A test per variant, so the pool runs them
// side by side.
#[test]
fn the_twin_graph_leaky_fails_and_its_census_names_the_holder() {
    // The statistic keeps the input and the hidden activation (8 × 2048 × 4 B more) per
    // request, in 7 autograd nodes.
    twin_scanned(
        "graph-leaky",
        Some(Leak {
            holder: "'app'.state.pipeline.acc",
            bytes_per_request: 81_920.0,
            graph_nodes_per_request: 7,
        }),
    );
}

#[test]
fn the_twin_refs_leaky_fails_and_its_census_names_the_holder() {
    twin_scanned(
        "refs-leaky",
        Some(Leak {
            holder: "'app'.state.pipeline.history",
            bytes_per_request: 16_384.0,
            graph_nodes_per_request: 0,
        }),
    );
}

#[test]
fn the_twin_cache_leaky_fails_and_its_census_names_the_holder() {
    twin_scanned(
        "cache-leaky",
        Some(Leak {
            holder: "'app'.state.pipeline.cache",
            bytes_per_request: 16_384.0,
            graph_nodes_per_request: 0,
        }),
    );
}

#[test]
fn the_twin_graph_fixed_passes_and_its_census_names_no_holder() {
    twin_scanned("graph-fixed", None);
}

#[test]
fn the_twin_refs_fixed_passes_and_its_census_names_no_holder() {
    twin_scanned("refs-fixed", None);
}

#[test]
fn the_twin_cache_fixed_passes_and_its_census_names_no_holder() {
    twin_scanned("cache-fixed", None);
}

/// Also a wrong `--agent`, refused before any traffic, on the same twin before its scan: a
/// twin started for that alone cost 2.6 s of CPU.
#[test]
fn the_twin_baseline_passes_and_its_census_names_no_holder_and_a_wrong_agent_is_refused() {
    twin_scanned("baseline", None);
}

/// What a leaky twin variant keeps per request, as its census must read it: one request is
/// 8 rows × 512 floats (16,384 B).
struct Leak {
    /// The holder's path from the app ends with it.
    holder: &'static str,
    /// Exact: the census counts storages, not pages.
    bytes_per_request: f64,
    graph_nodes_per_request: i64,
}

/// `leaklab scan` of the twin's `variant` by PID, by its /metrics and with its agent, against
/// [`BUDGET`]: a leaky variant (given its `leak`) fails both ways and its census names that
/// holder; a fixed one passes and its census names none.
fn twin_scanned(variant: &str, leak: Option<Leak>) {
    let dir = tempfile::tempdir().unwrap();
    let body = body(dir.path());
    let service = twin(variant, &[]);
    if leak.is_none() && variant == "baseline" {
        an_agent_url_that_is_not_the_agent_is_said_before_any_traffic(&service, &body);
    }
    let (pid, metrics) = (service.pid(), format!("{}/metrics", service.base));
    let agent = format!("{}/debug/leaklab", service.base);
    // A warm-up past the fixed cache's 32 entries, so that a cache that is full counts as kept
    // state, not growth. The censuses come after the judged requests and the axis's repeats,
    // around a further quarter of the judged ones (100 requests), not sampled: they cannot move a
    // verdict. Not fewer judged requests: over 200, cache-leaky's RSS rose 8.8 MB in steps and
    // then stopped, a plateau that passed (one run of ten, 2026-12-06).
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
        "--agent",
        &agent,
    ];
    flags.extend(BUDGET);
    let out = dir.path().join(variant);
    let (code, report, stderr) = scan(&format!("{}/v1/infer", service.base), &body, &out, &flags);
    assert_rejudged_alike(&out, code, &report);
    let anon = series(&report, "anonymous");
    let rss_metric = series(&report, "process_resident_memory_bytes");
    let census = &report["census"];
    eprintln!(
        "{variant}: exit {code}, anonymous {} {:.0} B/request, /metrics RSS {} {:.0} B/request, census over {} requests grew {}",
        anon["judgement"]["verdict"],
        anon["judgement"]["slope"]["bytes_per_request"]
            .as_f64()
            .unwrap_or(0.0),
        rss_metric["judgement"]["verdict"],
        rss_metric["judgement"]["slope"]["bytes_per_request"]
            .as_f64()
            .unwrap_or(0.0),
        census["steps"],
        census["grown"]
    );
    assert!(out.join("report.md").exists() && out.join("anonymous.svg").exists());
    assert!(
        report["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().contains("uses no CUDA")),
        "{variant}: the CPU twin's agent has no CUDA snapshot: {}",
        report["notes"]
    );
    let Some(leak) = leak else {
        assert_eq!(code, 0, "{variant} must pass: {report}\n{stderr}");
        assert_eq!(
            census["grown"],
            serde_json::json!([]),
            "{variant}: {census}"
        );
        return;
    };
    assert_eq!(code, 1, "{variant} must fail: {report}\n{stderr}");
    // The looks inside must not hide the leak from outside: a census costs the service megabytes
    // that the allocator keeps and the leak then refills unseen, so the scan looks only after the
    // judged requests (judged around a census, a 7 kB-a-request leak read flat). Both series fail;
    // each read a leak, or a plateau the census showed went on: cache-leaky's pages stopped
    // growing for the last 108 of 400 judged requests while its cache grew (7 runs of 7 on
    // 2026-12-07; lab/corpus/README.md).
    for (s, how) in [(anon, "by PID"), (rss_metric, "by its /metrics")] {
        assert_eq!(s["ops"], "fail", "{variant} {how}: {s}");
        let verdict = &s["judgement"]["verdict"];
        let went_on = report["notes"].as_array().unwrap().iter().any(|n| {
            let n = n.as_str().unwrap();
            n.starts_with(s["series"].as_str().unwrap()) && n.contains("census")
        });
        assert!(
            verdict == "leak" || (verdict == "plateau" && went_on),
            "{variant} {how}: {verdict}, {}",
            report["notes"]
        );
    }
    let top = &census["grown"][0];
    let name = top["holder"]
        .as_str()
        .unwrap_or_else(|| panic!("{variant}: no holder grew: {report}"));
    assert!(name.ends_with(leak.holder), "{variant}: {name}");
    assert_eq!(
        top["bytes_per_step"].as_f64().unwrap(),
        leak.bytes_per_request,
        "{variant}: {top}"
    );
    assert_eq!(
        top["graph_nodes"].as_i64().unwrap(),
        leak.graph_nodes_per_request * census["steps"].as_i64().unwrap(),
        "{variant}: {top}"
    );
    assert_eq!(
        census["grown"].as_array().unwrap().len(),
        1,
        "{variant}: only the leak grew: {census}"
    );
    assert!(
        report["diagnosis"].as_str().unwrap().contains(leak.holder),
        "{variant}: {}",
        report["diagnosis"]
    );
}

/// A wrong `--agent` is said before any traffic: a URL that answers but is not the agent's (a
/// route of the twin that does not exist), and one where nothing listens.
fn an_agent_url_that_is_not_the_agent_is_said_before_any_traffic(service: &Service, body: &Path) {
    for (agent, said) in [
        (format!("{}/not/the/agent", service.base), "404"),
        (
            "http://127.0.0.1:9/debug/leaklab".to_string(),
            "does not answer",
        ),
    ] {
        let out = leaklab()
            .args([
                "scan",
                &format!("{}/v1/infer", service.base),
                "--pid",
                &service.pid(),
                "--agent",
                &agent,
                "--body",
            ])
            .arg(body)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{agent}: {stderr}");
        assert!(stderr.contains(said), "{agent}: {stderr}");
    }
}

#[test]
fn the_rust_service_by_pid_agrees_with_its_own_exact_allocator() {
    let dir = tempfile::tempdir().unwrap();
    let body = body(dir.path());
    // What anonymous memory keeps per request against the exact allocator, per variant. A
    // debug build of the service with a 1,000-event history, 200 judged requests, a 2-core
    // machine shared with other builds (load 3 to 9): 55 runs read graph-leaky 1.35 or 1.36
    // fifteen times, 1.61 or 1.62 thirty-six times, 1.76, 1.85 and 1.87 twice (1.346 to
    // 1.871), and refs-leaky (54) 1.02, 1.05, 1.10, 1.30 three times, 1.33 and 1.50, 1.77 to
    // 1.97 thirteen times, 2.51 to 2.78 thirty times, 3.27, 3.36 and 4.03. Where malloc
    // places each variant's tensors decides the multiple: it is malloc's, not the scan's. So
    // each bound is its range of real readings, graph-leaky's with room above its tail (four
    // of 59 at 1.76 to 1.87) and still under a scan that counts the process twice (2.7 and
    // up); both catch a unit slip (pages, kB) or the wrong process. 100 judged requests were
    // too few (graph-leaky read up to 2.18, and refs-leaky once failed to fail the budget); 400
    // read the same spread (graph-leaky 1.35 to 1.61, refs-leaky 1.66 to 3.30 in 10 runs) for
    // twice the CPU. Under one more busy loop than CI's load (2026-12-06) graph-leaky read 1.27:
    // both lower bounds are now 1.0, what anonymous memory must hold at least (the kept tensors),
    // which still fails a unit slip or the wrong process; the upper ones stay the readings'.
    for (variant, ratios) in [("graph-leaky", 1.0..2.2), ("refs-leaky", 1.0..4.1)] {
        // The history fills in the warm-up (31 alloc/free events a request), so its ring grows
        // no more in the judged requests; each live block keeps its own stack, which is all the
        // who-holds table reads. 50,000 events made each snapshot a 290 MB pickle and the test
        // cost 31 s of CPU (15 s with 1,000 events, 9 s with 200 judged requests).
        let service = common::rust_with(variant, &["--memory-history", "1000"]);
        let snapshot = format!("{}/debug/memory/snapshot", service.base);
        let pid = service.pid();
        let mut flags = vec![
            "--pid",
            &pid,
            "--requests",
            "200",
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
        // The exact allocator's growth over the judged requests (after the 50 of the warm-up).
        let samples: Vec<serde_json::Value> = serde_json::from_str(&reqwest_get(&format!(
            "{}/debug/memory/samples?since=50",
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
        // What the ratio cannot catch for refs-leaky (malloc spreads it over 1.02 to 4.03): a
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

/// The scan's first reading over the test's own just before it: 1.0211 to 1.0217 in 173
/// readings (90 runs, graph-leaky and refs-leaky: the first request's own 4.3 MB); a doubled
/// reading is 2, one in pages or kB thousands apart, another process's far off.
const LEVEL: std::ops::Range<f64> = 1.02..1.03;

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
    // 500 judged requests: the cgroup charges memory in 256 kB batches, and where consecutive
    // floor points alternate 256/512/768 kB apart the series' own noise estimate reads 0.54 to
    // 1.1 MB (2 runs in 18 here), not 64 kB. At 300 requests the tail slope's bound was then
    // ±45.8 kB against a leak of 43.7 kB a request, and one fresh-clone CI run of 29 read a
    // plateau (2026-12-06); the bound shrinks with the floor's window, to ±13.5 kB at 0.54 MB
    // here (12 runs at 500 beside a busy loop, all a leak of 31.5 to 44.5 kB a request).
    let (code, report, stderr) = scan(
        &format!("{}/v1/infer", service.base),
        &body,
        dir.path(),
        &[
            "--cgroup",
            group.to_str().unwrap(),
            "--requests",
            "500",
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
    let service = rust_faulty("refs-leaky", "LEAKLAB_CRASH_AFTER", 220);
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

/// A service that begins answering HTTP 500 part-way through the scan (its fault injection,
/// `LEAKLAB_FAIL_AFTER`): a fixed one is never passed, since what it answered before the failures
/// proved no leak and the rest is a failing service's memory; a leaky one still fails on the
/// requests answered before, with the failures in a note. On main before this rule the fixed
/// one read PASS, exit 0, with the stop in a note. The fixed twin fails after 360 requests
/// (340 judged): over its first 220, under a full test run's load, its runtime's blocking
/// threads grew 5 to 9 and their arenas read as +61.7 kB a request (2026-12-07), a false alarm
/// the judge issue owns; the scan now stops 20 errors into a failure, so the judged window is
/// the requests before it, every run.
#[test]
fn a_target_that_starts_failing_is_never_passed_and_a_leak_proven_before_still_fails() {
    let dir = tempfile::tempdir().unwrap();
    let body = body(dir.path());
    for (variant, after, code, words) in [
        ("refs-fixed", 360, 2, "no verdict from a failing target"),
        ("refs-leaky", 240, 1, "the verdict is the leak proven"),
    ] {
        let service = rust_faulty(variant, "LEAKLAB_FAIL_AFTER", after);
        let out = dir.path().join(variant);
        let pid = service.pid();
        let mut flags = vec!["--pid", &pid, "--requests", "400", "--warmup", "20"];
        flags.extend(BUDGET);
        let (got, report, stderr) =
            scan(&format!("{}/v1/infer", service.base), &body, &out, &flags);
        assert_eq!(got, code, "{variant}: {report}\n{stderr}");
        assert_rejudged_alike(&out, code, &report);
        let from = report["failing_from"].as_u64().expect("failing_from");
        assert!(
            (after as u64..after as u64 + 3).contains(&from),
            "{variant}: failing from {from}, the service fails after {after}"
        );
        let notes = report["notes"].to_string();
        assert!(
            notes.contains(&format!("the target began failing at request {from}"))
                && notes.contains(words)
                && notes.contains("the target is failing"),
            "{variant}: {notes}"
        );
        assert!(first_error(&report).contains("HTTP 500"), "{report}");
        if code == 2 {
            // Nothing of a failing target passes: no series carries an ops verdict.
            let series = report["series"].as_array().unwrap();
            assert!(series.iter().all(|s| s["ops"].is_null()), "{report}");
        }
        assert!(
            out.join("report.md").exists(),
            "the report of what was measured is kept"
        );
    }
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
        .args(["--count", "420"])
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
        // Every judged request a new shape, then half as many repeats. The repeats' bound must
        // be under half the per-input slope: idle or beside three busy loops it read 3.7-15.7 kB
        // against 312-352 kB (300 judged), but one CI run read 196 kB against 346 kB, with a
        // repeat slope of 0 ("undetermined"): 400 judged and 200 repeats narrow what such a
        // window's noise leaves (3.1 kB against 304-308 kB here), for 2 s more of CPU. A later
        // CI run still read ±228.6 kB against 298 kB, a floor wandering a few MB around a flat
        // level (it rose 1.14 MB over 180 repeats): the repeats' rise now bounds them too
        // (`NoisyJudgement::rise_high`, about three times tighter on such a floor).
        .args([
            "--requests",
            "400",
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

/// More shapes than a per-shape cache holds, cycled (the generalisation issue's conv net): the
/// zoo's shape_cache_capped leaky twin (its 4-conv net, oneDNN's and ideep's caches capped at
/// 256 entries, three primitives a shape) on a folder of 400 images of distinct sizes, as
/// nested arrays of numbers, cycled over 500 judged requests. Memory rises while the cache
/// fills, then holds as entries are evicted and made again, before the first pass ends. With
/// 240 images (until 2026-12-08) glibc's heap took its last step at request 130 to 250 (10 scans
/// by hand): in 1 of those 10, and in one fresh-clone CI run, it landed at the first pass's end,
/// where memory cannot tell churn from growth per new shape, and the scan rightly said so
/// (per new input); 400 images end the first pass well past those steps. Main
/// read "per request: ... bodies cycled: it grows on inputs already seen, so per request", no
/// line saying shapes, the owner native with no mechanism; now the axis says the shapes and the churn, and the owner's mechanism and fix
/// the cache that holds fewer than them and its knob, as likely (not traced).
#[test]
fn more_shapes_than_a_capped_cache_holds_cycled_read_as_churn() {
    let serve = concat!(env!("CARGO_MANIFEST_DIR"), "/../../lab/zoo/serve.py");
    let dir = tempfile::tempdir().unwrap();
    // Images as a client sends a tensor in JSON: 3 × H × W numbers, 400 distinct sizes of the
    // zoo's grid (16 to 71 a side) in a scattered order, so that memory an evicted entry frees
    // fits the next (in order of size, each new shape outgrew what the last freed).
    let bodies = dir.path().join("bodies");
    std::fs::create_dir(&bodies).unwrap();
    for i in 0..400usize {
        let k = i * 1009 % (56 * 56);
        let (h, w) = (16 + k / 56, 16 + k % 56);
        let image = vec![vec![vec![0.5; w]; h]; 3];
        std::fs::write(
            bodies.join(format!("{i:03}.json")),
            serde_json::to_vec(&serde_json::json!({ "image": image })).unwrap(),
        )
        .unwrap();
    }
    let mut command = Command::new(python());
    command.args([serve, "shape_cache_capped", "--variant", "leaky"]);
    let service = Service::start(command);
    let agent = format!("{}/debug/leaklab", service.base);
    let out = dir.path().join("scan");
    // The folder cycled as it is (no --vary: each body's shape is the point).
    let output = leaklab()
        .args(["scan", &format!("{}/predict", service.base), "--body"])
        .arg(&bodies)
        .args(["--pid", &service.pid(), "--agent", &agent])
        .args(["--header", "content-type: application/json"])
        .args(["--requests", "500", "--warmup", "20", "--json", "--out"])
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let report: serde_json::Value =
        serde_json::from_slice(&output.stdout).unwrap_or(serde_json::Value::Null);
    let code = output.status.code().unwrap_or(-1);
    let (axis, owner) = (&report["axis"], &report["owner"]);
    let said = format!("{axis}\n{owner}\n{stderr}");
    assert_eq!(code, 0, "a bounded cache passes: {said}");
    assert_eq!(axis["axis"], "per-request", "{said}");
    assert_eq!(axis["bounded"], true, "{said}");
    assert_eq!(axis["churn"], 400, "{said}");
    let words = axis["words"].as_str().unwrap();
    assert!(
        words.contains("400 shapes") && words.contains("(churn)"),
        "{said}"
    );
    assert_eq!(owner["owner"], "native", "{said}");
    let (mechanism, fix) = (
        owner["mechanism"].as_str().unwrap(),
        owner["fix"].as_str().unwrap(),
    );
    assert!(
        mechanism.starts_with("likely a per-shape kernel cache")
            && mechanism.contains("fewer than the 400 shapes"),
        "{mechanism}"
    );
    assert!(
        mechanism.contains("libtorch_cpu.so") && mechanism.contains("libraries loaded"),
        "the process's libraries name the cache: {mechanism}"
    );
    assert!(fix.contains("ONEDNN_PRIMITIVE_CACHE_CAPACITY"), "{fix}");
    assert_rejudged_alike(&out, code, &report);
}

/// A service of `crates/cli/python/tests/cycles_service.py` of `variant`, its agent mounted with
/// the trim probe allowed.
fn cycles(variant: &str) -> Service {
    let mut c = Command::new(python());
    c.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("python/tests/cycles_service.py"))
        .args(["--variant", variant, "--port", "0"]);
    Service::start_bound(c)
}

/// Per-request reference cycles holding 8 KiB tensors, in a service with the collector enabled
/// and a long-lived heap large enough that no full collection comes within a scan: memory climbs
/// for the whole scan, and main read it "FAIL: a leak is proven" with a fix to "stop keeping it
/// in `unreachable cycle (awaiting gc)`". With `--trim`, full collections before the warm-up and
/// after the judged requests show the growth given back: PASS, the axis `garbage`. The rules'
/// other side: the same cycles also kept in a list, and the cycles beside a native leak of 8 KiB
/// a request, keep what they keep through the collections and still fail, named as a list and
/// as native memory (the cycles' garbage not counted).
#[test]
fn cycles_the_collector_frees_pass_as_its_garbage_and_kept_ones_or_a_native_leak_beside_fail() {
    let dir = tempfile::tempdir().unwrap();
    let body = body(dir.path());
    for (variant, code, owner) in [
        ("cycles", 0, "python"),
        ("cycles-kept", 1, "python"),
        ("native", 1, "native"),
    ] {
        let s = cycles(variant);
        let out = dir.path().join(variant);
        let agent = format!("{}/debug/leaklab", s.base);
        let flags = [
            "--pid",
            &s.pid(),
            "--agent",
            &agent,
            "--trim",
            "--collect",
            "--requests",
            "600",
            "--warmup",
            "50",
        ];
        let (c, report, stderr) = scan(&format!("{}/predict", s.base), &body, &out, &flags);
        let said = format!("{variant}: {}\n{stderr}", report["axis"]);
        assert_eq!(c, code, "{said}");
        assert_eq!(
            report["owner"]["owner"], owner,
            "{said}: {}",
            report["owner"]
        );
        let kept = |name: &str| {
            let c = &report["collected"];
            (c["end"][name].as_i64().unwrap() - c["start"][name].as_i64().unwrap()) as f64
                / (c["to"].as_u64().unwrap() - c["from"].as_u64().unwrap()) as f64
        };
        match variant {
            "cycles" => {
                // Every judged series climbed, and full collections gave it back.
                assert_eq!(report["axis"]["axis"], "garbage", "{said}");
                assert!(
                    kept("anonymous") < 2_048.0,
                    "{said}: kept {} a request",
                    kept("anonymous")
                );
                assert!(
                    report["owner"]["holder"]
                        .as_str()
                        .unwrap_or("")
                        .contains("unreachable cycle"),
                    "{said}"
                );
            }
            "cycles-kept" => {
                assert_eq!(
                    report["owner"]["holder"], "cycles_service.KEPT[…].held",
                    "{said}"
                );
                assert!(
                    kept("anonymous") > 8_192.0,
                    "{said}: kept {} a request",
                    kept("anonymous")
                );
            }
            _ => {
                let words = report["owner"]["words"].as_str().unwrap();
                assert!(
                    words.contains("not the collector's garbage"),
                    "{said}: {words}"
                );
                assert!(
                    kept("anonymous") > 8_192.0,
                    "{said}: kept {} a request",
                    kept("anonymous")
                );
            }
        }
        assert_rejudged_alike(&out, c, &report);
    }
}

/// An API server that hands its inference to a worker process over a pipe, as LitServe and
/// BentoML do (crates/cli/python/tests/worker_service.py): the worker serves no HTTP and serves
/// leaklab's agent itself (`leaklab.serve_agent()`), registered in the folder the API server's
/// agent shares. Scanned through the API server's agent alone, a worker that keeps every output
/// is found in the other process and its holder named by the worker's own census: main said
/// "look inside that process: leaklab scan --pid N (its census, where it serves the agent)".
#[test]
fn a_worker_that_serves_its_own_agent_has_its_holder_named_through_the_servers_agent() {
    let dir = tempfile::tempdir().unwrap();
    let body = body(dir.path());
    for (variant, code) in [("leaky", 1), ("fixed", 0)] {
        let folder = dir.path().join(format!("workers-{variant}"));
        let mut c = Command::new(python());
        c.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("python/tests/worker_service.py"))
            .args(["--variant", variant, "--port", "0"])
            .env("LEAKLAB_WORKERS_DIR", &folder);
        let s = Service::start_bound(c);
        // The worker registers its agent within a period of its start (0.1 s).
        std::thread::sleep(std::time::Duration::from_millis(500));
        let out = dir.path().join(variant);
        let agent = format!("{}/debug/leaklab", s.base);
        let flags = [
            "--pid",
            &s.pid(),
            "--agent",
            &agent,
            "--requests",
            "300",
            "--warmup",
            "30",
        ];
        let (c, report, stderr) = scan(&format!("{}/predict", s.base), &body, &out, &flags);
        let said = format!(
            "{variant}: {}\n{}\n{stderr}",
            report["axis"], report["owner"]
        );
        assert_eq!(c, code, "{said}");
        if variant == "leaky" {
            assert_eq!(report["axis"]["axis"], "other-process", "{said}");
            assert_eq!(report["owner"]["owner"], "other-process", "{said}");
            assert_eq!(report["owner"]["holder"], "__main__.KEPT", "{said}");
            let words = report["owner"]["words"].as_str().unwrap();
            assert!(
                words.contains("whose own agent at http://127.0.0.1:"),
                "{said}"
            );
            let fix = report["owner"]["fix"].as_str().unwrap();
            assert!(
                fix.starts_with("stop keeping it in `__main__.KEPT`"),
                "{said}"
            );
        }
        assert_rejudged_alike(&out, c, &report);
    }
}

/// The servers people run, from PyPI at the versions `cargo xtask test` pins
/// (crates/cli/python/tests/servers.py, docs/servers.md), scanned through the server's own port
/// and agent alone: a leaky variant fails and `leaky` checks its report (what `said` shows on
/// failure); a fixed one passes; both re-judge alike from their evidence.
fn server_scanned(framework: &str, modules: &str, leaky: impl Fn(&serde_json::Value, &str)) {
    server_scanned_with(framework, modules, &[], &[], leaky)
}

/// [`server_scanned`] with the server's environment and the scan's flags added.
fn server_scanned_with(
    framework: &str,
    modules: &str,
    env: &[(&str, &str)],
    flags: &[&str],
    leaky: impl Fn(&serde_json::Value, &str),
) {
    let found = Command::new(python())
        .args(["-c", &format!("import {modules}")])
        .status()
        .unwrap();
    if !found.success() {
        return skip_missing(
            &format!("the {framework} server's scan test"),
            &format!("{modules} (`cargo xtask test` installs them)"),
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let body = body(dir.path());
    for (variant, code) in [("leaky", 1), ("fixed", 0)] {
        let folder = dir.path().join(format!("workers-{variant}"));
        let mut c = Command::new(python());
        c.arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("python/tests/servers.py"))
            .args([framework, "--variant", variant])
            .env("LEAKLAB_WORKERS_DIR", &folder)
            .envs(env.iter().copied());
        let s = Service::start_bound(c);
        let out = dir.path().join(variant);
        let agent = format!("{}/debug/leaklab", s.base);
        // The scan's default counts, as a user runs it: at 300 requests LitServe's workers
        // kept their 4 kB a request each within the free heap they started with (read "PASS,
        // rss plateau" once, with the census naming the holder at 8.19 kB a request).
        let pid = s.pid();
        // A fixed variant is judged against the twin's budget ([`BUDGET`]): its workers grow
        // by a few hundred bytes to a couple of kB a request under CI's load, settling or the
        // framework's own state, which no window here tells from a leak. Without a budget, any
        // growth proven fails: at the default 600 BentoML's fixed service read a leak at +1.58
        // kB a request and LitServe's at +812 B (one fresh-clone run, 2026-12-07), and over
        // 1,500 BentoML's at +478 B (the next run); alone here, over 2,400, BentoML's read a
        // plateau (+987 kB, then 96 B a request). The judge's limit (issue 47's note); under the
        // budget a fixed variant passes unless it runs out of 8 GiB within 2 days at 5 a second.
        let flags: Vec<&str> = ["--pid", &pid, "--agent", &agent]
            .into_iter()
            .chain(
                if variant == "fixed" { &BUDGET[..] } else { &[] }
                    .iter()
                    .copied(),
            )
            .chain(flags.iter().copied())
            .collect();
        let (c, report, stderr) = scan(&format!("{}/predict", s.base), &body, &out, &flags);
        let said = format!(
            "{framework} {variant}: {}\n{}\n{stderr}",
            report["axis"], report["owner"]
        );
        assert_eq!(c, code, "{said}");
        if variant == "leaky" {
            leaky(&report, &said);
        }
        assert_rejudged_alike(&out, c, &report);
    }
}

/// Two worker processes sharing one workers folder, each keeping every output it computed: the
/// owner line names the holder inside the workers, from their own censuses (main said "look
/// inside that process", or named one worker's holder under an owner line that called the
/// service flat): in the workers (the tree's axis), or summed over them where the tree read
/// the growth whole.
fn named_from_the_workers(holder: &'static str) -> impl Fn(&serde_json::Value, &str) {
    move |report, said| {
        let named = report["owner"]["holder"].as_str().unwrap_or_default();
        assert!(named.contains(holder), "{said}");
        let words = report["owner"]["words"].as_str().unwrap();
        match report["owner"]["owner"].as_str() {
            Some("other-process") => assert!(words.contains("whose own agent"), "{said}"),
            Some("python") => assert!(
                words.contains("each census taken in its own process"),
                "{said}"
            ),
            _ => panic!("{said}"),
        }
    }
}

const SERVERS: &str = "litserve, gunicorn, uvicorn_worker";

#[test]
fn litserve_inference_workers_that_keep_their_outputs_are_named_from_their_own_censuses() {
    server_scanned(
        "litserve",
        SERVERS,
        named_from_the_workers("'lit_api'.outputs"),
    );
}

#[test]
fn gunicorn_uvicorn_workers_that_keep_their_outputs_are_named_from_their_own_censuses() {
    server_scanned(
        "gunicorn",
        SERVERS,
        named_from_the_workers("servers.OUTPUTS"),
    );
}

#[test]
fn uvicorn_workers_that_keep_their_outputs_are_named_from_their_own_censuses() {
    server_scanned(
        "uvicorn",
        SERVERS,
        named_from_the_workers("servers.OUTPUTS"),
    );
}

/// BentoML with two workers, the middleware in each (`add_asgi_middleware`): the leaky service
/// keeps its outputs on the service object, named from the workers' censuses. BentoML keeps each
/// request's context (its OpenTelemetry span among it) for its traffic timeout, in the timer its
/// TimeoutMiddleware sets (`loop.call_later` captures the context): with the default 60 s, any
/// scan shorter than a minute reads the fixed service's ~5 kB a request as growth (a worker at
/// 5.1-5.5 kB a request over 600, 1,000 and 3,000 judged requests, the census holding no tensor;
/// with a 5 s timeout, PASS, plateau). Here the timeout is 1 s, so that the scan's window holds
/// the retention's plateau (the fixed service PASS, plateau, in 3 runs of 3 before this test). The Python trace is asked of the worker that grows,
/// through its own agent: through the server's port it went to the other worker, which saw none
/// of the window's requests ("no answer in time").
#[test]
fn bentoml_workers_that_keep_their_outputs_are_named_from_their_own_censuses() {
    let named = named_from_the_workers("_current_service.outputs");
    server_scanned_with(
        "bentoml",
        "bentoml",
        &[("BENTO_TIMEOUT", "1")],
        &["--python-trace"],
        |report, said| {
            named(report, said);
            let notes = report["notes"].to_string();
            assert!(
                notes.contains("the worker that grows, through its own agent"),
                "{said}\n{notes}"
            );
            assert!(
                report["python_trace"]["requests"].as_u64() > Some(0),
                "{said}\n{notes}"
            );
        },
    );
}

/// transformers generating with a GPT-2 built from a config, each prompt's `DynamicCache` kept
/// in a dict: a growth per new input, owned by Python, the holder named down to the cache's
/// layers as a user would write it; the fixed variant's 16-slot LRU passes.
#[test]
fn a_transformers_prefix_cache_is_named_down_to_its_layers() {
    server_scanned("transformers", "transformers", |report, said| {
        assert_eq!(report["axis"]["axis"], "per-new-input", "{said}");
        assert_eq!(report["owner"]["owner"], "python", "{said}");
        let named = report["owner"]["holder"].as_str().unwrap_or_default();
        assert!(
            named.contains("CACHE[") && named.contains(".layers["),
            "{said}"
        );
    });
}

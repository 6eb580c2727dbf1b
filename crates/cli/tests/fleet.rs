//! `leaklab scan --prometheus` against a real Prometheus server (Debian's `prometheus`), as a
//! fleet's team runs it: a data folder backfilled with `promtool tsdb create-blocks-from
//! openmetrics` from the synthetic fleet (every dirty pattern, 204 pods over 12 h), and a live
//! server scraping two of the lab's services on loopback while `leaklab scan` drives them.
//! Without the server (not installed and not installable) each test says SKIPPED loudly.

mod common;

use common::{body, leaklab, rust};
use leaklab_fleet::synthetic::{self, Pattern};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn installed(tool: &str) -> bool {
    Command::new(tool).arg("--version").output().is_ok_and(|o| o.status.success())
}

/// A Prometheus server on a free loopback port over `data`, killed when dropped.
struct Prometheus {
    child: Child,
    url: String,
}

impl Prometheus {
    fn start(dir: &Path, config: &str) -> Prometheus {
        Prometheus::start_with(dir, config, None)
    }

    /// With `web`, a `--web.config.file` (TLS, basic auth): the server then speaks https.
    fn start_with(dir: &Path, config: &str, web: Option<&str>) -> Prometheus {
        std::fs::write(dir.join("prometheus.yml"), config).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let log = dir.join("prometheus.log");
        let mut command = Command::new("prometheus");
        command
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--storage.tsdb.retention.time=30d");
        if let Some(web) = web {
            std::fs::write(dir.join("web.yml"), web).unwrap();
            command.arg(format!("--web.config.file={}", dir.join("web.yml").display()));
        }
        let child = command.stdout(Stdio::null()).stderr(std::fs::File::create(&log).unwrap()).spawn().unwrap();
        let scheme = if web.is_some() { "https" } else { "http" };
        let server = Prometheus { child, url: format!("{scheme}://127.0.0.1:{port}") };
        // The server says when its storage is loaded and it answers queries; reading its log
        // needs no HTTP (or TLS) client in the test.
        let deadline = Instant::now() + Duration::from_secs(60);
        while !std::fs::read_to_string(&log).unwrap_or_default().contains("Server is ready to receive web requests") {
            assert!(Instant::now() < deadline, "Prometheus not ready in 60 s: {}", std::fs::read_to_string(&log).unwrap_or_default());
            std::thread::sleep(Duration::from_millis(200));
        }
        server
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `leaklab scan --prometheus` with `args`: exit code, JSON report, stderr.
fn fleet_scan(server: &str, out: &Path, args: &[&str]) -> (i32, serde_json::Value, String) {
    let output = leaklab().args(["scan", "--prometheus", server, "--json", "--out"]).arg(out).args(args).output().unwrap();
    let report = serde_json::from_slice(&output.stdout).unwrap_or(serde_json::Value::Null);
    (output.status.code().unwrap_or(-1), report, String::from_utf8_lossy(&output.stderr).into_owned())
}

fn skip(what: &str) -> bool {
    if installed("prometheus") && installed("promtool") {
        return false;
    }
    eprintln!("SKIPPED {what}: prometheus and promtool are not installed (apt-get install prometheus; `cargo xtask test` installs it as root)");
    true
}

#[test]
fn every_pod_of_a_dirty_synthetic_fleet_gets_its_verdict_from_a_real_prometheus() {
    if skip("the fleet scan against a backfilled Prometheus") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Twelve hours ending a few minutes ago, on a whole minute: the blocks are in the past and
    // the query's end is the same instant the data was written for.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let end = (now / 60 * 60 - 300) as f64;
    let pods = synthetic::fleet(12, end, 12.0 * 3600.0, 60.0);
    assert!(pods.len() >= 200);
    std::fs::write(dir.path().join("fleet.om"), synthetic::openmetrics(&pods)).unwrap();
    let backfill = Command::new("promtool").args(["tsdb", "create-blocks-from", "openmetrics"]).arg(dir.path().join("fleet.om")).arg(dir.path().join("data")).output().unwrap();
    assert!(backfill.status.success(), "promtool backfill: {}", String::from_utf8_lossy(&backfill.stderr));
    let server = Prometheus::start(dir.path(), "global:\n  scrape_interval: 1m\n");
    let end_flag = format!("{end}");
    let common = ["--range", "12h", "--step", "60s", "--end", end_flag.as_str(), "--fail-if-oom-within", "3d"];

    let gpu = ["--query", "DCGM_FI_DEV_FB_USED", "--unit", "MiB", "--capacity-query", "DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE"];
    let host = ["--query", "container_memory_working_set_bytes{container=\"server\"}", "--capacity-query", "kube_pod_container_resource_limits{resource=\"memory\",container=\"server\"}"];
    let mut judged = 0;
    for (name, query) in [("gpu", &gpu[..]), ("host", &host[..])] {
        let out = dir.path().join(name);
        let (code, report, stderr) = fleet_scan(&server.url, &out, &[query, &common[..]].concat());
        assert_eq!(code, 1, "the seed leaks run out within 3 days: exit 1. {stderr}");
        assert_eq!(report["outcome"], "fail");
        for pod in report["pods"].as_array().unwrap() {
            let name = pod["labels"]["pod"].as_str().unwrap();
            let pattern = pods.iter().find(|p| p.name == name).unwrap_or_else(|| panic!("unknown pod {name}")).pattern;
            let (verdict, fails) = pattern.expected();
            let why = format!("{name}: {}", serde_json::to_string(&pod).unwrap().chars().take(1500).collect::<String>());
            match verdict {
                None => assert!(pod["gone"] == true && pod["ops"].is_null(), "{why}"),
                Some(v) => {
                    assert_eq!(pod["judged"]["judgement"]["verdict"], v.to_string(), "{why}");
                    let failed = matches!(pod["ops"].as_str(), Some("fail" | "likely_fail"));
                    assert_eq!(failed, fails, "{why}");
                }
            }
            if pattern == Pattern::OomRestarts {
                assert!(pod["resets"].as_array().unwrap().iter().any(|r| r["kind"] == "out_of_memory"), "{why}");
            }
            if pattern == Pattern::Gaps {
                assert!(pod["dropped"].as_u64().unwrap() > 0, "NaN samples are counted: {why}");
            }
            judged += 1;
        }
        // Most urgent first: every failing pod before every passing one.
        let ops: Vec<bool> = report["pods"].as_array().unwrap().iter().map(|p| matches!(p["ops"].as_str(), Some("fail" | "likely_fail"))).collect();
        assert!(ops.windows(2).all(|w| w[0] >= w[1]), "{ops:?}");
        assert!(out.join("report.md").exists());
    }
    assert_eq!(judged, pods.len(), "every pod came back from the server");

    // Bad input: a clear message, exit 2.
    let (code, _, stderr) = fleet_scan(&server.url, &dir.path().join("bad"), &["--query", "sum(", "--end", &end_flag]);
    assert_eq!(code, 2);
    assert!(stderr.contains("Prometheus refused"), "{stderr}");
    let (code, _, stderr) = fleet_scan("http://127.0.0.1:9", &dir.path().join("bad"), &["--query", "up", "--end", &end_flag]);
    assert_eq!(code, 2);
    assert!(stderr.contains("cannot reach Prometheus"), "{stderr}");
    let (code, report, _) = fleet_scan(&server.url, &dir.path().join("none"), &["--query", "no_such_metric", "--end", &end_flag]);
    assert_eq!(code, 2, "nothing to judge");
    assert!(report["notes"][0].as_str().unwrap().contains("matched no series"), "{report}");
}

#[test]
fn a_live_prometheus_scraping_a_leaky_and_a_fixed_service_tells_them_apart() {
    if skip("the live fleet scan") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let (leaky, fixed) = (rust("refs-leaky"), rust("refs-fixed"));
    let target = |s: &common::Service, variant: &str| format!("      - targets: ['{}']\n        labels: {{ pod: {variant} }}\n", s.base.trim_start_matches("http://"));
    let config = format!("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: leaklab\n    static_configs:\n{}{}", target(&leaky, "refs-leaky"), target(&fixed, "refs-fixed"));
    let server = Prometheus::start(dir.path(), &config);
    // Load for 90 s on both, with `leaklab scan` itself as the driver, paced: Prometheus judges
    // memory over time, so the leak must grow steadily in time. Unpaced, each driver sent as
    // fast as its service answered, and on a 2-core machine shared with other tests that rate
    // fell from 170 to 100 requests a second within one run: the floor's steps shrank by 40 %,
    // the noise read from them grew to 15 MB, and a real leak read "plateau" in a CI rehearsal.
    // 40 a second is a fraction of what either service answers there.
    let body = body(dir.path());
    let drive = |s: &common::Service, name: &str| {
        leaklab()
            .args(["scan", &format!("{}/v1/infer", s.base), "--header", "content-type: application/json", "--requests", "1000000", "--max-requests", "1000000", "--warmup", "0", "--time-limit", "90s", "--pace", "40", "--pid", &s.pid(), "--json", "--out"])
            .arg(dir.path().join(name))
            .arg("--body")
            .arg(&body)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut drivers = [drive(&leaky, "drive-leaky"), drive(&fixed, "drive-fixed")];
    for d in &mut drivers {
        let status = d.wait().unwrap();
        assert!(status.code().is_some_and(|c| c <= 1), "the load driver failed: {status}");
    }
    let end = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64().floor() - 1.0;
    let (code, report, stderr) = fleet_scan(
        &server.url,
        &dir.path().join("live"),
        &[
            "--query",
            "leaklab_memory_bytes{probe=\"cpu_allocator_live\"}",
            "--rate-query",
            "rate(leaklab_requests_total{outcome=\"ok\"}[5s])",
            "--range",
            "85s",
            "--step",
            "1s",
            "--end",
            &end.to_string(),
            "--capacity",
            "2GiB",
            "--fail-if-oom-within",
            "1d",
        ],
    );
    let pod = |name: &str| report["pods"].as_array().unwrap().iter().find(|p| p["labels"]["pod"] == name).cloned().unwrap_or_else(|| panic!("no {name} in {report} ({stderr})"));
    let (l, f) = (pod("refs-leaky"), pod("refs-fixed"));
    let slope = &l["judged"]["judgement"]["slope"];
    eprintln!("refs-leaky from Prometheus: {} B/s, bound {} to {}, {} points, {} B/request", slope["bytes_per_request"], slope["low"], slope["high"], l["points"], l["bytes_per_request"]);
    assert_eq!(l["judged"]["judgement"]["verdict"], "leak", "{l}");
    assert_eq!(l["ops"], "fail", "2 GiB runs out within a day at this rate: {l}");
    assert_ne!(f["judged"]["judgement"]["verdict"], "leak", "{f}");
    assert_eq!(code, 1, "{stderr}");
    // refs-leaky keeps each answer, 8 rows × 512 floats = 16,384 B a request on the exact gauge:
    // at 40 requests a second, 655,360 B/s, which five runs read to the byte (two of them
    // beside the scan tests). Per request is that slope over the mean of Prometheus's
    // rate(...[5s]), which reads the paced rate a little low: 16,548, 16,675, 16,584, 16,641 and
    // 16,608 B.
    let per_second = slope["bytes_per_request"].as_f64().unwrap();
    assert!((per_second / 655_360.0 - 1.0).abs() < 0.02, "{per_second} B/s, expected 40 × 16,384");
    let per_request = l["bytes_per_request"].as_f64().unwrap();
    // From just under the truth to 2 % over the highest reading.
    assert!((16_300.0..17_000.0).contains(&per_request), "{per_request} B/request, expected 16,384 (Prometheus's rate a little low)");
}

#[test]
fn a_prometheus_behind_tls_and_basic_auth_answers_with_the_right_ca_and_credentials_only() {
    if skip("the fleet scan against a TLS Prometheus") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let certs = common::tls::make(dir.path());
    // Prometheus's own basic_auth_users take bcrypt hashes (cost 4: the test's, not production's).
    let hash = bcrypt::hash("s3cr3t", 4).unwrap();
    let web = format!("tls_server_config:\n  cert_file: {}\n  key_file: {}\nbasic_auth_users:\n  alice: {hash}\n", certs.cert.display(), certs.key.display());
    let (right, wrong) = (dir.path().join("password"), dir.path().join("wrong-password"));
    std::fs::write(&right, "s3cr3t\n").unwrap();
    std::fs::write(&wrong, "guess\n").unwrap();
    // One pod of each synthetic pattern over 12 h, backfilled as in the fleet test above.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let end = (now / 60 * 60 - 300) as f64;
    let pods = synthetic::fleet(1, end, 12.0 * 3600.0, 60.0);
    std::fs::write(dir.path().join("fleet.om"), synthetic::openmetrics(&pods)).unwrap();
    let backfill = Command::new("promtool").args(["tsdb", "create-blocks-from", "openmetrics"]).arg(dir.path().join("fleet.om")).arg(dir.path().join("data")).output().unwrap();
    assert!(backfill.status.success(), "promtool backfill: {}", String::from_utf8_lossy(&backfill.stderr));
    let server = Prometheus::start_with(dir.path(), "global:\n  scrape_interval: 1m\n", Some(&web));
    assert!(server.url.starts_with("https://127.0.0.1:"));
    let end_flag = format!("{end}");
    let query = ["--query", "DCGM_FI_DEV_FB_USED", "--unit", "MiB", "--capacity-query", "DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE", "--range", "12h", "--step", "60s", "--end", &end_flag, "--fail-if-oom-within", "3d"];
    let (ca, wrong_ca) = (certs.ca.to_str().unwrap(), certs.wrong_ca.to_str().unwrap());
    let alice = format!("alice:{}", right.display());
    let (code, report, stderr) = fleet_scan(&server.url, &dir.path().join("ok"), &[&query[..], &["--ca-cert", ca, "--basic-auth", &alice]].concat());
    assert_eq!(code, 1, "the seed leak runs out within 3 days: {stderr}");
    let gpu_pods = pods.iter().filter(|p| p.pattern.is_gpu()).count();
    assert_eq!(report["pods"].as_array().unwrap().len(), gpu_pods, "every GPU pod came back over TLS: {report}");

    let refused = |args: &[&str], expected: &[&str]| {
        let (code, _, stderr) = fleet_scan(&server.url, &dir.path().join("refused"), &[&query[..], args].concat());
        assert_eq!(code, 2, "{args:?}: {stderr}");
        for e in expected {
            assert!(stderr.contains(e), "{args:?}: expected `{e}` in: {stderr}");
        }
    };
    let wrong_password = format!("alice:{}", wrong.display());
    refused(&["--ca-cert", wrong_ca, "--basic-auth", &alice], &["certificate is not trusted", "--ca-cert"]);
    refused(&["--basic-auth", &alice], &["certificate is not trusted"]);
    refused(&["--ca-cert", ca], &["401 Unauthorized", "--basic-auth USER:PASSWORD_FILE"]);
    refused(&["--ca-cert", ca, "--basic-auth", &wrong_password], &["401 Unauthorized"]);
    refused(&["--ca-cert", ca, "--basic-auth", "alice:/no/such/file"], &["cannot read the password file /no/such/file"]);
    // Plain HTTP to the TLS port: Prometheus answers 400, said as "use https://".
    let plain = server.url.replace("https://", "http://");
    let (code, _, stderr) = fleet_scan(&plain, &dir.path().join("plain"), &[&query[..], &["--basic-auth", &alice]].concat());
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("use https://"), "{stderr}");
}

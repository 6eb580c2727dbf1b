//! TLS as people make it, against a real TLS server: Prometheus (Debian's) behind its own
//! `--web.config.file`, serving certificates made by the openssl commands of Prometheus's TLS
//! guide. A self-signed certificate given with `--ca-cert` is trusted although openssl marks it
//! `CA:TRUE`; a CA-signed one as before; a wrong CA, a certificate with only a common name and
//! one for another host are refused, each with what to do. Without prometheus or openssl the
//! test fails under CI and says SKIPPED loudly elsewhere.

use leaklab_client::{describe, ClientOptions};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn installed(tool: &str, arg: &str) -> bool {
    Command::new(tool)
        .arg(arg)
        .output()
        .is_ok_and(|o| o.status.success())
}

/// True (the test returns) where a tool is missing outside CI; under CI=true, a failure.
fn skip() -> bool {
    if installed("prometheus", "--version") && installed("openssl", "version") {
        return false;
    }
    assert!(
        std::env::var("CI").is_err(),
        "prometheus and openssl are needed (apt-get install prometheus openssl)"
    );
    eprintln!(
        "SKIPPED: prometheus or openssl is not installed (apt-get install prometheus openssl)"
    );
    true
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `openssl req -x509` as the guide gives it, non-interactive: `name`.pem and `name`.key,
/// with `extra` arguments (the subjectAltName) after the subject.
fn self_signed(
    dir: &Path,
    name: &str,
    bits: &str,
    subject: &str,
    extra: &[&str],
) -> (PathBuf, PathBuf) {
    let (cert, key) = (format!("{name}.pem"), format!("{name}.key"));
    let newkey = format!("rsa:{bits}");
    let mut args = vec![
        "req", "-x509", "-newkey", &newkey, "-nodes", "-keyout", &key, "-out", &cert, "-days", "1",
        "-subj", subject,
    ];
    args.extend(extra);
    openssl(dir, &args);
    (dir.join(cert), dir.join(key))
}

/// A Prometheus serving https on a free loopback port with `cert` and `key`, killed when dropped.
struct Prometheus {
    child: Child,
    port: u16,
}

impl Prometheus {
    fn start(dir: &Path, name: &str, cert: &Path, key: &Path) -> Prometheus {
        let home = dir.join(name);
        std::fs::create_dir_all(&home).unwrap();
        std::fs::write(
            home.join("prometheus.yml"),
            "global:\n  scrape_interval: 1m\n",
        )
        .unwrap();
        std::fs::write(
            home.join("web.yml"),
            format!(
                "tls_server_config:\n  cert_file: {}\n  key_file: {}\n",
                cert.display(),
                key.display()
            ),
        )
        .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let log = home.join("prometheus.log");
        let child = Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                home.join("prometheus.yml").display()
            ))
            .arg(format!(
                "--storage.tsdb.path={}",
                home.join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg(format!(
                "--web.config.file={}",
                home.join("web.yml").display()
            ))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let server = Prometheus { child, port };
        let deadline = Instant::now() + Duration::from_secs(60);
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("Server is ready to receive web requests")
        {
            assert!(
                Instant::now() < deadline,
                "Prometheus not ready in 60 s: {}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
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

/// GET `url` through a client trusting `ca`: the status, or the failure as a user reads it.
fn get(url: &str, ca: &Path) -> Result<u16, String> {
    let client = ClientOptions {
        ca_cert: Some(ca.to_path_buf()),
        timeout: Some(Duration::from_secs(10)),
        ..Default::default()
    }
    .build()
    .unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        client
            .get(url)
            .send()
            .await
            .map(|r| r.status().as_u16())
            .map_err(|e| describe(&e))
    })
}

#[test]
fn certificates_as_people_make_them_are_trusted_and_the_wrong_ones_refused_with_what_to_do() {
    if skip() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Prometheus's guide, as written (rsa:4096), with the subject and names on the command line.
    let san = ["-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1"];
    let (guide, guide_key) = self_signed(d, "guide", "4096", "/CN=localhost", &san);
    let text = Command::new("openssl")
        .args(["x509", "-noout", "-text", "-in"])
        .arg(&guide)
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&text.stdout).contains("CA:TRUE"),
        "openssl marks its self-signed certificate a CA"
    );
    let server = Prometheus::start(d, "guide", &guide, &guide_key);
    for host in ["127.0.0.1", "localhost"] {
        let url = format!("https://{host}:{}/-/ready", server.port);
        assert_eq!(
            get(&url, &guide),
            Ok(200),
            "{url} with the certificate itself as --ca-cert"
        );
    }
    // Another self-signed certificate as the CA: not this server's, refused.
    let (other, _) = self_signed(d, "other", "2048", "/CN=localhost", &san);
    let url = format!("https://127.0.0.1:{}/-/ready", server.port);
    let refused = get(&url, &other).unwrap_err();
    assert!(refused.starts_with("the server's certificate is self-signed (a CA certificate serving as its own) and is not one --ca-cert gives"), "{refused}");
    drop(server);

    // A CA and a certificate it signed (today's case): the CA file trusts it, by any SAN name.
    let (ca, ca_key) = self_signed(d, "ca", "2048", "/CN=leaklab test CA", &[]);
    openssl(
        d,
        &[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "signed.key",
            "-out",
            "signed.csr",
            "-subj",
            "/CN=localhost",
        ],
    );
    std::fs::write(
        d.join("san.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\n",
    )
    .unwrap();
    let (ca_s, ca_key_s) = (ca.to_str().unwrap(), ca_key.to_str().unwrap());
    openssl(
        d,
        &[
            "x509",
            "-req",
            "-in",
            "signed.csr",
            "-CA",
            ca_s,
            "-CAkey",
            ca_key_s,
            "-CAcreateserial",
            "-out",
            "signed.pem",
            "-days",
            "1",
            "-extfile",
            "san.ext",
        ],
    );
    let server = Prometheus::start(d, "signed", &d.join("signed.pem"), &d.join("signed.key"));
    assert_eq!(
        get(&format!("https://localhost:{}/-/ready", server.port), &ca),
        Ok(200)
    );
    let refused = get(
        &format!("https://localhost:{}/-/ready", server.port),
        &guide,
    )
    .unwrap_err();
    assert!(
        refused.contains("certificate is not trusted"),
        "the guide's certificate is not this server's CA: {refused}"
    );
    drop(server);

    // Only a common name (the guide's command without -addext): refused, saying to add a SAN.
    let (cn_only, cn_key) = self_signed(d, "cn-only", "2048", "/CN=localhost", &[]);
    let server = Prometheus::start(d, "cn-only", &cn_only, &cn_key);
    let refused = get(
        &format!("https://localhost:{}/-/ready", server.port),
        &cn_only,
    )
    .unwrap_err();
    assert!(
        refused.starts_with("the server's certificate names no host in a subjectAltName")
            && refused.contains("-addext \"subjectAltName=DNS:localhost\""),
        "{refused}"
    );
    drop(server);

    // For another host: refused, naming the hosts it is for, even as the --ca-cert itself.
    let (elsewhere, elsewhere_key) = self_signed(
        d,
        "elsewhere",
        "2048",
        "/CN=infer.internal",
        &["-addext", "subjectAltName=DNS:infer.internal"],
    );
    let server = Prometheus::start(d, "elsewhere", &elsewhere, &elsewhere_key);
    let refused = get(
        &format!("https://127.0.0.1:{}/-/ready", server.port),
        &elsewhere,
    )
    .unwrap_err();
    assert!(
        refused.starts_with("the server's certificate is for infer.internal, not 127.0.0.1"),
        "{refused}"
    );
}

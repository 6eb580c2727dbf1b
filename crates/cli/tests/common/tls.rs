//! Certificates for tests of TLS endpoints on loopback: a CA of the test's own, a server
//! certificate it signed for 127.0.0.1 and localhost, and a second, unrelated CA (the wrong
//! one a user might give); and the self-signed one Prometheus's TLS guide makes with openssl.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, SanType};
use std::path::{Path, PathBuf};

/// PEM files written into a test folder.
pub struct Certs {
    pub ca: PathBuf,
    pub wrong_ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn ca(name: &str) -> (CertificateParams, KeyPair, String) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let pem = params.self_signed(&key).unwrap().pem();
    (params, key, pem)
}

pub fn make(dir: &Path) -> Certs {
    let (ca_params, ca_key, ca_pem) = ca("leaklab test CA");
    let (_, _, wrong_pem) = ca("some other CA");
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params
        .subject_alt_names
        .push(SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()));
    params
        .distinguished_name
        .push(DnType::CommonName, "127.0.0.1");
    let issuer = Issuer::new(ca_params, ca_key);
    let cert = params.signed_by(&key, &issuer).unwrap();
    let certs = Certs {
        ca: dir.join("ca.pem"),
        wrong_ca: dir.join("wrong-ca.pem"),
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
    };
    std::fs::write(&certs.ca, ca_pem).unwrap();
    std::fs::write(&certs.wrong_ca, wrong_pem).unwrap();
    std::fs::write(&certs.cert, cert.pem()).unwrap();
    std::fs::write(&certs.key, key.serialize_pem()).unwrap();
    certs
}

/// The certificate and key of Prometheus's TLS guide, made by its command as written
/// (`openssl req -x509 -newkey rsa:4096 -nodes …`), non-interactive: the subject and the
/// subjectAltName on the command line. openssl marks it `CA:TRUE`.
pub fn openssl_guide(dir: &Path) -> (PathBuf, PathBuf) {
    let args = [
        "req",
        "-x509",
        "-newkey",
        "rsa:4096",
        "-nodes",
        "-keyout",
        "key.pem",
        "-out",
        "cert.pem",
        "-days",
        "1",
        "-subj",
        "/CN=localhost",
        "-addext",
        "subjectAltName=DNS:localhost,IP:127.0.0.1",
    ];
    let out = std::process::Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl is installed (apt-get install openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    (dir.join("cert.pem"), dir.join("key.pem"))
}

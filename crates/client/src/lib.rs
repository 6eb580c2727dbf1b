//! The instrument's one HTTP client: what `scan` sends to a user's service (the target, its
//! `/metrics`, its snapshot and agent routes) and what the fleet scan asks Prometheus.
//!
//! Real endpoints speak TLS and need credentials: managed and in-cluster Prometheus servers
//! are HTTPS behind a bearer token or basic auth, services sit behind HTTPS ingresses. The
//! client trusts the system's roots and Mozilla's (bundled, for containers without
//! ca-certificates), plus a CA file the user names, through rustls (no OpenSSL, so the wheel's
//! binary stays portable). Secrets come from files, as Prometheus's own `bearer_token_file` and
//! `password_file` do, never from the command line where `ps` shows them.
//!
//! Failures are said as a user acts on them: an untrusted certificate names `--ca-cert`, one
//! that does not name the host says which names it holds (or that it has no subjectAltName), a
//! 401 names the credential flags ([`Error`], [`refused`]). A certificate that is exactly one
//! of `--ca-cert`'s is trusted as itself, as openssl's `req -x509` makes them ([`tls`]).

mod tls;

use base64::prelude::{Engine, BASE64_STANDARD};
use reqwest::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION};
use rustls::pki_types::{pem::PemObject, CertificateDer};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read {what} {path}: {source}")]
    Read {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} holds no PEM certificate: give the CA that signed the server's certificate, in PEM ({detail})")]
    BadCa { path: PathBuf, detail: String },
    #[error("{path} is empty: it should hold the {what}")]
    EmptySecret { what: &'static str, path: PathBuf },
    #[error("`{0}`: a header is `Name: value` with a valid name and value")]
    BadHeader(String),
    #[error("`{0}`: give basic auth as USER:PASSWORD_FILE (the password is read from the file)")]
    BadBasicAuth(String),
    #[error("cannot build the HTTP client: {0}")]
    Build(#[source] reqwest::Error),
}

pub type Result<T> = std::result::Result<T, Error>;

/// Basic auth: a user name, and the file its password is read from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BasicAuth {
    pub user: String,
    pub password_file: PathBuf,
}

impl std::str::FromStr for BasicAuth {
    type Err = Error;

    /// `USER:PASSWORD_FILE`; a user name holds no colon in basic auth, so the first one splits.
    fn from_str(s: &str) -> Result<BasicAuth> {
        match s.split_once(':') {
            Some((user, file)) if !user.is_empty() && !file.is_empty() => Ok(BasicAuth {
                user: user.to_string(),
                password_file: file.into(),
            }),
            _ => Err(Error::BadBasicAuth(s.to_string())),
        }
    }
}

/// How to reach an endpoint: its trust, its credentials, its headers, its patience.
#[derive(Debug, Clone, Default)]
pub struct ClientOptions {
    /// `Name: value` headers sent with every request.
    pub headers: Vec<(String, String)>,
    /// A file holding a bearer token (sent as `Authorization: Bearer …`).
    pub bearer_token_file: Option<PathBuf>,
    pub basic_auth: Option<BasicAuth>,
    /// A PEM file of CA certificates to trust besides the system's and Mozilla's roots.
    pub ca_cert: Option<PathBuf>,
    /// A request's longest wait (`None`: no limit).
    pub timeout: Option<Duration>,
}

/// Splits `Name: value`.
pub fn parse_header(s: &str) -> Result<(String, String)> {
    let (k, v) = s
        .split_once(':')
        .ok_or_else(|| Error::BadHeader(s.to_string()))?;
    let (k, v) = (k.trim(), v.trim());
    if HeaderName::from_bytes(k.as_bytes()).is_err() || HeaderValue::from_str(v).is_err() {
        return Err(Error::BadHeader(s.to_string()));
    }
    Ok((k.to_string(), v.to_string()))
}

fn read_secret(what: &'static str, path: &Path) -> Result<String> {
    let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
        what,
        path: path.to_path_buf(),
        source,
    })?;
    // Files written by `echo` or by Kubernetes end with a newline that is not part of the secret.
    let secret = text.trim_end_matches(['\r', '\n']).to_string();
    if secret.is_empty() {
        return Err(Error::EmptySecret {
            what,
            path: path.to_path_buf(),
        });
    }
    Ok(secret)
}

impl ClientOptions {
    /// The client, with every header and credential set on each request it sends. Secrets are
    /// read once, here: a scan is minutes long, and a missing file is said before any traffic.
    pub fn build(&self) -> Result<reqwest::Client> {
        let mut headers = HeaderMap::new();
        for (k, v) in &self.headers {
            let bad = || Error::BadHeader(format!("{k}: {v}"));
            headers.append(
                HeaderName::from_bytes(k.as_bytes()).map_err(|_| bad())?,
                HeaderValue::from_str(v).map_err(|_| bad())?,
            );
        }
        let authorization = match (&self.bearer_token_file, &self.basic_auth) {
            (Some(file), _) => Some(format!(
                "Bearer {}",
                read_secret("the bearer token file", file)?
            )),
            (None, Some(b)) => {
                let password = read_secret("the password file", &b.password_file)?;
                Some(format!(
                    "Basic {}",
                    BASE64_STANDARD.encode(format!("{}:{password}", b.user))
                ))
            }
            (None, None) => None,
        };
        if let Some(value) = authorization {
            let mut value = HeaderValue::from_str(&value)
                .map_err(|_| Error::BadHeader("Authorization: (from a file)".into()))?;
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
        }
        let mut builder = reqwest::Client::builder()
            .default_headers(headers)
            .use_rustls_tls();
        if let Some(timeout) = self.timeout {
            builder = builder.timeout(timeout);
        }
        if let Some(path) = &self.ca_cert {
            let pem = std::fs::read(path).map_err(|source| Error::Read {
                what: "the CA certificate",
                path: path.clone(),
                source,
            })?;
            let bad = |detail: String| Error::BadCa {
                path: path.clone(),
                detail,
            };
            let certs = CertificateDer::pem_slice_iter(&pem)
                .collect::<std::result::Result<Vec<_>, _>>()
                .map_err(|e| bad(e.to_string()))?;
            if certs.is_empty() {
                return Err(bad("no BEGIN CERTIFICATE block".into()));
            }
            builder = builder.use_preconfigured_tls(tls::config(certs).map_err(bad)?);
        }
        builder.build().map_err(Error::Build)
    }
}

/// A transport failure in the words a user acts on: an untrusted or mismatched certificate,
/// TLS spoken to a plain-HTTP port, a refused connection, a timeout; else the error's chain.
pub fn describe(error: &reqwest::Error) -> String {
    let mut chain = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(s) = source {
        chain.push_str(": ");
        chain.push_str(&s.to_string());
        source = s.source();
    }
    let lower = chain.to_ascii_lowercase();
    if let Some(advice) = tls::rustls_error(error).and_then(tls::advice) {
        format!("{advice} ({chain})")
    } else if lower.contains("certificate") {
        format!("the server's TLS certificate is not trusted ({chain}); give the CA that signed it with --ca-cert FILE (PEM), and check the URL's host name is one the certificate names")
    } else if lower.contains("corrupt message")
        || lower.contains("invalidcontenttype")
        || lower.contains("wrong version number")
    {
        format!("the TLS handshake failed ({chain}): is this port plain HTTP? use http:// for it")
    } else if error.is_timeout() {
        format!("no answer in time ({chain})")
    } else if error.is_connect() {
        format!("cannot connect ({chain}): is the service running and the address right?")
    } else {
        chain
    }
}

/// The message for an answer that refuses the request for want of credentials (401, 403),
/// `None` for any other status. `body` is the start of the answer, for the server's own words.
pub fn refused(url: &str, status: reqwest::StatusCode, body: &[u8]) -> Option<String> {
    let said = String::from_utf8_lossy(&body[..body.len().min(200)])
        .trim()
        .to_string();
    let said = if said.is_empty() {
        String::new()
    } else {
        format!(" ({said})")
    };
    match status.as_u16() {
        401 => Some(format!("{url} answered 401 Unauthorized{said}: give credentials with --bearer-token-file FILE, --basic-auth USER:PASSWORD_FILE or --header 'Authorization: …'")),
        403 => Some(format!("{url} answered 403 Forbidden{said}: the credentials were read but do not grant access")),
        // A plain-HTTP request to a TLS port: Go's servers (Prometheus) say so in a 400.
        400 if said.contains("HTTPS server") => Some(format!("{url} answered 400{said}: the server speaks TLS, use https://")),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_parse_and_bad_ones_say_why() {
        assert_eq!(
            parse_header("Content-Type: application/json").unwrap(),
            ("Content-Type".into(), "application/json".into())
        );
        assert!(matches!(parse_header("no colon"), Err(Error::BadHeader(_))));
        assert!(matches!(
            parse_header("bad name: x"),
            Err(Error::BadHeader(_))
        ));
        assert_eq!(
            "alice:/run/secrets/pw".parse::<BasicAuth>().unwrap(),
            BasicAuth {
                user: "alice".into(),
                password_file: "/run/secrets/pw".into()
            }
        );
        assert!(
            "alice".parse::<BasicAuth>().is_err()
                && ":file".parse::<BasicAuth>().is_err()
                && "alice:".parse::<BasicAuth>().is_err()
        );
    }

    #[test]
    fn secrets_come_from_files_without_their_newline_and_missing_ones_are_said() {
        let dir = std::env::temp_dir().join(format!("leaklab-client-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (token, empty) = (dir.join("token"), dir.join("empty"));
        std::fs::write(&token, "abc.def\n").unwrap();
        std::fs::write(&empty, "\n").unwrap();
        assert_eq!(
            read_secret("the bearer token file", &token).unwrap(),
            "abc.def"
        );
        assert!(matches!(
            read_secret("the password file", &empty),
            Err(Error::EmptySecret { .. })
        ));
        let missing = ClientOptions {
            bearer_token_file: Some(dir.join("nope")),
            ..Default::default()
        }
        .build()
        .unwrap_err();
        assert!(
            missing
                .to_string()
                .contains("cannot read the bearer token file"),
            "{missing}"
        );
        let not_pem = ClientOptions {
            ca_cert: Some(token.clone()),
            ..Default::default()
        }
        .build()
        .unwrap_err();
        assert!(matches!(not_pem, Error::BadCa { .. }), "{not_pem}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn credentials_go_out_on_every_request() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let dir = std::env::temp_dir().join(format!("leaklab-client-auth-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("pw"), "s3cr3t\n").unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        // A one-request server that echoes the request head back, over a plain socket.
        let server = std::thread::spawn(move || {
            use std::io::{Read, Write};
            let (mut s, _) = listener.accept().unwrap();
            let mut head = vec![0u8; 4096];
            let n = s.read(&mut head).unwrap();
            let head = String::from_utf8_lossy(&head[..n]).to_string();
            write!(
                s,
                "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{head}",
                head.len()
            )
            .unwrap();
        });
        let options = ClientOptions {
            headers: vec![("X-Team".into(), "infer".into())],
            basic_auth: Some(BasicAuth {
                user: "alice".into(),
                password_file: dir.join("pw"),
            }),
            ..Default::default()
        };
        let client = options.build().unwrap();
        let echoed = runtime
            .block_on(async {
                client
                    .get(format!("http://127.0.0.1:{port}/"))
                    .send()
                    .await
                    .unwrap()
                    .text()
                    .await
                    .unwrap()
            })
            .to_ascii_lowercase();
        server.join().unwrap();
        assert!(
            echoed.contains("authorization: basic ywxpy2u6cznjcjn0"),
            "{echoed}"
        );
        assert!(echoed.contains("x-team: infer"), "{echoed}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn refusals_name_the_flags() {
        let m = refused(
            "https://p:9090/api",
            reqwest::StatusCode::UNAUTHORIZED,
            b"Unauthorized\n",
        )
        .unwrap();
        assert!(
            m.contains("401") && m.contains("--basic-auth") && m.contains("--bearer-token-file"),
            "{m}"
        );
        assert!(refused("u", reqwest::StatusCode::FORBIDDEN, b"")
            .unwrap()
            .contains("403"));
        assert!(refused(
            "u",
            reqwest::StatusCode::BAD_REQUEST,
            b"Client sent an HTTP request to an HTTPS server."
        )
        .unwrap()
        .contains("https://"));
        assert!(refused("u", reqwest::StatusCode::NOT_FOUND, b"").is_none());
    }
}

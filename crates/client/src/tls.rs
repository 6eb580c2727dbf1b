//! Trust for `--ca-cert`: the system's and Mozilla's roots plus the certificates of the file,
//! checked by rustls's own verifier, with one case it refuses that people make every day.
//!
//! `openssl req -x509 -newkey rsa:4096 …`, the command Prometheus's TLS guide and most how-tos
//! give, makes a self-signed certificate marked `CA:TRUE` and serves it as its own end entity.
//! webpki refuses that (`CaUsedAsEndEntity`), while curl and Python's `ssl` accept it when the
//! same file is their CA file. So a certificate that is exactly one of the `--ca-cert`
//! certificates, byte for byte, is trusted as itself: its dates and its host name (its
//! subjectAltName) are still checked, and the handshake's signatures are verified by rustls's
//! provider functions, as for any other certificate. Any other refusal stands.

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{verify_server_name, WebPkiServerVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, WebPkiSupportedAlgorithms};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::ParsedCertificate;
use rustls::{CertificateError, DigitallySignedStruct, RootCertStore, SignatureScheme};
use std::sync::Arc;

/// rustls's verifier over the roots, and the `--ca-cert` certificates trusted as themselves.
#[derive(Debug)]
struct GivenOrWebPki {
    webpki: Arc<WebPkiServerVerifier>,
    given: Vec<CertificateDer<'static>>,
    algorithms: WebPkiSupportedAlgorithms,
}

fn ca_used_as_end_entity(error: &rustls::Error) -> bool {
    match error {
        rustls::Error::InvalidCertificate(CertificateError::Other(other)) => {
            other.0.downcast_ref::<webpki::Error>() == Some(&webpki::Error::CaUsedAsEndEntity)
        }
        _ => false,
    }
}

/// The certificate's validity period holds `now`.
fn check_dates(der: &CertificateDer<'_>, now: UnixTime) -> Result<(), rustls::Error> {
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref())
        .map_err(|_| CertificateError::BadEncoding)?;
    let now = now.as_secs() as i64;
    let validity = cert.validity();
    if now < validity.not_before.timestamp() {
        return Err(CertificateError::NotValidYet.into());
    }
    if now > validity.not_after.timestamp() {
        return Err(CertificateError::Expired.into());
    }
    Ok(())
}

impl ServerCertVerifier for GivenOrWebPki {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let verdict = self.webpki.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        );
        match verdict {
            Err(e)
                if ca_used_as_end_entity(&e)
                    && self.given.iter().any(|c| c.as_ref() == end_entity.as_ref()) =>
            {
                check_dates(end_entity, now)?;
                verify_server_name(&ParsedCertificate::try_from(end_entity)?, server_name)?;
                Ok(ServerCertVerified::assertion())
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// A client configuration that trusts the system's roots, Mozilla's and `given` (the
/// certificates of `--ca-cert`, as CAs and each as itself). `Err` says what is wrong.
pub(crate) fn config(given: Vec<CertificateDer<'static>>) -> Result<rustls::ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    // As reqwest does: a system store's unparsable entries (ancient roots) are skipped.
    roots.add_parsable_certificates(rustls_native_certs::load_native_certs().certs);
    for cert in &given {
        roots
            .add(cert.clone())
            .map_err(|e| format!("a certificate cannot be a trust anchor: {e}"))?;
    }
    let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| e.to_string())?;
    let verifier = GivenOrWebPki {
        webpki,
        given,
        algorithms: provider.signature_verification_algorithms,
    };
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(verifier))
        .with_no_client_auth();
    // reqwest sets no ALPN on a configuration it is given; it speaks HTTP/1.1 here.
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The rustls error inside a transport failure, if that is what it is.
pub(crate) fn rustls_error<'a>(
    error: &'a (dyn std::error::Error + 'static),
) -> Option<&'a rustls::Error> {
    if let Some(tls) = error.downcast_ref::<rustls::Error>() {
        return Some(tls);
    }
    // io::Error's own `source` skips the error it wraps (hyper wraps rustls's error in two).
    if let Some(inner) = error
        .downcast_ref::<std::io::Error>()
        .and_then(|io| io.get_ref())
    {
        return rustls_error(inner);
    }
    error.source().and_then(rustls_error)
}

/// What to do about a certificate that does not name the host, or a self-signed one that is
/// not the one given; `None` for any other failure.
pub(crate) fn advice(error: &rustls::Error) -> Option<String> {
    if ca_used_as_end_entity(error) {
        return Some("the server's certificate is self-signed (a CA certificate serving as its own) and is not one --ca-cert gives: give that very certificate (PEM) with --ca-cert FILE".into());
    }
    let rustls::Error::InvalidCertificate(CertificateError::NotValidForNameContext {
        expected,
        presented,
    }) = error
    else {
        return None;
    };
    let host = expected.to_str();
    Some(if presented.is_empty() {
        // Go's clients say the same since 1.15: the common name is not a host name.
        format!("the server's certificate names no host in a subjectAltName (a common name alone is not read as a host name, by rustls as by Go's clients): make it again with one, e.g. openssl req -x509 … -addext \"subjectAltName=DNS:{host}\" (or IP:… for an address)")
    } else {
        let names: Vec<&str> = presented.iter().map(|n| plain(n)).collect();
        format!("the server's certificate is for {}, not {host}: use a URL with one of those names, or a certificate whose subjectAltName holds {host}", names.join(", "))
    })
}

/// `DnsName("infer.internal")`, as webpki lists a certificate's names, as `infer.internal`.
fn plain(name: &str) -> &str {
    [("DnsName(\"", "\")"), ("IpAddress(", ")")]
        .iter()
        .find_map(|(open, close)| name.strip_prefix(open)?.strip_suffix(close))
        .unwrap_or(name)
}

//! TLS to the database, as libpq's `sslmode` and `sslrootcert` ask for it: managed servers
//! expect it, and most refuse connections without it. tokio-postgres knows only `disable`,
//! `prefer` and `require`, so the two settings are taken out of the URL (or from `PGSSLMODE`
//! and `PGSSLROOTCERT`, as libpq reads them) and the certificate checks are made here.

use std::path::PathBuf;
use std::sync::Arc;

use postgres::config::SslMode;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, CryptoProvider};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio_postgres_rustls::MakeRustlsConnect;

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("sslmode must be disable, allow, prefer, require, verify-ca or verify-full, not {0:?}")]
    Mode(String),
    #[error("cannot read the root certificates in sslrootcert {path}: {reason}")]
    RootCert { path: String, reason: String },
    #[error("{0}")]
    Config(#[from] rustls::Error),
}

/// What the server's certificate must prove.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Nothing (`prefer`, `require`): the connection is encrypted, not authenticated.
    Nothing,
    /// Signed by a trusted root (`verify-ca`).
    Chain,
    /// Signed by a trusted root and issued for the host connected to (`verify-full`).
    ChainAndName,
}

/// The TLS a database URL asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tls {
    pub mode: SslMode,
    pub check: Check,
    /// PEM certificates to trust instead of the Mozilla roots compiled in.
    pub root_cert: Option<PathBuf>,
}

/// `url` without `sslmode` and `sslrootcert`, and the TLS they (or `PGSSLMODE` and
/// `PGSSLROOTCERT`) ask for. As libpq: `prefer` unless said otherwise, and `require` with a
/// root certificate file checks the chain.
pub fn take_tls(url: &str) -> Result<(String, Tls), TlsError> {
    let (rest, mode, root_cert) = split_settings(url);
    let mode = mode.or_else(|| std::env::var("PGSSLMODE").ok()).unwrap_or_else(|| "prefer".to_string());
    let root_cert = root_cert.or_else(|| std::env::var("PGSSLROOTCERT").ok()).filter(|path| !path.is_empty());
    let (mode, check) = match mode.as_str() {
        "disable" => (SslMode::Disable, Check::Nothing),
        "allow" | "prefer" => (SslMode::Prefer, Check::Nothing),
        "require" if root_cert.is_some() => (SslMode::Require, Check::Chain),
        "require" => (SslMode::Require, Check::Nothing),
        "verify-ca" => (SslMode::Require, Check::Chain),
        "verify-full" => (SslMode::Require, Check::ChainAndName),
        _ => return Err(TlsError::Mode(mode)),
    };
    Ok((rest, Tls { mode, check, root_cert: root_cert.map(PathBuf::from) }))
}

/// Splits `sslmode` and `sslrootcert` out of a URL's query (`postgres://…?sslmode=…`) or a
/// `key=value` connection string.
fn split_settings(url: &str) -> (String, Option<String>, Option<String>) {
    let (mut mode, mut root_cert) = (None, None);
    let mut take = |key: &str, value: String| match key {
        "sslmode" => mode = Some(value),
        "sslrootcert" => root_cert = Some(value),
        _ => unreachable!(),
    };
    let is_ours = |pair: &str| matches!(pair.split_once('=').map(|(key, _)| key.trim()), Some("sslmode" | "sslrootcert"));
    let rest = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
        match url.split_once('?') {
            None => url.to_string(),
            Some((base, query)) => {
                let kept: Vec<&str> = query.split('&').filter(|pair| !is_ours(pair)).collect();
                for (key, value) in query.split('&').filter(|pair| is_ours(pair)).filter_map(|pair| pair.split_once('=')) {
                    take(key, percent_decode(value));
                }
                if kept.is_empty() {
                    base.to_string()
                } else {
                    format!("{base}?{}", kept.join("&"))
                }
            }
        }
    } else {
        let kept: Vec<&str> = url.split_whitespace().filter(|pair| !is_ours(pair)).collect();
        for (key, value) in url.split_whitespace().filter(|pair| is_ours(pair)).filter_map(|pair| pair.split_once('=')) {
            take(key.trim(), value.trim_matches('\'').to_string());
        }
        kept.join(" ")
    };
    (rest, mode, root_cert)
}

fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes.get(i + 1..i + 3).and_then(|h| std::str::from_utf8(h).ok()).and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                decoded.push(byte);
                i += 3;
            }
            (byte, _) => {
                decoded.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

/// The connector for `tls`: rustls with the checks it asks for.
pub fn connector(tls: &Tls) -> Result<MakeRustlsConnect, TlsError> {
    Ok(MakeRustlsConnect::new(client_config(tls)?))
}

/// rustls set up with the checks `tls` asks for.
pub fn client_config(tls: &Tls) -> Result<ClientConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone()).with_safe_default_protocol_versions()?;
    let config = match tls.check {
        Check::Nothing => {
            let lenient = Lenient { chain: None, provider };
            builder.dangerous().with_custom_certificate_verifier(Arc::new(lenient)).with_no_client_auth()
        }
        Check::Chain | Check::ChainAndName => {
            let roots = Arc::new(root_store(tls.root_cert.as_ref())?);
            let verifier = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
                .build()
                .map_err(|e| TlsError::Config(rustls::Error::General(e.to_string())))?;
            if tls.check == Check::Chain {
                let lenient = Lenient { chain: Some(verifier), provider };
                builder.dangerous().with_custom_certificate_verifier(Arc::new(lenient)).with_no_client_auth()
            } else {
                builder.with_webpki_verifier(verifier).with_no_client_auth()
            }
        }
    };
    Ok(config)
}

fn root_store(path: Option<&PathBuf>) -> Result<RootCertStore, TlsError> {
    let Some(path) = path else {
        return Ok(RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() });
    };
    let failed = |reason: String| TlsError::RootCert { path: path.display().to_string(), reason };
    let certificates = CertificateDer::pem_file_iter(path).map_err(|e| failed(e.to_string()))?;
    let mut roots = RootCertStore::empty();
    for certificate in certificates {
        roots.add(certificate.map_err(|e| failed(e.to_string()))?).map_err(|e| failed(e.to_string()))?;
    }
    if roots.is_empty() {
        return Err(failed("no certificate in it".to_string()));
    }
    Ok(roots)
}

/// The checks of `prefer` and `require` (no `chain`: any certificate) and of `verify-ca`
/// (the chain, not the name the certificate was issued for). The handshake's signatures are
/// checked either way.
#[derive(Debug)]
struct Lenient {
    chain: Option<Arc<WebPkiServerVerifier>>,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for Lenient {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let Some(chain) = &self.chain else {
            return Ok(ServerCertVerified::assertion());
        };
        match chain.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
            Err(rustls::Error::InvalidCertificate(CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. })) => {
                Ok(ServerCertVerified::assertion())
            }
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, signature, &self.provider.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        signature: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, signature, &self.provider.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(url: &str) -> (String, Tls) {
        take_tls(url).unwrap()
    }

    #[test]
    fn the_tls_settings_come_out_of_a_url_and_the_rest_stays() {
        let (rest, tls) = parsed("postgres://u@db.example:5432/app?application_name=x&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem");
        assert_eq!(rest, "postgres://u@db.example:5432/app?application_name=x");
        assert_eq!(tls, Tls { mode: SslMode::Require, check: Check::ChainAndName, root_cert: Some("/etc/ca.pem".into()) });
        let (rest, tls) = parsed("postgres://u@h/app?sslmode=verify-ca");
        assert_eq!((rest.as_str(), tls.check), ("postgres://u@h/app", Check::Chain));
    }

    #[test]
    fn a_connection_string_of_keys_and_values_is_split_the_same_way() {
        let (rest, tls) = parsed("host=127.0.0.1 sslmode=require dbname=app sslrootcert=/ca.pem");
        assert_eq!(rest, "host=127.0.0.1 dbname=app");
        assert_eq!((tls.mode, tls.check), (SslMode::Require, Check::Chain), "require with a root certificate checks the chain");
    }

    #[test]
    fn modes_are_libpqs() {
        assert_eq!(parsed("postgres://h/d?sslmode=disable").1.mode, SslMode::Disable);
        assert_eq!(parsed("postgres://h/d?sslmode=allow").1.mode, SslMode::Prefer);
        assert_eq!(parsed("postgres://h/d?sslmode=require").1.check, Check::Nothing);
        assert!(matches!(take_tls("postgres://h/d?sslmode=verify"), Err(TlsError::Mode(mode)) if mode == "verify"));
    }

    #[test]
    fn a_root_certificate_file_that_holds_none_is_refused() {
        let empty = std::env::temp_dir().join(format!("outbox-tls-test-{}.pem", std::process::id()));
        std::fs::write(&empty, "not a certificate\n").unwrap();
        let tls = Tls { mode: SslMode::Require, check: Check::ChainAndName, root_cert: Some(empty.clone()) };
        let error = connector(&tls).err().expect("refused").to_string();
        std::fs::remove_file(&empty).unwrap();
        assert!(error.contains("no certificate in it"), "{error}");
    }
}

//! TLS to PostgreSQL, set by the URL's `sslmode` and `sslrootcert` parameters with libpq's
//! meanings, on rustls (ring, like the server's own TLS):
//!
//! | `sslmode` | encrypted | server certificate checked |
//! |---|---|---|
//! | `disable` | never | — |
//! | `prefer` (default) | if the server offers it | no |
//! | `require` | always | no; with `sslrootcert`, as `verify-ca` (as libpq does) |
//! | `verify-ca` | always | signed by a root of `sslrootcert` |
//! | `verify-full` | always | that, and issued for the URL's host |
//!
//! `tokio-postgres` itself knows neither `verify-*` nor `sslrootcert`, so both are taken out of
//! the URL here and the verification is done by the rustls configuration.

use std::{path::PathBuf, sync::Arc};

use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
    client::{
        WebPkiServerVerifier,
        danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    },
    crypto::{CryptoProvider, verify_tls12_signature, verify_tls13_signature},
    pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject},
};
use tokio_postgres_rustls::MakeRustlsConnect;

use crate::store::StoreError;

/// libpq's `sslmode` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl SslMode {
    fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "disable" => Self::Disable,
            "prefer" => Self::Prefer,
            "require" => Self::Require,
            "verify-ca" => Self::VerifyCa,
            "verify-full" => Self::VerifyFull,
            _ => return None,
        })
    }

    /// What `tokio-postgres` is told: whether it may fall back to plain text.
    fn for_driver(self) -> &'static str {
        match self {
            Self::Disable => "disable",
            Self::Prefer => "prefer",
            Self::Require | Self::VerifyCa | Self::VerifyFull => "require",
        }
    }
}

/// The TLS settings of a database URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TlsSettings {
    pub(crate) mode: SslMode,
    pub(crate) root_cert: Option<PathBuf>,
}

/// Takes `sslmode` and `sslrootcert` out of a `postgres://` URL: the URL `tokio-postgres` can
/// parse (its `sslmode` reduced to one it knows) and the settings. A URL in `key=value` form is
/// left to `tokio-postgres` as it is (its own `sslmode` values only).
pub(crate) fn split_url(url: &str) -> Result<(String, TlsSettings), StoreError> {
    let mut settings = TlsSettings {
        mode: SslMode::Prefer,
        root_cert: None,
    };
    let is_url = url.starts_with("postgres://") || url.starts_with("postgresql://");
    let Some((base, query)) = url.split_once('?').filter(|_| is_url) else {
        return Ok((url.to_owned(), settings));
    };
    let mut kept: Vec<&str> = Vec::new();
    for pair in query.split('&').filter(|p| !p.is_empty()) {
        let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
        match key {
            "sslmode" => {
                let value = percent_decode(value);
                settings.mode = SslMode::parse(&value).ok_or_else(|| {
                    StoreError::config(format!(
                        "postgres store: the database URL is invalid: sslmode={value:?}; use \
                         disable, prefer, require, verify-ca or verify-full"
                    ))
                })?;
            }
            "sslrootcert" => settings.root_cert = Some(PathBuf::from(percent_decode(value))),
            _ => kept.push(pair),
        }
    }
    kept.push(match settings.mode.for_driver() {
        "disable" => "sslmode=disable",
        "prefer" => "sslmode=prefer",
        _ => "sslmode=require",
    });
    Ok((format!("{base}?{}", kept.join("&")), settings))
}

/// `%XX` escapes of a URL parameter, decoded (anything malformed is kept as it is).
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(high), Some(low)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((high * 16 + low) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The connector for the settings: `None` for `disable` (plain text, no TLS code involved).
pub(crate) fn connector(settings: &TlsSettings) -> Result<Option<MakeRustlsConnect>, StoreError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| StoreError::Config {
            message: format!("postgres store: TLS setup: {e}"),
            source: Some(e.into()),
        })?;
    let mode = match (settings.mode, &settings.root_cert) {
        (SslMode::Disable, _) => return Ok(None),
        // libpq: `require` with a root certificate given checks the chain, as verify-ca.
        (SslMode::Require, Some(_)) => SslMode::VerifyCa,
        (mode, _) => mode,
    };
    let config = match mode {
        SslMode::Prefer | SslMode::Require => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyCertificate(provider)))
            .with_no_client_auth(),
        SslMode::VerifyCa => {
            let inner = WebPkiServerVerifier::builder_with_provider(
                Arc::new(roots(settings, mode)?),
                provider,
            )
            .build()
            .map_err(|e| StoreError::Config {
                message: format!("postgres store: TLS setup: {e}"),
                source: Some(e.into()),
            })?;
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyName(inner)))
                .with_no_client_auth()
        }
        SslMode::VerifyFull | SslMode::Disable => builder
            .with_root_certificates(roots(settings, mode)?)
            .with_no_client_auth(),
    };
    Ok(Some(MakeRustlsConnect::new(config)))
}

/// The roots of `sslrootcert` (libpq's default `~/.postgresql/root.crt` when not given).
fn roots(settings: &TlsSettings, mode: SslMode) -> Result<RootCertStore, StoreError> {
    let path = match &settings.root_cert {
        Some(path) => path.clone(),
        None => {
            let default = std::env::var_os("HOME")
                .map(|home| PathBuf::from(home).join(".postgresql/root.crt"))
                .filter(|path| path.exists());
            default.ok_or_else(|| {
                StoreError::config(format!(
                    "postgres store: sslmode={} needs the root certificate to check the server \
                     against: add sslrootcert=/path/to/root.crt to the database URL",
                    if mode == SslMode::VerifyFull {
                        "verify-full"
                    } else {
                        "verify-ca"
                    }
                ))
            })?
        }
    };
    let certs = CertificateDer::pem_file_iter(&path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| StoreError::Config {
            message: format!(
                "postgres store: reading sslrootcert {}: {e}",
                path.display()
            ),
            source: Some(e.into()),
        })?;
    let mut roots = RootCertStore::empty();
    let (added, _ignored) = roots.add_parsable_certificates(certs);
    if added == 0 {
        return Err(StoreError::config(format!(
            "postgres store: sslrootcert {} holds no usable certificate",
            path.display()
        )));
    }
    Ok(roots)
}

/// `prefer` and `require`: encrypted, but any certificate is accepted (as with libpq). The
/// handshake's signatures are still checked, so the peer holds the certificate's key.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a trusted root; the name it was issued for is not
/// checked.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_modes_and_the_root_certificate_are_taken_out_of_the_url() {
        let (url, settings) = split_url(
            "postgres://u:secret@db.example:5433/app?application_name=x&sslmode=verify-full&sslrootcert=%2Fetc%2Fca.pem",
        )
        .unwrap();
        assert_eq!(
            url,
            "postgres://u:secret@db.example:5433/app?application_name=x&sslmode=require"
        );
        assert_eq!(settings.mode, SslMode::VerifyFull);
        assert_eq!(settings.root_cert, Some(PathBuf::from("/etc/ca.pem")));
    }

    #[test]
    fn a_url_without_sslmode_prefers_tls_as_libpq_does() {
        let (url, settings) = split_url("postgres://postgres@127.0.0.1:5432/test").unwrap();
        assert_eq!(url, "postgres://postgres@127.0.0.1:5432/test");
        assert_eq!(settings.mode, SslMode::Prefer);
        let (url, settings) = split_url("postgres://h/db?sslmode=disable").unwrap();
        assert_eq!(url, "postgres://h/db?sslmode=disable");
        assert_eq!(settings.mode, SslMode::Disable);
    }

    #[test]
    fn an_unknown_sslmode_is_refused_without_quoting_the_url() {
        let error = split_url("postgres://u:secret@h/db?sslmode=sometimes").unwrap_err();
        let text = error.to_string();
        assert!(text.contains("sometimes"), "{text}");
        assert!(!text.contains("secret"), "{text}");
    }

    #[test]
    fn verify_full_without_a_root_certificate_says_what_to_add() {
        let settings = TlsSettings {
            mode: SslMode::VerifyFull,
            root_cert: Some(PathBuf::from("/nonexistent/root.crt")),
        };
        let error = connector(&settings).err().expect("refused");
        assert!(
            error.to_string().contains("/nonexistent/root.crt"),
            "{error}"
        );
    }
}

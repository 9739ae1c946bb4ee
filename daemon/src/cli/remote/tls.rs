//! Whom `acpd connect --url` trusts: the webpki roots by default, only the certificates of
//! `--ca FILE`, or exactly one leaf certificate pinned by `--fingerprint` (for a self-signed
//! server, as SSH pins a host key). There is no way to skip verification: a pinned certificate
//! still has to sign the handshake, so a copy of the certificate alone does not pass.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::{
    CertificateError, ClientConfig, DigitallySignedStruct, OtherError, RootCertStore,
    SignatureScheme,
};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use sha2::{Digest, Sha256};

use super::RemoteError;

/// The SHA-256 of a certificate's DER: what `openssl x509 -noout -fingerprint -sha256` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fingerprint([u8; 32]);

impl Fingerprint {
    pub(super) fn of(cert: &CertificateDer<'_>) -> Self {
        Fingerprint(Sha256::digest(cert.as_ref()).into())
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SHA256:")?;
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl FromStr for Fingerprint {
    type Err = String;

    /// `SHA256:<hex>`, bare hex, or hex in colon-separated pairs, any case; openssl's whole
    /// `sha256 Fingerprint=AB:CD:…` line too.
    fn from_str(text: &str) -> Result<Self, String> {
        let text = text.trim();
        let text = text.rsplit_once('=').map_or(text, |(_, value)| value);
        let hex = match text.split_once(':') {
            Some((algo, rest)) if algo.eq_ignore_ascii_case("sha256") => rest,
            _ => text,
        };
        let digits: Vec<u8> = hex.bytes().filter(|&b| b != b':').collect();
        let wrong = || {
            format!(
                "{text:?} is not a SHA-256 fingerprint: expected SHA256: and 64 hex digits (colons \
                 allowed), as `openssl x509 -noout -fingerprint -sha256 -in cert.pem` prints it"
            )
        };
        if digits.len() != 64 {
            return Err(wrong());
        }
        let mut out = [0u8; 32];
        for (byte, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
            let pair = std::str::from_utf8(pair).map_err(|_| wrong())?;
            *byte = u8::from_str_radix(pair, 16).map_err(|_| wrong())?;
        }
        Ok(Fingerprint(out))
    }
}

/// What the server's certificate is checked against.
#[derive(Debug, Clone)]
pub(super) enum Trust {
    /// The Mozilla roots webpki-roots ships (a public CA, Let's Encrypt and the like).
    PublicRoots,
    /// Only the certificates in this PEM file (a private CA, or the server's own certificate).
    Ca(PathBuf),
    /// Only the leaf certificate with this fingerprint, whatever its name or dates.
    Pinned(Fingerprint),
}

/// The rustls client configuration for `trust`, offering HTTP/1.1 alone (the WebSocket
/// upgrade is an HTTP/1.1 exchange; a server that also speaks h2 must not pick it).
pub(super) fn client_config(trust: &Trust) -> Result<Arc<ClientConfig>, RemoteError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| RemoteError::TlsSetup(e.to_string()))?;
    let verifier: Arc<dyn ServerCertVerifier> = match trust {
        Trust::PublicRoots => {
            let mut roots = RootCertStore::empty();
            roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
            Noting::over(roots, &provider)?
        }
        Trust::Ca(path) => Noting::over(ca_roots(path)?, &provider)?,
        Trust::Pinned(expected) => Arc::new(Pinned {
            expected: *expected,
            algorithms: provider.signature_verification_algorithms,
        }),
    };
    let mut config = builder
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The most a `--ca` file may hold (a whole system bundle is about 200 KiB).
const CA_FILE_MAX: u64 = 4 << 20;

/// The certificates of a `--ca` PEM file, as the only roots.
fn ca_roots(path: &Path) -> Result<RootCertStore, RemoteError> {
    let bad = |why: String| RemoteError::CaFile {
        path: path.to_path_buf(),
        why,
    };
    let (pem, _) = super::read_regular(path, CA_FILE_MAX).map_err(|e| bad(e.to_string()))?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.map_err(|e| bad(format!("it is not valid PEM ({e})")))?;
        roots
            .add(cert)
            .map_err(|e| bad(format!("a certificate in it is not usable as a root ({e})")))?;
    }
    if roots.is_empty() {
        return Err(bad(
            "it holds no PEM certificate (-----BEGIN CERTIFICATE-----)".into(),
        ));
    }
    Ok(roots)
}

/// Why a certificate was refused, with what the user needs to act on it; carried through
/// rustls as [`CertificateError::Other`] and recovered by [`refusal`].
#[derive(Debug, thiserror::Error)]
pub(super) enum Refusal {
    #[error(
        "fingerprint mismatch: --fingerprint expects {expected} but the server presented \
         {seen}; if its certificate was replaced on purpose, pin the new one, otherwise \
         something between here and the server is intercepting the connection"
    )]
    Mismatch {
        expected: Fingerprint,
        seen: Fingerprint,
    },
    #[error(
        "its certificate ({seen}) is not signed by a CA trusted here (unknown issuer); pass \
         --ca FILE with its CA (or the server's own certificate), or --fingerprint {seen} once \
         you have checked that fingerprint on the server (`openssl x509 -noout -fingerprint \
         -sha256 -in cert.pem`)"
    )]
    UnknownIssuer { seen: Fingerprint },
}

fn refused(refusal: Refusal) -> rustls::Error {
    rustls::Error::InvalidCertificate(CertificateError::Other(OtherError(Arc::new(refusal))))
}

/// The reason a handshake failed, in the words a user can act on.
pub(super) fn refusal(error: &rustls::Error, host: &str) -> String {
    use CertificateError as C;
    match error {
        rustls::Error::InvalidCertificate(C::Other(other)) => {
            match other.0.downcast_ref::<Refusal>() {
                Some(r) => r.to_string(),
                None => error.to_string(),
            }
        }
        rustls::Error::InvalidCertificate(
            C::NotValidForName | C::NotValidForNameContext { .. },
        ) => {
            format!(
                "its certificate is not valid for {host} ({error}); put a name the certificate \
                 holds in --url, or pin it with --fingerprint"
            )
        }
        rustls::Error::InvalidCertificate(C::Expired | C::ExpiredContext { .. }) => format!(
            "its certificate has expired ({error}); renew the server's tls_cert (then `acpd \
             reload` there)"
        ),
        rustls::Error::InvalidMessage(_) => format!(
            "what answered is not speaking TLS ({error}); is it a plain http:// listener? then \
             the URL is http://127.0.0.1:PORT (plain HTTP is for this machine only)"
        ),
        other => other.to_string(),
    }
}

/// The webpki verifier, with the presented certificate's fingerprint added to an
/// unknown-issuer refusal (what the user checks on the server before pinning it).
#[derive(Debug)]
struct Noting(Arc<WebPkiServerVerifier>);

impl Noting {
    fn over(
        roots: RootCertStore,
        provider: &Arc<CryptoProvider>,
    ) -> Result<Arc<dyn ServerCertVerifier>, RemoteError> {
        let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
            .build()
            .map_err(|e| RemoteError::TlsSetup(e.to_string()))?;
        Ok(Arc::new(Noting(inner)))
    }
}

impl ServerCertVerifier for Noting {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
            .map_err(|e| match e {
                rustls::Error::InvalidCertificate(CertificateError::UnknownIssuer) => {
                    refused(Refusal::UnknownIssuer {
                        seen: Fingerprint::of(end_entity),
                    })
                }
                other => other,
            })
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

/// Accepts exactly the leaf certificate with the pinned fingerprint (its name and dates are
/// not looked at: the pin is the identity), and still checks the handshake's signature with
/// that certificate's key, so only the holder of its private key passes.
#[derive(Debug)]
struct Pinned {
    expected: Fingerprint,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for Pinned {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let seen = Fingerprint::of(end_entity);
        if seen == self.expected {
            Ok(ServerCertVerified::assertion())
        } else {
            Err(refused(Refusal::Mismatch {
                expected: self.expected,
                seen,
            }))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::Fingerprint;

    #[test]
    fn a_fingerprint_is_read_in_each_form_openssl_and_acpd_print() {
        let hex = "00112233445566778899aabbccddeeff00112233445566778899AABBCCDDEEFF";
        let colons: Vec<String> = hex
            .as_bytes()
            .chunks(2)
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect();
        let forms = [
            format!("SHA256:{hex}"),
            format!("sha256:{}", colons.join(":")),
            hex.to_string(),
            colons.join(":"),
            format!("sha256 Fingerprint={}", colons.join(":")),
        ];
        let first: Fingerprint = forms[0].parse().unwrap_or_else(|e| panic!("{e}"));
        for form in &forms {
            assert_eq!(form.parse::<Fingerprint>(), Ok(first), "{form}");
        }
        assert_eq!(first.to_string(), format!("SHA256:{}", hex.to_lowercase()));
        for bad in [
            "SHA256:00",
            "SHA1:00112233",
            &format!("{}zz", &hex[..62]),
            "",
        ] {
            assert!(bad.parse::<Fingerprint>().is_err(), "{bad}");
        }
    }
}

//! The face's TLS: rustls with the certificate chain and key from `tls_cert`/`tls_key` (or
//! systemd's `LoadCredential=` files), ALPN for HTTP/2 and HTTP/1.1, and a reload (SIGHUP,
//! `acpd reload`) that puts a renewed certificate in force for new connections while a bad
//! file keeps the one in use.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::ServerConfig;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::config::network::NetworkConfig;

#[derive(Debug, thiserror::Error)]
pub(crate) enum TlsError {
    #[error(
        "an https listener needs a certificate: set tls_cert and tls_key in the config (PEM \
         files), or pass them as systemd credentials named tls_cert and tls_key \
         (LoadCredential=)"
    )]
    NoCertificate,
    #[error("cannot read the TLS certificate {}: {reason}; check tls_cert", path.display())]
    Cert { path: PathBuf, reason: String },
    #[error("cannot read the TLS key {}: {reason}; check tls_key", path.display())]
    Key { path: PathBuf, reason: String },
    #[error(
        "the TLS key {} may be read by other users (mode {mode:04o}); run `chmod 600 {}`",
        path.display(), path.display()
    )]
    KeyReadable { path: PathBuf, mode: u32 },
    #[error("the TLS certificate {} and key {} do not go together: {reason}", cert.display(), key.display())]
    Mismatch {
        cert: PathBuf,
        key: PathBuf,
        reason: String,
    },
}

/// Where the certificate and key are read from: the config, else systemd's credentials.
pub(crate) fn files(net: &NetworkConfig) -> Result<(PathBuf, PathBuf), TlsError> {
    if let (Some(cert), Some(key)) = (&net.tls_cert, &net.tls_key) {
        return Ok((cert.clone(), key.clone()));
    }
    let dir = std::env::var_os("CREDENTIALS_DIRECTORY")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .ok_or(TlsError::NoCertificate)?;
    let (cert, key) = (dir.join("tls_cert"), dir.join("tls_key"));
    if cert.exists() && key.exists() {
        Ok((cert, key))
    } else {
        Err(TlsError::NoCertificate)
    }
}

/// A rustls server config from PEM files.
pub(crate) fn load(cert: &Path, key: &Path) -> Result<Arc<ServerConfig>, TlsError> {
    use std::os::unix::fs::MetadataExt;
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<_, _>>())
        .map_err(|e| TlsError::Cert {
            path: cert.to_path_buf(),
            reason: e.to_string(),
        })?;
    if chain.is_empty() {
        return Err(TlsError::Cert {
            path: cert.to_path_buf(),
            reason: "it holds no PEM CERTIFICATE block".into(),
        });
    }
    let meta = std::fs::metadata(key).map_err(|e| TlsError::Key {
        path: key.to_path_buf(),
        reason: e.to_string(),
    })?;
    // A key others may read is a key others may have: refused as sshd refuses such a host key.
    // Credentials systemd passes are the service's own (mode 0400 under a private directory).
    if meta.mode() & 0o077 != 0 {
        return Err(TlsError::KeyReadable {
            path: key.to_path_buf(),
            mode: meta.mode() & 0o7777,
        });
    }
    let private = PrivateKeyDer::from_pem_file(key).map_err(|e| TlsError::Key {
        path: key.to_path_buf(),
        reason: e.to_string(),
    })?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Mismatch {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            reason: e.to_string(),
        })?
        .with_no_client_auth()
        .with_single_cert(chain, private)
        .map_err(|e| TlsError::Mismatch {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
            reason: e.to_string(),
        })?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// The server config in force, swapped by a reload.
pub(crate) struct Certificates {
    current: RwLock<Arc<ServerConfig>>,
}

impl Certificates {
    pub(crate) fn new(config: Arc<ServerConfig>) -> Arc<Certificates> {
        Arc::new(Certificates {
            current: RwLock::new(config),
        })
    }

    pub(crate) fn current(&self) -> Arc<ServerConfig> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Reads the files again; a failure is logged and the certificate in use is kept.
    pub(crate) fn reload(&self, net: &NetworkConfig) {
        match files(net).and_then(|(cert, key)| load(&cert, &key)) {
            Ok(config) => {
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = config;
                tracing::info!("TLS certificate reloaded");
            }
            Err(e) => {
                tracing::error!("TLS certificate reload rejected, keeping the one in use: {e}")
            }
        }
    }
}

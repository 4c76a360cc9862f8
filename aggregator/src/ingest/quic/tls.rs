//! The listener's TLS: its certificate (configured, or the development identity's, signed for
//! this host under the data directory by `identity`), TLS 1.3 only, and the verifier of
//! agents' client certificates.

use std::path::Path;
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use smolder_common::wire::ALPN;

use super::{QuicConfig, QuicError};
use crate::identity;

fn pem(path: &Path, source: rustls::pki_types::pem::Error) -> QuicError {
    QuicError::Pem {
        path: path.to_owned(),
        reason: source.to_string(),
    }
}

fn tls(source: rustls::Error) -> QuicError {
    QuicError::Tls {
        reason: source.to_string(),
    }
}

/// Reads every certificate of a PEM file.
pub(crate) fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, QuicError> {
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|err| pem(path, err))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| pem(path, err))?;
    if certs.is_empty() {
        return Err(QuicError::Pem {
            path: path.to_owned(),
            reason: "no CERTIFICATE block".to_owned(),
        });
    }
    Ok(certs)
}

/// Builds the server's TLS configuration, with the development identity under `data_dir` (its
/// certificate signed for this host) when the config names none.
pub(crate) fn server_config(
    config: &QuicConfig,
    data_dir: &Path,
) -> Result<rustls::ServerConfig, QuicError> {
    let (cert_path, key_path) = match (&config.cert, &config.key) {
        (Some(cert), Some(key)) => (cert.clone(), key.clone()),
        (None, None) => identity::server_identity(data_dir, config.listen.ip())?,
        _ => return Err(QuicError::HalfIdentity),
    };
    let certs = load_certs(&cert_path)?;
    let key = PrivateKeyDer::from_pem_file(&key_path).map_err(|err| pem(&key_path, err))?;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(tls)?;
    let builder = match &config.client_ca {
        Some(path) => {
            let mut roots = RootCertStore::empty();
            for cert in load_certs(path)? {
                roots.add(cert).map_err(tls)?;
            }
            // Unauthenticated clients still get through the handshake so that token agents
            // work beside certificate agents; the hello decides.
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .allow_unauthenticated()
                .build()
                .map_err(|err| QuicError::Tls {
                    reason: err.to_string(),
                })?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    let mut server = builder.with_single_cert(certs, key).map_err(tls)?;
    server.alpn_protocols = vec![ALPN.to_vec()];
    Ok(server)
}

/// Checks the files `config` names as [`server_config`] reads them, creating nothing: the
/// certificate with its key (and that they belong together) and the client CA.
pub(crate) fn check_files(config: &QuicConfig) -> Result<(), QuicError> {
    match (&config.cert, &config.key) {
        (Some(cert), Some(key_path)) => {
            let certs = load_certs(cert)?;
            let key = PrivateKeyDer::from_pem_file(key_path).map_err(|err| pem(key_path, err))?;
            let provider = Arc::new(rustls::crypto::ring::default_provider());
            rustls::ServerConfig::builder_with_provider(provider)
                .with_protocol_versions(&[&rustls::version::TLS13])
                .map_err(tls)?
                .with_no_client_auth()
                .with_single_cert(certs, key)
                .map_err(tls)?;
        }
        (None, None) => {}
        _ => return Err(QuicError::HalfIdentity),
    }
    if let Some(path) = &config.client_ca {
        load_certs(path)?;
    }
    Ok(())
}

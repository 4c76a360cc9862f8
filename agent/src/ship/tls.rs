//! The shipper's TLS: the CA it trusts the aggregator by, and its client certificate if any.

use std::path::Path;
use std::sync::Arc;

use quinn::crypto::rustls::QuicClientConfig;
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use smolder_common::wire::ALPN;

use super::{ShipConfig, ShipError};

fn pem(path: &Path, err: impl std::fmt::Display) -> ShipError {
    ShipError::Tls {
        reason: format!("{}: {err}", path.display()),
    }
}

/// Builds the QUIC client configuration from `ship.ca` and `ship.client-cert`/`client-key`.
///
/// # Errors
///
/// [`ShipError::Tls`] naming the file at fault.
pub(super) fn client_config(config: &ShipConfig) -> Result<quinn::ClientConfig, ShipError> {
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(&config.ca)
        .map_err(|err| pem(&config.ca, err))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| pem(&config.ca, err))?;
    if certs.is_empty() {
        return Err(pem(&config.ca, "no CERTIFICATE block (ship.ca)"));
    }
    for cert in certs {
        roots.add(cert).map_err(|err| pem(&config.ca, err))?;
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|err| ShipError::Tls {
            reason: err.to_string(),
        })?
        .with_root_certificates(roots);
    let mut tls = match (&config.client_cert, &config.client_key) {
        (Some(cert), Some(key)) => {
            let chain = CertificateDer::pem_file_iter(cert)
                .map_err(|err| pem(cert, err))?
                .collect::<Result<Vec<_>, _>>()
                .map_err(|err| pem(cert, err))?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|err| pem(key, err))?;
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|err| ShipError::Tls {
                    reason: format!("client certificate: {err}"),
                })?
        }
        (None, None) => builder.with_no_client_auth(),
        _ => {
            return Err(ShipError::Tls {
                reason: "ship.client-cert and ship.client-key must be set together".to_owned(),
            });
        }
    };
    tls.alpn_protocols = vec![ALPN.to_vec()];
    let quic = QuicClientConfig::try_from(tls).map_err(|err| ShipError::Tls {
        reason: err.to_string(),
    })?;
    Ok(quinn::ClientConfig::new(Arc::new(quic)))
}

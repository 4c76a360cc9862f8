//! The listener's TLS: its certificate (configured, or a development identity generated into
//! the data directory), TLS 1.3 only, and the verifier of agents' client certificates.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use smolder_common::wire::ALPN;
use tracing::info;

use super::{QuicConfig, QuicError};
use crate::tenant::Tenant;

/// Where the development identity lives, under the data directory.
const DEV_DIR: &str = "tls";
/// The development CA's certificate: what agents trust.
const DEV_CA: &str = "ca.pem";
/// The development server certificate, signed by the development CA.
const DEV_CERT: &str = "server.pem";
/// Its private key.
const DEV_KEY: &str = "server.key";
/// The token agents present when no tokens and no client CA are configured.
const DEV_TOKEN: &str = "agent-token";

/// What the listener authenticates agents with.
pub(crate) struct Credentials {
    /// Tokens accepted in a hello, each with the tenant its agents ship for.
    pub(crate) tokens: Vec<(String, Tenant)>,
    /// Whether a client CA is configured, so that a verified client certificate suffices.
    pub(crate) client_ca: bool,
}

fn io(path: &Path, source: std::io::Error) -> QuicError {
    QuicError::Io {
        path: path.to_owned(),
        source,
    }
}

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

/// Builds the server's TLS configuration and says how agents authenticate, creating the
/// development identity (and token) under `data_dir` when the config names none.
pub(crate) fn server_config(
    config: &QuicConfig,
    data_dir: &Path,
) -> Result<(rustls::ServerConfig, Credentials), QuicError> {
    let (cert_path, key_path) = match (&config.cert, &config.key) {
        (Some(cert), Some(key)) => (cert.clone(), key.clone()),
        (None, None) => dev_identity(data_dir)?,
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

    let mut tokens = config.token_tenants()?;
    if tokens.is_empty() && config.client_ca.is_none() {
        tokens.push((dev_token(data_dir)?, Tenant::anonymous()));
    }
    Ok((
        server,
        Credentials {
            tokens,
            client_ca: config.client_ca.is_some(),
        },
    ))
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

/// The development CA and server certificate, created on first use.
fn dev_identity(data_dir: &Path) -> Result<(PathBuf, PathBuf), QuicError> {
    let dir = data_dir.join(DEV_DIR);
    let (ca, cert, key) = (dir.join(DEV_CA), dir.join(DEV_CERT), dir.join(DEV_KEY));
    if !(ca.exists() && cert.exists() && key.exists()) {
        std::fs::create_dir_all(&dir).map_err(|err| io(&dir, err))?;
        let generated = generate_dev_identity().map_err(|err| QuicError::Generate {
            reason: err.to_string(),
        })?;
        write_private(&key, generated.key.as_bytes())?;
        write_file(&cert, generated.cert.as_bytes())?;
        // The CA goes last: its presence is what says the identity is complete.
        write_file(&ca, generated.ca.as_bytes())?;
        info!(ca = %ca.display(), "generated a development CA and server certificate");
    }
    info!(
        ca = %ca.display(),
        "QUIC ingest uses the development TLS identity; agents verify the aggregator with this CA (ship.ca)"
    );
    Ok((cert, key))
}

struct DevIdentity {
    ca: String,
    cert: String,
    key: String,
}

/// A CA (its key is not kept: it signs this one certificate) and a server certificate for
/// `localhost`, `127.0.0.1`, `::1` and this host's name.
fn generate_dev_identity() -> Result<DevIdentity, rcgen::Error> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "Smolder development CA");
    let ca = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca_params, ca_key);

    let mut names = vec![
        "localhost".to_owned(),
        "127.0.0.1".to_owned(),
        "::1".to_owned(),
    ];
    if let Ok(host) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        let host = host.trim();
        if !host.is_empty() && host != "localhost" {
            names.push(host.to_owned());
        }
    }
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(names)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "Smolder aggregator (development)");
    let cert = params.signed_by(&key, &issuer)?;
    Ok(DevIdentity {
        ca: ca.pem(),
        cert: cert.pem(),
        key: key.serialize_pem(),
    })
}

/// The development agent token, created on first use.
fn dev_token(data_dir: &Path) -> Result<String, QuicError> {
    let dir = data_dir.join(DEV_DIR);
    let path = dir.join(DEV_TOKEN);
    match std::fs::read_to_string(&path) {
        Ok(token) if !token.trim().is_empty() => {
            info!(token_file = %path.display(), "agents authenticate with the development token (ship.token-file)");
            return Ok(token.trim().to_owned());
        }
        Ok(_) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(io(&path, err)),
    }
    std::fs::create_dir_all(&dir).map_err(|err| io(&dir, err))?;
    let bytes: [u8; 24] = rand::random();
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    write_private(&path, format!("{token}\n").as_bytes())?;
    info!(token_file = %path.display(), "generated a development agent token (ship.token-file)");
    Ok(token)
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), QuicError> {
    std::fs::write(path, bytes).map_err(|err| io(path, err))
}

/// Writes a secret readable by its owner only.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), QuicError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|err| io(path, err))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|err| io(path, err))
}

//! HTTPS: the listener's certificate and key, read from PEM files and read again when they
//! change, so that a renewed certificate is served without a restart.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use tokio_rustls::TlsAcceptor;
use tracing::{info, warn};

/// How often the files' modification times are looked at, at most: on a handshake, never in
/// the background.
const RELOAD_CHECK: Duration = Duration::from_secs(10);

/// The TLS side of the listener.
pub(super) struct Acceptor {
    acceptor: TlsAcceptor,
}

impl Acceptor {
    /// Reads `cert` and `key` and builds the server configuration: TLS 1.2 and 1.3, ALPN `h2`
    /// then `http/1.1`.
    ///
    /// # Errors
    ///
    /// A file missing or not PEM of its kind, or a key that is not the certificate's.
    pub(super) fn load(cert: &Path, key: &Path) -> anyhow::Result<Acceptor> {
        let resolver = Reloading::new(cert, key)?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .context("choosing the TLS versions")?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(resolver));
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        Ok(Acceptor {
            acceptor: TlsAcceptor::from(Arc::new(config)),
        })
    }

    /// The acceptor a connection's handshake runs through.
    pub(super) fn acceptor(&self) -> TlsAcceptor {
        self.acceptor.clone()
    }
}

/// Serves the certificate of the files as they were at the last look, looking again at most
/// every [`RELOAD_CHECK`]; a file that no longer reads keeps the last good identity (and says
/// so in the log).
struct Reloading {
    cert: PathBuf,
    key: PathBuf,
    /// Held for a look at the files' times (and a reload when they changed), never across I/O
    /// other than those reads.
    state: Mutex<State>,
}

struct State {
    identity: Arc<CertifiedKey>,
    stamp: (Option<SystemTime>, Option<SystemTime>),
    checked: Instant,
}

impl fmt::Debug for Reloading {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reloading")
            .field("cert", &self.cert)
            .field("key", &self.key)
            .finish_non_exhaustive()
    }
}

impl Reloading {
    fn new(cert: &Path, key: &Path) -> anyhow::Result<Reloading> {
        let stamp = stamp(cert, key);
        let identity = read_identity(cert, key)?;
        Ok(Reloading {
            cert: cert.to_owned(),
            key: key.to_owned(),
            state: Mutex::new(State {
                identity,
                stamp,
                checked: Instant::now(),
            }),
        })
    }
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut state = self
            .state
            .lock()
            .expect("TLS identity lock: held for a look at two files");
        if state.checked.elapsed() >= RELOAD_CHECK {
            state.checked = Instant::now();
            let now = stamp(&self.cert, &self.key);
            if now != state.stamp {
                state.stamp = now;
                match read_identity(&self.cert, &self.key) {
                    Ok(identity) => {
                        state.identity = identity;
                        info!(cert = %self.cert.display(), "read the changed HTTPS certificate");
                    }
                    Err(error) => warn!(
                        cert = %self.cert.display(),
                        error = format!("{error:#}"),
                        "the changed HTTPS certificate does not load; serving the previous one"
                    ),
                }
            }
        }
        Some(Arc::clone(&state.identity))
    }
}

fn stamp(cert: &Path, key: &Path) -> (Option<SystemTime>, Option<SystemTime>) {
    let modified = |path: &Path| std::fs::metadata(path).and_then(|m| m.modified()).ok();
    (modified(cert), modified(key))
}

/// The certificate chain of `cert` with the key of `key`, checked to belong together.
fn read_identity(cert: &Path, key: &Path) -> anyhow::Result<Arc<CertifiedKey>> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("reading certificates from {}", cert.display()))?;
    if chain.is_empty() {
        anyhow::bail!("{} holds no CERTIFICATE block", cert.display());
    }
    let der = PrivateKeyDer::from_pem_file(key)
        .with_context(|| format!("reading a private key from {}", key.display()))?;
    let signer = rustls::crypto::ring::sign::any_supported_type(&der)
        .with_context(|| format!("{} is not a key rustls can sign with", key.display()))?;
    let identity = CertifiedKey::new(chain, signer);
    identity.keys_match().with_context(|| {
        format!(
            "the key in {} is not the certificate's in {}",
            key.display(),
            cert.display()
        )
    })?;
    Ok(Arc::new(identity))
}

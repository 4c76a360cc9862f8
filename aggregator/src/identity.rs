//! The development identity: the CA, server certificate and tokens an aggregator makes for
//! itself when none are configured, so that a first run needs no PKI and no credentials.
//!
//! Everything lives under `<data-dir>/tls/`:
//!
//! | file | what | made |
//! |---|---|---|
//! | `ca.pem`, `ca.key` | the development CA, which agents trust (`ship.ca`), and its key | once |
//! | `server.pem`, `server.key` | QUIC ingest's certificate, signed by the CA for this host's names and addresses | at every start |
//! | `agent-token` | the development agent token (scope `ingest`) | once |
//! | `admin-token` | the development admin token (every scope) | once |
//!
//! A data directory made before the CA's key was kept has `ca.pem`, `server.pem` and
//! `server.key` but no `ca.key`: its certificate is served as it is.
//!
//! In object-storage mode the aggregators of one bucket share one CA (with its key) and one of
//! each token: [`share`] offers this directory's (or new ones) as a candidate to the bucket,
//! adopts what the bucket settles on, and writes it here, before `auth` reads the tokens and
//! QUIC ingest signs its certificate with the CA. Each aggregator still signs its own
//! certificate, for its own names and addresses, so that an agent that trusts the one CA
//! verifies every aggregator by the address it dials.
//!
//! Callers: `app` ([`share`]), `auth` ([`token`]), `ingest::quic` ([`server_identity`]).
//! Depends on no other module of the crate.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

/// The directory of the development identity, under the data directory.
const DIR: &str = "tls";
/// The development CA's certificate: what agents trust.
const CA: &str = "ca.pem";
/// The development CA's private key.
const CA_KEY: &str = "ca.key";
/// The server certificate, signed by the development CA.
const SERVER_CERT: &str = "server.pem";
/// Its private key.
const SERVER_KEY: &str = "server.key";
/// The development CA's subject: a certificate it signs names it as its issuer.
const CA_NAME: &str = "Smolder development CA";

/// Why the development identity could not be read, made or written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum IdentityError {
    /// A file under `<data-dir>/tls/` cannot be read or written.
    #[error("cannot use {path}")]
    Io {
        /// The path at fault.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// rcgen refused to make or sign a certificate, or a stored CA key does not parse.
    #[error("generating the development certificate failed: {reason}")]
    Generate {
        /// What rcgen said.
        reason: String,
    },
    /// The bucket's shared identity is not one this version reads (object-storage mode).
    #[error("the bucket's shared development identity is unreadable: {reason}")]
    Shared {
        /// What is wrong with it.
        reason: String,
    },
    /// The bucket could not settle a shared identity (object-storage mode).
    #[error("sharing the development identity through the bucket failed")]
    Bucket {
        /// What the store said.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> IdentityError + '_ {
    move |source| IdentityError::Io {
        path: path.to_owned(),
        source,
    }
}

fn generate(err: rcgen::Error) -> IdentityError {
    IdentityError::Generate {
        reason: err.to_string(),
    }
}

/// One of the development tokens.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Token {
    /// The agent token: scope `ingest`.
    Agent,
    /// The admin token: every scope.
    Admin,
}

impl Token {
    fn file(self) -> &'static str {
        match self {
            Token::Agent => "agent-token",
            Token::Admin => "admin-token",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Token::Agent => "agent",
            Token::Admin => "admin",
        }
    }

    /// Its file under `data_dir`.
    pub(crate) fn path(self, data_dir: &Path) -> PathBuf {
        data_dir.join(DIR).join(self.file())
    }
}

/// Reads the development token `which` from `data_dir`, making it on first use.
///
/// # Errors
///
/// When the file cannot be read or written.
pub(crate) fn token(data_dir: &Path, which: Token) -> Result<String, IdentityError> {
    let path = which.path(data_dir);
    let what = which.what();
    if let Some(token) = read_token(&path)? {
        info!(token_file = %path.display(), "using the development {what} token");
        return Ok(token);
    }
    let token = new_token();
    write_private(&path, format!("{token}\n").as_bytes())?;
    info!(token_file = %path.display(), "generated a development {what} token");
    Ok(token)
}

/// The token in `path`, trimmed; `None` when the file is missing or blank.
fn read_token(path: &Path) -> Result<Option<String>, IdentityError> {
    match std::fs::read_to_string(path) {
        Ok(token) if !token.trim().is_empty() => Ok(Some(token.trim().to_owned())),
        Ok(_) => Ok(None),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(io(path)(err)),
    }
}

/// A random token: 24 bytes, hex.
fn new_token() -> String {
    let bytes: [u8; 24] = rand::random();
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The server certificate and key QUIC ingest serves without `ingest.quic.cert`: signed at
/// every start by the development CA (made on first use) for `localhost`, the loopback
/// addresses, this host's name and addresses, and `listen` unless it is unspecified; a data
/// directory without the CA's key keeps the certificate it has.
///
/// # Errors
///
/// When a file cannot be read or written, or a certificate cannot be made.
pub(crate) fn server_identity(
    data_dir: &Path,
    listen: IpAddr,
) -> Result<(PathBuf, PathBuf), IdentityError> {
    let dir = data_dir.join(DIR);
    let (ca, ca_key) = (dir.join(CA), dir.join(CA_KEY));
    let (cert, key) = (dir.join(SERVER_CERT), dir.join(SERVER_KEY));
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    if ca.exists() && !ca_key.exists() && cert.exists() && key.exists() {
        info!(ca = %ca.display(), "QUIC ingest uses the development TLS identity of an earlier version (its CA's key was not kept); agents verify the aggregator with this CA (ship.ca)");
        return Ok((cert, key));
    }
    let authority = match read_ca(&dir)? {
        Some(authority) => authority,
        None => {
            let authority = Authority::generate()?;
            authority.write(&dir)?;
            info!(ca = %ca.display(), "generated a development CA");
            authority
        }
    };
    let names = host_names(listen);
    let (pem, private) = authority.sign(&names)?;
    write_private(&key, private.as_bytes())?;
    write_file(&cert, pem.as_bytes())?;
    info!(
        ca = %ca.display(),
        names = ?names,
        "QUIC ingest uses the development TLS identity, its certificate signed for this host; agents verify the aggregator with this CA (ship.ca)"
    );
    Ok((cert, key))
}

/// The CA of `dir`, when both its certificate and its key are there.
fn read_ca(dir: &Path) -> Result<Option<Authority>, IdentityError> {
    let (ca, ca_key) = (dir.join(CA), dir.join(CA_KEY));
    let read = |path: &Path| match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(err) => Err(io(path)(err)),
    };
    Ok(match (read(&ca)?, read(&ca_key)?) {
        (Some(cert), Some(key)) => Some(Authority { cert, key }),
        _ => None,
    })
}

/// The names a server certificate is signed for: `localhost`, the loopback addresses, this
/// host's name, every address of its interfaces, and `listen` (when specified).
fn host_names(listen: IpAddr) -> Vec<String> {
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
    let mut addresses = vec![listen];
    match nix::ifaddrs::getifaddrs() {
        Ok(interfaces) => addresses.extend(interfaces.filter_map(|i| {
            let address = i.address?;
            match (address.as_sockaddr_in(), address.as_sockaddr_in6()) {
                (Some(v4), _) => Some(IpAddr::V4(v4.ip())),
                (_, Some(v6)) => Some(IpAddr::V6(v6.ip())),
                _ => None,
            }
        })),
        Err(err) => {
            warn!(error = %err, "listing this host's addresses failed; the development certificate names the loopback addresses and the host name only");
        }
    }
    for address in addresses {
        // A link-local address means nothing without its interface, and an agent cannot
        // dial the unspecified one.
        let useless = address.is_unspecified()
            || matches!(address, IpAddr::V6(v6) if v6.is_unicast_link_local());
        let name = address.to_string();
        if !useless && !names.contains(&name) {
            names.push(name);
        }
    }
    names
}

/// A CA as PEM: its certificate and its private key.
struct Authority {
    cert: String,
    key: String,
}

impl Authority {
    /// A new CA.
    fn generate() -> Result<Authority, IdentityError> {
        let key = KeyPair::generate().map_err(generate)?;
        let cert = ca_params()?.self_signed(&key).map_err(generate)?;
        Ok(Authority {
            cert: cert.pem(),
            key: key.serialize_pem(),
        })
    }

    /// Writes the CA into `dir`, its key first: the certificate's presence says it is complete.
    fn write(&self, dir: &Path) -> Result<(), IdentityError> {
        write_private(&dir.join(CA_KEY), self.key.as_bytes())?;
        write_file(&dir.join(CA), self.cert.as_bytes())
    }

    /// A new server key and its certificate for `names`, signed by this CA, as PEM.
    fn sign(&self, names: &[String]) -> Result<(String, String), IdentityError> {
        let ca_key = KeyPair::from_pem(&self.key).map_err(generate)?;
        // The issuer is named from the parameters the CA was made with (its subject is ours),
        // which spares parsing its certificate.
        let issuer = Issuer::new(ca_params()?, ca_key);
        let key = KeyPair::generate().map_err(generate)?;
        let mut params = CertificateParams::new(names.to_vec()).map_err(generate)?;
        params
            .distinguished_name
            .push(DnType::CommonName, "Smolder aggregator (development)");
        let cert = params.signed_by(&key, &issuer).map_err(generate)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}

/// The development CA's parameters.
fn ca_params() -> Result<CertificateParams, IdentityError> {
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(generate)?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, CA_NAME);
    Ok(params)
}

/// Which parts of the development identity this aggregator uses: those its config does not
/// replace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Needs {
    /// The CA: no `ingest.quic.cert`.
    pub(crate) ca: bool,
    /// The agent token: no credentials, no deprecated tokens, no `ingest.quic.client-ca`.
    pub(crate) agent_token: bool,
    /// The admin token: no credentials.
    pub(crate) admin_token: bool,
}

impl Needs {
    /// Whether any part is needed.
    pub(crate) fn any(self) -> bool {
        self.ca || self.agent_token || self.admin_token
    }
}

/// The identity aggregators on one bucket share, as it is stored there (JSON).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
struct Shared {
    /// The CA's certificate, PEM.
    ca: String,
    /// The CA's private key, PEM.
    ca_key: String,
    agent_token: String,
    admin_token: String,
}

impl Shared {
    /// What `data_dir` has (a CA only with its key), the rest made new.
    fn local_or_new(data_dir: &Path) -> Result<Shared, IdentityError> {
        let authority = match read_ca(&data_dir.join(DIR))? {
            Some(authority) => authority,
            None => Authority::generate()?,
        };
        let token = |which: Token| {
            Ok::<_, IdentityError>(read_token(&which.path(data_dir))?.unwrap_or_else(new_token))
        };
        Ok(Shared {
            ca: authority.cert,
            ca_key: authority.key,
            agent_token: token(Token::Agent)?,
            admin_token: token(Token::Admin)?,
        })
    }

    /// Writes the parts `needs` names into `data_dir`, replacing what differs (logged).
    fn install(&self, data_dir: &Path, needs: Needs) -> Result<(), IdentityError> {
        let dir = data_dir.join(DIR);
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let mut replaced = Vec::new();
        if needs.ca {
            let current = read_ca(&dir)?;
            if current
                .as_ref()
                .is_none_or(|c| c.cert != self.ca || c.key != self.ca_key)
            {
                // A CA certificate without its key (an earlier version's) is replaced too,
                // but said only when it is another CA.
                let cert = std::fs::read_to_string(dir.join(CA)).ok();
                if cert.is_some_and(|cert| cert != self.ca) {
                    replaced.push(CA);
                }
                Authority {
                    cert: self.ca.clone(),
                    key: self.ca_key.clone(),
                }
                .write(&dir)?;
            }
        }
        for (which, needed, token) in [
            (Token::Agent, needs.agent_token, &self.agent_token),
            (Token::Admin, needs.admin_token, &self.admin_token),
        ] {
            let path = which.path(data_dir);
            let current = read_token(&path)?;
            if needed && current.as_ref() != Some(token) {
                if current.is_some() {
                    replaced.push(which.file());
                }
                write_private(&path, format!("{token}\n").as_bytes())?;
            }
        }
        if !replaced.is_empty() {
            warn!(dir = %dir.display(), files = ?replaced, "this data directory's development identity is replaced by the one the bucket's aggregators share; agents that used the old CA or tokens need these files");
        }
        Ok(())
    }
}

/// Object-storage mode: makes the development identity of `data_dir` the one the bucket's
/// aggregators share. `adopt` offers a candidate (this directory's CA and tokens, or new ones)
/// to the bucket and answers the identity the bucket settled on, which is written here (the
/// parts `needs` names) for `auth` and QUIC ingest to read.
///
/// # Errors
///
/// When `adopt` fails, the bucket's identity does not parse, or a file cannot be written.
pub(crate) fn share<E>(
    data_dir: &Path,
    needs: Needs,
    adopt: impl FnOnce(Vec<u8>) -> Result<Vec<u8>, E>,
) -> Result<(), IdentityError>
where
    E: std::error::Error + Send + Sync + 'static,
{
    let candidate = Shared::local_or_new(data_dir)?;
    let bytes = serde_json::to_vec(&candidate).expect("strings serialize");
    let adopted = adopt(bytes).map_err(|err| IdentityError::Bucket {
        source: Box::new(err),
    })?;
    let shared: Shared = serde_json::from_slice(&adopted).map_err(|err| IdentityError::Shared {
        reason: err.to_string(),
    })?;
    KeyPair::from_pem(&shared.ca_key).map_err(|err| IdentityError::Shared {
        reason: format!("the CA's key: {err}"),
    })?;
    if [&shared.agent_token, &shared.admin_token]
        .iter()
        .any(|t| t.trim().is_empty() || t.trim() != t.as_str())
    {
        return Err(IdentityError::Shared {
            reason: "a token is blank or has surrounding spaces".into(),
        });
    }
    shared.install(data_dir, needs)?;
    info!(
        own = shared == candidate,
        "the development identity is the one this bucket's aggregators share"
    );
    Ok(())
}

fn write_file(path: &Path, bytes: &[u8]) -> Result<(), IdentityError> {
    std::fs::write(path, bytes).map_err(io(path))
}

/// Writes a secret readable by its owner only.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), IdentityError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(io(path))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(io(path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_certificate_is_signed_again_by_the_kept_ca_at_every_start() {
        let dir = tempfile::tempdir().unwrap();
        let listen = "192.0.2.7".parse().unwrap();
        let (cert, _) = server_identity(dir.path(), listen).unwrap();
        let ca = std::fs::read_to_string(dir.path().join("tls/ca.pem")).unwrap();
        let first = std::fs::read_to_string(&cert).unwrap();
        server_identity(dir.path(), listen).unwrap();
        assert_eq!(
            std::fs::read_to_string(dir.path().join("tls/ca.pem")).unwrap(),
            ca,
            "the CA is kept"
        );
        assert_ne!(std::fs::read_to_string(&cert).unwrap(), first);
        assert!(host_names(listen).contains(&"192.0.2.7".to_owned()));
        assert!(!host_names("0.0.0.0".parse().unwrap()).contains(&"0.0.0.0".to_owned()));
    }

    #[test]
    fn an_earlier_versions_identity_without_the_ca_key_is_served_as_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let tls = dir.path().join("tls");
        std::fs::create_dir_all(&tls).unwrap();
        for file in [CA, SERVER_CERT, SERVER_KEY] {
            std::fs::write(tls.join(file), file).unwrap();
        }
        let (cert, key) = server_identity(dir.path(), IpAddr::from([0, 0, 0, 0])).unwrap();
        assert_eq!(std::fs::read_to_string(cert).unwrap(), SERVER_CERT);
        assert_eq!(std::fs::read_to_string(key).unwrap(), SERVER_KEY);
        assert!(!tls.join(CA_KEY).exists());
    }

    #[test]
    fn sharing_installs_the_adopted_identity_and_offers_the_local_one() {
        let (first, second) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let all = Needs {
            ca: true,
            agent_token: true,
            admin_token: true,
        };
        let admin = token(first.path(), Token::Admin).unwrap();
        let mut offered = Vec::new();
        share(first.path(), all, |candidate| {
            offered = candidate.clone();
            Ok::<_, std::io::Error>(candidate)
        })
        .unwrap();
        let shared: Shared = serde_json::from_slice(&offered).unwrap();
        assert_eq!(shared.admin_token, admin, "the local token is offered");
        // A second directory adopts the first's, its own candidate set aside.
        share(second.path(), all, |_| {
            Ok::<_, std::io::Error>(offered.clone())
        })
        .unwrap();
        for file in [CA, CA_KEY, "agent-token", "admin-token"] {
            assert_eq!(
                std::fs::read(first.path().join("tls").join(file)).unwrap(),
                std::fs::read(second.path().join("tls").join(file)).unwrap(),
                "{file}"
            );
        }
        let only_ca = Needs {
            ca: true,
            agent_token: false,
            admin_token: false,
        };
        let third = tempfile::tempdir().unwrap();
        share(third.path(), only_ca, |_| {
            Ok::<_, std::io::Error>(offered.clone())
        })
        .unwrap();
        assert!(!Token::Agent.path(third.path()).exists());
        let broken = share(third.path(), only_ca, |_| {
            Ok::<_, std::io::Error>(b"{\"ca\": 1}".to_vec())
        });
        assert!(
            matches!(broken, Err(IdentityError::Shared { .. })),
            "{broken:?}"
        );
    }
}

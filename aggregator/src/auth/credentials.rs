//! Credentials: as the config and the credential files write them ([`CredentialSpec`]), and as
//! they are kept in memory ([`CredentialSet`]): each secret hashed (SHA-256), a presented one
//! hashed and compared with every credential's in constant time, so that neither memory nor
//! timing gives a secret away.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::tenant::{Tenant, TenantError};

/// A secret as written in a config or credential file. `Debug` shows `<redacted>`, so that a
/// config printed for debugging does not show it.
#[derive(Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// A secret holding `text`.
    pub fn new(text: impl Into<String>) -> Secret {
        Secret(text.into())
    }

    /// The secret itself.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// What a credential may do. `admin` includes `read` and `ingest`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Scope {
    /// Push profiles: `/ingest`, Connect push, OTLP, and agents over QUIC.
    Ingest,
    /// Read profiles, labels, rules and `/exported-metrics`; sign in to the web UI.
    Read,
    /// Change and delete: `DELETE /api/apps`, writing recording rules.
    Admin,
}

impl Scope {
    /// The scope's name as configs write it.
    pub fn as_str(self) -> &'static str {
        match self {
            Scope::Ingest => "ingest",
            Scope::Read => "read",
            Scope::Admin => "admin",
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One credential as written under `auth.credentials` or in a credential file: a bearer
/// `token` (what Pyroscope's SDKs send as `authToken`, and agents as `ship.token`) or a `user`
/// and `password` for HTTP basic auth (`basicAuthUser`, `basicAuthPassword`), with its scopes
/// and, optionally, the tenant it is limited to.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct CredentialSpec {
    /// What logs, metrics and the UI call it; never the secret.
    pub name: String,
    /// The bearer token (`Authorization: Bearer <token>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<Secret>,
    /// The basic-auth user name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// The basic-auth password.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<Secret>,
    /// `ingest`, `read` and/or `admin`.
    pub scopes: Vec<Scope>,
    /// The tenant its requests are served as, whatever `X-Scope-OrgID` says (a different one
    /// gets 403). Without one, the request names its tenant as without credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
}

/// A credential file: `credentials:` and a list as under `auth.credentials`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CredentialFile {
    #[serde(default)]
    pub(crate) credentials: Vec<CredentialSpec>,
}

/// Why a credential or a credential file cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CredentialError {
    /// A credential has no `name`.
    #[error("{place}: a credential needs a name")]
    NoName {
        /// Where it is (`auth.credentials[2]`, a file and index).
        place: String,
    },
    /// A credential has both or neither of `token` and `user`/`password`, or only one of
    /// `user` and `password`.
    #[error("{place} ({name}): give either token, or user and password")]
    Secret {
        /// Where it is.
        place: String,
        /// Its name.
        name: String,
    },
    /// A token or password is empty.
    #[error("{place} ({name}): the token or password is empty")]
    Empty {
        /// Where it is.
        place: String,
        /// Its name.
        name: String,
    },
    /// A credential's secret cannot travel in an `Authorization` header as written: a token
    /// with leading or trailing spaces or a character outside printable ASCII, or a user with
    /// a colon, which Basic auth puts between user and password. The secret is not shown.
    #[error("{place} ({name}): {why}")]
    Unpresentable {
        /// Where it is.
        place: String,
        /// Its name.
        name: String,
        /// Which rule it breaks.
        why: &'static str,
    },
    /// A credential has no scope.
    #[error("{place} ({name}): scopes is empty; give ingest, read and/or admin")]
    NoScope {
        /// Where it is.
        place: String,
        /// Its name.
        name: String,
    },
    /// A credential's tenant is not a tenant id.
    #[error("{place} ({name}): tenant {tenant:?} is not a tenant id")]
    Tenant {
        /// Where it is.
        place: String,
        /// Its name.
        name: String,
        /// The tenant as written.
        tenant: String,
        /// The rule it breaks.
        #[source]
        source: TenantError,
    },
    /// A credential names a tenant other than `anonymous` without multitenancy, which would
    /// mix its data with everyone's.
    #[error(
        "{place} ({name}): names tenant {tenant:?}, but tenant.multitenancy-enabled is false; enable it, or remove the tenant"
    )]
    TenantWithoutMultitenancy {
        /// Where it is.
        place: String,
        /// Its name.
        name: String,
        /// The tenant.
        tenant: String,
    },
    /// Two credentials have the same token, or the same user, so that which one a request
    /// presents would be ambiguous. The secret is not shown.
    #[error("credentials {first:?} and {second:?} have the same {what}; each must be unique")]
    Twice {
        /// The first's name.
        first: String,
        /// The second's name.
        second: String,
        /// `token` or `user`.
        what: &'static str,
    },
    /// A credential file cannot be read.
    #[error("cannot read credential file {path}")]
    Read {
        /// The file.
        path: PathBuf,
        /// What the OS said.
        #[source]
        source: std::io::Error,
    },
    /// A credential file is not YAML of `credentials: [...]`.
    #[error("credential file {path} does not parse: {reason}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What the parser said, with the line.
        reason: String,
    },
}

/// A SHA-256 hash; a credential's [`Key`] and its secrets' hashes.
pub(crate) type Hash = [u8; 32];

/// What identifies a credential across reloads and in sessions: the hash of its secret (of
/// its user's and password's hashes, for basic auth). A credential whose secret changed is
/// another credential.
pub(crate) type Key = Hash;

fn sha256(bytes: &[u8]) -> Hash {
    Sha256::digest(bytes).into()
}

/// The scopes of a credential, as a set.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Scopes(u8);

impl Scopes {
    /// Every scope.
    pub(crate) const ALL: Scopes = Scopes(0b111);

    fn bit(scope: Scope) -> u8 {
        match scope {
            Scope::Ingest => 1,
            Scope::Read => 2,
            Scope::Admin => 4,
        }
    }

    /// The set of `scopes`.
    pub(crate) fn of(scopes: &[Scope]) -> Scopes {
        Scopes(scopes.iter().fold(0, |bits, &s| bits | Self::bit(s)))
    }

    /// Whether a credential with these scopes may do what `scope` allows; `admin` may do all.
    pub(crate) fn allow(self, scope: Scope) -> bool {
        self.0 & (Self::bit(scope) | Self::bit(Scope::Admin)) != 0
    }

    /// The scopes, by name.
    pub(crate) fn names(self) -> Vec<&'static str> {
        [Scope::Ingest, Scope::Read, Scope::Admin]
            .into_iter()
            .filter(|&s| self.0 & Self::bit(s) != 0)
            .map(Scope::as_str)
            .collect()
    }
}

/// Where a credential comes from: the gauge of credentials is labelled by it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Source {
    /// `auth.credentials`.
    Config,
    /// One of `auth.credential-files`.
    File,
    /// `ingest.quic.tokens` or `tenant-tokens`, read as `ingest` credentials.
    Deprecated,
    /// The development tokens in `<data-dir>/tls/`.
    Development,
}

impl Source {
    /// The `source` label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Source::Config => "config",
            Source::File => "file",
            Source::Deprecated => "deprecated",
            Source::Development => "development",
        }
    }
}

#[derive(Clone, Debug)]
enum Proof {
    Token(Hash),
    Basic { user: Hash, password: Hash },
}

/// A credential as kept in memory: its secret hashed.
#[derive(Clone, Debug)]
pub(crate) struct Credential {
    pub(crate) name: Arc<str>,
    pub(crate) scopes: Scopes,
    pub(crate) tenant: Option<Tenant>,
    pub(crate) source: Source,
    proof: Proof,
}

impl Credential {
    /// A token credential.
    pub(crate) fn token(
        name: &str,
        token: &str,
        scopes: Scopes,
        tenant: Option<Tenant>,
        source: Source,
    ) -> Credential {
        Credential {
            name: name.into(),
            scopes,
            tenant,
            source,
            proof: Proof::Token(sha256(token.as_bytes())),
        }
    }

    /// What identifies it.
    pub(crate) fn key(&self) -> Key {
        match &self.proof {
            Proof::Token(hash) => *hash,
            Proof::Basic { user, password } => {
                let mut both = [0u8; 64];
                both[..32].copy_from_slice(user);
                both[32..].copy_from_slice(password);
                sha256(&both)
            }
        }
    }

    /// Whether it is a bearer token (agents present only those).
    pub(crate) fn is_token(&self) -> bool {
        matches!(self.proof, Proof::Token(_))
    }
}

impl CredentialSpec {
    /// The credential in memory; `place` says where it was written, for errors.
    ///
    /// # Errors
    ///
    /// What [`CredentialError`] lists for one credential.
    pub(crate) fn compile(
        &self,
        place: &str,
        source: Source,
        multitenancy: bool,
    ) -> Result<Credential, CredentialError> {
        let name = self.name.trim();
        if name.is_empty() {
            return Err(CredentialError::NoName {
                place: place.to_owned(),
            });
        }
        let described = || (place.to_owned(), name.to_owned());
        let proof = match (&self.token, &self.user, &self.password) {
            (Some(token), None, None) => {
                if token.0.is_empty() {
                    let (place, name) = described();
                    return Err(CredentialError::Empty { place, name });
                }
                // What `Bearer <token>` carries through a header's text and the trim around it.
                let presentable = token.0.bytes().all(|b| b == b' ' || b.is_ascii_graphic())
                    && token.0.trim() == token.0;
                if !presentable {
                    let (place, name) = described();
                    let why = "the token must be printable ASCII, without leading or trailing spaces, as a Bearer header carries it";
                    return Err(CredentialError::Unpresentable { place, name, why });
                }
                Proof::Token(sha256(token.0.as_bytes()))
            }
            (None, Some(user), Some(password)) => {
                if password.0.is_empty() || user.is_empty() {
                    let (place, name) = described();
                    return Err(CredentialError::Empty { place, name });
                }
                if user.contains(':') {
                    let (place, name) = described();
                    let why = "the user must not hold a colon, which Basic auth puts between user and password";
                    return Err(CredentialError::Unpresentable { place, name, why });
                }
                Proof::Basic {
                    user: sha256(user.as_bytes()),
                    password: sha256(password.0.as_bytes()),
                }
            }
            _ => {
                let (place, name) = described();
                return Err(CredentialError::Secret { place, name });
            }
        };
        if self.scopes.is_empty() {
            let (place, name) = described();
            return Err(CredentialError::NoScope { place, name });
        }
        let tenant = match &self.tenant {
            None => None,
            Some(id) => {
                let tenant = Tenant::new(id).map_err(|source| {
                    let (place, name) = described();
                    CredentialError::Tenant {
                        place,
                        name,
                        tenant: id.clone(),
                        source,
                    }
                })?;
                if !multitenancy && tenant != Tenant::anonymous() {
                    let (place, name) = described();
                    return Err(CredentialError::TenantWithoutMultitenancy {
                        place,
                        name,
                        tenant: id.clone(),
                    });
                }
                Some(tenant)
            }
        };
        Ok(Credential {
            name: name.into(),
            scopes: Scopes::of(&self.scopes),
            tenant,
            source,
            proof,
        })
    }
}

/// Reads and compiles the credential file at `path`.
///
/// # Errors
///
/// The file cannot be read or parsed, or a credential in it is invalid.
pub(crate) fn read_file(
    path: &Path,
    multitenancy: bool,
) -> Result<(Vec<u8>, Vec<Credential>), CredentialError> {
    let bytes = std::fs::read(path).map_err(|source| CredentialError::Read {
        path: path.to_owned(),
        source,
    })?;
    let credentials = parse_file(path, &bytes, multitenancy)?;
    Ok((bytes, credentials))
}

/// Compiles the credentials of a credential file's `bytes`.
///
/// # Errors
///
/// As [`read_file`], but for reading.
pub(crate) fn parse_file(
    path: &Path,
    bytes: &[u8],
    multitenancy: bool,
) -> Result<Vec<Credential>, CredentialError> {
    let parse_error = |reason: String| CredentialError::Parse {
        path: path.to_owned(),
        reason,
    };
    let text = std::str::from_utf8(bytes).map_err(|err| parse_error(err.to_string()))?;
    let file: CredentialFile = if text.trim().is_empty() {
        CredentialFile::default()
    } else {
        serde_norway::from_str(text).map_err(|err| parse_error(err.to_string()))?
    };
    file.credentials
        .iter()
        .enumerate()
        .map(|(i, spec)| {
            spec.compile(
                &format!("{} credentials[{i}]", path.display()),
                Source::File,
                multitenancy,
            )
        })
        .collect()
}

/// Every credential in force, hashed.
#[derive(Clone, Debug, Default)]
pub(crate) struct CredentialSet {
    list: Vec<Credential>,
}

impl CredentialSet {
    /// The set of `list`.
    ///
    /// # Errors
    ///
    /// [`CredentialError::Twice`] when two credentials share a token or a user.
    pub(crate) fn new(list: Vec<Credential>) -> Result<CredentialSet, CredentialError> {
        let mut tokens: BTreeMap<Hash, &str> = BTreeMap::new();
        let mut users: BTreeMap<Hash, &str> = BTreeMap::new();
        for credential in &list {
            let (seen, hash, what) = match &credential.proof {
                Proof::Token(hash) => (&mut tokens, hash, "token"),
                Proof::Basic { user, .. } => (&mut users, user, "user"),
            };
            if let Some(first) = seen.insert(*hash, &credential.name) {
                return Err(CredentialError::Twice {
                    first: first.to_owned(),
                    second: credential.name.to_string(),
                    what,
                });
            }
        }
        Ok(CredentialSet { list })
    }

    /// How many credentials each source gives.
    pub(crate) fn count_by_source(&self) -> BTreeMap<Source, usize> {
        let mut counts = BTreeMap::new();
        for credential in &self.list {
            *counts.entry(credential.source).or_default() += 1;
        }
        counts
    }

    /// The credential whose token is `presented`. Every credential is compared, in constant
    /// time, whichever matches.
    pub(crate) fn token(&self, presented: &str) -> Option<&Credential> {
        let hash = sha256(presented.as_bytes());
        let mut found = None;
        for credential in &self.list {
            if let Proof::Token(token) = &credential.proof
                && bool::from(token.ct_eq(&hash))
            {
                found = Some(credential);
            }
        }
        found
    }

    /// The credential of basic-auth `user` and `password`, compared as [`CredentialSet::token`]
    /// compares.
    pub(crate) fn basic(&self, user: &str, password: &str) -> Option<&Credential> {
        let (user, password) = (sha256(user.as_bytes()), sha256(password.as_bytes()));
        let mut found = None;
        for credential in &self.list {
            if let Proof::Basic {
                user: u,
                password: p,
            } = &credential.proof
                && bool::from(u.ct_eq(&user) & p.ct_eq(&password))
            {
                found = Some(credential);
            }
        }
        found
    }

    /// The credential of `key`, if it is still in force.
    pub(crate) fn get(&self, key: &Key) -> Option<&Credential> {
        let mut found = None;
        for credential in &self.list {
            if bool::from(credential.key().ct_eq(key)) {
                found = Some(credential);
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn spec(yaml: &str) -> CredentialSpec {
        serde_norway::from_str(yaml).unwrap()
    }

    proptest::proptest! {
        #[test]
        fn any_credential_file_is_read_or_refused_naming_the_file(
            bytes in proptest::collection::vec(proptest::num::u8::ANY, 0..400),
        ) {
            let path = Path::new("/etc/smolder/credentials.yaml");
            if let Err(err) = parse_file(path, &bytes, true) {
                proptest::prop_assert!(err.to_string().contains("credentials.yaml"));
            }
        }

        #[test]
        fn a_file_of_valid_credentials_gives_each_of_them(
            tokens in proptest::collection::btree_map("[a-z][a-z0-9-]{0,15}", "[A-Za-z0-9_.~-]{8,40}", 0..8),
            tenant in proptest::option::of("[a-z][a-z0-9-]{0,15}"),
        ) {
            let mut yaml = String::from("credentials:\n");
            for (name, token) in &tokens {
                yaml.push_str(&format!("  - name: {name}\n    token: \"{token}\"\n    scopes: [ingest, read]\n"));
                if let Some(tenant) = &tenant {
                    yaml.push_str(&format!("    tenant: {tenant}\n"));
                }
            }
            let read = parse_file(Path::new("f.yaml"), yaml.as_bytes(), true).unwrap();
            proptest::prop_assert_eq!(read.len(), tokens.len());
            let distinct: BTreeSet<&String> = tokens.values().collect();
            if distinct.len() == tokens.len() {
                let set = CredentialSet::new(read).unwrap();
                for (name, token) in &tokens {
                    proptest::prop_assert_eq!(&*set.token(token).unwrap().name, name.as_str());
                }
            }
        }
    }

    #[test]
    fn tokens_and_passwords_are_found_by_their_secret_only() {
        let set = CredentialSet::new(vec![
            spec("name: ci\ntoken: t0ken-of-ci\nscopes: [ingest]\n")
                .compile("x", Source::Config, false)
                .unwrap(),
            spec("name: grafana\nuser: graf\npassword: pw\nscopes: [read]\n")
                .compile("x", Source::Config, false)
                .unwrap(),
        ])
        .unwrap();
        assert_eq!(&*set.token("t0ken-of-ci").unwrap().name, "ci");
        assert!(set.token("t0ken-of-cI").is_none());
        assert!(set.token("pw").is_none(), "a password is not a token");
        assert_eq!(&*set.basic("graf", "pw").unwrap().name, "grafana");
        assert!(set.basic("graf", "pW").is_none());
        assert!(set.basic("t0ken-of-ci", "").is_none());
        let ci = set.token("t0ken-of-ci").unwrap().key();
        assert_eq!(&*set.get(&ci).unwrap().name, "ci");
        assert!(set.get(&[0; 32]).is_none());
    }

    #[test]
    fn scopes_nest_under_admin() {
        let admin = Scopes::of(&[Scope::Admin]);
        assert!(admin.allow(Scope::Read) && admin.allow(Scope::Ingest));
        let read = Scopes::of(&[Scope::Read]);
        assert!(read.allow(Scope::Read) && !read.allow(Scope::Ingest) && !read.allow(Scope::Admin));
        assert_eq!(
            Scopes::of(&[Scope::Ingest, Scope::Read]).names(),
            ["ingest", "read"]
        );
    }

    #[test]
    fn bad_credentials_are_named_without_their_secret() {
        let cases = [
            ("name: ''\ntoken: a\nscopes: [read]\n", "needs a name"),
            (
                "name: a\nscopes: [read]\n",
                "either token, or user and password",
            ),
            (
                "name: a\ntoken: x\nuser: u\npassword: p\nscopes: [read]\n",
                "either token",
            ),
            ("name: a\nuser: u\nscopes: [read]\n", "either token"),
            ("name: a\ntoken: ''\nscopes: [read]\n", "is empty"),
            (
                "name: a\ntoken: 's3cret '\nscopes: [read]\n",
                "without leading or trailing spaces",
            ),
            (
                "name: a\ntoken: 's3cret\u{e9}'\nscopes: [read]\n",
                "printable ASCII",
            ),
            (
                "name: a\nuser: 'x:s3cret'\npassword: p\nscopes: [read]\n",
                "must not hold a colon",
            ),
            ("name: a\ntoken: s3cret\nscopes: []\n", "scopes is empty"),
            (
                "name: a\ntoken: s3cret\nscopes: [read]\ntenant: a/b\n",
                "not a tenant id",
            ),
            (
                "name: a\ntoken: s3cret\nscopes: [read]\ntenant: team-a\n",
                "multitenancy-enabled",
            ),
        ];
        for (yaml, expected) in cases {
            let err = spec(yaml)
                .compile("auth.credentials[0]", Source::Config, false)
                .unwrap_err();
            let text = err.to_string();
            assert!(text.contains(expected), "{yaml}: {text}");
            assert!(text.starts_with("auth.credentials[0]"), "{text}");
            assert!(!text.contains("s3cret"), "{text}");
        }
        assert!(
            serde_norway::from_str::<CredentialSpec>("name: a\ntoken: x\nscopes: [write]\n")
                .is_err()
        );
        assert!(
            serde_norway::from_str::<CredentialSpec>("name: a\ntokn: x\nscopes: [read]\n").is_err()
        );
        let twice = CredentialSet::new(vec![
            Credential::token("a", "same", Scopes::ALL, None, Source::Config),
            Credential::token("b", "same", Scopes::ALL, None, Source::File),
        ])
        .unwrap_err()
        .to_string();
        assert!(
            twice.contains("\"a\" and \"b\" have the same token"),
            "{twice}"
        );
        assert!(!twice.contains("same\""), "{twice}");
        assert_eq!(format!("{:?}", Secret::new("hidden")), "<redacted>");
    }
}

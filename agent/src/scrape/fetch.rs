//! HTTP for scraping and HTTP discovery: one reqwest client per job, auth headers, and bodies
//! read under a cap.
//!
//! Input: a URL and a timeout. Output: the response body, as sent, with its content type and
//! whether it is gzip-encoded. Callers: the scrape loops and HTTP discovery. Bodies are
//! untrusted: a `Content-Length` over the cap is refused before anything is read, and a body
//! without one is read chunk by chunk and abandoned one byte past the cap.
//!
//! TLS is rustls with ring; targets are verified against the system's roots unless
//! `tls-config.ca-file` names the CAs to trust instead.

use std::error::Error as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::header::{ACCEPT, ACCEPT_ENCODING, AUTHORIZATION, CONTENT_ENCODING, CONTENT_TYPE};
use reqwest::{Certificate, Client, Identity, Url, redirect};

use super::http_client::{Authorization, BasicAuth, TlsConfig};

/// Why a fetch failed. The messages are what `/targets` shows as a target's last error.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// The whole request (connect, headers, body) took longer than `scrape-timeout`.
    #[error("timed out after {}", super::go_duration::format(*.timeout))]
    Timeout {
        /// The timeout.
        timeout: Duration,
    },
    /// No connection: refused, unreachable, DNS or TLS handshake failure.
    #[error("connecting to {url} failed: {detail}")]
    Connect {
        /// The URL.
        url: String,
        /// The cause, innermost last.
        detail: String,
    },
    /// More than 10 redirects, or a redirect loop (`follow-redirects`).
    #[error("too many redirects from {url}")]
    Redirects {
        /// The URL first requested.
        url: String,
    },
    /// Any other failure of the request or of reading the body.
    #[error("request to {url} failed: {detail}")]
    Request {
        /// The URL.
        url: String,
        /// The cause, innermost last.
        detail: String,
    },
    /// A status other than 200.
    #[error("HTTP status {status}: {body}")]
    Status {
        /// The status line's code and reason.
        status: String,
        /// The start of the body, for the target's own explanation.
        body: String,
    },
    /// The body is longer than `body-size-limit`.
    #[error("response body is larger than body-size-limit ({limit} bytes)")]
    TooLarge {
        /// The limit, in bytes.
        limit: u64,
    },
    /// A credentials file could not be read.
    #[error("reading {what} file {path}")]
    Credentials {
        /// Which file: `password`, `bearer token`, `credentials`.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
}

impl FetchError {
    /// A bounded name for metrics: `timeout`, `connect`, `redirects`, `request`, `status`,
    /// `too_large`, `credentials`.
    pub fn reason(&self) -> &'static str {
        match self {
            FetchError::Timeout { .. } => "timeout",
            FetchError::Connect { .. } => "connect",
            FetchError::Redirects { .. } => "redirects",
            FetchError::Request { .. } => "request",
            FetchError::Status { .. } => "status",
            FetchError::TooLarge { .. } => "too_large",
            FetchError::Credentials { .. } => "credentials",
        }
    }
}

/// Why a job's client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// A TLS file could not be read.
    #[error("reading tls-config {what} {path}")]
    Read {
        /// `ca-file`, `cert-file` or `key-file`.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A TLS file is not usable PEM.
    #[error("tls-config {what} {path} is not usable")]
    Pem {
        /// `ca-file` or `cert-file`/`key-file`.
        what: &'static str,
        /// Its path.
        path: PathBuf,
        /// reqwest's error.
        source: reqwest::Error,
    },
    /// reqwest refused the settings.
    #[error("building the HTTP client")]
    Build {
        /// reqwest's error.
        source: reqwest::Error,
    },
}

/// A response read in full.
#[derive(Debug)]
pub struct Body {
    /// The bytes as sent.
    pub bytes: Vec<u8>,
    /// The `Content-Type` header, or empty.
    pub content_type: String,
    /// Whether `Content-Encoding` is gzip.
    pub gzip: bool,
}

/// The `Authorization` header a job sends.
#[derive(Clone, Debug)]
enum Auth {
    None,
    Basic {
        username: String,
        password: Option<String>,
        password_file: Option<PathBuf>,
    },
    Header {
        kind: String,
        credentials: Option<String>,
        credentials_file: Option<PathBuf>,
    },
}

/// An HTTP client with a job's TLS, auth and redirect settings.
#[derive(Clone, Debug)]
pub struct Fetcher {
    client: Client,
    auth: Auth,
    body_limit: u64,
}

/// The settings [`Fetcher::new`] takes, borrowed from a scrape or HTTP discovery config.
pub struct ClientSettings<'c> {
    /// Basic auth.
    pub basic_auth: &'c Option<BasicAuth>,
    /// An `Authorization` header.
    pub authorization: &'c Option<Authorization>,
    /// A bearer token.
    pub bearer_token: &'c Option<String>,
    /// A bearer token file.
    pub bearer_token_file: &'c Option<PathBuf>,
    /// TLS.
    pub tls: &'c TlsConfig,
    /// Whether to follow redirects.
    pub follow_redirects: bool,
    /// The body cap, in bytes.
    pub body_limit: u64,
}

impl Fetcher {
    /// A client for `settings`.
    ///
    /// # Errors
    ///
    /// A [`ClientError`] when a TLS file cannot be read or parsed.
    pub fn new(settings: &ClientSettings<'_>) -> Result<Fetcher, ClientError> {
        let mut builder = Client::builder()
            .user_agent(concat!("smolder-agent/", env!("CARGO_PKG_VERSION")))
            .redirect(if settings.follow_redirects {
                redirect::Policy::limited(10)
            } else {
                redirect::Policy::none()
            })
            .pool_idle_timeout(Duration::from_secs(300))
            .danger_accept_invalid_certs(settings.tls.insecure_skip_verify);
        if let Some(path) = &settings.tls.ca_file {
            let pem = read(path, "ca-file")?;
            let certs = Certificate::from_pem_bundle(&pem).map_err(|source| ClientError::Pem {
                what: "ca-file",
                path: path.clone(),
                source,
            })?;
            builder = builder.tls_built_in_root_certs(false);
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        if let (Some(cert), Some(key)) = (&settings.tls.cert_file, &settings.tls.key_file) {
            let mut pem = read(cert, "cert-file")?;
            pem.push(b'\n');
            pem.extend(read(key, "key-file")?);
            let identity = Identity::from_pem(&pem).map_err(|source| ClientError::Pem {
                what: "cert-file/key-file",
                path: cert.clone(),
                source,
            })?;
            builder = builder.identity(identity);
        }
        let client = builder
            .build()
            .map_err(|source| ClientError::Build { source })?;
        let auth = if let Some(basic) = settings.basic_auth {
            Auth::Basic {
                username: basic.username.clone(),
                password: basic.password.clone(),
                password_file: basic.password_file.clone(),
            }
        } else if let Some(header) = settings.authorization {
            Auth::Header {
                kind: header.kind.clone(),
                credentials: header.credentials.clone(),
                credentials_file: header.credentials_file.clone(),
            }
        } else if settings.bearer_token.is_some() || settings.bearer_token_file.is_some() {
            Auth::Header {
                kind: "Bearer".to_owned(),
                credentials: settings.bearer_token.clone(),
                credentials_file: settings.bearer_token_file.clone(),
            }
        } else {
            Auth::None
        };
        Ok(Fetcher {
            client,
            auth,
            body_limit: settings.body_limit,
        })
    }

    /// GETs `url` and reads its body, all within `timeout`.
    ///
    /// # Errors
    ///
    /// A [`FetchError`] saying what went wrong, in words.
    ///
    /// # Cancel safety
    ///
    /// Cancel-safe: dropping the future drops the connection and nothing else.
    pub async fn get(
        &self,
        url: &Url,
        accept: &str,
        timeout: Duration,
    ) -> Result<Body, FetchError> {
        match tokio::time::timeout(timeout, self.get_inner(url, accept)).await {
            Ok(result) => result,
            Err(_) => Err(FetchError::Timeout { timeout }),
        }
    }

    async fn get_inner(&self, url: &Url, accept: &str) -> Result<Body, FetchError> {
        let mut request = self
            .client
            .get(url.clone())
            .header(ACCEPT, accept)
            .header(ACCEPT_ENCODING, "gzip");
        match self.credentials().await? {
            Credentials::None => {}
            Credentials::Basic(username, password) => {
                request = request.basic_auth(username, Some(password));
            }
            Credentials::Header(value) => request = request.header(AUTHORIZATION, value),
        }
        let mut response = request.send().await.map_err(|err| classify(url, &err))?;
        let status = response.status();
        let header = |name| {
            response
                .headers()
                .get(name)
                .and_then(|v: &reqwest::header::HeaderValue| v.to_str().ok())
                .unwrap_or("")
                .to_owned()
        };
        let content_type = header(CONTENT_TYPE);
        let gzip = header(CONTENT_ENCODING).eq_ignore_ascii_case("gzip");
        if response
            .content_length()
            .is_some_and(|n| n > self.body_limit)
        {
            return Err(FetchError::TooLarge {
                limit: self.body_limit,
            });
        }
        let mut bytes = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|err| classify(url, &err))? {
            if (bytes.len() + chunk.len()) as u64 > self.body_limit {
                return Err(FetchError::TooLarge {
                    limit: self.body_limit,
                });
            }
            bytes.extend_from_slice(&chunk);
        }
        if status != reqwest::StatusCode::OK {
            let text = String::from_utf8_lossy(&bytes[..bytes.len().min(200)]);
            return Err(FetchError::Status {
                status: status.to_string(),
                body: text.trim().to_owned(),
            });
        }
        Ok(Body {
            bytes,
            content_type,
            gzip,
        })
    }

    /// The credentials to send, reading credential files now so that rotated secrets apply
    /// without a restart.
    async fn credentials(&self) -> Result<Credentials<'_>, FetchError> {
        match &self.auth {
            Auth::None => Ok(Credentials::None),
            Auth::Basic {
                username,
                password,
                password_file,
            } => {
                let password = match password_file {
                    Some(path) => read_secret(path, "password").await?,
                    None => password.clone().unwrap_or_default(),
                };
                Ok(Credentials::Basic(username, password))
            }
            Auth::Header {
                kind,
                credentials,
                credentials_file,
            } => {
                let credentials = match credentials_file {
                    Some(path) => read_secret(path, "credentials").await?,
                    None => credentials.clone().unwrap_or_default(),
                };
                Ok(Credentials::Header(format!("{kind} {credentials}")))
            }
        }
    }
}

/// What one request authenticates with.
enum Credentials<'a> {
    None,
    Basic(&'a str, String),
    Header(String),
}

fn read(path: &Path, what: &'static str) -> Result<Vec<u8>, ClientError> {
    std::fs::read(path).map_err(|source| ClientError::Read {
        what,
        path: path.to_owned(),
        source,
    })
}

async fn read_secret(path: &Path, what: &'static str) -> Result<String, FetchError> {
    let text = tokio::fs::read_to_string(path)
        .await
        .map_err(|source| FetchError::Credentials {
            what,
            path: path.to_owned(),
            source,
        })?;
    Ok(text.trim().to_owned())
}

/// Sorts a reqwest error into a [`FetchError`] whose message names the innermost cause
/// (`Connection refused (os error 111)`) rather than reqwest's generic outer text.
fn classify(url: &Url, err: &reqwest::Error) -> FetchError {
    let url_text = url.as_str().to_owned();
    if err.is_redirect() {
        return FetchError::Redirects { url: url_text };
    }
    let mut causes = Vec::new();
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !causes.contains(&text) {
            causes.push(text);
        }
        source = cause.source();
    }
    let detail = if causes.is_empty() {
        err.to_string()
    } else {
        causes.join(": ")
    };
    if err.is_connect() {
        FetchError::Connect {
            url: url_text,
            detail,
        }
    } else {
        FetchError::Request {
            url: url_text,
            detail,
        }
    }
}

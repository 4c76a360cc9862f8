//! How targets are reached: HTTPS with the job's CA, a client certificate and skip-verify, and
//! basic and bearer authentication, against real servers (certificates made with `openssl`).

use super::*;

/// Runs `openssl` with `args` in `dir`.
fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("running openssl");
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, made with `openssl`.
fn make_certificates(dir: &Path) {
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    let mut ca = vec!["req", "-x509", "-days", "1", "-subj", "/CN=smolder test CA"];
    ca.extend(ec);
    ca.extend(["-keyout", "ca.key", "-out", "ca.pem"]);
    openssl(dir, &ca);
    for (name, extensions) in [
        (
            "server",
            "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n",
        ),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ] {
        std::fs::write(dir.join(format!("{name}.ext")), extensions).unwrap();
        let key = format!("{name}.key");
        let csr = format!("{name}.csr");
        let subject = format!("/CN={name}");
        let mut request = vec!["req", "-subj", &subject];
        request.extend(ec);
        request.extend(["-keyout", &key, "-out", &csr]);
        openssl(dir, &request);
        let ext = format!("{name}.ext");
        let pem = format!("{name}.pem");
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-days",
                "1",
                "-in",
                &csr,
                "-CA",
                "ca.pem",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-extfile",
                &ext,
                "-out",
                &pem,
            ],
        );
    }
}

/// An HTTPS server on a loopback port answering every request with a heap profile, on its own
/// threads (rustls over std sockets). With `client_ca`, it requires a client certificate that
/// CA signed.
fn serve_tls(dir: &Path, client_ca: bool) -> SocketAddr {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    use std::io::{Read as _, Write as _};

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(dir.join("server.pem"))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    let key = PrivateKeyDer::from_pem_file(dir.join("server.key")).unwrap();
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .unwrap();
    let builder = if client_ca {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(dir.join("ca.pem")).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                .build()
                .unwrap();
        builder.with_client_cert_verifier(verifier)
    } else {
        builder.with_no_client_auth()
    };
    let config = Arc::new(builder.with_single_cert(certs, key).unwrap());
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let body = heap_profile();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(stream) = stream else { continue };
            let config = Arc::clone(&config);
            let body = body.clone();
            std::thread::spawn(move || {
                let connection = rustls::ServerConnection::new(config).unwrap();
                let mut tls = rustls::StreamOwned::new(connection, stream);
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf) {
                        Ok(0) | Err(_) => return,
                        Ok(n) => request.extend_from_slice(&buf[..n]),
                    }
                }
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = tls.write_all(head.as_bytes());
                let _ = tls.write_all(&body);
                tls.conn.send_close_notify();
                let _ = tls.flush();
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_targets_with_ca_client_certificates_and_skip_verify() {
    let dir = tempfile::tempdir().unwrap();
    make_certificates(dir.path());
    let plain = serve_tls(dir.path(), false);
    let mutual = serve_tls(dir.path(), true);
    let d = dir.path().display();
    let job = |name: &str, tls: &str, targets: &[SocketAddr]| {
        let targets: Vec<String> = targets.iter().map(|t| format!("'{t}'")).collect();
        scrape_config(&format!(
            "job-name: {name}\nscheme: https\nenabled-profiles: [mem]\nscrape-interval: 1s\n\
             scrape-timeout: 900ms\ntls_config: {tls}\n\
             static-configs: [{{application: app, targets: [{}]}}]\n",
            targets.join(", ")
        ))
    };
    let configs = [
        job("ca", &format!("{{ca_file: {d}/ca.pem}}"), &[plain, mutual]),
        job(
            "mtls",
            &format!(
                "{{ca_file: {d}/ca.pem, cert_file: {d}/client.pem, key_file: {d}/client.key}}"
            ),
            &[mutual],
        ),
        job("system-roots", "{}", &[plain]),
        job("skip-verify", "{insecure_skip_verify: true}", &[plain]),
    ];
    let (scraper, _profiles) = start_scraper(&configs);
    let doc = wait_for_status(&scraper, "every https target scraped", |doc| {
        let active = doc["activeTargets"].as_array().unwrap();
        active.len() == 5 && active.iter().all(|t| t["health"] != "unknown")
    })
    .await;
    let health = |job: &str, addr: SocketAddr| {
        let target = doc["activeTargets"]
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["job"] == job && t["labels"]["instance"] == addr.to_string())
            .unwrap();
        (
            target["health"].as_str().unwrap().to_owned(),
            target["lastError"].as_str().unwrap().to_owned(),
        )
    };
    assert_eq!(health("ca", plain).0, "up", "{doc:#}");
    let (status, error) = health("ca", mutual);
    assert_eq!(
        status, "down",
        "a server requiring a client certificate refuses us"
    );
    assert!(!error.is_empty());
    assert_eq!(health("mtls", mutual).0, "up", "{doc:#}");
    let (status, error) = health("system-roots", plain);
    assert_eq!(status, "down");
    assert!(
        error.contains("certificate") || error.contains("UnknownIssuer"),
        "{error}"
    );
    assert_eq!(health("skip-verify", plain).0, "up", "{doc:#}");
    scraper.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn basic_and_bearer_auth_are_sent() {
    use axum::http::{HeaderMap, StatusCode};
    // "user:secret" and a bearer token.
    let protected = serve(Router::new().fallback(get(|headers: HeaderMap| async move {
        let auth = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if auth == "Basic dXNlcjpzZWNyZXQ=" || auth == "Bearer t0ken" {
            (StatusCode::OK, heap_profile()).into_response()
        } else {
            (StatusCode::UNAUTHORIZED, "who are you").into_response()
        }
    })))
    .await;
    let dir = tempfile::tempdir().unwrap();
    let password = dir.path().join("password");
    std::fs::write(&password, "secret\n").unwrap();
    let job = |name: &str, auth: &str| {
        scrape_config(&format!(
            "job-name: {name}\nenabled-profiles: [mem]\nscrape-interval: 1s\n\
             scrape-timeout: 900ms\n{auth}\n\
             static-configs: [{{application: app, targets: ['{protected}']}}]\n"
        ))
    };
    let configs = [
        job(
            "basic-file",
            &format!(
                "basic_auth: {{username: user, password_file: {}}}",
                password.display()
            ),
        ),
        job("bearer", "bearer_token: t0ken"),
        job("authorization", "authorization: {credentials: t0ken}"),
        job("wrong", "basic_auth: {username: user, password: guess}"),
    ];
    let (scraper, _profiles) = start_scraper(&configs);
    let doc = wait_for_status(&scraper, "every auth target scraped", |doc| {
        let active = doc["activeTargets"].as_array().unwrap();
        active.len() == 4 && active.iter().all(|t| t["health"] != "unknown")
    })
    .await;
    for target in doc["activeTargets"].as_array().unwrap() {
        if target["job"] == "wrong" {
            assert_eq!(target["health"], "down");
            assert_eq!(
                target["lastError"],
                "HTTP status 401 Unauthorized: who are you"
            );
        } else {
            assert_eq!(target["health"], "up", "{target:#}");
        }
    }
    scraper.stop().await;
}

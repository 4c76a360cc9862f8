//! An S3 API that honours conditional writes (`If-None-Match: *` and `If-Match` on PUT), for
//! the compaction lease of object-storage mode, which Garage cannot exercise (it overwrites):
//! moto's standalone server (PyPI `moto[server]`, the version `scripts/test` installs), an
//! implementation of AWS's APIs written by others that keeps objects in memory. [`Moto`] is one
//! server on loopback, port 0, with one bucket; killed when dropped.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;

use crate::process::Process;

/// The moto release the tests are written against.
pub const VERSION: &str = "5.2.6";

/// The region the tests name (moto answers for any).
pub const REGION: &str = "us-east-1";

/// A running moto S3 server with one bucket.
pub struct Moto {
    _process: Process,
    /// The S3 endpoint, `http://127.0.0.1:<port>`.
    pub endpoint: String,
    /// The bucket made at start.
    pub bucket: String,
}

impl Moto {
    /// Starts a server and creates bucket `bucket` (moto takes requests unsigned).
    ///
    /// # Panics
    ///
    /// When moto is not installed (with the command that installs it), or does not come up.
    pub fn start(bucket: &str) -> Moto {
        let installed = Command::new("python3")
            .args(["-c", "import moto.server"])
            .status()
            .is_ok_and(|status| status.success());
        assert!(
            installed,
            "the lease test needs moto's S3 server, which is not installed: run \
             `python3 -m pip install 'moto[server]=={VERSION}'` (scripts/test does)"
        );
        let mut command = Command::new("python3");
        command.args(["-m", "moto.server", "-H", "127.0.0.1", "-p", "0"]);
        let process = Process::spawn(command);
        let line = process.wait_for_line("its address", |line| line.contains("Running on http://"));
        let endpoint = line
            .split("Running on ")
            .nth(1)
            .expect("checked above")
            .trim()
            .trim_end_matches('/')
            .to_owned();
        let authority = endpoint.trim_start_matches("http://");
        let mut stream = TcpStream::connect(authority).expect("moto listens");
        write!(
            stream,
            "PUT /{bucket} HTTP/1.1\r\nHost: {authority}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        )
        .expect("asking for the bucket");
        let mut answer = String::new();
        stream.read_to_string(&mut answer).expect("moto answers");
        assert!(
            answer.starts_with("HTTP/1.1 200"),
            "creating bucket {bucket}: {answer}"
        );
        Moto {
            _process: process,
            endpoint,
            bucket: bucket.to_owned(),
        }
    }

    /// The `store:` section's `object-store` for the bucket, any key (moto checks none), with
    /// `extra` lines (indented four spaces, for `object-store`, or two, for `store`) after it.
    pub fn store_yaml(&self, extra: &str) -> String {
        format!(
            "  object-store:\n    type: s3\n    bucket: {}\n    endpoint: {}\n    region: {REGION}\n    access-key-id: smolder\n    secret-access-key: smolder\n{extra}",
            self.bucket, self.endpoint
        )
    }
}

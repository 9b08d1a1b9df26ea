//! The test services `scripts/services` starts on 127.0.0.1 (s3s-fs, rsync --daemon), as stores
//! under a prefix of their own per call, so tests running side by side never meet.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use weir_engine::backup::{RsyncOptions, RsyncStore, S3Options, S3Store, Store};

fn var(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the tests with scripts/test (or `source scripts/services` first)")
    })
}

/// A prefix no other call of this process, or other process, uses.
pub fn unique(test: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos();
    format!("{test}-{}-{nanos}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// The S3 server's options, with its keys.
pub fn s3_options() -> S3Options {
    S3Options {
        endpoint: Some(var("WEIR_TEST_S3_ENDPOINT")),
        access_key: Some(var("WEIR_TEST_S3_ACCESS_KEY")),
        secret_key: Some(var("WEIR_TEST_S3_SECRET_KEY")),
        timeout: Some(std::time::Duration::from_secs(10)),
        ..S3Options::default()
    }
}

/// `s3://<bucket>/<prefix>` of the test server.
pub fn s3_url(prefix: &str) -> String {
    format!("s3://{}/{prefix}", var("WEIR_TEST_S3_BUCKET"))
}

/// A store on the S3 test server, under `prefix`.
pub fn s3(prefix: &str) -> Arc<dyn Store> {
    Arc::new(S3Store::open(&var("WEIR_TEST_S3_BUCKET"), prefix, &s3_options()).expect("the S3 test store"))
}

/// The rsync daemon's options, with its password.
pub fn rsync_options() -> RsyncOptions {
    RsyncOptions {
        password: Some(var("WEIR_TEST_RSYNC_PASSWORD")),
        timeout: Some(std::time::Duration::from_secs(10)),
        ..RsyncOptions::default()
    }
}

/// `rsync://weir@127.0.0.1:<port>/<module>/<prefix>` of the test daemon.
pub fn rsync_url(prefix: &str) -> String {
    format!("{}/{prefix}", var("WEIR_TEST_RSYNC_URL"))
}

/// A store on the rsync test daemon, under `prefix`.
pub fn rsync(prefix: &str) -> Arc<dyn Store> {
    Arc::new(RsyncStore::open(&rsync_url(prefix), &rsync_options()).expect("the rsync test store"))
}

/// An `s3s-fs` server of a test's own on 127.0.0.1 (to stop and start again), over a folder
/// that outlives its restarts. Killed when dropped.
pub struct OwnS3 {
    pub port: u16,
    pub root: tempfile::TempDir,
    child: Option<std::process::Child>,
}

impl OwnS3 {
    pub const KEY: &'static str = "own-access";
    pub const SECRET: &'static str = "own-secret-key-0123456789";
    pub const BUCKET: &'static str = "own";

    /// Starts it on a free port.
    pub fn start() -> Self {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join(Self::BUCKET)).unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut s = OwnS3 { port, root, child: None };
        s.resume();
        s
    }

    /// Starts the server again (same port, same objects) and waits until it listens.
    pub fn resume(&mut self) {
        let child = std::process::Command::new("s3s-fs")
            .args(["--host", "127.0.0.1", "--port", &self.port.to_string()])
            .args(["--access-key", Self::KEY, "--secret-key", Self::SECRET])
            .arg(self.root.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("s3s-fs on the PATH (scripts/install-deps installs it)");
        self.child = Some(child);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(std::time::Instant::now() < deadline, "s3s-fs did not start on {}", self.port);
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }

    /// Kills the server (requests in flight fail, new ones are refused).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// A store on it under `prefix`, with short timeouts and one retry.
    pub fn store(&self, prefix: &str) -> Arc<dyn Store> {
        let opts = S3Options {
            endpoint: Some(format!("http://127.0.0.1:{}", self.port)),
            access_key: Some(Self::KEY.into()),
            secret_key: Some(Self::SECRET.into()),
            timeout: Some(std::time::Duration::from_secs(2)),
            retries: Some(1),
            ..S3Options::default()
        };
        Arc::new(S3Store::open(Self::BUCKET, prefix, &opts).expect("the own S3 store"))
    }
}

impl Drop for OwnS3 {
    fn drop(&mut self) {
        self.kill();
    }
}

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

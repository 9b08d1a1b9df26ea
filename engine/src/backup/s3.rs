//! The S3 store: any S3-compatible server (AWS, MinIO, `s3s-fs`, …) through the `object_store`
//! crate, under `s3://bucket/prefix`.
//!
//! `object_store` and not the design card's `rusoto_s3`: rusoto has been unmaintained since 2022;
//! `object_store` (Apache Arrow) is maintained, signs requests (SigV4), retries with exponential
//! backoff and jitter, and does multipart uploads, with timeouts on every request.
//!
//! Invariants: every call is bounded (`S3Options::timeout` per request, `retry_timeout` in all);
//! an object is visible whole or not at all (S3 puts and completed multipart uploads are atomic);
//! errors name the store's URL, the operation and the key, and say whether retrying can help
//! (credentials refused: no).
//!
//! The [`Store`] trait is synchronous (the uploader pool and the coordinator's store thread call
//! it from their own threads); each call runs on a small Tokio runtime owned by the store.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjPath;
use object_store::{
    BackoffConfig, ClientOptions, ObjectStore, ObjectStoreExt, PutPayload, RetryConfig, WriteMultipart,
};

use super::{Store, StoreError};

/// How to reach an S3-compatible server. Unset fields come from the usual `AWS_*` environment
/// variables (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`, `AWS_ENDPOINT_URL`, …).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct S3Options {
    /// Endpoint of a custom server (`http://127.0.0.1:9000`; default `AWS_ENDPOINT_URL`, else
    /// AWS); plain HTTP is allowed when the endpoint says `http://`, and requests are path-style.
    pub endpoint: Option<String>,
    /// Region (default `us-east-1`).
    pub region: Option<String>,
    /// Access key id.
    pub access_key: Option<String>,
    /// Secret access key.
    pub secret_key: Option<String>,
    /// Timeout of one request (default 30 s).
    pub timeout: Option<Duration>,
    /// Retries of a failed request (default 3), with exponential backoff and jitter.
    pub retries: Option<usize>,
}

impl std::fmt::Debug for S3Options {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Options")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .field("access_key", &self.access_key)
            .field("secret_key", &self.secret_key.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .field("retries", &self.retries)
            .finish()
    }
}

/// Files at least this large go up as multipart uploads.
pub const MULTIPART_THRESHOLD: u64 = 16 << 20;
/// Part size of a multipart upload.
pub const PART_SIZE: usize = 8 << 20;

/// A store in an S3 bucket, under a prefix.
pub struct S3Store {
    url: String,
    prefix: String,
    s3: Arc<AmazonS3>,
    rt: tokio::runtime::Runtime,
}

impl std::fmt::Debug for S3Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // No credentials in logs.
        f.debug_struct("S3Store").field("url", &self.url).finish_non_exhaustive()
    }
}

impl S3Store {
    /// The store at `s3://bucket/prefix`. Fails only on a malformed URL or options (nothing is
    /// contacted yet: the first call says whether the server answers and takes the credentials).
    pub fn open(bucket: &str, prefix: &str, opts: &S3Options) -> Result<Self, StoreError> {
        let url = format!("s3://{bucket}/{prefix}");
        let bad = |reason: String| StoreError::Config { store: url.clone(), reason };
        let timeout = opts.timeout.unwrap_or(Duration::from_secs(30));
        let mut b = AmazonS3Builder::from_env().with_bucket_name(bucket).with_virtual_hosted_style_request(false);
        let endpoint = opts.endpoint.clone().or_else(|| {
            ["AWS_ENDPOINT_URL", "AWS_ENDPOINT"].iter().find_map(|v| std::env::var(v).ok()).filter(|e| !e.is_empty())
        });
        let http = endpoint.as_deref().is_some_and(|e| e.starts_with("http://"));
        if let Some(e) = &endpoint {
            b = b.with_endpoint(e).with_allow_http(http);
        }
        b = b.with_region(opts.region.clone().unwrap_or_else(|| "us-east-1".into()));
        let env_keys = std::env::var_os("AWS_ACCESS_KEY_ID").is_some() || std::env::var_os("AWS_PROFILE").is_some();
        if endpoint.is_some() && opts.access_key.is_none() && !env_keys {
            // Without keys the client falls back to the instance metadata service, which a
            // custom server never has: say what is missing instead of a strange 403.
            return Err(bad("no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY".into()));
        }
        if let Some(k) = &opts.access_key {
            b = b.with_access_key_id(k);
        }
        if let Some(k) = &opts.secret_key {
            b = b.with_secret_access_key(k);
        }
        // reqwest is built without a TLS provider of its own (see Cargo.toml): HTTPS endpoints
        // use the process default, ring, installed here unless the process chose one already.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = ClientOptions::new()
            .with_timeout(timeout)
            .with_connect_timeout(Duration::from_secs(5))
            .with_allow_http(http);
        let retries = opts.retries.unwrap_or(3);
        let retry = RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(5),
                base: 2.0,
            },
            max_retries: retries,
            retry_timeout: timeout * (retries as u32 + 1),
        };
        let s3 = b.with_client_options(client).with_retry(retry).build().map_err(|e| bad(e.to_string()))?;
        let rt = tokio::runtime::Builder::new_multi_thread()
            // Measured (`weir-e2e backup`): restoring 16 x 8 MiB with 8 requests at a time ran
            // at 63 % of boto3's speed with 2 threads, 92 % with 4; they idle between calls.
            .worker_threads(4)
            .thread_name("weir-s3")
            .enable_all()
            .build()
            .map_err(|e| bad(format!("starting its I/O runtime: {e}")))?;
        Ok(Self { url, prefix: prefix.trim_matches('/').to_string(), s3: Arc::new(s3), rt })
    }

    fn path(&self, key: &str) -> Result<ObjPath, StoreError> {
        if key.split('/').any(|p| p.is_empty() || p == "." || p == "..") {
            return Err(StoreError::Config { store: self.url.clone(), reason: format!("invalid key {key:?}") });
        }
        let full = if self.prefix.is_empty() { key.to_string() } else { format!("{}/{key}", self.prefix) };
        ObjPath::parse(&full).map_err(|e| StoreError::Config { store: self.url.clone(), reason: e.to_string() })
    }

    fn error(&self, op: &'static str, key: &str, e: object_store::Error) -> StoreError {
        use object_store::Error as E;
        match e {
            E::NotFound { .. } => StoreError::NotFound { key: key.into() },
            E::Unauthenticated { .. } | E::PermissionDenied { .. } => {
                StoreError::Denied { store: self.url.clone(), op, key: key.into(), reason: e.to_string() }
            }
            // A request the server refused for its signature says so in a 403 that
            // `object_store` reports as generic: credentials, not the network.
            e if is_forbidden(&e) => {
                StoreError::Denied { store: self.url.clone(), op, key: key.into(), reason: e.to_string() }
            }
            e => StoreError::Unavailable { op, key: key.into(), reason: format!("{}: {e}", self.url) },
        }
    }

    async fn upload_file(&self, path: &ObjPath, src: &Path, len: u64) -> Result<(), object_store::Error> {
        if len < MULTIPART_THRESHOLD {
            let bytes = tokio::fs::read(src)
                .await
                .map_err(|e| object_store::Error::Generic { store: "local file", source: Box::new(e) })?;
            return self.s3.put(path, PutPayload::from(bytes)).await.map(|_| ());
        }
        use tokio::io::AsyncReadExt;
        let mut f = tokio::fs::File::open(src)
            .await
            .map_err(|e| object_store::Error::Generic { store: "local file", source: Box::new(e) })?;
        let upload = self.s3.put_multipart(path).await?;
        let mut w = WriteMultipart::new_with_chunk_size(upload, PART_SIZE);
        let mut buf = vec![0u8; PART_SIZE];
        loop {
            let n = match f.read(&mut buf).await {
                Ok(n) => n,
                Err(e) => {
                    w.abort().await?;
                    return Err(object_store::Error::Generic { store: "local file", source: Box::new(e) });
                }
            };
            if n == 0 {
                break;
            }
            // At most a few parts in flight: memory stays bounded for any file size.
            w.wait_for_capacity(4).await?;
            w.write(&buf[..n]);
        }
        w.finish().await.map(|_| ())
    }
}

fn is_forbidden(e: &object_store::Error) -> bool {
    says_forbidden(&e.to_string())
}

/// Whether an error's text is a server's refusal of the credentials. `object_store` keeps the
/// status in a type it does not export, so the text is all there is: the status as its message
/// prints it or S3's error codes, never a bare "403" (the elapsed time, a port or a key may hold
/// one).
fn says_forbidden(s: &str) -> bool {
    ["status code: 403", "AccessDenied", "SignatureDoesNotMatch", "InvalidAccessKeyId"]
        .iter()
        .any(|needle| s.contains(needle))
}

impl Store for S3Store {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        let path = self.path(key)?;
        let payload = PutPayload::from(bytes.to_vec());
        self.rt.block_on(self.s3.put(&path, payload)).map(|_| ()).map_err(|e| self.error("put", key, e))
    }

    fn put_file(&self, key: &str, src: &Path) -> Result<(), StoreError> {
        let path = self.path(key)?;
        let len = std::fs::metadata(src)
            .map_err(|e| StoreError::Unavailable { op: "read", key: src.display().to_string(), reason: e.to_string() })?
            .len();
        self.rt.block_on(self.upload_file(&path, src, len)).map_err(|e| self.error("put", key, e))
    }

    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        let path = self.path(key)?;
        self.rt
            .block_on(async { self.s3.get(&path).await?.bytes().await })
            .map(Vec::from)
            .map_err(|e| self.error("get", key, e))
    }

    fn get_at_most(&self, key: &str, max: u64) -> Result<Vec<u8>, StoreError> {
        let path = self.path(key)?;
        let got = self.rt.block_on(async {
            let r = self.s3.get(&path).await?;
            // The size comes with the response's headers, before its body is read; the body is
            // then read piece by piece and dropped at the first byte past `max` (a server may
            // send more than it said).
            if r.meta.size > max {
                return Ok(Err(r.meta.size));
            }
            let mut out = Vec::with_capacity(r.meta.size as usize);
            let mut body = r.into_stream();
            while let Some(piece) = body.try_next().await? {
                if (out.len() + piece.len()) as u64 > max {
                    return Ok(Err((out.len() + piece.len()) as u64));
                }
                out.extend_from_slice(&piece);
            }
            Ok(Ok(out))
        });
        match got.map_err(|e| self.error("get", key, e))? {
            Ok(bytes) => Ok(bytes),
            Err(size) => Err(StoreError::TooLarge { key: key.into(), size, max }),
        }
    }

    fn get_to_file(&self, key: &str, max: u64, dest: &Path) -> Result<u64, StoreError> {
        use std::io::Write;
        let path = self.path(key)?;
        let write = super::write_failed(dest);
        let mut to = crate::private_fs::create_new_private(dest).map_err(write)?;
        let got = self.rt.block_on(async {
            let r = self.s3.get(&path).await?;
            if r.meta.size > max {
                return Ok(Err(r.meta.size));
            }
            let mut n = 0u64;
            let mut body = r.into_stream();
            while let Some(piece) = body.try_next().await? {
                n += piece.len() as u64;
                if n > max {
                    return Ok(Err(n));
                }
                if let Err(e) = to.write_all(&piece) {
                    return Ok(Ok(Err(e)));
                }
            }
            Ok(Ok(Ok(n)))
        });
        match got.map_err(|e| self.error("get", key, e))? {
            Ok(Ok(n)) => {
                to.sync_all().map_err(write)?;
                Ok(n)
            }
            Ok(Err(e)) => Err(write(e)),
            Err(size) => Err(StoreError::TooLarge { key: key.into(), size, max }),
        }
    }

    fn size(&self, key: &str) -> Result<Option<u64>, StoreError> {
        let path = self.path(key)?;
        match self.rt.block_on(self.s3.head(&path)) {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.error("head", key, e)),
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        // S3 lists by whole path segments: list the directory the prefix is in, then filter.
        let dir = prefix.rsplit_once('/').map_or("", |(d, _)| d);
        let full = [self.prefix.as_str(), dir].iter().filter(|s| !s.is_empty()).copied().collect::<Vec<_>>().join("/");
        let at = (!full.is_empty()).then(|| ObjPath::from(full.as_str()));
        let strip = if self.prefix.is_empty() { 0 } else { self.prefix.len() + 1 };
        let metas: Vec<object_store::ObjectMeta> =
            self.rt.block_on(self.s3.list(at.as_ref()).try_collect()).map_err(|e| self.error("list", prefix, e))?;
        let mut keys: Vec<String> = metas
            .into_iter()
            .filter_map(|m| m.location.as_ref().get(strip..).map(str::to_string))
            .filter(|k| k.starts_with(prefix))
            .collect();
        keys.sort();
        Ok(keys)
    }

    fn delete(&self, key: &str) -> Result<(), StoreError> {
        let path = self.path(key)?;
        match self.rt.block_on(self.s3.delete(&path)) {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.error("delete", key, e)),
        }
    }

    /// One `DeleteObjects` request per thousand keys: a retention pass after a burst of
    /// checkpoints deletes hundreds of objects, 10–15 ms each one by one on `s3s-fs`.
    fn delete_many(&self, keys: &[String]) -> Result<(), StoreError> {
        let paths = keys.iter().map(|k| self.path(k)).collect::<Result<Vec<_>, _>>()?;
        let stream = futures::stream::iter(paths.into_iter().map(Ok)).boxed();
        let results: Vec<object_store::Result<ObjPath>> = self.rt.block_on(self.s3.delete_stream(stream).collect());
        for r in results {
            match r {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => {
                    let what = format!("{} keys from {}", keys.len(), keys.first().map_or("", String::as_str));
                    return Err(self.error("delete", &what, e));
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::says_forbidden;

    #[test]
    fn a_refusal_is_read_from_the_status_or_the_s3_code_not_from_any_403_in_the_text() {
        assert!(says_forbidden(
            "Error performing PUT http://127.0.0.1:9000/b/k in 2ms - Server returned non-2xx status code: 403 Forbidden: "
        ));
        assert!(says_forbidden("Server returned error response: <Error><Code>SignatureDoesNotMatch</Code></Error>"));
        assert!(says_forbidden("<Code>InvalidAccessKeyId</Code>"));
        assert!(says_forbidden("<Code>AccessDenied</Code>"));
        // A connection that failed, with a 403 in its elapsed time, its port and its key.
        assert!(!says_forbidden(
            "Generic S3 error: Error performing PUT https://127.0.0.1:34031/b/p/k403 in 403.447µs - HTTP error: error sending request"
        ));
    }
}

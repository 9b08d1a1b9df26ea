//! Choosing a store by URL: `file://PATH` (or a plain path), `s3://bucket/prefix`,
//! `rsync://[user@]host[:port]/module/prefix`.

use std::sync::Arc;

use super::{LocalDirStore, RsyncOptions, RsyncStore, S3Options, S3Store, Store, StoreError};

/// Options of the backends that need them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StoreOptions {
    /// For `s3://`.
    pub s3: S3Options,
    /// For `rsync://`.
    pub rsync: RsyncOptions,
}

/// The store at `url`.
pub fn open_store(url: &str, opts: &StoreOptions) -> Result<Arc<dyn Store>, StoreError> {
    let bad = |reason: &str| StoreError::Config { store: url.into(), reason: reason.into() };
    if let Some(rest) = url.strip_prefix("s3://") {
        let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() {
            return Err(bad("no bucket: s3://bucket[/prefix]"));
        }
        return Ok(Arc::new(S3Store::open(bucket, prefix, &opts.s3)?));
    }
    if url.starts_with("rsync://") {
        return Ok(Arc::new(RsyncStore::open(url, &opts.rsync)?));
    }
    let path = match url.strip_prefix("file://") {
        Some(p) => p,
        None if url.contains("://") => {
            return Err(bad("unknown scheme: use file://PATH, s3://bucket/prefix or rsync://host/module/prefix"));
        }
        None => url,
    };
    if path.is_empty() {
        return Err(bad("no path: file:///absolute/path or file://relative/path"));
    }
    Ok(Arc::new(LocalDirStore::new(path)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_names_its_backend_and_bad_ones_say_what_is_wrong() {
        let o = StoreOptions::default();
        for ok in ["file:///tmp/x", "file://rel/x", "plain/dir", "s3://bucket", "s3://bucket/a/b", "rsync://h/m/p"] {
            assert!(open_store(ok, &o).is_ok(), "{ok}");
        }
        for bad in ["s3://", "s3:///p", "ftp://h/p", "file://", "rsync://h"] {
            match open_store(bad, &o) {
                Err(StoreError::Config { store, .. }) => assert_eq!(store, bad),
                other => panic!("{bad}: {other:?}"),
            }
        }
    }
}

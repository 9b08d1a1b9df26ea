//! The remote-store options every command that reads or writes checkpoints takes.

use std::sync::Arc;

use anyhow::Context;
use weir_engine::backup::{Store, StoreOptions, open_store};

/// Where checkpoints are, and how to reach them.
#[derive(clap::Args, Debug, Clone)]
pub struct RemoteArgs {
    /// Where checkpoints go: `file://PATH`, `s3://bucket/prefix` or
    /// `rsync://[user@]host[:port]/module/prefix`.
    #[arg(long, env = "WEIR_REMOTE", value_name = "URL", global = true)]
    pub remote: Option<String>,
    /// S3 endpoint of a server other than AWS (e.g. `http://127.0.0.1:9000`); credentials come
    /// from `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`.
    #[arg(long, env = "WEIR_S3_ENDPOINT", value_name = "URL", global = true)]
    pub s3_endpoint: Option<String>,
    /// S3 region (default `AWS_REGION`, else us-east-1).
    #[arg(long, env = "WEIR_S3_REGION", global = true)]
    pub s3_region: Option<String>,
    /// File with the rsync user's password (else `RSYNC_PASSWORD`).
    #[arg(long, env = "WEIR_RSYNC_PASSWORD_FILE", value_name = "PATH", global = true)]
    pub rsync_password_file: Option<std::path::PathBuf>,
    /// Where a private scratch directory for rsync downloads goes (a node's or a run's data
    /// directory; default the system's temporary directory).
    #[arg(skip)]
    pub scratch_dir: Option<std::path::PathBuf>,
}

impl RemoteArgs {
    /// Opens the store at `url`.
    pub fn open(&self, url: &str) -> anyhow::Result<Arc<dyn Store>> {
        let mut opts = StoreOptions::default();
        opts.s3.endpoint = self.s3_endpoint.clone();
        opts.s3.region = self.s3_region.clone().or_else(|| std::env::var("AWS_REGION").ok());
        opts.rsync.password_file = self.rsync_password_file.clone();
        opts.rsync.scratch_dir = self.scratch_dir.clone();
        open_store(url, &opts).with_context(|| format!("opening the remote store {url}"))
    }
}

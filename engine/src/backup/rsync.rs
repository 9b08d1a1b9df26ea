//! The rsync store: an rsync daemon's module, under `rsync://[user@]host[:port]/module/prefix`,
//! through the system `rsync` binary.
//!
//! Invariants: `rsync` runs with an argument vector, never through a shell, so no key or URL is
//! ever interpreted; every call is bounded (rsync's own connection and I/O timeouts, and a
//! deadline after which the process is killed); an object is visible whole or not at all (rsync
//! writes to a temporary name and renames it into place). The password comes from the options
//! or `RSYNC_PASSWORD` (both reach rsync in its environment) or a password file, never from the
//! command line.

use std::collections::BTreeSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::{Store, StoreError};

/// How to reach an rsync daemon.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct RsyncOptions {
    /// The URL's user's password, handed to rsync in its environment (`RSYNC_PASSWORD`), never
    /// on its command line.
    pub password: Option<String>,
    /// A file holding the password of the URL's user (rsync's `--password-file`; it must not be
    /// readable by others). Without one, rsync reads `RSYNC_PASSWORD`.
    pub password_file: Option<PathBuf>,
    /// Connection and I/O timeout of one call (default 30 s).
    pub timeout: Option<Duration>,
    /// Where the private scratch directory for downloads goes (the node's data directory;
    /// default the system's temporary directory). It is created with a random name, mode 0700,
    /// and removed with the store.
    pub scratch_dir: Option<PathBuf>,
    /// The rsync binary (default `rsync` on the `PATH`).
    pub binary: Option<PathBuf>,
}

impl std::fmt::Debug for RsyncOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RsyncOptions")
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("password_file", &self.password_file)
            .field("timeout", &self.timeout)
            .field("scratch_dir", &self.scratch_dir)
            .field("binary", &self.binary)
            .finish()
    }
}

/// A store in an rsync daemon's module.
#[derive(Debug)]
pub struct RsyncStore {
    /// `rsync://[user@]host[:port]/module/prefix`, without a trailing slash.
    base: String,
    opts: RsyncOptions,
    /// Private (0700, random name), removed when the store is dropped.
    scratch: tempfile::TempDir,
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// What one rsync call printed.
struct Ran {
    stdout: String,
}

impl RsyncStore {
    /// The store at `url` (`rsync://[user@]host[:port]/module[/prefix]`). Nothing is contacted
    /// yet: the first call says whether the daemon answers and takes the credentials.
    pub fn open(url: &str, opts: &RsyncOptions) -> Result<Self, StoreError> {
        let bad = |reason: &str| StoreError::Config { store: url.into(), reason: reason.into() };
        let rest = url.strip_prefix("rsync://").ok_or_else(|| bad("not an rsync:// URL"))?;
        let (host, path) = rest.split_once('/').ok_or_else(|| bad("no module: rsync://host[:port]/module[/prefix]"))?;
        if host.is_empty() || path.trim_matches('/').is_empty() {
            return Err(bad("no host or no module: rsync://host[:port]/module[/prefix]"));
        }
        let base = opts.scratch_dir.clone().unwrap_or_else(std::env::temp_dir);
        std::fs::create_dir_all(&base).map_err(|e| bad(&format!("scratch directory in {}: {e}", base.display())))?;
        let scratch = tempfile::Builder::new()
            .prefix("weir-rsync-")
            .tempdir_in(&base)
            .map_err(|e| bad(&format!("scratch directory in {}: {e}", base.display())))?;
        Ok(Self { base: format!("rsync://{host}/{}", path.trim_matches('/')), opts: opts.clone(), scratch })
    }

    fn remote(&self, key: &str) -> Result<String, StoreError> {
        // Keys are plain names: no empty, relative or wildcard parts (a filter rule must match
        // exactly one file).
        let bad_part = |p: &str| p.is_empty() || p == "." || p == ".." || p.contains(['*', '?', '[', '\\']);
        if key.split('/').any(bad_part) {
            return Err(StoreError::Config { store: self.base.clone(), reason: format!("invalid key {key:?}") });
        }
        Ok(format!("{}/{key}", self.base))
    }

    fn scratch_file(&self, what: &str) -> PathBuf {
        self.scratch.path().join(format!("{what}-{}", SEQ.fetch_add(1, Ordering::Relaxed)))
    }

    fn timeout(&self) -> Duration {
        self.opts.timeout.unwrap_or(Duration::from_secs(30))
    }

    /// Runs rsync with `args` (after the common ones), with a deadline.
    fn run(&self, op: &'static str, key: &str, args: &[&str]) -> Result<Ran, StoreError> {
        let t = self.timeout().as_secs().max(1).to_string();
        let out_path = self.scratch_file("out");
        let err_path = self.scratch_file("err");
        let io =
            |e: std::io::Error| StoreError::Unavailable { op, key: key.into(), reason: format!("running rsync: {e}") };
        let mut cmd = Command::new(self.opts.binary.as_deref().unwrap_or(Path::new("rsync")));
        cmd.arg(format!("--timeout={t}")).arg(format!("--contimeout={t}"));
        if let Some(p) = &self.opts.password_file {
            cmd.arg(format!("--password-file={}", p.display()));
        }
        let given = self.opts.password.is_some()
            || self.opts.password_file.is_some()
            || std::env::var_os("RSYNC_PASSWORD").is_some();
        if let Some(p) = &self.opts.password {
            cmd.env("RSYNC_PASSWORD", p);
        } else if !given {
            // Without a password rsync would ask for one on the terminal and wait: an empty
            // one fails at once, and the error says what to set.
            cmd.env("RSYNC_PASSWORD", "");
        }
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(File::create(&out_path).map_err(io)?))
            .stderr(Stdio::from(File::create(&err_path).map_err(io)?));
        let mut child = cmd.spawn().map_err(io)?;
        // rsync's own timeouts cover stalls; this covers everything else (and a daemon that
        // accepts the connection and never speaks).
        let deadline = Instant::now() + self.timeout() * 2 + Duration::from_secs(1);
        let status = loop {
            if let Some(s) = child.try_wait().map_err(io)? {
                break s;
            }
            if Instant::now() >= deadline {
                let _ = child.kill();
                let _ = child.wait();
                let _ = std::fs::remove_file(&out_path);
                let _ = std::fs::remove_file(&err_path);
                return Err(StoreError::Unavailable {
                    op,
                    key: key.into(),
                    reason: format!("{}: no answer within {:?}", self.base, self.timeout() * 2),
                });
            }
            std::thread::sleep(Duration::from_millis(1));
        };
        let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
        let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
        let _ = std::fs::remove_file(&out_path);
        let _ = std::fs::remove_file(&err_path);
        if status.success() {
            return Ok(Ran { stdout });
        }
        let said = stderr.lines().filter(|l| !l.trim().is_empty()).take(3).collect::<Vec<_>>().join("; ");
        let code = status.code().unwrap_or(-1);
        Err(if said.contains("auth failed") || said.contains("password") {
            let reason =
                if given { said } else { format!("{said}; no password given: set RSYNC_PASSWORD or a password file") };
            StoreError::Denied { store: self.base.clone(), op, key: key.into(), reason }
        } else if said.contains("Unknown module") {
            StoreError::Config { store: self.base.clone(), reason: said }
        } else if code == 23 && said.contains("No such file or directory") {
            StoreError::NotFound { key: key.into() }
        } else {
            StoreError::Unavailable { op, key: key.into(), reason: format!("{}: rsync exit {code}: {said}", self.base) }
        })
    }

    fn send(&self, key: &str, src: &Path) -> Result<(), StoreError> {
        let dst = self.remote(key)?;
        let src = src
            .to_str()
            .ok_or_else(|| StoreError::Config { store: self.base.clone(), reason: "non-UTF-8 path".into() })?;
        // `--mkpath`: the key's parent folders are made as needed. A delete may remove a folder
        // it just made, as it empties, before its temporary file is there: made again.
        let mut tries = 0;
        loop {
            match self.run("put", key, &["-q", "--mkpath", "--chmod=F644", "--", src, &dst]) {
                Ok(_) => return Ok(()),
                Err(StoreError::NotFound { .. }) if tries < 4 => tries += 1,
                // A put never finds nothing: its folder went under it, again and again.
                Err(StoreError::NotFound { key }) => {
                    let reason = format!("{}: its folder was removed while written, 5 times", self.base);
                    return Err(StoreError::Unavailable { op: "put", key, reason });
                }
                Err(e) => return Err(e),
            }
        }
    }
}

/// Parses one line of `rsync --list-only --no-h` (`-rw-r--r--  1234 2026/12/01 10:00:00 name`):
/// a regular file's size and name.
fn parse_listing(line: &str) -> Option<(u64, &str)> {
    let mut it = line.splitn(5, ' ').filter(|s| !s.is_empty());
    let mode = it.next()?;
    if !mode.starts_with('-') {
        return None;
    }
    let rest = line[mode.len()..].trim_start();
    let (size, rest) = rest.split_once(' ')?;
    let size = size.parse().ok()?;
    let rest = rest.trim_start();
    let (_date, rest) = rest.split_once(' ')?;
    let (_time, name) = rest.trim_start().split_once(' ')?;
    Some((size, name))
}

impl Store for RsyncStore {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        let tmp = self.scratch_file("put");
        std::fs::write(&tmp, bytes).map_err(|e| StoreError::Unavailable {
            op: "put",
            key: key.into(),
            reason: format!("scratch file: {e}"),
        })?;
        let r = self.send(key, &tmp);
        let _ = std::fs::remove_file(&tmp);
        r
    }

    fn put_file(&self, key: &str, src: &Path) -> Result<(), StoreError> {
        self.send(key, src)
    }

    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        let src = self.remote(key)?;
        let tmp = self.scratch_file("get");
        let dst = tmp.to_str().expect("scratch paths are UTF-8").to_string();
        let r = self.run("get", key, &["-q", "--chmod=F600", "--", &src, &dst]).and_then(|_| {
            std::fs::read(&tmp).map_err(|e| StoreError::Unavailable {
                op: "get",
                key: key.into(),
                reason: format!("scratch file: {e}"),
            })
        });
        let _ = std::fs::remove_file(&tmp);
        r
    }

    fn get_at_most(&self, key: &str, max: u64) -> Result<Vec<u8>, StoreError> {
        use std::io::Read;
        let src = self.remote(key)?;
        let tmp = self.scratch_file("get");
        let dst = tmp.to_str().expect("scratch paths are UTF-8").to_string();
        // rsync itself refuses a larger file (`--max-size`), so none reaches the disk either.
        let max_size = format!("--max-size={}", max.saturating_add(1));
        let r = self.run("get", key, &["-q", "--chmod=F600", &max_size, "--", &src, &dst]).and_then(|_| {
            let scratch = |e: std::io::Error| StoreError::Unavailable {
                op: "get",
                key: key.into(),
                reason: format!("scratch file: {e}"),
            };
            let f = match std::fs::File::open(&tmp) {
                Ok(f) => f,
                // Skipped by --max-size (or gone): ask what is there.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(match self.size(key)? {
                        Some(size) => StoreError::TooLarge { key: key.into(), size, max },
                        None => StoreError::NotFound { key: key.into() },
                    });
                }
                Err(e) => return Err(scratch(e)),
            };
            let mut bytes = Vec::new();
            f.take(max.saturating_add(1)).read_to_end(&mut bytes).map_err(scratch)?;
            if bytes.len() as u64 > max {
                return Err(StoreError::TooLarge { key: key.into(), size: bytes.len() as u64, max });
            }
            Ok(bytes)
        });
        let _ = std::fs::remove_file(&tmp);
        r
    }

    fn get_to_file(&self, key: &str, max: u64, dest: &Path) -> Result<u64, StoreError> {
        let src = self.remote(key)?;
        let tmp = self.scratch_file("get");
        let to = tmp.to_str().expect("scratch paths are UTF-8").to_string();
        let max_size = format!("--max-size={}", max.saturating_add(1));
        let r = self.run("get", key, &["-q", "--chmod=F600", &max_size, "--", &src, &to]).and_then(|_| {
            let len = match std::fs::symlink_metadata(&tmp) {
                Ok(m) if m.is_file() => m.len(),
                Ok(_) => return Err(StoreError::Corrupt { key: key.into(), reason: "not a regular file".into() }),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(match self.size(key)? {
                        Some(size) => StoreError::TooLarge { key: key.into(), size, max },
                        None => StoreError::NotFound { key: key.into() },
                    });
                }
                Err(e) => {
                    return Err(StoreError::Unavailable {
                        op: "get",
                        key: key.into(),
                        reason: format!("scratch file: {e}"),
                    });
                }
            };
            if len > max {
                return Err(StoreError::TooLarge { key: key.into(), size: len, max });
            }
            let write = super::write_failed(dest);
            // Moved into place when on the same file system (the scratch directory is under the
            // node's data directory), copied into a new private file otherwise.
            if std::fs::rename(&tmp, dest).is_err() {
                let mut out = crate::private_fs::create_new_private(dest).map_err(write)?;
                std::fs::File::open(&tmp).and_then(|mut f| std::io::copy(&mut f, &mut out)).map_err(write)?;
                out.sync_all().map_err(write)?;
            }
            Ok(len)
        });
        let _ = std::fs::remove_file(&tmp);
        r
    }

    fn size(&self, key: &str) -> Result<Option<u64>, StoreError> {
        let src = self.remote(key)?;
        let name = key.rsplit('/').next().unwrap_or(key);
        match self.run("head", key, &["--list-only", "--no-h", "--", &src]) {
            Ok(r) => Ok(r.stdout.lines().filter_map(parse_listing).find(|(_, n)| *n == name).map(|(s, _)| s)),
            Err(StoreError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let dir = prefix.rsplit_once('/').map_or("", |(d, _)| d);
        let src = if dir.is_empty() { format!("{}/", self.base) } else { format!("{}/", self.remote(dir)?) };
        let listed = match self.run("list", prefix, &["--list-only", "--no-h", "-r", "--", &src]) {
            Ok(r) => r.stdout,
            Err(StoreError::NotFound { .. }) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut keys: Vec<String> = listed
            .lines()
            .filter_map(parse_listing)
            .map(|(_, rel)| if dir.is_empty() { rel.to_string() } else { format!("{dir}/{rel}") })
            .filter(|k| k.starts_with(prefix))
            .collect();
        keys.sort();
        Ok(keys)
    }

    fn delete(&self, key: &str) -> Result<(), StoreError> {
        self.delete_many(&[key.to_string()])
    }

    /// One rsync over the store's base per [`KEYS_PER_CALL`] keys, with anchored rules for
    /// each key and each of its folders: the keys go, then every folder of theirs left empty,
    /// deepest first (a listing walks folders: a store that kept them would list slower with
    /// every checkpoint ever taken). A folder that still holds anything (another object, a
    /// put's temporary file) is excluded from the sync's view, so kept; a key already gone
    /// costs nothing, whoever deleted it.
    fn delete_many(&self, keys: &[String]) -> Result<(), StoreError> {
        for chunk in keys.chunks(KEYS_PER_CALL) {
            let mut rules = BTreeSet::new();
            for key in chunk {
                self.remote(key)?;
                let mut at = 0;
                while let Some(i) = key[at..].find('/') {
                    rules.insert(format!("--include=/{}/", &key[..at + i]));
                    at += i + 1;
                }
                rules.insert(format!("--include=/{key}"));
            }
            let empty = self.scratch_file("empty");
            let first = chunk.first().map_or("", String::as_str);
            std::fs::create_dir_all(&empty).map_err(|e| StoreError::Unavailable {
                op: "delete",
                key: first.into(),
                reason: format!("scratch: {e}"),
            })?;
            let (src, dst) = (format!("{}/", empty.display()), format!("{}/", self.base));
            let mut args = vec!["-q", "-r", "--delete"];
            args.extend(rules.iter().map(String::as_str));
            args.extend(["--exclude=*", "--", &src, &dst]);
            let r = self.run("delete", first, &args);
            let _ = std::fs::remove_dir(&empty);
            match r {
                Ok(_) | Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }
}

/// Keys one rsync call deletes at most (each with its folders' rules on its command line).
const KEYS_PER_CALL: usize = 200;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listing_lines_parse_to_files_only() {
        assert_eq!(parse_listing("-rw-r--r--          1234 2026/12/01 10:00:00 a/b c"), Some((1234, "a/b c")));
        assert_eq!(parse_listing("drwxr-xr-x             0 2026/12/01 10:00:00 ."), None);
        assert_eq!(parse_listing("lrwxrwxrwx             4 2026/12/01 10:00:00 l"), None);
        assert_eq!(parse_listing("garbage"), None);
    }

    #[test]
    fn urls_need_a_host_and_a_module() {
        let o = RsyncOptions::default();
        assert!(RsyncStore::open("rsync://127.0.0.1:873/mod/pre/", &o).is_ok());
        for bad in ["rsync://", "rsync://host", "rsync://host/", "s3://b/p", "rsync:///mod"] {
            assert!(matches!(RsyncStore::open(bad, &o), Err(StoreError::Config { .. })), "{bad}");
        }
        let s = RsyncStore::open("rsync://h/m", &o).unwrap();
        for key in ["a/../b", "a//b", "*", "a/[x]"] {
            assert!(s.remote(key).is_err(), "{key}");
        }
    }
}

//! The local-directory store: objects are files under a root directory, written to a temporary
//! name, synced and renamed into place, so a crash leaves the old object or the new one.
//! Files (`put_file`: snapshot SST files) are copied, never hard-linked: the backup shares no
//! bytes with the node's own files, so damage to one leaves the other intact.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::{Store, StoreError};

/// A store in a local directory.
#[derive(Debug, Clone)]
pub struct LocalDirStore {
    root: PathBuf,
}

impl LocalDirStore {
    /// A store rooted at `root` (created on first write).
    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The object at `key`, opened (see `open_object`), and its size: refused past `max`.
    fn open_at_most(&self, key: &str, max: u64) -> Result<(fs::File, u64), StoreError> {
        let f = match open_object(&self.path(key)?) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(StoreError::NotFound { key: key.into() }),
            Err(e) => return Err(unavailable("get", key)(e)),
        };
        let size = f.metadata().map_err(unavailable("get", key))?.len();
        if size > max {
            return Err(StoreError::TooLarge { key: key.into(), size, max });
        }
        Ok((f, size))
    }

    fn path(&self, key: &str) -> Result<PathBuf, StoreError> {
        if key.split('/').any(|p| p.is_empty() || p == "." || p == "..") {
            return Err(StoreError::Unavailable { op: "resolve", key: key.into(), reason: "invalid key".into() });
        }
        Ok(self.root.join(key))
    }
}

fn unavailable<'a>(op: &'static str, key: &'a str) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |e| StoreError::Unavailable { op, key: key.to_string(), reason: e.to_string() }
}

/// A temporary name beside `path`, unique in this process (two threads may write one key).
fn tmp_path(path: &Path) -> PathBuf {
    static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    path.with_extension(format!("tmp-{}-{n}", std::process::id()))
}

/// A new temporary file at `tmp`: an error if anything is there (a link planted at the
/// predictable name is not followed).
fn create_tmp(tmp: &Path) -> std::io::Result<fs::File> {
    let mut o = fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut o, libc::O_NOFOLLOW);
    o.open(tmp)
}

/// Opens the object at `path` for reading: not through a link, not a FIFO or device (which could
/// block a restore for ever), only a regular file.
fn open_object(path: &Path) -> std::io::Result<fs::File> {
    let mut o = fs::OpenOptions::new();
    o.read(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut o, libc::O_NOFOLLOW | libc::O_NONBLOCK);
    let f = o.open(path)?;
    if !f.metadata()?.is_file() {
        return Err(std::io::Error::other("not a regular file"));
    }
    Ok(f)
}

fn sync_dir(dir: &Path) -> std::io::Result<()> {
    fs::File::open(dir)?.sync_all()
}

impl Store for LocalDirStore {
    fn put(&self, key: &str, bytes: &[u8]) -> Result<(), StoreError> {
        let path = self.path(key)?;
        let dir = path.parent().expect("keys have a parent");
        fs::create_dir_all(dir).map_err(unavailable("put", key))?;
        let tmp = tmp_path(&path);
        let mut f = create_tmp(&tmp).map_err(unavailable("put", key))?;
        f.write_all(bytes).map_err(unavailable("put", key))?;
        f.sync_all().map_err(unavailable("put", key))?;
        fs::rename(&tmp, &path).map_err(unavailable("put", key))?;
        sync_dir(dir).map_err(unavailable("put", key))
    }

    fn put_file(&self, key: &str, src: &Path) -> Result<(), StoreError> {
        let path = self.path(key)?;
        let dir = path.parent().expect("keys have a parent");
        fs::create_dir_all(dir).map_err(unavailable("put", key))?;
        let tmp = tmp_path(&path);
        // A copy, never a hard link: a backup that shares the node's bytes dies with them (one
        // damaged byte in a linked file damages the local snapshot and the backup at once).
        // The copy's writes skip the page cache where they can (`direct_io`): nothing reads a
        // stored file back soon, and fresh cache pages were most of an upload's cost.
        let to = create_tmp(&tmp).map_err(unavailable("put", key))?;
        crate::direct_io::copy(src, to, &tmp).map_err(unavailable("put", key))?;
        fs::rename(&tmp, &path).map_err(unavailable("put", key))?;
        sync_dir(dir).map_err(unavailable("put", key))
    }

    fn get(&self, key: &str) -> Result<Vec<u8>, StoreError> {
        self.get_at_most(key, u64::MAX - 1)
    }

    fn get_at_most(&self, key: &str, max: u64) -> Result<Vec<u8>, StoreError> {
        use std::io::Read;
        let (f, size) = self.open_at_most(key, max)?;
        // Read at most one byte past the limit: a file that grew since is refused, not read whole.
        let mut bytes = Vec::with_capacity(size as usize);
        f.take(max.saturating_add(1)).read_to_end(&mut bytes).map_err(unavailable("get", key))?;
        if bytes.len() as u64 > max {
            return Err(StoreError::TooLarge { key: key.into(), size: bytes.len() as u64, max });
        }
        Ok(bytes)
    }

    fn get_to_file(&self, key: &str, max: u64, dest: &Path) -> Result<u64, StoreError> {
        use std::io::Read;
        let (f, _) = self.open_at_most(key, max)?;
        let write = super::write_failed(dest);
        let mut to = crate::private_fs::create_new_private(dest).map_err(write)?;
        let n = std::io::copy(&mut f.take(max.saturating_add(1)), &mut to).map_err(unavailable("get", key))?;
        if n > max {
            return Err(StoreError::TooLarge { key: key.into(), size: n, max });
        }
        to.sync_all().map_err(write)?;
        Ok(n)
    }

    fn size(&self, key: &str) -> Result<Option<u64>, StoreError> {
        match fs::metadata(self.path(key)?) {
            Ok(m) => Ok(Some(m.len())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(unavailable("stat", key)(e)),
        }
    }

    fn list(&self, prefix: &str) -> Result<Vec<String>, StoreError> {
        let mut out = Vec::new();
        let mut stack = vec![self.root.clone()];
        while let Some(dir) = stack.pop() {
            let entries = match fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(unavailable("list", prefix)(e)),
            };
            for entry in entries {
                let path = entry.map_err(unavailable("list", prefix))?.path();
                if path.is_dir() {
                    stack.push(path);
                } else if let Ok(rel) = path.strip_prefix(&self.root) {
                    let key = rel.to_string_lossy().replace('\\', "/");
                    if key.starts_with(prefix) && !key.contains(".tmp-") {
                        out.push(key);
                    }
                }
            }
        }
        out.sort();
        Ok(out)
    }

    fn delete(&self, key: &str) -> Result<(), StoreError> {
        match fs::remove_file(self.path(key)?) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(unavailable("delete", key)(e)),
        }
    }
}

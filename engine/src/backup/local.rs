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

/// `create_tmp` in `dir`, made first: again while a delete removes the folder as it empties
/// between the two (bounded: a folder removed that often is a fault, reported).
fn create_in(dir: &Path, tmp: &Path) -> std::io::Result<fs::File> {
    let mut tries = 0;
    loop {
        // Either step finds a folder gone that a delete emptied and removed meanwhile.
        match fs::create_dir_all(dir).and_then(|()| create_tmp(tmp)) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries < 8 => tries += 1,
            r => return r,
        }
    }
}

/// Whether `e` says the thing is not there (any more): a walk skips it.
fn gone(e: &std::io::Error) -> bool {
    matches!(e.kind(), std::io::ErrorKind::NotFound | std::io::ErrorKind::NotADirectory)
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
        let tmp = tmp_path(&path);
        let mut f = create_in(dir, &tmp).map_err(unavailable("put", key))?;
        f.write_all(bytes).map_err(unavailable("put", key))?;
        f.sync_all().map_err(unavailable("put", key))?;
        fs::rename(&tmp, &path).map_err(unavailable("put", key))?;
        sync_dir(dir).map_err(unavailable("put", key))
    }

    fn put_file(&self, key: &str, src: &Path) -> Result<(), StoreError> {
        let path = self.path(key)?;
        let dir = path.parent().expect("keys have a parent");
        let tmp = tmp_path(&path);
        // A copy, never a hard link: a backup that shares the node's bytes dies with them (one
        // damaged byte in a linked file damages the local snapshot and the backup at once).
        // The copy's writes skip the page cache where they can (`direct_io`): nothing reads a
        // stored file back soon, and fresh cache pages were most of an upload's cost.
        let to = create_in(dir, &tmp).map_err(unavailable("put", key))?;
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
        // The walk starts at the directory the prefix names: a store shared by many streams
        // lists one stream's objects in time of their own, not of the whole store's.
        let start = match prefix.rsplit_once('/') {
            Some((dir, _)) if !dir.split('/').any(|p| p.is_empty() || p == "." || p == "..") => self.root.join(dir),
            _ => self.root.clone(),
        };
        let mut stack = vec![start.clone()];
        while let Some(dir) = stack.pop() {
            let entries = match fs::read_dir(&dir) {
                Ok(e) => e,
                Err(e) if gone(&e) => continue,
                Err(e) => return Err(unavailable("list", prefix)(e)),
            };
            let mut empty = true;
            for entry in entries {
                empty = false;
                let entry = entry.map_err(unavailable("list", prefix))?;
                let path = entry.path();
                let is_dir = match entry.file_type() {
                    // A link to a folder is walked into, as a folder (never taken for an object).
                    Ok(t) if t.is_symlink() => path.is_dir(),
                    Ok(t) => t.is_dir(),
                    Err(e) if gone(&e) => continue,
                    Err(e) => return Err(unavailable("list", prefix)(e)),
                };
                if is_dir {
                    stack.push(path);
                } else if let Ok(rel) = path.strip_prefix(&self.root) {
                    let key = rel.to_string_lossy().replace('\\', "/");
                    if key.starts_with(prefix) && !key.contains(".tmp-") {
                        out.push(key);
                    }
                }
            }
            // An empty folder a delete left (a crash between its two steps, or a store written
            // before deletes removed them) goes as it is walked past; a writer making it again
            // meanwhile retries (`create_in`).
            if empty && dir != start {
                let _ = fs::remove_dir(&dir);
            }
        }
        out.sort();
        Ok(out)
    }

    fn delete(&self, key: &str) -> Result<(), StoreError> {
        let path = self.path(key)?;
        match fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(unavailable("delete", key)(e)),
        }
        // Folders left empty go too (every checkpoint has one per task): a listing walks
        // folders, so a store that kept them would list slower with every checkpoint ever
        // taken. A folder a writer is filling holds its temporary file and stays; a writer
        // whose folder went between its creation and its file's makes it again (`create_in`).
        let mut dir = path.parent();
        while let Some(d) = dir.filter(|d| *d != self.root && d.starts_with(&self.root)) {
            if fs::remove_dir(d).is_err() {
                break; // not empty (or gone): its parents are not empty either
            }
            dir = d.parent();
        }
        Ok(())
    }
}

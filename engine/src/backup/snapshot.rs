//! Upload of a local snapshot directory to a [`Store`] (incremental: SST files already stored are
//! not sent again, see [`UploadIndex`]) and download with verification.

use std::fs;
use std::path::Path;
use std::sync::Mutex;

use weir_wire::{CheckpointId, StreamId, TaskId, Version};

use super::index::{UploadIndex, sst_key};
use super::{MAX_RECORD, Store, StoreError, check_key, check_name, with_retries};

/// One file of a checkpoint.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ManifestEntry {
    /// File name in the snapshot directory.
    pub name: String,
    /// Key in the store.
    pub key: String,
    /// Size in bytes.
    pub size: u64,
    /// CRC32C of the content.
    pub crc: u32,
}

/// The manifest format this Weir writes. 2: a sink's manifest names its result store's RocksDB
/// checkpoint (format 1 named none: its results stayed on the node). 3: that result store keeps
/// its results in blocks (`state::result_blocks`; format 2 kept one entry per result). 4: an
/// agg's manifest names a chain of state files, a full one and deltas (`state::WindowChain`;
/// format 3 and older named one file, which reads as a chain of one). 5: those files hold
/// compact entries (varint counts and sums; format 4's fixed ones are read, and a chain may hold
/// both). 6: a source's manifest lists its offsets at its recent checkpoints, and an agg's may
/// hold a [`ReplayPoint`] instead of its windows' entries (replay checkpoints, see
/// `operator::window::replay`); an older Weir refuses it rather than restore empty windows.
/// 7: a replay point may name windows whose entries are in the files (written, or partly
/// rebuilt by a replay it resumes), and a source's manifest where each output's replay stood
/// at checkpoints taken during one. Formats 1 to 7 are read; a sink refuses to restore a result
/// store older than 3.
pub const MANIFEST_FORMAT: u32 = 7;

/// What an agg's replay snapshot asks of its upstreams at a restore: the rows of its named
/// windows came after the sources' offsets at checkpoint `from`, and `taken` says, per upstream
/// (in the agg's upstream order), how many rows the agg had taken from it by `from` and by this
/// checkpoint: the difference is what a restore sends it again. Windows in `written` and
/// `partial` have their entries in the snapshot's files; the others are named (rebuilt by the
/// replay). A `resume` point (taken during a replay, `from` being this checkpoint) counts the
/// rows had again and owed instead, and the sources restart each output where its replay
/// stood then.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplayPoint {
    /// The checkpoint the replay starts at (0: the sources' start).
    pub from: CheckpointId,
    /// Per upstream: rows taken by `from`, and by this checkpoint.
    pub taken: Vec<(u64, u64)>,
    /// Starts of the windows whose entries are in the files and take no replayed row.
    pub written: Vec<i64>,
    /// Starts of the windows whose entries are in the files and take the replayed rows.
    pub partial: Vec<i64>,
    /// The point resumes a replay.
    pub resume: bool,
}

/// What a manifest says besides its files.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ManifestHead {
    /// Source offset (sources).
    pub version: Version,
    /// A source's offsets at its recent checkpoints, oldest first.
    pub offsets: Vec<(CheckpointId, Version)>,
    /// A source's offset per output at its recent checkpoints taken during a replay.
    pub outputs: Vec<(CheckpointId, Vec<u64>)>,
    /// An agg's replay point, when its snapshot names windows.
    pub replay: Option<ReplayPoint>,
}

impl From<Version> for ManifestHead {
    fn from(version: Version) -> Self {
        ManifestHead { version, ..Default::default() }
    }
}

/// What one task's checkpoint consists of.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Manifest {
    /// The format it was written in ([`MANIFEST_FORMAT`] for every manifest this Weir writes).
    pub format: u32,
    /// Checkpoint.
    pub id: CheckpointId,
    /// Source offset (sources).
    pub version: Version,
    /// Files.
    pub files: Vec<ManifestEntry>,
    /// A source's offsets at its recent checkpoints, oldest first (format 6).
    pub offsets: Vec<(CheckpointId, Version)>,
    /// A source's offset per output at its recent checkpoints taken during a replay (format 7).
    pub outputs: Vec<(CheckpointId, Vec<u64>)>,
    /// An agg's replay point (format 6; its windows and `resume`, format 7).
    pub replay: Option<ReplayPoint>,
}

impl Manifest {
    /// The manifest as text (one line per file), with a trailing CRC line over everything before it.
    pub fn encode(&self) -> String {
        let mut s = format!("weir-manifest {}\nid {}\nversion {}\n", self.format, self.id.0, self.version.0);
        for (id, v) in &self.offsets {
            s.push_str(&format!("offset {} {}\n", id.0, v.0));
        }
        for (id, at) in &self.outputs {
            s.push_str(&format!("outputs {}", id.0));
            at.iter().for_each(|o| s.push_str(&format!(" {o}")));
            s.push('\n');
        }
        if let Some(r) = &self.replay {
            s.push_str(&format!("replay {}\n", r.from.0));
            if r.resume {
                s.push_str("resume\n");
            }
            for (at_from, now) in &r.taken {
                s.push_str(&format!("taken {at_from} {now}\n"));
            }
            for w in &r.written {
                s.push_str(&format!("written {w}\n"));
            }
            for w in &r.partial {
                s.push_str(&format!("partial {w}\n"));
            }
        }
        for f in &self.files {
            s.push_str(&format!("file {} {} {:08x} {}\n", f.size, f.key, f.crc, f.name));
        }
        super::seal(s)
    }

    /// Parses and checks a manifest.
    pub fn decode(key: &str, text: &[u8]) -> Result<Manifest, StoreError> {
        let bad = |reason: &str| StoreError::Corrupt { key: key.into(), reason: reason.into() };
        let text = std::str::from_utf8(text).map_err(|_| bad("not UTF-8"))?;
        let body_end = text.rfind("crc ").ok_or_else(|| bad("no checksum line"))?;
        let (body, tail) = text.split_at(body_end);
        let want =
            u32::from_str_radix(tail.trim_start_matches("crc ").trim(), 16).map_err(|_| bad("bad checksum line"))?;
        if crc32c::crc32c(body.as_bytes()) != want {
            return Err(bad("checksum mismatch"));
        }
        let mut lines = body.lines();
        let format = match lines.next().and_then(|l| l.strip_prefix("weir-manifest ")).map(str::parse::<u32>) {
            Some(Ok(f @ 1..=MANIFEST_FORMAT)) => f,
            Some(Ok(f)) => {
                return Err(bad(&format!(
                    "manifest format {f}, and this Weir reads formats 1 to {MANIFEST_FORMAT}: written by a newer Weir"
                )));
            }
            _ => return Err(bad("not a manifest")),
        };
        let num = |l: Option<&str>, p: &str| {
            l.and_then(|l| l.strip_prefix(p)).and_then(|v| v.parse::<u64>().ok()).ok_or_else(|| bad("bad header"))
        };
        let id = CheckpointId(num(lines.next(), "id ")?);
        let version = Version(num(lines.next(), "version ")?);
        let mut files = Vec::new();
        let (mut offsets, mut outputs, mut replay) = (Vec::new(), Vec::new(), None::<ReplayPoint>);
        for l in lines {
            let two = |l: &str, p: &str| {
                let mut n = l.strip_prefix(p)?.split(' ').map(|v| v.parse::<u64>().ok());
                match (n.next()?, n.next()?, n.next()) {
                    (Some(a), Some(b), None) => Some((a, b)),
                    _ => None,
                }
            };
            if format >= 6 && l.starts_with("offset ") {
                let (id, v) = two(l, "offset ").ok_or_else(|| bad("bad offset line"))?;
                offsets.push((CheckpointId(id), Version(v)));
                continue;
            }
            if format >= 6 && l.starts_with("replay ") {
                let from = l["replay ".len()..].parse::<u64>().map_err(|_| bad("bad replay line"))?;
                replay = Some(ReplayPoint { from: CheckpointId(from), ..Default::default() });
                continue;
            }
            if format >= 6 && l.starts_with("taken ") {
                let t = two(l, "taken ").ok_or_else(|| bad("bad taken line"))?;
                replay.as_mut().ok_or_else(|| bad("taken line before the replay line"))?.taken.push(t);
                continue;
            }
            if format >= 7 && l.starts_with("outputs ") {
                let mut n = l["outputs ".len()..].split(' ').map(str::parse::<u64>);
                let id = n.next().and_then(Result::ok).ok_or_else(|| bad("bad outputs line"))?;
                let at = n.collect::<Result<Vec<u64>, _>>().map_err(|_| bad("bad outputs line"))?;
                outputs.push((CheckpointId(id), at));
                continue;
            }
            if format >= 7 && l == "resume" {
                replay.as_mut().ok_or_else(|| bad("resume line before the replay line"))?.resume = true;
                continue;
            }
            if format >= 7 && (l.starts_with("written ") || l.starts_with("partial ")) {
                let (kind, start) = l.split_once(' ').expect("checked");
                let start = start.parse::<i64>().map_err(|_| bad("bad window line"))?;
                let r = replay.as_mut().ok_or_else(|| bad("window line before the replay line"))?;
                if kind == "written" {
                    r.written.push(start)
                } else {
                    r.partial.push(start)
                }
                continue;
            }
            let mut parts = l.splitn(5, ' ');
            let (Some("file"), Some(size), Some(k), Some(crc), Some(name)) =
                (parts.next(), parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return Err(bad("bad file line"));
            };
            // A restore writes each file under its name: one plain component, nothing else.
            check_name(key, name)?;
            check_key(key, k)?;
            files.push(ManifestEntry {
                name: name.into(),
                key: k.into(),
                size: size.parse().map_err(|_| bad("bad size"))?,
                crc: u32::from_str_radix(crc, 16).map_err(|_| bad("bad crc"))?,
            });
        }
        Ok(Manifest { format, id, version, files, offsets, outputs, replay })
    }
}

/// CRC32C of the file at `path`, read a megabyte at a time (SST files can be large), past the
/// page cache where it can be (see [`crate::direct_io`]).
pub(crate) fn file_crc(path: &Path) -> std::io::Result<u32> {
    use std::io::Read;
    let mut f = crate::direct_io::Reader::open(path)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut crc = 0;
    loop {
        match f.read(&mut buf)? {
            0 => return Ok(crc),
            n => crc = crc32c::crc32c_append(crc, &buf[..n]),
        }
    }
}

/// Key prefix of a task's objects.
pub fn task_prefix(stream: StreamId, task: TaskId) -> String {
    format!("{}/tasks/{}", stream.0, task.0)
}

/// Key of a task's manifest for checkpoint `id`.
pub fn manifest_key(stream: StreamId, task: TaskId, id: CheckpointId) -> String {
    format!("{}/chk-{}/MANIFEST.weir", task_prefix(stream, task), id.0)
}

/// Objects one upload stores (or one restore fetches) at the same time.
const PARALLEL_PUTS: usize = 8;

/// Runs `f` on every item, [`PARALLEL_PUTS`] at a time on scoped threads; the first error (or a
/// panic, as an error of `op` on `dir`) is the result, after every thread has ended.
fn each_parallel<T: Sync>(
    items: &[T],
    op: &'static str,
    dir: &Path,
    f: impl Fn(&T) -> Result<(), StoreError> + Sync,
) -> Result<(), StoreError> {
    let next = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|scope| {
        let worker = || -> Result<(), StoreError> {
            while let Some(item) = items.get(next.fetch_add(1, std::sync::atomic::Ordering::Relaxed)) {
                f(item)?;
            }
            Ok(())
        };
        let handles: Vec<_> = (0..items.len().min(PARALLEL_PUTS)).map(|_| scope.spawn(worker)).collect();
        let mut result = Ok(());
        for h in handles {
            let r = h.join().unwrap_or_else(|_| {
                Err(StoreError::Unavailable { op, key: dir.display().to_string(), reason: "panicked".into() })
            });
            result = result.and(r);
        }
        result
    })
}

/// What [`upload_snapshot`] stored.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UploadSummary {
    /// CRC32C of the stored manifest (the commit record names it).
    pub manifest_crc: u32,
    /// Bytes sent: files the store did not hold yet, and the manifest.
    pub bytes: u64,
    /// Files the manifest lists.
    pub files: u32,
}

/// Uploads the snapshot in `dir` as checkpoint `id` of `task`, asking the store about each SST
/// file: one already stored under its content key with the same size is not sent again.
pub fn upload_snapshot(
    store: &dyn Store,
    stream: StreamId,
    task: TaskId,
    id: CheckpointId,
    version: Version,
    dir: &Path,
) -> Result<UploadSummary, StoreError> {
    upload(store, stream, task, id, version.into(), dir, None).map(|(s, _)| s)
}

/// [`upload_snapshot`] with the task's [`UploadIndex`]: SST files it knows are neither read nor
/// sent again, and the others go up without asking the store first (they are new: a round trip
/// to a remote store saved per file). The index then holds this snapshot's SST files (and the
/// files stored ahead that it does not name). The index is locked only before and after the
/// upload: files stored ahead meanwhile skip the files it claimed (see [`UploadIndex`]).
pub fn upload_snapshot_indexed(
    store: &dyn Store,
    stream: StreamId,
    task: TaskId,
    id: CheckpointId,
    head: impl Into<ManifestHead>,
    dir: &Path,
    index: &Mutex<UploadIndex>,
) -> Result<UploadSummary, StoreError> {
    let files = sst_files(dir).map_err(|e| StoreError::Unavailable {
        op: "read",
        key: dir.display().to_string(),
        reason: e.to_string(),
    })?;
    let (known, claim) = {
        let mut idx = lock(index);
        let new: Vec<String> =
            files.into_iter().filter(|(name, size)| idx.get(name, *size).is_none()).map(|(name, _)| name).collect();
        idx.begin_upload(&new);
        (idx.clone(), Claim { index, names: new })
    };
    let (summary, manifest) = upload(store, stream, task, id, head.into(), dir, Some(&known))?;
    let mut idx = lock(index);
    idx.accept(&manifest);
    drop(idx);
    drop(claim);
    Ok(summary)
}

fn lock(index: &Mutex<UploadIndex>) -> std::sync::MutexGuard<'_, UploadIndex> {
    index.lock().unwrap_or_else(|e| e.into_inner())
}

/// An upload in flight's claim on its files: it ends when dropped, whatever ended the upload.
struct Claim<'a> {
    index: &'a Mutex<UploadIndex>,
    names: Vec<String>,
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        lock(self.index).end_upload(&self.names);
    }
}

/// The SST files in `dir`, with their sizes.
fn sst_files(dir: &Path) -> std::io::Result<Vec<(String, u64)>> {
    let mut out = Vec::new();
    for e in fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name().to_string_lossy().into_owned();
        if name.ends_with(".sst") {
            out.push((name, e.metadata()?.len()));
        }
    }
    Ok(out)
}

fn upload(
    store: &dyn Store,
    stream: StreamId,
    task: TaskId,
    id: CheckpointId,
    head: ManifestHead,
    dir: &Path,
    index: Option<&UploadIndex>,
) -> Result<(UploadSummary, Manifest), StoreError> {
    let io = |e: std::io::Error| StoreError::Unavailable {
        op: "read",
        key: dir.display().to_string(),
        reason: e.to_string(),
    };
    let prefix = task_prefix(stream, task);
    let mut files = Vec::new();
    // What to store: (key, the file, its bytes when small), decided before anything is sent.
    let mut puts: Vec<(String, std::path::PathBuf, Option<Vec<u8>>)> = Vec::new();
    let mut names: Vec<_> =
        fs::read_dir(dir).map_err(io)?.map(|e| e.map(|e| e.path())).collect::<Result<_, _>>().map_err(io)?;
    names.sort();
    let mut sent = 0;
    for path in names {
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        let is_sst = name.ends_with(".sst");
        if is_sst {
            let size = fs::metadata(&path).map_err(io)?.len();
            if let Some(known) = index.and_then(|i| i.get(&name, size)) {
                files.push(known.clone());
                continue;
            }
            // Read once for the checksum, in pieces; the store reads the file again (large files
            // stream).
            let crc = file_crc(&path).map_err(io)?;
            let key = sst_key(&prefix, &name, crc);
            files.push(ManifestEntry { name, key: key.clone(), size, crc });
            if index.is_some() || store.size(&key)? != Some(size) {
                sent += size;
                puts.push((key, path, None));
            }
        } else {
            let bytes = fs::read(&path).map_err(io)?;
            let key = format!("{prefix}/chk-{}/{name}", id.0);
            files.push(ManifestEntry { name, key: key.clone(), size: bytes.len() as u64, crc: crc32c::crc32c(&bytes) });
            sent += bytes.len() as u64;
            puts.push((key, path, Some(bytes)));
        }
    }
    let count = files.len() as u32;
    let ManifestHead { version, offsets, outputs, replay } = head;
    let manifest = Manifest { format: MANIFEST_FORMAT, id, version, files, offsets, outputs, replay };
    let text = manifest.encode();
    // The files go up at once (each put waits for the store's durability, and none depends on
    // another), then the manifest that names them: a manifest in the store always names files
    // that are there. Only a commit record, written after this returns, makes a checkpoint
    // restorable.
    each_parallel(&puts, "put", dir, |(key, path, bytes)| {
        with_retries(|| match bytes {
            Some(b) => store.put(key, b),
            None => store.put_file(key, path),
        })
    })?;
    with_retries(|| store.put(&manifest_key(stream, task, id), text.as_bytes()))?;
    let summary =
        UploadSummary { manifest_crc: crc32c::crc32c(text.as_bytes()), bytes: sent + text.len() as u64, files: count };
    Ok((summary, manifest))
}

/// Fetches the manifest of checkpoint `id` of `task`, checked against `manifest_crc` when given
/// (the commit record's) and against its own checksum.
pub fn fetch_manifest(
    store: &dyn Store,
    stream: StreamId,
    task: TaskId,
    id: CheckpointId,
    manifest_crc: Option<u32>,
) -> Result<Manifest, StoreError> {
    let key = manifest_key(stream, task, id);
    let text = store.get_at_most(&key, MAX_RECORD)?;
    if let Some(want) = manifest_crc
        && crc32c::crc32c(&text) != want
    {
        return Err(StoreError::Corrupt { key, reason: "manifest differs from the commit record".into() });
    }
    Manifest::decode(&key, &text)
}

/// Whether `dir` holds exactly the files of `manifest`, each with its size and checksum: a local
/// snapshot that can be restored without downloading anything.
pub fn local_snapshot_matches(manifest: &Manifest, dir: &Path) -> bool {
    let Ok(entries) = fs::read_dir(dir) else { return false };
    let count = entries.count();
    count == manifest.files.len()
        && manifest.files.iter().all(|f| {
            let p = dir.join(&f.name);
            fs::metadata(&p).is_ok_and(|m| m.len() == f.size) && file_crc(&p).is_ok_and(|c| c == f.crc)
        })
}

/// Downloads the files of `manifest` into `dir` (replacing it), verifying each.
///
/// What the store says is untrusted: every name is checked to be one plain component before
/// anything is written, `dir` is made afresh (mode 0700, never through a link), each object is
/// read only up to the size its manifest gives, and each file is created new inside `dir`.
pub fn download_files(store: &dyn Store, manifest: &Manifest, dir: &Path) -> Result<(), StoreError> {
    let io = super::write_failed(dir);
    let where_ = dir.display().to_string();
    for f in &manifest.files {
        check_name(&where_, &f.name)?;
    }
    match fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(dir).map_err(io)?,
        Ok(_) => fs::remove_file(dir).map_err(io)?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(io(e)),
    }
    if let Some(parent) = dir.parent() {
        crate::private_fs::private_dir_all(parent).map_err(io)?;
    }
    crate::private_fs::private_dir(dir).map_err(io)?;
    // Files come down at once, each verified before it is written.
    // Each goes straight to its file (never whole in memory), read up to the size its manifest
    // gives, then checked.
    each_parallel(&manifest.files, "get", dir, |f| {
        let path = dir.join(&f.name);
        let len = with_retries(|| {
            // A retry starts the file afresh.
            let _ = fs::remove_file(&path);
            store.get_to_file(&f.key, f.size, &path)
        })?;
        if len != f.size || file_crc(&path).map_err(io)? != f.crc {
            return Err(StoreError::Corrupt {
                key: f.key.clone(),
                reason: "size or checksum differs from the manifest".into(),
            });
        }
        Ok(())
    })
}

/// Downloads checkpoint `id` of `task` into `dir` (replacing it), verifying every file against the
/// manifest, and the manifest against `manifest_crc` when given (the commit record's).
pub fn download_snapshot(
    store: &dyn Store,
    stream: StreamId,
    task: TaskId,
    id: CheckpointId,
    manifest_crc: Option<u32>,
    dir: &Path,
) -> Result<Manifest, StoreError> {
    let manifest = fetch_manifest(store, stream, task, id, manifest_crc)?;
    download_files(store, &manifest, dir)?;
    Ok(manifest)
}

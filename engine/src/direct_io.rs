//! Writing bulk files past the page cache (`O_DIRECT`), where the file system allows it.
//!
//! Why: a sink writes every result once (160 MB a second at 4,000,000 keys, 1 s windows) and the
//! uploader copies each file once more; nothing reads them back soon. Through the page cache each
//! byte lands in a page the kernel has just taken from its free lists, and on hosts that hand
//! freed guest memory back to the hypervisor (virtio-balloon free page reporting, as on the
//! machine of docs/benchmarks.md) the first touch of such a page costs a fault in the host:
//! `dd` of 2 GB into a new file took 5.6 s of system time there, 0.2 s with `O_DIRECT`. In
//! `weir-e2e keys 8 4000000` that was a third of both cores (`perf`: the flush thread's and the
//! uploader's kernel copies).
//!
//! Invariants: a file written here is complete and synced (`sync_all`) when [`copy`] returns
//! `Ok`; a file system without `O_DIRECT` (tmpfs, some FUSE and network file systems) gets the
//! ordinary buffered copy, never an error for that reason alone.

use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::path::Path;

/// The alignment `O_DIRECT` asks of buffers, offsets and lengths (a page covers every logical
/// block size Linux file systems use).
const ALIGN: usize = 4096;

/// Bytes moved per read and write.
const CHUNK: usize = 1 << 20;

/// Whether files in `dir` can be written with `O_DIRECT` (Linux; elsewhere never): tried on a
/// scratch file, removed again.
pub fn supported(dir: &Path) -> bool {
    #[cfg(target_os = "linux")]
    {
        let probe = dir.join(format!(".direct-io-probe-{}", std::process::id()));
        let ok = open_direct(fs::OpenOptions::new().write(true).create_new(true), &probe).is_ok();
        let _ = fs::remove_file(&probe);
        ok
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = dir;
        false
    }
}

#[cfg(target_os = "linux")]
fn open_direct(o: &mut fs::OpenOptions, path: &Path) -> io::Result<File> {
    if *DISABLED {
        return Err(io::Error::other("O_DIRECT disabled by WEIR_NO_DIRECT_IO"));
    }
    std::os::unix::fs::OpenOptionsExt::custom_flags(o, libc::O_DIRECT | libc::O_NOFOLLOW);
    o.open(path)
}

/// `WEIR_NO_DIRECT_IO` set (to anything): every file goes through the page cache, as on a file
/// system without `O_DIRECT` (to compare the two, docs/benchmarks.md).
#[cfg(target_os = "linux")]
static DISABLED: std::sync::LazyLock<bool> =
    std::sync::LazyLock::new(|| std::env::var_os("WEIR_NO_DIRECT_IO").is_some());

/// A buffer of `CHUNK` bytes at an `ALIGN`ed address, carved from a larger `Vec` (no unsafe
/// allocation).
struct Aligned {
    buf: Vec<u8>,
    at: usize,
}

impl Aligned {
    fn new() -> Self {
        let buf = vec![0u8; CHUNK + ALIGN];
        let at = buf.as_ptr().align_offset(ALIGN);
        Self { buf, at }
    }

    fn get(&mut self) -> &mut [u8] {
        &mut self.buf[self.at..self.at + CHUNK]
    }
}

/// A file read past the page cache where its file system allows it, else through it: what
/// the uploader reads once (to checksum and to copy a file a sink's flush wrote past the cache)
/// would otherwise land in fresh cache pages again.
pub struct Reader {
    file: File,
    /// Whether `file` was opened with `O_DIRECT` (reads go through `buf`).
    direct: bool,
    buf: Aligned,
    /// The unread bytes of `buf`: `buf[at..end]`.
    at: usize,
    end: usize,
    /// Bytes of the file read into `buf` so far (the offset of the next direct read).
    pos: u64,
    path: std::path::PathBuf,
}

impl Reader {
    /// Opens `path` for reading (not through a link).
    pub fn open(path: &Path) -> io::Result<Reader> {
        #[cfg(target_os = "linux")]
        if let Ok(file) = open_direct(fs::OpenOptions::new().read(true), path) {
            return Ok(Self::new(file, true, path));
        }
        Ok(Self::new(File::open(path)?, false, path))
    }

    fn new(file: File, direct: bool, path: &Path) -> Reader {
        Reader { file, direct, buf: Aligned::new(), at: 0, end: 0, pos: 0, path: path.to_path_buf() }
    }

    /// Fills `buf` with the next whole blocks; `Ok(false)` at the end of the file.
    fn fill(&mut self) -> io::Result<bool> {
        loop {
            match self.file.read(self.buf.get()) {
                Ok(n) => {
                    (self.at, self.end) = (0, n);
                    self.pos += n as u64;
                    return Ok(n > 0);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // A file system that took `O_DIRECT` at open and refuses it at read (some FUSE
                // and network ones): the rest is read through the cache.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                    use std::io::{Seek, SeekFrom};
                    let mut f = File::open(&self.path)?;
                    f.seek(SeekFrom::Start(self.pos))?;
                    (self.file, self.direct) = (f, false);
                }
                Err(e) => return Err(e),
            }
        }
    }
}

impl Read for Reader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        if !self.direct && self.at == self.end {
            return self.file.read(out);
        }
        if self.at == self.end && !self.fill()? {
            return Ok(0);
        }
        let n = out.len().min(self.end - self.at);
        out[..n].copy_from_slice(&self.buf.get()[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// Copies the file at `from` into `to`, a new empty file at `to_path`, past the page cache
/// where the file systems allow it, and syncs `to`. Returns the bytes copied.
pub fn copy(from: &Path, to: File, to_path: &Path) -> io::Result<u64> {
    let mut from = Reader::open(from)?;
    #[cfg(target_os = "linux")]
    {
        let mut o = fs::OpenOptions::new();
        o.write(true);
        // The same file, opened again past the page cache; `to` stays open for the tail.
        if let Ok(direct) = open_direct(&mut o, to_path) {
            return copy_direct(&mut from, direct, to);
        }
    }
    let _ = to_path;
    let mut to = to;
    let n = io::copy(&mut from, &mut to)?;
    to.sync_all()?;
    Ok(n)
}

/// Whole `ALIGN`ed blocks go through `direct`; the tail shorter than a block through the
/// buffered `tail` handle (which `O_DIRECT` would need padding and a truncation for).
#[cfg(target_os = "linux")]
fn copy_direct(from: &mut Reader, mut direct: File, mut tail: File) -> io::Result<u64> {
    use std::io::{Seek, SeekFrom};
    let mut buf = Aligned::new();
    let mut total = 0u64;
    loop {
        let b = buf.get();
        let mut filled = 0;
        while filled < CHUNK {
            match from.read(&mut b[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        let whole = filled - filled % ALIGN;
        direct.write_all(&b[..whole])?;
        total += whole as u64;
        if filled < CHUNK {
            if filled > whole {
                tail.seek(SeekFrom::Start(total))?;
                tail.write_all(&b[whole..filled])?;
                total += (filled - whole) as u64;
            }
            break;
        }
    }
    tail.sync_all()?;
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roundtrip(len: usize) {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        let bytes: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
        fs::write(&src, &bytes).unwrap();
        let dst = dir.path().join("dst");
        let to = fs::OpenOptions::new().write(true).create_new(true).open(&dst).unwrap();
        let n = copy(&src, to, &dst).unwrap();
        assert_eq!(n, len as u64);
        assert_eq!(fs::read(&dst).unwrap(), bytes, "{len} bytes");
        // Read in odd pieces, as a checksum's loop or `io::copy` may.
        let mut r = Reader::open(&src).unwrap();
        let (mut got, mut piece) = (Vec::new(), vec![0u8; 777]);
        loop {
            match r.read(&mut piece).unwrap() {
                0 => break,
                n => got.extend_from_slice(&piece[..n]),
            }
        }
        assert_eq!(got, bytes, "{len} bytes read in pieces");
    }

    #[test]
    fn copies_are_byte_exact_at_every_alignment() {
        for len in [0, 1, ALIGN - 1, ALIGN, ALIGN + 1, CHUNK - 1, CHUNK, CHUNK + ALIGN + 7, 3 * CHUNK] {
            roundtrip(len);
        }
    }

    #[test]
    fn a_directory_on_a_disk_file_system_supports_direct_writes_or_says_it_does_not() {
        let dir = tempfile::tempdir().unwrap();
        // Whatever the answer, the probe leaves nothing behind.
        let _ = supported(dir.path());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}

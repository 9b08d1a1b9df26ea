//! A log directory's small files (producers, ledger, chain anchor) written whole: the body and
//! a CRC32C of it into a new file, synced, renamed over the old one, the directory synced, so a
//! crash leaves the old file or the new one, never a mix.

use std::fs::{self, File};
use std::io::Write;
use std::path::Path;

use super::log::{LogError, io_err, sync_dir};

/// Replaces `dir/name` with `body` followed by its CRC32C (little-endian).
pub(super) fn write_sealed(dir: &Path, name: &str, mut body: Vec<u8>) -> Result<(), LogError> {
    let crc = crc32c::crc32c(&body);
    body.extend_from_slice(&crc.to_le_bytes());
    let tmp = dir.join(format!("{name}.tmp"));
    let path = dir.join(name);
    let mut f = File::create(&tmp).map_err(io_err(&tmp))?;
    f.write_all(&body).and_then(|()| f.sync_all()).map_err(io_err(&tmp))?;
    fs::rename(&tmp, &path).map_err(io_err(&path))?;
    sync_dir(dir)
}

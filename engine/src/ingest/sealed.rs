//! A log directory's small files (producers, ledger, chain anchor) written whole: the body and
//! a CRC32C of it into a new file, synced, renamed over the old one, the directory synced, so a
//! crash leaves the old file or the new one, never a mix.

use std::fs::{self, File};
use std::io::{self, Write};
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

/// The body of `dir/name` as [`write_sealed`] wrote it, `None` when there is no such file; a file
/// too short for its checksum, or whose checksum does not match, is corruption (named `what`).
pub(super) fn read_sealed(dir: &Path, name: &str, what: &str) -> Result<Option<Vec<u8>>, LogError> {
    let path = dir.join(name);
    let mut bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(&path)(e)),
    };
    let corrupt = |why: &str| LogError::Corrupt { path: path.clone(), offset: 0, reason: format!("{what}: {why}") };
    if bytes.len() < 4 {
        return Err(corrupt("shorter than its checksum"));
    }
    let crc = bytes.split_off(bytes.len() - 4);
    if crc32c::crc32c(&bytes) != u32::from_le_bytes(crc.try_into().expect("4 bytes")) {
        return Err(corrupt("checksum does not match"));
    }
    Ok(Some(bytes))
}

//! Files and directories only this node's user can read: data directories are 0700, what a
//! restore writes is 0600, and nothing is written through a link.
//!
//! Everything a node keeps (state, results, ingest logs, snapshots from the store) is private to
//! the user it runs as, whatever the umask says.

use std::fs;
use std::io::{self, Write};
use std::path::Path;

#[cfg(unix)]
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};

/// Creates `dir` and its missing parents; the ones created get mode 0700, and `dir` itself is
/// set to 0700 if it is looser (a directory made by hand, say).
pub fn private_dir_all(dir: &Path) -> io::Result<()> {
    let mut b = fs::DirBuilder::new();
    b.recursive(true);
    #[cfg(unix)]
    b.mode(0o700);
    b.create(dir)?;
    #[cfg(unix)]
    {
        let m = fs::metadata(dir)?;
        if m.permissions().mode() & 0o077 != 0 {
            fs::set_permissions(dir, fs::Permissions::from_mode(0o700))?;
        }
    }
    Ok(())
}

/// Creates `dir` (its parent must exist), mode 0700; an error if anything is there already, a
/// link included: a restore's directory is always its own and fresh.
pub fn private_dir(dir: &Path) -> io::Result<()> {
    let mut b = fs::DirBuilder::new();
    #[cfg(unix)]
    b.mode(0o700);
    b.create(dir)
}

/// A new file at `path`, mode 0600, open for writing: an error if anything is there already (a
/// link included, which is not followed).
pub fn create_new_private(path: &Path) -> io::Result<fs::File> {
    let mut o = fs::OpenOptions::new();
    o.write(true).create_new(true);
    #[cfg(unix)]
    o.mode(0o600).custom_flags(libc::O_NOFOLLOW);
    o.open(path)
}

/// Writes `bytes` to a new file at `path` (see [`create_new_private`]) and syncs it.
pub fn write_new_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut f = create_new_private(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_dirs_and_files_are_the_owners_alone_and_links_are_refused() {
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("a/b");
        private_dir_all(&d).unwrap();
        let f = d.join("f");
        write_new_private(&f, b"x").unwrap();
        assert!(write_new_private(&f, b"y").is_err(), "an existing file is not replaced");
        #[cfg(unix)]
        {
            assert_eq!(fs::metadata(&d).unwrap().permissions().mode() & 0o777, 0o700);
            assert_eq!(fs::metadata(&f).unwrap().permissions().mode() & 0o777, 0o600);
            let outside = t.path().join("outside");
            std::os::unix::fs::symlink(&outside, d.join("link")).unwrap();
            assert!(write_new_private(&d.join("link"), b"z").is_err());
            assert!(!outside.exists(), "written through a link");
            std::os::unix::fs::symlink(&outside, t.path().join("dlink")).unwrap();
            assert!(private_dir(&t.path().join("dlink")).is_err());
        }
        assert_eq!(fs::read(&f).unwrap(), b"x");
    }
}

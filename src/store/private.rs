//! Files only the server reads. The data directory and the store hold every transcript, so
//! whatever the umask the server was started with, a directory it creates is `0700` and a file
//! it creates `0600` (SQLite gives the store's WAL and shared-memory files the store's own
//! mode). What exists already is left as its operator made it: a Kubernetes `fsGroup`, for one,
//! gives the group access on purpose; the server says so only when *others* may read.

use std::{
    fs::{DirBuilder, OpenOptions, Permissions},
    io,
    os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt},
    path::Path,
};

/// Creates `dir` and its missing parents, each `0700`; whether `dir` was created.
pub fn create_dir(dir: &Path) -> io::Result<bool> {
    if dir.is_dir() {
        return Ok(false);
    }
    DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    // The umask may have taken bits from the mode; it can never have added any.
    std::fs::set_permissions(dir, Permissions::from_mode(0o700))?;
    Ok(true)
}

/// Creates the empty file `path`, `0600`, unless it exists; whether it was created.
pub fn create_file(path: &Path) -> io::Result<bool> {
    match OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
    {
        Ok(_) => {
            std::fs::set_permissions(path, Permissions::from_mode(0o600))?;
            Ok(true)
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

/// The mode of `path` when users other than its owner and group may read or enter it.
pub fn open_to_others(path: &Path) -> Option<u32> {
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
    (mode & 0o007 != 0).then_some(mode)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_directories_and_files_are_private_and_existing_ones_are_left_alone() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a/b");
        assert!(create_dir(&dir).unwrap());
        assert!(!create_dir(&dir).unwrap());
        let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&dir), 0o700);
        assert_eq!(mode(&root.path().join("a")), 0o700);
        let file = dir.join("f");
        assert!(create_file(&file).unwrap());
        assert_eq!(mode(&file), 0o600);
        std::fs::set_permissions(&file, Permissions::from_mode(0o640)).unwrap();
        assert!(!create_file(&file).unwrap());
        assert_eq!(mode(&file), 0o640, "an existing file keeps its mode");
        assert_eq!(open_to_others(&file), None, "the group alone is fine");
        std::fs::set_permissions(&file, Permissions::from_mode(0o644)).unwrap();
        assert_eq!(open_to_others(&file), Some(0o644));
    }
}

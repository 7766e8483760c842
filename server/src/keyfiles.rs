//! The data directory's key files: the admission secret (shared with the waiting room)
//! and the reservation key (never rotates). Created on first start when absent.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::engine::token::{KeyError, Keyring, ReservationKey};

#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Key { path: PathBuf, source: KeyError },
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> KeyFileError + '_ {
    move |source| KeyFileError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Writes a new file readable only by its owner; fails if it already exists, so two
/// processes starting at once cannot overwrite each other's key.
fn create_private(path: &Path, content: &[u8]) -> Result<(), KeyFileError> {
    let mut opts = fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(path).map_err(io(path))?;
    f.write_all(content).map_err(io(path))?;
    f.sync_all().map_err(io(path))?;
    Ok(())
}

/// Loads the admission keys from `secret_file`, or from `<data_dir>/secret`, creating
/// the latter with one random key when absent. Returns the keys, the path, and whether
/// it was created now.
pub fn load_or_create_secret(
    data_dir: &Path,
    secret_file: Option<&Path>,
) -> Result<(Keyring, PathBuf, bool), KeyFileError> {
    let (path, may_create) = match secret_file {
        Some(p) => (p.to_path_buf(), false),
        None => (data_dir.join("secret"), true),
    };
    let mut created = false;
    if may_create && !path.exists() {
        fs::create_dir_all(data_dir).map_err(io(data_dir))?;
        match create_private(&path, Keyring::generate_file_text().as_bytes()) {
            Ok(()) => created = true,
            Err(KeyFileError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    let text = fs::read_to_string(&path).map_err(io(&path))?;
    let ring = Keyring::parse(&text).map_err(|source| KeyFileError::Key {
        path: path.clone(),
        source,
    })?;
    Ok((ring, path, created))
}

/// Loads the reservation key from `key_file` or `<data_dir>/reservation.key`, creating
/// it (32 random bytes) when absent.
pub fn load_or_create_reservation_key(
    data_dir: &Path,
    key_file: Option<&Path>,
) -> Result<(ReservationKey, PathBuf, bool), KeyFileError> {
    let path = key_file
        .map(Path::to_path_buf)
        .unwrap_or_else(|| data_dir.join("reservation.key"));
    let mut created = false;
    if !path.exists() {
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent).map_err(io(parent))?;
        }
        let key: [u8; 32] = rand::random();
        match create_private(&path, &key) {
            Ok(()) => created = true,
            Err(KeyFileError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(e),
        }
    }
    let bytes = fs::read(&path).map_err(io(&path))?;
    let key = ReservationKey::from_file_bytes(&bytes).map_err(|source| KeyFileError::Key {
        path: path.clone(),
        source,
    })?;
    Ok((key, path, created))
}

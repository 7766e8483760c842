//! The data directory's key files: the admission secret (shared with the waiting room)
//! and the reservation key (never rotates).
//!
//! The reservation key is the one file whose loss silently breaks idempotency: a new key
//! gives every retry a new token, so it takes stock again. It is therefore created only
//! in a brand-new data dir (and a file the operator named with `--reservation-key-file`
//! only when asked to, `--create-keys`), and the data dir remembers the fingerprint of
//! the key its log was written with (`reservation.key.fingerprint`), so a missing or
//! different key is refused at start with both names in the message.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use crate::engine::token::{KeyError, Keyring, ReservationKey};

/// Why the key files could not be loaded or created; each stops the server at start-up.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// Reading or writing a key file failed.
    #[error("{path}: {source}")]
    Io {
        /// The key file.
        path: PathBuf,
        /// What the system reported.
        source: std::io::Error,
    },
    /// A key file's contents are not a valid key.
    #[error("{path}: {source}")]
    Key {
        /// The key file.
        path: PathBuf,
        /// What is wrong with the key.
        source: KeyError,
    },
    /// The reservation key file is gone while the data dir holds state written with a key.
    #[error(
        "reservation key {path} is missing, but the data dir {data_dir} already holds state written with reservation key fingerprint {expected}; restore that key file (a new key would give every retried request a new token and take stock twice). Refusing to start"
    )]
    MissingWithState {
        /// The key file.
        path: PathBuf,
        /// The data directory whose state the key must match.
        data_dir: PathBuf,
        /// The fingerprint the state was written with.
        expected: String,
    },
    /// A key file named on the command line does not exist and `--create-keys` was not given.
    #[error(
        "reservation key {path} does not exist; a key file named with --reservation-key-file is created only with --create-keys (and only for a data dir with no state)"
    )]
    NamedMissing {
        /// The key file.
        path: PathBuf,
    },
    /// The reservation key is not the one the data dir's state was written with.
    #[error(
        "reservation key {path} has fingerprint {found}, but the data dir {data_dir} holds state written with fingerprint {expected}; start with the key that wrote it. Refusing to start"
    )]
    Mismatch {
        /// The key file.
        path: PathBuf,
        /// The data directory whose state the key must match.
        data_dir: PathBuf,
        /// The fingerprint of the key file given.
        found: String,
        /// The fingerprint the state was written with.
        expected: String,
    },
}

/// The file in the data dir recording the reservation key fingerprint its state uses.
pub const FINGERPRINT_FILE: &str = "reservation.key.fingerprint";

/// Whether the data dir holds any durable state (log segments or snapshots): then a
/// reservation key may no longer be invented.
pub fn data_dir_has_state(data_dir: &Path) -> bool {
    let Ok(entries) = fs::read_dir(data_dir.join("wal")) else {
        return false;
    };
    entries.flatten().any(|e| {
        let name = e.file_name();
        let name = name.to_string_lossy();
        name.starts_with("wal-") || name.starts_with("snapshot-")
    })
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
    let ring = read_secret(&path)?;
    Ok((ring, path, created))
}

/// Reads the admission secret file at `path` (at start, and again on `SECRET.RELOAD`).
pub fn read_secret(path: &Path) -> Result<Keyring, KeyFileError> {
    let text = fs::read_to_string(path).map_err(io(path))?;
    Keyring::parse(&text).map_err(|source| KeyFileError::Key {
        path: path.to_path_buf(),
        source,
    })
}

/// Loads the reservation key from `key_file` or `<data_dir>/reservation.key`. Creates it
/// (32 random bytes) only when the data dir holds no state yet, and a named `key_file`
/// only with `create_named`. Checks it against the fingerprint the data dir recorded, and
/// records it when none is. Returns the key, its path and whether it was created now.
pub fn load_or_create_reservation_key(
    data_dir: &Path,
    key_file: Option<&Path>,
    create_named: bool,
) -> Result<(ReservationKey, PathBuf, bool), KeyFileError> {
    let path = key_file
        .map(Path::to_path_buf)
        .unwrap_or_else(|| data_dir.join("reservation.key"));
    let fp_path = data_dir.join(FINGERPRINT_FILE);
    let recorded = match fs::read_to_string(&fp_path) {
        Ok(t) => Some(t.trim().to_string()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io(&fp_path)(e)),
    };
    let mut created = false;
    if !path.exists() {
        if recorded.is_some() || data_dir_has_state(data_dir) {
            return Err(KeyFileError::MissingWithState {
                path,
                data_dir: data_dir.to_path_buf(),
                expected: recorded.unwrap_or_else(|| {
                    format!("unknown (no {FINGERPRINT_FILE}; see SALE.INFO key_fingerprint in the ledger)")
                }),
            });
        }
        if key_file.is_some() && !create_named {
            return Err(KeyFileError::NamedMissing { path });
        }
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
    match recorded {
        Some(expected) if expected != key.fingerprint() => {
            return Err(KeyFileError::Mismatch {
                path,
                data_dir: data_dir.to_path_buf(),
                found: key.fingerprint().to_string(),
                expected,
            })
        }
        Some(_) => {}
        None => {
            fs::create_dir_all(data_dir).map_err(io(data_dir))?;
            let tmp = data_dir.join(format!("{FINGERPRINT_FILE}.tmp"));
            fs::write(&tmp, format!("{}\n", key.fingerprint())).map_err(io(&tmp))?;
            fs::File::open(&tmp)
                .and_then(|f| f.sync_all())
                .map_err(io(&tmp))?;
            fs::rename(&tmp, &fp_path).map_err(io(&fp_path))?;
            fs::File::open(data_dir)
                .and_then(|d| d.sync_all())
                .map_err(io(data_dir))?;
        }
    }
    Ok((key, path, created))
}

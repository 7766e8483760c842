//! `stockgate mint-token`: an admission token signed with a key of a secret file, as
//! the waiting room signs them.

use std::path::PathBuf;

use crate::engine::ident;
use crate::engine::token::{hex_decode, mint_admission_token};
use crate::engine::Keyring;

/// What to sign and with which key.
pub struct MintRequest {
    /// The admission keys, one `<kid> <hex secret>` per line.
    pub secret_file: PathBuf,
    /// The key to sign with; `None`: the file's first.
    pub kid: Option<String>,
    /// The sale the token admits to.
    pub sku: String,
    /// The buyer the token admits.
    pub user: String,
    /// Validity from now, in ms.
    pub ttl_ms: u64,
}

/// Why no token was minted.
#[derive(Debug)]
pub enum MintError {
    /// The sku or the user is not a valid identifier (the message names the flag).
    Argument(String),
    /// The secret file cannot be read, or holds no usable key.
    Key(String),
}

impl MintError {
    /// The process's exit status: 2 for a bad argument, 1 for a key.
    pub fn exit_code(&self) -> u8 {
        match self {
            MintError::Argument(_) => 2,
            MintError::Key(_) => 1,
        }
    }
}

impl std::fmt::Display for MintError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            MintError::Argument(m) | MintError::Key(m) => f.write_str(m),
        }
    }
}

/// The token `req` asks for.
pub fn mint(req: &MintRequest) -> Result<String, MintError> {
    for (field, ok) in [
        ("sku", ident::valid_sku(req.sku.as_bytes())),
        ("user", ident::valid_user(req.user.as_bytes())),
    ] {
        if !ok {
            return Err(MintError::Argument(format!(
                "--{field}: {}",
                ident::invalid_message(field)
            )));
        }
    }
    let path = req.secret_file.display();
    let text = std::fs::read_to_string(&req.secret_file)
        .map_err(|e| MintError::Key(format!("{path}: {e}")))?;
    Keyring::parse(&text).map_err(|e| MintError::Key(format!("{path}: {e}")))?;
    let line = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .find(|l| {
            req.kid
                .as_deref()
                .is_none_or(|k| l.split_whitespace().next() == Some(k))
        });
    let Some((kid, hex)) = line.and_then(|l| {
        let mut p = l.split_whitespace();
        Some((p.next()?, p.next()?))
    }) else {
        return Err(MintError::Key(match &req.kid {
            Some(kid) => format!("no key with id {kid} in {path}"),
            None => format!("no key in {path}"),
        }));
    };
    let Some(secret) = hex_decode(hex) else {
        return Err(MintError::Key(format!(
            "the secret of key {kid} in {path} is not hex (expected `<kid> <hex secret>`)"
        )));
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    Ok(mint_admission_token(
        &secret,
        kid,
        &req.sku,
        &req.user,
        now + req.ttl_ms,
    ))
}

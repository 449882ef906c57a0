//! The waiting room's token secret: from the config (`token_secret` / `token_secret_file`), or on the
//! embedded backend `<data_dir>/queue.secret`, generated on the first start. Errors name the setting
//! and never show the secret.

use std::path::Path;

use anyhow::Context as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use rankgate_store::queue::token::TokenSecret;

use super::config::WaitingRoomConfig;

/// The token secret the config gives (`token_secret` or `token_secret_file`), if any. Errors name the
/// setting and never show the secret.
pub(crate) fn configured_token_secret(config: &WaitingRoomConfig) -> anyhow::Result<Option<TokenSecret>> {
    let (encoded, source) = match (&config.token_secret, &config.token_secret_file) {
        (Some(_), Some(_)) => anyhow::bail!(
            "waiting_room.token_secret and waiting_room.token_secret_file are both set; keep one"
        ),
        (Some(inline), None) => (inline.clone(), "waiting_room.token_secret".to_string()),
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("waiting_room.token_secret_file: reading {}", path.display()))?;
            (
                text,
                format!("waiting_room.token_secret_file ({})", path.display()),
            )
        }
        (None, None) => return Ok(None),
    };
    let bytes = URL_SAFE_NO_PAD
        .decode(encoded.trim().trim_end_matches('='))
        .map_err(|_| {
            anyhow::anyhow!(
                "{source}: not URL-safe base64 (make one with `openssl rand 32 | basenc --base64url`)"
            )
        })?;
    let bytes: [u8; 32] = bytes
        .try_into()
        .map_err(|_| anyhow::anyhow!("{source}: must decode to exactly 32 bytes"))?;
    Ok(Some(TokenSecret::from_bytes(bytes)))
}

/// The embedded backend's secret: the configured one, else `<data_dir>/queue.secret` (generated on the
/// first start, so a single instance starts with no configuration). That file sits next to the store it
/// protects, so a backup of the data directory holds both (SPEC 2.3): a warning says so at every start.
pub(crate) fn load_or_create_secret(
    config: &WaitingRoomConfig,
    data_dir: &Path,
) -> anyhow::Result<TokenSecret> {
    if let Some(secret) = configured_token_secret(config)? {
        if let Some(path) = &config.token_secret_file {
            if let (Ok(file), Ok(dir)) = (path.canonicalize(), data_dir.canonicalize()) {
                if file.starts_with(&dir) {
                    tracing::warn!(
                        file = %path.display(),
                        "waiting_room.token_secret_file is inside the data directory: a backup of the \
                         data directory then holds the secret with the tokens it protects; move it out"
                    );
                }
            }
        }
        return Ok(secret);
    }
    let path = data_dir.join("queue.secret");
    tracing::warn!(
        file = %path.display(),
        "waiting_room.token_secret_file is not set: entry tokens are derived from a secret kept in the data \
         directory, next to the queue store; set token_secret_file to a file outside it for production"
    );
    if let Ok(existing) = std::fs::read(&path) {
        let bytes: [u8; 32] = existing
            .try_into()
            .map_err(|_| anyhow::anyhow!("{} is not 32 bytes", path.display()))?;
        return Ok(TokenSecret::from_bytes(bytes));
    }
    let secret = TokenSecret::generate().context("reading the OS random number generator")?;
    std::fs::create_dir_all(data_dir).with_context(|| format!("creating {}", data_dir.display()))?;
    write_private_file(&path, &secret.to_bytes()).with_context(|| format!("writing {}", path.display()))?;
    Ok(secret)
}

#[cfg(unix)]
fn write_private_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

#[cfg(not(unix))]
fn write_private_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::write(path, bytes)
}

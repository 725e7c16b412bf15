//! `bucketfs auth gdrive`: the headless OAuth consent flow for Google Drive.
//!
//! It prints the consent address; the user opens it in a browser on any machine, allows
//! access, and pastes back the code (or the whole address the browser ends on, which
//! carries it). The code is exchanged for a refresh token, saved as an `authorized_user`
//! file readable by its owner only, where `gdrive://` mounts find it. The request carries a
//! PKCE challenge and a random `state` ([`auth::Consent`]); `--gdrive-scope readonly` asks
//! for Drive's read-only scope, which the file records so mounts with it are read-only.

use std::io::{BufRead, Write};
use std::path::PathBuf;

use bucketfs_store::gdrive::auth;
use clap::{Args, Subcommand};

#[derive(Subcommand)]
pub enum AuthCommand {
    /// Authorize bucketfs to use your Google Drive (works without a browser on this machine).
    Gdrive(GdriveArgs),
}

#[derive(Args)]
pub struct GdriveArgs {
    /// OAuth client ID (a "Desktop app" client from the Google Cloud console).
    #[arg(long, env = "BUCKETFS_GDRIVE_CLIENT_ID", hide_env_values = true)]
    client_id: String,
    /// OAuth client secret of that client.
    #[arg(long, env = "BUCKETFS_GDRIVE_CLIENT_SECRET", hide_env_values = true)]
    client_secret: String,
    /// Where to save the token (default: ~/.config/bucketfs/gdrive-token.json).
    #[arg(long, env = "BUCKETFS_GDRIVE_TOKEN_FILE")]
    token_file: Option<PathBuf>,
    /// Consent and token server instead of Google's (a Drive emulator).
    #[arg(long)]
    endpoint: Option<String>,
    /// What to allow: full (read and write, Drive's `drive` scope) or readonly
    /// (`drive.readonly`; mounts using this token are then read-only).
    #[arg(long, value_name = "full|readonly", default_value = "full")]
    gdrive_scope: auth::Scope,
}

pub fn run(cmd: AuthCommand) -> Result<(), String> {
    let AuthCommand::Gdrive(a) = cmd;
    let path = a.token_file.or_else(auth::default_token_file).ok_or("no home directory: pass --token-file")?;
    let base = a.endpoint.as_deref().map(|e| e.trim_end_matches('/'));
    let auth_url = base.map_or(auth::GOOGLE_AUTH_URL.to_string(), |b| format!("{b}/o/oauth2/auth"));
    let token_url = base.map_or(auth::GOOGLE_TOKEN_URL.to_string(), |b| format!("{b}/token"));
    let consent = auth::Consent::new(&auth_url, &a.client_id, a.gdrive_scope).map_err(|e| e.message)?;
    let mut err = std::io::stderr();
    let _ = writeln!(
        err,
        "Open this address in a browser (on any machine) and allow access:\n\n  {}\n\n\
         The browser then goes to an address on localhost that may not load: paste that whole\n\
         address (or just its code) here and press Enter.",
        consent.url
    );
    let _ = write!(err, "Code: ");
    let _ = err.flush();
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).map_err(|e| format!("reading the code: {e}"))?;
    let code = consent.code_from_paste(&line)?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let refresh = rt
        .block_on(auth::exchange_code(&token_url, &a.client_id, &a.client_secret, &code, &consent.verifier))
        .map_err(|e| e.to_string())?;
    auth::save_token_file(&path, &a.client_id, &a.client_secret, &refresh, a.gdrive_scope)
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    let _ = writeln!(err, "Saved Google Drive credentials to {} (readable by you only).", path.display());
    Ok(())
}

//! OAuth 2.0 access tokens for Drive: from a refresh token (an installed-app client) or
//! a service-account key (a JWT signed with RS256), plus the headless consent flow used by
//! `bucketfs auth gdrive`. Tokens and secrets are never logged or put in error messages.
//!
//! Where credentials come from, first match wins:
//! 1. `BUCKETFS_GDRIVE_CLIENT_ID`, `BUCKETFS_GDRIVE_CLIENT_SECRET`, `BUCKETFS_GDRIVE_REFRESH_TOKEN`;
//! 2. the token file `BUCKETFS_GDRIVE_TOKEN_FILE`, else `~/.config/bucketfs/gdrive-token.json`
//!    if it exists (written by `bucketfs auth gdrive`; gcloud's `authorized_user` format);
//! 3. `GOOGLE_APPLICATION_CREDENTIALS`: a service-account key or an `authorized_user` file.

use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use base64::Engine;
use rsa::pkcs1v15::SigningKey;
use rsa::pkcs8::DecodePrivateKey;
use rsa::sha2::Sha256;
use rsa::signature::{SignatureEncoding, Signer};
use serde::Deserialize;
use tokio::sync::Mutex;

use crate::{StoreError, StoreErrorKind};

pub const SCOPE: &str = "https://www.googleapis.com/auth/drive";
pub const SCOPE_READONLY: &str = "https://www.googleapis.com/auth/drive.readonly";
pub const GOOGLE_TOKEN_URL: &str = "https://oauth2.googleapis.com/token";
pub const GOOGLE_AUTH_URL: &str = "https://accounts.google.com/o/oauth2/v2/auth";
/// Where Google sends the browser after consent. Nothing needs to listen there: on a
/// headless machine the user copies the address (or just its `code`) from the browser.
pub const REDIRECT_URI: &str = "http://localhost";

/// What a consent grants (`--gdrive-scope`): all of Drive, or reading only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Scope {
    #[default]
    Full,
    ReadOnly,
}

impl Scope {
    pub fn url(self) -> &'static str {
        match self {
            Scope::Full => SCOPE,
            Scope::ReadOnly => SCOPE_READONLY,
        }
    }

    /// The scope a space-separated list grants (a token file's `scope`), if it names Drive's.
    pub fn from_granted(list: &str) -> Option<Scope> {
        let has = |s: &str| list.split_whitespace().any(|x| x == s);
        if has(SCOPE) {
            Some(Scope::Full)
        } else if has(SCOPE_READONLY) {
            Some(Scope::ReadOnly)
        } else {
            None
        }
    }
}

impl std::str::FromStr for Scope {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "full" | "drive" => Ok(Scope::Full),
            "readonly" | "read-only" | "drive.readonly" => Ok(Scope::ReadOnly),
            _ => Err(format!("{s:?}: use full (read and write) or readonly")),
        }
    }
}

/// The credentials an access token is obtained with.
pub enum Credentials {
    Refresh { client_id: String, client_secret: String, refresh_token: String },
    ServiceAccount { email: String, key: Box<rsa::RsaPrivateKey> },
}

/// The key/token file formats we read (gcloud's `authorized_user`, a service-account key).
#[derive(Deserialize, Default)]
#[serde(default)]
pub struct CredentialFile {
    #[serde(rename = "type")]
    pub kind: String,
    pub client_id: String,
    pub client_secret: String,
    pub refresh_token: String,
    pub client_email: String,
    pub private_key: String,
    pub token_uri: Option<String>,
    /// What the consent granted (`bucketfs auth gdrive` writes it; gcloud's files have none).
    pub scope: String,
}

fn config(msg: String) -> StoreError {
    StoreError::new(StoreErrorKind::Config, msg)
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|s| !s.is_empty())
}

/// The default token file of `bucketfs auth gdrive`.
pub fn default_token_file() -> Option<PathBuf> {
    let base =
        env("XDG_CONFIG_HOME").map(PathBuf::from).or_else(|| env("HOME").map(|h| PathBuf::from(h).join(".config")))?;
    Some(base.join("bucketfs").join("gdrive-token.json"))
}

/// The credentials file used when the environment holds no refresh token (see the module docs).
fn credential_file() -> Option<PathBuf> {
    let token_file = env("BUCKETFS_GDRIVE_TOKEN_FILE").map(PathBuf::from);
    let candidates = [
        token_file.clone(),
        default_token_file().filter(|p| token_file.is_none() && p.exists()),
        env("GOOGLE_APPLICATION_CREDENTIALS").map(PathBuf::from),
    ];
    candidates.into_iter().flatten().next()
}

fn env_refresh_token() -> Option<(String, String, String)> {
    Some((
        env("BUCKETFS_GDRIVE_CLIENT_ID")?,
        env("BUCKETFS_GDRIVE_CLIENT_SECRET")?,
        env("BUCKETFS_GDRIVE_REFRESH_TOKEN")?,
    ))
}

/// The scope the credentials in use were granted, when their file says
/// (`bucketfs auth gdrive` records it).
pub fn saved_scope() -> Option<Scope> {
    if env_refresh_token().is_some() {
        return None;
    }
    let text = std::fs::read_to_string(credential_file()?).ok()?;
    Scope::from_granted(&serde_json::from_str::<CredentialFile>(&text).ok()?.scope)
}

/// The scope a mount works with: `--gdrive-scope`, else what the token file records, else
/// full. Asking for full access with a token granted read-only access is refused here, not
/// at the first write.
pub fn effective_scope(flag: Option<Scope>) -> Result<Scope, StoreError> {
    match (flag, saved_scope()) {
        (Some(Scope::Full), Some(Scope::ReadOnly)) => Err(config(
            "--gdrive-scope full, but the saved Google Drive token was granted read-only access: run \
             `bucketfs auth gdrive --gdrive-scope full` again, or mount with --gdrive-scope readonly"
                .into(),
        )),
        (Some(s), _) | (None, Some(s)) => Ok(s),
        (None, None) => Ok(Scope::Full),
    }
}

impl Credentials {
    /// Find credentials as the module docs say; also returns the file's `token_uri`.
    pub fn from_env() -> Result<(Self, Option<String>), StoreError> {
        if let Some((client_id, client_secret, refresh_token)) = env_refresh_token() {
            return Ok((Credentials::Refresh { client_id, client_secret, refresh_token }, None));
        }
        if let Some(path) = credential_file() {
            return Self::from_file(&path);
        }
        Err(config(
            "no Google Drive credentials: run `bucketfs auth gdrive`, or set GOOGLE_APPLICATION_CREDENTIALS to a \
             service-account key, or BUCKETFS_GDRIVE_CLIENT_ID/_CLIENT_SECRET/_REFRESH_TOKEN"
                .into(),
        ))
    }

    pub fn from_file(path: &std::path::Path) -> Result<(Self, Option<String>), StoreError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| config(format!("cannot read Drive credentials {}: {e}", path.display())))?;
        let f: CredentialFile = serde_json::from_str(&text)
            .map_err(|e| config(format!("{} is not a credentials JSON file: {e}", path.display())))?;
        let creds = match f.kind.as_str() {
            "service_account" => {
                let key = rsa::RsaPrivateKey::from_pkcs8_pem(&f.private_key)
                    .map_err(|_| config(format!("{}: private_key is not a PKCS#8 PEM RSA key", path.display())))?;
                Credentials::ServiceAccount { email: f.client_email, key: Box::new(key) }
            }
            "authorized_user" | "" if !f.refresh_token.is_empty() => Credentials::Refresh {
                client_id: f.client_id,
                client_secret: f.client_secret,
                refresh_token: f.refresh_token,
            },
            other => {
                return Err(config(format!(
                    "{}: credentials of type {other:?} are not supported (service_account or authorized_user)",
                    path.display()
                )))
            }
        };
        Ok((creds, f.token_uri))
    }
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
    #[serde(default)]
    expires_in: Option<u64>,
    #[serde(default)]
    refresh_token: Option<String>,
}

/// Gets and caches access tokens; refreshes them a minute before they expire.
pub struct Auth {
    creds: Credentials,
    token_url: String,
    http: reqwest::Client,
    cached: Mutex<Option<(String, Instant)>>,
    /// The scope a service account asks for (a refresh token has the one it was granted).
    scope: Scope,
}

impl Auth {
    pub fn new(creds: Credentials, token_url: String, http: reqwest::Client) -> Self {
        Self { creds, token_url, http, cached: Mutex::new(None), scope: Scope::Full }
    }

    pub fn with_scope(self, scope: Scope) -> Self {
        Self { scope, ..self }
    }

    /// A valid access token.
    pub async fn token(&self) -> Result<String, StoreError> {
        let mut cached = self.cached.lock().await;
        if let Some((t, until)) = cached.as_ref() {
            if Instant::now() < *until {
                return Ok(t.clone());
            }
        }
        let form: Vec<(&str, String)> = match &self.creds {
            Credentials::Refresh { client_id, client_secret, refresh_token } => vec![
                ("grant_type", "refresh_token".into()),
                ("client_id", client_id.clone()),
                ("client_secret", client_secret.clone()),
                ("refresh_token", refresh_token.clone()),
            ],
            Credentials::ServiceAccount { email, key } => vec![
                ("grant_type", "urn:ietf:params:oauth:grant-type:jwt-bearer".into()),
                ("assertion", jwt(email, key, &self.token_url, self.scope)?),
            ],
        };
        let hint = match &self.creds {
            Credentials::Refresh { .. } => Grant::Refresh,
            Credentials::ServiceAccount { .. } => Grant::ServiceAccount,
        };
        let r = post_form(&self.http, &self.token_url, &form, hint).await?;
        let life = Duration::from_secs(r.expires_in.unwrap_or(3600).saturating_sub(60).max(1));
        *cached = Some((r.access_token.clone(), Instant::now() + life));
        Ok(r.access_token)
    }

    /// Forget the cached token (the server refused it).
    pub async fn invalidate(&self) {
        *self.cached.lock().await = None;
    }
}

/// What a token request exchanges, to say what to do when it is refused.
#[derive(Clone, Copy)]
enum Grant {
    Refresh,
    ServiceAccount,
    Code,
}

/// An OAuth error answer (RFC 6749 section 5.2); it carries no secret.
#[derive(Deserialize, Default)]
#[serde(default)]
struct OauthError {
    error: String,
    error_description: String,
}

/// How many times a token request is tried when the endpoint is down (5xx, no answer).
const TOKEN_TRIES: usize = 5;

/// POST a token request. 5xx answers and transport errors are retried with backoff; a
/// refusal (4xx) is one error that says what to do.
async fn post_form(
    http: &reqwest::Client,
    url: &str,
    form: &[(&str, String)],
    grant: Grant,
) -> Result<TokenResponse, StoreError> {
    let body = url::form_urlencoded::Serializer::new(String::new()).extend_pairs(form).finish();
    let mut attempt = 0;
    let (status, text) = loop {
        let sent = http.post(url).header("Content-Type", "application/x-www-form-urlencoded").body(body.clone()).send();
        let failed = match sent.await {
            Ok(r) if !r.status().is_server_error() => break (r.status(), r.text().await.unwrap_or_default()),
            Ok(r) => format!("{}", r.status()),
            Err(e) => e.to_string(),
        };
        attempt += 1;
        if attempt >= TOKEN_TRIES {
            return Err(StoreError::new(
                StoreErrorKind::Unavailable,
                format!("token request to {url} failed {attempt} times, last: {failed}"),
            ));
        }
        tracing::debug!(attempt, "drive: token endpoint failed ({failed}), retrying");
        tokio::time::sleep(crate::retry::backoff(attempt - 1, 8_000)).await;
    };
    if !status.is_success() {
        let e: OauthError = serde_json::from_str(&text).unwrap_or_default();
        let said = match (e.error.as_str(), e.error_description.as_str()) {
            ("", _) => text.split_whitespace().collect::<Vec<_>>().join(" ").chars().take(300).collect(),
            (code, "") => code.to_string(),
            (code, desc) => format!("{code}: {desc}"),
        };
        let todo = match (e.error.as_str(), grant) {
            ("invalid_grant", Grant::Refresh) => {
                "the refresh token expired or was revoked: run `bucketfs auth gdrive` again for a new one"
            }
            ("invalid_grant", Grant::ServiceAccount) => {
                "the service-account key was refused: check that the key is still active (not deleted in the \
                 Cloud console) and that this machine's clock is right"
            }
            ("invalid_grant", Grant::Code) => "the code was refused: run the flow again and paste the new code",
            ("invalid_client" | "unauthorized_client", _) => {
                "the OAuth client ID or secret is wrong: check BUCKETFS_GDRIVE_CLIENT_ID/_CLIENT_SECRET or the token file"
            }
            _ => "check the Drive credentials (see `bucketfs auth gdrive`)",
        };
        return Err(StoreError::new(
            StoreErrorKind::PermissionDenied,
            format!("token request to {url} refused ({status}: {said}); {todo}"),
        ));
    }
    serde_json::from_str(&text)
        .map_err(|e| StoreError::new(StoreErrorKind::Other, format!("token response from {url}: {e}")))
}

/// A service-account assertion: a JWT with Drive's scope, signed with the account's key.
fn jwt(email: &str, key: &rsa::RsaPrivateKey, aud: &str, scope: Scope) -> Result<String, StoreError> {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default().as_secs();
    let header = b64.encode(br#"{"alg":"RS256","typ":"JWT"}"#);
    let claims = serde_json::json!({"iss": email, "scope": scope.url(), "aud": aud, "iat": now, "exp": now + 3600});
    let unsigned = format!("{header}.{}", b64.encode(claims.to_string()));
    let signer = SigningKey::<Sha256>::new((*key).clone());
    let sig = signer.try_sign(unsigned.as_bytes()).map_err(|e| {
        StoreError::new(StoreErrorKind::Config, format!("cannot sign the service-account assertion: {e}"))
    })?;
    Ok(format!("{unsigned}.{}", b64.encode(sig.to_bytes())))
}

/// One consent request of the headless flow: the address to open, and the secrets that
/// tie its answer to this run.
///
/// It follows Google's "OAuth 2.0 for Mobile & Desktop Apps"
/// (developers.google.com/identity/protocols/oauth2/native-app): PKCE (RFC 7636) with
/// `code_challenge_method=S256`, so a code intercepted on its way back (the redirect goes to
/// an address on localhost that anything may listen on) cannot be exchanged without
/// [`Consent::verifier`], which never leaves this process; and a random `state`, which
/// Google returns with the code, so an address from another request is refused.
pub struct Consent {
    pub url: String,
    /// The PKCE code verifier: 43 characters of base64url (32 random bytes), sent only
    /// with the code exchange.
    pub verifier: String,
    pub state: String,
}

impl Consent {
    pub fn new(auth_url: &str, client_id: &str, scope: Scope) -> Result<Self, StoreError> {
        let (verifier, state) = (random_token()?, random_token()?);
        let url = consent_url(auth_url, client_id, scope, &pkce_challenge(&verifier), &state);
        Ok(Consent { url, verifier, state })
    }

    /// The code in what the user pasted: the code itself, or the whole redirected address,
    /// whose `state` must be this request's. A bare code cannot be checked that way; PKCE
    /// still binds it to this run.
    pub fn code_from_paste(&self, pasted: &str) -> Result<String, String> {
        let s = pasted.trim();
        if let Ok(u) = url::Url::parse(s) {
            let get = |k: &str| u.query_pairs().find(|(n, _)| n == k).map(|(_, v)| v.into_owned());
            if let Some(e) = get("error") {
                return Err(format!("consent was not given ({e}); run `bucketfs auth gdrive` again"));
            }
            let code = get("code").ok_or("no authorization code in the pasted address (no `code=`)")?;
            if get("state").as_deref() != Some(self.state.as_str()) {
                return Err("the pasted address does not answer this consent request (its state differs): \
                            open the address printed above and paste where it leads"
                    .into());
            }
            return Ok(code);
        }
        let s = s.strip_prefix("code=").unwrap_or(s);
        if s.is_empty() || s.contains(char::is_whitespace) {
            return Err(
                "no authorization code in what was pasted: paste the code, or the address that contains `code=`".into(),
            );
        }
        Ok(s.to_string())
    }
}

/// 32 random bytes from the OS, base64url without padding (43 characters).
fn random_token() -> Result<String, StoreError> {
    let mut b = [0u8; 32];
    getrandom::getrandom(&mut b).map_err(|e| config(format!("no randomness from the OS: {e}")))?;
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(b))
}

/// RFC 7636 S256: base64url(SHA-256(verifier)), no padding.
pub fn pkce_challenge(verifier: &str) -> String {
    use rsa::sha2::Digest;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(verifier.as_bytes()))
}

/// The consent page to open in a browser (on any machine) for the headless flow.
fn consent_url(auth_url: &str, client_id: &str, scope: Scope, challenge: &str, state: &str) -> String {
    let q = url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs([
            ("client_id", client_id),
            ("redirect_uri", REDIRECT_URI),
            ("response_type", "code"),
            ("scope", scope.url()),
            ("access_type", "offline"),
            ("prompt", "consent"),
            ("code_challenge", challenge),
            ("code_challenge_method", "S256"),
            ("state", state),
        ])
        .finish();
    format!("{auth_url}?{q}")
}

/// Exchange a consent code for a refresh token (the headless flow's last step).
pub async fn exchange_code(
    token_url: &str,
    client_id: &str,
    client_secret: &str,
    code: &str,
    verifier: &str,
) -> Result<String, StoreError> {
    let http = reqwest::Client::new();
    let r = post_form(
        &http,
        token_url,
        &[
            ("grant_type", "authorization_code".into()),
            ("client_id", client_id.into()),
            ("client_secret", client_secret.into()),
            ("code", code.into()),
            ("redirect_uri", REDIRECT_URI.into()),
            ("code_verifier", verifier.into()),
        ],
        Grant::Code,
    )
    .await?;
    r.refresh_token.ok_or_else(|| {
        StoreError::new(StoreErrorKind::PermissionDenied, "the token answer has no refresh_token; run the flow again")
    })
}

/// Save a refresh token as an `authorized_user` file readable by its owner only (0600).
pub fn save_token_file(
    path: &std::path::Path,
    client_id: &str,
    client_secret: &str,
    refresh_token: &str,
    scope: Scope,
) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let body = serde_json::json!({
        "type": "authorized_user", "client_id": client_id, "client_secret": client_secret, "refresh_token": refresh_token,
        "scope": scope.url(),
    });
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
    f.write_all(body.to_string().as_bytes())?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pasted_codes_and_state() {
        let c = Consent::new("http://a/auth", "cid", Scope::Full).unwrap();
        let st = &c.state;
        assert_eq!(c.code_from_paste(" 4/abc-d \n").as_deref(), Ok("4/abc-d"));
        assert_eq!(c.code_from_paste(&format!("http://localhost/?code=4%2Fxy&state={st}")).as_deref(), Ok("4/xy"));
        assert!(c.code_from_paste("http://localhost/?code=4%2Fxy&state=other").unwrap_err().contains("state"));
        assert!(c.code_from_paste("http://localhost/?code=4%2Fxy").unwrap_err().contains("state"));
        assert!(c.code_from_paste("http://localhost/?error=access_denied").unwrap_err().contains("access_denied"));
        assert!(c.code_from_paste("two words").is_err());
    }

    #[test]
    fn consent_carries_pkce_state_and_scope() {
        let a = Consent::new("http://a/auth", "cid", Scope::ReadOnly).unwrap();
        let b = Consent::new("http://a/auth", "cid", Scope::ReadOnly).unwrap();
        assert_ne!((&a.verifier, &a.state), (&b.verifier, &b.state), "fresh secrets per request");
        assert_eq!(a.verifier.len(), 43, "RFC 7636: 43 to 128 characters");
        let q: std::collections::HashMap<String, String> =
            url::Url::parse(&a.url).unwrap().query_pairs().map(|(k, v)| (k.into(), v.into())).collect();
        assert_eq!(q["code_challenge"], pkce_challenge(&a.verifier));
        assert_eq!(q["code_challenge_method"], "S256");
        assert_eq!(q["state"], a.state);
        assert_eq!(q["scope"], SCOPE_READONLY);
        assert_eq!(q["redirect_uri"], "http://localhost");
        assert!(!a.url.contains(&a.verifier));
    }

    /// RFC 7636 appendix B's example.
    #[test]
    fn s256_challenge_matches_the_rfc() {
        assert_eq!(
            pkce_challenge("dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk"),
            "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
        );
    }

    #[test]
    fn scopes() {
        assert_eq!("readonly".parse::<Scope>(), Ok(Scope::ReadOnly));
        assert_eq!("full".parse::<Scope>(), Ok(Scope::Full));
        assert!("write".parse::<Scope>().is_err());
        assert_eq!(Scope::from_granted(&format!("openid {SCOPE_READONLY}")), Some(Scope::ReadOnly));
        assert_eq!(Scope::from_granted(&format!("{SCOPE_READONLY} {SCOPE}")), Some(Scope::Full));
        assert_eq!(Scope::from_granted(""), None);
    }
}

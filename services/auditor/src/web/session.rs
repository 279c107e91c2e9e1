//! Who is asking, checked before any handler runs:
//!
//! - pages need a session: cookie `pw_auditor_session` (HttpOnly, SameSite=Strict, Path=/,
//!   Secure when the UI is served under TLS). Without one a GET is redirected to
//!   `/login?next=...` and anything else is a 401;
//! - every form post comes from this origin (its `Origin`, else its `Referer`, names the host
//!   it was sent to) or is a 403, and carries the session's CSRF token (checked by the handler
//!   that reads the form, [`SessionUser::check_csrf`]);
//! - the JSON API needs `Authorization: Bearer TOKEN`;
//! - acknowledging and resolving needs the operator role ([`sign_off_as`]); the name recorded
//!   is the session's or the token's, never one a form supplies.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, COOKIE, HOST, ORIGIN, REFERER};
use axum::http::{HeaderMap, HeaderValue, Method};
use axum::middleware::Next;
use axum::response::{IntoResponse, Redirect, Response};
use parking_lot::Mutex;
use rand::Rng;

use pagewarden_common::edge::Connection;

use super::throttle::{Throttle, ThrottleLimits};
use super::{AppState, WebError};
use crate::accounts::{Accounts, Principal};

/// The session cookie's name.
pub const COOKIE_NAME: &str = "pw_auditor_session";
/// How long a session lasts from sign-in (no sliding renewal: sign in again after).
const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// argon2 checks running at once; more sign-in attempts wait (each takes ~19 MiB and a core).
const CONCURRENT_LOGINS: usize = 2;

/// A signed-in person, as handlers see them.
#[derive(Clone, Debug)]
pub struct SessionUser {
    /// Who.
    pub who: Principal,
    /// The token every form of this session carries.
    pub csrf: String,
}

impl SessionUser {
    /// A 403 unless `token` is this session's CSRF token.
    pub fn check_csrf(&self, token: &str) -> Result<(), WebError> {
        let (a, b) = (self.csrf.as_bytes(), token.as_bytes());
        // Constant time over the token's length: no early exit on the first wrong byte.
        let same =
            a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0;
        if same {
            Ok(())
        } else {
            Err(WebError::Forbidden(
                "missing or wrong CSRF token: reload the page and try again".into(),
            ))
        }
    }
}

/// The acting name when `who` may acknowledge and resolve; a 403 for viewers.
pub fn sign_off_as(who: &Principal) -> Result<&str, WebError> {
    operator_as(who, "acknowledge or resolve incidents")
}

/// The acting name when `who` is an operator; a 403 for viewers saying only operators `what`.
pub fn operator_as<'a>(who: &'a Principal, what: &str) -> Result<&'a str, WebError> {
    if who.role.may_sign_off() {
        Ok(&who.name)
    } else {
        Err(WebError::Forbidden(format!(
            "`{}` is a {}: only operators {what}",
            who.name,
            who.role.as_str()
        )))
    }
}

struct Session {
    user: SessionUser,
    expires: Instant,
}

/// Accounts, live sessions and cookie settings.
pub struct Auth {
    accounts: Accounts,
    sessions: Mutex<HashMap<String, Session>>,
    secure_cookies: bool,
    logins: tokio::sync::Semaphore,
    /// Back-off of failed sign-ins.
    pub throttle: Throttle,
}

type HashJob = Box<dyn FnOnce() + Send>;

/// The threads that run argon2: always the same `CONCURRENT_LOGINS` of them. Each hash takes
/// argon2's whole memory block; run on ever new blocking threads, every thread's allocator
/// arena kept one (a flood of sign-ins grew the auditor by hundreds of MB), so the hashing
/// threads are fixed and their memory is reused.
fn hashers() -> &'static Mutex<std::sync::mpsc::Sender<HashJob>> {
    static HASHERS: std::sync::OnceLock<Mutex<std::sync::mpsc::Sender<HashJob>>> =
        std::sync::OnceLock::new();
    HASHERS.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<HashJob>();
        let rx = std::sync::Arc::new(Mutex::new(rx));
        for i in 0..CONCURRENT_LOGINS {
            let rx = rx.clone();
            std::thread::Builder::new()
                .name(format!("argon2-{i}"))
                .spawn(move || loop {
                    let job = rx.lock().recv();
                    match job {
                        Ok(job) => job(),
                        Err(_) => return,
                    }
                })
                .expect("spawning a password hashing thread");
        }
        Mutex::new(tx)
    })
}

fn random_hex() -> String {
    let mut rng = rand::rng();
    format!("{:032x}{:032x}", rng.random::<u128>(), rng.random::<u128>())
}

impl Auth {
    /// `secure_cookies`: the UI is served under TLS, so cookies are marked `Secure` (they are
    /// also whenever a TLS proxy says so with `X-Forwarded-Proto: https`).
    pub fn new(accounts: Accounts, secure_cookies: bool) -> Self {
        Self::with_throttle(accounts, secure_cookies, ThrottleLimits::default())
    }

    /// Like [`Auth::new`], with failed sign-ins backing off under `limits`.
    pub fn with_throttle(accounts: Accounts, secure_cookies: bool, limits: ThrottleLimits) -> Self {
        Self {
            accounts,
            sessions: Mutex::new(HashMap::new()),
            secure_cookies,
            logins: tokio::sync::Semaphore::new(CONCURRENT_LOGINS),
            throttle: Throttle::new(limits),
        }
    }

    /// Checks a name and password (argon2, off the async threads) and opens a session.
    /// Returns the session id.
    pub async fn login(&self, name: String, password: String) -> Option<String> {
        let _permit = self.logins.acquire().await.ok()?;
        let accounts = self.accounts.clone();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let job: HashJob = Box::new(move || {
            let _ = tx.send(accounts.login(&name, &password));
        });
        hashers().lock().send(job).ok()?;
        let who = rx.await.ok()??;
        let id = random_hex();
        let now = Instant::now();
        let mut map = self.sessions.lock();
        map.retain(|_, s| s.expires > now);
        map.insert(
            id.clone(),
            Session {
                user: SessionUser {
                    who,
                    csrf: random_hex(),
                },
                expires: now + SESSION_TTL,
            },
        );
        Some(id)
    }

    /// Ends the session `id`.
    pub fn logout(&self, id: &str) {
        self.sessions.lock().remove(id);
    }

    fn session(&self, headers: &HeaderMap) -> Option<(String, SessionUser)> {
        let id = session_id(headers)?;
        let map = self.sessions.lock();
        let s = map.get(id).filter(|s| s.expires > Instant::now())?;
        Some((id.to_string(), s.user.clone()))
    }

    /// The `Set-Cookie` value carrying session `id` (`None`: clear the cookie).
    pub fn cookie(&self, headers: &HeaderMap, id: Option<&str>) -> HeaderValue {
        let forwarded_tls = headers
            .get("x-forwarded-proto")
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"https"));
        let secure = if self.secure_cookies || forwarded_tls {
            "; Secure"
        } else {
            ""
        };
        let (value, age) = match id {
            Some(id) => (id, SESSION_TTL.as_secs()),
            None => ("", 0),
        };
        HeaderValue::from_str(&format!(
            "{COOKIE_NAME}={value}; Path=/; HttpOnly; SameSite=Strict; Max-Age={age}{secure}"
        ))
        .unwrap_or_else(|_| unreachable!("hex ids make a valid header"))
    }
}

/// The session id the request's cookies carry.
pub fn session_id(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .find_map(|c| c.trim().strip_prefix(COOKIE_NAME)?.strip_prefix('='))
}

/// Percent-encodes a path and query for a `next=` parameter.
fn encode_component(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' | b'/' => {
                (b as char).to_string()
            }
            b => format!("%{b:02X}"),
        })
        .collect()
}

/// Middleware of the pages: a [`SessionUser`] request extension, or a redirect to sign in.
pub async fn require_session(State(st): State<AppState>, mut req: Request, next: Next) -> Response {
    match st.auth.session(req.headers()) {
        Some((_, user)) => {
            mark_connection(&req, &user.who);
            req.extensions_mut().insert(user);
            next.run(req).await
        }
        None if req.method() == Method::GET => {
            let here = req
                .uri()
                .path_and_query()
                .map(|p| p.as_str())
                .unwrap_or("/");
            Redirect::to(&format!("/login?next={}", encode_component(here))).into_response()
        }
        None => WebError::Unauthorized("sign in first: your session is missing or expired".into())
            .into_response(),
    }
}

/// The session id and user of a request that passed [`require_session`] (for sign-out).
pub fn current(st: &AppState, headers: &HeaderMap) -> Option<(String, SessionUser)> {
    st.auth.session(headers)
}

/// Middleware of the JSON API: a [`Principal`] request extension, or a 401.
pub async fn require_bearer(State(st): State<AppState>, mut req: Request, next: Next) -> Response {
    let who = req
        .headers()
        .get(AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|s| s.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .and_then(|(_, token)| st.auth.accounts.bearer(token.trim()));
    match who {
        Some(who) => {
            mark_connection(&req, &who);
            req.extensions_mut().insert(who);
            next.run(req).await
        }
        None => WebError::Unauthorized(
            "the JSON API needs `Authorization: Bearer TOKEN` with a token from the auditor's \
             [[api_tokens]]"
                .into(),
        )
        .into_response(),
    }
}

/// A signed-in request's connection counts against its account, not its source address.
fn mark_connection(req: &Request, who: &Principal) {
    if let Some(conn) = req.extensions().get::<Connection>() {
        conn.authenticated(&who.name);
    }
}

/// Whether `source` (an `Origin`, or a `Referer` URL) names `host` (the `Host` header).
fn names_host(source: &str, host: &str) -> bool {
    let rest = source
        .strip_prefix("http://")
        .or_else(|| source.strip_prefix("https://"));
    rest.and_then(|r| r.split(['/', '?', '#']).next())
        .is_some_and(|h| h.eq_ignore_ascii_case(host))
}

/// Middleware of the whole listener: a form post (any POST outside `/api/`) must come from a
/// page of this origin, else 403. Browsers send `Origin` on every POST; `Referer` is the
/// fallback; a post with neither is refused too.
pub async fn same_origin_posts(req: Request, next: Next) -> Response {
    if req.method() != Method::POST || req.uri().path().starts_with("/api/") {
        return next.run(req).await;
    }
    let h = req.headers();
    let text = |name| h.get(name).and_then(|v: &HeaderValue| v.to_str().ok());
    let ok = match (text(HOST), text(ORIGIN).or_else(|| text(REFERER))) {
        (Some(host), Some(source)) => names_host(source, host),
        _ => false,
    };
    if ok {
        next.run(req).await
    } else {
        WebError::Forbidden("cross-origin form post refused".into()).into_response()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_must_name_the_host() {
        assert!(names_host("http://127.0.0.1:7401", "127.0.0.1:7401"));
        assert!(names_host("https://a.example/incidents?x=1", "a.example"));
        assert!(!names_host("http://127.0.0.1:7402", "127.0.0.1:7401"));
        assert!(!names_host("http://127.0.0.1:7401.evil", "127.0.0.1:7401"));
        assert!(!names_host("null", "127.0.0.1:7401"));
    }

    #[test]
    fn cookies_and_next_parameters_parse() {
        let mut h = HeaderMap::new();
        h.insert(
            COOKIE,
            HeaderValue::from_static("a=1; pw_auditor_session=abc; b=2"),
        );
        assert_eq!(session_id(&h), Some("abc"));
        assert_eq!(
            encode_component("/incidents?a=b&c"),
            "/incidents%3Fa%3Db%26c"
        );
    }
}

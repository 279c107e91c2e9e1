//! Who gets in: the test accounts every in-process auditor is started with, a signed-in HTTP
//! client, and the locks of the web UI and the JSON API checked request by request (the
//! browser test checks the same through Chromium).

use pagewarden_auditor::accounts::{hash_password, ApiToken, OperatorAccount, Role};
use pagewarden_auditor::{accounts::Accounts, Config};
use pagewarden_common::secret::SecretHash;
use pagewarden_proto::v1 as pb;
use rand::SeedableRng;
use reqwest::header::{COOKIE, LOCATION, ORIGIN, SET_COOKIE};
use reqwest::StatusCode;
use serde_json::{json, Value};

use crate::ingest::{get_json, open_incident_id, report_kinds, start};

/// The operator account: name and password.
pub const OPERATOR: (&str, &str) = ("ops-ann", "ann-correct-horse");
/// The viewer account.
pub const VIEWER: (&str, &str) = ("viewer-vic", "vic-battery-staple");
/// A bearer token with the operator role, named `ops-token`.
pub const OPS_TOKEN: &str = "pw-test-operator-token";
/// A bearer token with the viewer role, named `viewer-token`.
pub const VIEWER_TOKEN: &str = "pw-test-viewer-token";

/// `Config::for_tests` with the accounts above.
pub fn config(database_url: &str) -> Config {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let mut op = |(name, pw): (&str, &str), role| OperatorAccount {
        name: name.into(),
        role,
        password_argon2: hash_password(pw, &mut rng),
    };
    let operators = [op(OPERATOR, Role::Operator), op(VIEWER, Role::Viewer)];
    let tok = |name: &str, t: &str, role| ApiToken {
        name: name.into(),
        role,
        token_sha256: SecretHash::of(t),
    };
    let tokens = [
        tok("ops-token", OPS_TOKEN, Role::Operator),
        tok("viewer-token", VIEWER_TOKEN, Role::Viewer),
    ];
    let mut c = Config::for_tests(database_url);
    c.accounts = Accounts::new(&operators, &tokens).expect("test accounts");
    c
}

/// An HTTP client signed in to the web UI (cookie and CSRF token in hand).
pub struct Signed {
    http: reqwest::Client,
    base: String,
    cookie: String,
    /// The session's CSRF token, as its pages carry it.
    pub csrf: String,
}

fn no_redirects() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// POSTs a form to `url` claiming to come from `origin`, with the session `cookie` if any.
async fn post_form(
    http: &reqwest::Client,
    url: String,
    origin: &str,
    cookie: Option<&str>,
    form: &[(&str, &str)],
) -> reqwest::Response {
    let mut req = http.post(url).header(ORIGIN, origin).form(form);
    if let Some(c) = cookie {
        req = req.header(COOKIE, c);
    }
    req.send().await.unwrap()
}

impl Signed {
    /// Signs in at `base` (`http://host:port`) as `(name, password)`.
    pub async fn sign_in(base: &str, (name, password): (&str, &str)) -> Self {
        let http = no_redirects();
        let form = [("name", name), ("password", password), ("next", "/nodes")];
        let resp = post_form(&http, format!("{base}/login"), base, None, &form).await;
        assert_eq!(resp.status(), StatusCode::SEE_OTHER, "sign-in of {name}");
        assert_eq!(resp.headers()[LOCATION], "/nodes");
        let set = resp.headers()[SET_COOKIE].to_str().unwrap().to_string();
        for attr in ["HttpOnly", "SameSite=Strict", "Path=/"] {
            assert!(set.contains(attr), "cookie without {attr}: {set}");
        }
        let cookie = set.split(';').next().unwrap().to_string();
        let mut s = Self {
            http,
            base: base.to_string(),
            cookie,
            csrf: String::new(),
        };
        let page = s.get("/nodes").await.text().await.unwrap();
        let at = page
            .find("name=\"csrf\" value=\"")
            .expect("pages carry a CSRF token")
            + 19;
        s.csrf = page[at..].split('"').next().unwrap().to_string();
        s
    }

    /// GET `path` with the session cookie.
    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.http
            .get(format!("{}{path}", self.base))
            .header(COOKIE, &self.cookie)
            .send()
            .await
            .unwrap()
    }

    /// POSTs a form to `path` with the session cookie, claiming to come from `origin`.
    pub async fn post(&self, path: &str, origin: &str, form: &[(&str, &str)]) -> reqwest::Response {
        let url = format!("{}{path}", self.base);
        post_form(&self.http, url, origin, Some(&self.cookie), form).await
    }
}

/// POSTs JSON to the API with `token` (or none).
pub async fn api_post(url: String, token: Option<&str>, body: Value) -> reqwest::Response {
    let mut req = reqwest::Client::new().post(url).json(&body);
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    req.send().await.unwrap()
}

#[tokio::test]
async fn pages_and_api_are_locked_and_sign_offs_name_the_signed_in_operator() {
    let r = start().await;
    let base = format!("http://{}", r.http_addr);
    use pb::IntegrityKind::{ChecksumMismatch, GuardWordCorrupt};
    report_kinds(&r, "decode-0", &[ChecksumMismatch, GuardWordCorrupt]).await;
    let id = open_incident_id(&r, "checksum_mismatch").await;
    let other = open_incident_id(&r, "guard_word_corrupt").await;

    // Nobody signed in: pages redirect to the sign-in page, the API and posts are refused.
    let http = no_redirects();
    let resp = http
        .get(format!("{base}/incidents?status=open"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    assert_eq!(
        resp.headers()[LOCATION],
        "/login?next=/incidents%3Fstatus%3Dopen"
    );
    let resp = http
        .get(format!("{base}/api/incidents"))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let ack = format!("/incidents/{id}/ack");
    let resp = post_form(
        &http,
        format!("{base}{ack}"),
        &base,
        None,
        &[("by", "mallory")],
    )
    .await;
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let resp = api_post(format!("{base}/api{ack}"), None, json!({"by": "mallory"})).await;
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    let form = [("name", OPERATOR.0), ("password", "guess")];
    let resp = post_form(&http, format!("{base}/login"), &base, None, &form).await;
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert!(resp.headers().get(SET_COOKIE).is_none());

    // A viewer reads but cannot sign off, by form or by token.
    let viewer = Signed::sign_in(&base, VIEWER).await;
    let page = viewer.get("/incidents").await.text().await.unwrap();
    assert!(page.contains(&format!("id=\"incident-{id}\"")), "{page}");
    assert!(
        !page.contains(&format!("id=\"ack-{id}\"")),
        "viewers get no buttons"
    );
    let csrf = viewer.csrf.clone();
    let resp = viewer.post(&ack, &base, &[("csrf", csrf.as_str())]).await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let resp = api_post(format!("{base}/api{ack}"), Some(VIEWER_TOKEN), json!({})).await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);

    // An operator's post without the CSRF token, or from another origin, is refused.
    let ops = Signed::sign_in(&base, OPERATOR).await;
    let resp = ops.post(&ack, &base, &[("by", "ops-ann")]).await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let csrf = ops.csrf.clone();
    let resp = ops
        .post(&ack, "http://127.0.0.1:1", &[("csrf", csrf.as_str())])
        .await;
    assert_eq!(resp.status(), StatusCode::FORBIDDEN);
    let api = format!("{base}/api/incidents/{id}");
    let still = get_json(api.clone()).await;
    assert_eq!(still["status"], "open", "{still}");

    // The operator's own post works and records the session's name, not the form's.
    let resp = ops
        .post(
            &ack,
            &base,
            &[("csrf", csrf.as_str()), ("by", "mallory"), ("note", "seen")],
        )
        .await;
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    let done = get_json(api).await;
    assert_eq!(done["status"], "acknowledged");
    assert_eq!(done["acknowledged"]["by"], OPERATOR.0, "{done}");

    // An operator token signs off under its own name.
    let resp = api_post(
        format!("{base}/api/incidents/{other}/resolve"),
        Some(OPS_TOKEN),
        json!({"by": "mallory", "note": "fixed"}),
    )
    .await;
    assert_eq!(resp.status(), StatusCode::OK);
    let done: Value = resp.json().await.unwrap();
    assert_eq!(done["resolved"]["by"], "ops-token", "{done}");

    // Signing out ends the session.
    let resp = ops.post("/logout", &base, &[("csrf", csrf.as_str())]).await;
    assert_eq!(resp.status(), StatusCode::SEE_OTHER);
    assert_eq!(ops.get("/incidents").await.status(), StatusCode::SEE_OTHER);
    r.shutdown().await;
}

//! The auditor's sign-in under a guessing flood: 1,000 wrong passwords, 50 at a time, end in
//! 429s (a blocked try hashes nothing) while the auditor stays under 100 MB;
//! once the back-off has passed the right password signs in; `next` values that would send
//! the browser to another host (a tab the browser drops, `//`, `\`, a scheme, CR/LF) land on
//! the auditor's own pages; a form it cannot read is a JSON error, not plain text.

use std::time::Duration;

use argon2::password_hash::{PasswordHasher, SaltString};
use argon2::Argon2;
use pagewarden_system_tests::Service;
use pagewarden_testkit::eventually;
use reqwest::header::{LOCATION, ORIGIN, RETRY_AFTER};

const NAME: &str = "op";
const PASSWORD: &str = "the-right-password";
const FLOOD: usize = 1000;
const AT_ONCE: usize = 50;
const MAX_RSS_KB: u64 = 100 * 1024;
/// The test's back-off cap, so that waiting it out stays short.
const BACKOFF: Duration = Duration::from_secs(2);

fn start(dir: &std::path::Path) -> Service {
    let salt = SaltString::encode_b64(b"system-test-salt").expect("salt");
    let hash = Argon2::default()
        .hash_password(PASSWORD.as_bytes(), &salt)
        .expect("hash")
        .to_string();
    let config = dir.join("auditor.toml");
    std::fs::write(
        &config,
        format!(
            "[[operators]]\nname = \"{NAME}\"\nrole = \"operator\"\npassword_argon2 = \"{hash}\"\n"
        ),
    )
    .expect("config");
    let args: Vec<String> = [
        "--http-addr",
        "127.0.0.1:0",
        "--grpc-addr",
        "127.0.0.1:0",
        "--probe-interval",
        "0",
        "--sign-in-max-backoff",
        "2s",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([
        "--config".into(),
        config.display().to_string(),
        "--data-dir".into(),
        dir.display().to_string(),
        "--database-url".into(),
        format!("sqlite://{}/auditor.sqlite?mode=rwc", dir.display()),
    ])
    .collect();
    Service::start("pagewarden-auditor", &args)
}

fn rss_kb(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client")
}

/// One sign-in post; its status and `Location`.
async fn sign_in(
    c: &reqwest::Client,
    auditor: &Service,
    password: &str,
    next: &str,
) -> (u16, Option<String>) {
    let url = auditor.http_url();
    let r = c
        .post(format!("{url}/login"))
        .header(ORIGIN, url.clone())
        .form(&[("name", NAME), ("password", password), ("next", next)])
        .send()
        .await
        .expect("sign-in post");
    let location = r
        .headers()
        .get(LOCATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    (r.status().as_u16(), location)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_guessing_flood_backs_off_in_flat_memory_and_redirects_stay_home() {
    let dir = tempfile::tempdir().expect("tempdir");
    let auditor = start(dir.path());
    let pid = auditor.pid();
    let before = rss_kb(pid);

    let c = client();
    let mut statuses = Vec::with_capacity(FLOOD);
    let mut peak = before;
    for _ in 0..FLOOD / AT_ONCE {
        let wave: Vec<_> = (0..AT_ONCE)
            .map(|i| {
                let (c, auditor_url) = (c.clone(), auditor.http_url());
                tokio::spawn(async move {
                    c.post(format!("{auditor_url}/login"))
                        .header(ORIGIN, auditor_url.clone())
                        .form(&[
                            ("name", NAME),
                            ("password", &format!("guess-{i}")),
                            ("next", "/"),
                        ])
                        .send()
                        .await
                        .map(|r| (r.status().as_u16(), r.headers().contains_key(RETRY_AFTER)))
                })
            })
            .collect();
        for t in wave {
            statuses.push(t.await.expect("task").expect("sign-in post"));
        }
        peak = peak.max(rss_kb(pid));
    }
    let refused = statuses.iter().filter(|(s, _)| *s == 401).count();
    let limited = statuses
        .iter()
        .filter(|(s, retry)| *s == 429 && *retry)
        .count();
    eprintln!(
        "{FLOOD} wrong sign-ins: {refused} 401, {limited} 429 with Retry-After; auditor RSS \
         {before} kB before, {peak} kB at most"
    );
    assert_eq!(
        refused + limited,
        FLOOD,
        "every guess is a 401 or a 429: {statuses:?}"
    );
    assert!(
        limited >= FLOOD * 9 / 10,
        "the flood was not throttled: {limited} 429s"
    );
    assert!(statuses[FLOOD - AT_ONCE..].iter().all(|(s, _)| *s == 429));
    assert!(
        peak < MAX_RSS_KB,
        "the auditor grew to {peak} kB under the flood (at most {MAX_RSS_KB} kB)"
    );

    // The right password while blocked: still a 429, nothing hashed.
    assert_eq!(sign_in(&c, &auditor, PASSWORD, "/").await.0, 429);
    // After the back-off it signs in.
    // A blocked attempt is answered without counting as a failure: asking does not extend it.
    let within = BACKOFF * 4 + Duration::from_secs(10);
    let l = eventually(within, "a sign-in after the back-off", || async {
        match sign_in(&c, &auditor, PASSWORD, "/nodes").await {
            (303, Some(l)) => Some(l),
            (429, _) => None,
            other => panic!("the right password after the back-off: {other:?}"),
        }
    })
    .await;
    assert_eq!(l, "/nodes");

    // Redirect payloads land on the auditor's own pages.
    for next in [
        "/\t/other-host/x",
        "/%09/other-host/x",
        "//other-host/x",
        "/\\other-host/x",
        "https://other-host/x",
        "/%2F/other-host",
        "/x\r\nSet-Cookie: a=b",
    ] {
        let (status, location) = sign_in(&c, &auditor, PASSWORD, next).await;
        assert_eq!(status, 303, "{next:?}");
        assert_eq!(location.as_deref(), Some("/incidents"), "{next:?}");
    }

    // A form the auditor cannot read: a JSON error.
    let url = auditor.http_url();
    let r = c
        .post(format!("{url}/login"))
        .header(ORIGIN, url.clone())
        .form(&[("nobody", "x")])
        .send()
        .await
        .expect("bad form");
    let status = r.status().as_u16();
    let body: serde_json::Value = r.json().await.expect("a JSON error body");
    assert!((400..500).contains(&status), "{status} {body}");
    assert!(body["error"]["message"].is_string(), "{body}");
}

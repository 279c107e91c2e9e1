//! A WebDriver client for the browser test: headless Chromium driven over the W3C WebDriver
//! protocol (Debian's `chromedriver`), spoken directly with reqwest so no extra client crate is
//! needed; just the handful of commands the test uses.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use pagewarden_testkit::{eventually, Polling};
use serde_json::{json, Value};

/// A wait on the browser of at most `within`: it asks every 50 ms, each ask a round trip
/// through chromedriver.
pub fn browser_wait(within: Duration) -> Polling {
    Polling::within(within).every(Duration::from_millis(50))
}

pub const CHROMIUM: &str = "/usr/bin/chromium";
pub const CHROMEDRIVER: &str = "/usr/bin/chromedriver";
pub const MISSING: &str = "install chromium and chromium-driver (scripts/test.sh does)";
/// The key under which WebDriver returns an element reference.
const ELEMENT_KEY: &str = "element-6066-11e4-a52e-4f735466cecf";

/// chromedriver, started as PID 1 of a PID namespace of its own (`unshare --pid`): Chromium and
/// everything it starts live in that namespace, so no signal they send can reach a process
/// outside it (a run once took the whole machine's processes down with it), and killing the
/// namespace's first process ends all of them.
pub struct DriverProcess {
    child: Child,
}

impl Drop for DriverProcess {
    fn drop(&mut self) {
        // `--kill-child` kills chromedriver when `unshare` dies; the kernel then ends every
        // other process of the namespace.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a loopback port")
        .port()
}

pub fn spawn_chromedriver(port: u16) -> DriverProcess {
    let child = Command::new("unshare")
        .args([
            "--pid",
            "--fork",
            "--kill-child",
            "--mount-proc",
            CHROMEDRIVER,
        ])
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {CHROMEDRIVER} under unshare: {e}; {MISSING}"));
    DriverProcess { child }
}

/// A WebDriver session: just the handful of commands this test needs.
pub struct Session {
    http: reqwest::Client,
    url: String,
}

impl Session {
    pub async fn cmd(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let mut req = self.http.request(method, format!("{}{path}", self.url));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let resp = req.send().await.expect("webdriver answers");
        let status = resp.status();
        let v: Value = resp.json().await.expect("webdriver json");
        assert!(status.is_success(), "webdriver {path}: {status} {v}");
        v["value"].clone()
    }

    pub async fn current_url(&self) -> String {
        let v = self.cmd(reqwest::Method::GET, "/url", None).await;
        v.as_str().unwrap_or_default().to_string()
    }

    /// Runs `script` (async: it ends by calling `done(value)`) in the page; returns the value.
    pub async fn run_async(&self, script: &str) -> Value {
        let body = format!("const done = arguments[arguments.length - 1]; {script}");
        self.cmd(
            reqwest::Method::POST,
            "/execute/async",
            Some(json!({ "script": body, "args": [] })),
        )
        .await
    }

    /// Signs in through the sign-in page the browser is on.
    pub async fn sign_in(&self, (name, password): (&str, &str)) {
        self.type_into(&self.find("#name").await, name).await;
        self.type_into(&self.find("#password").await, password)
            .await;
        self.click(&self.find("#sign-in").await).await;
        let who = self.wait_find("#signed-in").await;
        assert!(self.text(&who).await.starts_with(name));
    }

    pub async fn goto(&self, url: &str) {
        self.cmd(reqwest::Method::POST, "/url", Some(json!({ "url": url })))
            .await;
    }

    /// The element matching `css`, or `None` when there is none right now.
    pub async fn try_find(&self, css: &str) -> Option<String> {
        let resp = self
            .http
            .post(format!("{}/element", self.url))
            .json(&json!({"using": "css selector", "value": css}))
            .send()
            .await
            .expect("webdriver answers");
        let ok = resp.status().is_success();
        let v: Value = resp.json().await.expect("webdriver json");
        if !ok {
            // A find that lands while a submitted form's page loads is aborted by that
            // navigation: the element is not there yet, as with "no such element".
            let error = v["value"]["error"].as_str().unwrap_or("");
            assert!(
                matches!(error, "no such element" | "aborted by navigation"),
                "find {css}: {v}"
            );
            return None;
        }
        Some(
            v["value"][ELEMENT_KEY]
                .as_str()
                .expect("element id")
                .to_string(),
        )
    }

    pub async fn find(&self, css: &str) -> String {
        match self.try_find(css).await {
            Some(e) => e,
            None => panic!("no element matches {css}"),
        }
    }

    pub async fn attr(&self, el: &str, name: &str) -> Option<String> {
        let v = self
            .cmd(
                reqwest::Method::GET,
                &format!("/element/{el}/attribute/{name}"),
                None,
            )
            .await;
        v.as_str().map(str::to_string)
    }

    pub async fn text(&self, el: &str) -> String {
        let v = self
            .cmd(reqwest::Method::GET, &format!("/element/{el}/text"), None)
            .await;
        v.as_str().unwrap_or_default().to_string()
    }

    pub async fn type_into(&self, el: &str, text: &str) {
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{el}/value"),
            Some(json!({ "text": text })),
        )
        .await;
    }

    pub async fn click(&self, el: &str) {
        self.cmd(
            reqwest::Method::POST,
            &format!("/element/{el}/click"),
            Some(json!({})),
        )
        .await;
    }

    /// Polls until an element matches `css` (a navigation may still be under way); panics
    /// after 5 s.
    pub async fn wait_find(&self, css: &str) -> String {
        let what = format!("{css} to show");
        eventually(browser_wait(Duration::from_secs(5)), &what, || {
            self.try_find(css)
        })
        .await
    }

    /// Polls until the row `#incident-{id}` shows `status`; panics after 5 s.
    pub async fn wait_row_status(&self, id: i64, status: &str) {
        let css = format!("#incident-{id}[data-status=\"{status}\"]");
        let what = format!("incident {id} to show status {status} in the browser");
        eventually(browser_wait(Duration::from_secs(5)), &what, || {
            self.try_find(&css)
        })
        .await;
    }

    pub async fn screenshot(&self, to: &Path) -> Vec<u8> {
        let v = self.cmd(reqwest::Method::GET, "/screenshot", None).await;
        let png = base64_decode(v.as_str().expect("screenshot is base64"));
        std::fs::write(to, &png).expect("write screenshot");
        png
    }

    pub async fn close(self) {
        let _ = self.http.delete(&self.url).send().await;
    }
}

pub async fn new_session(driver_port: u16, profile: &Path) -> Session {
    let http = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(15))
        .build()
        .expect("http client");
    let base = format!("http://127.0.0.1:{driver_port}");
    eventually(
        browser_wait(Duration::from_secs(10)),
        "chromedriver to be ready",
        || async {
            match http.get(format!("{base}/status")).send().await {
                Ok(r) => r
                    .json::<Value>()
                    .await
                    .map(|v| v["value"]["ready"] == true)
                    .unwrap_or(false),
                Err(_) => false,
            }
        },
    )
    .await;
    let args = vec![
        "--headless".to_string(),
        "--no-sandbox".into(),
        "--disable-gpu".into(),
        "--disable-quic".into(),
        "--no-first-run".into(),
        "--disable-background-networking".into(),
        "--disable-component-update".into(),
        "--disable-sync".into(),
        "--no-proxy-server".into(),
        "--disable-dev-shm-usage".into(),
        "--window-size=1280,900".into(),
        format!("--user-data-dir={}", profile.display()),
    ];
    let caps = json!({"capabilities": {"alwaysMatch": {
        "browserName": "chrome",
        "goog:chromeOptions": {"binary": CHROMIUM, "args": args}
    }}});
    let resp = http
        .post(format!("{base}/session"))
        .json(&caps)
        .send()
        .await
        .expect("chromedriver answers");
    let v: Value = resp.json().await.expect("session json");
    let id = v["value"]["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("chromium did not start: {v}"));
    Session {
        url: format!("{base}/session/{id}"),
        http,
    }
}

fn base64_decode(s: &str) -> Vec<u8> {
    fn val(c: u8) -> u32 {
        match c {
            b'A'..=b'Z' => u32::from(c - b'A'),
            b'a'..=b'z' => u32::from(c - b'a') + 26,
            b'0'..=b'9' => u32::from(c - b'0') + 52,
            b'+' => 62,
            b'/' => 63,
            other => panic!("not base64: {other}"),
        }
    }
    let clean: Vec<u8> = s
        .bytes()
        .filter(|c| !c.is_ascii_whitespace() && *c != b'=')
        .collect();
    let mut out = Vec::with_capacity(clean.len() * 3 / 4);
    for chunk in clean.chunks(4) {
        let mut acc = 0u32;
        for (i, c) in chunk.iter().enumerate() {
            acc |= val(*c) << (18 - 6 * i);
        }
        let bytes = acc.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    out
}

#[test]
fn base64_decoder_round_trips_known_text() {
    assert_eq!(base64_decode("aGVsbG8gd29ybGQ="), b"hello world");
    assert_eq!(base64_decode("YQ=="), b"a");
    assert_eq!(base64_decode("YWI="), b"ab");
}

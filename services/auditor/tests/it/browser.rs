//! The operators' UI in a real browser: headless Chromium driven over WebDriver (`webdriver`).
//! An unauthenticated visit lands on the sign-in page; the operator signs in, acknowledges and
//! resolves a cross-tenant incident through the HTML forms (recorded under their name); a page
//! served from another origin that posts a form to the auditor is refused; a viewer gets no
//! buttons and a post of theirs is refused. Also checks the node table; pages through the
//! incident list, filters it by a page tag, and watches it refresh itself; checks the probe
//! chart and the charts over time render; and saves a screenshot of each into
//! `$CARGO_TARGET_TMPDIR/auditor-screens/`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use pagewarden_auditor::domain::{IsolationChannel, UnixMs};
use pagewarden_auditor::store::NewIsolationAudit;
use pagewarden_proto::v1 as pb;
use pagewarden_proto::v1::auditor_client::AuditorClient;
use pagewarden_testkit::{eventually, Polling};
use serde_json::json;
use tonic::transport::Channel;

use pagewarden_auditor::probe::Prober;
use pagewarden_auditor::Running;

use crate::auth::{OPERATOR, VIEWER};
use crate::ingest::{get_json, grpc, open_incident_id, report_kinds};
use crate::webdriver::{
    browser_wait, free_port, new_session, spawn_chromedriver, Session, CHROMEDRIVER, CHROMIUM,
    MISSING,
};

/// Where screenshot `name` is saved.
fn screenshot_path(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("auditor-screens");
    std::fs::create_dir_all(&dir).expect("screenshot dir");
    dir.join(name)
}

/// Saves a screenshot of what the browser shows as `name`, checks it is a PNG, says where.
async fn shoot(s: &Session, name: &str) {
    let shot = screenshot_path(name);
    let png = s.screenshot(&shot).await;
    assert!(
        png.len() > 1000 && png.starts_with(b"\x89PNG\r\n\x1a\n"),
        "screenshot is not a PNG ({} bytes)",
        png.len()
    );
    println!("screenshot: {}", shot.display());
}

/// A page of another origin (another port of the same host) that, once opened, posts a
/// resolve form to the auditor, as a malicious site would with the operator's cookie.
async fn serve_forging_page(auditor: &str, id: i64) -> String {
    let html = format!(
        "<!doctype html><html><body><form id=\"f\" method=\"post\" \
         action=\"{auditor}/incidents/{id}/resolve\"><input name=\"by\" value=\"mallory\">\
         <input name=\"note\" value=\"forged\"><input name=\"csrf\" value=\"guess\"></form>\
         <script>document.getElementById('f').submit()</script></body></html>"
    );
    let app = axum::Router::new().route(
        "/",
        axum::routing::get(move || async move { axum::response::Html(html) }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}/")
}

/// The number of rows of the incident table the browser shows.
async fn rows(s: &Session) -> i64 {
    s.run_async("done(document.querySelectorAll('#incidents tr[id^=\"incident-\"]').length);")
        .await
        .as_i64()
        .expect("a count")
}

/// Polls until the browser's URL contains `part`; panics after 5 s.
async fn wait_url(s: &Session, part: &str) -> String {
    let what = format!("a URL with {part}");
    eventually(browser_wait(Duration::from_secs(5)), &what, || async {
        let at = s.current_url().await;
        if at.contains(part) {
            Ok(at)
        } else {
            Err(format!("at {at}"))
        }
    })
    .await
}

/// The operator pages through the list, follows a page tag, watches the list refresh itself,
/// and looks at the probe chart and the charts over time.
async fn pages_filters_refresh_and_charts(s: &Session, r: &Running, base: &str) {
    // Paging: 7 incidents, 3 a page; the routine stale message is counted above them.
    s.goto(&format!("{base}/incidents?limit=3")).await;
    let routine = s.text(&s.find("#routine-stale_message").await).await;
    assert!(routine.starts_with("stale_message 1"), "{routine}");
    let of = s.text(&s.find("#page-of").await).await;
    assert!(of.starts_with("page 1 of 3"), "{of}");
    assert_eq!(rows(s).await, 3);
    s.click(&s.find("#older").await).await;
    wait_url(s, "page_no=2").await;
    let of = s.text(&s.wait_find("#page-of").await).await;
    assert!(of.starts_with("page 2 of 3"), "{of}");
    assert_eq!(rows(s).await, 3);
    shoot(s, "incidents-page-2.png").await;

    // A page tag links the incidents of that page on that node.
    s.goto(&format!("{base}/incidents")).await;
    let tagged = open_incident_id(r, "generation_mismatch").await;
    let link = s.find(&format!("#incident-{tagged} a.page-tag")).await;
    assert_eq!(s.text(&link).await, "7");
    s.click(&link).await;
    let at = wait_url(s, "page=7").await;
    assert!(at.contains("node=decode-1"), "{at}");
    s.wait_find("#incidents").await;
    assert_eq!(rows(s).await, 3, "decode-1 page 7 holds three incidents");
    let pages = s
        .run_async(
            "done(Array.from(document.querySelectorAll('#incidents tr[id^=\"incident-\"] \
             a.page-tag')).filter((a, i) => i % 2 === 0).map(a => a.textContent));",
        )
        .await;
    assert_eq!(pages, json!(["7", "7", "7"]));
    shoot(s, "incidents-page-tag-7.png").await;

    // The list refreshes itself: an incident reported now shows up without a navigation.
    s.goto(&format!("{base}/incidents?refresh=2")).await;
    s.find("#auto-refresh[data-seconds=\"2\"]").await;
    report_kinds(r, "decode-3", &[pb::IntegrityKind::GuardWordCorrupt]).await;
    let fresh = open_incident_id(r, "guard_word_corrupt").await;
    eventually(
        Polling::within(Duration::from_secs(10)).every(Duration::from_millis(200)),
        &format!("the list to refresh and show incident {fresh}"),
        || async { s.try_find(&format!("#incident-{fresh}")).await },
    )
    .await;

    // The probe page: outcome and TTFT against prompt length, one dot per step.
    s.goto(&format!("{base}/probes")).await;
    s.find("svg#probe-chart").await;
    let dots = s
        .run_async("done(document.querySelectorAll('#probe-chart circle.step').length);")
        .await;
    assert_eq!(
        dots, 15,
        "7 steps for each of 2 probe tenants, and the prefix-isolation check"
    );
    shoot(s, "probes.png").await;
    let traffic = s
        .run_async(
            "const c = document.getElementById('traffic-chart'); c.scrollIntoView(); \
             done(c.querySelectorAll('circle.sample').length);",
        )
        .await;
    assert_eq!(traffic, 1, "the one sampled request");
    shoot(s, "probes-traffic.png").await;

    // Incidents and integrity events over time.
    s.goto(&format!("{base}/integrity?window_s=3600&bucket_s=300"))
        .await;
    s.find("svg#incidents-chart").await;
    s.find("svg#integrity-chart").await;
    let bars = s
        .run_async("done(document.querySelectorAll('#incidents-chart rect title').length);")
        .await;
    assert!(bars.as_i64() >= Some(1), "no incident bars: {bars}");
    shoot(s, "over-time.png").await;
}

/// Prefix-cache events of two tenants, and two side-channel verdicts on the last probe run
/// (a leak on the timing channel, a clean order audit), for the tenants page and the charts.
async fn seed_tenants_and_isolation(r: &Running, g: &mut AuditorClient<Channel>) {
    use pb::CacheEventKind::{Held, Hit, Miss};
    for (kind, tenant, namespace, cached, pages) in [
        (Miss, "alice", "a1b2c3d4", 0, 0),
        (Hit, "alice", "a1b2c3d4", 96, 0),
        (Miss, "bob", "0badcafe", 0, 0),
        (Held, "alice", "a1b2c3d4", 0, 6),
    ] {
        g.report_cache(pb::CacheReport {
            kind: kind as i32,
            node: "prefill-0".into(),
            role: "prefill".into(),
            tenant: tenant.into(),
            namespace: namespace.into(),
            req: Some(pb::RequestRef {
                request_id: vec![0xab; 16],
                attempt: 1,
            }),
            prompt_tokens: if kind == Held { 0 } else { 100 },
            cached_tokens: cached,
            pages,
        })
        .await
        .unwrap();
    }
    let store = r.engine.store();
    let run = store.probe_runs(1).await.unwrap()[0].id;
    for (channel, p, leak) in [
        (IsolationChannel::Timing, 1.6e-4, true),
        (IsolationChannel::Order, 0.44, false),
    ] {
        store
            .insert_isolation_audit(&NewIsolationAudit {
                run_id: run,
                worker: "prefill-0".into(),
                channel,
                rounds: 24,
                p,
                control_p: (channel == IsolationChannel::Timing).then_some(1e-5),
                threshold: 1e-3,
                conclusive: true,
                leak,
                at: UnixMs::now(),
            })
            .await
            .unwrap();
    }
}

/// Every `<text>` of chart `svg` that reaches outside its drawing, and the labels of its
/// value axis (`text.ytick`), read from the rendered page.
async fn chart_labels(s: &Session, svg: &str) -> (Vec<String>, Vec<String>) {
    let out = s
        .run_async(&format!(
            "const svg = document.querySelector('{svg}'); svg.scrollIntoView(); \
             const vb = svg.viewBox.baseVal; \
             const w = vb && vb.width ? vb.width : svg.width.baseVal.value; \
             const h = vb && vb.height ? vb.height : svg.height.baseVal.value; \
             const clipped = Array.from(svg.querySelectorAll('text')).filter(t => {{ \
               const b = t.getBBox(); \
               return b.x < -0.5 || b.y < -0.5 || b.x + b.width > w + 0.5 \
                 || b.y + b.height > h + 0.5; }}).map(t => t.textContent); \
             done([clipped, Array.from(svg.querySelectorAll('text.ytick')) \
               .map(t => t.textContent)]);"
        ))
        .await;
    let strings = |v: &serde_json::Value| -> Vec<String> {
        v.as_array()
            .expect("a list")
            .iter()
            .map(|t| t.as_str().expect("text").to_string())
            .collect()
    };
    (strings(&out[0]), strings(&out[1]))
}

/// Whether `labels` read as a round axis: `0` first, then equal steps of 1, 2 or 5 times a
/// power of ten, in one unit (`ms` or `s`) or none.
fn round_axis(labels: &[String]) -> bool {
    let value = |l: &str| -> Option<f64> {
        let (n, scale) = match l.split_once(' ') {
            Some((n, "ms")) => (n, 1.0),
            Some((n, "s")) => (n, 1000.0),
            None => (l, 1.0),
            Some(_) => return None,
        };
        Some(n.parse::<f64>().ok()? * scale)
    };
    let Some(v) = labels
        .iter()
        .map(|l| value(l))
        .collect::<Option<Vec<f64>>>()
    else {
        return false;
    };
    if v.len() < 2 || v[0] != 0.0 {
        return false;
    }
    let step = v[1];
    let mantissa = step / 10f64.powf(step.log10().floor());
    [1.0, 2.0, 5.0].iter().any(|m| (mantissa - m).abs() < 1e-9)
        && v.windows(2).all(|p| (p[1] - p[0] - step).abs() < 1e-9)
}

/// The console's pages as an operator reads them: the overview (workers with their device,
/// build and KV use, links to open incidents and to the last probe run), a probe run's page,
/// an incident's page (what it means, what to do, its related incidents), the tenants page
/// (cache per tenant, side-channel verdicts linked to their run), and the probe page's charts
/// (round value axes, no label outside its chart, the run history a page at a time).
async fn console_pages(s: &Session, base: &str, incident: i64) {
    s.goto(&format!("{base}/")).await;
    wait_url(s, "/overview").await;
    let suite = s.text(&s.find("#suite").await).await;
    assert!(suite.contains("serving"), "{suite}");
    let workers = s
        .run_async(
            "done(Array.from(document.querySelectorAll('#workers tr.worker')).map(r => \
             Array.from(r.cells).map(c => c.textContent)));",
        )
        .await;
    let listed = workers.as_array().expect("worker rows");
    assert_eq!(listed.len(), 3, "{workers}");
    let row = |node: &str| {
        listed
            .iter()
            .find(|r| r[0] == node)
            .unwrap_or_else(|| panic!("no row for {node}: {workers}"))
    };
    let decode = row("decode-0");
    assert_eq!(decode[2], "live", "{workers}");
    assert_eq!(decode[3], "cpu:avx512", "{workers}");
    assert_eq!(decode[4], "0.1.0", "{workers}");
    assert_eq!(decode[6], "25% (16 of 64 pages)", "{workers}");
    assert_eq!(decode[9], "none", "no preflight from decode-0: {workers}");
    let draining = row("decode-1");
    assert!(
        draining[2].as_str().unwrap().contains("decode is draining"),
        "{workers}"
    );
    assert_eq!(draining[9], "ok", "decode-1's preflight: {workers}");
    let ranges = s
        .run_async("done(document.querySelectorAll('#ranges a').length);")
        .await;
    assert_eq!(ranges, 4, "four other ranges to pick");
    let kinds = s
        .run_async(
            "done(Array.from(document.querySelectorAll('#open-incidents a')) \
             .map(a => a.getAttribute('href')));",
        )
        .await;
    assert!(
        kinds
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h == "/incidents?status=open&kind=checksum_mismatch"),
        "{kinds}"
    );
    shoot(s, "overview.png").await;

    // The last probe run's own page: every step it recorded.
    let last = s.find("#last-probe a").await;
    let href = s.attr(&last, "href").await.expect("href");
    assert!(href.starts_with("/probes/runs/"), "{href}");
    s.click(&last).await;
    wait_url(s, &href).await;
    let steps = s
        .run_async("done(document.querySelectorAll('#run-steps tr.step').length);")
        .await;
    assert_eq!(steps, 15, "the run's 15 steps");
    assert_eq!(s.text(&s.find("#steps-recorded").await).await, "15");
    shoot(s, "probe-run.png").await;

    // An incident explains itself and links its node's, tenant's and kind's incidents.
    s.goto(&format!("{base}/incidents/{incident}")).await;
    let meaning = s.text(&s.find("#meaning").await).await;
    assert!(meaning.len() > 40, "{meaning}");
    assert!(!s.text(&s.find("#next-step").await).await.is_empty());
    for (link, want) in [
        ("#node-incidents", "node=decode-1"),
        ("#tenant-incidents", "tenant=bob"),
        ("#kind-incidents", "kind=cross_tenant_marker"),
    ] {
        let href = s.attr(&s.find(link).await, "href").await.expect("href");
        assert!(href.contains(want), "{link}: {href}");
    }
    shoot(s, "incident.png").await;
    s.click(&s.find("#node-incidents").await).await;
    wait_url(s, "node=decode-1").await;
    assert!(rows(s).await >= 3);

    // Tenants: cache per tenant, and the side-channel verdicts linked to their run.
    s.goto(&format!("{base}/tenants")).await;
    let alice = s
        .run_async(
            "done(Array.from(document.querySelectorAll('#tenant-cache tr')) \
             .filter(r => r.cells[0] && r.cells[0].textContent === 'alice') \
             .map(r => [r.cells[4].textContent, r.querySelector('td.held').textContent]));",
        )
        .await;
    assert_eq!(
        alice,
        json!([["50%", "6"]]),
        "alice's hit rate and pages held"
    );
    let verdicts = s
        .run_async(
            "done(Array.from(document.querySelectorAll('#worker-isolation a')) \
             .map(a => a.getAttribute('href')));",
        )
        .await;
    assert_eq!(
        verdicts,
        json!([href.clone(), href.clone()]),
        "both verdicts link their run"
    );
    shoot(s, "tenants.png").await;

    // The probe page's charts: round value axes, nothing drawn outside a chart.
    s.goto(&format!("{base}/probes")).await;
    for chart in [
        "svg#probe-chart",
        "svg#isolation-chart",
        "svg#traffic-chart",
    ] {
        let (clipped, yticks) = chart_labels(s, chart).await;
        assert!(clipped.is_empty(), "{chart}: labels outside: {clipped:?}");
        if chart != "svg#isolation-chart" {
            assert!(round_axis(&yticks), "{chart}: value axis {yticks:?}");
        }
    }
    assert!(!round_axis(&["0".into(), "3 ms".into()]));
    assert!(!round_axis(&["0".into(), "2 ms".into(), "5 ms".into()]));
    assert!(round_axis(&["0".into(), "500 ms".into(), "1 s".into()]));
    let runs = s
        .run_async("done(document.querySelectorAll('#probe-runs tr[id^=\"run-\"]').length);")
        .await;
    assert_eq!(runs, 1);
    let of = s.text(&s.find("#page-of").await).await;
    assert_eq!(of, "page 1 of 1 · 1 run");
    s.find("svg#probe-chart").await;
    shoot(s, "probes-charts.png").await;
}

#[tokio::test]
async fn operator_acknowledges_and_resolves_an_incident_in_chromium() {
    for bin in [CHROMIUM, CHROMEDRIVER] {
        assert!(Path::new(bin).exists(), "{bin} is missing: {MISSING}");
    }
    // The fake router is the auditor's router too: the overview reads its workers.
    let (router, _fake) =
        crate::fake_router::start(&[("key-a", "probe-a"), ("key-b", "probe-b")]).await;
    let mut cfg = crate::auth::config("sqlite::memory:");
    cfg.router_url = Some(format!("http://{router}"));
    cfg.probe_tenants = crate::probe::settings(String::new()).tenants;
    let r = pagewarden_auditor::start(&cfg, None)
        .await
        .expect("auditor starts");
    let mut g = grpc(&r).await;
    let alice = g
        .issue_marker(pb::IssueMarkerRequest {
            tenant: "alice".into(),
        })
        .await
        .unwrap()
        .into_inner();
    g.report_sample(pb::SampleReport {
        tenant: "bob".into(),
        req: Some(pb::RequestRef {
            request_id: vec![0xcd; 16],
            attempt: 1,
        }),
        prompt_tokens: 12,
        completion_tokens: 7,
        response_text: format!("here: {}", alice.marker),
        ttft_ms: Some(40),
        status: pb::SampleStatus::Ok as i32,
        node: "decode-1".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    report_kinds(&r, "decode-1", &[pb::IntegrityKind::ChecksumMismatch]).await;
    g.report_preflight(pb::PreflightReport {
        node: "decode-1".into(),
        role: "decode".into(),
        pool_tokens: 16384,
        context_length: 8192,
        ok: true,
        message: String::new(),
    })
    .await
    .unwrap();
    let id = open_incident_id(&r, "cross_tenant_marker").await;
    let other = open_incident_id(&r, "checksum_mismatch").await;
    // Incidents with page tags, and a probe run for the prompt-length chart.
    for (node, page, generation) in [
        ("decode-1", 7, 1),
        ("decode-1", 7, 2),
        ("decode-1", 8, 1),
        ("decode-2", 7, 1),
        ("decode-1", 7, 3),
    ] {
        g.report_integrity(pb::IntegrityReport {
            kind: pb::IntegrityKind::GenerationMismatch as i32,
            node: node.into(),
            page: Some(page),
            generation: Some(generation),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    // A routine event: counted on the dashboard, no incident.
    g.report_integrity(pb::IntegrityReport {
        kind: pb::IntegrityKind::StaleMessage as i32,
        node: "decode-1".into(),
        req: Some(pb::RequestRef {
            request_id: vec![0xee; 16],
            attempt: 2,
        }),
        details: "[decode] late message of attempt 1".into(),
        ..Default::default()
    })
    .await
    .unwrap();
    Prober::new(
        r.engine.clone(),
        crate::probe::settings(format!("http://{router}")),
    )
    .unwrap()
    .run_once()
    .await
    .unwrap();
    seed_tenants_and_isolation(&r, &mut g).await;
    let base = format!("http://{}", r.http_addr);
    let api = format!("{base}/api/incidents/{id}");

    let profile = tempfile::tempdir().unwrap();
    let port = free_port();
    let _driver = spawn_chromedriver(port);
    let s = new_session(port, profile.path()).await;

    // Not signed in: the incident list sends the browser to the sign-in page.
    s.goto(&format!("{base}/incidents")).await;
    let at = s.current_url().await;
    assert_eq!(
        at,
        format!("{base}/login?next=/incidents"),
        "not redirected"
    );
    assert!(s.try_find(&format!("#incident-{id}")).await.is_none());
    s.sign_in(OPERATOR).await;
    assert_eq!(s.current_url().await, format!("{base}/incidents"));
    let row = s.find(&format!("#incident-{id}")).await;
    assert_eq!(s.attr(&row, "data-status").await.as_deref(), Some("open"));

    let note = s
        .find(&format!(
            "form[action=\"/incidents/{id}/ack\"] input[name=\"note\"]"
        ))
        .await;
    s.type_into(&note, "looking").await;
    s.click(&s.find(&format!("#ack-{id}")).await).await;
    s.wait_row_status(id, "acknowledged").await;
    let acked = get_json(api.clone()).await;
    assert_eq!(acked["acknowledged"]["by"], OPERATOR.0, "{acked}");
    assert_eq!(acked["acknowledged"]["note"], "looking", "{acked}");
    shoot(&s, "incidents-acknowledged.png").await;

    // Another origin's page posts a resolve form with the operator's cookie: refused.
    s.goto(&serve_forging_page(&base, id).await).await;
    eventually(
        browser_wait(Duration::from_secs(5)),
        "the forged form to post",
        || async { s.current_url().await.starts_with(&format!("{base}/")) },
    )
    .await;
    let body = s.text(&s.find("body").await).await;
    assert!(body.contains("cross-origin form post refused"), "{body}");
    assert_eq!(get_json(api.clone()).await["status"], "acknowledged");

    s.goto(&format!("{base}/incidents")).await;
    s.click(&s.find(&format!("#resolve-{id}")).await).await;
    s.wait_row_status(id, "resolved").await;
    let done = get_json(api.clone()).await;
    assert_eq!(done["status"], "resolved", "{done}");
    assert_eq!(done["resolved"]["by"], OPERATOR.0, "{done}");

    s.goto(&format!("{base}/nodes")).await;
    let table = s.find("table#nodes").await;
    let text = s.text(&table).await;
    assert!(text.contains("decode-1"), "node table: {text}");

    pages_filters_refresh_and_charts(&s, &r, &base).await;
    console_pages(&s, &base, id).await;

    // A viewer: no buttons, and a post of theirs (with their own CSRF token) is a 403.
    s.click(&s.find("#sign-out").await).await;
    s.wait_find("#sign-in").await;
    s.goto(&format!("{base}/incidents")).await;
    s.sign_in(VIEWER).await;
    s.find(&format!("#incident-{other}")).await;
    assert!(s.try_find(&format!("#ack-{other}")).await.is_none());
    let status = s
        .run_async(&format!(
            "const csrf = document.querySelector('input[name=csrf]').value; \
             fetch('/incidents/{other}/ack', {{method: 'POST', \
             body: new URLSearchParams({{csrf, note: 'viewer'}})}}).then(r => done(r.status));"
        ))
        .await;
    assert_eq!(status, 403);
    assert_eq!(
        get_json(format!("{base}/api/incidents/{other}")).await["status"],
        "open"
    );

    s.close().await;
    r.shutdown().await;
}

//! The incident replayed on the real services. The router, prefill and decode are the
//! binaries built with the TEST-ONLY defense switches (`scripts/build-switched.sh`; feature
//! `unsafe-test-switches`, read from `PAGEWARDEN_UNSAFE_TEST_SWITCHES`), over the real model
//! and the real TCP transfer, with the auditor recording. As in the incident, the prefill pool
//! (128 tokens) is smaller than the advertised context (512): the pool preflight is switched
//! off in every case.
//!
//! Tenant A (tenant-0) first sends two prompts dense with a canary marker the auditor issued
//! to it (at once, so that between them they fill decode's pool); their KV stays in decode's
//! freed pages (no zeroing). Tenant B (tenant-1) then sends a 200-token prompt: longer than the
//! prefill pool, within the advertised context. With every defense off, the router admits it,
//! prefill computes and sends only the 128 tokens its pool holds and commits that many, decode
//! commits the 13 pages it reserved over 8 written ones and attends over 5 that still hold A's
//! KV: B gets HTTP 200, and its greedy text is not the text it gets when those pages hold no
//! one's KV (the same case on fresh workers without A's traffic): A's KV conditioned B's
//! response (the positive control). Each defense alone keeps B from being served: router
//! rejection (400), worker admission (prefill's 400), commit token count and checksums (decode
//! refuses the commit), read generation (the unwritten pages present an older generation: the
//! first read fails). Grant fencing has nothing to stop in this chain (no write lands late; the
//! late-write class is `reliability_late_writes.rs`): B is served over A's KV.
//!
//! A's marker does not come out verbatim in B's text with this model (the stale KV sits at
//! positions shifted by the prefill pool's length): when it does, the auditor, scanning the
//! router's samples, must have recorded the cross-tenant marker; no other case may show it.
//!
//! The recompute audit sees what the marker misses: the router sends every served request
//! (`--recompute-rate 1`) to the auditor, which scores its tokens again on a clean pass of its
//! own (`--recompute-model`). Every B that is served over pages its prompt did not fill (every
//! defense off; grant fencing alone) must be a `recompute_mismatch`; every other served request
//! (A's) must match, so a case that stops B records none.
//!
//! Also: the normal binaries in `target/<profile>/` carry no switches at all.

use std::collections::BTreeMap;
use std::time::Duration;

use pagewarden_common::test_switches::{Switch, TestSwitches, ENV};
use pagewarden_proto::v1 as pb;
use pagewarden_proto::v1::auditor_client::AuditorClient;
use pagewarden_system_tests::{
    api_key, bin, get_json, model_path, start_auditor_with, start_switched_router, switched_bin,
    worker_args, ModelArg, Service,
};
use pagewarden_testkit::poll_until;
use serde_json::{json, Value};

const REAL: ModelArg = ModelArg::Real;
/// The advertised context of both workers.
const CONTEXT: &str = "512";
/// Prefill's pool: 8 pages of 16, smaller than the context.
const PREFILL_POOL: &str = "128";
/// Decode's pool: 16 pages, all of them A's after A's two requests.
const DECODE_POOL: &str = "256";
/// B's prompt in tokens: longer than the prefill pool, within the context (13 pages).
const B_PROMPT_TOKENS: usize = 200;
/// Tenant A and tenant B.
const A: usize = 0;
const B: usize = 1;

/// One case: the defenses switched off (the pool preflight always is).
#[derive(Clone, Copy, Debug)]
struct Case {
    name: &'static str,
    switches: TestSwitches,
    /// The incident kind the auditor must record when this case stops B.
    incident: Option<&'static str>,
}

impl Case {
    fn all_off() -> Self {
        let mut s = TestSwitches::default().with_off(Switch::PoolPreflight);
        for d in Switch::defenses() {
            s = s.with_off(d);
        }
        Case {
            name: "all off",
            switches: s,
            incident: None,
        }
    }

    fn all_on() -> Self {
        Case {
            name: "all on",
            switches: TestSwitches::default().with_off(Switch::PoolPreflight),
            incident: None,
        }
    }

    fn only(d: Switch) -> Self {
        let mut s = TestSwitches::default().with_off(Switch::PoolPreflight);
        for other in Switch::defenses().filter(|o| *o != d) {
            s = s.with_off(other);
        }
        let incident = match d {
            Switch::CommitTokenCount => Some("count_mismatch"),
            Switch::Checksums => Some("manifest_mismatch"),
            Switch::ReadGeneration => Some("generation_mismatch"),
            Switch::PoolPreflight
            | Switch::NamespaceIsolation
            | Switch::RouterRejection
            | Switch::WorkerAdmission
            | Switch::GrantFencing => None,
        };
        Case {
            name: d.name(),
            switches: s,
            incident,
        }
    }
}

/// What B got, and what the auditor recorded meanwhile.
#[derive(Debug)]
struct Outcome {
    status: u16,
    body: Value,
    /// B's completion text ("" when B was refused).
    text: String,
    /// A's marker in B's text.
    leaked: bool,
    /// Incidents opened during the case, by kind.
    incidents: BTreeMap<String, usize>,
    /// The recompute audit's verdict on B's request, when B was served.
    recompute: Option<String>,
}

/// The request id of a completion (its `id` is `cmpl-<request id>`).
fn request_id(body: &Value) -> String {
    let id = body["id"].as_str().expect("a completion id");
    id.strip_prefix("cmpl-").expect("cmpl- id").to_string()
}

/// The recompute audit's verdict on each of `ids`, once it has one for all of them.
async fn recompute_verdicts(auditor: &Service, ids: &[String]) -> Vec<String> {
    poll_until(Duration::from_secs(60), || async {
        let rows = get_json(auditor, "/api/recomputes?limit=500").await;
        let rows = rows.as_array().expect("recompute list").clone();
        ids.iter()
            .map(|id| {
                rows.iter()
                    .find(|r| r["request_id"].as_str() == Some(id.as_str()))
                    .map(|r| {
                        // The verdict, and how far the served logprobs were from the clean ones.
                        let verdict = r["verdict"].as_str().expect("verdict");
                        format!("{verdict} ({} µnat)", r["max_diff_micro"])
                    })
            })
            .collect::<Option<Vec<_>>>()
    })
    .await
    .unwrap_or_else(|| panic!("the auditor recomputed not all of {ids:?} within 60 s"))
}

/// Every incident, any status, by kind.
async fn incidents(auditor: &Service) -> BTreeMap<String, usize> {
    let list = get_json(auditor, "/api/incidents?limit=1000").await;
    let mut m = BTreeMap::new();
    for i in list.as_array().expect("incident list") {
        *m.entry(i["kind"].as_str().expect("kind").to_string())
            .or_default() += 1;
    }
    m
}

fn delta(
    before: &BTreeMap<String, usize>,
    after: &BTreeMap<String, usize>,
) -> BTreeMap<String, usize> {
    after
        .iter()
        .filter_map(|(k, n)| {
            let d = n - before.get(k).copied().unwrap_or(0);
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// A's prompt: the marker over and over, so its KV spells it everywhere.
fn a_prompt(marker: &str) -> String {
    let mut p = String::from("Codes:");
    for _ in 0..4 {
        p.push(' ');
        p.push_str(marker);
    }
    p
}

async fn complete(router: &Service, tenant: usize, prompt: &str, max_tokens: u32) -> (u16, Value) {
    let r = reqwest::Client::new()
        .post(format!("{}/v1/completions", router.http_url()))
        .bearer_auth(api_key(tenant))
        .json(&json!({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0}))
        .send()
        .await
        .expect("POST /v1/completions");
    let status = r.status().as_u16();
    (status, r.json().await.unwrap_or(Value::Null))
}

async fn token_count(router: &Service, prompt: &str) -> usize {
    let r: Value = reqwest::Client::new()
        .post(format!("{}/tokenize", router.http_url()))
        .bearer_auth(api_key(B))
        .json(&json!({"prompt": prompt}))
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .expect("POST /tokenize")
        .json()
        .await
        .expect("tokenize json");
    r["count"].as_u64().expect("count") as usize
}

/// B's prompt: exactly [`B_PROMPT_TOKENS`] tokens (counted by the router's tokenizer).
async fn b_prompt(router: &Service) -> String {
    let mut words = Vec::new();
    let mut prompt = String::new();
    for i in 0.. {
        words.push(["alpha", "bravo", "delta", "echo", "kilo"][i % 5]);
        let p = format!("Notes: {} Codes:", words.join(" "));
        if token_count(router, &p).await > B_PROMPT_TOKENS {
            break;
        }
        prompt = p;
    }
    assert!(token_count(router, &prompt).await > 128);
    prompt
}

/// Runs one case on fresh workers and router (the switches are per process); `a_traffic`:
/// whether A sends its requests before B.
async fn replay(
    case: Case,
    auditor: &Service,
    b_text: &mut Option<String>,
    a_traffic: bool,
) -> Outcome {
    let env_value = case.switches.env_value();
    let env = [(ENV, env_value.as_str())];
    let grpc = auditor.grpc_url();
    let worker = |pool: &str| {
        let extra = [
            "--pool-tokens",
            pool,
            "--context-length",
            CONTEXT,
            "--prefix-cache-tokens",
            "0",
            "--auditor",
            grpc.as_str(),
        ];
        worker_args(&REAL, &extra)
    };
    let decode = Service::start_switched("pagewarden-decode", &worker(DECODE_POOL), &env);
    let prefill = Service::start_switched("pagewarden-prefill", &worker(PREFILL_POOL), &env);
    let router = start_switched_router(
        &REAL,
        &[&decode],
        &[&prefill],
        &["--auditor", &grpc, "--recompute-rate", "1"],
        &env,
    )
    .await;
    let mut audit = AuditorClient::connect(grpc.clone())
        .await
        .expect("auditor gRPC");
    let marker = audit
        .issue_marker(pb::IssueMarkerRequest {
            tenant: format!("tenant-{A}"),
        })
        .await
        .expect("issue marker")
        .into_inner()
        .marker;
    let before = incidents(auditor).await;

    // A: two requests at once, so that between them they fill every decode page.
    let a = a_prompt(&marker);
    if !a_traffic {
        return b_request(case, auditor, &router, b_text, &marker, before, Vec::new()).await;
    }
    let (a1, a2) = tokio::join!(complete(&router, A, &a, 16), complete(&router, A, &a, 16));
    for (status, body) in [&a1, &a2] {
        assert_eq!(*status, 200, "{}: A's request: {body}", case.name);
    }
    let served = vec![request_id(&a1.1), request_id(&a2.1)];
    b_request(case, auditor, &router, b_text, &marker, before, served).await
}

/// B's request, and what the auditor opened meanwhile.
async fn b_request(
    case: Case,
    auditor: &Service,
    router: &Service,
    b_text: &mut Option<String>,
    marker: &str,
    before: BTreeMap<String, usize>,
    a_served: Vec<String>,
) -> Outcome {
    if b_text.is_none() {
        *b_text = Some(b_prompt(router).await);
    }
    let (status, body) = complete(router, B, b_text.as_deref().unwrap_or_default(), 24).await;
    let text = body["choices"][0]["text"]
        .as_str()
        .unwrap_or("")
        .to_string();
    let leaked = text.contains(marker);
    // Every served request's recompute is done before the case's incidents are read: A's
    // (which must match), and B's when it was served.
    let b_id = (status == 200).then(|| request_id(&body));
    let ids: Vec<String> = a_served.iter().cloned().chain(b_id.clone()).collect();
    let verdicts = recompute_verdicts(auditor, &ids).await;
    for (id, v) in a_served.iter().zip(&verdicts) {
        assert!(
            v.starts_with("match "),
            "{}: A's request {id} did not recompute equal: {v}",
            case.name
        );
    }
    let recompute = b_id.map(|_| verdicts[verdicts.len() - 1].clone());

    // The incident this case must show (the cross-tenant marker, from the router's sample of
    // B, or the defense's own) reaches the auditor shortly after B's answer.
    let expected = if leaked {
        Some("cross_tenant_marker")
    } else if recompute
        .as_deref()
        .is_some_and(|v| v.starts_with("mismatch "))
    {
        Some("recompute_mismatch")
    } else {
        case.incident
    };
    let recorded = match expected {
        None => None,
        Some(kind) => {
            poll_until(Duration::from_secs(10), || async {
                let d = delta(&before, &incidents(auditor).await);
                d.contains_key(kind).then_some(d)
            })
            .await
        }
    };
    let incidents = match recorded {
        Some(d) => d,
        None => delta(&before, &incidents(auditor).await),
    };
    let o = Outcome {
        status,
        body,
        text,
        leaked,
        incidents,
        recompute,
    };
    eprintln!(
        "case {:<18} B: HTTP {} leaked={} recompute={:?} text={:?} incidents={:?}",
        case.name, o.status, o.leaked, o.recompute, o.text, o.incidents
    );
    o
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_incident_on_the_real_services_leaks_only_with_every_defense_off() {
    let dir = tempfile::tempdir().expect("tempdir");
    let recompute_model = model_path().display().to_string();
    let auditor = start_auditor_with(dir.path(), &["--recompute-model".into(), recompute_model]);
    let mut b_text = None;

    // The positive control first: without it, the other cases prove nothing.
    let off = replay(Case::all_off(), &auditor, &mut b_text, true).await;
    assert_eq!(off.status, 200, "all off: B was not served: {}", off.body);
    assert_recompute_mismatch("all off", &off);
    let clean = replay(Case::all_off(), &auditor, &mut b_text, false).await;
    assert_eq!(clean.status, 200, "all off, no A: {}", clean.body);
    // Served over pages no one wrote, B's answer was not computed over its prompt either.
    assert_recompute_mismatch("all off, no A", &clean);
    assert_ne!(
        off.text, clean.text,
        "all off: B's text is the same over A's KV as over pages no one wrote (the replay is \
         broken)"
    );
    if off.leaked {
        assert_eq!(
            off.incidents.get("cross_tenant_marker"),
            Some(&1),
            "all off: A's marker reached B but the auditor did not record it: {:?}",
            off.incidents
        );
    }

    let on = replay(Case::all_on(), &auditor, &mut b_text, true).await;
    assert_no_leak("all on", &on);
    assert_rejected_400("all on", &on);

    for d in Switch::defenses() {
        let o = replay(Case::only(d), &auditor, &mut b_text, true).await;
        match d {
            Switch::RouterRejection => {
                assert_no_leak(d.name(), &o);
                assert_rejected_400(d.name(), &o);
            }
            Switch::WorkerAdmission => {
                assert_no_leak(d.name(), &o);
                assert_ne!(o.status, 200, "{}: B was served: {:?}", d.name(), o.text);
                assert!(
                    o.body.to_string().contains("context_length_exceeded")
                        && o.body.to_string().contains("the prefill worker"),
                    "{}: {}",
                    d.name(),
                    o.body
                );
            }
            Switch::CommitTokenCount => {
                assert_no_leak(d.name(), &o);
                assert_ne!(o.status, 200, "{}: B was served: {:?}", d.name(), o.text);
                assert!(o.incidents.contains_key("count_mismatch"), "{o:?}");
            }
            Switch::Checksums => {
                assert_no_leak(d.name(), &o);
                assert_ne!(o.status, 200, "{}: B was served: {:?}", d.name(), o.text);
                assert!(o.incidents.contains_key("manifest_mismatch"), "{o:?}");
            }
            Switch::ReadGeneration => {
                assert_no_leak(d.name(), &o);
                assert_ne!(o.status, 200, "{}: B was served: {:?}", d.name(), o.text);
                assert!(o.incidents.contains_key("generation_mismatch"), "{o:?}");
            }
            Switch::GrantFencing => {
                // Nothing in this chain writes late: fencing alone cannot stop it, and B is
                // served over A's KV, which the recompute audit sees.
                assert_eq!(o.status, 200, "{}: {}", d.name(), o.body);
                assert_recompute_mismatch(d.name(), &o);
            }
            Switch::PoolPreflight | Switch::NamespaceIsolation => {
                unreachable!("not a defense of the incident")
            }
        }
    }
}

/// B was served over pages its prompt did not fill: the recompute audit found it.
fn assert_recompute_mismatch(what: &str, o: &Outcome) {
    assert!(
        o.recompute
            .as_deref()
            .is_some_and(|v| v.starts_with("mismatch ")),
        "{what}: B's answer recomputed equal over a clean pass: {o:?}"
    );
    assert_eq!(
        o.incidents.get("recompute_mismatch"),
        Some(&1),
        "{what}: no recompute_mismatch incident for B: {:?}",
        o.incidents
    );
}

/// Nothing of A reached B: no marker, and no served request of the case (A's) was computed
/// over anything but its own prompt.
fn assert_no_leak(what: &str, o: &Outcome) {
    assert!(
        !o.incidents.contains_key("recompute_mismatch"),
        "{what}: {:?}",
        o.incidents
    );
    assert!(!o.leaked, "{what}: A's marker reached B: {:?}", o.text);
    assert!(
        !o.incidents.contains_key("cross_tenant_marker"),
        "{what}: the auditor saw a cross-tenant marker: {:?}",
        o.incidents
    );
}

fn assert_rejected_400(what: &str, o: &Outcome) {
    assert_eq!(o.status, 400, "{what}: {}", o.body);
    assert_eq!(
        o.body["error"]["code"], "context_length_exceeded",
        "{what}: {}",
        o.body
    );
}

/// The normal binaries carry no switches: the variable's name, which the switched build reads,
/// is nowhere in them (and is in the switched ones, so the check can fail).
#[test]
fn the_normal_binaries_have_no_defense_switches() {
    for name in [
        "pagewarden-router",
        "pagewarden-prefill",
        "pagewarden-decode",
    ] {
        let has = |path: std::path::PathBuf| {
            let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            bytes.windows(ENV.len()).any(|w| w == ENV.as_bytes())
        };
        assert!(
            !has(bin(name)),
            "{name}: the normal binary carries the test-only defense switches"
        );
        assert!(
            has(switched_bin(name)),
            "{name}: the switched binary does not read {ENV} (this check would prove nothing)"
        );
    }
}

//! I11 with the real binaries: under the suite CA a whole request is served with mutual TLS on
//! every internal link (router → decode/prefill, workers and router → auditor), while a
//! plaintext client, a client whose certificate another CA signed, and a prefill certificate
//! calling decode's `Reserve` are all refused; canary markers are listed only for a router; a
//! frame forged in clear on decode's transfer port is refused and recorded by the auditor; and a
//! worker refuses to serve in clear on a non-loopback address.

use std::time::Duration;

use pagewarden_common::tls::{write_dev_suite, DevSuite, SuiteRole};
use pagewarden_proto::v1 as pb;
use pagewarden_proto::v1::auditor_client::AuditorClient;
use pagewarden_proto::v1::decode_client::DecodeClient;
use pagewarden_system_tests::{
    api_key, get_json, start_auditor_with, start_decode, start_prefill, start_router_with,
    worker_args, ModelArg, Service,
};
use pagewarden_testkit::poll_until;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

const TINY: ModelArg = ModelArg::Tiny(5);

fn args(suite: &DevSuite, role: SuiteRole) -> Vec<String> {
    suite.args(role)
}

fn strs(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

fn start_auditor_tls(dir: &std::path::Path, suite: &DevSuite) -> Service {
    start_auditor_with(dir, &args(suite, SuiteRole::Auditor))
}

/// A channel to `addr` that trusts `trust`'s CA, expects a server of role `server`, and
/// presents `who`'s certificate of `role`.
async fn tls_channel(
    addr: &str,
    trust: &DevSuite,
    server: SuiteRole,
    who: &DevSuite,
    role: SuiteRole,
) -> Result<Channel, tonic::transport::Error> {
    let read = |p: std::path::PathBuf| std::fs::read(p).expect("read PEM");
    let tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(read(trust.ca())))
        .identity(Identity::from_pem(
            read(who.cert(role)),
            read(who.key(role)),
        ))
        .domain_name(server.dns_name());
    Endpoint::from_shared(format!("https://{addr}"))
        .expect("uri")
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await
}

/// How many times `needle` appears in the auditor's open incidents, waiting up to 10 s for
/// `want`; and the incidents.
async fn open_incidents_naming(
    auditor: &Service,
    needle: &str,
    want: usize,
) -> (usize, serde_json::Value) {
    let naming = || async {
        let v = get_json(auditor, "/api/incidents?status=open").await;
        (v.to_string().matches(needle).count(), v)
    };
    let enough = poll_until(Duration::from_secs(10), || async {
        Some(naming().await).filter(|(found, _)| *found >= want)
    })
    .await;
    match enough {
        Some(answer) => answer,
        None => naming().await,
    }
}

fn reserve() -> pb::ReserveRequest {
    pb::ReserveRequest {
        req: Some(pb::RequestRef {
            request_id: vec![7; 16],
            attempt: 1,
        }),
        tenant: "tenant-0".into(),
        prompt_tokens: 4,
        sampling: Some(pb::SamplingParams {
            top_p: 1.0,
            max_tokens: 2,
            ..Default::default()
        }),
        prompt_token_ids: vec![30, 31, 32, 33],
        tenant_weight: 1,
        namespace: Vec::new(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn internal_links_need_the_suite_ca_and_the_right_role() {
    let dir = tempfile::tempdir().expect("tempdir");
    let suite = write_dev_suite(&dir.path().join("tls")).expect("dev suite");
    let other = write_dev_suite(&dir.path().join("other-ca")).expect("second CA");
    let auditor = start_auditor_tls(&dir.path().join("auditor"), &suite);
    let grpc = auditor.grpc_url();

    let mut extra = vec!["--auditor".to_string(), grpc.clone()];
    extra.extend(args(&suite, SuiteRole::Decode));
    let decode = start_decode(&TINY, &strs(&extra));
    assert_eq!(decode.addrs.get("tls").map(String::as_str), Some("mutual"));
    let mut extra = vec!["--auditor".to_string(), grpc.clone()];
    extra.extend(args(&suite, SuiteRole::Prefill));
    let prefill = start_prefill(&TINY, &strs(&extra));
    let mut extra = vec!["--auditor".to_string(), grpc.clone()];
    extra.extend(args(&suite, SuiteRole::Router));
    let router = start_router_with(&TINY, &[&decode], &[&prefill], &strs(&extra)).await;

    // The whole path works under mutual TLS, and the sample reaches the auditor over it.
    let r = reqwest::Client::new()
        .post(format!("{}/v1/completions", router.http_url()))
        .bearer_auth(api_key(0))
        .json(&json!({"prompt": "hello there", "max_tokens": 4}))
        .send()
        .await
        .expect("router request");
    assert_eq!(r.status().as_u16(), 200, "{:?}", r.text().await);
    let sampled = |s: &serde_json::Value| s["samples"]["samples"].as_i64() >= Some(1);
    let summary = poll_until(Duration::from_secs(10), || async {
        Some(get_json(&auditor, "/api/summary").await).filter(sampled)
    })
    .await;
    let summary = match summary {
        Some(s) => s,
        None => get_json(&auditor, "/api/summary").await,
    };
    assert_eq!(summary["samples"]["samples"], 1, "summary: {summary}");

    let d = &decode.addrs["grpc"];
    // 1. A plaintext client gets no answer from decode.
    let plain = async {
        let mut c = DecodeClient::connect(format!("http://{d}")).await?;
        c.reserve(reserve()).await.map_err(Into::into)
    };
    let plain: Result<_, Box<dyn std::error::Error>> = plain.await;
    assert!(
        plain.is_err(),
        "a plaintext client reached decode: {plain:?}"
    );

    // 2. A router certificate from another CA is refused (the handshake or the first call).
    let foreign = async {
        let ch = tls_channel(d, &suite, SuiteRole::Decode, &other, SuiteRole::Router).await?;
        DecodeClient::new(ch)
            .reserve(reserve())
            .await
            .map_err(Into::into)
    };
    let foreign: Result<_, Box<dyn std::error::Error>> = foreign.await;
    assert!(
        foreign.is_err(),
        "another CA's certificate reached decode: {foreign:?}"
    );

    // 3. A prefill certificate of the suite may not call Reserve.
    let ch = tls_channel(d, &suite, SuiteRole::Decode, &suite, SuiteRole::Prefill)
        .await
        .expect("prefill certificate completes the handshake");
    let denied = DecodeClient::new(ch).reserve(reserve()).await.unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");

    // ... while a router certificate may.
    let ch = tls_channel(d, &suite, SuiteRole::Decode, &suite, SuiteRole::Router)
        .await
        .expect("router certificate");
    let ok = DecodeClient::new(ch).reserve(reserve()).await;
    assert!(ok.is_ok(), "the router's Reserve was refused: {ok:?}");

    // 4. Canary markers are listed for a router, never for a worker.
    let a = &auditor.addrs["grpc"];
    let ch = tls_channel(a, &suite, SuiteRole::Auditor, &suite, SuiteRole::Decode)
        .await
        .expect("decode certificate");
    let denied = AuditorClient::new(ch)
        .list_markers(pb::ListMarkersRequest::default())
        .await
        .unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied, "{denied:?}");
    let ch = tls_channel(a, &suite, SuiteRole::Auditor, &suite, SuiteRole::Router)
        .await
        .expect("router certificate");
    AuditorClient::new(ch)
        .list_markers(pb::ListMarkersRequest::default())
        .await
        .expect("a router lists markers");

    // 5. A frame forged in clear on decode's transfer port, and the same frame replayed inside
    // a TLS record (as bytes recorded from a real prefill's stream would arrive), are refused,
    // and each refusal reaches the auditor (from a source address of its own: refusals are
    // summarized per source, one incident per address and window).
    let t = &decode.addrs["transfer"];
    let forged = b"PWKV\x01\x01\x00\x00forged frame for a guessed grant".to_vec();
    let replayed = [&[0x16u8, 3, 3, 0, 5][..], &forged[..]].concat();
    for (from, bytes) in [(1, forged), (2, replayed)] {
        let mut s = connect_from(t, from).await;
        let _ = s.write_all(&bytes).await;
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
    }
    let (found, incidents) = open_incidents_naming(&auditor, "KV transfer connection", 2).await;
    assert_eq!(
        found, 2,
        "the refused transfer connections are not both on record: {incidents}"
    );
}

/// A connection to `addr` from the loopback address 127.0.0.`host`: the transfer listener
/// summarizes refusals per source address, so each refusal meant to reach the auditor on its
/// own comes from an address of its own.
async fn connect_from(addr: &str, host: u8) -> tokio::net::TcpStream {
    let socket = tokio::net::TcpSocket::new_v4().expect("socket");
    socket
        .bind(std::net::SocketAddr::from(([127, 0, 0, host], 0)))
        .expect("binding a loopback source address");
    socket
        .connect(addr.parse().expect("a transfer address"))
        .await
        .expect("transfer port")
}

#[test]
fn a_worker_refuses_plaintext_off_loopback_and_says_why() {
    let mut a = worker_args(&TINY, &[]);
    let i = a
        .iter()
        .position(|s| s == "--grpc-addr")
        .expect("grpc flag");
    a[i + 1] = "0.0.0.0:0".into();
    let err = match Service::try_start("pagewarden-decode", &a) {
        Ok(_) => panic!("decode served plaintext gRPC on 0.0.0.0"),
        Err(e) => e,
    };
    assert!(err.contains("--insecure-internal"), "{err}");
    a.push("--insecure-internal".into());
    Service::try_start("pagewarden-decode", &a).expect("--insecure-internal serves in clear");
}

/// Decode's `--transfer-seal aead` under mutual TLS: the transfer stream runs without TLS and
/// every frame carries its grant's seal; a whole request is served (the grant's secret went
/// router → prefill inside the grant), while a frame sent with a guessed tag, and one sent
/// unsealed, each close their connection and reach the auditor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sealed_transfer_serves_and_refuses_forged_frames() {
    let dir = tempfile::tempdir().expect("tempdir");
    let suite = write_dev_suite(&dir.path().join("tls")).expect("dev suite");
    let auditor = start_auditor_tls(&dir.path().join("auditor"), &suite);
    let grpc = auditor.grpc_url();
    let with = |role, more: &[&str]| {
        let mut v = vec!["--auditor".to_string(), grpc.clone()];
        v.extend(args(&suite, role));
        v.extend(more.iter().map(|s| s.to_string()));
        v
    };
    let decode = start_decode(
        &TINY,
        &strs(&with(SuiteRole::Decode, &["--transfer-seal", "aead"])),
    );
    let prefill = start_prefill(&TINY, &strs(&with(SuiteRole::Prefill, &[])));
    let router = start_router_with(
        &TINY,
        &[&decode],
        &[&prefill],
        &strs(&with(SuiteRole::Router, &[])),
    )
    .await;
    let r = reqwest::Client::new()
        .post(format!("{}/v1/completions", router.http_url()))
        .bearer_auth(api_key(0))
        .json(&json!({"prompt": "hello there, sealed frames", "max_tokens": 4}))
        .send()
        .await
        .expect("router request");
    assert_eq!(r.status().as_u16(), 200, "{:?}", r.text().await);

    // A WRITE-shaped frame flagged as sealed with a guessed tag, and the same unsealed.
    let t = &decode.addrs["transfer"];
    let mut body = vec![0u8; 48 + 16];
    body[44..48].copy_from_slice(&0u32.to_le_bytes());
    let frame = |flags: u16, payload: &[u8]| {
        let mut f = b"PWKV\x01\x01".to_vec();
        f.extend_from_slice(&flags.to_le_bytes());
        f.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        f.extend_from_slice(payload);
        f
    };
    for (from, bytes) in [(1, frame(2, &body)), (2, frame(0, &body[..48]))] {
        let mut s = connect_from(t, from).await;
        let _ = s.write_all(&bytes).await;
        let mut rest = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
    }
    let (found, incidents) = open_incidents_naming(&auditor, "frame refused", 2).await;
    assert_eq!(
        found, 2,
        "the refused frames are not both on record: {incidents}"
    );
}

//! Routine integrity events (a drained deferred release, a stale message naming its request)
//! are counted per kind on the dashboard, in `/api/summary` and in `/metrics`, and open no
//! incident; real evidence, and a stale message no request accounts for, still opens one.

use pagewarden_proto::v1 as pb;
use serde_json::Value;

use crate::ingest::{get_json, get_page, get_text, grpc, start};

#[tokio::test]
async fn routine_events_are_counted_and_open_no_incident() {
    let r = start().await;
    let mut g = grpc(&r).await;
    use pb::IntegrityKind::{ChecksumMismatch, DeferredReleaseDrained, StaleMessage};
    let mut acks = Vec::new();
    for (kind, names_request) in [
        (StaleMessage, true),
        (StaleMessage, true),
        (DeferredReleaseDrained, false),
        (StaleMessage, false),
        (ChecksumMismatch, true),
    ] {
        let ack = g
            .report_integrity(pb::IntegrityReport {
                kind: kind as i32,
                node: "decode-0".into(),
                req: names_request.then(|| pb::RequestRef {
                    request_id: vec![7; 16],
                    attempt: 1,
                }),
                details: "[decode] late message".into(),
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        acks.push(ack.incidents_opened);
    }
    assert_eq!(acks, vec![0, 0, 0, 1, 1], "only the last two are incidents");

    let base = format!("http://{}", r.http_addr);
    let list = get_json(format!("{base}/api/incidents")).await;
    let mut kinds: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["kind"].as_str().unwrap())
        .collect();
    kinds.sort();
    assert_eq!(kinds, vec!["checksum_mismatch", "stale_message"]);
    let stray = list
        .as_array()
        .unwrap()
        .iter()
        .find(|i| i["kind"] == "stale_message")
        .unwrap();
    assert_eq!(stray["request_id"], Value::Null, "{stray}");

    let summary = get_json(format!("{base}/api/summary")).await;
    let routine: Vec<(String, i64)> = summary["routine"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["kind"].as_str().unwrap().to_string(),
                c["count"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        routine,
        vec![
            ("deferred_release_drained".to_string(), 1),
            ("stale_message".to_string(), 2)
        ]
    );

    let metrics = get_text(format!("{base}/metrics")).await;
    for line in [
        "pagewarden_auditor_routine_events_total{kind=\"stale_message\"} 2",
        "pagewarden_auditor_routine_events_total{kind=\"deferred_release_drained\"} 1",
        "pagewarden_auditor_integrity_events_total{kind=\"stale_message\"} 3",
        "pagewarden_auditor_incidents_opened_total{kind=\"stale_message\"} 1",
    ] {
        assert!(metrics.contains(line), "missing {line}:\n{metrics}");
    }

    let html = get_page(format!("{base}/incidents")).await;
    let at = html
        .find("id=\"routine-stale_message\"")
        .expect("routine counter");
    assert!(html[at..].starts_with("id=\"routine-stale_message\">stale_message <strong>2</strong>"));
    assert!(html.contains("id=\"routine-deferred_release_drained\""));
    r.shutdown().await;
}

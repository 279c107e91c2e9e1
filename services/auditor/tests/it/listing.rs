//! The incident list at scale: page tags as columns that filter and link the incidents of one
//! page, paging in the JSON API and the HTML page, and a clear 400 for every malformed value.

use std::collections::BTreeSet;

use pagewarden_proto::v1 as pb;
use reqwest::StatusCode;
use serde_json::Value;

use crate::auth::{Signed, OPERATOR, OPS_TOKEN};
use crate::ingest::{get_json, grpc, start};

/// Reports a generation mismatch on `page` of `node` at `generation`.
async fn mismatch(
    g: &mut pb::auditor_client::AuditorClient<tonic::transport::Channel>,
    node: &str,
    page: u32,
    generation: u64,
) {
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

async fn api(url: String) -> (Vec<Value>, i64) {
    let resp = reqwest::Client::new()
        .get(&url)
        .bearer_auth(OPS_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "GET {url}");
    let total = resp.headers()["x-total-count"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    (resp.json::<Vec<Value>>().await.unwrap(), total)
}

fn ids(list: &[Value]) -> Vec<i64> {
    list.iter().map(|i| i["id"].as_i64().unwrap()).collect()
}

#[tokio::test]
async fn incidents_page_through_and_filter_by_page_tag() {
    let r = start().await;
    let mut g = grpc(&r).await;
    for i in 0..7u64 {
        mismatch(&mut g, "decode-0", 40 + (i % 2) as u32, i).await;
    }
    mismatch(&mut g, "decode-1", 40, 0).await;
    let base = format!("http://{}", r.http_addr);

    // Paging: three pages of three, newest first, each incident once; past the end is empty.
    let mut seen = Vec::new();
    for page_no in 1..=3 {
        let (list, total) = api(format!("{base}/api/incidents?limit=3&page_no={page_no}")).await;
        assert_eq!(total, 8);
        assert_eq!(list.len(), if page_no < 3 { 3 } else { 2 });
        seen.extend(ids(&list));
    }
    assert!(
        seen.windows(2).all(|w| w[0] > w[1]),
        "newest first: {seen:?}"
    );
    assert_eq!(seen.iter().collect::<BTreeSet<_>>().len(), 8);
    assert_eq!(
        api(format!("{base}/api/incidents?limit=3&page_no=4")).await,
        (vec![], 8)
    );

    // Page tags are columns: a filter by node and page, by page alone, and by generation.
    let (on_40, total) = api(format!("{base}/api/incidents?node=decode-0&page=40")).await;
    assert_eq!((on_40.len(), total), (4, 4));
    assert!(on_40
        .iter()
        .all(|i| i["page"] == 40 && i["node"] == "decode-0"));
    assert_eq!(api(format!("{base}/api/incidents?page=40")).await.1, 5);
    let (gen_3, _) = api(format!("{base}/api/incidents?page=41&generation=3")).await;
    assert_eq!(gen_3.len(), 1);
    assert_eq!(gen_3[0]["generation"], 3);

    // The HTML list pages the same way and links each page tag to its page's incidents.
    let ops = Signed::sign_in(&base, OPERATOR).await;
    let html = ops.get("/incidents?limit=3").await.text().await.unwrap();
    assert!(html.contains("page 1 of 3 · 8 incidents"), "{html}");
    assert!(html.contains("id=\"older\" href=\"/incidents?page_no=2&amp;limit=3\""));
    assert!(!html.contains("id=\"newer\""));
    assert!(
        html.contains("href=\"/incidents?node=decode-1&amp;page=40&amp;limit=3\""),
        "page-tag link: {html}"
    );
    let html = ops
        .get("/incidents?limit=3&page_no=3")
        .await
        .text()
        .await
        .unwrap();
    assert!(html.contains("page 3 of 3") && html.contains("id=\"newer\""));
    assert!(!html.contains("id=\"older\""));
    let html = ops
        .get("/incidents?node=decode-0&page=41")
        .await
        .text()
        .await
        .unwrap();
    assert_eq!(html.matches("<tr id=\"incident-").count(), 3, "{html}");

    // The detail page lists the other incidents on the same page of the same node.
    let newest_on_40 = on_40[0]["id"].as_i64().unwrap();
    let detail = ops
        .get(&format!("/incidents/{newest_on_40}"))
        .await
        .text()
        .await
        .unwrap();
    let at = detail.find("id=\"same-page\"").expect("same-page table");
    let table = &detail[at..detail[at..].find("</table>").unwrap() + at];
    let linked: BTreeSet<i64> = ids(&on_40[1..]).into_iter().collect();
    for id in &linked {
        assert!(
            table.contains(&format!("href=\"/incidents/{id}\"")),
            "{table}"
        );
    }
    assert_eq!(table.matches("<tr><td>").count(), linked.len());
    r.shutdown().await;
}

#[tokio::test]
async fn malformed_list_and_chart_queries_are_400s_naming_the_field() {
    let r = start().await;
    let base = format!("http://{}", r.http_addr);
    let ops = Signed::sign_in(&base, OPERATOR).await;
    let http = reqwest::Client::new();
    for (query, names) in [
        ("page_no=0", "page_no"),
        ("page_no=abc", "page_no"),
        ("page_no=99999999999999999999", "page_no"),
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("page=-1", "KV page"),
        ("page=4x", "KV page"),
        ("generation=two", "generation"),
        ("status=closed", "incident status"),
        ("kind=bogus", "incident kind"),
        ("refresh=1", "refresh"),
    ] {
        for resp in [
            ops.get(&format!("/incidents?{query}")).await,
            http.get(format!("{base}/api/incidents?{query}"))
                .bearer_auth(OPS_TOKEN)
                .send()
                .await
                .unwrap(),
        ] {
            assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{query}");
            let body: Value = resp.json().await.unwrap();
            let msg = body["error"]["message"].as_str().unwrap();
            assert!(msg.contains(names), "{query}: {msg}");
        }
    }
    for (path, names) in [
        ("/integrity?window_s=soon", "window_s"),
        ("/integrity?bucket_s=0", "bucket_s"),
        ("/integrity?window_s=2592000&bucket_s=1", "buckets"),
        ("/probes?refresh=-5", "refresh"),
    ] {
        let resp = ops.get(path).await;
        assert_eq!(resp.status(), StatusCode::BAD_REQUEST, "{path}");
        let body: Value = resp.json().await.unwrap();
        let msg = body["error"]["message"].as_str().unwrap();
        assert!(msg.contains(names), "{path}: {msg}");
    }
    let resp = http
        .get(format!("{base}/api/integrity/series?bucket_s=x"))
        .bearer_auth(OPS_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_REQUEST);
    // Still serving after all that.
    assert_eq!(
        get_json(format!("{base}/api/incidents")).await,
        Value::Array(vec![])
    );
    r.shutdown().await;
}

//! Issue 8, the incident reproduced in one process: tenant B's over-length prompt with every
//! defense on, with each defense removed, with each defense alone, and with none (the
//! positive control, which must leak).

#[allow(dead_code)]
#[path = "../src/harness/mod.rs"]
mod harness;

use harness::cluster::Failure;
use harness::incident::{run, Outcome};
use harness::layers::{Layer, Layers};
use pagewarden_kvcache::PoolStats;

fn all_free(s: &PoolStats, pages: usize) -> bool {
    s.free == pages && s.reserved == 0 && s.readable == 0 && s.draining == 0 && s.quarantined == 0
}

fn assert_no_leak(what: &str, o: &Outcome) {
    assert!(
        !o.leaked(),
        "{what}: A's bytes reached B: {:?}",
        o.b.as_ref().map(|_| "response")
    );
    assert!(
        all_free(&o.end.0, harness::cluster::DECODE_PAGES),
        "{what}: decode pool not all free at the end: {:?}",
        o.end.0
    );
    assert!(
        all_free(&o.end.1, harness::cluster::PREFILL_PAGES),
        "{what}: prefill pool not all free at the end: {:?}",
        o.end.1
    );
}

#[tokio::test]
async fn every_defense_on_b_gets_400_and_nothing_is_reserved() {
    let o = run(Layers::all_on()).await;
    match &o.b {
        Err(Failure::Rejected { by, reason }) => {
            assert_eq!(*by, "router");
            assert_eq!(reason.reason(), "context_length_exceeded");
        }
        other => panic!(
            "expected a router 400, got {:?}",
            other.as_ref().map(|_| "response")
        ),
    }
    assert_eq!(o.before_b, o.after_b, "B's rejection changed a pool");
    assert_no_leak("all on", &o);
}

#[tokio::test]
async fn removing_any_one_defense_still_fails_b_without_leaking() {
    for l in Layer::ALL {
        let o = run(Layers::without(l)).await;
        assert!(o.b.is_err(), "without {l:?}: B was served");
        assert_no_leak(&format!("without {l:?}"), &o);
        if l != Layer::RouterRejection {
            assert!(o.rejected_400(), "without {l:?}: expected the router's 400");
            assert_eq!(o.before_b, o.after_b, "without {l:?}: a page was reserved");
        }
    }
}

#[tokio::test]
async fn each_defense_alone_keeps_a_out_of_b() {
    for l in Layer::ALL {
        let o = run(Layers::only(l)).await;
        assert_no_leak(&format!("only {l:?}"), &o);
        let kinds: Vec<&str> = o.events.iter().map(|e| e.kind.as_str()).collect();
        match l {
            Layer::RouterRejection => {
                assert!(
                    o.rejected_400(),
                    "only router: {:?}",
                    o.b.as_ref().map(|_| ())
                );
                assert_eq!(o.before_b, o.after_b, "only router: a page was reserved");
            }
            Layer::WorkerAdmission => match &o.b {
                Err(Failure::Rejected { by, .. }) => assert_eq!(*by, "prefill"),
                other => panic!("only admission: {:?}", other.as_ref().map(|_| ())),
            },
            Layer::CommitTokenCount => {
                assert!(matches!(o.b, Err(Failure::Commit(_))), "only token count");
                assert!(kinds.contains(&"token_count_mismatch"), "{kinds:?}");
            }
            Layer::Checksums => {
                assert!(matches!(o.b, Err(Failure::Commit(_))), "only checksums");
                assert!(kinds.contains(&"checksum_mismatch"), "{kinds:?}");
            }
            Layer::ReadGeneration => {
                // The stale read of A's page is refused; B gets its own (truncated) KV only.
                assert!(kinds.contains(&"generation_mismatch"), "{kinds:?}");
                assert!(o.b.is_err() || o.b_saw_own());
            }
            Layer::GrantFencing => {
                // A's late writes under its dead grant are dropped; B gets its own KV only.
                assert!(kinds.contains(&"stale_message"), "{kinds:?}");
                assert!(o.b.is_err() || o.b_saw_own());
            }
        }
    }
}

#[tokio::test]
async fn positive_control_with_every_defense_off_a_reaches_b() {
    let o = run(Layers::all_off()).await;
    assert!(
        o.b.is_ok(),
        "all off: B was not served: {:?}",
        o.b.as_ref().err()
    );
    assert!(
        o.leaked(),
        "all off: the chain did not deliver A's bytes to B (harness is broken)"
    );
    assert!(
        o.events.is_empty(),
        "all off: something still detected: {:?}",
        o.events
    );
}

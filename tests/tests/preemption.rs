//! Pages as you go (I9): decode allocates the pages of generated tokens as they are
//! generated, and when its pool runs short it preempts the youngest sequences (frees their
//! pages) and recomputes them later from their token ids. Real worker processes on 127.0.0.1,
//! the tiny test model.

use std::time::Duration;

use pagewarden_system_tests::driver::{greedy, Driver};
use pagewarden_system_tests::{start_decode, start_prefill, ModelArg};
use pagewarden_testkit::{eventually, Polling};

const TINY: ModelArg = ModelArg::Tiny(7);
const PREEMPTIONS: &str = "pagewarden_preemptions_total{role=\"decode\"}";
const SHARE_PREEMPTIONS: &str = "pagewarden_share_preemptions_total{role=\"decode\"}";

/// Four prompts of 40 tokens, each generating 150 (end-of-generation ignored): 190 tokens, 12
/// pages each at the end. Decode's pool is one context (256 tokens, 16 pages): all four are
/// granted (3 pages each) and start, and their generations collide.
const PROMPT: usize = 40;
const MAX: u32 = 150;

fn prompt(i: usize) -> Vec<u32> {
    (0..PROMPT)
        .map(|j| 20 + ((i * 37 + j * 11) % 200) as u32)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preempted_sequences_are_recomputed_and_say_what_they_say_alone() {
    let decode = start_decode(&TINY, &["--pool-tokens", "256"]);
    let prefill = start_prefill(&TINY, &[]);
    let mut d = Driver::connect(&decode.grpc_url(), &prefill.grpc_url()).await;
    let info = d.decode_info().await;
    assert_eq!((info.total_pages, info.context_length), (16, 256));
    let sampling = || {
        let mut s = greedy(MAX);
        s.ignore_eos = true;
        s
    };

    // Each alone: it has the pool to itself, nothing is preempted.
    let mut alone = Vec::new();
    for i in 0..4 {
        let out = d
            .complete("t", &prompt(i), sampling())
            .await
            .expect("alone");
        assert_eq!(out.tokens.len(), MAX as usize, "request {i} alone: {out:?}");
        alone.push(out);
    }
    assert_eq!(
        decode.metric(PREEMPTIONS).await,
        0.0,
        "a request alone was preempted"
    );

    // All four at once: the pool cannot hold them; the youngest give their pages up, are
    // recomputed, and say exactly what they said alone.
    let calls: Vec<_> = (0..4)
        .map(|i| {
            let mut d = d.clone();
            let s = sampling();
            tokio::spawn(async move { d.complete(&format!("t{}", i % 2), &prompt(i), s).await })
        })
        .collect();
    for (i, c) in calls.into_iter().enumerate() {
        let out = c.await.unwrap().expect("together");
        assert_eq!(
            out.tokens, alone[i].tokens,
            "request {i}: tokens differ from alone"
        );
        assert_eq!(
            out.text, alone[i].text,
            "request {i}: text differs from alone"
        );
        assert_eq!(out.finish, alone[i].finish);
    }
    let preempted = decode.metric(PREEMPTIONS).await;
    eprintln!("preemptions: {preempted}");
    assert!(
        preempted >= 1.0,
        "no sequence was preempted: the test does not fill the pool"
    );
    // vLLM's name counts the same preemptions.
    let text = decode.metrics().await;
    let vllm: f64 = text
        .lines()
        .filter(|l| l.starts_with("vllm:num_preemptions_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    assert_eq!(vllm, preempted, "{text}");

    // Every page comes back; a request after all that is served as before.
    eventually(Duration::from_secs(20), "free pools", || {
        let mut d = d.clone();
        async move {
            let (di, pi) = (d.decode_info().await, d.prefill_info().await);
            let idle = (di.free_pages, di.active_requests, di.queue_depth)
                == (di.total_pages, 0, 0)
                && pi.free_pages == pi.total_pages;
            idle.then_some(()).ok_or(format!("{di:?} {pi:?}"))
        }
    })
    .await;
    let again = d
        .complete("t", &prompt(0), sampling())
        .await
        .expect("again");
    assert_eq!(again.tokens, alone[0].tokens);
}

/// A tenant's share of decode's pool while another waits: tenant "a" fills the pool with
/// three long generations, then tenant "b" sends one request whose prompt does not fit in what
/// is left. "b" holds nothing, under its half of the pool, so "a" (over its half) gives its
/// youngest sequence back (counted apart), "b" is served, and "a"'s requests still say what
/// they say alone. Without the share rule "b" waits until "a" frees pages by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_tenant_gets_its_share_back_from_one_over_its_own() {
    // 32 pages; "a": three prompts of 40 tokens generating 200 each (15 pages each at the end:
    // they cannot all fit); "b": a prompt of 200 tokens (13 pages with its first token's).
    let decode = start_decode(&TINY, &["--pool-tokens", "512"]);
    let prefill = start_prefill(&TINY, &[]);
    let d = Driver::connect(&decode.grpc_url(), &prefill.grpc_url()).await;
    let long = || {
        let mut s = greedy(200);
        s.ignore_eos = true;
        s
    };
    let mut alone = Vec::new();
    for i in 0..3 {
        alone.push(
            d.clone()
                .complete("a", &prompt(i), long())
                .await
                .expect("alone"),
        );
    }
    // The scenario needs "a" still generating when "b" arrives; on a fast machine "a" can finish
    // in the moment between the two, so it runs again (at most three times) until "b" found
    // "a" over its share. With the share rule off, no run preempts anything.
    let mut for_share = 0.0;
    for _ in 0..3 {
        let calls: Vec<_> = (0..3)
            .map(|i| {
                let (mut d, s) = (d.clone(), long());
                tokio::spawn(async move { d.complete("a", &prompt(i), s).await })
            })
            .collect();
        // Until "a" holds most of the pool (its prompts' 9 pages have grown past 24).
        // Asked every millisecond: "a" holds the pool only until its generations end.
        let pace = Polling::within(Duration::from_secs(60)).every(Duration::from_millis(1));
        eventually(pace, "\"a\" to fill the pool", || {
            let mut d = d.clone();
            async move {
                let info = d.decode_info().await;
                (info.total_pages - info.free_pages >= 24)
                    .then_some(())
                    .ok_or(format!("{info:?}"))
            }
        })
        .await;
        let b_prompt: Vec<u32> = (0..200).map(|j| 30 + (j * 7 % 150) as u32).collect();
        let b = d
            .clone()
            .complete("b", &b_prompt, greedy(4))
            .await
            .expect("b");
        assert_eq!(b.tokens.len(), 4, "{b:?}");
        for (i, c) in calls.into_iter().enumerate() {
            let out = c.await.unwrap().expect("a's request");
            assert_eq!(
                out.tokens, alone[i].tokens,
                "a's request {i}: differs from alone"
            );
        }
        for_share = decode.metric(SHARE_PREEMPTIONS).await;
        if for_share >= 1.0 {
            break;
        }
    }
    assert!(
        for_share >= 1.0,
        "no sequence of \"a\" was preempted for \"b\"'s share"
    );
}

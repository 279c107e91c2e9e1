//! Stateright model of OUR page protocol: reserve with fresh generations and a write grant,
//! one-sided writes that are fenced when issued but land whenever the network delivers them,
//! commit that verifies the manifest against landed bytes, abort (revoke), over-length
//! rejection, drain acknowledgement, timeout to quarantine, and peer teardown.
//! 3 pages, 2 requests; request 1 is over-length, so prefill rejects it mid-transfer.
//!
//! Checked exhaustively with every defense on (no violation), and once per removed defense,
//! where the checker must find a counterexample:
//! - `reject_reaches_decode = false`: decode's handler lets a prefill rejection fall through
//!   to admission (the incident).
//! - `defer_free = false`: revoked pages go straight to the free list, without waiting for
//!   the drain acknowledgement.
//!
//! `shared_pages`: the same for the prefix cache's shared read-only pages (I10).

use std::collections::BTreeSet;

use stateright::{Checker, Model, Property};

#[path = "page_model/shared_pages.rs"]
mod shared_pages;

const PAGES: usize = 3;
const REQS: usize = 2;
const NEED: usize = 2;
const OVERLENGTH: [bool; REQS] = [false, true];

/// What a page's bytes were written for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
struct Tag {
    req: u8,
    gen: u8,
}

/// The pool's page states; the grant of request r is named r (one reservation per request).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum PState {
    Free,
    Reserved(u8),
    Readable(u8),
    Draining(u8),
    Quarantined(u8),
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Page {
    state: PState,
    gen: u8,
    content: Option<Tag>,
}

/// Decode's view of one request: one enum, transitions consume it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Decode {
    Idle,
    Reserved,
    Readable,
    Finished,
    Aborted,
    Rejected,
}

/// Prefill's view of one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Prefill {
    Idle,
    Writing,
    ManifestSent,
    RejectSent,
    Done,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct S {
    pages: Vec<Page>,
    decode: [Decode; REQS],
    prefill: [Prefill; REQS],
    /// The (page, generation) list of each request's grant.
    grant: [Vec<(u8, u8)>; REQS],
    /// Pages whose write prefill has issued, per request.
    issued: [Vec<u8>; REQS],
    /// Writes posted but not landed: (page, tag they carry).
    inflight: BTreeSet<(u8, Tag)>,
    /// A read returned bytes not written for the reader at the page's current generation.
    leaked: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum A {
    Reserve(u8),
    IssueWrite(u8, u8),
    Land(u8, Tag),
    SendManifest(u8),
    SendReject(u8),
    HandleManifest(u8),
    HandleReject(u8),
    Cancel(u8),
    ReadAndFinish(u8),
    DrainAck(u8),
    Timeout(u8),
    PeerGone(u8),
}

struct Protocol {
    reject_reaches_decode: bool,
    defer_free: bool,
}

impl Protocol {
    /// Revoke request r's grant: its pages drain (or, without the defense, are freed now).
    fn revoke(&self, s: &mut S, r: u8) {
        for p in s.pages.iter_mut() {
            if p.state == PState::Reserved(r) {
                p.state = if self.defer_free {
                    PState::Draining(r)
                } else {
                    PState::Free
                };
            }
        }
    }

    fn pages_in(s: &S, st: PState) -> impl Iterator<Item = usize> + '_ {
        (0..PAGES).filter(move |&i| s.pages[i].state == st)
    }
}

impl Model for Protocol {
    type State = S;
    type Action = A;

    fn init_states(&self) -> Vec<S> {
        let page = Page {
            state: PState::Free,
            gen: 0,
            content: None,
        };
        vec![S {
            pages: vec![page; PAGES],
            decode: [Decode::Idle; REQS],
            prefill: [Prefill::Idle; REQS],
            grant: Default::default(),
            issued: Default::default(),
            inflight: BTreeSet::new(),
            leaked: false,
        }]
    }

    fn actions(&self, s: &S, out: &mut Vec<A>) {
        for r in 0..REQS as u8 {
            let ri = r as usize;
            match s.decode[ri] {
                Decode::Idle => {
                    if Self::pages_in(s, PState::Free).count() >= NEED {
                        out.push(A::Reserve(r));
                    }
                }
                Decode::Reserved => {
                    out.push(A::Cancel(r));
                    match s.prefill[ri] {
                        Prefill::ManifestSent => out.push(A::HandleManifest(r)),
                        Prefill::RejectSent => out.push(A::HandleReject(r)),
                        Prefill::Idle | Prefill::Writing | Prefill::Done => {}
                    }
                }
                Decode::Readable => out.push(A::ReadAndFinish(r)),
                Decode::Aborted | Decode::Rejected => {
                    let draining = Self::pages_in(s, PState::Draining(r)).count() > 0;
                    let in_flight = s.inflight.iter().any(|(_, t)| t.req == r);
                    if draining && !in_flight {
                        out.push(A::DrainAck(r));
                    }
                    if draining {
                        out.push(A::Timeout(r));
                    }
                    if Self::pages_in(s, PState::Quarantined(r)).count() > 0 {
                        out.push(A::PeerGone(r));
                    }
                }
                Decode::Finished => {}
            }
            if s.prefill[ri] == Prefill::Writing {
                for &(p, _) in &s.grant[ri] {
                    if !s.issued[ri].contains(&p) {
                        out.push(A::IssueWrite(r, p));
                    }
                }
                let all_landed =
                    s.issued[ri].len() == NEED && !s.inflight.iter().any(|(_, t)| t.req == r);
                if OVERLENGTH[ri] {
                    out.push(A::SendReject(r));
                } else if all_landed {
                    out.push(A::SendManifest(r));
                }
            }
        }
        for &(p, t) in &s.inflight {
            out.push(A::Land(p, t));
        }
    }

    fn next_state(&self, s0: &S, a: A) -> Option<S> {
        let mut s = s0.clone();
        match a {
            A::Reserve(r) => {
                let free: Vec<usize> = Self::pages_in(&s, PState::Free).take(NEED).collect();
                let mut grant = Vec::new();
                for i in free {
                    let p = &mut s.pages[i];
                    p.gen += 1;
                    p.state = PState::Reserved(r);
                    grant.push((i as u8, p.gen));
                }
                s.grant[r as usize] = grant;
                s.decode[r as usize] = Decode::Reserved;
                s.prefill[r as usize] = Prefill::Writing;
            }
            A::IssueWrite(r, p) => {
                s.issued[r as usize].push(p);
                let gen = s.grant[r as usize].iter().find(|(q, _)| *q == p)?.1;
                // The fence: a write is posted only under a live grant for this page and
                // generation. Once posted, the network delivers it whatever happens next.
                let page = &s.pages[p as usize];
                if page.state == PState::Reserved(r) && page.gen == gen {
                    s.inflight.insert((p, Tag { req: r, gen }));
                }
            }
            A::Land(p, t) => {
                s.inflight.remove(&(p, t));
                s.pages[p as usize].content = Some(t);
            }
            A::SendManifest(r) => s.prefill[r as usize] = Prefill::ManifestSent,
            A::SendReject(r) => s.prefill[r as usize] = Prefill::RejectSent,
            A::HandleManifest(r) => {
                s.prefill[r as usize] = Prefill::Done;
                // Commit: every granted page still reserved to r and holding bytes written for
                // r at its current generation (checksums of landed bytes match the manifest).
                let ok = s.grant[r as usize].iter().all(|&(p, g)| {
                    let page = &s.pages[p as usize];
                    page.state == PState::Reserved(r)
                        && page.gen == g
                        && page.content == Some(Tag { req: r, gen: g })
                });
                if ok {
                    for p in s.pages.iter_mut() {
                        if p.state == PState::Reserved(r) {
                            p.state = PState::Readable(r);
                        }
                    }
                    s.decode[r as usize] = Decode::Readable;
                } else {
                    self.revoke(&mut s, r);
                    s.decode[r as usize] = Decode::Aborted;
                }
            }
            A::HandleReject(r) => {
                s.prefill[r as usize] = Prefill::Done;
                if self.reject_reaches_decode {
                    self.revoke(&mut s, r);
                    s.decode[r as usize] = Decode::Rejected;
                } else {
                    // The incident: an unexpected message falls through to admission.
                    for p in s.pages.iter_mut() {
                        if p.state == PState::Reserved(r) {
                            p.state = PState::Readable(r);
                        }
                    }
                    s.decode[r as usize] = Decode::Readable;
                }
            }
            A::Cancel(r) => {
                self.revoke(&mut s, r);
                s.decode[r as usize] = Decode::Aborted;
                s.prefill[r as usize] = Prefill::Done;
            }
            A::ReadAndFinish(r) => {
                for p in s.pages.iter_mut() {
                    if p.state == PState::Readable(r) {
                        if p.content != Some(Tag { req: r, gen: p.gen }) {
                            s.leaked = true;
                        }
                        p.state = PState::Free;
                    }
                }
                s.decode[r as usize] = Decode::Finished;
            }
            A::DrainAck(r) | A::PeerGone(r) => {
                if matches!(a, A::PeerGone(_)) {
                    // Teardown of the peer's connection drops whatever it still had posted.
                    s.inflight.retain(|(_, t)| t.req != r);
                }
                for p in s.pages.iter_mut() {
                    if p.state == PState::Draining(r) || p.state == PState::Quarantined(r) {
                        p.state = PState::Free;
                    }
                }
            }
            A::Timeout(r) => {
                for p in s.pages.iter_mut() {
                    if p.state == PState::Draining(r) {
                        p.state = PState::Quarantined(r);
                    }
                }
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(
                "no read of bytes written for another request or generation",
                |_, s: &S| !s.leaked,
            ),
            Property::always(
                "no page is reallocated while a write to it may land",
                |_, s: &S| {
                    s.inflight
                        .iter()
                        .all(|(p, t)| s.pages[*p as usize].gen == t.gen)
                },
            ),
            Property::sometimes("a request is read", |_, s: &S| {
                s.decode.contains(&Decode::Finished)
            }),
            Property::sometimes("an over-length request ends rejected", |_, s: &S| {
                s.decode[1] == Decode::Rejected
            }),
            Property::sometimes("quarantine is reached", |_, s: &S| {
                s.pages
                    .iter()
                    .any(|p| matches!(p.state, PState::Quarantined(_)))
            }),
        ]
    }
}

const LEAK: &str = "no read of bytes written for another request or generation";
const REUSE: &str = "no page is reallocated while a write to it may land";

#[test]
fn protocol_with_every_defense_has_no_violation() {
    let c = Protocol {
        reject_reaches_decode: true,
        defer_free: true,
    }
    .checker()
    .spawn_bfs()
    .join();
    assert!(c.is_done(), "state space not exhausted");
    c.assert_no_discovery(LEAK);
    c.assert_no_discovery(REUSE);
    c.assert_properties();
    assert!(
        c.unique_state_count() > 1_000,
        "{} states",
        c.unique_state_count()
    );
}

#[test]
fn rejection_not_reaching_decode_leaks() {
    let c = Protocol {
        reject_reaches_decode: false,
        defer_free: true,
    }
    .checker()
    .spawn_bfs()
    .join();
    let path = c.assert_any_discovery(LEAK);
    assert!(path
        .into_actions()
        .iter()
        .any(|a| matches!(a, A::HandleReject(_))));
}

#[test]
fn immediate_free_without_drain_leaks() {
    let c = Protocol {
        reject_reaches_decode: true,
        defer_free: false,
    }
    .checker()
    .spawn_bfs()
    .join();
    c.assert_any_discovery(REUSE);
    let path = c.assert_any_discovery(LEAK);
    assert!(path.into_actions().iter().any(|a| matches!(a, A::Land(..))));
}

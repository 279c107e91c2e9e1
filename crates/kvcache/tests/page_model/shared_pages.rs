//! Stateright model of the prefix cache's shared pages (I10, with I1): requests of two
//! namespaces compute the SAME prompt page (the dangerous case: equal tokens), publish it,
//! pin cached pages as readers, read them, unpin; unpinned pages are evicted and pages are
//! reallocated. 2 pages; generations capped at 3 so the space is finite.
//!
//! Checked exhaustively with every defense on, and once per removed defense, where the checker
//! must find the counterexample the defense exists for:
//! - `namespace_in_key = false`: the index is keyed by tokens alone, so B pins A's page.
//! - `evict_needs_no_readers = false`: a pinned page is evicted (and reallocated).
//! - the same with `read_checks_generation = false` too: a reader reads a page at a stale
//!   generation (with the check on, that read is refused instead).
//! - `zero_on_evict = false`: a page comes back from eviction holding cached bytes.

use stateright::{Checker, Model, Property};

const PAGES: usize = 2;
const NS: u8 = 2;
const MAX_GEN: u8 = 3;
const MAX_READERS: usize = 2;

/// What a page's bytes hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Bytes {
    Zero,
    /// The prompt page's KV as computed by a request of `ns` at generation `gen`; `cached`
    /// once it has been published into the cache.
    Kv {
        ns: u8,
        gen: u8,
        cached: bool,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum PState {
    Free,
    /// Owned by a request of `ns` that computed the page.
    Owned(u8),
    /// Cached under `ns`, with `readers` pins.
    Shared {
        ns: u8,
        readers: u8,
    },
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct Page {
    state: PState,
    gen: u8,
    bytes: Bytes,
}

/// A pin: a reader of namespace `ns` holding (page, generation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct Pin {
    ns: u8,
    page: u8,
    gen: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct S {
    pages: Vec<Page>,
    /// The index: for each namespace, the page caching the prompt page (one prompt).
    index: [Option<(u8, u8)>; NS as usize],
    pins: Vec<Pin>,
    /// A read returned KV computed for another namespace.
    crossed: bool,
    /// A read succeeded at a generation other than the page's current one.
    stale: bool,
    /// A fresh allocation found bytes that had been cached.
    leftover: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum A {
    /// A request of `ns` allocates a free page and computes the prompt page into it.
    Compute(u8, u8),
    /// The owner publishes: cached if its namespace has no copy, else freed.
    Publish(u8),
    /// A request of `ns` looks the prompt up and pins what it finds.
    PinPrefix(u8),
    Read(usize),
    Unpin(usize),
    Evict(u8),
}

struct SharedCache {
    namespace_in_key: bool,
    evict_needs_no_readers: bool,
    read_checks_generation: bool,
    zero_on_evict: bool,
}

impl SharedCache {
    fn all_defenses() -> Self {
        Self {
            namespace_in_key: true,
            evict_needs_no_readers: true,
            read_checks_generation: true,
            zero_on_evict: true,
        }
    }

    /// The index entry a lookup under `ns` finds.
    fn lookup(&self, s: &S, ns: u8) -> Option<(u8, u8)> {
        if self.namespace_in_key {
            s.index[ns as usize]
        } else {
            s.index.iter().flatten().next().copied()
        }
    }
}

impl Model for SharedCache {
    type State = S;
    type Action = A;

    fn init_states(&self) -> Vec<S> {
        let page = Page {
            state: PState::Free,
            gen: 0,
            bytes: Bytes::Zero,
        };
        vec![S {
            pages: vec![page; PAGES],
            index: [None; NS as usize],
            pins: vec![],
            crossed: false,
            stale: false,
            leftover: false,
        }]
    }

    fn actions(&self, s: &S, out: &mut Vec<A>) {
        for (i, p) in s.pages.iter().enumerate() {
            let i = i as u8;
            match p.state {
                PState::Free if p.gen < MAX_GEN => {
                    (0..NS).for_each(|ns| out.push(A::Compute(ns, i)));
                }
                PState::Free => {}
                PState::Owned(_) => out.push(A::Publish(i)),
                PState::Shared { readers, .. } => {
                    if readers == 0 || !self.evict_needs_no_readers {
                        out.push(A::Evict(i));
                    }
                }
            }
        }
        if s.pins.len() < MAX_READERS {
            (0..NS).for_each(|ns| out.push(A::PinPrefix(ns)));
        }
        for i in 0..s.pins.len() {
            out.push(A::Read(i));
            out.push(A::Unpin(i));
        }
    }

    fn next_state(&self, s0: &S, a: A) -> Option<S> {
        let mut s = s0.clone();
        match a {
            A::Compute(ns, i) => {
                let p = &mut s.pages[i as usize];
                p.gen += 1;
                // Before the request writes: what it could see of the page's old bytes.
                if matches!(p.bytes, Bytes::Kv { cached: true, .. }) {
                    s.leftover = true;
                }
                p.state = PState::Owned(ns);
                p.bytes = Bytes::Kv {
                    ns,
                    gen: p.gen,
                    cached: false,
                };
            }
            A::Publish(i) => {
                let PState::Owned(ns) = s.pages[i as usize].state else {
                    return None;
                };
                let p = &mut s.pages[i as usize];
                if s.index[ns as usize].is_none() {
                    s.index[ns as usize] = Some((i, p.gen));
                    p.state = PState::Shared { ns, readers: 0 };
                    if let Bytes::Kv { cached, .. } = &mut p.bytes {
                        *cached = true;
                    }
                } else {
                    p.state = PState::Free;
                }
            }
            A::PinPrefix(ns) => {
                let (page, gen) = self.lookup(&s, ns)?;
                let p = &mut s.pages[page as usize];
                // A pin is taken only on a Shared page at the entry's generation.
                let PState::Shared { ns: owner, readers } = p.state else {
                    return None;
                };
                if p.gen != gen {
                    return None;
                }
                p.state = PState::Shared {
                    ns: owner,
                    readers: readers + 1,
                };
                s.pins.push(Pin { ns, page, gen });
            }
            A::Read(i) => {
                let pin = s.pins[i];
                let p = &s.pages[pin.page as usize];
                if self.read_checks_generation && p.gen != pin.gen {
                    return Some(s); // refused: the request fails, sees no data
                }
                if p.gen != pin.gen {
                    s.stale = true;
                }
                if let Bytes::Kv { ns, .. } = p.bytes {
                    if ns != pin.ns {
                        s.crossed = true;
                    }
                }
            }
            A::Unpin(i) => {
                let pin = s.pins.remove(i);
                let p = &mut s.pages[pin.page as usize];
                if let PState::Shared { ns, readers } = p.state {
                    if p.gen == pin.gen {
                        p.state = PState::Shared {
                            ns,
                            readers: readers.saturating_sub(1),
                        };
                    }
                }
            }
            A::Evict(i) => {
                let p = &mut s.pages[i as usize];
                let PState::Shared { ns, .. } = p.state else {
                    return None;
                };
                s.index[ns as usize] = None;
                if self.zero_on_evict {
                    p.bytes = Bytes::Zero;
                }
                if p.gen < MAX_GEN {
                    p.gen += 1;
                }
                p.state = PState::Free;
            }
        }
        Some(s)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always(CROSSED, |_, s: &S| !s.crossed),
            Property::always(STALE, |_, s: &S| !s.stale),
            Property::always(PINNED, |_, s: &S| {
                s.pins.iter().all(|pin| {
                    let p = &s.pages[pin.page as usize];
                    matches!(p.state, PState::Shared { .. }) && p.gen == pin.gen
                })
            }),
            Property::always(LEFTOVER, |_, s: &S| !s.leftover),
            Property::sometimes("a namespace hits its own cached page", |_, s: &S| {
                !s.pins.is_empty()
            }),
            Property::sometimes("both namespaces cache the same prompt", |_, s: &S| {
                s.index.iter().all(Option::is_some)
            }),
        ]
    }
}

const CROSSED: &str = "no read of KV cached under another namespace";
const STALE: &str = "no read at a stale generation";
const PINNED: &str = "a pinned page stays Shared at the pinned generation";
const LEFTOVER: &str = "no allocation finds bytes that were cached";

#[test]
fn shared_pages_with_every_defense_have_no_violation() {
    let c = SharedCache::all_defenses().checker().spawn_bfs().join();
    assert!(c.is_done(), "state space not exhausted");
    for p in [CROSSED, STALE, PINNED, LEFTOVER] {
        c.assert_no_discovery(p);
    }
    c.assert_properties();
    assert!(
        c.unique_state_count() > 100,
        "{} states",
        c.unique_state_count()
    );
}

#[test]
fn an_index_keyed_by_tokens_alone_crosses_namespaces() {
    let c = SharedCache {
        namespace_in_key: false,
        ..SharedCache::all_defenses()
    }
    .checker()
    .spawn_bfs()
    .join();
    c.assert_any_discovery(CROSSED);
}

#[test]
fn evicting_a_pinned_page_is_caught_by_the_generation_check() {
    let c = SharedCache {
        evict_needs_no_readers: false,
        ..SharedCache::all_defenses()
    }
    .checker()
    .spawn_bfs()
    .join();
    c.assert_any_discovery(PINNED);
    c.assert_no_discovery(STALE);
    c.assert_no_discovery(CROSSED);
}

#[test]
fn evicting_a_pinned_page_without_the_generation_check_reads_stale() {
    let c = SharedCache {
        evict_needs_no_readers: false,
        read_checks_generation: false,
        ..SharedCache::all_defenses()
    }
    .checker()
    .spawn_bfs()
    .join();
    c.assert_any_discovery(STALE);
    c.assert_any_discovery(CROSSED);
}

#[test]
fn eviction_without_zeroing_leaves_cached_bytes() {
    let c = SharedCache {
        zero_on_evict: false,
        ..SharedCache::all_defenses()
    }
    .checker()
    .spawn_bfs()
    .join();
    c.assert_any_discovery(LEFTOVER);
}

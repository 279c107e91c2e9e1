//! The reference model: page counts per state and, per reservation, which pages were written
//! how. It predicts the exact outcome (Ok or which error) of every transition.

use proptest::prelude::*;
use proptest::sample::Index;
use proptest::strategy::Union;
use proptest_state_machine::ReferenceStateMachine;

/// How a write to a reserved page is made.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteKind {
    /// Correct data, tokens and checksum.
    Good,
    /// Correct data, one token fewer than the page must hold.
    Short,
    /// Another (request, page, generation)'s bytes with a matching checksum.
    Foreign,
    /// Presents generation + 1.
    WrongGen,
    /// Checksum that does not match the data.
    BadChecksum,
    /// One byte short.
    BadLength,
    /// page_size + 1 tokens.
    TooManyTokens,
    /// The grant's key on a page outside the grant.
    WrongPage,
}

/// How a commit manifest is built (always from the data the writer meant to send).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ManifestKind {
    Good,
    ShortCount,
    BadChecksum,
    BadDigest,
    WrongKey,
}

#[derive(Clone, Debug)]
pub enum Transition {
    Reserve {
        tokens: usize,
    },
    Allocate {
        tokens: usize,
    },
    Write {
        res: Index,
        page: Index,
        kind: WriteKind,
    },
    /// A write under a revoked (draining/quarantined) grant, to one of its old pages.
    WriteRevoked {
        rev: Index,
        page: Index,
    },
    /// A write under a committed or drained grant, to one of its old pages.
    WriteRetired {
        old: Index,
        page: Index,
    },
    WriteUnknown,
    Commit {
        res: Index,
        kind: ManifestKind,
    },
    Abort {
        res: Index,
        by_drop: bool,
    },
    /// mark_drained / peer_gone on a live grant: changes no page; recorded on the grant, whose
    /// end then frees its pages at once.
    DrainLive {
        res: Index,
    },
    Drain {
        rev: Index,
    },
    Sweep,
    ReleaseQuarantined {
        rev: Index,
    },
    Read {
        rd: Index,
        page: Index,
        layer: usize,
    },
    Grow {
        rd: Index,
        extra: usize,
    },
    /// Drop, or publish into the prefix cache (off in this pool: frees the same).
    DropReadable {
        rd: Index,
        publish: bool,
    },
}

/// What the model knows of one write landed on a reserved page.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Landed {
    Good,
    Short,
    Foreign,
}

#[derive(Clone, Debug)]
pub struct Res {
    pub tokens: usize,
    pub written: Vec<Option<Landed>>,
    /// The transfer reported the grant's stream ended (drained, peer gone) while it was live.
    pub stream_ended: bool,
}

#[derive(Clone, Debug)]
pub struct Read {
    pub pages: usize,
}

#[derive(Clone, Debug)]
pub struct Rev {
    pub pages: usize,
    pub quarantined: bool,
}

#[derive(Clone, Debug)]
pub struct Model {
    pub capacity: usize,
    pub zero_on_release: bool,
    /// `PoolConfig::revocation_drains`: a grant's end frees its pages at once.
    pub revocation_drains: bool,
    pub free: usize,
    pub reserved: Vec<Res>,
    pub readable: Vec<Read>,
    pub revoked: Vec<Rev>,
    pub retired: usize,
}

pub const PAGE_SIZE: usize = 4;
pub const LAYERS: usize = 2;

impl Model {
    pub fn cap_tokens(&self) -> usize {
        self.capacity * PAGE_SIZE
    }

    /// Predicted result of allocating `tokens` more tokens: Ok(pages) or the error's kind.
    pub fn alloc(&self, tokens: usize) -> Result<usize, &'static str> {
        if tokens == 0 {
            Err("zero")
        } else if tokens > self.cap_tokens() {
            Err("too_large")
        } else if tokens.div_ceil(PAGE_SIZE) > self.free {
            Err("exhausted")
        } else {
            Ok(tokens.div_ceil(PAGE_SIZE))
        }
    }

    /// A reservation ends without a commit: its pages drain, or are freed at once when
    /// nothing of the grant can land any more.
    fn end_without_commit(&mut self, r: Res) {
        if r.stream_ended || self.revocation_drains {
            self.free += r.written.len();
            self.retired += 1;
        } else {
            self.revoked.push(Rev {
                pages: r.written.len(),
                quarantined: false,
            });
        }
    }

    pub fn draining(&self) -> usize {
        self.revoked
            .iter()
            .filter(|r| !r.quarantined)
            .map(|r| r.pages)
            .sum()
    }

    pub fn quarantined(&self) -> usize {
        self.revoked
            .iter()
            .filter(|r| r.quarantined)
            .map(|r| r.pages)
            .sum()
    }
}

/// Tokens page `i` of a `tokens`-token reservation must hold.
pub fn tokens_in_page(tokens: usize, i: usize) -> usize {
    tokens.saturating_sub(i * PAGE_SIZE).min(PAGE_SIZE)
}

/// Predicted outcome of a write: Ok or the error's name.
pub fn predict_write(r: &Res, page: usize, kind: WriteKind) -> Result<(), &'static str> {
    match kind {
        WriteKind::WrongPage => return Err("WrongPage"),
        WriteKind::WrongGen => return Err("StaleGeneration"),
        WriteKind::Good
        | WriteKind::Short
        | WriteKind::Foreign
        | WriteKind::BadChecksum
        | WriteKind::BadLength
        | WriteKind::TooManyTokens => {}
    }
    if r.written[page].is_some() {
        return Err("DuplicateWrite");
    }
    match kind {
        WriteKind::BadLength => Err("BadLength"),
        WriteKind::TooManyTokens => Err("TooManyTokens"),
        WriteKind::BadChecksum => Err("ChecksumMismatch"),
        WriteKind::Good | WriteKind::Short | WriteKind::Foreign => Ok(()),
        WriteKind::WrongPage | WriteKind::WrongGen => unreachable!("handled above"),
    }
}

/// Predicted outcome of a commit, in the pool's check order.
pub fn predict_commit(r: &Res, kind: ManifestKind) -> Result<(), String> {
    match kind {
        ManifestKind::WrongKey => return Err("KeyMismatch".into()),
        ManifestKind::ShortCount => return Err(format!("TokenCount {}", r.tokens - 1)),
        ManifestKind::BadDigest => return Err("DigestMismatch".into()),
        ManifestKind::Good | ManifestKind::BadChecksum => {}
    }
    for (i, w) in r.written.iter().enumerate() {
        let Some(w) = w else {
            return Err(format!("PageNotWritten {i}"));
        };
        if *w == Landed::Foreign || (kind == ManifestKind::BadChecksum && i == 0) {
            return Err(format!("ChecksumMismatch {i}"));
        }
    }
    if r.written.contains(&Some(Landed::Short)) {
        let landed: usize = (0..r.written.len())
            .map(|i| match r.written[i] {
                Some(Landed::Short) => tokens_in_page(r.tokens, i) - 1,
                Some(Landed::Good) | Some(Landed::Foreign) | None => tokens_in_page(r.tokens, i),
            })
            .sum();
        return Err(format!("TokenCount {landed}"));
    }
    Ok(())
}

pub struct PoolModel;

fn write_kind() -> impl Strategy<Value = WriteKind> {
    prop_oneof![
        8 => Just(WriteKind::Good),
        1 => Just(WriteKind::Short),
        1 => Just(WriteKind::Foreign),
        1 => Just(WriteKind::WrongGen),
        1 => Just(WriteKind::BadChecksum),
        1 => Just(WriteKind::BadLength),
        1 => Just(WriteKind::TooManyTokens),
        1 => Just(WriteKind::WrongPage),
    ]
}

fn manifest_kind() -> impl Strategy<Value = ManifestKind> {
    prop_oneof![
        8 => Just(ManifestKind::Good),
        1 => Just(ManifestKind::ShortCount),
        1 => Just(ManifestKind::BadChecksum),
        1 => Just(ManifestKind::BadDigest),
        1 => Just(ManifestKind::WrongKey),
    ]
}

impl ReferenceStateMachine for PoolModel {
    type State = Model;
    type Transition = Transition;

    fn init_state() -> BoxedStrategy<Model> {
        (3usize..=8, any::<bool>(), any::<bool>())
            .prop_map(|(capacity, zero_on_release, revocation_drains)| Model {
                capacity,
                zero_on_release,
                revocation_drains,
                free: capacity,
                reserved: vec![],
                readable: vec![],
                revoked: vec![],
                retired: 0,
            })
            .boxed()
    }

    fn transitions(s: &Model) -> BoxedStrategy<Transition> {
        let max = s.cap_tokens() + PAGE_SIZE;
        let mut arms: Vec<(u32, BoxedStrategy<Transition>)> = vec![
            (
                3,
                (0..=max)
                    .prop_map(|tokens| Transition::Reserve { tokens })
                    .boxed(),
            ),
            (
                2,
                (0..=max)
                    .prop_map(|tokens| Transition::Allocate { tokens })
                    .boxed(),
            ),
            (1, Just(Transition::WriteUnknown).boxed()),
            (1, Just(Transition::Sweep).boxed()),
        ];
        if !s.reserved.is_empty() {
            arms.push((
                10,
                (any::<Index>(), any::<Index>(), write_kind())
                    .prop_map(|(res, page, kind)| Transition::Write { res, page, kind })
                    .boxed(),
            ));
            arms.push((
                3,
                (any::<Index>(), manifest_kind())
                    .prop_map(|(res, kind)| Transition::Commit { res, kind })
                    .boxed(),
            ));
            arms.push((
                1,
                (any::<Index>(), any::<bool>())
                    .prop_map(|(res, by_drop)| Transition::Abort { res, by_drop })
                    .boxed(),
            ));
            arms.push((
                1,
                any::<Index>()
                    .prop_map(|res| Transition::DrainLive { res })
                    .boxed(),
            ));
        }
        if !s.revoked.is_empty() {
            arms.push((
                2,
                (any::<Index>(), any::<Index>())
                    .prop_map(|(rev, page)| Transition::WriteRevoked { rev, page })
                    .boxed(),
            ));
            arms.push((
                2,
                any::<Index>()
                    .prop_map(|rev| Transition::Drain { rev })
                    .boxed(),
            ));
            arms.push((
                1,
                any::<Index>()
                    .prop_map(|rev| Transition::ReleaseQuarantined { rev })
                    .boxed(),
            ));
        }
        if s.retired > 0 {
            arms.push((
                1,
                (any::<Index>(), any::<Index>())
                    .prop_map(|(old, page)| Transition::WriteRetired { old, page })
                    .boxed(),
            ));
        }
        if !s.readable.is_empty() {
            arms.push((
                4,
                (any::<Index>(), any::<Index>(), 0..LAYERS)
                    .prop_map(|(rd, page, layer)| Transition::Read { rd, page, layer })
                    .boxed(),
            ));
            arms.push((
                1,
                (any::<Index>(), 1..=3 * PAGE_SIZE)
                    .prop_map(|(rd, extra)| Transition::Grow { rd, extra })
                    .boxed(),
            ));
            arms.push((
                2,
                (any::<Index>(), any::<bool>())
                    .prop_map(|(rd, publish)| Transition::DropReadable { rd, publish })
                    .boxed(),
            ));
        }
        Union::new_weighted(arms).boxed()
    }

    fn preconditions(s: &Model, t: &Transition) -> bool {
        match t {
            Transition::Reserve { .. }
            | Transition::Allocate { .. }
            | Transition::WriteUnknown
            | Transition::Sweep => true,
            Transition::Write { .. }
            | Transition::Commit { .. }
            | Transition::Abort { .. }
            | Transition::DrainLive { .. } => !s.reserved.is_empty(),
            Transition::WriteRevoked { .. }
            | Transition::Drain { .. }
            | Transition::ReleaseQuarantined { .. } => !s.revoked.is_empty(),
            Transition::WriteRetired { .. } => s.retired > 0,
            Transition::Read { .. } | Transition::Grow { .. } | Transition::DropReadable { .. } => {
                !s.readable.is_empty()
            }
        }
    }

    fn apply(mut s: Model, t: &Transition) -> Model {
        match t {
            Transition::Reserve { tokens } => {
                if let Ok(n) = s.alloc(*tokens) {
                    s.free -= n;
                    s.reserved.push(Res {
                        tokens: *tokens,
                        written: vec![None; n],
                        stream_ended: false,
                    });
                }
            }
            Transition::Allocate { tokens } => {
                if let Ok(n) = s.alloc(*tokens) {
                    s.free -= n;
                    s.readable.push(Read { pages: n });
                }
            }
            Transition::Write { res, page, kind } => {
                let n = s.reserved.len();
                let r = &mut s.reserved[res.index(n)];
                let p = page.index(r.written.len());
                if predict_write(r, p, *kind).is_ok() {
                    r.written[p] = Some(match kind {
                        WriteKind::Short => Landed::Short,
                        WriteKind::Foreign => Landed::Foreign,
                        _ => Landed::Good,
                    });
                }
            }
            Transition::Commit { res, kind } => {
                let r = s.reserved.remove(res.index(s.reserved.len()));
                match predict_commit(&r, *kind) {
                    Ok(()) => {
                        s.readable.push(Read {
                            pages: r.written.len(),
                        });
                        s.retired += 1;
                    }
                    Err(_) => s.end_without_commit(r),
                }
            }
            Transition::Abort { res, .. } => {
                let r = s.reserved.remove(res.index(s.reserved.len()));
                s.end_without_commit(r);
            }
            Transition::DrainLive { res } => {
                let n = s.reserved.len();
                s.reserved[res.index(n)].stream_ended = true;
            }
            Transition::Drain { rev } | Transition::ReleaseQuarantined { rev } => {
                let r = s.revoked.remove(rev.index(s.revoked.len()));
                s.free += r.pages;
                s.retired += 1;
            }
            Transition::Sweep => {
                for r in &mut s.revoked {
                    r.quarantined = true;
                }
            }
            Transition::Grow { rd, extra } => {
                let i = rd.index(s.readable.len());
                let have = s.readable[i].pages;
                let want = have * PAGE_SIZE + extra;
                if want <= s.cap_tokens() {
                    if let Ok(n) = s.alloc(want - have * PAGE_SIZE) {
                        s.free -= n;
                        s.readable[i].pages += n;
                    }
                }
            }
            Transition::DropReadable { rd, .. } => {
                let r = s.readable.remove(rd.index(s.readable.len()));
                s.free += r.pages;
            }
            Transition::WriteRevoked { .. }
            | Transition::WriteRetired { .. }
            | Transition::WriteUnknown
            | Transition::Read { .. } => {}
        }
        s
    }
}

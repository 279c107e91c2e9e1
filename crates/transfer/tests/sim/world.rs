//! The simulated world: a decode worker (real `KvPool`, real `ReceiverSession` per link), a
//! few prefill workers speaking the transfer protocol, a router that aborts and retries, and
//! seeded faults (delays, holds with late release, partitions, sender crashes, aborts at a
//! random step, reused request ids).
//!
//! Decode side of an attempt: `Reserved --commit ok--> Readable --read--> Ended`,
//! `Reserved --commit err | abort | timeout--> Ended`, `Readable --abort--> Ended`.
//! Sender side: `AwaitGrant -> Sending -> AwaitAck -> AwaitCommit -> Draining -> Done`, any
//! active state `--cancel--> Draining`, `--crash | partition--> Lost`.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pagewarden_kvcache::{
    CommitManifest, Defenses, GrantKey, KvLayout, KvPool, Owner, PoolConfig, ReadablePages,
    RequestId, ReservedPages, TenantId,
};
use pagewarden_transfer::frame::{decode_from, encode, BatchId, Frame, WriteFrame};
use pagewarden_transfer::receiver::{CloseReason, ReceiverCounters, ReceiverSession};
use pagewarden_transfer::types::page_checksum;
use pagewarden_transfer::{ManifestBuilder, PageSink};

use super::net::{Link, LinkState};
use super::rng::Rng;

mod decode;
mod prefill;

/// What to simulate.
#[derive(Clone, Copy, Debug)]
pub struct SimConfig {
    /// Grant fencing and drain-before-free on (production) or off (Mooncake-like).
    pub fencing: bool,
    /// The pool's per-write grant check. Off (with `fencing` on) models one-sided, RDMA-like
    /// writes that only the drain protocol (drain-before-free, quarantine) protects.
    pub pool_grant_check: bool,
    /// Client requests per run.
    pub requests: usize,
    /// Pages in the decode pool.
    pub pages: usize,
    /// Prefill workers.
    pub workers: usize,
}

impl SimConfig {
    /// The production protocol.
    pub fn fenced() -> Self {
        Self {
            fencing: true,
            pool_grant_check: true,
            requests: 8,
            pages: 6,
            workers: 2,
        }
    }
}

/// Result of one seed.
#[derive(Debug, Default)]
pub struct Outcome {
    /// Hash of every event and its result.
    pub trace_hash: u64,
    /// Reads that returned bytes not written for the reader.
    pub violations: Vec<String>,
    /// Reservations or pages that never reached a terminal state.
    pub hung: Vec<String>,
    /// Commits that succeeded.
    pub committed: u32,
    /// Frames the receiver dropped (I5).
    pub dropped_frames: u64,
    /// Manifests dropped because they named another attempt's grant.
    pub stale_manifests: u32,
    /// Event log, when asked for.
    pub trace: Vec<String>,
}

enum DecodeSt {
    Reserved(ReservedPages),
    Readable(ReadablePages),
    Ended(&'static str),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SendSt {
    AwaitGrant,
    Sending { next: usize },
    AwaitAck,
    AwaitCommit,
    Draining,
    Done,
    Lost,
}

struct Attempt {
    req: usize,
    no: u32,
    rid: RequestId,
    worker: usize,
    key: GrantKey,
    pages: Vec<(pagewarden_kvcache::PageId, pagewarden_kvcache::Generation)>,
    tokens_in: Vec<usize>,
    decode: DecodeSt,
    send: SendSt,
    link: Option<usize>,
    manifest: ManifestBuilder,
}

struct Worker {
    up: bool,
    epoch: u32,
    link: Option<usize>,
}

#[derive(Debug)]
enum Ev {
    Start {
        req: usize,
        no: u32,
        tries: u32,
    },
    GrantArrives {
        att: usize,
    },
    SendPage {
        att: usize,
        epoch: u32,
    },
    Deliver {
        link: usize,
    },
    Reply {
        link: usize,
        bytes: Vec<u8>,
    },
    Manifest {
        rid: RequestId,
        from: usize,
        m: CommitManifest,
    },
    CommitResult {
        att: usize,
    },
    Cancel {
        att: usize,
    },
    Abort {
        att: usize,
        why: &'static str,
    },
    Read {
        att: usize,
    },
    Crash {
        worker: usize,
    },
    Restart {
        worker: usize,
    },
    Partition {
        worker: usize,
    },
    LinkClose {
        link: usize,
    },
}

impl Ev {
    /// A label without grant keys (they are random, so they must stay out of the trace).
    fn label(&self) -> String {
        match self {
            Ev::Reply { link, bytes } => format!("Reply link={link} len={}", bytes.len()),
            Ev::Manifest { from, m, .. } => {
                format!("Manifest from={from} tokens={}", m.tokens_written)
            }
            other => format!("{other:?}"),
        }
    }
}

/// Bytes that request `req`, attempt `no` writes into its page `idx`.
pub fn fill(req: usize, no: u32, idx: usize, len: usize) -> Vec<u8> {
    let mut r = Rng::new(((req as u64) << 40) | (u64::from(no) << 20) | idx as u64);
    (0..len).map(|_| r.next_u64() as u8).collect()
}

struct World {
    cfg: SimConfig,
    rng: Rng,
    now: u64,
    seq: u64,
    queue: BTreeMap<(u64, u64), Ev>,
    pool: KvPool,
    sink: Arc<dyn PageSink>,
    counters: Arc<ReceiverCounters>,
    reqs: Vec<RequestId>,
    tokens: Vec<usize>,
    attempts: Vec<Attempt>,
    latest: HashMap<RequestId, usize>,
    by_key: HashMap<GrantKey, usize>,
    workers: Vec<Worker>,
    links: Vec<Link>,
    hasher: DefaultHasher,
    out: Outcome,
    verbose: bool,
}

const LAYOUT: KvLayout = KvLayout {
    layers: 1,
    kv_heads: 1,
    head_dim: 4,
    page_size: 2,
};

/// Runs one seed.
pub fn run(seed: u64, cfg: SimConfig, verbose: bool) -> Outcome {
    let mut pc = PoolConfig::with_pages(LAYOUT, cfg.pages);
    pc.defenses = Defenses {
        grant_fencing: cfg.fencing && cfg.pool_grant_check,
        ..Defenses::default()
    };
    let pool = KvPool::new(pc);
    let mut rng = Rng::new(seed);
    let mut reqs: Vec<RequestId> = Vec::new();
    for i in 0..cfg.requests {
        // Reused request ids: some requests share an earlier request's id.
        let rid = if i > 0 && rng.chance(25) {
            reqs[rng.range(0, i as u64 - 1) as usize]
        } else {
            RequestId([i as u8; 16])
        };
        reqs.push(rid);
    }
    let tokens = (0..cfg.requests)
        .map(|_| rng.range(1, 6) as usize)
        .collect();
    let mut w = World {
        cfg,
        rng,
        now: 0,
        seq: 0,
        queue: BTreeMap::new(),
        sink: Arc::new(pool.clone()),
        pool,
        counters: Arc::default(),
        reqs,
        tokens,
        attempts: Vec::new(),
        latest: HashMap::new(),
        by_key: HashMap::new(),
        workers: (0..cfg.workers)
            .map(|_| Worker {
                up: true,
                epoch: 0,
                link: None,
            })
            .collect(),
        links: Vec::new(),
        hasher: DefaultHasher::new(),
        out: Outcome::default(),
        verbose,
    };
    for req in 0..cfg.requests {
        let at = w.rng.range(0, 200);
        w.at(
            at,
            Ev::Start {
                req,
                no: 0,
                tries: 0,
            },
        );
    }
    for worker in 0..cfg.workers {
        if w.rng.chance(15) {
            let at = w.rng.range(0, 800);
            w.at(at, Ev::Crash { worker });
        }
        if w.rng.chance(15) {
            let at = w.rng.range(0, 800);
            w.at(at, Ev::Partition { worker });
        }
    }
    while let Some(((t, _), ev)) = w.queue.pop_first() {
        w.now = t;
        let label = ev.label();
        let result = w.step(ev);
        w.log(format!("{t} {label} -> {result}"));
    }
    w.finish();
    w.out
}

impl World {
    fn at(&mut self, t: u64, ev: Ev) {
        self.seq += 1;
        self.queue.insert((t, self.seq), ev);
    }

    fn after(&mut self, lo: u64, hi: u64, ev: Ev) {
        let t = self.now + self.rng.range(lo, hi);
        self.at(t, ev);
    }

    fn log(&mut self, line: String) {
        self.hasher.write(line.as_bytes());
        if self.verbose {
            self.out.trace.push(line);
        }
    }

    fn step(&mut self, ev: Ev) -> String {
        match ev {
            Ev::Start { req, no, tries } => self.start(req, no, tries),
            Ev::GrantArrives { att } => self.grant_arrives(att),
            Ev::SendPage { att, epoch } => self.send_page(att, epoch),
            Ev::Deliver { link } => self.deliver(link),
            Ev::Reply { link, bytes } => self.reply(link, &bytes),
            Ev::Manifest { rid, from: _, m } => self.manifest(rid, &m),
            Ev::CommitResult { att } => {
                if self.attempts[att].send == SendSt::AwaitCommit {
                    self.send_drain(att)
                } else {
                    "ignored".into()
                }
            }
            Ev::Cancel { att } => match self.attempts[att].send {
                SendSt::AwaitGrant
                | SendSt::Sending { .. }
                | SendSt::AwaitAck
                | SendSt::AwaitCommit => self.send_drain(att),
                SendSt::Draining | SendSt::Done | SendSt::Lost => "nothing to cancel".into(),
            },
            Ev::Abort { att, why } => self.abort(att, why),
            Ev::Read { att } => self.read(att),
            Ev::Crash { worker } => self.crash(worker),
            Ev::Restart { worker } => {
                self.workers[worker].up = true;
                "up".into()
            }
            Ev::Partition { worker } => self.partition(worker),
            Ev::LinkClose { link } => {
                self.links[link].close(CloseReason::PeerClosed);
                "closed".into()
            }
        }
    }
}

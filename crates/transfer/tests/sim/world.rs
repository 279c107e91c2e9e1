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

/// What to simulate.
#[derive(Clone, Copy, Debug)]
pub struct SimConfig {
    /// Grant fencing and drain-before-free on (production) or off (Mooncake-like).
    pub fencing: bool,
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
        grant_fencing: cfg.fencing,
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

    fn start(&mut self, req: usize, no: u32, tries: u32) -> String {
        let rid = self.reqs[req];
        let owner = Owner {
            request: rid,
            tenant: TenantId::new(format!("tenant-{req}")),
        };
        let res = match self.pool.reserve(owner, self.tokens[req]) {
            Ok(r) => r,
            Err(pagewarden_kvcache::ReserveError::Exhausted { .. }) if tries < 30 => {
                self.after(
                    10,
                    40,
                    Ev::Start {
                        req,
                        no,
                        tries: tries + 1,
                    },
                );
                return "exhausted, retry later".into();
            }
            Err(e) => return format!("gave up: {e}"),
        };
        let g = res.grant().clone();
        let att = self.attempts.len();
        let worker = self.rng.range(0, self.cfg.workers as u64 - 1) as usize;
        self.attempts.push(Attempt {
            req,
            no,
            rid,
            worker,
            key: g.key,
            tokens_in: (0..g.pages.len()).map(|i| g.tokens_in_page(i)).collect(),
            pages: g.pages.clone(),
            decode: DecodeSt::Reserved(res),
            send: SendSt::AwaitGrant,
            link: None,
            manifest: ManifestBuilder::new(g.key),
        });
        self.latest.insert(rid, att);
        self.by_key.insert(g.key, att);
        self.after(1, 10, Ev::GrantArrives { att });
        self.at(
            self.now + 600,
            Ev::Abort {
                att,
                why: "commit timeout",
            },
        );
        if self.rng.chance(30) {
            self.after(
                0,
                300,
                Ev::Abort {
                    att,
                    why: "client abort",
                },
            );
        }
        let pages: Vec<u32> = g.pages.iter().map(|(p, _)| p.0).collect();
        format!("att {att} reserved {pages:?} worker {worker}")
    }

    /// The worker's live link, opening a new one if it has none.
    fn link_of(&mut self, worker: usize) -> usize {
        if let Some(l) = self.workers[worker].link {
            if self.links[l].state == LinkState::Up {
                return l;
            }
        }
        let session = ReceiverSession::new(self.sink.clone(), self.counters.clone());
        self.links.push(Link::new(session));
        let l = self.links.len() - 1;
        self.workers[worker].link = Some(l);
        l
    }

    fn push_frame(&mut self, link: usize, f: &Frame<'_>) {
        let mut bytes = Vec::new();
        encode(&mut bytes, f);
        let hold = 6;
        let at = self.links[link].send(self.now, bytes, &mut self.rng, hold);
        self.at(at, Ev::Deliver { link });
    }

    fn grant_arrives(&mut self, att: usize) -> String {
        if self.attempts[att].send != SendSt::AwaitGrant {
            return "stale grant".into();
        }
        let worker = self.attempts[att].worker;
        if !self.workers[worker].up {
            self.attempts[att].send = SendSt::Lost;
            return "worker down".into();
        }
        let link = self.link_of(worker);
        let a = &mut self.attempts[att];
        a.link = Some(link);
        a.send = SendSt::Sending { next: 0 };
        let epoch = self.workers[worker].epoch;
        self.after(1, 5, Ev::SendPage { att, epoch });
        format!("sending on link {link}")
    }

    fn send_page(&mut self, att: usize, epoch: u32) -> String {
        let a = &self.attempts[att];
        let SendSt::Sending { next } = a.send else {
            return "not sending".into();
        };
        let link = a.link.expect("sending attempts have a link");
        if self.workers[a.worker].epoch != epoch || self.links[link].state != LinkState::Up {
            return "sender gone".into();
        }
        let data = fill(a.req, a.no, next, LAYOUT.page_bytes());
        let checksum = page_checksum(&data);
        let (page, generation) = a.pages[next];
        let (key, tokens, n) = (a.key, a.tokens_in[next], a.pages.len());
        let batch = BatchId(att as u64 + 1);
        let f = Frame::Write(WriteFrame {
            key,
            batch,
            page,
            generation,
            tokens: tokens as u32,
            checksum,
            data: &data,
        });
        self.push_frame(link, &f);
        let a = &mut self.attempts[att];
        a.manifest.add_page(checksum, tokens);
        if next + 1 == n {
            a.send = SendSt::AwaitAck;
            let end = Frame::BatchEnd {
                key,
                batch,
                pages: n as u32,
            };
            self.push_frame(link, &end);
        } else {
            a.send = SendSt::Sending { next: next + 1 };
            self.after(1, 8, Ev::SendPage { att, epoch });
        }
        format!("sent page {next}")
    }

    fn send_drain(&mut self, att: usize) -> String {
        let worker = self.attempts[att].worker;
        if !self.workers[worker].up {
            self.attempts[att].send = SendSt::Lost;
            return "worker down, no drain".into();
        }
        let link = self.link_of(worker);
        let key = self.attempts[att].key;
        self.push_frame(link, &Frame::Drain(key));
        self.attempts[att].send = SendSt::Draining;
        format!("drain on link {link}")
    }

    fn deliver(&mut self, link: usize) -> String {
        let l = &mut self.links[link];
        if l.state == LinkState::Broken {
            return "link broken".into();
        }
        let Some((at, bytes)) = l.queue.pop_front() else {
            return "nothing queued".into();
        };
        assert!(at <= self.now, "link delivered out of order");
        let session = l.session.as_mut().expect("open link has a session");
        let before = self.counters.snapshot();
        let res = match decode_from(&bytes, session.max_payload()) {
            Ok(Some((f, _))) => session.on_frame(f),
            Ok(None) => panic!("sim frames are whole"),
            Err(e) => Err(e),
        };
        let after = self.counters.snapshot();
        self.out.dropped_frames += after.dropped_total() - before.dropped_total();
        match res {
            Ok(Some(reply)) => {
                let mut out = Vec::new();
                encode(&mut out, &reply);
                self.after(1, 6, Ev::Reply { link, bytes: out });
                "processed, reply".into()
            }
            Ok(None) => format!(
                "processed ok={} dropped={}",
                after.frames_ok - before.frames_ok,
                after.dropped_total() - before.dropped_total()
            ),
            Err(e) => {
                self.out
                    .violations
                    .push(format!("malformed frame in sim: {e}"));
                self.links[link].close(CloseReason::Malformed(e));
                "malformed".into()
            }
        }
    }

    fn reply(&mut self, link: usize, bytes: &[u8]) -> String {
        if self.links[link].state != LinkState::Up {
            return "reply lost".into();
        }
        match decode_from(bytes, 64) {
            Ok(Some((Frame::BatchAck(a), _))) => {
                let att = a.batch.0 as usize - 1;
                let at = &self.attempts[att];
                if at.send != SendSt::AwaitAck {
                    return "late batch ack".into();
                }
                if a.rejected == 0 && a.written as usize == at.pages.len() {
                    let m = at.manifest.build();
                    let rid = at.rid;
                    self.attempts[att].send = SendSt::AwaitCommit;
                    self.after(1, 10, Ev::Manifest { rid, from: att, m });
                    "batch complete, manifest sent".into()
                } else {
                    let r = format!("batch rejected {} ({:?})", a.rejected, a.first_reject);
                    self.send_drain(att);
                    r
                }
            }
            Ok(Some((Frame::DrainAck(k), _))) => {
                let att = self.by_key[&k];
                if self.attempts[att].send == SendSt::Draining {
                    self.attempts[att].send = SendSt::Done;
                }
                format!("drain ack att {att}")
            }
            other => panic!("unexpected reply {other:?}"),
        }
    }

    fn manifest(&mut self, rid: RequestId, m: &CommitManifest) -> String {
        // Decode routes a manifest by request id; a reused id can name another attempt.
        let att = self.latest[&rid];
        if self.attempts[att].key != m.key {
            self.out.stale_manifests += 1;
            return "stale manifest dropped".into();
        }
        let DecodeSt::Reserved(_) = self.attempts[att].decode else {
            return "attempt no longer reserved".into();
        };
        let DecodeSt::Reserved(res) = std::mem::replace(
            &mut self.attempts[att].decode,
            DecodeSt::Ended("committing"),
        ) else {
            unreachable!("checked above")
        };
        let r = match res.commit(m) {
            Ok(readable) => {
                self.out.committed += 1;
                self.attempts[att].decode = DecodeSt::Readable(readable);
                self.after(1, 150, Ev::Read { att });
                "committed".into()
            }
            Err(e) => {
                self.attempts[att].decode = DecodeSt::Ended("commit failed");
                if !self.cfg.fencing {
                    self.pool.mark_drained(m.key);
                }
                format!("commit failed: {e}")
            }
        };
        self.after(1, 10, Ev::CommitResult { att });
        r
    }

    fn abort(&mut self, att: usize, why: &'static str) -> String {
        let a = &mut self.attempts[att];
        let (req, no) = (a.req, a.no);
        match std::mem::replace(&mut a.decode, DecodeSt::Ended(why)) {
            DecodeSt::Reserved(res) => {
                let key = res.grant().key;
                res.abort();
                if !self.cfg.fencing {
                    // Unfenced: pages go back at once, whatever is still in flight.
                    self.pool.mark_drained(key);
                }
                self.after(1, 10, Ev::Cancel { att });
                if no < 2 && self.rng.chance(60) {
                    self.after(
                        5,
                        50,
                        Ev::Start {
                            req,
                            no: no + 1,
                            tries: 0,
                        },
                    );
                }
                format!("{why}: revoked")
            }
            DecodeSt::Readable(r) => {
                drop(r);
                format!("{why}: released readable")
            }
            DecodeSt::Ended(e) => {
                self.attempts[att].decode = DecodeSt::Ended(e);
                "already ended".into()
            }
        }
    }

    fn read(&mut self, att: usize) -> String {
        let a = &mut self.attempts[att];
        let DecodeSt::Readable(r) = std::mem::replace(&mut a.decode, DecodeSt::Ended("read"))
        else {
            return "not readable".into();
        };
        let mut bad = 0;
        for i in 0..r.table().len() {
            match r.page_bytes(i) {
                Ok(b) => {
                    if b != fill(a.req, a.no, i, b.len()).as_slice() {
                        bad += 1;
                    }
                }
                Err(e) => {
                    self.out
                        .violations
                        .push(format!("att {att}: committed page {i} unreadable: {e}"));
                }
            }
        }
        if bad > 0 {
            self.out.violations.push(format!(
                "att {att} (request {} attempt {}): {bad} page(s) hold bytes not written for it",
                a.req, a.no
            ));
        }
        format!("read, {bad} bad pages")
    }

    fn lose_attempts_on(&mut self, worker: usize, link: Option<usize>) {
        for a in &mut self.attempts {
            let on = a.worker == worker && (link.is_none() || a.link == link);
            match a.send {
                SendSt::Sending { .. }
                | SendSt::AwaitAck
                | SendSt::AwaitCommit
                | SendSt::Draining
                    if on =>
                {
                    a.send = SendSt::Lost;
                }
                SendSt::AwaitGrant
                | SendSt::Sending { .. }
                | SendSt::AwaitAck
                | SendSt::AwaitCommit
                | SendSt::Draining
                | SendSt::Done
                | SendSt::Lost => {}
            }
        }
    }

    fn crash(&mut self, worker: usize) -> String {
        if !self.workers[worker].up {
            return "already down".into();
        }
        let w = &mut self.workers[worker];
        w.up = false;
        w.epoch += 1;
        if let Some(l) = w.link.take() {
            if self.links[l].state == LinkState::Up {
                // Bytes already sent still arrive, then the receiver sees the close.
                self.links[l].state = LinkState::Closing;
                let last = self.links[l].queue.back().map_or(self.now, |(t, _)| *t);
                self.at(last.max(self.now) + 1, Ev::LinkClose { link: l });
            }
        }
        self.lose_attempts_on(worker, None);
        self.after(30, 150, Ev::Restart { worker });
        "crashed".into()
    }

    fn partition(&mut self, worker: usize) -> String {
        let Some(l) = self.workers[worker].link.take() else {
            return "no link".into();
        };
        if self.links[l].state != LinkState::Up {
            return "link not up".into();
        }
        self.links[l].close(CloseReason::Transport("partition".into()));
        self.lose_attempts_on(worker, Some(l));
        format!("link {l} broken")
    }

    fn finish(&mut self) {
        for l in &mut self.links {
            if l.state != LinkState::Broken {
                l.close(CloseReason::Shutdown);
            }
        }
        for (i, a) in self.attempts.iter().enumerate() {
            match &a.decode {
                DecodeSt::Reserved(_) => self.out.hung.push(format!("att {i} still reserved")),
                DecodeSt::Readable(_) => self.out.hung.push(format!("att {i} never read")),
                DecodeSt::Ended(_) => {}
            }
        }
        self.attempts.clear();
        self.pool
            .sweep_expired(Instant::now() + Duration::from_secs(3600));
        let s = self.pool.stats();
        if s.reserved + s.readable + s.draining != 0 || s.free + s.quarantined != self.cfg.pages {
            self.out.hung.push(format!("pool not settled: {s:?}"));
        }
        let line = format!("end {:?} committed={}", s, self.out.committed);
        self.log(line);
        self.out.trace_hash = self.hasher.finish();
    }
}

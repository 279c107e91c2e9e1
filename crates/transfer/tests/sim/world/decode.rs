//! Decode side of the simulation: reserve, commit on a manifest, abort (revoke + cancel, or
//! free at once when unfenced), read and check every page, and the end-of-run settlement.

use super::*;

impl World {
    pub(super) fn start(&mut self, req: usize, no: u32, tries: u32) -> String {
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
    pub(super) fn manifest(&mut self, rid: RequestId, m: &CommitManifest) -> String {
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

    pub(super) fn abort(&mut self, att: usize, why: &'static str) -> String {
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

    pub(super) fn read(&mut self, att: usize) -> String {
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

    pub(super) fn finish(&mut self) {
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

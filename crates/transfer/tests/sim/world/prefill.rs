//! Prefill side and the network: links, frames out, deliveries into the real receiver
//! session, acks back, drains, crashes and partitions.

use super::*;

impl World {
    pub(super) fn link_of(&mut self, worker: usize) -> usize {
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

    pub(super) fn push_frame(&mut self, link: usize, f: &Frame<'_>) {
        let mut bytes = Vec::new();
        encode(&mut bytes, f);
        let hold = 6;
        let at = self.links[link].send(self.now, bytes, &mut self.rng, hold);
        self.at(at, Ev::Deliver { link });
    }

    pub(super) fn grant_arrives(&mut self, att: usize) -> String {
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

    pub(super) fn send_page(&mut self, att: usize, epoch: u32) -> String {
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

    pub(super) fn send_drain(&mut self, att: usize) -> String {
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

    pub(super) fn deliver(&mut self, link: usize) -> String {
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

    pub(super) fn reply(&mut self, link: usize, bytes: &[u8]) -> String {
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

    pub(super) fn lose_attempts_on(&mut self, worker: usize, link: Option<usize>) {
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

    pub(super) fn crash(&mut self, worker: usize) -> String {
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

    pub(super) fn partition(&mut self, worker: usize) -> String {
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
}

//! An ordered, unreliable-in-time link: frames arrive in the order sent, each after a random
//! delay, sometimes held for a long time (everything behind waits: one TCP stream). A break
//! loses what is still queued.

use std::collections::VecDeque;

use pagewarden_transfer::receiver::{CloseReason, ReceiverSession};
use pagewarden_transfer::PageSink;

use super::rng::Rng;

/// Link life: `Up --break--> Broken`, `Up --sender crash--> Closing --queue empty--> Broken`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinkState {
    /// Carries frames both ways.
    Up,
    /// The sender is gone; queued frames still arrive, then the receiver sees the close.
    Closing,
    /// Torn down.
    Broken,
}

/// One connection from a prefill worker to the decode receiver.
pub struct Link {
    /// Life state.
    pub state: LinkState,
    /// Receiver side; `None` once closed.
    pub session: Option<ReceiverSession<dyn PageSink>>,
    /// Frames in flight, oldest first, with their arrival times.
    pub queue: VecDeque<(u64, Vec<u8>)>,
    last_arrival: u64,
}

impl Link {
    /// A fresh link whose receiver writes through `session`.
    pub fn new(session: ReceiverSession<dyn PageSink>) -> Self {
        Self {
            state: LinkState::Up,
            session: Some(session),
            queue: VecDeque::new(),
            last_arrival: 0,
        }
    }

    /// Queues a frame sent at `now`; returns when it arrives (never before an earlier frame).
    pub fn send(&mut self, now: u64, bytes: Vec<u8>, rng: &mut Rng, hold_percent: u64) -> u64 {
        let mut delay = rng.range(1, 6);
        if rng.chance(hold_percent) {
            delay += rng.range(100, 500);
        }
        let at = (now + delay).max(self.last_arrival);
        self.last_arrival = at;
        self.queue.push_back((at, bytes));
        at
    }

    /// Ends the receiver session (peer-gone for undrained grants).
    pub fn close(&mut self, reason: CloseReason) {
        self.state = LinkState::Broken;
        self.queue.clear();
        if let Some(s) = self.session.take() {
            s.close(&reason);
        }
    }
}

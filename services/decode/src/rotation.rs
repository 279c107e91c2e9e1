//! The order in which committed sequences are stepped: first come, first served, and round
//! robin once there are more sequences than a batch holds. A step takes the first `max`
//! runnable sequences from the front; those go to the back, the others keep their places, so
//! every sequence is stepped at least once every `ceil(n / max)` steps and none waits for
//! another to finish.

use std::collections::VecDeque;

use pagewarden_common::RequestId;

/// What a sequence in the rotation can do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// Running: may be stepped.
    Ready,
    /// Still live but not steppable now: keeps its place.
    Busy,
    /// Over: leaves the rotation.
    Gone,
}

/// Committed sequences in stepping order (front first).
#[derive(Debug, Default)]
pub struct Rotation {
    order: VecDeque<RequestId>,
}

impl Rotation {
    /// A newly committed sequence joins at the back.
    pub fn push(&mut self, req: RequestId) {
        self.order.push_back(req);
    }

    /// Up to `max` ready sequences from the front; they move to the back. `turn` is asked
    /// once per sequence (and may take it: the scheduler moves it to the model thread).
    pub fn next_batch(
        &mut self,
        max: usize,
        mut turn: impl FnMut(RequestId, bool) -> Turn,
    ) -> Vec<RequestId> {
        let mut picked = Vec::new();
        let mut kept = VecDeque::with_capacity(self.order.len());
        while let Some(req) = self.order.pop_front() {
            let room = picked.len() < max;
            match turn(req, room) {
                Turn::Ready if room => picked.push(req),
                Turn::Ready | Turn::Busy => kept.push_back(req),
                Turn::Gone => {}
            }
        }
        kept.extend(picked.iter().copied());
        self.order = kept;
        picked
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn more_sequences_than_the_batch_take_turns() {
        let ids: Vec<RequestId> = (0..5).map(|_| RequestId::random()).collect();
        let mut r = Rotation::default();
        for id in &ids {
            r.push(*id);
        }
        let mut last_stepped = vec![0usize; ids.len()];
        let mut steps = vec![0usize; ids.len()];
        for step in 1..=20 {
            let batch = r.next_batch(2, |_, _| Turn::Ready);
            assert_eq!(batch.len(), 2);
            for id in batch {
                let i = ids.iter().position(|x| *x == id).unwrap();
                steps[i] += 1;
                last_stepped[i] = step;
            }
            for (i, &last) in last_stepped.iter().enumerate() {
                assert!(
                    step - last <= 3,
                    "sequence {i} waited {} steps (batch 2 of 5: at most 3)",
                    step - last
                );
            }
        }
        assert_eq!(steps, vec![8; 5], "every sequence got the same share");
    }

    #[test]
    fn finished_sequences_leave_and_busy_ones_keep_their_place() {
        let ids: Vec<RequestId> = (0..3).map(|_| RequestId::random()).collect();
        let mut r = Rotation::default();
        for id in &ids {
            r.push(*id);
        }
        let batch = r.next_batch(8, |id, _| {
            if id == ids[0] {
                Turn::Gone
            } else if id == ids[1] {
                Turn::Busy
            } else {
                Turn::Ready
            }
        });
        assert_eq!(batch, vec![ids[2]]);
        let batch = r.next_batch(8, |_, _| Turn::Ready);
        assert_eq!(
            batch,
            vec![ids[1], ids[2]],
            "the first one left the rotation"
        );
    }
}

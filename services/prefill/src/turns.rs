//! `Turns`: the engine computes one chunk at a time. Jobs waiting for it are served round robin
//! across tenants and FIFO within one ([`FairQueue`]), so a tenant with many long prompts in
//! flight gets one chunk in turn with each other tenant, not one per prompt, and no chunks of
//! two jobs oversubscribe the cores together.
//!
//! One exception keeps a short prompt from waiting for a long one's pass: a job whose whole
//! remaining prompt fits one short pass, of a tenant with nothing else at the engine (neither
//! holding the turn nor waiting for it), overtakes ([`Turns::overtake`]): its pass runs at once
//! as urgent work, and the pass under way pauses between its parallel regions until it is done
//! (`Compute::urgent`). One overtake at a time; a tenant's second job waits for its turn, so a
//! tenant cannot keep the turn's holder paused with a flood of short prompts.
//!
//! ```text
//! take ──idle──▶ Turn ──drop: hand to the next waiter (or idle)──▶ …
//!   └──busy──▶ waiting in the fair queue ──handed the turn──▶ Turn
//!                  └── dropped while waiting: leaves; a turn handed meanwhile is passed on
//! overtake ──busy, another tenant holds it, no overtake, this tenant idle here──▶ Overtake
//! ```

use pagewarden_common::TenantId;
use pagewarden_worker::FairQueue;
use parking_lot::Mutex;
use tokio::sync::oneshot;

/// The engine's turn, one holder at a time.
#[derive(Default)]
pub struct Turns {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    /// The tenant whose job holds the turn; `None`: the engine is idle.
    holder: Option<TenantId>,
    /// Whether a short pass is overtaking the holder now.
    overtaking: bool,
    waiting: FairQueue<(TenantId, oneshot::Sender<()>)>,
}

/// The turn, held until dropped.
pub struct Turn<'a> {
    turns: &'a Turns,
}

/// A short pass's leave to run beside the turn's holder, held until dropped.
pub struct Overtake<'a> {
    turns: &'a Turns,
}

impl Turns {
    /// Waits for the turn, in `tenant`'s place in the rotation (up to `weight` turns in a row
    /// while others wait).
    pub async fn take(&self, tenant: &TenantId, weight: u32) -> Turn<'_> {
        let rx = {
            let mut inner = self.inner.lock();
            if inner.holder.is_none() {
                inner.holder = Some(tenant.clone());
                return Turn { turns: self };
            }
            let (tx, rx) = oneshot::channel();
            inner.waiting.push(tenant, weight, (tenant.clone(), tx));
            rx
        };
        let mut waiting = Waiting {
            turns: self,
            rx: Some(rx),
        };
        if let Some(rx) = waiting.rx.as_mut() {
            // The sender lives in the queue until it hands the turn over; `Turns` outlives us.
            let _ = rx.await;
        }
        waiting.rx = None;
        Turn { turns: self }
    }

    /// Leave for a short pass of `tenant` to run now, beside the turn's holder, when another
    /// tenant holds the turn, no other pass overtakes, and `tenant` neither holds the turn nor
    /// waits for it (module doc). `None`: take the turn instead.
    pub fn overtake(&self, tenant: &TenantId) -> Option<Overtake<'_>> {
        let mut inner = self.inner.lock();
        let held_by_another = inner.holder.as_ref().is_some_and(|h| h != tenant);
        if !held_by_another || inner.overtaking || inner.waiting.waits(tenant) {
            return None;
        }
        inner.overtaking = true;
        Some(Overtake { turns: self })
    }

    /// Whether a job of a tenant other than `tenant` waits for the turn (the holder, of
    /// `tenant`, then ends its turn early: see `job.rs`).
    pub fn contended(&self, tenant: &TenantId) -> bool {
        self.inner.lock().waiting.waits_besides(tenant)
    }

    /// Hands the turn to the next waiter still waiting, or marks the engine idle.
    fn pass_on(&self) {
        let mut inner = self.inner.lock();
        while let Some((tenant, tx)) = inner.waiting.pop() {
            if tx.send(()).is_ok() {
                inner.holder = Some(tenant);
                return;
            }
        }
        inner.holder = None;
    }
}

impl Drop for Turn<'_> {
    fn drop(&mut self) {
        self.turns.pass_on();
    }
}

impl Drop for Overtake<'_> {
    fn drop(&mut self) {
        self.turns.inner.lock().overtaking = false;
    }
}

/// A wait in progress; dropped early (the job was cancelled), it leaves the queue, and passes
/// on a turn that was handed to it meanwhile.
struct Waiting<'a> {
    turns: &'a Turns,
    rx: Option<oneshot::Receiver<()>>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        if let Some(mut rx) = self.rx.take() {
            rx.close();
            if rx.try_recv().is_ok() {
                self.turns.pass_on();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    //! On the paused clock: each short sleep lets the spawned waiters reach their place in
    //! the line, with no real time spent.
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    fn t(name: &str) -> TenantId {
        TenantId::new(name)
    }

    /// Each waiter records its name when it gets the turn, then lets it go.
    async fn order(turns: Arc<Turns>, waiters: &[(&str, &str)]) -> Vec<String> {
        let first = turns.take(&t("holder"), 1).await;
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        for &(tenant, name) in waiters {
            let (turns, log, name) = (turns.clone(), log.clone(), name.to_string());
            let tenant = t(tenant);
            tasks.push(tokio::spawn(async move {
                let _turn = turns.take(&tenant, 1).await;
                log.lock().push(name);
            }));
            // Queue them in this order.
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(first);
        for task in tasks {
            task.await.unwrap();
        }
        let out = log.lock().clone();
        out
    }

    #[tokio::test(start_paused = true)]
    async fn tenants_take_turns_and_each_is_fifo() {
        let got = order(
            Arc::new(Turns::default()),
            &[
                ("a", "a1"),
                ("a", "a2"),
                ("a", "a3"),
                ("b", "b1"),
                ("b", "b2"),
            ],
        )
        .await;
        assert_eq!(got, ["a1", "b1", "a2", "b2", "a3"]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_turn_is_contended_only_by_another_tenants_waiter() {
        let turns = Arc::new(Turns::default());
        let held = turns.take(&t("a"), 1).await;
        assert!(!turns.contended(&t("a")));
        let waiter = |tenant: &'static str| {
            let turns = turns.clone();
            tokio::spawn(async move {
                let _t = turns.take(&t(tenant), 1).await;
            })
        };
        let a2 = waiter("a");
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(!turns.contended(&t("a")), "a's own job ends a's turn early");
        let b = waiter("b");
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(turns.contended(&t("a")));
        drop(held);
        b.await.unwrap();
        a2.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn only_an_idle_tenants_job_overtakes_and_one_at_a_time() {
        let turns = Arc::new(Turns::default());
        assert!(
            turns.overtake(&t("b")).is_none(),
            "an idle engine is taken, not overtaken"
        );
        let held = turns.take(&t("a"), 1).await;
        assert!(
            turns.overtake(&t("a")).is_none(),
            "the holder's own tenant waits its turn"
        );
        let b = turns
            .overtake(&t("b"))
            .expect("b has nothing at the engine");
        assert!(turns.overtake(&t("c")).is_none(), "one overtake at a time");
        drop(b);
        // A tenant with a job waiting for the turn does not overtake with another.
        let c_waits = {
            let turns = turns.clone();
            tokio::spawn(async move {
                let _t = turns.take(&t("c"), 1).await;
            })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        assert!(turns.overtake(&t("c")).is_none());
        assert!(turns.overtake(&t("d")).is_some());
        drop(held);
        c_waits.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiter_that_leaves_does_not_keep_the_turn() {
        let turns = Arc::new(Turns::default());
        let held = turns.take(&t("a"), 1).await;
        let gone = {
            let turns = turns.clone();
            tokio::spawn(async move {
                let _t = turns.take(&t("b"), 1).await;
                unreachable!("aborted before its turn");
            })
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        gone.abort();
        let _ = gone.await;
        drop(held);
        // The engine is idle again: a new taker gets the turn at once.
        let next = tokio::time::timeout(Duration::from_secs(1), turns.take(&t("c"), 1)).await;
        assert!(next.is_ok(), "the turn was lost with the waiter that left");
    }
}

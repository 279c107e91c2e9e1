//! What Pagewarden's tests share: one way to wait for a condition instead of sleeping.
//!
//! A test that sleeps for a fixed time either waits longer than it needs or fails on a slow
//! machine. A test here instead names what it waits for and a generous bound: the helpers ask a
//! probe again and again until it answers, and a test that times out panics with what it waited
//! for and how long it waited.
//!
//! - [`eventually`] / [`eventually_blocking`]: wait for a probe, panic on timeout.
//! - [`poll_until`] / [`poll_until_blocking`]: the same wait, `None` on timeout, for a test
//!   whose assertion is about the timeout itself (a process that must *not* exit).
//!
//! The bound is a `Duration`, or a [`Polling`] that also says how often to ask.
//!
//! A probe answers with anything that is [`Ready`]: a `bool` (the condition holds), an
//! `Option<T>` (the value, once there is one) or a `Result<T, E>` whose error says what the
//! probe saw instead (the timeout's panic quotes the last one).
//!
//! The bound is measured on the wall clock, so a test that runs with `tokio::time::pause()`
//! still fails in real time; between two probes the async helpers sleep on tokio's clock, which
//! such a test advances at once.
#![warn(missing_docs)]

use std::future::Future;
use std::time::{Duration, Instant};

/// The first pause between two probes; it doubles up to [`MAX_INTERVAL`], so a condition that
/// holds quickly is seen quickly and a long wait does not load the machine.
const FIRST_INTERVAL: Duration = Duration::from_millis(1);

/// The longest pause between two probes: how late, at most, a condition is seen.
const MAX_INTERVAL: Duration = Duration::from_millis(20);

/// A probe's answer: whether the awaited condition holds, and what it yields when it does.
pub trait Ready {
    /// What a successful wait returns.
    type Output;

    /// The output once the condition holds; otherwise what the probe saw instead, when it
    /// says, for the timeout's message.
    fn ready(self) -> Result<Self::Output, Option<String>>;
}

impl Ready for bool {
    type Output = ();

    fn ready(self) -> Result<(), Option<String>> {
        if self {
            Ok(())
        } else {
            Err(None)
        }
    }
}

impl<T> Ready for Option<T> {
    type Output = T;

    fn ready(self) -> Result<T, Option<String>> {
        self.ok_or(None)
    }
}

/// `Err` says what the probe saw instead; a timeout's panic ends with the last one.
impl<T, E: std::fmt::Display> Ready for Result<T, E> {
    type Output = T;

    fn ready(self) -> Result<T, Option<String>> {
        self.map_err(|e| Some(e.to_string()))
    }
}

/// How long a wait may last and how often it asks. A bare `Duration` is a wait of that long
/// that asks at once, then again after pauses doubling from 1 ms to 20 ms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Polling {
    within: Duration,
    every: Option<Duration>,
}

impl Polling {
    /// A wait of at most `within` (on the wall clock).
    pub fn within(within: Duration) -> Self {
        Polling {
            within,
            every: None,
        }
    }

    /// The same wait, asking every `every` instead: slower for a probe that costs (a
    /// container's command, a browser's round trip), faster for a state that does not last.
    pub fn every(self, every: Duration) -> Self {
        Polling {
            every: Some(every),
            ..self
        }
    }
}

impl From<Duration> for Polling {
    fn from(within: Duration) -> Self {
        Polling::within(within)
    }
}

/// The pauses between probes, never past the deadline.
struct Backoff {
    start: Instant,
    polling: Polling,
    next: Duration,
}

impl Backoff {
    fn new(polling: Polling) -> Self {
        Backoff {
            start: Instant::now(),
            polling,
            next: polling.every.unwrap_or(FIRST_INTERVAL),
        }
    }

    /// The pause before the next probe; `None` once the deadline has passed.
    fn pause(&mut self) -> Option<Duration> {
        let left = self.polling.within.checked_sub(self.start.elapsed())?;
        let pause = self.next.min(left);
        let cap = self.polling.every.unwrap_or(MAX_INTERVAL);
        self.next = (self.next * 2).min(cap);
        Some(pause)
    }

    /// The panic of a wait that gave up; `last` is what the last probe saw, when it said.
    fn timed_out(&self, what: &str, last: Option<String>) -> ! {
        let last = last.map(|l| format!(": {l}")).unwrap_or_default();
        panic!(
            "timed out after {:.1?} (limit {:?}) waiting for {what}{last}",
            self.start.elapsed(),
            self.polling.within
        )
    }
}

/// Asks `probe` until it is ready; on timeout, the backoff and the last answer.
async fn wait<R, F, Fut>(
    polling: Polling,
    mut probe: F,
) -> Result<R::Output, (Backoff, Option<String>)>
where
    R: Ready,
    F: FnMut() -> Fut,
    Fut: Future<Output = R>,
{
    let mut backoff = Backoff::new(polling);
    loop {
        let last = match probe().await.ready() {
            Ok(v) => return Ok(v),
            Err(last) => last,
        };
        match backoff.pause() {
            // The one place async tests let time pass: what they wait for happens in another
            // task, thread or process, and this gives it the time to.
            Some(pause) => tokio::time::sleep(pause).await,
            None => return Err((backoff, last)),
        }
    }
}

/// [`wait`] for a test without an async runtime: the thread blocks between probes.
fn wait_blocking<R, F>(
    polling: Polling,
    mut probe: F,
) -> Result<R::Output, (Backoff, Option<String>)>
where
    R: Ready,
    F: FnMut() -> R,
{
    let mut backoff = Backoff::new(polling);
    loop {
        let last = match probe().ready() {
            Ok(v) => return Ok(v),
            Err(last) => last,
        };
        match backoff.pause() {
            // The one place blocking tests let time pass: what they wait for happens in
            // another thread or process, and this gives it the time to.
            Some(pause) => std::thread::sleep(pause),
            None => return Err((backoff, last)),
        }
    }
}

/// Asks `probe` until it is ready or `within` has passed on the wall clock; `None` on timeout.
/// The probe is asked at least once, the last time at the deadline.
pub async fn poll_until<R, F, Fut>(within: impl Into<Polling>, probe: F) -> Option<R::Output>
where
    R: Ready,
    F: FnMut() -> Fut,
    Fut: Future<Output = R>,
{
    wait(within.into(), probe).await.ok()
}

/// Asks `probe` until it is ready and returns what it yields; panics naming `what`, the time
/// waited and what the last probe saw when `within` passes first.
pub async fn eventually<R, F, Fut>(within: impl Into<Polling>, what: &str, probe: F) -> R::Output
where
    R: Ready,
    F: FnMut() -> Fut,
    Fut: Future<Output = R>,
{
    wait(within.into(), probe)
        .await
        .unwrap_or_else(|(backoff, last)| backoff.timed_out(what, last))
}

/// [`poll_until`] for a test without an async runtime: the thread blocks between probes.
pub fn poll_until_blocking<R, F>(within: impl Into<Polling>, probe: F) -> Option<R::Output>
where
    R: Ready,
    F: FnMut() -> R,
{
    wait_blocking(within.into(), probe).ok()
}

/// [`eventually`] for a test without an async runtime: the thread blocks between probes.
pub fn eventually_blocking<R, F>(within: impl Into<Polling>, what: &str, probe: F) -> R::Output
where
    R: Ready,
    F: FnMut() -> R,
{
    wait_blocking(within.into(), probe)
        .unwrap_or_else(|(backoff, last)| backoff.timed_out(what, last))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn eventually_returns_the_first_ready_value() {
        let asked = AtomicUsize::new(0);
        let got = eventually(Duration::from_secs(5), "the third probe", || async {
            let n = asked.fetch_add(1, Ordering::SeqCst) + 1;
            (n == 3).then_some(n)
        })
        .await;
        assert_eq!(got, 3);
    }

    #[tokio::test]
    #[should_panic(expected = "waiting for a condition that never holds")]
    async fn eventually_names_what_timed_out() {
        eventually(
            Duration::from_millis(30),
            "a condition that never holds",
            || async { false },
        )
        .await
    }

    #[tokio::test]
    async fn poll_until_asks_at_least_once_then_gives_up() {
        let asked = AtomicUsize::new(0);
        let got = poll_until(Duration::ZERO, || async {
            asked.fetch_add(1, Ordering::SeqCst);
            false
        })
        .await;
        assert_eq!(got, None);
        assert!(asked.load(Ordering::SeqCst) >= 1);
    }

    #[tokio::test(start_paused = true)]
    async fn a_paused_clock_advances_between_probes() {
        let start = tokio::time::Instant::now();
        eventually(Duration::from_secs(5), "a minute of tokio time", || async {
            start.elapsed() >= Duration::from_secs(60)
        })
        .await;
    }

    #[test]
    #[should_panic(expected = "waiting for the pool to empty: 3 pages in use")]
    fn a_timeout_quotes_what_the_last_probe_saw() {
        eventually_blocking(Duration::from_millis(10), "the pool to empty", || {
            Err::<(), _>("3 pages in use")
        })
    }

    #[test]
    fn polling_every_asks_at_that_pace() {
        let mut asked = 0;
        let got = poll_until_blocking(
            Polling::within(Duration::from_millis(250)).every(Duration::from_millis(100)),
            || {
                asked += 1;
                false
            },
        );
        assert_eq!(got, None);
        // At most at 0, 100 and 200 ms and once more at the deadline; a slow machine asks less.
        assert!((2..=4).contains(&asked), "asked {asked} times");
    }

    #[test]
    fn the_blocking_helpers_wait_for_another_thread() {
        let done = std::sync::Arc::new(AtomicUsize::new(0));
        let d = done.clone();
        std::thread::spawn(move || d.store(1, Ordering::SeqCst));
        eventually_blocking(Duration::from_secs(5), "the thread's store", || {
            done.load(Ordering::SeqCst) == 1
        });
        assert_eq!(
            poll_until_blocking(Duration::from_millis(10), || None::<()>),
            None
        );
    }
}

//! A persistent worker pool: the model owns one, every kernel that splits work takes it.
//!
//! A decode step opens about 150 parallel regions (five per layer), each a few tens of
//! microseconds of work. A fork/join pool whose workers sleep between regions pays a wake-up
//! (a futex round trip, worse under virtualization) per region, which is why decode gained
//! little from a second thread. Here, as in ggml's thread pool, the caller takes part in the
//! work and the workers spin on an epoch counter for a while after each region before they
//! park, so back-to-back regions start in well under a microsecond.
//!
//! Lifecycle of one region (`run`): the caller takes the dispatch lock, publishes the job (`n`
//! items, a share of consecutive ones per participant, see `Share`), opens the region and bumps the
//! epoch, claims items itself until none is left, closes the region, then waits until no worker is
//! inside. A worker enters only while the region is open (it counts itself in `active`, then
//! checks), so a worker that the OS did not schedule in time (an oversubscribed machine) is not
//! waited for: the caller has done its items. Only then does the borrowed closure go out of scope.
//! A panic in any item is caught, the region still completes, and the panic is resumed on the
//! caller.
//!
//! On an oversubscribed machine (more runnable threads than CPUs: other processes, the prefill
//! and decode workers side by side) a worker is often descheduled holding an item, and the
//! caller then waits out the worker's turn of the scheduler, milliseconds, for a region of a
//! few microseconds: two threads ran decode at half the speed of one. The caller notices such
//! a stall (it waited far longer than its own items took) and, when the stall follows another
//! within `RECUR` regions, runs the next regions alone, a window that doubles while stalls
//! recur and shrinks again while regions run clean, and that ends after `SOLO_TIME` in any case
//! (a long prefill's regions take milliseconds each). A lone stall opens no window: on a
//! virtual machine with nothing else to run, the hypervisor takes a vCPU for a moment now and
//! then, and a window per such hiccup ran a tenth of a decode alone.

use std::cell::Cell;
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_utils::CachePadded;

/// How long an idle worker spins before it parks (decode steps follow each other within this).
const SPIN: Duration = Duration::from_millis(2);

/// Regions run on the caller alone after a first recurring stall (about one decode step of a
/// small model), and the most after repeated ones.
const SOLO_BASE: usize = 256;
const SOLO_MAX: usize = 16 * 1024;
/// A window also ends after this long, whatever regions it has left: regions of a long
/// prompt's prefill take milliseconds, and 16,384 of them ran a 7,299-token prefill on one
/// thread for most of its 50 s (the worker thread got 2 s of CPU, or none).
const SOLO_TIME: Duration = Duration::from_millis(100);
/// A wait for workers counts as a stall when it is longer than this many of the caller's own
/// items, plus `STALL_SLACK`.
const STALL_ITEMS: u32 = 8;
const STALL_SLACK: Duration = Duration::from_micros(200);
/// A stall opens a window only when fewer than this many parallel regions ran clean since the
/// last one (half a decode step of a 1B model). Two threads decoding Llama 3.2 1B's shapes on an idle
/// Zen 4 (2 vCPUs) met 7-12 lone stalls in 256 tokens, each of which had cost a window of 256
/// regions run alone; an oversubscribed machine stalls region after region.
const RECUR: usize = 64;

/// How many threads a kernel may use. With one thread, work runs inline on the caller.
#[derive(Clone)]
pub struct Parallel {
    pool: Option<Arc<Pool>>,
    threads: usize,
}

impl std::fmt::Debug for Parallel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parallel")
            .field("threads", &self.threads)
            .finish()
    }
}

thread_local! {
    /// Set while this thread runs an item of a region: a nested region runs inline.
    static IN_REGION: Cell<bool> = const { Cell::new(false) };
    /// Set while this thread runs urgent work ([`Parallel::urgent`]).
    static URGENT: Cell<bool> = const { Cell::new(false) };
}

/// A type-erased `&dyn Fn(usize)` valid for one region.
#[derive(Clone, Copy)]
struct JobRef {
    f: *const (dyn Fn(usize) + Sync),
}

/// State shared by the caller and the workers. The counters that change within a region each
/// have their own cache line: sharing a claim line with the epoch that idle workers spin on,
/// or with `active`, which the caller spins on, cost a line transfer per item claimed.
struct Shared {
    /// Bumped (Release) when a job is published; `u64`-like wrap is harmless.
    epoch: CachePadded<AtomicUsize>,
    /// The current job; written only while no worker is inside a region.
    job: Mutex<Option<JobRef>>,
    /// Each participant's share of the items (the caller's first, then each worker's).
    shares: Vec<Share>,
    /// Workers inside the current region (entered and not yet left).
    active: CachePadded<AtomicUsize>,
    /// Whether the current region still admits workers.
    open: AtomicBool,
    /// Set when an item panicked; the payload is kept in `panic`.
    panicked: AtomicBool,
    panic: Mutex<Option<Box<dyn std::any::Any + Send>>>,
    /// Parked workers wait here; `sleepers` counts them so the caller knows to notify.
    sleep: Mutex<usize>,
    wake: Condvar,
    shutdown: AtomicBool,
}

// SAFETY: `JobRef` points to a `Sync` closure that the caller keeps alive until every worker
// has left the region (closed, `active == 0`), and it is only dereferenced by a worker that
// entered while the region was open.
unsafe impl Send for JobRef {}

struct Pool {
    shared: Arc<Shared>,
    /// One region at a time (two callers sharing a model take turns); holds the stall backoff.
    dispatch: Mutex<Backoff>,
    /// Callers inside [`Parallel::urgent`]; while there is one, the others wait in `calm`
    /// before their next region.
    urgent: AtomicUsize,
    calm: Mutex<()>,
    calmed: Condvar,
    workers: Vec<JoinHandle<()>>,
}

/// When to run regions on the caller alone (see the module documentation).
#[derive(Debug)]
struct Backoff {
    /// Regions still to run alone.
    solo_left: usize,
    /// When the current window opened.
    solo_since: Instant,
    /// The window the next stall opens.
    window: usize,
    /// Regions run in parallel without a stall since the window last changed.
    clean: usize,
    /// Parallel regions run clean since the last stall (`usize::MAX` before the first).
    since_stall: usize,
}

impl Backoff {
    fn new() -> Backoff {
        Backoff {
            solo_left: 0,
            solo_since: Instant::now(),
            window: SOLO_BASE,
            clean: 0,
            since_stall: usize::MAX,
        }
    }

    /// Whether the next region runs on the caller alone (counts it).
    fn take_solo(&mut self) -> bool {
        if self.solo_left == 0 {
            return false;
        }
        if self.solo_since.elapsed() > SOLO_TIME {
            self.solo_left = 0;
            return false;
        }
        self.solo_left -= 1;
        true
    }

    /// Records how a parallel region went.
    fn record(&mut self, stalled: bool) {
        if stalled {
            let recurs = self.since_stall < RECUR;
            self.since_stall = 0;
            if !recurs {
                // A hiccup, or the first of a series: the next stall tells.
                return;
            }
            self.solo_left = self.window;
            self.solo_since = Instant::now();
            self.window = (self.window * 2).min(SOLO_MAX);
            self.clean = 0;
        } else {
            self.since_stall = self.since_stall.saturating_add(1);
            self.clean += 1;
            if self.clean >= 4 * SOLO_BASE {
                self.window = (self.window / 2).max(SOLO_BASE);
                self.clean = 0;
            }
        }
    }
}

/// One participant's share of a region's items, a run of consecutive indices `front..back`:
/// the owner claims from the front, the others, once out of their own, from the back.
///
/// Consecutive items are consecutive memory in the products (a job is a run of weight rows),
/// so each thread streams through one stretch of a matrix, which the hardware prefetchers
/// follow, where items claimed in turn from one counter had each thread jump a job ahead of
/// the other's at every claim (on a Zen 5, a C loop read 48 GB/s over two halves of a buffer
/// and 38 over 288 KiB chunks handed to two threads in turn). A thread that the OS does not
/// schedule leaves its share to be taken from the back, so no item waits for it; and the
/// owner's claims touch a line no other thread writes until it steals.
#[derive(Default)]
struct Share(CachePadded<AtomicU64>);

impl Share {
    /// Packs `front..back` (each below 2^32) into one word, front high.
    fn set(&self, front: usize, back: usize) {
        let (f, b) = (
            u32::try_from(front).expect("items fit 32 bits"),
            u32::try_from(back).expect("items fit 32 bits"),
        );
        self.0
            .store((u64::from(f) << 32) | u64::from(b), Ordering::Relaxed);
    }

    /// Takes the first item left, if any.
    fn take_front(&self) -> Option<usize> {
        self.take(|f, b| (f + 1, b, f))
    }

    /// Takes the last item left, if any.
    fn take_back(&self) -> Option<usize> {
        self.take(|f, b| (f, b - 1, b - 1))
    }

    /// Applies `step(front, back) -> (front', back', taken)` while the share is not empty.
    fn take(&self, step: impl Fn(u32, u32) -> (u32, u32, u32)) -> Option<usize> {
        let mut cur = self.0.load(Ordering::Relaxed);
        loop {
            let (f, b) = ((cur >> 32) as u32, cur as u32);
            if f >= b {
                return None;
            }
            let (nf, nb, taken) = step(f, b);
            let new = (u64::from(nf) << 32) | u64::from(nb);
            match self
                .0
                .compare_exchange_weak(cur, new, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => return Some(taken as usize),
                Err(now) => cur = now,
            }
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.shared.shutdown.store(true, Ordering::Release);
        {
            let _g = self.shared.sleep.lock().unwrap_or_else(|e| e.into_inner());
            self.shared.wake.notify_all();
        }
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
    }
}

impl Shared {
    /// Claims and runs items of `job` until none is left, its own share's first (participant
    /// `me`); returns how many it ran.
    fn work(&self, job: JobRef, me: usize) -> usize {
        IN_REGION.with(|r| r.set(true));
        let mut done = 0;
        let p = self.shares.len();
        let claims = std::iter::from_fn(|| self.shares[me].take_front()).chain(
            (1..p).flat_map(|k| std::iter::from_fn(move || self.shares[(me + k) % p].take_back())),
        );
        for i in claims {
            if self.panicked.load(Ordering::Relaxed) {
                continue;
            }
            done += 1;
            // SAFETY: see `JobRef`.
            let f = unsafe { &*job.f };
            if let Err(p) = catch_unwind(AssertUnwindSafe(|| f(i))) {
                self.panicked.store(true, Ordering::Relaxed);
                let mut slot = self.panic.lock().unwrap_or_else(|e| e.into_inner());
                slot.get_or_insert(p);
            }
        }
        IN_REGION.with(|r| r.set(false));
        done
    }

    /// The loop of worker `me` (participant `me`; the caller is 0).
    fn worker_loop(&self, me: usize) {
        // The epoch at the pool's creation, not at this thread's start: a region published
        // before this thread first ran must still count on it.
        let mut seen = 0;
        loop {
            // Spin, then park, until the epoch moves.
            let start = Instant::now();
            let mut spins = 0u32;
            loop {
                if self.shutdown.load(Ordering::Acquire) {
                    return;
                }
                let e = self.epoch.load(Ordering::Acquire);
                if e != seen {
                    seen = e;
                    break;
                }
                spins += 1;
                if spins.is_multiple_of(1024) && start.elapsed() > SPIN {
                    let mut sleepers = self.sleep.lock().unwrap_or_else(|e| e.into_inner());
                    *sleepers += 1;
                    while self.epoch.load(Ordering::Acquire) == seen
                        && !self.shutdown.load(Ordering::Acquire)
                    {
                        sleepers = self.wake.wait(sleepers).unwrap_or_else(|e| e.into_inner());
                    }
                    *sleepers -= 1;
                    spins = 0;
                    continue;
                }
                std::hint::spin_loop();
            }
            // Enter, then check the region is still the one seen and still open (SeqCst pairs
            // with the caller's close-then-read of `active`).
            self.active.fetch_add(1, Ordering::SeqCst);
            if self.open.load(Ordering::SeqCst) && self.epoch.load(Ordering::SeqCst) == seen {
                let job = *self.job.lock().unwrap_or_else(|e| e.into_inner());
                if let Some(job) = job {
                    self.work(job, me);
                }
            }
            self.active.fetch_sub(1, Ordering::Release);
        }
    }
}

impl Pool {
    fn new(workers: usize) -> Pool {
        let shared = Arc::new(Shared {
            epoch: CachePadded::new(AtomicUsize::new(0)),
            job: Mutex::new(None),
            shares: (0..=workers).map(|_| Share::default()).collect(),
            active: CachePadded::new(AtomicUsize::new(0)),
            open: AtomicBool::new(false),
            panicked: AtomicBool::new(false),
            panic: Mutex::new(None),
            sleep: Mutex::new(0),
            wake: Condvar::new(),
            shutdown: AtomicBool::new(false),
        });
        let workers = (0..workers)
            .map(|i| {
                let s = Arc::clone(&shared);
                std::thread::Builder::new()
                    .name(format!("pw-kernel-{}", i + 1))
                    .spawn(move || s.worker_loop(i + 1))
                    .expect("spawning a kernel worker thread")
            })
            .collect();
        Pool {
            shared,
            dispatch: Mutex::new(Backoff::new()),
            urgent: AtomicUsize::new(0),
            calm: Mutex::new(()),
            calmed: Condvar::new(),
            workers,
        }
    }

    /// Waits while another thread's urgent work runs (not when this thread's is the urgent
    /// work).
    fn yield_to_urgent(&self) {
        if self.urgent.load(Ordering::Acquire) == 0 || URGENT.with(Cell::get) {
            return;
        }
        let mut calm = self.calm.lock().unwrap_or_else(|e| e.into_inner());
        while self.urgent.load(Ordering::Acquire) > 0 {
            // The notify comes under `calm` after the count drops, so none is missed; the
            // timeout only bounds the cost of a mistake.
            calm = self
                .calmed
                .wait_timeout(calm, Duration::from_millis(50))
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// Runs `f(i)` for `i < n` on the caller and every worker; returns when all are done.
    fn run(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        self.yield_to_urgent();
        let mut turn = self.dispatch.lock().unwrap_or_else(|e| e.into_inner());
        if turn.take_solo() {
            drop(turn);
            (0..n).for_each(f);
            return;
        }
        let s = &*self.shared;
        let job = JobRef {
            // SAFETY: erases the closure's lifetime; it outlives the region (we wait for
            // the region closed with `active == 0` below before returning, even when an item
            // panics).
            f: unsafe {
                std::mem::transmute::<&(dyn Fn(usize) + Sync), &'static (dyn Fn(usize) + Sync)>(f)
            },
        };
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = Some(job);
        let p = s.shares.len();
        for (k, share) in s.shares.iter().enumerate() {
            share.set(k * n / p, (k + 1) * n / p);
        }
        s.panicked.store(false, Ordering::Relaxed);
        s.open.store(true, Ordering::SeqCst);
        s.epoch.fetch_add(1, Ordering::Release);
        if *s.sleep.lock().unwrap_or_else(|e| e.into_inner()) > 0 {
            s.wake.notify_all();
        }
        let start = Instant::now();
        let mine = s.work(job, 0);
        let worked = start.elapsed();
        let mut spins = 0u32;
        s.open.store(false, Ordering::SeqCst);
        while s.active.load(Ordering::SeqCst) != 0 {
            spins += 1;
            if spins < 1 << 16 {
                std::hint::spin_loop();
            } else {
                // A worker lost its CPU (an oversubscribed machine): let it run.
                std::thread::yield_now();
            }
        }
        if mine > 0 {
            let waited = if spins > 0 {
                start.elapsed() - worked
            } else {
                Duration::ZERO
            };
            let per_item = worked / u32::try_from(mine).unwrap_or(u32::MAX);
            turn.record(waited > per_item * STALL_ITEMS + STALL_SLACK);
        }
        *s.job.lock().unwrap_or_else(|e| e.into_inner()) = None;
        if s.panicked.load(Ordering::Relaxed) {
            let p = s.panic.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(p) = p {
                resume_unwind(p);
            }
        }
    }
}

/// Raw pointer to a results buffer, written at disjoint indices by the items of one region.
struct SlotPtr<T>(*mut T);
// SAFETY: every item writes only its own index, and the buffer outlives the region.
unsafe impl<T: Send> Sync for SlotPtr<T> {}

impl Parallel {
    /// A pool of `threads` workers including the caller (0 means the number of available
    /// CPUs).
    pub fn new(threads: usize) -> Parallel {
        let threads = if threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            threads
        };
        let pool = (threads > 1).then(|| Arc::new(Pool::new(threads - 1)));
        Parallel { pool, threads }
    }

    /// A single-threaded instance (no pool).
    pub fn single() -> Parallel {
        Parallel {
            pool: None,
            threads: 1,
        }
    }

    /// Number of threads.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Runs `f` as urgent work: while it runs, other threads calling into this pool wait
    /// before each of their regions, so `f`'s regions wait at most for the one under way. For
    /// short work that must not queue behind long work (a short prompt's prefill pass beside a
    /// long prompt's); the others resume when `f` returns (or unwinds).
    pub fn urgent<R>(&self, f: impl FnOnce() -> R) -> R {
        let Some(pool) = &self.pool else {
            return f();
        };
        if URGENT.with(Cell::get) {
            return f();
        }
        /// Ends the urgent work, on return or unwind.
        struct Done<'a>(&'a Pool);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                URGENT.with(|u| u.set(false));
                if self.0.urgent.fetch_sub(1, Ordering::AcqRel) == 1 {
                    let _calm = self.0.calm.lock().unwrap_or_else(|e| e.into_inner());
                    self.0.calmed.notify_all();
                }
            }
        }
        pool.urgent.fetch_add(1, Ordering::AcqRel);
        URGENT.with(|u| u.set(true));
        let _done = Done(pool);
        f()
    }

    /// Runs `f(i, chunk)` for every `chunk_len`-sized chunk of `data` (the last may be shorter),
    /// in parallel when the pool has more than one thread.
    pub fn for_each_chunk<T, F>(&self, data: &mut [T], chunk_len: usize, f: F)
    where
        T: Send,
        F: Fn(usize, &mut [T]) + Send + Sync,
    {
        let chunk_len = chunk_len.max(1);
        let len = data.len();
        let base = SlotPtr(data.as_mut_ptr());
        self.for_each_index(len.div_ceil(chunk_len), |i| {
            let at = i * chunk_len;
            let n = chunk_len.min(len - at);
            let base = &base;
            // SAFETY: chunk `i` is `data[at..at + n]`, disjoint from every other item's.
            f(i, unsafe {
                std::slice::from_raw_parts_mut(base.0.add(at), n)
            })
        });
    }

    /// Runs `f(i)` for every `i` in `0..n` (in parallel when the pool has more than one
    /// thread). Each thread takes consecutive items of its own share, then what is left of the
    /// others' (from their ends), so uneven items balance themselves.
    pub fn for_each_index<F>(&self, n: usize, f: F)
    where
        F: Fn(usize) + Send + Sync,
    {
        match &self.pool {
            // (A share's bounds are 32-bit: more items than that run inline.)
            Some(pool) if n > 1 && u32::try_from(n).is_ok() && !IN_REGION.with(|r| r.get()) => {
                pool.run(n, &f)
            }
            _ => (0..n).for_each(f),
        }
    }

    /// Maps `f` over `0..n` (in parallel when possible), returning results in order.
    pub fn map<R, F>(&self, n: usize, f: F) -> Vec<R>
    where
        R: Send,
        F: Fn(usize) -> R + Send + Sync,
    {
        let mut out: Vec<Option<R>> = (0..n).map(|_| None).collect();
        let slots = SlotPtr(out.as_mut_ptr());
        self.for_each_index(n, |i| {
            let slots = &slots;
            let r = f(i);
            // SAFETY: item `i` alone writes slot `i`, inside the buffer's length.
            unsafe { *slots.0.add(i) = Some(r) };
        });
        out.into_iter()
            .map(|r| r.expect("every item ran"))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_index_runs_once_across_many_regions() {
        let par = Parallel::new(3);
        for n in [0, 1, 2, 5, 100] {
            let hits: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            for _ in 0..50 {
                par.for_each_index(n, |i| {
                    hits[i].fetch_add(1, Ordering::Relaxed);
                });
            }
            assert!(hits.iter().all(|h| h.load(Ordering::Relaxed) == 50));
        }
    }

    #[test]
    fn urgent_work_runs_its_regions_while_other_callers_wait() {
        use std::sync::atomic::AtomicBool;
        let par = Parallel::new(2);
        let (stop, strict) = (AtomicBool::new(false), AtomicBool::new(false));
        let (others_during, others) = (AtomicUsize::new(0), AtomicUsize::new(0));
        std::thread::scope(|s| {
            s.spawn(|| {
                while !stop.load(Ordering::SeqCst) {
                    let during = strict.load(Ordering::SeqCst);
                    par.for_each_index(2, |_| {});
                    others.fetch_add(1, Ordering::SeqCst);
                    if during && strict.load(Ordering::SeqCst) {
                        others_during.fetch_add(1, Ordering::SeqCst);
                    }
                }
            });
            while others.load(Ordering::SeqCst) < 100 {
                std::thread::yield_now();
            }
            par.urgent(|| {
                // The other caller may have passed its check just before: one region of it
                // may still start. From then on it waits.
                par.for_each_index(2, |_| {});
                par.for_each_index(2, |_| {});
                strict.store(true, Ordering::SeqCst);
                for _ in 0..20 {
                    par.for_each_index(2, |_| {});
                    // Real time (real threads): room for the other caller to take the pool,
                    // were it not waiting.
                    std::thread::sleep(Duration::from_millis(1));
                }
                strict.store(false, Ordering::SeqCst);
            });
            let after = others.load(Ordering::SeqCst);
            while others.load(Ordering::SeqCst) < after + 10 {
                std::thread::yield_now();
            }
            stop.store(true, Ordering::SeqCst);
        });
        assert!(
            others_during.load(Ordering::SeqCst) <= 1,
            "another caller ran {} regions during urgent work",
            others_during.load(Ordering::SeqCst)
        );
    }

    #[test]
    fn map_keeps_order_and_nested_regions_run_inline() {
        let par = Parallel::new(2);
        let v = par.map(64, |i| par.map(3, |j| i * 3 + j).iter().sum::<usize>());
        assert_eq!(v, (0..64).map(|i| 9 * i + 3).collect::<Vec<_>>());
    }

    #[test]
    fn a_panicking_item_reaches_the_caller_and_the_pool_survives() {
        let par = Parallel::new(2);
        let r = catch_unwind(AssertUnwindSafe(|| {
            par.for_each_index(10, |i| assert!(i != 7, "item seven"))
        }));
        assert!(r.is_err());
        assert_eq!(par.map(4, |i| i), vec![0, 1, 2, 3]);
    }

    #[test]
    fn a_stalled_worker_sends_the_next_regions_to_the_caller_alone() {
        let par = Parallel::new(2);
        let pool = par.pool.as_ref().expect("two threads have a pool");
        let solo_left = || pool.dispatch.lock().unwrap().solo_left;
        let caller = std::thread::current().id();
        // Two items that meet at a barrier run on two threads; the worker's then holds its
        // item for a long time, as a descheduled worker would. A stall opens a window when it
        // recurs: two such regions in a row. (Tried again if the caller itself waited so long
        // at the barrier that the worker's delay looked ordinary.)
        let stall = || {
            let meet = std::sync::Barrier::new(2);
            par.for_each_index(2, |_| {
                meet.wait();
                if std::thread::current().id() != caller {
                    // Real time: a worker thread held busy while the caller goes on.
                    std::thread::sleep(Duration::from_millis(50));
                }
            });
        };
        for _ in 0..8 {
            stall();
            if solo_left() > 0 {
                break;
            }
        }
        let window = solo_left();
        assert!(window >= SOLO_BASE, "the stall was noticed");
        let elsewhere = AtomicUsize::new(0);
        for _ in 0..window {
            par.for_each_index(64, |_| {
                if std::thread::current().id() != caller {
                    elsewhere.fetch_add(1, Ordering::Relaxed);
                }
            });
        }
        assert_eq!(
            elsewhere.load(Ordering::Relaxed),
            0,
            "the window ran on the caller"
        );
        // The window is over: the next region is parallel again (the barrier needs two
        // threads).
        assert_eq!(solo_left(), 0);
        let meet = std::sync::Barrier::new(2);
        let threads = Mutex::new(std::collections::HashSet::new());
        par.for_each_index(2, |_| {
            meet.wait();
            threads.lock().unwrap().insert(std::thread::current().id());
        });
        assert_eq!(threads.lock().unwrap().len(), 2);
    }

    #[test]
    fn backoff_doubles_while_stalls_recur_and_shrinks_while_clean() {
        let mut b = Backoff::new();
        assert!(!b.take_solo());
        b.record(true);
        assert_eq!(b.solo_left, 0, "a lone stall opens no window");
        b.record(true);
        assert_eq!(b.solo_left, SOLO_BASE);
        b.solo_left = 0;
        b.record(true);
        assert_eq!((b.solo_left, b.window), (2 * SOLO_BASE, 4 * SOLO_BASE));
        for _ in 0..2 * SOLO_BASE {
            assert!(b.take_solo());
        }
        assert!(!b.take_solo());
        for _ in 0..8 * SOLO_BASE {
            b.record(false);
        }
        assert_eq!(b.window, SOLO_BASE);
        for _ in 0..100 * SOLO_BASE {
            b.record(false);
        }
        assert_eq!(b.window, SOLO_BASE);
        b.record(true);
        b.solo_left = 0;
        for _ in 0..20 {
            b.record(true);
        }
        assert_eq!(b.window, SOLO_MAX);
    }

    #[test]
    fn lone_stalls_open_no_window() {
        let mut b = Backoff::new();
        for _ in 0..10 {
            b.record(true);
            assert_eq!(b.solo_left, 0);
            for _ in 0..RECUR {
                b.record(false);
            }
        }
        // One within `RECUR` regions of the last opens one.
        b.record(true);
        for _ in 0..RECUR - 1 {
            b.record(false);
        }
        b.record(true);
        assert_eq!(b.solo_left, SOLO_BASE);
    }

    #[test]
    fn a_window_ends_after_its_time_with_regions_left() {
        let mut b = Backoff::new();
        b.record(true);
        b.record(true);
        assert!(b.take_solo());
        b.solo_since -= SOLO_TIME + Duration::from_millis(1);
        assert!(!b.take_solo(), "the window's time is up");
        assert_eq!(b.solo_left, 0);
        assert_eq!(
            b.window,
            2 * SOLO_BASE,
            "a recurring stall still doubles the next"
        );
    }

    #[test]
    fn workers_wake_after_parking() {
        let par = Parallel::new(2);
        par.for_each_index(4, |_| {});
        // Real time: long enough for the worker threads to stop spinning and park.
        std::thread::sleep(SPIN * 3);
        let n = AtomicUsize::new(0);
        par.for_each_index(1000, |_| {
            n.fetch_add(1, Ordering::Relaxed);
        });
        assert_eq!(n.load(Ordering::Relaxed), 1000);
    }

    #[test]
    fn a_share_is_taken_from_the_front_by_its_owner_and_from_the_back_by_others() {
        let share = Share::default();
        share.set(3, 8);
        assert_eq!(share.take_front(), Some(3));
        assert_eq!(share.take_back(), Some(7));
        assert_eq!(share.take_front(), Some(4));
        assert_eq!(share.take_back(), Some(6));
        assert_eq!(share.take_back(), Some(5));
        assert_eq!((share.take_front(), share.take_back()), (None, None));
        share.set(2, 2);
        assert_eq!(share.take_front(), None);
    }

    #[test]
    fn each_thread_walks_consecutive_items() {
        // Each thread's items are at most two runs of consecutive indices: its own share from
        // the front, then what it took from the back of the other's. (Claims from one shared
        // counter interleave the threads item by item.)
        let par = Parallel::new(2);
        let n = 1000;
        let mut both = 0;
        for _ in 0..10 {
            let who: Vec<AtomicUsize> = (0..n).map(|_| AtomicUsize::new(0)).collect();
            par.for_each_index(n, |i| {
                let worker = std::thread::current().name() == Some("pw-kernel-1");
                let me = if worker { 2 } else { 1 };
                who[i].store(me, Ordering::Relaxed);
                // Long enough that both threads take part.
                let t = Instant::now();
                while t.elapsed() < Duration::from_micros(5) {
                    std::hint::spin_loop();
                }
            });
            let who: Vec<usize> = who.iter().map(|w| w.load(Ordering::Relaxed)).collect();
            assert!(who.iter().all(|&w| w != 0), "every item ran");
            let runs = 1 + who.windows(2).filter(|p| p[0] != p[1]).count();
            assert!(runs <= 3, "{runs} runs of one thread's items");
            both += usize::from(runs > 1);
        }
        assert!(both > 0, "the worker never took part");
    }
}

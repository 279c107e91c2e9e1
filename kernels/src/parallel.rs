//! A configurable thread pool: the model owns one, every kernel that splits work takes it.

use std::sync::Arc;

/// How many threads a kernel may use. With one thread, work runs inline on the caller.
#[derive(Clone)]
pub struct Parallel {
    pool: Option<Arc<rayon::ThreadPool>>,
    threads: usize,
}

impl std::fmt::Debug for Parallel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Parallel")
            .field("threads", &self.threads)
            .finish()
    }
}

impl Parallel {
    /// A pool of `threads` workers (0 means the number of available CPUs).
    pub fn new(threads: usize) -> Parallel {
        let threads = if threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            threads
        };
        let pool = (threads > 1).then(|| {
            Arc::new(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(threads)
                    .thread_name(|i| format!("pw-kernel-{i}"))
                    .build()
                    .expect("building the kernel thread pool"),
            )
        });
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

    /// Runs `f(i, chunk)` for every `chunk_len`-sized chunk of `data` (the last may be shorter),
    /// in parallel when the pool has more than one thread.
    pub fn for_each_chunk<T, F>(&self, data: &mut [T], chunk_len: usize, f: F)
    where
        T: Send,
        F: Fn(usize, &mut [T]) + Send + Sync,
    {
        let chunk_len = chunk_len.max(1);
        match &self.pool {
            None => data
                .chunks_mut(chunk_len)
                .enumerate()
                .for_each(|(i, c)| f(i, c)),
            Some(pool) => {
                use rayon::prelude::*;
                pool.install(|| {
                    data.par_chunks_mut(chunk_len)
                        .enumerate()
                        .for_each(|(i, c)| f(i, c))
                })
            }
        }
    }

    /// Runs `f(i)` for every `i` in `0..n` (in parallel when the pool has more than one
    /// thread).
    pub fn for_each_index<F>(&self, n: usize, f: F)
    where
        F: Fn(usize) + Send + Sync,
    {
        match &self.pool {
            None => (0..n).for_each(f),
            Some(pool) => {
                use rayon::prelude::*;
                pool.install(|| (0..n).into_par_iter().for_each(f))
            }
        }
    }

    /// Maps `f` over `0..n` (in parallel when possible), returning results in order.
    pub fn map<R, F>(&self, n: usize, f: F) -> Vec<R>
    where
        R: Send,
        F: Fn(usize) -> R + Send + Sync,
    {
        match &self.pool {
            None => (0..n).map(f).collect(),
            Some(pool) => {
                use rayon::prelude::*;
                pool.install(|| (0..n).into_par_iter().map(f).collect())
            }
        }
    }
}

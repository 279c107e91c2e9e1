//! `load` on the seeded tiny model: the pool it builds is the one the preflight vouched for,
//! and a pool that cannot hold the context is refused with both numbers named.

use std::error::Error;

use pagewarden_common::worker_config::{WorkerConfig, WorkerDefaults, WorkerFlags};
use pagewarden_kernels::{Device, Packing};
use pagewarden_worker::{load, PoolOptions, StartupError};

const OPTS: PoolOptions = PoolOptions {
    device: Device::Cpu,
    zero_on_release: true,
    commit_rehash: false,
    prefix_cache: false,
};

fn tiny(pool_tokens: Option<usize>) -> WorkerConfig {
    let flags = WorkerFlags {
        tiny_test_model: Some(3),
        pool_tokens,
        ..WorkerFlags::default()
    };
    WorkerConfig::resolve(flags, WorkerDefaults::decode()).expect("config")
}

#[test]
fn the_pool_is_the_one_the_preflight_sized() {
    let cfg = tiny(Some(1024));
    let loaded = load(&cfg, OPTS, Packing::Bandwidth).expect("tiny model loads");
    assert_eq!(loaded.model_name, "tiny-test-3");
    assert_eq!(loaded.preflight.pool_tokens, 1024);
    assert_eq!(loaded.pool.stats().free * cfg.page_size, 1024);
    assert_eq!(
        loaded.preflight.advertised_context,
        loaded.model.context_length()
    );
}

#[test]
fn a_pool_under_the_context_is_refused_by_the_preflight() {
    let Err(e) = load(&tiny(Some(128)), OPTS, Packing::Bandwidth) else {
        panic!("a 128-token pool passed the preflight of a 256-token context");
    };
    assert!(matches!(e, StartupError::Preflight(_)), "{e:?}");
    assert_eq!(e.to_string(), "preflight");
    let why = e.source().expect("the preflight's reason").to_string();
    assert!(why.contains("128") && why.contains("256"), "{why}");
}

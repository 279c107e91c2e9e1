//! Deterministic discrete-event simulation of prefill senders, the decode receiver and a real
//! `KvPool`, with seeded faults. Every random choice comes from one seeded RNG, every map that
//! is iterated is ordered, and the trace hash covers every event, so a seed replays exactly.
//!
//! - `rng.rs`: SplitMix64, the only source of randomness.
//! - `net.rs`: ordered links (one per prefill connection) with delays, holds and breaks.
//! - `world.rs`: the world, its events and run loop, the oracle (`world/decode.rs`: decode
//!   side; `world/prefill.rs`: prefill side and links).

pub mod net;
pub mod rng;
pub mod world;

//! Deterministic discrete-event simulation of prefill senders, the decode receiver and a real
//! `KvPool`, with seeded faults. Every random choice comes from one seeded RNG, every map that
//! is iterated is ordered, and the trace hash covers every event, so a seed replays exactly.
//!
//! - `rng.rs`: SplitMix64, the only source of randomness.
//! - `net.rs`: ordered links (one per prefill connection) with delays, holds and breaks.
//! - `world.rs`: events, the decode and prefill state machines, the oracle.

pub mod net;
pub mod rng;
pub mod world;

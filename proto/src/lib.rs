//! Generated gRPC types for package `pagewarden.v1`.
//!
//! - `build.rs`: compiles every `pagewarden/v1/*.proto` with protox + tonic-prost-build.
//! - `v1`: the generated messages, clients (`*_client`) and servers (`*_server`).
//! - `convert`: the shared vocabulary (`pagewarden-types`) to and from the wire, each once.
#![warn(missing_docs)]

/// Messages, clients and servers of package `pagewarden.v1`.
#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("pagewarden.v1");
}

pub mod convert;

//! `AuditorClient` and `AuditorIntegritySink` live in `pagewarden-common` (so router and workers
//! can use them without depending on this service); re-exported here for compatibility.

pub use pagewarden_common::auditor_client::*;

//! Integration tests of the auditor, in one binary to keep link time down.

mod auth;
mod browser;
mod db_outage;
mod fake_router;
mod ingest;
mod listing;
mod pg;
mod probe;
mod process;
mod recompute;
mod routine;
mod store_suite;
mod tokens;
mod webdriver;

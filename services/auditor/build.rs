//! `sqlx_macros::migrate!` embeds `migrations/` at build time: rebuild when a file there changes.

fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}

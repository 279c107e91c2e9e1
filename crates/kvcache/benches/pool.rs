//! Pool benchmarks (placeholder while the real ones land).
fn main() {}

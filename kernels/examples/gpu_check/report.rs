//! The check table: one row per kernel and shape, GPU output against the CPU reference.

/// One compared output.
pub struct Row {
    pub kernel: String,
    pub shape: String,
    pub max_abs: f32,
    /// max |gpu - ref| / max |ref|.
    pub max_rel: f32,
    pub tol: f32,
    pub pass: bool,
    pub note: String,
}

/// Compares `gpu` with `reference`; passes when every value is finite and max_rel <= tol.
pub fn compare(kernel: &str, shape: String, gpu: &[f32], reference: &[f32], tol: f32) -> Row {
    assert_eq!(gpu.len(), reference.len(), "{kernel} {shape}: lengths");
    let finite = gpu.iter().all(|v| v.is_finite());
    let max_abs = gpu
        .iter()
        .zip(reference)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    let scale = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
    let max_rel = if scale > 0.0 {
        max_abs / scale
    } else {
        max_abs
    };
    Row {
        kernel: kernel.to_string(),
        shape,
        max_abs,
        max_rel,
        tol,
        pass: finite && max_rel <= tol,
        note: if finite {
            String::new()
        } else {
            "non-finite output".into()
        },
    }
}

/// A yes/no check (exact comparisons, fault handling).
pub fn verdict(kernel: &str, shape: String, pass: bool, note: String) -> Row {
    Row {
        kernel: kernel.to_string(),
        shape,
        max_abs: 0.0,
        max_rel: 0.0,
        tol: 0.0,
        pass,
        note,
    }
}

/// Prints the table; returns how many rows failed.
pub fn print(rows: &[Row]) -> usize {
    println!(
        "{:<28} {:<30} {:>11} {:>11} {:>9}  result",
        "kernel", "shape", "max abs", "max rel", "tol"
    );
    println!("{}", "-".repeat(100));
    for r in rows {
        let verdict = if r.pass { "PASS" } else { "FAIL" };
        if r.tol > 0.0 {
            println!(
                "{:<28} {:<30} {:>11.3e} {:>11.3e} {:>9.1e}  {verdict} {}",
                r.kernel, r.shape, r.max_abs, r.max_rel, r.tol, r.note
            );
        } else {
            println!(
                "{:<28} {:<30} {:>11} {:>11} {:>9}  {verdict} {}",
                r.kernel, r.shape, "-", "-", "exact", r.note
            );
        }
    }
    rows.iter().filter(|r| !r.pass).count()
}

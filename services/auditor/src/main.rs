fn main() {
    println!("pagewarden-auditor: not built yet");
}

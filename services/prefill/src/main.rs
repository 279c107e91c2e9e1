fn main() {
    println!("pagewarden-prefill: not built yet");
}

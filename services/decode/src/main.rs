fn main() {
    println!("pagewarden-decode: not built yet");
}

fn main() {
    println!("pagewarden-router: not built yet");
}

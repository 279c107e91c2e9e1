fn main() {
    println!("pagewarden: not built yet");
}

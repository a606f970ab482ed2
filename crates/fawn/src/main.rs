fn main() {
    println!("fawn: under construction");
}

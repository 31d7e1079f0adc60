fn main() {
    // Migrations are embedded at compile time: rebuild when one changes.
    println!("cargo:rerun-if-changed=migrations");
}

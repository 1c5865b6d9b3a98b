//! Empty: it makes `[build-dependencies]` count, so that the host's build of `syn` has the
//! features the tests' procedural macros ask for (see `Cargo.toml`).
fn main() {}

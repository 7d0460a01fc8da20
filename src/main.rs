//! The `lifeguard` binary: parses the command line, hands it to the
//! library's composition root, and exits with the code `exit` gives how
//! it ended.

// As in the library (src/lib.rs): no function over 80 lines of code.

use std::process::ExitCode;

/// mimalloc gives memory back to the system once freed (glibc's allocator
/// kept hundreds of MB after thousands of slow readers had gone) and
/// fragments less under many short-lived connections.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let invocation = lifeguard::cli::parse(std::env::args_os().collect());
    let ended = lifeguard::agent::main(invocation);
    ExitCode::from(lifeguard::exit::code(&ended))
}

//! The `lifeguard` binary: parses the command line and hands it to the
//! library's composition root.

use std::process::ExitCode;

/// mimalloc gives memory back to the system once freed (glibc's allocator
/// kept hundreds of MB after thousands of slow readers had gone) and
/// fragments less under many short-lived connections.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    lifeguard::tune_memory();
    match lifeguard::cli::parse(std::env::args_os().collect()) {
        Ok(invocation) => ExitCode::from(lifeguard::agent::main(invocation)),
        Err(code) => ExitCode::from(code),
    }
}

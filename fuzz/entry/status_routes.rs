//! The libFuzzer entry of `status_routes`: what it exercises and what it holds
//! is `fuzz_targets/status_routes.rs`, shared with the seeds' replay in the test
//! suite (src/fuzzing.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lifeguard_fuzz::status_routes::run(data));

//! The libFuzzer entry of `go_duration`: what it exercises and what it holds
//! is `fuzz_targets/go_duration.rs`, shared with the seeds' replay in the test
//! suite (src/fuzzing.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lifeguard_fuzz::go_duration::run(data));

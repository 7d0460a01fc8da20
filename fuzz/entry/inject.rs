//! The libFuzzer entry of `inject`: what it exercises and what it holds
//! is `fuzz_targets/inject.rs`, shared with the seeds' replay in the test
//! suite (src/fuzzing.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lifeguard_fuzz::inject::run(data));

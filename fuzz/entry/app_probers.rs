//! The libFuzzer entry of `app_probers`: what it exercises and what it holds
//! is `fuzz_targets/app_probers.rs`, shared with the seeds' replay in the test
//! suite (src/fuzzing.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lifeguard_fuzz::app_probers::run(data));

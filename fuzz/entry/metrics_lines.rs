//! The libFuzzer entry of `metrics_lines`: what it exercises and what it holds
//! is `fuzz_targets/metrics_lines.rs`, shared with the seeds' replay in the test
//! suite (src/fuzzing.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lifeguard_fuzz::metrics_lines::run(data));

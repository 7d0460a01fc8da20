//! The libFuzzer entry of `prometheus_annotations`: what it exercises and what it holds
//! is `fuzz_targets/prometheus_annotations.rs`, shared with the seeds' replay in the test
//! suite (src/fuzzing.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lifeguard_fuzz::prometheus_annotations::run(data));

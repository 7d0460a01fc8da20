//! The libFuzzer entry of `envoy_stats`: what it exercises and what it holds
//! is `fuzz_targets/envoy_stats.rs`, shared with the seeds' replay in the test
//! suite (src/fuzzing.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lifeguard_fuzz::envoy_stats::run(data));

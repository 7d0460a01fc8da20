//! The libFuzzer entry of `grpc_health`: what it exercises and what it holds
//! is `fuzz_targets/grpc_health.rs`, shared with the seeds' replay in the test
//! suite (src/fuzzing.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lifeguard_fuzz::grpc_health::run(data));

//! The libFuzzer entry of `proxy_config`: what it exercises and what it holds
//! is `fuzz_targets/proxy_config.rs`, shared with the seeds' replay in the test
//! suite (src/fuzzing.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lifeguard_fuzz::proxy_config::run(data));

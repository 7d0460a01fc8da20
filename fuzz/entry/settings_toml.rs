//! The libFuzzer entry of `settings_toml`: what it exercises and what it holds
//! is `fuzz_targets/settings_toml.rs`, shared with the seeds' replay in the test
//! suite (src/fuzzing.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lifeguard_fuzz::settings_toml::run(data));

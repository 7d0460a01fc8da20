//! The libFuzzer entry of `merged_scrape`: what it exercises and what it holds
//! is `fuzz_targets/merged_scrape.rs`, shared with the seeds' replay in the test
//! suite (src/fuzzing.rs).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| lifeguard_fuzz::merged_scrape::run(data));

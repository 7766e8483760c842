#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| stockgate_fuzz::bodies::raft_frame(data));

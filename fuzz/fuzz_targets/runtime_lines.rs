//! The runtime line reader (`acp::connection::read_lines`) against its reference model. The first
//! two bytes choose the line limit (1..=200) and the read size (1..=64); the rest is what the
//! runtime wrote.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    agent_harness_testkit::fuzzing::runtime_lines_bytes(data);
});

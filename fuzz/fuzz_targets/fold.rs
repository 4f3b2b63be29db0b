//! The fold (`acp::fold`): one log entry per line; the line's first byte chooses direction,
//! action id and epoch, the rest is the frame's JSON text.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    agent_harness_testkit::fuzzing::fold_bytes(data);
});

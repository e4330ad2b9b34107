//! Any bytes, whole or cut short, must give a header or an error: never a panic, never an
//! allocation the input asked for.
#![no_main]

use libfuzzer_sys::fuzz_target;
use modelserve::gguf::header::parse;

fuzz_target!(|data: &[u8]| {
    let _ = parse(data, true);
    if let Err(e) = parse(data, false)
        && let Some(needed) = e.needs_more()
    {
        assert!(needed > data.len() as u64, "asked for {needed} bytes while holding {}", data.len());
    }
});

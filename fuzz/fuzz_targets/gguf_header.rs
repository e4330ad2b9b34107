//! Any bytes through the whole inspection: parse (whole or cut short), the bounds, the support
//! check and the estimate with varied settings; see `check`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| modelserve_fuzz::check(data));

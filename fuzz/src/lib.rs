//! What the fuzz targets check, shared with `slowest` (which times a corpus through it).
//!
//! Any bytes, whole or cut short, must give a header or an error: never a panic, never an
//! allocation the input asked for. A header that parses goes on through the support check and
//! the estimate, with settings taken from the input's last bytes (past what the header reads),
//! and the checked and unchecked paths must agree.

use modelserve::gguf::bounds::MAX_ESTIMATE;
use modelserve::gguf::header::parse;
use modelserve::gguf::inspect::{self, InspectError};
use modelserve::gguf::memory::{self, Flags};
use modelserve::gguf::{hparams, support};

/// Every reason a refusal may carry.
const REASONS: [&str; 5] = [
    "InvalidGGUF",
    "InvalidHeader",
    "InvalidSpec",
    "UnsupportedArchitecture",
    "UnsupportedTensorType",
];

/// Settings, build and split from the last 16 bytes, across every magnitude.
fn settings(data: &[u8]) -> (Flags, bool) {
    let mut tail = [0u8; 16];
    for (t, b) in tail.iter_mut().rev().zip(data.iter().rev()) {
        *t = *b;
    }
    let [c0, c1, c2, c3, c4, c5, c6, c7, p0, p1, u0, u1, b0, b1, split, shift] = tail;
    let ctx = u64::from_le_bytes([c0, c1, c2, c3, c4, c5, c6, c7]) >> (shift % 64);
    let flags = Flags {
        ctx_size: ctx,
        parallel: u16::from_le_bytes([p0, p1]).into(),
        ubatch: u16::from_le_bytes([u0, u1]).into(),
        build: u16::from_le_bytes([b0, b1]).into(),
    };
    (flags, split & 1 == 1)
}

/// Runs one input through parse, validate, the support check and both estimates.
pub fn check(data: &[u8]) {
    if let Err(e) = parse(data, false)
        && let Some(needed) = e.needs_more()
    {
        assert!(
            needed > data.len() as u64,
            "asked for {needed} bytes while holding {}",
            data.len()
        );
    }
    let header = match parse(data, true) {
        Ok(h) => h,
        Err(e) => {
            assert!(REASONS.contains(&e.reason()), "{e}");
            return;
        }
    };
    let (flags, split) = settings(data);
    if let Ok(first) = support::first_build(&header, split, flags.build) {
        assert!(first <= flags.build, "b{first} loads it, above b{}", flags.build);
    }
    let e = memory::estimate(&header, &flags);
    assert!(e.total <= MAX_ESTIMATE, "{e:?}");
    for part in [e.weights, e.kv, e.recurrent, e.compute, e.overhead] {
        assert!(part <= e.total, "{e:?}");
    }
    let valid = hparams::validate(&header).is_ok() && flags.check().is_ok();
    match memory::estimate_checked(&header, &flags) {
        Ok(checked) => {
            assert!(valid);
            assert_eq!(checked, e, "the checked estimate differs");
        }
        Err(err) => assert!(REASONS.contains(&err.reason()), "{err}"),
    }
    match inspect::inspect(&[("fuzz.gguf", data)], flags.build, &flags) {
        Ok((_, verdict)) => assert_eq!(verdict.estimate, e),
        Err(err @ InspectError::Read(_)) => panic!("parsed once, refused on the second read: {err}"),
        Err(err) => assert!(REASONS.contains(&err.reason()), "{err}"),
    }
}

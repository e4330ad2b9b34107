//! What the fuzz targets check, shared with `slowest` (which times a corpus through it).
//!
//! Any bytes, whole or cut short, must give a header or an error: never a panic, never an
//! allocation the input asked for. A header that parses goes on through the support check and
//! the estimate, with settings taken from the input's last bytes (past what the header reads),
//! and the checked and unchecked paths must agree; then through the GPU placement on none, one
//! and two GPUs (CUDA's rules and RPC's) and the fit.

use modelserve::gguf::bounds::MAX_ESTIMATE;
use modelserve::gguf::header::parse;
use modelserve::gguf::inspect::{self, InspectError};
use modelserve::gguf::memory::{self, Flags};
use modelserve::gguf::offload::{self, Backend, Device};
use modelserve::gguf::{hparams, support};

/// Every reason a refusal may carry.
const REASONS: [&str; 5] = [
    "InvalidGGUF",
    "InvalidHeader",
    "InvalidSpec",
    "UnsupportedArchitecture",
    "UnsupportedTensorType",
];

/// Settings, build, split and `-ngl` from the last 16 bytes, across every magnitude.
fn settings(data: &[u8]) -> (Flags, bool, u32) {
    let mut tail = [0u8; 16];
    for (t, b) in tail.iter_mut().rev().zip(data.iter().rev()) {
        *t = *b;
    }
    // The little-endian number in `len` bytes of the tail from `at`.
    let le = |at: usize, len: usize| {
        let bytes = tail.iter().skip(at).take(len).rev();
        bytes.fold(0u64, |n, b| (n << 8) | u64::from(*b))
    };
    let flags = Flags {
        ctx_size: le(0, 8) >> (le(15, 1) % 64),
        parallel: le(8, 2),
        ubatch: le(10, 2),
        build: u32::try_from(le(12, 2)).unwrap_or(u32::MAX),
        // Every CPU tier: the repack is counted for each, the most work an estimate does.
        cpu: memory::repack::Tiers::ANY,
        // The node's CPUs, 1 to 128, from the split byte's other bits.
        cpus: 1 + (le(14, 1) >> 1),
    };
    let ngl = u32::try_from(le(13, 1)).unwrap_or(u32::MAX);
    (flags, le(14, 1) & 1 == 1, ngl)
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
    let (flags, split, ngl) = settings(data);
    if let Ok(first) = support::first_build(&header, split, flags.build) {
        assert!(
            first <= flags.build,
            "b{first} loads it, above b{}",
            flags.build
        );
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
        Err(err @ InspectError::Read(_)) => {
            panic!("parsed once, refused on the second read: {err}")
        }
        Err(err) => assert!(REASONS.contains(&err.reason()), "{err}"),
    }
    gpus(&header, &flags, ngl, e.compute);
}

/// The placement at `ngl` on no GPU, one, and two split 1:3 under CUDA's and RPC's rules, and the
/// fit on two GPUs of 24 and 16 GiB: a placement has a share per GPU, without GPUs the host's
/// compute is the estimate's (`compute`), and a decision has its message.
fn gpus(header: &modelserve::gguf::header::Header, flags: &Flags, ngl: u32, compute: u64) {
    for backend in [Backend::CUDA, Backend::RPC] {
        for split in [&[][..], &[1.0], &[1.0, 3.0]] {
            let p = match offload::place_on(header, flags, ngl, split, backend) {
                Ok(p) => p,
                Err(err) => {
                    assert_eq!(err.reason(), "InvalidPlacement");
                    continue;
                }
            };
            assert_eq!(p.devices.len(), split.len());
            if split.is_empty() {
                assert_eq!(p.host.compute, compute, "{p:?}");
            }
        }
    }
    let devices = [24u64 << 30, 16 << 30].map(|free| Device {
        name: "fuzz".into(),
        free,
    });
    if let Ok(decision) = offload::decide(header, flags, &devices, 1 << 30) {
        assert!(!decision.message(&devices).is_empty());
    }
}

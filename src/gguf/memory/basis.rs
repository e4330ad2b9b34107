//! The estimate's basis: what was counted, as the words of `status.check.basis`.

use super::{engine, repack};
use crate::gguf::header::Header;
use crate::units::human_bytes;

/// " + CPU repack 1.2 GiB (96 tensors, x86 AVX2)", or nothing when nothing is repacked.
pub(super) fn repack_basis(
    b: u64,
    tier: repack::Tier,
    tensors: u64,
    tiers: repack::Tiers,
) -> String {
    if b == 0 {
        return String::new();
    }
    let several = tiers.iter().count() > 1;
    let bound = if several {
        format!(
            "; the largest of {}, as the nodes' CPU features are not known",
            tiers.key()
        )
    } else {
        String::new()
    };
    format!(
        " + CPU repack {} ({tensors} tensors, {}{bound})",
        human_bytes(b),
        tier.describe()
    )
}

/// "output 1 MiB + vocabulary 12 MiB (32000 tokens, 0 merges) + samplers ... + engine 32 MiB".
pub(super) fn engine_basis(e: &engine::Engine, h: &Header, vocab: u64) -> String {
    let merges = h
        .get("tokenizer.ggml.merges")
        .and_then(crate::gguf::header::Value::array_len)
        .unwrap_or(0);
    format!(
        "output {} + vocabulary {} ({vocab} tokens, {merges} merges) + samplers {} + matmul work {} + graph {} + engine {}",
        human_bytes(e.output),
        human_bytes(e.vocab),
        human_bytes(e.sampler),
        human_bytes(e.work),
        human_bytes(e.graph),
        human_bytes(e.fixed)
    )
}

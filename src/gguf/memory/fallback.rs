//! The estimate of a header that lacks the shapes (block count or width): the weights, a
//! rough compute buffer and margin, and the engine's fixed memory; no KV cache.

use super::{Estimate, Flags, Header, Parts, Scan, bytes, engine, human_bytes, repack};

/// The estimate of a header without shapes: no KV, and a rough compute buffer.
pub(super) fn parts(h: &Header, weights: u128, arch: &str, f: &Flags) -> Parts {
    let (compute, margin): (u128, u128) = (512 << 20, weights / 10);
    let engine_fixed = engine::fixed(f.cpus, f.parallel);
    let (repack, tier, _) = repack::largest(h, f.cpu);
    let parts = weights + u128::from(repack) + margin + compute + u128::from(engine_fixed);
    let total = parts.div_ceil(1 << 20) << 20;
    let e = Estimate {
        weights: bytes(weights),
        repack,
        repack_tier: tier,
        kv: 0,
        recurrent: 0,
        checkpoints: 0,
        checkpoint_window: 0,
        compute: bytes(compute + margin),
        engine: engine::Engine {
            fixed: engine_fixed,
            ..Default::default()
        },
        overhead: engine_fixed,
        total: bytes(total),
        kv_bytes_per_token: 0,
        fallback: true,
        basis: format!(
            "FALLBACK: the header lacks {arch}.block_count or {arch}.embedding_length, so the KV cache cannot be computed; estimate = weights {} + CPU repack {} + 10% + 512 MiB + engine {}",
            human_bytes(bytes(weights)),
            human_bytes(repack),
            human_bytes(engine_fixed)
        ),
    };
    Parts {
        activations: e.compute,
        estimate: e,
        unclamped: total,
        kv: Vec::new(),
        kv_values: Vec::new(),
        recurrent: Vec::new(),
        logits: 0,
        masks: 0,
        mask_full: 0,
        mask_window: 0,
        mask_layers: Vec::new(),
        residual: 0,
        query: 0,
        ffn: 0,
        gate: 0,
        scaled: 0,
        positions: 0,
        cache_indices: 0,
        out_rows: 0,
        moe_tail: 0,
        dense_lead: 0,
        scan: Scan::default(),
        latent_compute: 0,
        latent_rows: 0,
        latent_cache: false,
    }
}

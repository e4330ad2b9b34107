//! The engine's memory outside its logged buffers: the vocabulary's tables, the samplers, the
//! CPU matmul work buffer, the graph metadata, and a fixed part (binary, libraries, threads).
//!
//! The per-token and per-merge figures are llama.cpp's containers as libstdc++ and glibc lay
//! them out (`llama_vocab`: token data, the text-to-id map, the piece cache; BPE's merge ranks;
//! UGM and RWKV's tries). The loader's GGUF copy of the merges is alive only while the model
//! loads, before any slot serves: the engine's peak is the larger of that copy and what serving
//! adds (`SERVING` and the samplers), not their sum.

use super::super::header::{Header, Value};
use super::super::support::ggml_type;

/// Bytes per vocabulary token once loaded: token data, the text-to-id map node and buckets, the
/// piece cache and long texts on the heap. Fitted as an upper bound on llama-server's resident
/// memory after the load (b11312, one tiny model body over eight of the sdist's vocabularies,
/// 30k to 262k tokens, 0 to 515k merges): SPM and WordPiece take 96-99 B per token, and this
/// with `PER_MERGE` is 0.8-10 MiB over the BPE ones (command-r the closest, gemma-4 the
/// farthest). tests/quantized_memory.rs holds the estimate over all 19 of them.
pub const PER_TOKEN: u64 = 192;
/// Bytes per BPE merge once loaded: the rank map's node (a pair of strings) and buckets.
pub const PER_MERGE: u64 = 112;
/// Bytes per BPE merge of the loader's GGUF copy, freed once the model is loaded: the largest
/// drop of resident memory at the end of the load, per merge, over the same vocabularies
/// (31-48 B; 23.5 MiB for gemma-4's 515k merges).
pub const LOADER_PER_MERGE: u64 = 48;
/// What serving adds to llama-server's resident memory after the load besides the samplers:
/// the requests of full slots in flight (their JSON, token lists and responses) and the HTTP
/// threads' first use (8.0 MiB with every slot's context filled on 2 CPUs); part of `BASE`.
pub const SERVING: u64 = 8 << 20;
/// Bytes per token of the tries UGM, RWKV and PLaMo-2 tokenizers build.
pub const TRIE_PER_TOKEN: u64 = 320;
/// Bytes per token and slot of a sampler's candidate array (id, logit, p).
pub const SAMPLER_PER_TOKEN: u64 = 12;
/// Bytes per graph node of the graph results and the scheduler's tables.
pub const PER_GRAPH_NODE: u64 = 1536;
/// The fewest graph nodes llama.cpp reserves.
const MIN_GRAPH_NODES: u64 = 1024;
/// Resident memory of llama-server besides its buffers, tables and threads, whatever the node:
/// the binary's and libraries' pages (12.4 MiB of the test bed's build), the heap's base, and
/// the requests of full slots in flight (`SERVING`). Measured against the test bed's build
/// with every slot's context filled (tests/offload_engine.rs, on 2 CPUs):
/// 17.5-23.7 MiB beside the other parts on a quiet machine (the most with mamba2-bench's first
/// layers on the host), and up to 3 MiB more on a busy one: 27 MiB.
pub const BASE: u64 = 27 << 20;
/// One thread's resident stack and heap under load: 56 KiB measured from 7 to 132 threads.
pub const PER_THREAD: u64 = 64 << 10;
/// The logical CPUs assumed of a node the estimate does not know (the CLI without
/// `--node-cpus`): a large one.
pub const DEFAULT_CPUS: u64 = 128;
/// The most CPUs counted: more is taken for this many (a node's status is input like any other).
pub const MAX_CPUS: u64 = 4096;

/// The threads llama-server starts on a node of `cpus` logical CPUs, with `parallel` slots and
/// its default flags, whatever the pod's CPU limit: a compute thread per core (at most one per
/// CPU), max(parallel + 4, cpus - 1) HTTP threads, and 4 more (main, the slots' loop, the
/// listener, the log).
pub fn threads(cpus: u64, parallel: u64) -> u64 {
    let cpus = cpus.clamp(1, MAX_CPUS);
    let http = parallel.saturating_add(4).max(cpus - 1);
    cpus.saturating_add(http).saturating_add(4)
}

/// The engine's memory outside its buffers and tables on a node of `cpus` logical CPUs.
pub fn fixed(cpus: u64, parallel: u64) -> u64 {
    BASE.saturating_add(PER_THREAD.saturating_mul(threads(cpus, parallel)))
}

/// The parts, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Engine {
    pub vocab: u64,
    pub sampler: u64,
    pub output: u64,
    pub work: u64,
    pub graph: u64,
    pub fixed: u64,
}

impl Engine {
    pub fn total(&self) -> u64 {
        [
            self.vocab,
            self.sampler,
            self.output,
            self.work,
            self.graph,
            self.fixed,
        ]
        .iter()
        .fold(0u64, |a, b| a.saturating_add(*b))
    }
}

/// Inputs the parts depend on besides the header.
pub struct Shape {
    pub vocab: u64,
    pub parallel: u64,
    pub ubatch: u64,
    /// The widest activation row a matmul reads: max(n_ff, n_embd, heads × head width, used
    /// experts × expert width).
    pub widest: u64,
    /// The most logical CPUs of a node the replicas may run on.
    pub cpus: u64,
}

/// The engine parts for a model of this header and shape.
pub fn parts(h: &Header, s: &Shape) -> Engine {
    let merges = h
        .get("tokenizer.ggml.merges")
        .and_then(Value::array_len)
        .unwrap_or(0);
    let tokenizer = h
        .get("tokenizer.ggml.model")
        .and_then(Value::as_str)
        .unwrap_or("");
    let charsmap = h
        .get("tokenizer.ggml.precompiled_charsmap")
        .and_then(Value::array_len)
        .unwrap_or(0);
    let trie = if matches!(tokenizer, "t5" | "rwkv" | "plamo2") {
        s.vocab
            .saturating_mul(TRIE_PER_TOKEN)
            .saturating_add(charsmap)
    } else {
        0
    };
    let sampler = s
        .vocab
        .saturating_mul(SAMPLER_PER_TOKEN)
        .saturating_mul(s.parallel);
    // The loader's copy where it is more than what serving adds once it is gone.
    let loading = merges
        .saturating_mul(LOADER_PER_MERGE)
        .saturating_sub(SERVING.saturating_add(sampler));
    let vocab = s
        .vocab
        .saturating_mul(PER_TOKEN)
        .saturating_add(merges.saturating_mul(PER_MERGE))
        .saturating_add(trie)
        .saturating_add(loading);
    // The work buffer holds a ubatch of the activations converted to the weights' dot-product
    // type: f16 for f16/bf16 weights, 8-bit blocks (292 bytes per 256) for quantized ones.
    let wide_float = h.tensors.iter().any(|t| {
        t.dims.len() >= 2
            && ggml_type(t.ggml_type).is_some_and(|ty| ty.name == "F16" || ty.name == "BF16")
    });
    let elements = s.ubatch.saturating_mul(s.widest);
    let work = if wide_float {
        elements.saturating_mul(2)
    } else {
        elements.saturating_mul(292).div_ceil(256)
    };
    let nodes = (h.tensors.len() as u64)
        .saturating_mul(8)
        .max(MIN_GRAPH_NODES);
    Engine {
        vocab,
        sampler,
        output: s.vocab.saturating_mul(4).saturating_mul(s.parallel),
        work,
        graph: nodes.saturating_mul(PER_GRAPH_NODE),
        fixed: fixed(s.cpus, s.parallel),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_vocabulary_parts_grow_with_tokens_merges_and_slots() {
        let mut h = Header {
            version: 3,
            metadata: Default::default(),
            tensors: Vec::new(),
            alignment: 32,
            data_offset: 0,
        };
        h.metadata
            .insert("tokenizer.ggml.model".into(), Value::String("gpt2".into()));
        h.metadata.insert(
            "tokenizer.ggml.merges".into(),
            Value::Array {
                value_type: 8,
                len: 514_906,
                items: None,
            },
        );
        let s = Shape {
            vocab: 262_144,
            parallel: 4,
            ubatch: 512,
            widest: 10240,
            cpus: 2,
        };
        let e = parts(&h, &s);
        assert_eq!(e.sampler, 262_144 * 12 * 4);
        // The loader's copy of the merges (23.6 MiB) outlasts what serving adds with 4 slots
        // (8 MiB and 12 MiB of samplers) by 3.6 MiB.
        let loading = 514_906 * LOADER_PER_MERGE - SERVING - e.sampler;
        assert_eq!(e.vocab, 262_144 * PER_TOKEN + 514_906 * PER_MERGE + loading);
        assert!(
            (100 << 20..110 << 20).contains(&e.vocab),
            "Gemma's tables come to about 107 MiB: {}",
            e.vocab
        );
        // With one slot the copy counts more; with many, serving covers it.
        let one = parts(&h, &Shape { parallel: 1, ..s });
        assert_eq!(one.vocab - e.vocab, 9 * 262_144 * 4);
        let many = parts(&h, &Shape { parallel: 8, ..s });
        assert_eq!(many.vocab, 262_144 * PER_TOKEN + 514_906 * PER_MERGE);
        assert_eq!(e.output, 262_144 * 4 * 4);
        assert_eq!(e.work, 512 * 10240 * 292 / 256);
        assert_eq!(e.graph, 1024 * PER_GRAPH_NODE);
        assert_eq!(e.fixed, BASE + 14 * PER_THREAD, "2 + 8 + 4 threads");
    }

    #[test]
    fn the_threads_follow_the_node_not_the_model() {
        // llama-server on this 2-CPU machine with 2 slots: 12 threads.
        assert_eq!(threads(2, 2), 12);
        // HTTP threads: at least parallel + 4, else one fewer than the CPUs.
        assert_eq!(threads(2, 32), 2 + 36 + 4);
        assert_eq!(threads(128, 4), 128 + 127 + 4);
        // A node reporting no CPU or absurdly many is taken within bounds.
        assert_eq!(threads(0, 1), threads(1, 1));
        assert_eq!(threads(u64::MAX, 1), threads(MAX_CPUS, 1));
        assert!(fixed(DEFAULT_CPUS, 4) > fixed(2, 4));
        assert!(
            (41 << 20..45 << 20).contains(&fixed(DEFAULT_CPUS, 4)),
            "a large node: about 43 MiB, {}",
            fixed(DEFAULT_CPUS, 4)
        );
    }
}

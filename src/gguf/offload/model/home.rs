//! Which part of the model a tensor belongs to, by its name: the input layer, a block, or the
//! output layer (`llm_tensor_info_mapping`'s layers).

use crate::gguf::header::{Header, TensorInfo};
use crate::gguf::memory;

/// Tensors of the input layer (`LLM_TENSOR_LAYER_INPUT`): always in host memory.
const INPUT: [&str; 6] = [
    "token_embd",
    "position_embd",
    "token_types",
    "per_layer_token_embd",
    "masked_embd_centroids",
    "masked_embd_ordering",
];
/// Tensors of the output layer (`LLM_TENSOR_LAYER_OUTPUT`) besides `output*`.
const OUTPUT: [&str; 16] = [
    "cls",
    "dense_2",
    "dense_3",
    "dec.output_norm",
    "enc.output_norm",
    "altup_proj",
    "altup_unembd_proj",
    "nextn.post_projection",
    "fc",
    "d2t",
    "markov_w1",
    "markov_w2",
    "conf_proj",
    "selector_predecessor",
    "selector_successor",
    "selector_hidden",
];

/// Where a tensor lives.
pub(super) enum Home {
    Input,
    Layer(usize),
    Output,
}

/// The layer a tensor belongs to, by name: `blk.N.` (also under `enc.`/`dec.`), the input and
/// output tensors, and the few repeating tensors without a number (`rope_freqs`,
/// `token_embd_norm`), which the engine creates with layer 0.
pub(super) fn home(name: &str, n_layer: usize) -> Home {
    let first = name.split('.').next().unwrap_or_default();
    let inner = name
        .strip_prefix("enc.")
        .or_else(|| name.strip_prefix("dec."))
        .unwrap_or(name);
    if let Some(rest) = inner.strip_prefix("blk.") {
        return match rest.split('.').next().and_then(|n| n.parse::<usize>().ok()) {
            Some(il) if il < n_layer => Home::Layer(il),
            // A block the model does not have: the engine refuses the file; count it on the host.
            _ => Home::Input,
        };
    }
    if INPUT.contains(&first) {
        Home::Input
    } else if first.starts_with("output") || OUTPUT.iter().any(|o| name.starts_with(o)) {
        Home::Output
    } else if n_layer > 0 {
        Home::Layer(0)
    } else {
        Home::Input
    }
}

/// A weight's kind: the part of its name before `.weight` after the block's prefix
/// (`blk.3.ffn_up.weight`: `ffn_up`); empty for a tensor that is not a weight.
pub(super) fn kind(name: &str) -> &str {
    name.strip_suffix(".weight")
        .and_then(|n| n.rsplit('.').next())
        .unwrap_or_default()
}

/// Calls `each` with the block, kind (`kind`) and bytes of every tensor of a block.
pub(super) fn each_block_weight(
    h: &Header,
    n_layer: usize,
    mut each: impl FnMut(usize, &str, &TensorInfo, u64),
) {
    for t in &h.tensors {
        if let Home::Layer(il) = home(&t.name, n_layer) {
            each(il, kind(&t.name), t, memory::tensor_bytes(t).unwrap_or(0));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::kind;

    #[test]
    fn a_weights_kind_is_the_last_part_of_its_name() {
        assert_eq!(kind("blk.3.ffn_up.weight"), "ffn_up");
        assert_eq!(kind("enc.blk.0.attn_q.weight"), "attn_q");
        assert_eq!(kind("blk.0.ssm_conv1d.bias"), "");
        assert_eq!(kind("output.weight"), "output");
    }
}

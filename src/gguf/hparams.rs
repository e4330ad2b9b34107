//! The hyper-parameters of a model's architecture, read only through their bounds.
//!
//! `validate` checks every hyper-parameter in `bounds::PARAMS` that the header holds, per-layer
//! arrays against the layer count, and the tensors, so a header that passed reads the same
//! through `Hp` as it is written. `Hp` clamps what it returns to the bound as well, so the
//! estimate stays bounded on any header, validated or not.

use super::bounds::{
    self, BLOCK_COUNT, BoundsError, Kind, MAX_LAYERS, MAX_MODEL_ELEMENTS, MAX_TENSORS, MAX_VOCAB,
    PARAMS, Param, VOCAB_SIZE,
};
use super::header::{Header, Value};

const TOKENS: &str = "tokenizer.ggml.tokens";

/// Checks every count the estimate and the support check read against its bound.
pub fn validate(h: &Header) -> Result<(), BoundsError> {
    let arch = h.architecture().unwrap_or_default();
    let layers = h
        .get(&format!("{arch}.{}", BLOCK_COUNT.key))
        .and_then(Value::as_u64);
    // block_count comes first, so a per-layer array is never compared with an absurd count.
    for p in PARAMS {
        param(h, arch, p, layers)?;
    }
    if let Some(n) = h.get(TOKENS).and_then(Value::array_len) {
        bounds::at_most(n, MAX_VOCAB, "tokens", || format!("the length of {TOKENS}"))?;
    }
    tensors(h).map(|_| ())
}

/// The elements of all tensors, each tensor and the sum within bounds.
pub fn tensors(h: &Header) -> Result<u64, BoundsError> {
    bounds::at_most(h.tensors.len() as u64, MAX_TENSORS, "tensors", || {
        "the tensor count".into()
    })?;
    let mut total = 0u64;
    for t in &h.tensors {
        // Each term is at most 2^40 and there are at most 2^18: no overflow.
        total += bounds::tensor_elements(&t.name, &t.dims)?;
    }
    bounds::at_most(total, MAX_MODEL_ELEMENTS, "elements", || {
        "the element count of all tensors".into()
    })
}

fn param(h: &Header, arch: &str, p: &Param, layers: Option<u64>) -> Result<(), BoundsError> {
    let key = format!("{arch}.{}", p.key);
    match (h.get(&key), p.kind) {
        (None, _) => Ok(()),
        // Read as a number only: an array reads as absent.
        (Some(Value::Array { .. }), Kind::Scalar) => Ok(()),
        (Some(Value::Array { len, items, .. }), Kind::PerLayer) => {
            match layers {
                Some(n) if *len != n => {
                    return Err(BoundsError::PerLayerLength {
                        field: key,
                        len: *len,
                        layers: n,
                    });
                }
                _ => bounds::at_most(*len, MAX_LAYERS, "layers", || {
                    format!("the length of {key}")
                })?,
            };
            for (i, item) in items.iter().flatten().enumerate() {
                if let Some(v) = item.as_u64() {
                    bounds::at_most(v, p.limit, p.unit, || format!("{key}[{i}]"))?;
                }
            }
            Ok(())
        }
        (Some(Value::Array { len, .. }), Kind::LayerFlags) => {
            bounds::at_most(*len, MAX_LAYERS, "layers", || {
                format!("the length of {key}")
            })
            .map(|_| ())
        }
        (Some(v), _) => match v.as_u64() {
            Some(n) => bounds::at_most(n, p.limit, p.unit, || key.clone()).map(|_| ()),
            None => Ok(()),
        },
    }
}

/// The hyper-parameters of the header's architecture, each at most its bound. It reads only
/// those listed in `PARAMS`, so each one it reads is one `validate` checks.
pub struct Hp<'a> {
    h: &'a Header,
    pub arch: &'a str,
    /// The listed hyper-parameters the header holds, looked up once: the estimate asks for
    /// them for every layer.
    present: Vec<(&'static str, &'a Value)>,
}

impl<'a> Hp<'a> {
    pub fn new(h: &'a Header) -> Self {
        let arch = h.architecture().unwrap_or_default();
        let present = PARAMS
            .iter()
            .filter_map(|p| Some((p.key, h.get(&format!("{arch}.{}", p.key))?)))
            .collect();
        Hp { h, arch, present }
    }

    /// The value as written.
    pub fn get(&self, p: &Param) -> Option<&'a Value> {
        self.present
            .iter()
            .find(|(key, _)| *key == p.key)
            .map(|(_, v)| *v)
    }

    /// A number (not an array).
    pub fn u(&self, p: &Param) -> Option<u64> {
        self.get(p).and_then(Value::as_u64).map(|v| v.min(p.limit))
    }

    /// A number or per-layer array entry, for layer `il`.
    pub fn per_layer(&self, p: &Param, il: u64) -> Option<u64> {
        match self.get(p)? {
            Value::Array {
                items: Some(items), ..
            } => nth(items, il).and_then(Value::as_u64),
            v => v.as_u64(),
        }
        .map(|v| v.min(p.limit))
    }

    /// Whether a per-layer flags array says 1 for layer `il`.
    pub fn flag(&self, p: &Param, il: u64) -> Option<bool> {
        self.get(p)
            .and_then(Value::items)
            .map(|items| nth(items, il).and_then(Value::as_u64) == Some(1))
    }

    /// Tokens of the vocabulary: `vocab_size`, else the length of the token list.
    pub fn vocab(&self) -> u64 {
        self.u(&VOCAB_SIZE)
            .or_else(|| self.h.get(TOKENS).and_then(Value::array_len))
            .map_or(0, |v| v.min(MAX_VOCAB))
    }
}

fn nth(items: &[Value], il: u64) -> Option<&Value> {
    usize::try_from(il).ok().and_then(|i| items.get(i))
}

#[cfg(test)]
mod tests {
    use super::super::bounds::{EMBEDDING, HEAD_COUNT_KV};
    use super::super::header::{parse, write};
    use super::*;

    #[test]
    fn listed_hyper_parameters_read_clamped_and_unlisted_ones_not_at_all() {
        let h = parse(
            &write::header(
                &[
                    ("general.architecture", Value::String("llama".into())),
                    ("llama.embedding_length", Value::U64(u64::MAX)),
                    ("llama.attention.head_count_kv", write::u32s(&[8, 0])),
                    ("llama.rope.dimension_count", Value::U32(128)),
                ],
                &[],
            ),
            true,
        )
        .unwrap();
        let hp = Hp::new(&h);
        assert_eq!(hp.u(&EMBEDDING), Some(EMBEDDING.limit));
        assert_eq!(hp.per_layer(&HEAD_COUNT_KV, 0), Some(8));
        assert_eq!(hp.per_layer(&HEAD_COUNT_KV, 1), Some(0));
        assert_eq!(hp.per_layer(&HEAD_COUNT_KV, 2), None);
        let unlisted = Param {
            key: "rope.dimension_count",
            ..EMBEDDING
        };
        assert_eq!(hp.u(&unlisted), None, "read only what validate checks");
    }
}

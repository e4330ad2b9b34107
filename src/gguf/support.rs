//! Which llama.cpp build loads a model: the first build of its architecture, of every tensor
//! type it uses, of its tokenizer pre-type, and of split loading, from the tables in data/
//! (compiled into the binary). A llama.cpp build number `bN` contains every commit up to N.

use std::collections::HashMap;
use std::sync::LazyLock;

use super::header::{Header, Value};

/// GGUF files with these tensor-type ids stopped loading at b4282 (online repacking replaced them).
const REMOVED_TYPES: [(u32, &str); 3] = [(31, "Q4_0_4_4"), (32, "Q4_0_4_8"), (33, "Q4_0_8_8")];
const REMOVED_TYPES_AT: u32 = 4282;
/// Split (sharded) GGUF loading.
const SPLIT_LOADING: u32 = 2505;
/// GGUF v3 files.
const GGUF_V3: u32 = 1405;
/// GGUFs converted with the MLA-aware converter (attention.key_length_mla present).
const MLA_GGUF: u32 = 5137;

/// A ggml tensor type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgmlType {
    pub name: String,
    pub id: u32,
    pub block_elems: u64,
    pub block_bytes: u64,
    /// None when it predates GGUF.
    pub first_build: Option<u32>,
}

impl GgmlType {
    /// Bytes of `elements` values of this type.
    pub fn bytes(&self, elements: u64) -> u64 {
        elements
            .div_ceil(self.block_elems)
            .saturating_mul(self.block_bytes)
    }
}

struct Arch {
    first: Option<u32>,
    last: Option<u32>,
}

static TYPES: LazyLock<HashMap<u32, GgmlType>> = LazyLock::new(|| {
    rows(include_str!("../../data/ggml-types.tsv"))
        .filter_map(|c| {
            Some(GgmlType {
                name: c.first()?.to_string(),
                id: c.get(1)?.parse().ok()?,
                block_elems: c.get(2)?.parse().ok()?,
                block_bytes: c.get(3)?.parse().ok()?,
                first_build: build_number(c.get(5)?),
            })
        })
        .map(|t| (t.id, t))
        .collect()
});

static ARCHS: LazyLock<HashMap<String, Arch>> = LazyLock::new(|| {
    rows(include_str!("../../data/llama-arch-support.tsv"))
        .filter_map(|c| {
            let notes = c.get(10).copied().unwrap_or_default();
            // "loadable only in b1340..b2951" / "loadable only b(first)..b7975"
            let last = notes.split("..b").nth(1).and_then(|s| {
                s.split(|ch: char| !ch.is_ascii_digit())
                    .next()?
                    .parse()
                    .ok()
            });
            Some((
                c.first()?.to_string(),
                Arch {
                    first: build_number(c.get(2)?),
                    last,
                },
            ))
        })
        .collect()
});

static PRE_TOKENIZERS: LazyLock<HashMap<String, Option<u32>>> = LazyLock::new(|| {
    rows(include_str!("../../data/llama-pre-tokenizer-support.tsv"))
        .filter_map(|c| Some((c.first()?.to_string(), build_number(c.get(1)?))))
        .collect()
});

fn rows(tsv: &str) -> impl Iterator<Item = Vec<&str>> {
    tsv.lines()
        .skip(1)
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| l.split('\t').collect())
}

fn build_number(s: &str) -> Option<u32> {
    s.trim().strip_prefix('b')?.parse().ok()
}

/// The tensor type with this id, if the data knows it.
pub fn ggml_type(id: u32) -> Option<&'static GgmlType> {
    TYPES.get(&id)
}

/// The llama.cpp build of an engine image: `server-b6500`, `server-cuda-b6500`, `b6500`,
/// optionally with a registry and name (`ghcr.io/ggml-org/llama.cpp:server-b6500`).
pub fn build_of_image(image: &str) -> Option<u32> {
    let image = image.split('@').next().unwrap_or(image);
    let name = image.rsplit('/').next().unwrap_or(image);
    let tag = name.rsplit_once(':').map_or(name, |(_, t)| t);
    tag.rsplit('-').next().and_then(build_number)
}

/// Why the nodes' build cannot load a model.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unsupported {
    #[error("architecture {arch} needs llama.cpp b{first} or newer; the nodes run b{build}")]
    ArchitectureTooNew {
        arch: String,
        first: u32,
        build: u32,
    },
    #[error("architecture {arch} was removed from llama.cpp after b{last}; the nodes run b{build}")]
    ArchitectureRemoved { arch: String, last: u32, build: u32 },
    #[error(
        "architecture {arch} is unknown to every llama.cpp build this operator knows (the nodes run b{build})"
    )]
    ArchitectureUnknown { arch: String, build: u32 },
    #[error("the GGUF header has no general.architecture")]
    NoArchitecture,
    #[error(
        "tensor {tensor} has type {name} (id {id}), which llama.cpp loads from b{first}; the nodes run b{build}"
    )]
    TypeTooNew {
        tensor: String,
        name: String,
        id: u32,
        first: u32,
        build: u32,
    },
    #[error(
        "tensor {tensor} has type {name} (id {id}), which llama.cpp stopped loading at b{REMOVED_TYPES_AT}; the nodes run b{build}: use another quant"
    )]
    TypeRemoved {
        tensor: String,
        name: String,
        id: u32,
        build: u32,
    },
    #[error(
        "tensor {tensor} has type id {id}, which no llama.cpp build this operator knows defines"
    )]
    TypeUnknown { tensor: String, id: u32 },
    #[error("{what} needs llama.cpp b{first} or newer; the nodes run b{build}")]
    FeatureTooNew {
        what: String,
        first: u32,
        build: u32,
    },
}

impl Unsupported {
    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Unsupported::TypeTooNew { .. }
            | Unsupported::TypeRemoved { .. }
            | Unsupported::TypeUnknown { .. } => "UnsupportedTensorType",
            _ => "UnsupportedArchitecture",
        }
    }
}

/// The first build that loads the model, or why `build` cannot.
pub fn first_build(header: &Header, split: bool, build: u32) -> Result<u32, Unsupported> {
    let arch = header.architecture().ok_or(Unsupported::NoArchitecture)?;
    let a = ARCHS
        .get(arch)
        .ok_or_else(|| Unsupported::ArchitectureUnknown {
            arch: arch.into(),
            build,
        })?;
    let Some(arch_first) = a.first else {
        return Err(Unsupported::ArchitectureUnknown {
            arch: arch.into(),
            build,
        });
    };
    if arch_first > build {
        return Err(Unsupported::ArchitectureTooNew {
            arch: arch.into(),
            first: arch_first,
            build,
        });
    }
    if let Some(last) = a.last.filter(|l| build > *l) {
        return Err(Unsupported::ArchitectureRemoved {
            arch: arch.into(),
            last,
            build,
        });
    }
    let mut first = arch_first;
    let mut need = |what: String, at: u32| {
        if at > build {
            return Err(Unsupported::FeatureTooNew {
                what,
                first: at,
                build,
            });
        }
        first = first.max(at);
        Ok(())
    };
    if header.version >= 3 {
        need("GGUF version 3".into(), GGUF_V3)?;
    }
    if split {
        need("loading split (sharded) GGUF files".into(), SPLIT_LOADING)?;
    }
    if header
        .get(&format!("{arch}.attention.key_length_mla"))
        .is_some()
    {
        need(
            "a GGUF converted for MLA (attention.key_length_mla)".into(),
            MLA_GGUF,
        )?;
    }
    if let Some(pre) = header.get("tokenizer.ggml.pre").and_then(Value::as_str)
        && let Some(Some(at)) = PRE_TOKENIZERS.get(pre)
    {
        need(format!("tokenizer pre-type {pre}"), *at)?;
    }
    let mut seen = std::collections::BTreeSet::new();
    for t in &header.tensors {
        if !seen.insert(t.ggml_type) {
            continue;
        }
        if let Some((_, name)) = REMOVED_TYPES.iter().find(|(id, _)| *id == t.ggml_type) {
            if build >= REMOVED_TYPES_AT {
                return Err(Unsupported::TypeRemoved {
                    tensor: t.name.clone(),
                    name: (*name).into(),
                    id: t.ggml_type,
                    build,
                });
            }
            continue;
        }
        let ty = ggml_type(t.ggml_type).ok_or_else(|| Unsupported::TypeUnknown {
            tensor: t.name.clone(),
            id: t.ggml_type,
        })?;
        if let Some(at) = ty.first_build {
            if at > build {
                return Err(Unsupported::TypeTooNew {
                    tensor: t.name.clone(),
                    name: ty.name.clone(),
                    id: ty.id,
                    first: at,
                    build,
                });
            }
            first = first.max(at);
        }
    }
    Ok(first)
}

#[cfg(test)]
mod tests {
    use super::super::header::{parse, write};
    use super::*;

    fn model(arch: &str, extra: &[(&str, Value)], types: &[u32]) -> Header {
        let mut kv = vec![("general.architecture", Value::String(arch.into()))];
        kv.extend(extra.iter().cloned());
        let names: Vec<String> = (0..types.len()).map(|i| format!("t{i}")).collect();
        let tensors: Vec<(&str, &[u64], u32)> = names
            .iter()
            .zip(types)
            .map(|(n, t)| (n.as_str(), &[256u64][..], *t))
            .collect();
        parse(&write::header(&kv, &tensors), true).unwrap()
    }

    #[test]
    fn the_data_tables_load() {
        assert_eq!(
            ggml_type(12).map(|t| (t.name.as_str(), t.block_elems, t.block_bytes)),
            Some(("Q4_K", 256, 144))
        );
        assert_eq!(ggml_type(39).and_then(|t| t.first_build), Some(6096));
        assert_eq!(ggml_type(0).and_then(|t| t.first_build), None);
        assert!(ARCHS.len() > 140);
        assert!(PRE_TOKENIZERS.contains_key("qwen2"));
    }

    #[test]
    fn the_build_comes_from_the_image_tag() {
        assert_eq!(
            build_of_image("ghcr.io/ggml-org/llama.cpp:server-b6500"),
            Some(6500)
        );
        assert_eq!(build_of_image("server-cuda-b6500"), Some(6500));
        assert_eq!(build_of_image("b6500"), Some(6500));
        assert_eq!(
            build_of_image("registry:5000/llama.cpp:full-b7000@sha256:abc"),
            Some(7000)
        );
        assert_eq!(build_of_image("llama.cpp:latest"), None);
    }

    #[test]
    fn an_architecture_newer_than_the_build_names_both_builds() {
        let h = model("gemma4", &[], &[0]);
        let e = first_build(&h, false, 8000).unwrap_err();
        assert_eq!(e.reason(), "UnsupportedArchitecture");
        assert_eq!(
            e.to_string(),
            "architecture gemma4 needs llama.cpp b8637 or newer; the nodes run b8000"
        );
        assert_eq!(first_build(&h, false, 9000), Ok(8637));
    }

    #[test]
    fn tensor_types_pre_tokenizers_and_split_raise_the_first_build() {
        let h = model(
            "llama",
            &[("tokenizer.ggml.pre", Value::String("qwen2".into()))],
            &[0, 39],
        );
        assert_eq!(
            first_build(&h, false, 10000),
            Ok(6096),
            "MXFP4 arrived at b6096"
        );
        let e = first_build(&h, false, 5000).unwrap_err();
        assert_eq!(e.reason(), "UnsupportedTensorType");
        assert!(e.to_string().contains("MXFP4"), "{e}");
        let h = model("llama", &[], &[0]);
        assert_eq!(first_build(&h, true, 9000), Ok(2505));
    }

    #[test]
    fn removed_and_unknown_things_are_refused() {
        assert_eq!(
            first_build(&model("llama", &[], &[31]), false, 5000)
                .unwrap_err()
                .reason(),
            "UnsupportedTensorType"
        );
        assert!(first_build(&model("llama", &[], &[31]), false, 4000).is_ok());
        assert!(matches!(
            first_build(&model("llama", &[], &[99]), false, 5000),
            Err(Unsupported::TypeUnknown { .. })
        ));
        assert!(matches!(
            first_build(&model("persimmon", &[], &[0]), false, 5000),
            Err(Unsupported::ArchitectureRemoved { last: 2951, .. })
        ));
        assert!(matches!(
            first_build(&model("gptj", &[], &[0]), false, 5000),
            Err(Unsupported::ArchitectureUnknown { .. })
        ));
        assert!(matches!(
            first_build(&model("no-such-arch", &[], &[0]), false, 5000),
            Err(Unsupported::ArchitectureUnknown { .. })
        ));
    }
}

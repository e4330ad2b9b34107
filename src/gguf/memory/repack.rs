//! The CPU repack: at load, llama.cpp's CPU backend copies some quantized matmul weights into
//! interleaved layouts for the CPU's vector units (ggml-cpu's repack and AMX extra buffer
//! types). With the default mmap load, the file pages of those tensors stay mapped, so each
//! repacked tensor is resident twice: its file pages and the `CPU_REPACK` (or `AMX`) buffer.
//!
//! Which tensors are repacked depends on the CPU code the engine runs: the tier of the node's
//! CPU, capped by the best code the engine image has (official images carry every variant and
//! load the best one the CPU supports).
//!
//! Rules, from ggml-cpu's `ggml_repack_get_optimal_repack_type` and AMX `supports_op`:
//! - eligible: 2-D weights used by a matrix multiply (projections, `output`, shared experts)
//!   and 3-D merged experts (`*_exps`); never `token_embd` and the other row-lookup tables,
//!   except as the output copy of a model with tied embeddings;
//! - AVX2: Q4_0, Q4_K, IQ4_NL, MXFP4 with rows a multiple of 8; AVX-512 adds Q2_K;
//! - AMX (2-D only, before the above): Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, IQ4_XS and F16 with
//!   rows a multiple of 32, some with a few bytes more per block;
//! - ARM dot product: Q4_0, Q8_0, IQ4_NL, MXFP4, Q1_0 with rows a multiple of 4, Q4_K, Q5_K,
//!   Q6_K with rows a multiple of 8.
//!
//! A repacked tensor has the bytes of the original, padded to 32.

use super::super::header::{Header, TensorInfo};
use super::super::support::ggml_type;
use crate::gguf::bounds::MAX_TENSOR_ELEMENTS;

/// The CPU code that decides the repack.
#[derive(
    Clone,
    Copy,
    Debug,
    PartialEq,
    Eq,
    PartialOrd,
    Ord,
    Hash,
    strum::EnumString,
    strum::Display,
    strum::IntoStaticStr,
    strum::VariantArray,
)]
#[strum(serialize_all = "kebab-case")]
pub enum Tier {
    /// No repack: a CPU without AVX2 or dot product, or `--no-repack`.
    None,
    /// x86-64 with AVX2 (Haswell and later).
    Avx2,
    /// x86-64 with AVX-512 F, BW, CD, DQ and VL.
    Avx512,
    /// x86-64 with AMX (Sapphire Rapids and later).
    Amx,
    /// ARM64 with the dot-product extension.
    ArmDotprod,
}

impl Tier {
    fn bit(self) -> u8 {
        1 << (self as u8)
    }

    /// What the tier is, for the basis sentence.
    pub fn describe(self) -> &'static str {
        match self {
            Tier::None => "no CPU repack",
            Tier::Avx2 => "x86 AVX2",
            Tier::Avx512 => "x86 AVX-512",
            Tier::Amx => "x86 AMX",
            Tier::ArmDotprod => "ARM dot product",
        }
    }
}

/// The tiers a replica may run with: one when the nodes say, several when they do not (the
/// estimate takes the largest repack among them). Never empty.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Tiers(u8);

impl Tiers {
    /// Any tier at all: the upper bound when nothing is known.
    pub const ANY: Tiers = Tiers(0b11111);
    /// Every x86-64 tier: a node whose architecture is known but whose CPU features are not.
    pub const X86: Tiers = Tiers(0b01111);
    /// Every ARM64 tier.
    pub const ARM: Tiers = Tiers(0b10001);

    pub fn one(t: Tier) -> Tiers {
        Tiers(t.bit())
    }

    pub fn with(self, t: Tier) -> Tiers {
        Tiers(self.0 | t.bit())
    }

    pub fn union(self, other: Tiers) -> Tiers {
        Tiers(self.0 | other.0)
    }

    pub fn iter(self) -> impl Iterator<Item = Tier> {
        <Tier as strum::VariantArray>::VARIANTS
            .iter()
            .copied()
            .filter(move |t| self.0 & t.bit() != 0)
    }

    /// The tiers as the engine runs them: each capped by the best code the engine has for its
    /// architecture (an engine built for AVX2 runs AVX2 code on an AMX node).
    pub fn capped(self, engine: EngineCpu) -> Tiers {
        let mut out = Tiers(0);
        for t in self.iter() {
            let capped = match t {
                Tier::None => Tier::None,
                Tier::Avx2 | Tier::Avx512 | Tier::Amx => t.min(engine.x86),
                Tier::ArmDotprod if engine.arm == Tier::ArmDotprod => t,
                Tier::ArmDotprod => Tier::None,
            };
            out = out.with(capped);
        }
        if out.0 == 0 {
            Tiers::one(Tier::None)
        } else {
            out
        }
    }

    /// The tiers, for request keys and messages: "avx2" or "avx2|amx".
    pub fn key(self) -> String {
        self.iter()
            .map(<&'static str>::from)
            .collect::<Vec<_>>()
            .join("|")
    }
}

impl std::fmt::Debug for Tiers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tiers({})", self.key())
    }
}

impl std::str::FromStr for Tiers {
    type Err = String;

    /// "unknown", "x86", "arm", or tiers joined by '|' or ','.
    fn from_str(s: &str) -> Result<Tiers, String> {
        match s.trim() {
            "unknown" | "any" => return Ok(Tiers::ANY),
            "x86" | "amd64" => return Ok(Tiers::X86),
            "arm" | "arm64" => return Ok(Tiers::ARM),
            _ => {}
        }
        let mut out = Tiers(0);
        for part in s.split(['|', ',']) {
            let t: Tier = part.trim().parse().map_err(|_| {
                format!(
                    "unknown CPU tier {part:?}; valid: none, avx2, avx512, amx, arm-dotprod, or unknown, x86, arm"
                )
            })?;
            out = out.with(t);
        }
        Ok(out)
    }
}

/// The best CPU code an engine image has, per architecture. Official llama.cpp images carry
/// every variant (`GGML_CPU_ALL_VARIANTS`) and load the best one the CPU supports; an image
/// built for one CPU level has only that.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct EngineCpu {
    pub x86: Tier,
    pub arm: Tier,
}

impl EngineCpu {
    /// Every variant, as the official images.
    pub const ALL: EngineCpu = EngineCpu {
        x86: Tier::Amx,
        arm: Tier::ArmDotprod,
    };
}

impl Default for EngineCpu {
    fn default() -> Self {
        EngineCpu::ALL
    }
}

impl std::str::FromStr for EngineCpu {
    type Err = String;

    /// "all", or the best tier per architecture: "avx2", "avx512,arm-dotprod", "none".
    fn from_str(s: &str) -> Result<EngineCpu, String> {
        if s.trim() == "all" {
            return Ok(EngineCpu::ALL);
        }
        let mut e = EngineCpu {
            x86: Tier::None,
            arm: Tier::None,
        };
        for part in s.split(',') {
            let t: Tier = part.trim().parse().map_err(|_| {
                format!(
                    "unknown engine CPU code {part:?}; valid: all, or the best tier per architecture among none, avx2, avx512, amx, arm-dotprod (e.g. \"avx2\" or \"amx,arm-dotprod\")"
                )
            })?;
            match t {
                Tier::None => {}
                Tier::ArmDotprod => e.arm = t,
                x86 => e.x86 = e.x86.max(x86),
            }
        }
        Ok(e)
    }
}

impl std::fmt::Display for EngineCpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if *self == EngineCpu::ALL {
            return f.write_str("all");
        }
        match (self.x86, self.arm) {
            (x, Tier::None) => write!(f, "{x}"),
            (Tier::None, a) => write!(f, "{a}"),
            (x, a) => write!(f, "{x},{a}"),
        }
    }
}

/// Bytes one repacked tensor takes in its tier's buffer, or None when it is not repacked.
fn repacked(t: &TensorInfo, tier: Tier, output_copy: bool) -> Option<u64> {
    let ty = ggml_type(t.ggml_type)?;
    let dims = t.dims.len();
    let experts = t.name.contains("_exps");
    if !(output_copy || (dims == 2 && matmul_weight(&t.name)) || (dims == 3 && experts)) {
        return None;
    }
    let ne0 = *t.dims.first()?;
    let rows = *t.dims.get(1)?;
    let bytes = ty.bytes(t.elements().min(MAX_TENSOR_ELEMENTS));
    let padded = |b: u64| b.div_ceil(32) * 32;
    let name = ty.name.as_str();
    if tier == Tier::Amx && dims == 2 && rows % 32 == 0 {
        // AMX keeps some types with extra bytes per block (mmq's get_row_size).
        let (width, extra) = match name {
            "Q4_0" | "Q4_1" => (32, 0),
            "Q8_0" => (32, 4),
            "Q4_K" | "Q5_K" => (256, 4),
            "Q6_K" => (256, 0),
            "IQ4_XS" => (256, 2),
            "F16" => (16, 0),
            _ => (0, 0),
        };
        if width > 0 && ne0 % width == 0 {
            let blocks = t.elements().min(MAX_TENSOR_ELEMENTS) / ty.block_elems.max(1);
            return Some(padded(bytes + blocks * extra));
        }
    }
    let multiple = match (tier, name) {
        (Tier::Avx2 | Tier::Avx512 | Tier::Amx, "Q4_0" | "Q4_K" | "IQ4_NL" | "MXFP4") => 8,
        (Tier::Avx512 | Tier::Amx, "Q2_K") => 8,
        (Tier::ArmDotprod, "Q4_0" | "Q8_0" | "IQ4_NL" | "MXFP4" | "Q1_0") => 4,
        (Tier::ArmDotprod, "Q4_K" | "Q5_K" | "Q6_K") => 8,
        _ => return None,
    };
    (rows % multiple == 0).then(|| padded(bytes))
}

/// Whether the tier repacks this tensor (`output_copy`: it is `token_embd` standing in for the
/// output of a model with tied embeddings).
pub(crate) fn is_repacked(t: &TensorInfo, tier: Tier, output_copy: bool) -> bool {
    tier != Tier::None && repacked(t, tier, output_copy).is_some()
}

/// Whether a 2-D tensor is a matrix-multiply weight: every `*.weight` but the row-lookup
/// tables (embeddings), which the engine reads by row and never repacks.
fn matmul_weight(name: &str) -> bool {
    const LOOKUPS: [&str; 5] = [
        "token_embd.",
        "per_layer_token_embd.",
        "position_embd.",
        "token_types.",
        "pos_embd.",
    ];
    name.ends_with(".weight") && !LOOKUPS.iter().any(|l| name.starts_with(l))
}

/// Bytes of the repack buffer for one tier, and how many tensors go there.
pub fn bytes(h: &Header, tier: Tier) -> (u64, u64) {
    if tier == Tier::None {
        return (0, 0);
    }
    let tied = !h.tensors.iter().any(|t| t.name == "output.weight");
    let (mut sum, mut count) = (0u64, 0u64);
    for t in &h.tensors {
        let output_copy = tied && t.name == "token_embd.weight";
        if let Some(b) = repacked(t, tier, output_copy) {
            sum = sum.saturating_add(b);
            count += 1;
        }
    }
    (sum, count)
}

/// The largest repack among the tiers, with its tier.
pub fn largest(h: &Header, tiers: Tiers) -> (u64, Tier, u64) {
    tiers
        .iter()
        .map(|t| {
            let (b, n) = bytes(h, t);
            (b, t, n)
        })
        .max_by_key(|(b, t, _)| (*b, *t))
        .unwrap_or((0, Tier::None, 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(name: &str, ty: u32, dims: &[u64]) -> TensorInfo {
        TensorInfo {
            name: name.into(),
            dims: dims.to_vec(),
            ggml_type: ty,
            offset: 0,
        }
    }

    fn header(tensors: Vec<TensorInfo>) -> Header {
        Header {
            version: 3,
            metadata: Default::default(),
            tensors,
            alignment: 32,
            data_offset: 0,
        }
    }

    const Q4_0: u32 = 2;
    const Q8_0: u32 = 8;
    const Q4_K: u32 = 12;
    const Q6_K: u32 = 14;
    const F16: u32 = 1;

    #[test]
    fn avx2_repacks_q4_weights_but_not_embeddings_norms_or_q6_k() {
        let h = header(vec![
            tensor("token_embd.weight", Q4_K, &[2048, 32000]),
            tensor("output.weight", Q6_K, &[2048, 32000]),
            tensor("blk.0.attn_q.weight", Q4_K, &[2048, 2048]),
            tensor("blk.0.ffn_down.weight", Q4_0, &[5632, 2048]),
            tensor("blk.0.attn_norm.weight", 0, &[2048]),
            tensor("blk.0.ffn_gate_exps.weight", Q4_K, &[2048, 512, 8]),
        ]);
        let q4k = 2048 * 2048 / 256 * 144;
        let q40 = 5632 * 2048 / 32 * 18;
        let exps = 2048 * 512 * 8 / 256 * 144;
        assert_eq!(bytes(&h, Tier::Avx2), (q4k + q40 + exps, 3));
        // ARM adds Q6_K; no tier repacks a row-lookup table.
        let q6k = 2048 * 32000 / 256 * 210;
        assert_eq!(bytes(&h, Tier::ArmDotprod).0, q4k + q40 + exps + q6k);
        assert_eq!(bytes(&h, Tier::None), (0, 0));
    }

    #[test]
    fn tied_embeddings_are_repacked_as_the_output_copy() {
        let h = header(vec![tensor("token_embd.weight", Q4_0, &[1024, 151936])]);
        assert_eq!(bytes(&h, Tier::Avx2).0, 1024 * 151936 / 32 * 18);
    }

    #[test]
    fn rows_must_divide_and_amx_adds_bytes_to_q8_0_blocks() {
        let odd = header(vec![tensor("blk.0.attn_q.weight", Q4_0, &[64, 100])]);
        assert_eq!(bytes(&odd, Tier::Avx2).0, 0);
        assert_eq!(
            bytes(&odd, Tier::ArmDotprod).0,
            (64 * 100 / 32 * 18u64).div_ceil(32) * 32
        );
        let h = header(vec![
            tensor("blk.0.attn_q.weight", Q8_0, &[4096, 4096]),
            tensor("blk.0.attn_k.weight", F16, &[4096, 1024]),
        ]);
        let blocks = 4096 * 4096 / 32;
        assert_eq!(
            bytes(&h, Tier::Amx).0,
            blocks * 38 + 4096 * 1024 * 2,
            "AMX keeps Q8_0 in 38-byte blocks and copies F16"
        );
        assert_eq!(bytes(&h, Tier::Avx512).0, 0);
    }

    #[test]
    fn unknown_tiers_take_the_largest_and_the_engine_caps_them() {
        let h = header(vec![tensor("blk.0.attn_q.weight", Q8_0, &[4096, 4096])]);
        let (b, t, _) = largest(&h, Tiers::ANY);
        assert_eq!((b, t), (4096 * 4096 / 32 * 38, Tier::Amx));
        let avx2: EngineCpu = "avx2".parse().unwrap();
        assert_eq!(Tiers::ANY.capped(avx2).key(), "none|avx2");
        assert_eq!(Tiers::one(Tier::Amx).capped(avx2), Tiers::one(Tier::Avx2));
        assert_eq!(largest(&h, Tiers::ANY.capped(avx2)).0, 0);
        assert_eq!(Tiers::ARM.capped(EngineCpu::ALL), Tiers::ARM);
    }

    #[test]
    fn tiers_and_engine_code_parse_or_say_what_is_valid() {
        assert_eq!("avx2|amx".parse::<Tiers>().unwrap().key(), "avx2|amx");
        assert_eq!("unknown".parse::<Tiers>().unwrap(), Tiers::ANY);
        let e = "sse".parse::<Tiers>().unwrap_err();
        assert!(e.contains("\"sse\"") && e.contains("avx512"), "{e}");
        assert_eq!("all".parse::<EngineCpu>().unwrap(), EngineCpu::ALL);
        let e: EngineCpu = "avx512,arm-dotprod".parse().unwrap();
        assert_eq!(e.to_string(), "avx512,arm-dotprod");
        assert!(
            "avx9"
                .parse::<EngineCpu>()
                .unwrap_err()
                .contains("valid: all")
        );
    }
}

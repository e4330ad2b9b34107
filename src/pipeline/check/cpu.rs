//! The CPU code a node's llama.cpp runs, from the node's labels: Node Feature Discovery's
//! `feature.node.kubernetes.io/cpu-cpuid.*` when present, else every tier of the node's
//! architecture (`kubernetes.io/arch`), else any tier. It decides the CPU repack (see
//! `gguf::memory::repack`).

use std::collections::BTreeMap;

use crate::gguf::memory::repack::{Tier, Tiers};

/// Node Feature Discovery's prefix for CPUID flags.
pub const CPUID: &str = "feature.node.kubernetes.io/cpu-cpuid.";
const ARCH: &str = "kubernetes.io/arch";
const AVX512: [&str; 5] = ["AVX512F", "AVX512BW", "AVX512CD", "AVX512DQ", "AVX512VL"];
const AMX: [&str; 5] = [
    "AMXINT8",
    "AMXTILE",
    "AVX512VNNI",
    "AVX512BF16",
    "AVX512VBMI",
];

/// The tiers a node may run.
pub fn tiers(labels: &BTreeMap<String, String>) -> Tiers {
    let has = |flag: &str| {
        labels
            .get(&format!("{CPUID}{flag}"))
            .is_some_and(|v| v == "true")
    };
    let known = labels.keys().any(|k| k.starts_with(CPUID));
    let arch = labels.get(ARCH).map(String::as_str);
    if !known {
        return match arch {
            Some("amd64") => Tiers::X86,
            Some("arm64") => Tiers::ARM,
            _ => Tiers::ANY,
        };
    }
    let tier = if has("ASIMDDP") {
        Tier::ArmDotprod
    } else if AVX512.iter().all(|f| has(f)) && AMX.iter().all(|f| has(f)) {
        Tier::Amx
    } else if AVX512.iter().all(|f| has(f)) {
        Tier::Avx512
    } else if has("AVX2") {
        Tier::Avx2
    } else {
        Tier::None
    };
    Tiers::one(tier)
}

/// The tiers of all the nodes a replica may land on; any tier when there are none.
pub fn union<'a>(nodes: impl IntoIterator<Item = &'a Tiers>) -> Tiers {
    nodes
        .into_iter()
        .copied()
        .reduce(Tiers::union)
        .unwrap_or(Tiers::ANY)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::check::test_labels as labels;

    fn nfd(flags: &[&str]) -> BTreeMap<String, String> {
        let mut l = labels(&[("kubernetes.io/arch", "amd64")]);
        for f in flags {
            l.insert(format!("{CPUID}{f}"), "true".into());
        }
        l
    }

    #[test]
    fn nfd_labels_name_one_tier_and_their_absence_every_tier_of_the_arch() {
        assert_eq!(
            tiers(&nfd(&["AVX", "AVX2", "FMA3"])),
            Tiers::one(Tier::Avx2)
        );
        assert_eq!(tiers(&nfd(&AVX512)), Tiers::one(Tier::Avx512));
        let spr: Vec<&str> = AVX512.iter().chain(AMX.iter()).copied().collect();
        assert_eq!(tiers(&nfd(&spr)), Tiers::one(Tier::Amx));
        assert_eq!(tiers(&nfd(&["SSE4", "AVX"])), Tiers::one(Tier::None));
        assert_eq!(
            tiers(&nfd(&["ASIMD", "ASIMDDP"])),
            Tiers::one(Tier::ArmDotprod)
        );
        assert_eq!(
            tiers(&labels(&[("kubernetes.io/arch", "amd64")])),
            Tiers::X86
        );
        assert_eq!(
            tiers(&labels(&[("kubernetes.io/arch", "arm64")])),
            Tiers::ARM
        );
        assert_eq!(tiers(&labels(&[])), Tiers::ANY);
        assert_eq!(
            union(&[Tiers::one(Tier::Avx2), Tiers::one(Tier::Amx)]).key(),
            "avx2|amx"
        );
        assert_eq!(union(&[]), Tiers::ANY);
    }
}

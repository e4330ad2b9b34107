//! AMD's node labeller, for GPUs requested as an `amd.com/` resource (ROCm, or Vulkan on AMD
//! GPUs): `amd.com/gpu.vram` is one GPU's memory in GiB rounded to the nearest, such as 16G; on
//! a node whose GPUs differ, one `amd.com/gpu.vram.<size>` label per size instead, whose value
//! counts the GPUs of that size. A size is no number that node affinity can compare (`Gt` takes
//! integers), so a replica's affinity names the sizes too small for it ([`too_small`]): every
//! larger GPU, today's or a later one, is admitted without a list of them.

use std::collections::BTreeMap;

/// One GPU's memory in GiB, such as 16G, on a node whose AMD GPUs are alike.
pub const VRAM: &str = "amd.com/gpu.vram";
pub const PRODUCT: &str = "amd.com/gpu.product-name";
/// The largest size in GiB a label may say: more is no GPU's, and it bounds [`too_small`].
pub const MOST_GIB: u64 = 1024;
/// The most sizes of nodes whose GPUs differ that a replica's affinity admits by name.
pub const MOST_MIXED: usize = 16;

/// Whether the GPUs of `resource` are AMD's, which its node labeller sizes.
pub fn is_amd(resource: &str) -> bool {
    resource.starts_with("amd.com/")
}

/// The GiB of a size such as `16G`: 1 to [`MOST_GIB`].
fn gib(size: &str) -> Option<u64> {
    size.strip_suffix('G')?
        .parse::<u64>()
        .ok()
        .filter(|n| (1..=MOST_GIB).contains(n))
}

/// The memory a GPU labelled `n` GiB has at least: rounded to the nearest, it may have half a GiB
/// less (a 16 GB card's 15.98 GiB is labelled 16G).
fn least(n: u64) -> u64 {
    (n << 30) - (1 << 29)
}

/// The least memory of the node's AMD GPUs, and on a node whose GPUs differ, the size label of
/// its smallest (such as `64G`), which node affinity admits the node by. Err(None) without AMD's
/// labels, else what they say instead of a size.
pub fn vram(labels: &BTreeMap<String, String>) -> Result<(u64, Option<String>), Option<String>> {
    if let Some(size) = labels.get(VRAM) {
        return gib(size).map(|n| (least(n), None)).ok_or_else(|| {
            Some(format!(
                "{VRAM}={size:?} is not one GPU's memory in GiB, such as 16G (at most \
                 {MOST_GIB}G)"
            ))
        });
    }
    let prefix = format!("{VRAM}.");
    let mut sizes = labels
        .range(prefix.clone()..)
        .take_while(|(k, _)| k.starts_with(&prefix))
        .map(|(k, _)| &k[prefix.len()..])
        .peekable();
    if sizes.peek().is_none() {
        return Err(None);
    }
    sizes
        .filter_map(|size| Some((gib(size)?, size)))
        .min()
        .map(|(n, size)| (least(n), Some(size.to_string())))
        .ok_or_else(|| {
            Some(format!(
                "no {prefix}<size> label names one GPU's memory in GiB, such as {prefix}16G"
            ))
        })
}

/// Whether GPUs labelled `size` (such as 64G) have at least `memory` each.
pub fn holds(size: &str, memory: u64) -> bool {
    gib(size).is_some_and(|n| least(n) >= memory)
}

/// The sizes a label may say of GPUs with less than `memory`: `1G` up to the largest such, at
/// most [`MOST_GIB`] of them.
pub fn too_small(memory: u64) -> Vec<String> {
    (1..=MOST_GIB)
        .take_while(|n| least(*n) < memory)
        .map(|n| format!("{n}G"))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn a_size_is_read_as_the_least_memory_it_may_round_from() {
        assert_eq!(vram(&labels(&[(VRAM, "16G")])), Ok(((31 << 30) / 2, None)));
        assert_eq!(
            vram(&labels(&[(VRAM, "1024G")])),
            Ok(((2047 << 30) / 2, None))
        );
        // A node whose GPUs differ: the smallest counts, and its label is the one to select by.
        let mixed = labels(&[
            ("amd.com/gpu.vram.192G", "4"),
            ("amd.com/gpu.vram.64G", "4"),
            ("amd.com/gpu.vram.lots", "1"),
            ("amd.com/gpu.vramx", "1"),
        ]);
        assert_eq!(vram(&mixed), Ok((127 << 29, Some("64G".into()))));
        for bad in ["16", "0G", "-1G", "G", "1025G", "99999999999999G", "16GB"] {
            assert_eq!(
                vram(&labels(&[(VRAM, bad)])),
                Err(Some(format!(
                    "amd.com/gpu.vram={bad:?} is not one GPU's memory in GiB, such as 16G (at \
                     most 1024G)"
                ))),
            );
        }
        assert_eq!(
            vram(&labels(&[("amd.com/gpu.vram.lots", "2")])),
            Err(Some(
                "no amd.com/gpu.vram.<size> label names one GPU's memory in GiB, such as \
                 amd.com/gpu.vram.16G"
                    .into()
            ))
        );
        assert_eq!(
            vram(&labels(&[("amd.com/gpu.product-name", "x")])),
            Err(None)
        );
    }

    #[test]
    fn the_sizes_too_small_are_those_that_may_hold_less_than_the_plan() {
        // A plan on 16G GPUs (15.5 GiB): 1G to 15G may hold less, 16G may not.
        let sixteen = least(16);
        let small = too_small(sixteen);
        assert_eq!(small.len(), 15);
        assert_eq!((small[0].as_str(), small[14].as_str()), ("1G", "15G"));
        // A byte more and a 16G GPU may hold less too.
        assert_eq!(
            too_small(sixteen + 1).last().map(String::as_str),
            Some("16G")
        );
        assert!(too_small(0).is_empty() && too_small(1 << 29).is_empty());
        assert_eq!(too_small((1 << 29) + 1), ["1G"]);
        assert!(holds("16G", sixteen) && !holds("16G", sixteen + 1));
        assert!(!holds("16", 1) && !holds("2048G", 1));
        // Bounded whatever the plan says.
        assert_eq!(too_small(u64::MAX).len(), MOST_GIB as usize);
        // Every size it names reads as less than the plan, and the next one does not.
        for memory in [3 << 30, 47 << 30, (191 << 30) + 7] {
            let small = too_small(memory);
            for s in &small {
                let (m, _) = vram(&labels(&[(VRAM, s)])).unwrap();
                assert!(m < memory, "{s}");
            }
            let next = format!("{}G", small.len() + 1);
            let (m, _) = vram(&labels(&[(VRAM, &next)])).unwrap();
            assert!(m >= memory, "{next}");
        }
    }

    #[test]
    fn only_amd_resources_are_sized_by_amd_labels() {
        assert!(is_amd("amd.com/gpu"));
        assert!(!is_amd("nvidia.com/gpu") && !is_amd("gpu.intel.com/i915"));
    }
}

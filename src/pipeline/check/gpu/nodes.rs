//! What the nodes have for GPUs, read from the API: allocatable GPUs of the resource, each GPU's
//! memory and model from GPU Feature Discovery's labels (a MIG slice's own under the mixed
//! strategy; AMD's node labeller for ROCm), the CUDA driver's major version, and allocatable host
//! memory.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use super::Request;
use crate::units::parse_quantity;

/// GPU Feature Discovery's labels: memory of one GPU in MiB, its model, the driver's CUDA major.
pub const NVIDIA_MEMORY: &str = "nvidia.com/gpu.memory";
pub const NVIDIA_PRODUCT: &str = "nvidia.com/gpu.product";
pub const NVIDIA_DRIVER_MAJOR: &str = "nvidia.com/cuda.driver.major";
/// AMD's node labeller: memory of one GPU, such as 16G or 191G.
pub const AMD_VRAM: &str = "amd.com/gpu.vram";
pub const AMD_PRODUCT: &str = "amd.com/gpu.product-name";
/// The resources of MIG slices under the device plugin's mixed strategy, such as
/// `nvidia.com/mig-1g.10gb`; GFD labels each profile's memory `<resource>.memory` beside the whole
/// GPU's `nvidia.com/gpu.memory`.
pub(super) const MIG_PREFIX: &str = "nvidia.com/mig-";

/// The node label that holds, in MiB, the memory of one unit of `resource`, which node affinity
/// can compare: a MIG profile's own (`nvidia.com/mig-1g.10gb.memory`), else GFD's whole GPU's for
/// NVIDIA's resources (`nvidia.com/gpu`, or a time-sliced `nvidia.com/gpu.shared`); None for
/// others (AMD's label is a size such as 16G, not a number).
pub fn memory_label(resource: &str) -> Option<String> {
    if resource.starts_with(MIG_PREFIX) {
        Some(format!("{resource}.memory"))
    } else if resource.starts_with("nvidia.com/") {
        Some(NVIDIA_MEMORY.into())
    } else {
        None
    }
}

/// One node's GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeGpus {
    pub node: String,
    /// Allocatable GPUs of the resource.
    pub count: u32,
    /// One GPU's memory, from the labels or engine.gpuMemory.
    pub memory: Option<u64>,
    /// Whether `memory` came from the node's own label (node affinity can select on it).
    pub labelled: bool,
    pub product: Option<String>,
    pub driver_major: Option<u32>,
    /// Allocatable host memory.
    pub host_memory: u64,
}

/// The GPUs of each node in `names` (the nodes the replicas may land on).
pub fn node_gpus(nodes: &[Arc<Node>], names: &[String], req: &Request) -> Vec<NodeGpus> {
    nodes
        .iter()
        .filter(|n| names.contains(&n.name_any()))
        .map(|n| {
            let labels = n.labels();
            let allocatable = n.status.as_ref().and_then(|s| s.allocatable.as_ref());
            let get = |k: &str| {
                allocatable
                    .and_then(|a| a.get(k))
                    .and_then(|q| parse_quantity(&q.0))
            };
            let labelled = label_memory(labels, &req.resource);
            NodeGpus {
                node: n.name_any(),
                count: get(&req.resource).map_or(0, |c| c.min(1024) as u32),
                memory: req.memory.or(labelled),
                labelled: req.memory.is_none() && labelled.is_some(),
                product: product(labels, &req.resource),
                driver_major: labels.get(NVIDIA_DRIVER_MAJOR).and_then(|v| v.parse().ok()),
                host_memory: get("memory").unwrap_or(0),
            }
        })
        .collect()
}

/// The memory of one unit of `resource` from the node's labels: GFD's (MiB) for NVIDIA's
/// resources, a MIG slice's own and never the whole GPU's; else GFD's or AMD's (a size such as
/// 16G, read as GiB).
fn label_memory(labels: &BTreeMap<String, String>, resource: &str) -> Option<u64> {
    let mib = |key: &str| {
        let mib = labels.get(key)?.parse::<u64>().ok()?;
        mib.checked_mul(1 << 20).filter(|m| *m > 0)
    };
    if let Some(key) = memory_label(resource) {
        return mib(&key);
    }
    if let Some(m) = mib(NVIDIA_MEMORY) {
        return Some(m);
    }
    let v = labels.get(AMD_VRAM)?;
    let v = v
        .strip_suffix('G')
        .map(|g| format!("{g}Gi"))
        .unwrap_or_else(|| v.clone());
    parse_quantity(&v).filter(|m| *m > 0)
}

/// The GPU's model from the labels; for a MIG slice, with its profile, as GFD names MIG devices
/// under the single strategy (`NVIDIA-A100-SXM4-40GB-MIG-1g.5gb`).
fn product(labels: &BTreeMap<String, String>, resource: &str) -> Option<String> {
    let gpu = labels
        .get(NVIDIA_PRODUCT)
        .or_else(|| labels.get(AMD_PRODUCT))
        .cloned();
    match resource.strip_prefix(MIG_PREFIX) {
        Some(profile) => Some(format!("{}-MIG-{profile}", gpu.as_deref().unwrap_or("GPU"))),
        None => gpu,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_memory_is_read_from_gfd_in_mib_and_from_amd_in_gib() {
        let l = |k: &str, v: &str| BTreeMap::from([(k.to_string(), v.to_string())]);
        let nvidia = "nvidia.com/gpu";
        assert_eq!(
            label_memory(&l(NVIDIA_MEMORY, "23028"), nvidia),
            Some(23028 << 20)
        );
        assert_eq!(
            label_memory(&l(AMD_VRAM, "16G"), "amd.com/gpu"),
            Some(16 << 30)
        );
        assert_eq!(label_memory(&l(NVIDIA_MEMORY, "lots"), nvidia), None);
        assert_eq!(label_memory(&BTreeMap::new(), nvidia), None);
        // A time-sliced GPU under another name is still the whole GPU's memory.
        let shared = "nvidia.com/gpu.shared";
        assert_eq!(
            label_memory(&l(NVIDIA_MEMORY, "23028"), shared),
            Some(23028 << 20)
        );
    }

    #[test]
    fn a_mig_slice_is_its_profiles_memory_never_the_whole_gpus() {
        // GFD's labels of an A100 40GB under the mixed strategy.
        let labels = BTreeMap::from(
            [
                (NVIDIA_MEMORY, "40537"),
                (NVIDIA_PRODUCT, "NVIDIA-A100-SXM4-40GB"),
                ("nvidia.com/mig-1g.5gb.count", "7"),
                ("nvidia.com/mig-1g.5gb.memory", "4864"),
                ("nvidia.com/mig-3g.20gb.memory", "20096"),
            ]
            .map(|(k, v)| (k.to_string(), v.to_string())),
        );
        let small = "nvidia.com/mig-1g.5gb";
        assert_eq!(label_memory(&labels, small), Some(4864 << 20));
        assert_eq!(
            label_memory(&labels, "nvidia.com/mig-3g.20gb"),
            Some(20096 << 20)
        );
        assert_eq!(
            product(&labels, small).as_deref(),
            Some("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb")
        );
        // A profile the node does not label is unknown, not the whole GPU's 40 GiB.
        assert_eq!(label_memory(&labels, "nvidia.com/mig-2g.10gb"), None);
        assert_eq!(
            memory_label(small).as_deref(),
            Some("nvidia.com/mig-1g.5gb.memory")
        );
        assert_eq!(
            memory_label("nvidia.com/gpu").as_deref(),
            Some(NVIDIA_MEMORY)
        );
        assert_eq!(memory_label("amd.com/gpu"), None);
    }
}

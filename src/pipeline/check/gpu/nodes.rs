//! What the nodes have for GPUs, read from the API: allocatable GPUs of the resource, each GPU's
//! memory and model from GPU Feature Discovery's labels (a MIG slice's own under the mixed
//! strategy; AMD's node labeller for ROCm), how many pods share each GPU (time-slicing or MPS),
//! the CUDA driver's major version, and allocatable host memory.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;

use super::{Request, amd, gke, instance};
use crate::units::parse_quantity;

/// GPU Feature Discovery's labels: memory of one GPU in MiB, its model, the driver's CUDA major.
pub const NVIDIA_MEMORY: &str = "nvidia.com/gpu.memory";
pub const NVIDIA_PRODUCT: &str = "nvidia.com/gpu.product";
pub const NVIDIA_DRIVER_MAJOR: &str = "nvidia.com/cuda.driver.major";
/// The resources of MIG slices under the device plugin's mixed strategy, such as
/// `nvidia.com/mig-1g.10gb`; GFD labels each profile's memory `<resource>.memory` beside the whole
/// GPU's `nvidia.com/gpu.memory`.
pub(super) const MIG_PREFIX: &str = "nvidia.com/mig-";

/// Most pods that may share one GPU: with a larger (or unreadable) replicas label, a GPU's share
/// is unknown, as if its memory were not labelled.
pub const MOST_SHARED_BY: u32 = 1024;

/// The node label that holds, in MiB, the memory of one unit of `resource`, which node affinity
/// can compare: a MIG profile's own (`nvidia.com/mig-1g.10gb.memory`), else GFD's whole GPU's for
/// NVIDIA's resources (`nvidia.com/gpu`, or a time-sliced `nvidia.com/gpu.shared`); None for
/// others (AMD's label is a size such as 16G, not a number: see [`amd`]).
pub fn memory_label(resource: &str) -> Option<String> {
    if resource.starts_with(MIG_PREFIX) {
        Some(format!("{resource}.memory"))
    } else if resource.starts_with("nvidia.com/") {
        Some(NVIDIA_MEMORY.into())
    } else {
        None
    }
}

/// The node label that says how many pods share one unit of `resource` under the device plugin's
/// time-slicing or MPS (GFD's `replicas`: 0 or 1 when not shared): keyed like the memory label,
/// by the resource the plugin replicates (`nvidia.com/gpu` also when it advertises the shares as
/// `nvidia.com/gpu.shared`). None for others.
pub fn sharing_label(resource: &str) -> Option<String> {
    let memory = memory_label(resource)?;
    Some(format!("{}.replicas", memory.strip_suffix(".memory")?))
}

/// One node's GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeGpus {
    pub node: String,
    /// Allocatable GPUs of the resource.
    pub count: u32,
    /// The memory one unit of the resource may use, from the labels or engine.gpuMemory: a GPU
    /// shared by `shared_by` pods counts its part, as MPS limits each one to (time-slicing
    /// does not, but then the pods that share it all fit). Unknown: why, the label that is
    /// missing or one that says no size or count.
    pub memory: Result<u64, String>,
    /// How many pods share each GPU (time-slicing or MPS); 1 when not shared.
    pub shared_by: u32,
    /// Whether `memory` came from the node's own label (node affinity can select on it).
    pub labelled: bool,
    /// The GKE accelerator whose known memory `memory` is, on a node GFD does not label.
    pub gke: Option<String>,
    /// The instance type (EC2, Azure) whose GPUs' known memory `memory` is, on a node GFD does
    /// not label.
    pub instance_type: Option<String>,
    /// On a node whose AMD GPUs differ in size, the size label of the smallest (`64G` of
    /// `amd.com/gpu.vram.64G`), whose memory `memory` is.
    pub amd_mixed: Option<String>,
    pub product: Option<String>,
    pub driver_major: Option<u32>,
    /// Allocatable host memory.
    pub host_memory: u64,
}

impl NodeGpus {
    /// Whether the node can give a replica `gpus` GPUs: that many units of the resource, and for
    /// more than one, GPUs not shared among pods (with time-slicing two shares may be one GPU,
    /// and MPS refuses a pod more than one).
    pub fn takes(&self, gpus: u32) -> bool {
        self.count >= gpus && (gpus <= 1 || self.shared_by == 1)
    }

    /// The memory one unit of the resource may use, where it is known.
    pub fn known(&self) -> Option<u64> {
        self.memory.as_ref().ok().copied()
    }

    /// What of the node the placement depends on, for status.check.request: a change there
    /// checks again. A known memory reads as it did before an unknown one said why.
    pub fn key(&self) -> String {
        let memory = match &self.memory {
            Ok(m) => format!("Some({m})"),
            Err(why) => format!("None({why})"),
        };
        let shared = match self.shared_by {
            1 => String::new(),
            by => format!(":/{by}"),
        };
        format!(
            "{}:{}:{memory}:{:?}:{}{shared}",
            self.node, self.count, self.driver_major, self.host_memory
        )
    }
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
            let shared_by = shared_by(labels, &req.resource);
            let (whole, known) = gpu_memory(labels, &req.resource);
            let labelled = whole.and_then(|m| Ok(m / u64::from(shared_by.clone()?)));
            let assumed = |label: &str| {
                known
                    .as_ref()
                    .filter(|(l, _)| *l == label && req.memory.is_none() && labelled.is_ok())
                    .map(|(_, name)| name.clone())
            };
            NodeGpus {
                node: n.name_any(),
                count: get(&req.resource).map_or(0, |c| c.min(1024) as u32),
                shared_by: shared_by.unwrap_or(1),
                labelled: req.memory.is_none() && labelled.is_ok(),
                gke: assumed(gke::ACCELERATOR),
                instance_type: assumed(instance::INSTANCE_TYPE),
                amd_mixed: amd::is_amd(&req.resource)
                    .then(|| amd::vram(labels).ok()?.1)
                    .flatten()
                    .filter(|_| req.memory.is_none()),
                memory: req.memory.map_or(labelled, Ok),
                product: product(labels, &req.resource),
                driver_major: labels.get(NVIDIA_DRIVER_MAJOR).and_then(|v| v.parse().ok()),
                host_memory: get("memory").unwrap_or(0),
            }
        })
        .collect()
}

/// One GPU's memory from the node's labels, and on a GKE, EC2 or Azure node that GFD does not
/// label, the label whose value names the GPUs whose known memory it is, and that value.
fn gpu_memory(
    labels: &BTreeMap<String, String>,
    resource: &str,
) -> (Result<u64, String>, Option<(&'static str, String)>) {
    let labelled = label_memory(labels, resource);
    if labelled.is_ok() || labels.contains_key(NVIDIA_MEMORY) {
        return (labelled, None);
    }
    let known = [
        (gke::ACCELERATOR, gke::label_memory(labels, resource)),
        (
            instance::INSTANCE_TYPE,
            instance::label_memory(labels, resource),
        ),
    ];
    match known.into_iter().find_map(|(l, m)| Some((l, m?))) {
        Some((label, Ok((memory, name)))) => (Ok(memory), Some((label, name))),
        Some((_, Err(why))) => (Err(why), None),
        None => (labelled, None),
    }
}

/// How many pods share each unit of `resource` on the node: 1 without the label (or with GFD's 0
/// when sharing is off), GKE's where GFD does not say; what the label says instead when it is
/// not a count up to [`MOST_SHARED_BY`].
fn shared_by(labels: &BTreeMap<String, String>, resource: &str) -> Result<u32, String> {
    let Some(key) = sharing_label(resource) else {
        return Ok(1);
    };
    let Some(v) = labels.get(&key) else {
        return gke::shared_by(labels, resource).unwrap_or(Ok(1));
    };
    match v.parse::<u32>() {
        Ok(0) => Ok(1),
        Ok(n) if n <= MOST_SHARED_BY => Ok(n),
        _ => Err(format!(
            "{key}={v:?} is not a count of the pods that share a GPU, 0 to {MOST_SHARED_BY}"
        )),
    }
}

/// The memory of one unit of `resource` from the node's labels: GFD's (MiB) for NVIDIA's
/// resources, a MIG slice's own and never the whole GPU's; AMD's for AMD's, which node affinity
/// selects by; else GFD's or AMD's. Without it, the label that is missing or what it says
/// instead of a size.
fn label_memory(labels: &BTreeMap<String, String>, resource: &str) -> Result<u64, String> {
    let mib = |key: &str| {
        let v = labels.get(key).ok_or_else(|| format!("no {key} label"))?;
        v.parse::<u64>()
            .ok()
            .and_then(|mib| mib.checked_mul(1 << 20))
            .filter(|m| *m > 0)
            .ok_or_else(|| format!("{key}={v:?} is not one GPU's memory in MiB, such as 24576"))
    };
    if let Some(key) = memory_label(resource) {
        return mib(&key);
    }
    let amd_vram = || amd::vram(labels).map(|(m, _)| m);
    if amd::is_amd(resource) {
        return amd_vram().map_err(|why| why.unwrap_or_else(|| format!("no {} label", amd::VRAM)));
    }
    match (mib(NVIDIA_MEMORY), amd_vram()) {
        (Ok(m), _) | (_, Ok(m)) => Ok(m),
        (Err(nvidia), Err(None)) if labels.contains_key(NVIDIA_MEMORY) => Err(nvidia),
        (_, Err(Some(amd))) => Err(amd),
        (_, Err(None)) => Err(format!("no {NVIDIA_MEMORY} or {} label", amd::VRAM)),
    }
}

/// How many nodes [`unknown_text`] names; the rest are counted.
const NAMED: usize = 5;

/// Those of `nodes` whose GPU memory is unknown, each with why: "a: no nvidia.com/gpu.memory
/// label; b: ...", the first [`NAMED`] of them and how many more.
pub fn unknown_text(nodes: &[&NodeGpus]) -> String {
    let unknown: Vec<String> = nodes
        .iter()
        .filter_map(|n| Some(format!("{}: {}", n.node, n.memory.as_ref().err()?)))
        .collect();
    let mut text = unknown[..unknown.len().min(NAMED)].join("; ");
    if unknown.len() > NAMED {
        text = format!("{text}; and {} more", unknown.len() - NAMED);
    }
    text
}

/// The GPU's model from the labels; for a MIG slice, with its profile, as GFD names MIG devices
/// under the single strategy (`NVIDIA-A100-SXM4-40GB-MIG-1g.5gb`).
fn product(labels: &BTreeMap<String, String>, resource: &str) -> Option<String> {
    let gpu = labels
        .get(NVIDIA_PRODUCT)
        .or_else(|| labels.get(amd::PRODUCT))
        .or_else(|| labels.get(gke::ACCELERATOR))
        .cloned()
        .or_else(|| instance::product(labels, resource));
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
            Ok(23028 << 20)
        );
        // AMD's is rounded to the nearest GiB: at least half a GiB less (amd.rs reads it).
        let amd = "amd.com/gpu";
        assert_eq!(label_memory(&l(amd::VRAM, "16G"), amd), Ok((31 << 30) / 2));
        let mixed = BTreeMap::from([
            ("amd.com/gpu.vram.192G".to_string(), "4".to_string()),
            ("amd.com/gpu.vram.64G".to_string(), "4".to_string()),
        ]);
        assert_eq!(label_memory(&mixed, amd), Ok(127 << 29));
        assert_eq!(
            label_memory(&l(amd::VRAM, "16"), amd).unwrap_err(),
            "amd.com/gpu.vram=\"16\" is not one GPU's memory in GiB, such as 16G (at most 1024G)"
        );
        // AMD's GPUs are sized by AMD's labels alone, which their node affinity selects by.
        assert_eq!(
            label_memory(&l(NVIDIA_MEMORY, "23028"), amd).unwrap_err(),
            "no amd.com/gpu.vram label"
        );
        // Another vendor's resource takes either.
        let other = "gpu.example.com/gpu";
        assert_eq!(
            label_memory(&l(NVIDIA_MEMORY, "23028"), other),
            Ok(23028 << 20)
        );
        assert_eq!(label_memory(&mixed, other), Ok(127 << 29));
        assert_eq!(
            label_memory(&BTreeMap::new(), other).unwrap_err(),
            "no nvidia.com/gpu.memory or amd.com/gpu.vram label"
        );
        // A size that is no number of MiB is named with what it says, and a missing one too.
        for bad in ["lots", "0", "24GB", "99999999999999999"] {
            assert_eq!(
                label_memory(&l(NVIDIA_MEMORY, bad), nvidia),
                Err(format!(
                    "nvidia.com/gpu.memory={bad:?} is not one GPU's memory in MiB, such as 24576"
                ))
            );
        }
        assert_eq!(
            label_memory(&BTreeMap::new(), nvidia).unwrap_err(),
            "no nvidia.com/gpu.memory label"
        );
        // A time-sliced GPU under another name is still the whole GPU's memory.
        let shared = "nvidia.com/gpu.shared";
        assert_eq!(
            label_memory(&l(NVIDIA_MEMORY, "23028"), shared),
            Ok(23028 << 20)
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
        assert_eq!(label_memory(&labels, small), Ok(4864 << 20));
        assert_eq!(
            label_memory(&labels, "nvidia.com/mig-3g.20gb"),
            Ok(20096 << 20)
        );
        assert_eq!(
            product(&labels, small).as_deref(),
            Some("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb")
        );
        // A profile the node does not label is unknown, not the whole GPU's 40 GiB.
        assert_eq!(
            label_memory(&labels, "nvidia.com/mig-2g.10gb").unwrap_err(),
            "no nvidia.com/mig-2g.10gb.memory label"
        );
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

    /// A node with GFD's labels of one 24 GiB GPU and `extra` labels, allocating `resource`.
    fn node(resource: &str, count: u32, extra: &[(&str, &str)]) -> Arc<Node> {
        let mut labels = serde_json::json!({
            NVIDIA_MEMORY: "24576",
            NVIDIA_PRODUCT: "NVIDIA-L4",
        });
        for (k, v) in extra {
            labels[*k] = (*v).into();
        }
        Arc::new(
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": "n", "labels": labels},
                "status": {"allocatable": {resource: count.to_string(), "memory": "64Gi"}},
            }))
            .unwrap(),
        )
    }

    fn request(resource: &str, memory: Option<u64>) -> Request {
        Request {
            accelerator: crate::api::Accelerator::Cuda,
            gpus: 1,
            resource: resource.into(),
            layers: None,
            split_mode: Default::default(),
            memory,
            margin: 1 << 30,
            cuda_major: None,
        }
    }

    #[test]
    fn a_gpu_shared_by_pods_counts_one_pods_share_of_its_memory() {
        let gpu = "nvidia.com/gpu";
        let names = ["n".to_string()];
        let one = |n: Arc<Node>, r: &Request| node_gpus(&[n], &names, r).remove(0);
        // Time-slicing four ways, as GFD labels it: four units of the resource, each a quarter.
        let sliced = [
            ("nvidia.com/gpu.replicas", "4"),
            ("nvidia.com/gpu.sharing-strategy", "time-slicing"),
        ];
        let n = one(node(gpu, 4, &sliced), &request(gpu, None));
        assert_eq!((n.count, n.memory, n.shared_by), (4, Ok(6 << 30), 4));
        assert!(n.labelled);
        // The same shares under their own name keep the labels of nvidia.com/gpu.
        let renamed = "nvidia.com/gpu.shared";
        let n = one(node(renamed, 4, &sliced), &request(renamed, None));
        assert_eq!((n.count, n.memory, n.shared_by), (4, Ok(6 << 30), 4));
        // Not shared: GFD's 1, or 0 when sharing is off, or no label at all.
        for replicas in [
            &[("nvidia.com/gpu.replicas", "1")][..],
            &[("nvidia.com/gpu.replicas", "0")],
            &[],
        ] {
            let n = one(node(gpu, 1, replicas), &request(gpu, None));
            assert_eq!((n.memory, n.shared_by), (Ok(24 << 30), 1), "{replicas:?}");
        }
        // A replicas label that is no count leaves the share unknown, as an unlabelled GPU,
        // and says why.
        for bad in ["many", "-2", "100000"] {
            let n = one(
                node(gpu, 4, &[("nvidia.com/gpu.replicas", bad)]),
                &request(gpu, None),
            );
            assert_eq!(
                n.memory,
                Err(format!(
                    "nvidia.com/gpu.replicas={bad:?} is not a count of the pods that share a \
                     GPU, 0 to 1024"
                )),
                "{bad}"
            );
        }
        // engine.gpuMemory is what a replica may use, as the spec says it.
        let n = one(node(gpu, 4, &sliced), &request(gpu, Some(10 << 30)));
        assert_eq!((n.memory, n.labelled), (Ok(10 << 30), false));
        // A MIG slice shared by two: its profile's replicas label.
        let mig = "nvidia.com/mig-1g.5gb";
        let n = one(
            node(
                mig,
                14,
                &[
                    ("nvidia.com/mig-1g.5gb.memory", "4864"),
                    ("nvidia.com/mig-1g.5gb.replicas", "2"),
                    ("nvidia.com/gpu.replicas", "8"),
                ],
            ),
            &request(mig, None),
        );
        assert_eq!((n.memory, n.shared_by), (Ok(2432 << 20), 2));
        assert_eq!(
            sharing_label(mig).as_deref(),
            Some("nvidia.com/mig-1g.5gb.replicas")
        );
        assert_eq!(
            sharing_label(renamed).as_deref(),
            Some("nvidia.com/gpu.replicas")
        );
        assert_eq!(sharing_label("amd.com/gpu"), None);
    }

    #[test]
    fn a_gke_eks_or_aks_node_without_gfd_is_sized_by_its_gpus_model_and_gfd_wins_where_it_labels() {
        let gpu = "nvidia.com/gpu";
        let names = ["n".to_string()];
        let gke_node = |labels: serde_json::Value, count: u32| -> Arc<Node> {
            Arc::new(
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": "n", "labels": labels},
                    "status": {"allocatable": {gpu: count.to_string(), "memory": "64Gi"}},
                }))
                .unwrap(),
            )
        };
        let l4 = serde_json::json!({gke::ACCELERATOR: "nvidia-l4"});
        let n = node_gpus(&[gke_node(l4.clone(), 1)], &names, &request(gpu, None)).remove(0);
        assert_eq!((n.memory, n.shared_by), (Ok(23034 << 20), 1));
        assert!(n.labelled);
        assert_eq!(n.gke.as_deref(), Some("nvidia-l4"));
        assert_eq!(n.product.as_deref(), Some("nvidia-l4"));
        // Time-shared four ways: four units of nvidia.com/gpu, each a quarter of the L4.
        let mut sliced = l4.clone();
        sliced[gke::SHARED_CLIENTS] = "4".into();
        let n = node_gpus(&[gke_node(sliced, 4)], &names, &request(gpu, None)).remove(0);
        assert_eq!((n.memory, n.shared_by), (Ok((23034 << 20) / 4), 4));
        // GFD's label, where it runs on GKE, is what counts.
        let mut both = l4.clone();
        both[NVIDIA_MEMORY] = "23028".into();
        let n = node_gpus(&[gke_node(both, 1)], &names, &request(gpu, None)).remove(0);
        assert_eq!((n.memory, n.gke), (Ok(23028 << 20), None));
        // engine.gpuMemory: neither label.
        let n = node_gpus(&[gke_node(l4, 1)], &names, &request(gpu, Some(8 << 30))).remove(0);
        assert_eq!((n.memory, n.labelled, n.gke), (Ok(8 << 30), false, None));
        // On EKS, the GPUs of the EC2 type; GFD's label wins there too.
        let mut g5 = serde_json::json!({instance::INSTANCE_TYPE: "g5.2xlarge"});
        let n = node_gpus(&[gke_node(g5.clone(), 1)], &names, &request(gpu, None)).remove(0);
        assert_eq!((n.memory, n.gke), (Ok(23028 << 20), None));
        assert_eq!(n.instance_type.as_deref(), Some("g5.2xlarge"));
        assert_eq!(n.product.as_deref(), Some("NVIDIA-A10G"));
        g5[NVIDIA_MEMORY] = "23000".into();
        let n = node_gpus(&[gke_node(g5, 1)], &names, &request(gpu, None)).remove(0);
        assert_eq!((n.memory, n.instance_type), (Ok(23000 << 20), None));
        // A model modelserve does not know is unknown memory, saying why.
        let b200 = serde_json::json!({gke::ACCELERATOR: "nvidia-b200"});
        let n = node_gpus(&[gke_node(b200, 8)], &names, &request(gpu, None)).remove(0);
        assert!(
            n.memory
                .unwrap_err()
                .starts_with("cloud.google.com/gke-accelerator=\"nvidia-b200\"")
        );
    }

    #[test]
    fn an_amd_node_whose_gpus_differ_is_known_by_its_smallest_size() {
        let amd = "amd.com/gpu";
        let names = ["n".to_string()];
        let one = |labels: serde_json::Value, r: &Request| {
            let n: Node = serde_json::from_value(serde_json::json!({
                "metadata": {"name": "n", "labels": labels},
                "status": {"allocatable": {amd: "8", "memory": "64Gi"}},
            }))
            .unwrap();
            node_gpus(&[Arc::new(n)], &names, r).remove(0)
        };
        let mixed = serde_json::json!({
            "amd.com/gpu.vram.192G": "4", "amd.com/gpu.vram.64G": "4",
            amd::PRODUCT: "Instinct-MI300X",
        });
        let n = one(mixed.clone(), &request(amd, None));
        assert_eq!(
            (n.memory, n.amd_mixed.as_deref()),
            (Ok(127 << 29), Some("64G"))
        );
        assert_eq!(n.product.as_deref(), Some("Instinct-MI300X"));
        assert!(n.labelled);
        // GPUs alike: the one label, no size to name.
        let alike = one(serde_json::json!({amd::VRAM: "192G"}), &request(amd, None));
        assert_eq!((alike.memory, alike.amd_mixed), (Ok(383 << 29), None));
        // engine.gpuMemory: no label counts.
        let set = one(mixed, &request(amd, Some(8 << 30)));
        assert_eq!(
            (set.memory, set.labelled, set.amd_mixed),
            (Ok(8 << 30), false, None)
        );
    }

    #[test]
    fn a_nodes_key_changes_with_why_its_memory_is_unknown_and_a_known_ones_stays_as_it_was() {
        let gpu = "nvidia.com/gpu";
        let names = ["n".to_string()];
        let key = |extra: &[(&str, &str)]| {
            node_gpus(&[node(gpu, 2, extra)], &names, &request(gpu, None))[0].key()
        };
        // The key status.check.request held before the reason was kept: no check again.
        assert_eq!(key(&[]), "n:2:Some(25769803776):None:68719476736");
        assert_eq!(
            key(&[("nvidia.com/gpu.replicas", "2")]),
            "n:2:Some(12884901888):None:68719476736:/2"
        );
        let bad = key(&[(NVIDIA_MEMORY, "24GB")]);
        assert!(
            bad.starts_with("n:2:None(nvidia.com/gpu.memory=\"24GB\" is"),
            "{bad}"
        );
        assert_ne!(bad, key(&[(NVIDIA_MEMORY, "lots")]));
    }

    #[test]
    fn nodes_of_unknown_gpu_memory_are_named_with_why_the_first_five() {
        let gpu = "nvidia.com/gpu";
        // n3 is labelled as it should be: it is not named, nor counted.
        let nodes: Vec<Arc<Node>> = (0..8)
            .map(|i| {
                let mut n = (*node(gpu, 1, &[])).clone();
                n.metadata.name = Some(format!("n{i}"));
                let labels = n.metadata.labels.as_mut().unwrap();
                match i {
                    0 => drop(labels.remove(NVIDIA_MEMORY)),
                    1 => drop(labels.insert(NVIDIA_MEMORY.into(), "24GB".into())),
                    3 => {}
                    _ => drop(labels.insert("nvidia.com/gpu.replicas".into(), "many".into())),
                }
                Arc::new(n)
            })
            .collect();
        let names: Vec<String> = (0..8).map(|i| format!("n{i}")).collect();
        let gpus = node_gpus(&nodes, &names, &request(gpu, None));
        let text = unknown_text(&gpus.iter().collect::<Vec<_>>());
        assert!(
            text.starts_with(
                "n0: no nvidia.com/gpu.memory label; n1: nvidia.com/gpu.memory=\"24GB\" is not \
                 one GPU's memory in MiB, such as 24576; n2: nvidia.com/gpu.replicas=\"many\" is"
            ),
            "{text}"
        );
        assert!(text.ends_with("; n5: nvidia.com/gpu.replicas=\"many\" is not a count of the pods that share a GPU, 0 to 1024; and 2 more"), "{text}");
        assert!(!text.contains("n3"), "{text}");
    }
}

//! GPUs in the Check stage. What the spec and the operator's settings ask ([`request`]). What
//! the nodes have, read from the API ([`nodes`]): allocatable GPUs of the resource, each GPU's
//! memory and model from GPU Feature Discovery's labels (AMD's node labeller for ROCm), and the
//! CUDA driver's major version. Then the placement a replica runs with, by llama.cpp's own rules
//! (`gguf::offload`): on the smallest GPUs that hold the whole model with the headroom, else on
//! the GPUs that hold the most layers, the rest in host RAM. Replicas then go only to nodes whose
//! GPUs are at least that large (node affinity on the memory label), so the plan holds wherever
//! the scheduler puts them.

use crate::api::DeviceStatus;
use crate::gguf::header::Header;
use crate::gguf::memory::Flags;
use crate::gguf::offload::{self, Decision, Device, Placement};
use crate::units::human_bytes;

pub mod amd;
pub mod gke;
pub mod instance;
mod nodes;
mod nvml;
mod request;

pub use nodes::{
    MOST_SHARED_BY, NVIDIA_DRIVER_MAJOR, NVIDIA_MEMORY, NVIDIA_PRODUCT, NodeGpus, memory_label,
    node_gpus, sharing_label, unknown_text,
};
pub use request::{Request, cuda_major_of_image, tolerations};

/// The placement a replica runs with, and on which GPUs.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub placement: Placement,
    /// One GPU's memory the placement assumes; every node in `nodes` has at least that.
    pub memory: u64,
    /// Whether that figure is a node label (node affinity can require it).
    pub labelled: bool,
    /// The GKE accelerators of the nodes in `nodes` whose GPU memory is what modelserve knows
    /// of the model, GFD labelling none, in name order.
    pub gke: Vec<String>,
    /// The instance types of the nodes in `nodes` whose GPU memory is what modelserve knows of
    /// the type (EC2, Azure), GFD labelling none, in name order.
    pub instance_types: Vec<String>,
    /// The size labels of the smallest GPUs of the nodes in `nodes` whose AMD GPUs differ in
    /// size (`64G` of `amd.com/gpu.vram.64G`), each once.
    pub amd_mixed: Vec<String>,
    pub product: Option<String>,
    pub nodes: Vec<String>,
    /// How many pods share each GPU (time-slicing or MPS) on those nodes, each count once: the
    /// memory a replica plans on is a GPU's divided by it.
    pub shared_by: Vec<u32>,
    pub message: String,
}

impl Plan {
    /// status.check.devices.
    pub fn devices(&self) -> Vec<DeviceStatus> {
        let i = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        self.placement
            .devices
            .iter()
            .enumerate()
            .map(|(index, d)| DeviceStatus {
                index: index as i32,
                product: self.product.clone(),
                layers: layers_text(d.layers.clone(), d.output),
                weights_bytes: i(d.weights),
                kv_bytes: i(d.kv.saturating_add(d.recurrent)),
                compute_bytes: i(d.compute),
                total_bytes: i(d.total),
                memory_bytes: i(self.memory),
            })
            .collect()
    }
}

fn layers_text(r: std::ops::Range<u32>, output: bool) -> String {
    let blocks = match r.len() {
        0 => "none".to_string(),
        1 => r.start.to_string(),
        _ => format!("{}-{}", r.start, r.end - 1),
    };
    if output {
        format!("{blocks} and the output")
    } else {
        blocks
    }
}

/// GPUs of one size, as some nodes have them.
struct Class {
    memory: u64,
    labelled: bool,
    product: Option<String>,
}

/// Decides the placement over the nodes' GPUs, or says why no node can take the model.
pub fn plan(h: &Header, f: &Flags, nodes: &[NodeGpus], req: &Request) -> Result<Plan, String> {
    let want = req.gpus;
    let enough: Vec<&NodeGpus> = nodes.iter().filter(|n| n.takes(want)).collect();
    // Nodes with as many shares of GPUs, which are not GPUs apart.
    let shared = nodes
        .iter()
        .filter(|n| n.count >= want && !n.takes(want))
        .max_by_key(|n| n.shared_by);
    if let (true, Some(n)) = (enough.is_empty(), shared) {
        return Err(format!(
            "a replica asks for {want} {} and the nodes that have that many share each GPU among pods ({}: {}={}): a pod gets at most one share of a GPU (time-slicing may give it two shares of one GPU, and MPS refuses more than one); set engine.gpus to 1 or use unshared GPUs",
            req.resource,
            n.node,
            sharing_label(&req.resource).unwrap_or_default(),
            n.shared_by
        ));
    }
    if enough.is_empty() {
        let most = nodes.iter().max_by_key(|n| n.count);
        return Err(match most {
            Some(n) if n.count > 0 => format!(
                "a replica asks for {want} {} and no node has that many: the most, {}, has {}",
                req.resource, n.node, n.count
            ),
            _ => format!(
                "a replica asks for {want} {} and no node it may run on has any (allocatable {})",
                req.resource, req.resource
            ),
        });
    }
    let driver_ok = |n: &&NodeGpus| match (req.cuda_major, n.driver_major) {
        (Some(image), Some(node)) => node >= image,
        _ => true,
    };
    let usable: Vec<&NodeGpus> = enough.iter().copied().filter(driver_ok).collect();
    if usable.is_empty() {
        let n = enough[0];
        return Err(format!(
            "the engine image needs a CUDA {} driver and every node with {want} GPUs has an older one ({} has CUDA {}); use a server-cuda image of the nodes' CUDA major",
            req.cuda_major.unwrap_or_default(),
            n.node,
            n.driver_major.unwrap_or_default()
        ));
    }
    // The nodes whose GPU memory is unknown, named with why; empty where there are none.
    let unknown = unknown_text(&usable);
    let mut classes: Vec<Class> = usable
        .iter()
        .filter_map(|n| {
            n.known().map(|memory| Class {
                memory,
                labelled: n.labelled,
                product: n.product.clone(),
            })
        })
        .collect();
    classes.sort_by_key(|c| c.memory);
    classes.dedup_by_key(|c| c.memory);
    if classes.is_empty() {
        return Err(format!(
            "no node says how much memory its GPUs have ({unknown}); set engine.gpuMemory to one GPU's memory, such as 24Gi"
        ));
    }
    let split = vec![1.0; want as usize];
    let mut best: Option<(Decision, &Class, Vec<Device>)> = None;
    for class in &classes {
        let name = class.product.clone().unwrap_or_else(|| "GPU".into());
        let devices: Vec<Device> = (0..want)
            .map(|_| Device {
                name: name.clone(),
                free: class.memory,
            })
            .collect();
        let decision = match req.layers {
            Some(ngl) => {
                let placement = offload::place(h, f, ngl, &split).map_err(|e| e.to_string())?;
                forced(placement, &devices, req.margin)
            }
            None => offload::decide(h, f, &devices, req.margin).map_err(|e| e.to_string())?,
        };
        let better = match (&best, &decision) {
            (None, _) => true,
            (Some((Decision::Full(_), ..)), _) => false,
            (Some(_), Decision::Full(_)) => true,
            (Some((old, ..)), Decision::Partial(p)) => {
                matches!(old, Decision::NoFit { .. }) || p.ngl > old.placement().ngl
            }
            (Some(_), Decision::NoFit { .. }) => false,
        };
        if better {
            let full = matches!(decision, Decision::Full(_));
            best = Some((decision, class, devices));
            if full {
                break;
            }
        }
    }
    let Some((decision, class, devices)) = best else {
        return Err("no GPU class to place the model on".into());
    };
    let message = decision.message(&devices);
    if let Decision::NoFit { .. } = decision {
        return Err(format!(
            "{message}; the largest GPUs the replicas may get have {} each",
            human_bytes(classes.last().map_or(0, |c| c.memory))
        ));
    }
    let chosen: Vec<&NodeGpus> = usable
        .iter()
        .copied()
        .filter(|n| n.known().is_some_and(|m| m >= class.memory))
        .collect();
    let shared_by = distinct(chosen.iter().map(|n| n.shared_by));
    let mut message = message;
    if let Some(most) = shared_by.last().filter(|by| **by > 1) {
        message = format!(
            "{message}; GPUs shared by up to {most} pods ({}) count only a pod's share of their memory",
            sharing_label(&req.resource).unwrap_or_default()
        );
    }
    let amd_mixed = distinct(chosen.iter().filter_map(|n| n.amd_mixed.clone()));
    let gke = distinct(chosen.iter().filter_map(|n| n.gke.clone()));
    if !gke.is_empty() {
        message = format!(
            "{message}; GKE nodes that GPU Feature Discovery does not label are taken to have the memory of their {} ({}): set engine.gpuMemory where a pod gets less",
            gke::ACCELERATOR,
            sizes(&gke, |g| format!("{g} {}", mib_text(gke::memory_mib(g))))
        );
    }
    let instance_types = distinct(chosen.iter().filter_map(|n| n.instance_type.clone()));
    if !instance_types.is_empty() {
        message = format!(
            "{message}; EC2 and Azure nodes that GPU Feature Discovery does not label are taken to have the GPUs of their {} ({}): set engine.gpuMemory where a pod gets less",
            instance::INSTANCE_TYPE,
            sizes(&instance_types, |t| {
                let gpu = instance::gpu(t).map(|(gpu, _)| gpu).unwrap_or("GPU");
                format!("{t} {gpu} {}", mib_text(instance::memory_mib(t)))
            })
        );
    }
    if !unknown.is_empty() {
        message = format!(
            "{message}; nodes whose GPU memory is not known are left out ({unknown}): set engine.gpuMemory to count them"
        );
    }
    Ok(Plan {
        placement: decision.placement().clone(),
        memory: class.memory,
        labelled: class.labelled,
        gke,
        instance_types,
        amd_mixed,
        product: class.product.clone(),
        nodes: chosen.iter().map(|n| n.node.clone()).collect(),
        shared_by,
        message,
    })
}

/// `names`, each as `text` says it, in a list.
fn sizes(names: &[String], text: impl Fn(&str) -> String) -> String {
    names.iter().map(|n| text(n)).collect::<Vec<_>>().join(", ")
}

/// A GPU's memory in MiB, as a size.
fn mib_text(mib: Option<u64>) -> String {
    human_bytes(mib.unwrap_or(0) << 20)
}

/// Each of `items` once, in order.
fn distinct<T: Ord>(items: impl Iterator<Item = T>) -> Vec<T> {
    let mut all: Vec<T> = items.collect();
    all.sort_unstable();
    all.dedup();
    all
}

/// Of `names`, those each of whose GPUs, by the memory in MiB `mib` knows of them, gives each of
/// `by` pods that share it at least `bytes`, in the order given (GKE accelerators, instance types).
pub fn at_least(
    names: &[String],
    mib: fn(&str) -> Option<u64>,
    bytes: u64,
    by: u64,
) -> Vec<String> {
    let need = bytes.saturating_mul(by);
    names
        .iter()
        .filter(|n| mib(n).is_some_and(|mib| mib << 20 >= need))
        .cloned()
        .collect()
}

/// A placement the spec forces (engine.gpuLayers), judged against the GPUs like a decision.
fn forced(placement: Placement, devices: &[Device], margin: u64) -> Decision {
    let needs: Vec<offload::Need> = placement
        .devices
        .iter()
        .zip(devices)
        .map(|(d, dev)| offload::Need {
            needed: d.total.saturating_add(margin),
            free: dev.free,
        })
        .collect();
    if needs.iter().any(|n| n.needed > n.free) {
        Decision::NoFit { placement, needs }
    } else if placement.full() {
        Decision::Full(placement)
    } else {
        Decision::Partial(placement)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{Accelerator, EngineSpec, SplitMode};
    use crate::gguf::header::{Value, write};
    use crate::gguf::memory::repack;

    const GIB: u64 = 1 << 30;

    /// A llama-shaped model of `blocks` blocks of about `block` bytes each (f32).
    fn model(blocks: u64, block: u64) -> Header {
        let n_embd = 4096u64;
        let kv: Vec<(String, Value)> = vec![
            ("general.architecture".into(), Value::String("llama".into())),
            ("llama.block_count".into(), Value::U64(blocks)),
            ("llama.embedding_length".into(), Value::U64(n_embd)),
            ("llama.vocab_size".into(), Value::U64(32000)),
            ("llama.attention.head_count".into(), Value::U32(32)),
            ("llama.attention.head_count_kv".into(), Value::U32(8)),
        ];
        let mut t: Vec<(String, Vec<u64>, u32)> = vec![
            ("token_embd.weight".into(), vec![n_embd, 32000], 1),
            ("output_norm.weight".into(), vec![n_embd], 0),
            ("output.weight".into(), vec![n_embd, 32000], 1),
        ];
        for il in 0..blocks {
            t.push((format!("blk.{il}.attn_norm.weight"), vec![n_embd], 0));
            t.push((
                format!("blk.{il}.ffn_up.weight"),
                vec![n_embd, block / 4 / n_embd],
                0,
            ));
        }
        write::parsed(&kv, &t)
    }

    fn flags() -> Flags {
        Flags {
            ctx_size: 4096,
            parallel: 1,
            ubatch: 512,
            build: 10587,
            cpu: repack::Tiers::one(repack::Tier::None),
            cpus: crate::gguf::memory::engine::DEFAULT_CPUS,
        }
    }

    fn node(name: &str, count: u32, memory: Option<u64>, driver: Option<u32>) -> NodeGpus {
        NodeGpus {
            node: name.into(),
            count,
            memory: memory.ok_or_else(|| "no nvidia.com/gpu.memory label".to_string()),
            shared_by: 1,
            labelled: memory.is_some(),
            gke: None,
            instance_type: None,
            amd_mixed: None,
            product: Some("NVIDIA-A10".into()),
            driver_major: driver,
            host_memory: 64 * GIB,
        }
    }

    fn request(gpus: u32) -> Request {
        Request {
            accelerator: Accelerator::Cuda,
            gpus,
            resource: "nvidia.com/gpu".into(),
            layers: None,
            split_mode: SplitMode::Layer,
            memory: None,
            margin: GIB,
            cuda_major: Some(12),
        }
    }

    #[test]
    fn a_placement_on_gke_nodes_says_whose_memory_it_assumed() {
        // About 10 GiB of weights: a GKE L4 without GFD holds them; a GFD-labelled 8 GiB GPU
        // does not.
        let h = model(16, 6 * GIB / 10);
        let mut l4 = node("gke-l4", 1, Some(23034 << 20), None);
        l4.gke = Some("nvidia-l4".into());
        l4.product = Some("nvidia-l4".into());
        let nodes = [node("small", 1, Some(8 * GIB), Some(12)), l4];
        let p = plan(&h, &flags(), &nodes, &request(1)).unwrap();
        assert!(p.placement.full(), "{}", p.message);
        assert_eq!(
            (p.nodes.clone(), p.gke.clone()),
            (vec!["gke-l4".into()], vec!["nvidia-l4".into()])
        );
        assert!(
            p.message.ends_with(
                "; GKE nodes that GPU Feature Discovery does not label are taken to have the \
                 memory of their cloud.google.com/gke-accelerator (nvidia-l4 22.5 GiB): set \
                 engine.gpuMemory where a pod gets less"
            ),
            "{}",
            p.message
        );
        // A small model planned on the 8 GiB GPU may go to the L4 too, which the message says.
        let small = model(4, GIB / 10);
        let p = plan(&small, &flags(), &nodes, &request(1)).unwrap();
        assert_eq!(p.nodes, ["small", "gke-l4"]);
        assert_eq!(
            (p.memory, p.gke.clone()),
            (8 * GIB, vec!["nvidia-l4".into()])
        );
        // Without GKE nodes, no word of GKE.
        let p = plan(&small, &flags(), &nodes[..1], &request(1)).unwrap();
        assert!(
            p.gke.is_empty() && !p.message.contains("GKE"),
            "{}",
            p.message
        );
        // An EC2 node without GFD, the same way: the type, its GPU and that GPU's memory.
        let mut g5 = node("eks-g5", 1, Some(23028 << 20), None);
        g5.instance_type = Some("g5.2xlarge".into());
        let p = plan(&h, &flags(), &[nodes[0].clone(), g5], &request(1)).unwrap();
        assert_eq!(
            (p.nodes, p.instance_types),
            (vec!["eks-g5".into()], vec!["g5.2xlarge".into()])
        );
        assert!(
            p.message.ends_with(
                "; EC2 and Azure nodes that GPU Feature Discovery does not label are taken to \
                 have the GPUs of their node.kubernetes.io/instance-type (g5.2xlarge NVIDIA-A10G 22.5 \
                 GiB): set engine.gpuMemory where a pod gets less"
            ),
            "{}",
            p.message
        );
    }

    #[test]
    fn a_model_that_fits_two_24_gib_gpus_but_not_one_16_gib_gpu_goes_to_the_two() {
        // 32 blocks of 1.1 GiB: about 35 GiB of weights.
        let h = model(32, 11 * GIB / 10);
        let nodes = [
            node("one-16", 1, Some(16 * GIB), Some(12)),
            node("two-24", 2, Some(24 * GIB), Some(12)),
        ];
        let p = plan(&h, &flags(), &nodes, &request(2)).unwrap();
        assert!(p.placement.full(), "{}", p.message);
        assert_eq!(p.nodes, ["two-24"]);
        assert_eq!(p.memory, 24 * GIB);
        assert_eq!(p.devices().len(), 2);
        assert!(
            p.devices()
                .iter()
                .all(|d| d.total_bytes as u64 + GIB <= 24 * GIB)
        );
        // One 16 GiB GPU holds only part of it: the most layers that fit, the rest on the host.
        let one = plan(&h, &flags(), &nodes[..1], &request(1)).unwrap();
        assert!(!one.placement.full());
        assert!(one.placement.ngl > 0, "{}", one.message);
        assert!(one.message.contains("of 33 layers"), "{}", one.message);
    }

    #[test]
    fn a_shared_gpu_is_planned_on_one_pods_share_and_tolerated_under_its_own_name() {
        let mut shared = node("shared", 2, Some(12 * GIB), Some(12));
        shared.shared_by = 2;
        let small = node("small", 1, Some(8 * GIB), Some(12));
        let nodes = [small, shared];
        // About 10 GiB of weights: only the 12 GiB share (half of a 24 GiB GPU) holds them.
        let big = model(16, 6 * GIB / 10);
        let p = plan(&big, &flags(), &nodes, &request(1)).unwrap();
        assert!(p.placement.full(), "{}", p.message);
        assert_eq!(
            (p.memory, p.nodes.clone(), p.shared_by.clone()),
            (12 * GIB, vec!["shared".to_string()], vec![2])
        );
        assert!(
            p.message
                .contains("shared by up to 2 pods (nvidia.com/gpu.replicas)"),
            "{}",
            p.message
        );
        // A model the 8 GiB GPU holds may go to either, and each count is planned on.
        let p = plan(&model(8, GIB / 4), &flags(), &nodes, &request(1)).unwrap();
        assert_eq!((p.memory, p.shared_by), (8 * GIB, vec![1, 2]));
        let engine: EngineSpec = serde_json::from_value(
            serde_json::json!({"accelerator": "cuda", "gpuResource": "nvidia.com/gpu.shared"}),
        )
        .unwrap();
        // A replica of two GPUs is no place for shares of one.
        let e = plan(&big, &flags(), &nodes, &request(2)).unwrap_err();
        assert!(
            e.contains("(shared: nvidia.com/gpu.replicas=2)") && e.contains("engine.gpus to 1"),
            "{e}"
        );
        let keys: Vec<_> = tolerations(&engine)
            .into_iter()
            .filter_map(|t| t.key)
            .collect();
        assert_eq!(keys, ["nvidia.com/gpu.shared", "nvidia.com/gpu"]);
    }

    #[test]
    fn the_smallest_gpus_that_hold_the_whole_model_are_chosen() {
        let h = model(32, GIB / 2);
        let nodes = [
            node("big", 2, Some(80 * GIB), Some(12)),
            node("mid", 2, Some(24 * GIB), Some(12)),
        ];
        let p = plan(&h, &flags(), &nodes, &request(1)).unwrap();
        assert!(p.placement.full());
        assert_eq!(p.memory, 24 * GIB);
        assert_eq!(
            p.nodes,
            ["big", "mid"],
            "every node with GPUs at least that large"
        );
    }

    #[test]
    fn no_node_fits_says_what_is_missing() {
        let h = model(8, GIB / 4);
        let few = [node("one", 1, Some(24 * GIB), Some(12))];
        let e = plan(&h, &flags(), &few, &request(2)).unwrap_err();
        assert!(
            e.contains("asks for 2 nvidia.com/gpu") && e.contains("one, has 1"),
            "{e}"
        );
        let none = [node("cpu", 0, None, None)];
        assert!(
            plan(&h, &flags(), &none, &request(1))
                .unwrap_err()
                .contains("has any")
        );
        let old = [node("old", 1, Some(24 * GIB), Some(11))];
        let e = plan(&h, &flags(), &old, &request(1)).unwrap_err();
        assert!(e.contains("CUDA 12 driver") && e.contains("CUDA 11"), "{e}");
        let unlabelled = [node("bare", 1, None, Some(12))];
        let e = plan(&h, &flags(), &unlabelled, &request(1)).unwrap_err();
        assert!(e.contains("(bare: no nvidia.com/gpu.memory label); set engine.gpuMemory"));
        let l4 = node("l4", 1, Some(24 * GIB), Some(12));
        let some = [unlabelled[0].clone(), l4];
        let m = plan(&h, &flags(), &some, &request(1)).unwrap().message;
        assert!(
            m.contains("left out (bare: no nvidia.com/gpu.memory label)"),
            "{m}"
        );
    }

    #[test]
    fn forced_gpu_layers_that_do_not_fit_name_each_gpus_need() {
        let h = model(32, GIB / 2);
        let mut r = request(1);
        r.layers = Some(33);
        let e = plan(
            &h,
            &flags(),
            &[node("small", 1, Some(8 * GIB), Some(12))],
            &r,
        )
        .unwrap_err();
        assert!(e.contains("8.0 GiB"), "{e}");
        r.layers = Some(4);
        let p = plan(
            &h,
            &flags(),
            &[node("small", 1, Some(8 * GIB), Some(12))],
            &r,
        )
        .unwrap();
        assert_eq!(p.placement.ngl, 4);
    }

    #[test]
    fn layer_ranges_read_like_a_person_writes_them() {
        assert_eq!(layers_text(0..16, false), "0-15");
        assert_eq!(layers_text(16..32, true), "16-31 and the output");
        assert_eq!(layers_text(5..6, false), "5");
        assert_eq!(layers_text(3..3, true), "none and the output");
    }
}

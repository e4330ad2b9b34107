//! The GPU parts of a replica's pod, from the placement the Check stage decided: the GPUs as an
//! extended resource, the usual GPU taint tolerated, node affinity to GPUs at least as large as
//! the placement assumed, and llama-server's offload flags with exactly that placement.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::api::{CheckStatus, EngineSpec, SplitMode};
use crate::pipeline::check::gpu::{
    MOST_SHARED_BY, amd, at_least, gke, instance, memory_label, sharing_label,
};

/// llama-server's --fit, which would change a -ngl and --tensor-split it was not given; switched
/// off because the operator decided them. The flag is known from this build (the newest read
/// here has it); an older build that has it changes nothing either, as both are always given.
pub const FIT_FROM: u32 = 11312;
/// --split-mode, from the multi-GPU rework.
pub const SPLIT_MODE_FROM: u32 = 1875;

/// The GPU request of the server container: (resource, count), None on cpu.
pub fn limits(engine: &EngineSpec) -> Option<(String, Quantity)> {
    let resource = engine.gpu_resource()?;
    let n = engine.gpus();
    (engine.accelerator().is_gpu() && n > 0).then(|| (resource, Quantity(n.to_string())))
}

/// llama-server's offload flags for the placement in `check`.
pub fn server_flags(engine: &EngineSpec, check: &CheckStatus, build: u32) -> Vec<String> {
    if !engine.accelerator().is_gpu() {
        return Vec::new();
    }
    let mut args = Vec::new();
    if let Some(n) = check.gpu_layers {
        args.extend(["--n-gpu-layers".into(), n.max(0).to_string()]);
    }
    let mode = engine.split_mode.unwrap_or_default();
    if engine.gpus() > 1 && build >= SPLIT_MODE_FROM {
        args.extend(["--split-mode".into(), mode.name().into()]);
    }
    if let Some(split) = check
        .tensor_split
        .as_ref()
        .filter(|_| mode != SplitMode::None)
    {
        args.extend(["--tensor-split".into(), split.clone()]);
    }
    if build >= FIT_FROM {
        args.extend(["--fit".into(), "off".into()]);
    }
    args
}

/// Node affinity to GPUs that give a replica at least the memory the placement assumed, when
/// that came from GPU Feature Discovery's label (a number of MiB the scheduler can compare): the
/// whole GPU's, or a MIG profile's own for a MIG resource. A GPU shared by N pods (time-slicing
/// or MPS) gives each a Nth, which the scheduler cannot divide: one term per sharing count the
/// Check stage planned over, each asking N times the memory of a GPU shared that way, and GPUs
/// not shared by a term of their own, so a large shared GPU never passes for an unshared one.
/// Where the placement also held on GKE, EC2 or Azure nodes that GFD does not label, terms
/// naming the GKE accelerators or instance types whose known memory is enough for each sharing
/// count. AMD's GPUs, whose label is a size such as 16G, by the sizes too small (`amd_terms`).
pub fn affinity(engine: &EngineSpec, check: &CheckStatus) -> Option<Affinity> {
    let memory = check.gpu_memory_bytes.filter(|m| *m > 0)? as u64;
    if engine.gpu_memory.is_some() {
        return None;
    }
    let resource = engine.gpu_resource()?;
    if amd::is_amd(&resource) {
        return Some(required(amd_terms(memory, &check.amd_mixed_sizes)));
    }
    let key = memory_label(&resource)?;
    let shared = sharing_label(&resource)?;
    let mut by: Vec<u64> = check
        .gpu_shared_by
        .iter()
        .map(|n| (*n).clamp(1, MOST_SHARED_BY as i32) as u64)
        .collect();
    if by.is_empty() {
        // A check made before sharing was read: it planned on unshared GPUs.
        by.push(1);
    }
    by.sort_unstable();
    by.dedup();
    let gfd = |by: u64| {
        let mib = memory.saturating_mul(by).div_ceil(1 << 20);
        vec![requirement(
            &key,
            "Gt",
            &[mib.saturating_sub(1).to_string()],
        )]
    };
    let mut terms = Vec::new();
    for n in &by {
        // GFD labels 1 when the plugin shares nothing, 0 when sharing is off; older ones no
        // label at all.
        terms.extend(shared_terms(gfd(*n), &shared, *n));
    }
    if resource == gke::RESOURCE {
        // Nodes GFD does not label, by the GPUs their GKE accelerator or instance type names,
        // with the labels they must not have (GFD's memory; GKE's MIG partition).
        let known = [
            (
                gke::ACCELERATOR,
                &check.gke_accelerators,
                gke::memory_mib as fn(&str) -> Option<u64>,
                gke::SHARED_CLIENTS,
                vec![key.as_str(), gke::PARTITION],
            ),
            (
                instance::INSTANCE_TYPE,
                &check.instance_types,
                instance::memory_mib,
                shared.as_str(),
                vec![key.as_str()],
            ),
        ];
        for (label, names, mib, sharing, absent) in known {
            for n in &by {
                let names = at_least(names, mib, memory, *n);
                if names.is_empty() {
                    continue;
                }
                let mut node = vec![requirement(label, "In", &names)];
                node.extend(absent.iter().map(|k| requirement(k, "DoesNotExist", &[])));
                terms.extend(shared_terms(node, sharing, *n));
            }
        }
    }
    Some(required(terms))
}

/// Terms admitting nodes whose AMD GPUs have at least `memory` each: where the GPUs are alike, an
/// `amd.com/gpu.vram` that is none of the sizes too small; where they differ, one of `mixed`
/// (the smallest sizes of such nodes the placement held on) and none too small, so a node whose
/// smallest GPU is too small is kept out however large its others are.
fn amd_terms(memory: u64, mixed: &[String]) -> Vec<NodeSelectorTerm> {
    let small = amd::too_small(memory);
    let mut alike = vec![requirement(amd::VRAM, "Exists", &[])];
    if !small.is_empty() {
        alike.push(requirement(amd::VRAM, "NotIn", &small));
    }
    let mut terms = vec![term(alike)];
    let sizes = mixed
        .iter()
        .filter(|s| amd::holds(s, memory))
        .take(amd::MOST_MIXED);
    for size in sizes {
        let mut differ = vec![
            requirement(amd::VRAM, "DoesNotExist", &[]),
            requirement(&format!("{}.{size}", amd::VRAM), "Exists", &[]),
        ];
        differ.extend(
            small
                .iter()
                .map(|s| requirement(&format!("{}.{s}", amd::VRAM), "DoesNotExist", &[])),
        );
        terms.push(term(differ));
    }
    terms
}

fn required(terms: Vec<NodeSelectorTerm>) -> Affinity {
    Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: terms,
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn requirement(key: &str, operator: &str, values: &[String]) -> NodeSelectorRequirement {
    NodeSelectorRequirement {
        key: key.into(),
        operator: operator.into(),
        values: (!values.is_empty()).then(|| values.to_vec()),
    }
}

/// A term that holds where all of `requirements` do.
fn term(requirements: Vec<NodeSelectorRequirement>) -> NodeSelectorTerm {
    NodeSelectorTerm {
        match_expressions: Some(requirements),
        ..Default::default()
    }
}

/// The terms of `node` on GPUs shared by `n` pods, as the label `shared` counts them: for one,
/// with no such label or one of 0 or 1.
fn shared_terms(node: Vec<NodeSelectorRequirement>, shared: &str, n: u64) -> Vec<NodeSelectorTerm> {
    let with = |sharing: NodeSelectorRequirement| {
        let mut all = node.clone();
        all.push(sharing);
        term(all)
    };
    if n == 1 {
        vec![
            with(requirement(shared, "DoesNotExist", &[])),
            with(requirement(shared, "In", &["0".into(), "1".into()])),
        ]
    } else {
        vec![with(requirement(shared, "In", &[n.to_string()]))]
    }
}

/// Adds the GPU resource to the container's requests and limits (an extended resource is
/// requested in whole units, the same in both).
pub fn add_limits(
    engine: &EngineSpec,
    resources: &mut k8s_openapi::api::core::v1::ResourceRequirements,
) {
    if let Some((resource, n)) = limits(engine) {
        for m in [&mut resources.requests, &mut resources.limits] {
            m.get_or_insert_with(BTreeMap::new)
                .entry(resource.clone())
                .or_insert_with(|| n.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::check::gpu::NVIDIA_MEMORY;

    fn engine(v: serde_json::Value) -> EngineSpec {
        serde_json::from_value(v).unwrap()
    }

    fn placed(ngl: i32, split: Option<&str>, memory: i64) -> CheckStatus {
        CheckStatus {
            gpu_layers: Some(ngl),
            tensor_split: split.map(String::from),
            gpu_memory_bytes: Some(memory),
            ..Default::default()
        }
    }

    #[test]
    fn the_server_runs_exactly_the_placement_check_decided() {
        let two = engine(serde_json::json!({"accelerator": "cuda", "gpus": 2}));
        let c = placed(33, Some("17,16"), 24 << 30);
        assert_eq!(
            server_flags(&two, &c, 11312),
            [
                "--n-gpu-layers",
                "33",
                "--split-mode",
                "layer",
                "--tensor-split",
                "17,16",
                "--fit",
                "off"
            ]
        );
        // An older build gets no --fit, which it may not know.
        assert!(!server_flags(&two, &c, 10587).contains(&"--fit".to_string()));
        let one = engine(serde_json::json!({"accelerator": "cuda"}));
        let flags = server_flags(&one, &placed(20, None, 16 << 30), 10587);
        assert_eq!(flags, ["--n-gpu-layers", "20"]);
        assert!(server_flags(&EngineSpec::default(), &c, 11312).is_empty());
    }

    #[test]
    fn the_gpus_are_an_extended_resource_requested_and_limited_alike() {
        let mut r = Default::default();
        add_limits(
            &engine(serde_json::json!({"accelerator": "rocm", "gpus": 2})),
            &mut r,
        );
        assert_eq!(
            r.limits.as_ref().unwrap()["amd.com/gpu"],
            Quantity("2".into())
        );
        assert_eq!(
            r.requests.as_ref().unwrap()["amd.com/gpu"],
            Quantity("2".into())
        );
        let mut cpu = Default::default();
        add_limits(&EngineSpec::default(), &mut cpu);
        assert!(cpu.limits.is_none());
    }

    /// Each term of an affinity, as (memory key, Gt value, sharing operator, sharing values).
    fn terms(a: Affinity) -> Vec<(String, String, String, Vec<String>)> {
        requirements(a)
            .into_iter()
            .map(|t| {
                let [memory, sharing]: [_; 2] = t.try_into().unwrap();
                assert_eq!(memory.1, "Gt");
                (memory.0, memory.2.concat(), sharing.1, sharing.2)
            })
            .collect()
    }

    /// Each term of an affinity, as its requirements (key, operator, values).
    fn requirements(a: Affinity) -> Vec<Vec<(String, String, Vec<String>)>> {
        a.node_affinity
            .and_then(|n| n.required_during_scheduling_ignored_during_execution)
            .unwrap()
            .node_selector_terms
            .into_iter()
            .map(|t| {
                t.match_expressions
                    .into_iter()
                    .flatten()
                    .map(|r| (r.key, r.operator, r.values.unwrap_or_default()))
                    .collect()
            })
            .collect()
    }

    /// The terms of GPUs not shared, for a memory key and its least MiB.
    fn unshared(key: &str, gt: &str) -> Vec<(String, String, String, Vec<String>)> {
        vec![
            (key.into(), gt.into(), "DoesNotExist".into(), vec![]),
            (
                key.into(),
                gt.into(),
                "In".into(),
                vec!["0".into(), "1".into()],
            ),
        ]
    }

    #[test]
    fn replicas_go_only_to_gpus_at_least_as_large_as_the_placement_assumed() {
        let cuda = engine(serde_json::json!({"accelerator": "cuda", "gpus": 2}));
        let a = affinity(&cuda, &placed(33, Some("1,1"), 24 << 30)).unwrap();
        assert_eq!(terms(a.clone()), unshared(NVIDIA_MEMORY, "24575"));
        let replicas = serde_json::to_string(&a).unwrap();
        assert!(
            replicas.contains("\"nvidia.com/gpu.replicas\""),
            "{replicas}"
        );
        // A memory the spec set is no label the scheduler can compare.
        let set = engine(serde_json::json!({"accelerator": "cuda", "gpuMemory": "24Gi"}));
        assert!(affinity(&set, &placed(33, None, 24 << 30)).is_none());
        let amd = engine(serde_json::json!({"accelerator": "rocm", "gpuMemory": "24Gi"}));
        assert!(affinity(&amd, &placed(33, None, 24 << 30)).is_none());
        // A MIG slice: its profile's own labels.
        let mig = engine(
            serde_json::json!({"accelerator": "cuda", "gpuResource": "nvidia.com/mig-1g.5gb"}),
        );
        let a = affinity(&mig, &placed(33, None, 4864 << 20)).unwrap();
        assert_eq!(
            terms(a.clone()),
            unshared("nvidia.com/mig-1g.5gb.memory", "4863")
        );
        assert!(
            serde_json::to_string(&a)
                .unwrap()
                .contains("nvidia.com/mig-1g.5gb.replicas")
        );
    }

    #[test]
    fn a_shared_gpu_must_give_each_pod_the_memory_planned() {
        // Planned on 6 GiB: a quarter of a 24 GiB GPU shared four ways, or a whole GPU of 6 GiB
        // or more.
        let shared = engine(serde_json::json!({"accelerator": "cuda"}));
        let mut c = placed(33, None, 6 << 30);
        c.gpu_shared_by = vec![4, 1];
        let mut want = unshared(NVIDIA_MEMORY, "6143");
        want.push((
            NVIDIA_MEMORY.into(),
            "24575".into(),
            "In".into(),
            vec!["4".into()],
        ));
        assert_eq!(terms(affinity(&shared, &c).unwrap()), want);
        // A share that is no whole MiB asks for the MiB above it: 7 ways of 1000 MiB.
        let mut c = placed(33, None, (1000 << 20) / 7);
        c.gpu_shared_by = vec![7];
        assert_eq!(
            terms(affinity(&shared, &c).unwrap()),
            [(
                NVIDIA_MEMORY.into(),
                "999".into(),
                "In".into(),
                vec!["7".into()]
            )]
        );
    }

    #[test]
    fn gke_nodes_without_gfd_are_admitted_by_accelerators_large_enough() {
        // Planned on 11 GiB over an L4 (22.5 GiB) shared two ways and a T4 (15 GiB) alone.
        let cuda = engine(serde_json::json!({"accelerator": "cuda"}));
        let mut c = placed(33, None, 11 << 30);
        c.gpu_shared_by = vec![2, 1];
        c.gke_accelerators = vec!["nvidia-l4".into(), "nvidia-tesla-t4".into()];
        let all = requirements(affinity(&cuda, &c).unwrap());
        // GFD's three terms as before, then GKE's: unshared (no label, or 0 or 1) for either
        // model, and two ways for the L4 alone: a T4's half is 7.5 GiB.
        assert_eq!(all.len(), 6);
        let gke = &all[3..];
        let node = |names: &[&str]| {
            vec![
                (
                    gke::ACCELERATOR.to_string(),
                    "In".to_string(),
                    names.iter().map(|n| n.to_string()).collect(),
                ),
                (NVIDIA_MEMORY.into(), "DoesNotExist".into(), vec![]),
                (gke::PARTITION.into(), "DoesNotExist".into(), vec![]),
            ]
        };
        let with = |names: &[&str], op: &str, values: &[&str]| {
            let mut t = node(names);
            let values = values.iter().map(|v| v.to_string()).collect();
            t.push((gke::SHARED_CLIENTS.into(), op.into(), values));
            t
        };
        assert_eq!(
            gke,
            [
                with(&["nvidia-l4", "nvidia-tesla-t4"], "DoesNotExist", &[]),
                with(&["nvidia-l4", "nvidia-tesla-t4"], "In", &["0", "1"]),
                with(&["nvidia-l4"], "In", &["2"]),
            ]
        );
        // Without GKE nodes in the placement, or for another resource, no GKE term.
        c.gke_accelerators.clear();
        assert_eq!(terms(affinity(&cuda, &c).unwrap()).len(), 3);
        let mut c = placed(33, None, 4 << 30);
        c.gke_accelerators = vec!["nvidia-l4".into()];
        let shared = engine(
            serde_json::json!({"accelerator": "cuda", "gpuResource": "nvidia.com/gpu.shared"}),
        );
        assert_eq!(terms(affinity(&shared, &c).unwrap()).len(), 2);
    }

    #[test]
    fn eks_and_aks_nodes_without_gfd_are_admitted_by_instance_types_large_enough() {
        // Planned on 20 GiB over an Azure A100 80GB, a g5 (A10G, 22.5 GiB) and a g4dn (T4,
        // 15 GiB) listed as seen: the g4dn's GPU is too small and is kept out; a GFD label still
        // wins where there is one.
        let cuda = engine(serde_json::json!({"accelerator": "cuda"}));
        let mut c = placed(33, None, 20 << 30);
        let a100 = "Standard_NC24ads_A100_v4".to_string();
        c.instance_types = vec![a100.clone(), "g5.2xlarge".into(), "g4dn.xlarge".into()];
        let all = requirements(affinity(&cuda, &c).unwrap());
        let node = |op: &str, values: &[&str]| {
            let values = values.iter().map(|v| v.to_string()).collect();
            vec![
                (
                    instance::INSTANCE_TYPE.to_string(),
                    "In".to_string(),
                    vec![a100.clone(), "g5.2xlarge".into()],
                ),
                (NVIDIA_MEMORY.into(), "DoesNotExist".into(), vec![]),
                ("nvidia.com/gpu.replicas".into(), op.into(), values),
            ]
        };
        assert_eq!(all.len(), 4, "{all:?}");
        assert_eq!(
            all[2..],
            [node("DoesNotExist", &[]), node("In", &["0", "1"])]
        );
        // More than a g5 holds: no instance type term, and GFD's alone.
        let mut c = placed(33, None, 23 << 30);
        c.instance_types = vec!["g5.2xlarge".into()];
        assert_eq!(terms(affinity(&cuda, &c).unwrap()).len(), 2);
    }

    #[test]
    fn amd_gpus_are_admitted_by_no_size_too_small() {
        let rocm = engine(serde_json::json!({"accelerator": "rocm"}));
        let sizes = |n: u64| (1..=n).map(|i| format!("{i}G")).collect::<Vec<_>>();
        let r =
            |key: &str, op: &str, values: Vec<String>| (key.to_string(), op.to_string(), values);
        // Planned on 16G GPUs (15.5 GiB): alike GPUs of 16G or more, whatever their size.
        let c = placed(33, None, (31 << 30) / 2);
        assert_eq!(
            requirements(affinity(&rocm, &c).unwrap()),
            [vec![
                r(amd::VRAM, "Exists", vec![]),
                r(amd::VRAM, "NotIn", sizes(15)),
            ]]
        );
        // Planned on 20 GiB over nodes whose GPUs differ too, the smallest 24G on one and 64G
        // on another: each admitted by its smallest size with no size too small; a listed size
        // too small (16G) or no size at all ("x") adds no term.
        let mut c = placed(33, None, 20 << 30);
        c.amd_mixed_sizes = vec!["24G".into(), "64G".into(), "16G".into(), "x".into()];
        let differ = |size: &str| {
            let mut t = vec![
                r(amd::VRAM, "DoesNotExist", vec![]),
                r(&format!("amd.com/gpu.vram.{size}"), "Exists", vec![]),
            ];
            t.extend(
                sizes(20)
                    .iter()
                    .map(|s| r(&format!("amd.com/gpu.vram.{s}"), "DoesNotExist", vec![])),
            );
            t
        };
        assert_eq!(
            requirements(affinity(&rocm, &c).unwrap()),
            [
                vec![
                    r(amd::VRAM, "Exists", vec![]),
                    r(amd::VRAM, "NotIn", sizes(20))
                ],
                differ("24G"),
                differ("64G"),
            ]
        );
        // A plan that any labelled GPU holds: any size. Vulkan on AMD's resource alike.
        let vulkan =
            engine(serde_json::json!({"accelerator": "vulkan", "gpuResource": "amd.com/gpu"}));
        assert_eq!(
            requirements(affinity(&vulkan, &placed(33, None, 100 << 20)).unwrap()),
            [vec![r(amd::VRAM, "Exists", vec![])]]
        );
    }
}

//! The GPU parts of a replica's pod, from the placement the Check stage decided: the GPUs as an
//! extended resource, the usual GPU taint tolerated, node affinity to GPUs at least as large as
//! the placement assumed, and llama-server's offload flags with exactly that placement.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, NodeAffinity, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use crate::api::{CheckStatus, EngineSpec, SplitMode};
use crate::pipeline::check::gpu::memory_label;

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

/// Node affinity to GPUs with at least the memory the placement assumed, when that came from
/// GPU Feature Discovery's label (a number of MiB the scheduler can compare): the whole GPU's, or
/// a MIG profile's own for a MIG resource.
pub fn affinity(engine: &EngineSpec, check: &CheckStatus) -> Option<Affinity> {
    let memory = check.gpu_memory_bytes.filter(|m| *m > 0)? as u64;
    if engine.gpu_memory.is_some() {
        return None;
    }
    let key = memory_label(&engine.gpu_resource()?)?;
    let mib = memory / (1 << 20);
    Some(Affinity {
        node_affinity: Some(NodeAffinity {
            required_during_scheduling_ignored_during_execution: Some(NodeSelector {
                node_selector_terms: vec![NodeSelectorTerm {
                    match_expressions: Some(vec![NodeSelectorRequirement {
                        key,
                        operator: "Gt".into(),
                        values: Some(vec![mib.saturating_sub(1).to_string()]),
                    }]),
                    ..Default::default()
                }],
            }),
            ..Default::default()
        }),
        ..Default::default()
    })
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

    /// The one node requirement of an affinity.
    fn requirement(a: Affinity) -> NodeSelectorRequirement {
        let terms = a
            .node_affinity
            .and_then(|n| n.required_during_scheduling_ignored_during_execution)
            .unwrap()
            .node_selector_terms;
        assert_eq!(terms.len(), 1);
        let reqs = terms[0].match_expressions.clone().unwrap();
        assert_eq!(reqs.len(), 1);
        reqs[0].clone()
    }

    #[test]
    fn replicas_go_only_to_gpus_at_least_as_large_as_the_placement_assumed() {
        let cuda = engine(serde_json::json!({"accelerator": "cuda", "gpus": 2}));
        let req = requirement(affinity(&cuda, &placed(33, Some("1,1"), 24 << 30)).unwrap());
        assert_eq!(
            (req.key.as_str(), req.operator.as_str(), req.values.clone()),
            (NVIDIA_MEMORY, "Gt", Some(vec!["24575".to_string()]))
        );
        // A memory the spec set, or AMD's label, is no number the scheduler can compare.
        let set = engine(serde_json::json!({"accelerator": "cuda", "gpuMemory": "24Gi"}));
        assert!(affinity(&set, &placed(33, None, 24 << 30)).is_none());
        let amd = engine(serde_json::json!({"accelerator": "rocm"}));
        assert!(affinity(&amd, &placed(33, None, 24 << 30)).is_none());
        // A MIG slice: its profile's own label.
        let mig = engine(
            serde_json::json!({"accelerator": "cuda", "gpuResource": "nvidia.com/mig-1g.5gb"}),
        );
        let req = requirement(affinity(&mig, &placed(33, None, 4864 << 20)).unwrap());
        assert_eq!(
            (req.key.as_str(), req.values.clone()),
            (
                "nvidia.com/mig-1g.5gb.memory",
                Some(vec!["4863".to_string()])
            )
        );
    }
}

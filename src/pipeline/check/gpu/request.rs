//! What the GPU part of a check is asked for, from the spec and the operator's settings: the
//! accelerator, GPUs per replica, the resource, overrides, the headroom, and the CUDA major of
//! the engine image; and the tolerations that let replicas onto GPU nodes.

use crate::api::{Accelerator, EngineSpec, SplitMode};
use crate::units::parse_quantity;

use super::memory_label;

/// What the GPU part of a check is for, from the spec and the operator's settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    pub accelerator: Accelerator,
    pub gpus: u32,
    pub resource: String,
    /// engine.gpuLayers: the -ngl to run with instead of the computed one.
    pub layers: Option<u32>,
    pub split_mode: SplitMode,
    /// engine.gpuMemory: each GPU's memory, in place of what the labels say.
    pub memory: Option<u64>,
    /// Headroom kept free on each GPU (llama.cpp's --fit-target).
    pub margin: u64,
    /// The CUDA major of the engine image, when it says (server-cuda is 12, server-cuda13 13).
    pub cuda_major: Option<u32>,
}

impl Request {
    /// The request of `engine`, None on cpu; an error names a spec field that is wrong.
    pub fn of(engine: &EngineSpec, image: &str, margin: u64) -> Result<Option<Request>, String> {
        let accelerator = engine.accelerator();
        if !accelerator.is_gpu() {
            return Ok(None);
        }
        let memory = match &engine.gpu_memory {
            None => None,
            Some(q) => Some(parse_quantity(q).filter(|m| *m > 0).ok_or_else(|| {
                format!("engine.gpuMemory {q:?} is not a memory size such as 24Gi or 81559Mi")
            })?),
        };
        Ok(Some(Request {
            accelerator,
            gpus: engine.gpus().max(1),
            resource: engine.gpu_resource().unwrap_or_default(),
            layers: engine.gpu_layers.map(|n| n.max(0) as u32),
            split_mode: engine.split_mode.unwrap_or_default(),
            memory,
            margin,
            cuda_major: cuda_major_of_image(image),
        }))
    }

    /// What status.check.request records of it. Where the memory comes from labels, the key
    /// names the label, so a check made when MIG slices were read from the whole GPU's label is
    /// made again.
    pub fn key(&self) -> String {
        let memory = match (self.memory, memory_label(&self.resource)) {
            (Some(m), _) => m.to_string(),
            (None, Some(label)) => format!("label:{label}"),
            (None, None) => "labels".into(),
        };
        format!(
            "{} gpus={} resource={} ngl={} split={} memory={} margin={}",
            self.accelerator.name(),
            self.gpus,
            self.resource,
            self.layers.map_or("auto".into(), |n| n.to_string()),
            self.split_mode.name(),
            memory,
            self.margin
        )
    }
}

/// The replicas' tolerations: the spec's, and with a GPU accelerator one for the usual taint
/// of GPU nodes (the resource's name, any value, NoSchedule), which the NVIDIA and AMD device
/// plugins' guides put on them; for another NVIDIA resource (a MIG slice, time-sliced shares
/// under their own name) also `nvidia.com/gpu`'s, as its node is an NVIDIA GPU node. The Check
/// stage considers the nodes these tolerate.
pub fn tolerations(engine: &EngineSpec) -> Vec<k8s_openapi::api::core::v1::Toleration> {
    let mut all = engine.tolerations.clone();
    let Some(resource) = engine
        .gpu_resource()
        .filter(|_| engine.accelerator().is_gpu())
    else {
        return all;
    };
    let mut keys = vec![resource.clone()];
    if resource.starts_with("nvidia.com/") && resource != "nvidia.com/gpu" {
        keys.push("nvidia.com/gpu".into());
    }
    for key in keys {
        let usual = k8s_openapi::api::core::v1::Toleration {
            key: Some(key),
            operator: Some("Exists".into()),
            effect: Some("NoSchedule".into()),
            ..Default::default()
        };
        if !all.contains(&usual) {
            all.push(usual);
        }
    }
    all
}

/// The CUDA major version an official llama.cpp image is built with, from its tag:
/// `server-cuda-bN` is CUDA 12, `server-cuda13-bN` CUDA 13; None for other images.
pub fn cuda_major_of_image(image: &str) -> Option<u32> {
    let image = image.split('@').next().unwrap_or(image);
    let name = image.rsplit('/').next().unwrap_or(image);
    let tag = name.rsplit_once(':').map(|(_, t)| t)?;
    let rest = tag.split('-').find_map(|part| part.strip_prefix("cuda"))?;
    if rest.is_empty() {
        Some(12)
    } else {
        rest.parse().ok().filter(|v| (9..=99).contains(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cuda_major_comes_from_the_official_tags() {
        assert_eq!(
            cuda_major_of_image("ghcr.io/ggml-org/llama.cpp:server-cuda-b6500"),
            Some(12)
        );
        assert_eq!(
            cuda_major_of_image("ghcr.io/ggml-org/llama.cpp:server-cuda13-b7000"),
            Some(13)
        );
        assert_eq!(
            cuda_major_of_image("ghcr.io/ggml-org/llama.cpp:server-b6500"),
            None
        );
        assert_eq!(
            cuda_major_of_image("ghcr.io/ggml-org/llama.cpp:server-rocm-b6500"),
            None
        );
        assert_eq!(cuda_major_of_image("x/cuda:latest"), None);
    }
}

//! The GPU failures of a replica, told from the scheduler's and the engine's own words: GPUs
//! the scheduler lacks, a driver older than the image's CUDA, and a GPU with less free memory
//! than the placement the Check stage decided.

use crate::api::CheckStatus;
use crate::units::human_bytes;

/// Whether the scheduler's words say a GPU resource is short (`Insufficient nvidia.com/gpu`,
/// `Insufficient amd.com/gpu`, a MIG slice's `Insufficient nvidia.com/mig-1g.10gb`, a
/// time-sliced `Insufficient nvidia.com/gpu.shared`).
pub(super) fn short_of_gpus(m: &str) -> bool {
    m.split("Insufficient ").skip(1).any(|rest| {
        rest.split([',', ' ']).next().is_some_and(|resource| {
            let resource = resource.trim_end_matches('.');
            resource.ends_with("/gpu")
                || ["nvidia.com/", "amd.com/"]
                    .iter()
                    .any(|vendor| resource.starts_with(vendor))
        })
    })
}

/// Whether an exit says the GPU driver is too old for the image's CUDA runtime, in the words
/// the CUDA runtime and ggml use.
pub(super) fn driver_too_old(m: &str) -> bool {
    let m = m.to_ascii_lowercase();
    [
        "cuda driver version is insufficient",
        "provided ptx was compiled with an unsupported toolchain",
        "forward compatibility was attempted on non supported hw",
    ]
    .iter()
    .any(|w| m.contains(w))
}

/// Whether an exit says a GPU ran out of memory, in ggml's words: CUDA's and ROCm's
/// (`cudaMalloc failed: out of memory`, `CUDA error: out of memory`), Vulkan's
/// (`ErrorOutOfDeviceMemory`), or a GPU buffer it could not allocate (`unable to allocate CUDA0
/// buffer`, `failed to allocate ROCm1 buffer of size N`). A `CUDA_Host` buffer is pinned host
/// memory, not the GPU's.
pub(super) fn out_of_memory(m: &str) -> bool {
    let m = m.to_ascii_lowercase();
    let said = [
        "cudamalloc failed: out of memory",
        "cuda error: out of memory",
        "rocm error: out of memory",
        "erroroutofdevicememory",
    ]
    .iter()
    .any(|w| m.contains(w));
    said || m.split("allocate ").skip(1).any(gpu_buffer)
}

/// Whether a buffer name starts these words: a GPU backend and its device number (`cuda0`,
/// `rocm1`, `vulkan0`), so not `cuda_host`.
fn gpu_buffer(words: &str) -> bool {
    ["cuda", "rocm", "vulkan"].iter().any(|backend| {
        words
            .strip_prefix(backend)
            .is_some_and(|rest| rest.starts_with(|c: char| c.is_ascii_digit()))
    })
}

/// The Place message for a GPU out of memory: the exit, what the Check stage planned on each
/// GPU, and what to do.
pub(super) fn out_of_memory_message(exit: &str, check: Option<&CheckStatus>) -> String {
    let planned: Vec<String> = check
        .map(|c| c.devices.as_slice())
        .unwrap_or_default()
        .iter()
        .map(|d| {
            let size = |b: i64| human_bytes(u64::try_from(b).unwrap_or(0));
            let product = d
                .product
                .as_deref()
                .map(|p| format!(" ({p})"))
                .unwrap_or_default();
            format!(
                "{} of its {} on GPU {}{product}",
                size(d.total_bytes),
                size(d.memory_bytes),
                d.index
            )
        })
        .collect();
    let plan = if planned.is_empty() {
        String::new()
    } else {
        format!(
            ", though the Check stage planned {} with the operator's --gpu-headroom free",
            planned.join(" and ")
        )
    };
    format!(
        "{exit}; a GPU had less free memory than the engine allocates{plan}: something else holds memory on it (another process, time-slicing, MIG), or the node's GPU memory label says more than is free; free the GPU, or set engine.gpuMemory to the memory free per GPU (the Check stage then places fewer layers), or engine.gpuLayers to fewer layers"
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::DeviceStatus;

    #[test]
    fn gpus_the_scheduler_lacks_and_a_driver_too_old_are_told_apart() {
        assert!(short_of_gpus(
            "m-a cannot be scheduled: 0/4 nodes are available: 2 Insufficient nvidia.com/gpu, 2 node(s) had untolerated taint(s)."
        ));
        assert!(short_of_gpus(
            "0/1 nodes are available: 1 Insufficient amd.com/gpu."
        ));
        assert!(short_of_gpus(
            "0/3 nodes are available: 1 Insufficient nvidia.com/mig-1g.5gb, 2 node(s) didn't match Pod's node affinity/selector."
        ));
        assert!(short_of_gpus(
            "0/1 nodes are available: 1 Insufficient nvidia.com/gpu.shared."
        ));
        assert!(!short_of_gpus(
            "0/2 nodes are available: 2 Insufficient memory."
        ));
        assert!(!short_of_gpus(
            "0/2 nodes are available: 2 Insufficient cpu."
        ));
        assert!(driver_too_old(
            "container llama-server exited 4 times, last exit code 1 (Error): ggml_cuda_init: failed to initialize CUDA: CUDA driver version is insufficient for CUDA runtime version"
        ));
        assert!(!driver_too_old("exit code 1 (Error): error loading model"));
    }

    #[test]
    fn a_gpu_out_of_memory_is_told_in_each_backends_words_and_pinned_host_memory_is_not() {
        for said in [
            "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 21504.00 MiB on device 0: cudaMalloc failed: out of memory",
            "llama_model_load: error loading model: unable to allocate CUDA0 buffer",
            "alloc_tensor_range: failed to allocate ROCm1 buffer of size 22548578304",
            "ggml_gallocr_reserve_n: failed to allocate Vulkan0 buffer of size 1073741824",
            "ggml_vulkan: vk::Device::allocateMemory: ErrorOutOfDeviceMemory",
            "CUDA error: out of memory\n  current device: 0, in function ggml_cuda_op",
        ] {
            assert!(out_of_memory(said), "{said}");
        }
        for not in [
            "llama_model_load: error loading model: unable to allocate CUDA_Host buffer",
            "llama_kv_cache: failed to allocate buffer for kv cache",
            "ggml_cuda_init: failed to initialize CUDA: CUDA driver version is insufficient for CUDA runtime version",
            "error loading model",
        ] {
            assert!(!out_of_memory(not), "{not}");
        }
    }

    #[test]
    fn the_out_of_memory_message_says_what_was_planned_on_each_gpu_and_what_to_do() {
        let device = |index, total: i64| DeviceStatus {
            index,
            product: Some("NVIDIA-A10".into()),
            layers: "0-15".into(),
            weights_bytes: total - (1 << 30),
            kv_bytes: 1 << 29,
            compute_bytes: 1 << 29,
            total_bytes: total,
            memory_bytes: 24 << 30,
        };
        let check = CheckStatus {
            devices: vec![device(0, 22 << 30), device(1, 21 << 30)],
            ..Default::default()
        };
        let m = out_of_memory_message("last exit code 1 (Error): cudaMalloc failed", Some(&check));
        assert!(
            m.starts_with("last exit code 1 (Error): cudaMalloc failed; a GPU had less free memory than the engine allocates, though the Check stage planned 22.0 GiB of its 24.0 GiB on GPU 0 (NVIDIA-A10) and 21.0 GiB of its 24.0 GiB on GPU 1 (NVIDIA-A10) with the operator's --gpu-headroom free"),
            "{m}"
        );
        assert!(
            m.contains("engine.gpuMemory") && m.contains("engine.gpuLayers"),
            "{m}"
        );
        // Without a placement in the status, the advice alone.
        let bare = out_of_memory_message("exit", None);
        assert!(
            bare.starts_with("exit; a GPU had less free memory than the engine allocates: "),
            "{bare}"
        );
    }
}

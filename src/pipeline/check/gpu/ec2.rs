//! EC2's GPU instance types, for EKS nodes that GPU Feature Discovery does not label (the
//! accelerated AMIs come with NVIDIA's device plugin; GFD runs only where the GPU operator or its
//! own chart is installed). The well-known `node.kubernetes.io/instance-type` names the type, and
//! its family (`g5` of `g5.2xlarge`) fixes the GPU model, so one GPU's memory ([`FAMILIES`]).
//! Karpenter's `karpenter.k8s.aws/instance-gpu-memory` is not read: it is the model's nominal
//! size (24576 MiB for an A10G, whose NVML total is 23028), more than a pod can allocate.

use std::collections::BTreeMap;

/// The instance type of a node, set by the cloud provider, such as `g5.2xlarge` on EC2.
pub const INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
/// The resource NVIDIA's device plugin advertises EC2's GPUs as.
pub const RESOURCE: &str = "nvidia.com/gpu";

/// Each EC2 family of whole NVIDIA GPUs whose model modelserve knows: the GPU, and one GPU's
/// memory in MiB, NVML's total as GFD labels it (the same figures as [`super::gke::MEMORY`]; the
/// H200's the decimal 141 GB of its name, below NVML's). A family of fractional GPUs (`g6f`) is
/// not one of them, nor a family whose GPU has more than one size (`p3`, `p3dn`).
pub const FAMILIES: [(&str, &str, u64); 10] = [
    ("g4dn", "NVIDIA-T4", 15360),
    ("g5", "NVIDIA-A10G", 23028),
    ("g6", "NVIDIA-L4", 23034),
    ("gr6", "NVIDIA-L4", 23034),
    ("g6e", "NVIDIA-L40S", 46068),
    ("p4d", "NVIDIA-A100-40GB", 40536),
    ("p4de", "NVIDIA-A100-80GB", 81920),
    ("p5", "NVIDIA-H100-80GB", 81559),
    ("p5e", "NVIDIA-H200-141GB", 141_000_000_000 >> 20),
    ("p5en", "NVIDIA-H200-141GB", 141_000_000_000 >> 20),
];

/// The family of an EC2 instance type (`g5` of `g5.2xlarge`): None for a name that is not one,
/// such as another cloud's (`n1-standard-4`, `Standard_NC6s_v3`, `VM.GPU.A10.1`).
fn family(instance_type: &str) -> Option<&str> {
    let (family, size) = instance_type.split_once('.')?;
    let name = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    };
    let ec2 = family.starts_with(|c: char| c.is_ascii_lowercase()) && name(family) && name(size);
    ec2.then_some(family)
}

/// The GPU model and one GPU's memory in MiB of an EC2 instance type, where modelserve knows them.
pub fn gpu(instance_type: &str) -> Option<(&'static str, u64)> {
    let family = family(instance_type)?;
    FAMILIES
        .iter()
        .find(|(f, ..)| *f == family)
        .map(|(_, gpu, mib)| (*gpu, *mib))
}

/// One GPU's memory in MiB of an EC2 instance type, where modelserve knows it.
pub fn memory_mib(instance_type: &str) -> Option<u64> {
    gpu(instance_type).map(|(_, mib)| mib)
}

/// The memory of one GPU of an EC2 node, in bytes, and the instance type that says it: None where
/// the node has no EC2 instance type (or `resource` is not the device plugin's); else the memory,
/// or why it is unknown.
pub fn label_memory(
    labels: &BTreeMap<String, String>,
    resource: &str,
) -> Option<Result<(u64, String), String>> {
    let name = labels.get(INSTANCE_TYPE).filter(|_| resource == RESOURCE)?;
    family(name)?;
    Some(match memory_mib(name) {
        Some(mib) => Ok((mib << 20, name.clone())),
        None => Err(format!(
            "{INSTANCE_TYPE}={name:?} is not an EC2 type whose GPUs modelserve knows (families {}), \
             and no nvidia.com/gpu.memory label says their memory",
            FAMILIES.map(|(f, ..)| f).join(", ")
        )),
    })
}

/// The GPU model of an EC2 node of `resource`, where its instance type says it.
pub fn product(labels: &BTreeMap<String, String>, resource: &str) -> Option<String> {
    let name = labels.get(INSTANCE_TYPE).filter(|_| resource == RESOURCE)?;
    gpu(name).map(|(gpu, _)| gpu.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::check::test_labels as labels;

    #[test]
    fn an_eks_node_without_gfd_has_its_instance_types_gpu_memory() {
        let g5 = labels(&[(INSTANCE_TYPE, "g5.12xlarge")]);
        assert_eq!(
            label_memory(&g5, RESOURCE),
            Some(Ok((23028 << 20, "g5.12xlarge".to_string())))
        );
        assert_eq!(product(&g5, RESOURCE).as_deref(), Some("NVIDIA-A10G"));
        // A family is matched whole: g6e is an L40S, not a g6's L4.
        assert_eq!(memory_mib("g6e.xlarge"), Some(46068));
        assert_eq!(memory_mib("g6.xlarge"), Some(23034));
        assert_eq!(memory_mib("p5en.48xlarge"), Some(134_468));
        // Not EC2's, or not the device plugin's resource: nothing to say.
        for other in [
            "n1-standard-4",
            "Standard_NC6s_v3",
            "VM.GPU.A10.1",
            "g5.",
            ".x",
        ] {
            assert_eq!(
                label_memory(&labels(&[(INSTANCE_TYPE, other)]), RESOURCE),
                None,
                "{other}"
            );
        }
        assert_eq!(label_memory(&labels(&[]), RESOURCE), None);
        assert_eq!(label_memory(&g5, "nvidia.com/mig-1g.5gb"), None);
        assert_eq!(label_memory(&g5, "amd.com/gpu"), None);
        assert_eq!(product(&g5, "amd.com/gpu"), None);
    }

    #[test]
    fn an_ec2_type_of_unknown_or_fractional_gpus_is_unknown_memory_saying_why() {
        for name in ["g6f.large", "p3.2xlarge", "m5.xlarge"] {
            let e = label_memory(&labels(&[(INSTANCE_TYPE, name)]), RESOURCE)
                .unwrap()
                .unwrap_err();
            assert_eq!(
                e,
                format!(
                    "node.kubernetes.io/instance-type={name:?} is not an EC2 type whose GPUs \
                     modelserve knows (families g4dn, g5, g6, gr6, g6e, p4d, p4de, p5, p5e, \
                     p5en), and no nvidia.com/gpu.memory label says their memory"
                )
            );
        }
    }
}

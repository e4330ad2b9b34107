//! Cloud instance types whose GPUs modelserve knows, for nodes that GPU Feature Discovery does not
//! label: EKS's accelerated AMIs and AKS's GPU node pools come with NVIDIA's device plugin alone
//! (GFD runs only where the GPU operator or its own chart is installed). The well-known
//! `node.kubernetes.io/instance-type` names the type: on EC2 its family (`g5` of `g5.2xlarge`)
//! fixes the GPU model ([`EC2`]), on Azure the VM size does ([`AZURE`]), and so one GPU's memory.
//! Karpenter's `karpenter.k8s.aws/instance-gpu-memory` is not read: it is the model's nominal
//! size (24576 MiB for an A10G, whose NVML total is 23028), more than a pod can allocate.

use std::collections::BTreeMap;

use super::nvml::{A10G, A100_40GB, A100_80GB, H100_80GB, H200, L4, L40S, T4};

/// The instance type of a node, set by the cloud provider: `g5.2xlarge` on EC2,
/// `Standard_NC24ads_A100_v4` on Azure.
pub const INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
/// The resource NVIDIA's device plugin advertises the GPUs as.
pub const RESOURCE: &str = "nvidia.com/gpu";

/// Each EC2 family of whole NVIDIA GPUs of one model: the GPU, and one GPU's memory in MiB
/// (nvml.rs). A family of fractional GPUs (`g6f`) is not one of them, nor one whose GPU comes in
/// two sizes.
pub const EC2: [(&str, &str, u64); 10] = [
    ("g4dn", "NVIDIA-T4", T4),
    ("g5", "NVIDIA-A10G", A10G),
    ("g6", "NVIDIA-L4", L4),
    ("gr6", "NVIDIA-L4", L4),
    ("g6e", "NVIDIA-L40S", L40S),
    ("p4d", "NVIDIA-A100-40GB", A100_40GB),
    ("p4de", "NVIDIA-A100-80GB", A100_80GB),
    ("p5", "NVIDIA-H100-80GB", H100_80GB),
    ("p5e", "NVIDIA-H200-141GB", H200),
    ("p5en", "NVIDIA-H200-141GB", H200),
];

/// Each Azure VM size of whole NVIDIA GPUs whose model modelserve knows (the NCasT4_v3,
/// NC A100 v4, ND A100 v4, NDm A100 v4, ND H100 v5 and ND H200 v5 series): the GPU, and one
/// GPU's memory in MiB. The sizes of a fraction of a GPU (NVadsA10 v5) are not among them.
pub const AZURE: [(&str, &str, u64); 11] = [
    ("Standard_NC4as_T4_v3", "NVIDIA-T4", T4),
    ("Standard_NC8as_T4_v3", "NVIDIA-T4", T4),
    ("Standard_NC16as_T4_v3", "NVIDIA-T4", T4),
    ("Standard_NC64as_T4_v3", "NVIDIA-T4", T4),
    ("Standard_NC24ads_A100_v4", "NVIDIA-A100-80GB", A100_80GB),
    ("Standard_NC48ads_A100_v4", "NVIDIA-A100-80GB", A100_80GB),
    ("Standard_NC96ads_A100_v4", "NVIDIA-A100-80GB", A100_80GB),
    ("Standard_ND96asr_v4", "NVIDIA-A100-40GB", A100_40GB),
    ("Standard_ND96amsr_A100_v4", "NVIDIA-A100-80GB", A100_80GB),
    ("Standard_ND96isr_H100_v5", "NVIDIA-H100-80GB", H100_80GB),
    ("Standard_ND96isr_H200_v5", "NVIDIA-H200-141GB", H200),
];

/// The cloud whose name `instance_type` is, and the key of its table: the family of an EC2 type
/// (`g5` of `g5.2xlarge`), an Azure size whole. None for another cloud's (`n1-standard-4`,
/// `VM.GPU.A10.1`).
fn cloud(instance_type: &str) -> Option<(&'static str, &str)> {
    if instance_type.starts_with("Standard_") {
        return Some(("Azure", instance_type));
    }
    let (family, size) = instance_type.split_once('.')?;
    let name = |s: &str| {
        !s.is_empty()
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    };
    let ec2 = family.starts_with(|c: char| c.is_ascii_lowercase()) && name(family) && name(size);
    ec2.then_some(("EC2", family))
}

/// The GPU model and one GPU's memory in MiB of an instance type, where modelserve knows them.
pub fn gpu(instance_type: &str) -> Option<(&'static str, u64)> {
    let (cloud, key) = cloud(instance_type)?;
    let table: &[(&str, &str, u64)] = if cloud == "EC2" { &EC2 } else { &AZURE };
    table
        .iter()
        .find(|(k, ..)| *k == key)
        .map(|(_, gpu, mib)| (*gpu, *mib))
}

/// One GPU's memory in MiB of an instance type, where modelserve knows it.
pub fn memory_mib(instance_type: &str) -> Option<u64> {
    gpu(instance_type).map(|(_, mib)| mib)
}

/// The memory of one GPU of an EC2 or Azure node, in bytes, and the instance type that says it:
/// None where the node's type is neither cloud's (or `resource` is not the device plugin's);
/// else the memory, or why it is unknown.
pub fn label_memory(
    labels: &BTreeMap<String, String>,
    resource: &str,
) -> Option<Result<(u64, String), String>> {
    let name = labels.get(INSTANCE_TYPE).filter(|_| resource == RESOURCE)?;
    let (cloud, _) = cloud(name)?;
    Some(match memory_mib(name) {
        Some(mib) => Ok((mib << 20, name.clone())),
        None => {
            let known = match cloud {
                "EC2" => format!("families {}", EC2.map(|(f, ..)| f).join(", ")),
                _ => "the NCasT4_v3, NC A100 v4, ND A100 v4, NDm A100 v4, ND H100 v5 and ND \
                      H200 v5 sizes"
                    .into(),
            };
            Err(format!(
                "{INSTANCE_TYPE}={name:?} is not an {cloud} type whose GPUs modelserve knows \
                 ({known}), and no nvidia.com/gpu.memory label says their memory"
            ))
        }
    })
}

/// The GPU model of an EC2 or Azure node of `resource`, where its instance type says it.
pub fn product(labels: &BTreeMap<String, String>, resource: &str) -> Option<String> {
    let name = labels.get(INSTANCE_TYPE).filter(|_| resource == RESOURCE)?;
    gpu(name).map(|(gpu, _)| gpu.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::check::test_labels as labels;

    #[test]
    fn a_node_without_gfd_has_its_instance_types_gpu_memory() {
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
        // An Azure size is matched whole.
        assert_eq!(memory_mib("Standard_NC24ads_A100_v4"), Some(81920));
        assert_eq!(memory_mib("Standard_ND96asr_v4"), Some(40536));
        assert_eq!(memory_mib("Standard_ND96asr_v4_x"), None);
        // Not EC2's or Azure's, or not the device plugin's resource: nothing to say.
        for other in [
            "n1-standard-4",
            "VM.GPU.A10.1",
            "g5.",
            ".x",
            "G5.xlarge",
            "standard_nc4as_t4_v3",
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
    fn a_type_of_unknown_or_fractional_gpus_is_unknown_memory_saying_why() {
        let ec2 = "an EC2 type whose GPUs modelserve knows (families g4dn, g5, g6, gr6, g6e, p4d, \
                   p4de, p5, p5e, p5en)";
        let azure = "an Azure type whose GPUs modelserve knows (the NCasT4_v3, NC A100 v4, ND A100 \
                     v4, NDm A100 v4, ND H100 v5 and ND H200 v5 sizes)";
        // Fractional GPUs (g6f, a fraction of an A10), and models whose memory is not known here.
        let unknown = [
            ("g6f.large", ec2),
            ("p3.2xlarge", ec2),
            ("m5.xlarge", ec2),
            ("Standard_NV36ads_A10_v5", azure),
            ("Standard_NC80adis_H100_v5", azure),
        ];
        for (name, known) in unknown {
            let e = label_memory(&labels(&[(INSTANCE_TYPE, name)]), RESOURCE)
                .unwrap()
                .unwrap_err();
            assert_eq!(
                e,
                format!(
                    "node.kubernetes.io/instance-type={name:?} is not {known}, and no \
                     nvidia.com/gpu.memory label says their memory"
                )
            );
        }
    }
}

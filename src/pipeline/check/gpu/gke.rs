//! GKE's own GPU labels, for nodes where GPU Feature Discovery does not run (GKE installs its own
//! device plugin and no GFD): `cloud.google.com/gke-accelerator` names the GPU model, whose
//! memory is then what modelserve knows of that model ([`MEMORY`]); a MIG partition
//! (`cloud.google.com/gke-gpu-partition-size`) has no memory any label says; GPU time-sharing and
//! MPS say how many pods share a GPU in `cloud.google.com/gke-max-shared-clients-per-gpu`, and
//! advertise that many units of `nvidia.com/gpu` per GPU.

use std::collections::BTreeMap;

use super::{MOST_SHARED_BY, nvml};

/// The GPU model of a GKE node's accelerators, such as `nvidia-l4`.
pub const ACCELERATOR: &str = "cloud.google.com/gke-accelerator";
/// The MIG profile of a GKE node's GPU partitions, such as `1g.5gb`.
pub const PARTITION: &str = "cloud.google.com/gke-gpu-partition-size";
/// How many pods share one GPU under GKE's time-sharing or MPS.
pub const SHARED_CLIENTS: &str = "cloud.google.com/gke-max-shared-clients-per-gpu";
/// The only resource GKE's device plugin advertises GPUs as.
pub const RESOURCE: &str = "nvidia.com/gpu";

/// One GPU's memory in MiB by GKE accelerator (nvml.rs says where each figure comes from).
pub const MEMORY: [(&str, u64); 8] = [
    ("nvidia-tesla-t4", nvml::T4),
    ("nvidia-l4", nvml::L4),
    ("nvidia-tesla-a100", nvml::A100_40GB),
    ("nvidia-a100-80gb", nvml::A100_80GB),
    ("nvidia-h100-80gb", nvml::H100_80GB),
    ("nvidia-h100-mega-80gb", nvml::H100_80GB),
    ("nvidia-h200-141gb", nvml::H200),
    ("nvidia-rtx-pro-6000", nvml::RTX_PRO_6000),
];

/// One GPU's memory in MiB of the GKE accelerator `name`, where modelserve knows it.
pub fn memory_mib(name: &str) -> Option<u64> {
    MEMORY.iter().find(|(n, _)| *n == name).map(|(_, m)| *m)
}

/// The memory of one GPU of a GKE node, in bytes, and the accelerator that says it: None where
/// the node has no GKE accelerator label (or `resource` is not GKE's); else the memory, or why
/// it is unknown.
pub fn label_memory(
    labels: &BTreeMap<String, String>,
    resource: &str,
) -> Option<Result<(u64, String), String>> {
    let name = labels.get(ACCELERATOR).filter(|_| resource == RESOURCE)?;
    if let Some(profile) = labels.get(PARTITION) {
        return Some(Err(format!(
            "{PARTITION}={profile:?}: its GPUs are MIG partitions, whose memory no label says"
        )));
    }
    Some(match memory_mib(name) {
        Some(mib) => Ok((mib << 20, name.clone())),
        None => Err(format!(
            "{ACCELERATOR}={name:?} is not a GPU whose memory modelserve knows ({}), and no \
             nvidia.com/gpu.memory label says it",
            MEMORY.map(|(n, _)| n).join(", ")
        )),
    })
}

/// How many pods share each GPU of a GKE node: None without GKE's label (or for another
/// resource); else the count, 1 for 0, or what the label says instead of a count.
pub fn shared_by(labels: &BTreeMap<String, String>, resource: &str) -> Option<Result<u32, String>> {
    let v = labels
        .get(SHARED_CLIENTS)
        .filter(|_| resource == RESOURCE)?;
    Some(match v.parse::<u32>() {
        Ok(0) => Ok(1),
        Ok(n) if n <= MOST_SHARED_BY => Ok(n),
        _ => Err(format!(
            "{SHARED_CLIENTS}={v:?} is not a count of the pods that share a GPU, 0 to \
             {MOST_SHARED_BY}"
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pipeline::check::gpu::at_least;
    use crate::pipeline::check::test_labels as labels;

    #[test]
    fn a_gke_node_without_gfd_has_its_accelerators_memory() {
        let l4 = labels(&[(ACCELERATOR, "nvidia-l4")]);
        assert_eq!(
            label_memory(&l4, RESOURCE),
            Some(Ok((23034 << 20, "nvidia-l4".to_string())))
        );
        // The two whose figure is the decimal size in their names: below NVML's.
        assert_eq!(memory_mib("nvidia-h200-141gb"), Some(134_468));
        assert_eq!(memory_mib("nvidia-rtx-pro-6000"), Some(91_552));
        // Not GKE, or not GKE's resource: nothing to say.
        assert_eq!(label_memory(&labels(&[]), RESOURCE), None);
        assert_eq!(label_memory(&l4, "nvidia.com/mig-1g.5gb"), None);
        assert_eq!(label_memory(&l4, "amd.com/gpu"), None);
    }

    #[test]
    fn an_unknown_accelerator_or_a_mig_partition_is_unknown_memory_saying_why() {
        let b200 = labels(&[(ACCELERATOR, "nvidia-b200")]);
        let e = label_memory(&b200, RESOURCE).unwrap().unwrap_err();
        assert!(
            e.starts_with(
                "cloud.google.com/gke-accelerator=\"nvidia-b200\" is not a GPU whose memory \
                 modelserve knows (nvidia-tesla-t4, nvidia-l4, "
            ),
            "{e}"
        );
        assert!(e.ends_with("no nvidia.com/gpu.memory label says it"), "{e}");
        // A partition of an A100 is never counted as the whole GPU's 40 GiB.
        let mig = labels(&[(ACCELERATOR, "nvidia-tesla-a100"), (PARTITION, "1g.5gb")]);
        assert_eq!(
            label_memory(&mig, RESOURCE),
            Some(Err(
                "cloud.google.com/gke-gpu-partition-size=\"1g.5gb\": its GPUs are MIG \
                 partitions, whose memory no label says"
                    .into()
            ))
        );
    }

    #[test]
    fn gke_time_sharing_says_how_many_pods_share_a_gpu() {
        let by = |v: &str| shared_by(&labels(&[(SHARED_CLIENTS, v)]), RESOURCE);
        assert_eq!(by("4"), Some(Ok(4)));
        assert_eq!(by("0"), Some(Ok(1)));
        for bad in ["many", "-1", "2000"] {
            assert_eq!(
                by(bad),
                Some(Err(format!(
                    "cloud.google.com/gke-max-shared-clients-per-gpu={bad:?} is not a count of \
                     the pods that share a GPU, 0 to 1024"
                )))
            );
        }
        assert_eq!(shared_by(&labels(&[]), RESOURCE), None);
        assert_eq!(
            shared_by(&labels(&[(SHARED_CLIENTS, "4")]), "nvidia.com/gpu.shared"),
            None
        );
    }

    #[test]
    fn only_accelerators_that_give_each_pod_the_memory_planned_are_admitted() {
        let names: Vec<String> = ["nvidia-l4", "nvidia-tesla-t4", "nvidia-b200"]
            .map(String::from)
            .to_vec();
        // 15 GiB: an L4 or a T4 alone; an unknown model never.
        assert_eq!(
            at_least(&names, memory_mib, 15 << 30, 1),
            ["nvidia-l4", "nvidia-tesla-t4"]
        );
        assert_eq!(
            at_least(&names, memory_mib, (15 << 30) + 1, 1),
            ["nvidia-l4"]
        );
        // An L4 shared two ways gives each pod 11517 MiB.
        assert_eq!(at_least(&names, memory_mib, 11517 << 20, 2), ["nvidia-l4"]);
        assert!(at_least(&names, memory_mib, (11517 << 20) + 1, 2).is_empty());
        assert!(at_least(&names, memory_mib, u64::MAX, 1024).is_empty());
    }
}

//! The pure part of the node check: which nodes a replica may land on, and whether one holds
//! the memory its pod will request.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeStatus, Toleration};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;

use super::cpu;
use crate::api::EngineSpec;
use crate::gguf::memory::repack::Tiers;
use crate::units::{human_bytes, parse_quantity};

/// A node the replicas may land on, with its allocatable memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub name: String,
    pub memory: u64,
    /// The CPU code it may run (its Node Feature Discovery labels, or its architecture).
    pub cpu: Tiers,
    /// Its logical CPUs (`status.capacity.cpu`: llama-server starts its threads by the
    /// hardware, not by the pod's CPU limit), 0 when it does not say.
    pub cpus: u64,
}

/// The nodes a replica could be scheduled on, by nodeSelector, taints and cordons.
pub fn candidates(
    nodes: &[std::sync::Arc<Node>],
    selector: &BTreeMap<String, String>,
    tolerations: &[Toleration],
) -> Vec<Candidate> {
    nodes
        .iter()
        .filter(|n| {
            !n.spec
                .as_ref()
                .and_then(|s| s.unschedulable)
                .unwrap_or(false)
        })
        .filter(|n| selector.iter().all(|(k, v)| n.labels().get(k) == Some(v)))
        .filter(|n| {
            let taints = n
                .spec
                .as_ref()
                .and_then(|s| s.taints.clone())
                .unwrap_or_default();
            taints
                .iter()
                .filter(|t| t.effect == "NoSchedule" || t.effect == "NoExecute")
                .all(|t| {
                    tolerations.iter().any(|tol| {
                        let key_ok = tol
                            .key
                            .as_deref()
                            .is_none_or(|k| k.is_empty() || k == t.key);
                        let effect_ok = tol
                            .effect
                            .as_deref()
                            .is_none_or(|e| e.is_empty() || e == t.effect);
                        let value_ok = tol.operator.as_deref() == Some("Exists")
                            || tol.value.as_deref() == t.value.as_deref();
                        key_ok
                            && effect_ok
                            && value_ok
                            && (tol.key.is_some() || tol.operator.as_deref() == Some("Exists"))
                    })
                })
        })
        .map(|n| {
            // A quantity of the node's status, 0 when it does not say.
            let status = |field: fn(&NodeStatus) -> Option<&BTreeMap<String, Quantity>>, key| {
                n.status
                    .as_ref()
                    .and_then(field)
                    .and_then(|m| m.get(key))
                    .and_then(|q| parse_quantity(&q.0))
                    .unwrap_or(0)
            };
            Candidate {
                name: n.name_any(),
                memory: status(|s| s.allocatable.as_ref(), "memory"),
                cpu: cpu::tiers(n.labels()),
                cpus: status(|s| s.capacity.as_ref(), "cpu"),
            }
        })
        .collect()
}

/// The most logical CPUs of the nodes a replica may land on, within `engine::MAX_CPUS`; a
/// large node's (`engine::DEFAULT_CPUS`) when none says.
pub fn most_cpus(nodes: &[Candidate]) -> u64 {
    use crate::gguf::memory::engine::{DEFAULT_CPUS, MAX_CPUS};
    match nodes.iter().map(|c| c.cpus).max() {
        Some(n) if n > 0 => n.min(MAX_CPUS),
        _ => DEFAULT_CPUS,
    }
}

/// Whether some candidate holds `needed` bytes; the message says where or by how much not.
pub fn fit(needed: u64, nodes: &[Candidate]) -> Result<String, String> {
    let fitting = nodes.iter().filter(|c| c.memory >= needed).count();
    match nodes
        .iter()
        .max_by_key(|c| (c.memory, std::cmp::Reverse(c.name.clone())))
    {
        None => Err(format!(
            "a replica needs {} and no node matches engine.nodeSelector and tolerations",
            human_bytes(needed)
        )),
        Some(largest) if largest.memory < needed => Err(format!(
            "a replica needs {}, and no node can hold it: the largest, {}, has {} allocatable ({} short)",
            human_bytes(needed),
            largest.name,
            human_bytes(largest.memory),
            human_bytes(needed - largest.memory)
        )),
        Some(_) => Ok(format!("fits on {fitting} of {} node(s)", nodes.len())),
    }
}

/// The memory a replica's pod requests, and a note when the user set it: `engine.resources`
/// (request, or else limit) wins over the estimate `needed`, which the note compares it with.
pub fn requested(engine: &EngineSpec, needed: u64) -> Result<(u64, Option<String>), String> {
    let Some(q) = engine.memory_request() else {
        return Ok((needed, None));
    };
    let Some(asked) = parse_quantity(&q.0) else {
        return Err(format!(
            "engine.resources memory {:?} is not a quantity such as 16Gi, 16384Mi or 17179869184",
            q.0
        ));
    };
    let note = if asked < needed {
        format!(
            "engine.resources asks for {} per replica, {} below the estimate: llama-server may be killed for memory",
            human_bytes(asked),
            human_bytes(needed - asked)
        )
    } else {
        format!(
            "engine.resources asks for {} per replica (the estimate is {})",
            human_bytes(asked),
            human_bytes(needed)
        )
    };
    Ok((asked, Some(note)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, Taint};

    fn node(
        name: &str,
        mem: &str,
        labels: &[(&str, &str)],
        taint: Option<&str>,
    ) -> std::sync::Arc<Node> {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.metadata.labels = Some(
            labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        n.status = Some(NodeStatus {
            allocatable: Some([("memory".to_string(), Quantity(mem.into()))].into()),
            capacity: Some([("cpu".to_string(), Quantity(name.len().to_string()))].into()),
            ..Default::default()
        });
        n.spec = Some(NodeSpec {
            taints: taint.map(|k| {
                vec![Taint {
                    key: k.into(),
                    effect: "NoSchedule".into(),
                    ..Default::default()
                }]
            }),
            ..Default::default()
        });
        std::sync::Arc::new(n)
    }

    fn engine(resources: serde_json::Value) -> EngineSpec {
        serde_json::from_value(serde_json::json!({ "resources": resources })).unwrap()
    }

    #[test]
    fn the_threads_are_counted_for_the_largest_node_a_replica_may_land_on() {
        // The test nodes have as many CPUs as their names have letters.
        let nodes = [
            node("small", "8Gi", &[], None),
            node("larger", "8Gi", &[], None),
        ];
        let c = candidates(&nodes, &BTreeMap::new(), &[]);
        assert_eq!(c.iter().map(|c| c.cpus).collect::<Vec<_>>(), [5, 6]);
        assert_eq!(most_cpus(&c), 6);
        // None, or none that says: a large node's.
        assert_eq!(most_cpus(&[]), crate::gguf::memory::engine::DEFAULT_CPUS);
        let mut silent = c.clone();
        silent.iter_mut().for_each(|c| c.cpus = 0);
        assert_eq!(
            most_cpus(&silent),
            crate::gguf::memory::engine::DEFAULT_CPUS
        );
        // A node claiming absurdly many is taken for the most counted.
        silent[0].cpus = u64::MAX;
        assert_eq!(most_cpus(&silent), crate::gguf::memory::engine::MAX_CPUS);
    }

    #[test]
    fn the_users_memory_request_or_limit_is_what_must_fit() {
        let need = 4 << 30;
        assert_eq!(requested(&EngineSpec::default(), need), Ok((need, None)));

        let (asked, note) = requested(
            &engine(serde_json::json!({"requests": {"memory": "8Gi"}})),
            need,
        )
        .unwrap();
        assert_eq!(asked, 8 << 30);
        assert_eq!(
            note.unwrap(),
            "engine.resources asks for 8.0 GiB per replica (the estimate is 4.0 GiB)"
        );

        // A limit alone is the request too, as Kubernetes makes it.
        let (asked, note) = requested(
            &engine(serde_json::json!({"limits": {"memory": "3Gi"}})),
            need,
        )
        .unwrap();
        assert_eq!(asked, 3 << 30);
        assert_eq!(
            note.unwrap(),
            "engine.resources asks for 3.0 GiB per replica, 1.0 GiB below the estimate: llama-server may be killed for memory"
        );

        let bad = requested(
            &engine(serde_json::json!({"requests": {"memory": "lots"}})),
            need,
        )
        .unwrap_err();
        assert_eq!(
            bad,
            "engine.resources memory \"lots\" is not a quantity such as 16Gi, 16384Mi or 17179869184"
        );
    }

    #[test]
    fn no_node_fits_names_the_largest_node_and_the_shortfall() {
        let nodes = [
            node("small", "16Gi", &[], None),
            node("large", "64Gi", &[], None),
        ];
        let c = candidates(&nodes, &BTreeMap::new(), &[]);
        assert_eq!(
            fit(70 << 30, &c).unwrap_err(),
            "a replica needs 70.0 GiB, and no node can hold it: the largest, large, has 64.0 GiB allocatable (6.0 GiB short)"
        );
        assert_eq!(fit(20 << 30, &c).unwrap(), "fits on 1 of 2 node(s)");
    }

    #[test]
    fn node_selector_and_taints_narrow_the_candidates() {
        let nodes = [
            node("cpu", "64Gi", &[("pool", "cpu")], None),
            node("gpu", "128Gi", &[("pool", "gpu")], Some("nvidia.com/gpu")),
        ];
        let any: Vec<_> = candidates(&nodes, &BTreeMap::new(), &[])
            .into_iter()
            .map(|c| c.name)
            .collect();
        assert_eq!(any, ["cpu"], "a tainted node needs a toleration");
        let tol = Toleration {
            key: Some("nvidia.com/gpu".into()),
            operator: Some("Exists".into()),
            ..Default::default()
        };
        let sel: BTreeMap<_, _> = [("pool".to_string(), "gpu".to_string())].into();
        let gpu: Vec<_> = candidates(&nodes, &sel, &[tol])
            .into_iter()
            .map(|c| c.name)
            .collect();
        assert_eq!(gpu, ["gpu"]);
        assert!(
            fit(
                1,
                &candidates(
                    &nodes,
                    &[("pool".to_string(), "tpu".to_string())].into(),
                    &[]
                )
            )
            .unwrap_err()
            .contains("no node matches")
        );
    }
}

//! Who holds the GPUs a replica waits for. When the scheduler says a GPU replica lacks GPUs, the
//! Place stage reads the pods on the nodes the replica may use (those the Check stage would
//! place it on: selector, taints, enough GPUs of the resource, each at least the memory planned)
//! and says how many GPUs are requested there, and by which pods of the model's own namespace;
//! pods of other namespaces are counted, never named, so one tenant does not learn another's.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use crate::api::{CheckStatus, EngineSpec};
use crate::pipeline::catalog;
use crate::pipeline::check::{GpuCheck, fit, gpu};
use crate::pipeline::env::Env;
use crate::units::parse_quantity;

/// The most nodes whose pods are read for one model: beyond these, the message says how many
/// more there are.
const MOST_NODES: usize = 8;
/// The most pods named per node.
const MOST_NAMED: usize = 3;
/// The most pods read on one node (the kubelet's default is 110).
const MOST_PODS: u32 = 500;

/// A node the replica may use: its name and allocatable GPUs of the resource.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Usable {
    pub node: String,
    pub gpus: u32,
}

/// The nodes a replica of `engine` may use, by the placement in `check`, in name order.
pub fn usable(env: &Env, engine: &EngineSpec, check: Option<&CheckStatus>) -> Vec<Usable> {
    let nodes = env.cache.nodes();
    let candidates = fit::candidates(&nodes, &engine.node_selector, &gpu::tolerations(engine));
    let Ok(Some(g)) = GpuCheck::of(env, engine, &nodes, &candidates) else {
        return Vec::new();
    };
    let planned = check
        .and_then(|c| c.gpu_memory_bytes)
        .map_or(0, |m| m.max(0) as u64);
    // Where the Deployment's affinity asks the memory label, a node that does not say is not one
    // the replica gets.
    let by_label = check.is_some_and(|c| catalog::gpu::affinity(engine, c).is_some());
    admitted(g.nodes, g.request.gpus, planned, by_label)
}

/// The nodes that give a replica `gpus` GPUs of at least `planned` each, in name order; those
/// whose GPU memory is unknown only where it is not asked `by_label`.
fn admitted(nodes: Vec<gpu::NodeGpus>, gpus: u32, planned: u64, by_label: bool) -> Vec<Usable> {
    let mut usable: Vec<Usable> = nodes
        .into_iter()
        .filter(|n| n.takes(gpus))
        .filter(|n| n.known().map_or(!by_label, |m| m >= planned))
        .map(|n| Usable {
            node: n.node,
            gpus: n.count,
        })
        .collect();
    usable.sort_by(|a, b| a.node.cmp(&b.node));
    usable
}

/// The GPUs of `resource` a pod requests, as the scheduler counts them: the larger of its
/// containers' sum and its largest init container (a limit stands for a missing request).
pub fn requested(spec: &PodSpec, resource: &str) -> u64 {
    let of = |c: &Container| {
        let r = c.resources.as_ref();
        let get = |m: Option<&BTreeMap<String, Quantity>>| {
            m.and_then(|m| m.get(resource))
                .and_then(|q| parse_quantity(&q.0))
        };
        get(r.and_then(|r| r.requests.as_ref()))
            .or_else(|| get(r.and_then(|r| r.limits.as_ref())))
            .unwrap_or(0)
    };
    let sum = spec
        .containers
        .iter()
        .fold(0u64, |a, c| a.saturating_add(of(c)));
    let init = spec
        .init_containers
        .iter()
        .flatten()
        .map(of)
        .max()
        .unwrap_or(0);
    sum.max(init)
}

/// What the message adds: for each usable node with fewer than `want` GPUs free, how many of
/// its GPUs are requested and by which pods (named only in `namespace`). None when some usable
/// node has enough free (the scheduler's words are then about something else) or there is
/// none to tell.
pub fn held(
    resource: &str,
    want: u32,
    namespace: &str,
    nodes: &[(Usable, Vec<Pod>)],
    more: usize,
) -> Option<String> {
    let mut told = Vec::new();
    for (node, pods) in nodes {
        let mut total = 0u64;
        let mut named = Vec::new();
        let mut elsewhere = 0u64;
        for p in pods {
            let running = !matches!(
                p.status.as_ref().and_then(|s| s.phase.as_deref()),
                Some("Succeeded" | "Failed")
            );
            let n = p.spec.as_ref().map_or(0, |s| requested(s, resource));
            if !running || n == 0 {
                continue;
            }
            total = total.saturating_add(n);
            if p.namespace().as_deref() == Some(namespace) {
                named.push((p.name_any(), n));
            } else {
                elsewhere = elsewhere.saturating_add(n);
            }
        }
        if u64::from(node.gpus).saturating_sub(total) >= u64::from(want) {
            return None;
        }
        named.sort();
        let mut by: Vec<String> = named
            .iter()
            .take(MOST_NAMED)
            .map(|(pod, n)| format!("{n} by {pod}"))
            .collect();
        if named.len() > MOST_NAMED {
            by.push(format!("{} more pods", named.len() - MOST_NAMED));
        }
        if elsewhere > 0 {
            by.push(format!("{elsewhere} by pods of other namespaces"));
        }
        let by = if by.is_empty() {
            String::new()
        } else {
            format!(" ({})", by.join(", "))
        };
        told.push(format!(
            "{}: {total} of {} requested{by}",
            node.node, node.gpus
        ));
    }
    if told.is_empty() {
        return None;
    }
    let more = match more {
        0 => String::new(),
        n => format!("; {n} more nodes the replica may use were not read"),
    };
    Some(format!(
        "the nodes whose GPUs the replica may use have fewer than {want} {resource} free: {}{more}; a replica starts when another model frees them (scale it down or delete it) or a GPU node is added",
        told.join("; ")
    ))
}

/// [`held`] for a model in `namespace` from the pods on its usable nodes, read from the API.
/// None when reading fails: the scheduler's words stand alone.
pub async fn tell(
    env: &Env,
    engine: &EngineSpec,
    namespace: &str,
    check: Option<&CheckStatus>,
) -> Option<String> {
    let resource = engine.gpu_resource()?;
    let usable = usable(env, engine, check);
    let more = usable.len().saturating_sub(MOST_NODES);
    let pods: Api<Pod> = Api::all(env.client.clone());
    let mut nodes = Vec::new();
    for node in usable.into_iter().take(MOST_NODES) {
        // From the API server's watch cache (any resourceVersion): cheap, and a second's
        // staleness does not matter to a message.
        let lp = ListParams::default()
            .fields(&format!(
                "spec.nodeName={},status.phase!=Succeeded,status.phase!=Failed",
                node.node
            ))
            .limit(MOST_PODS)
            .match_any();
        match pods.list(&lp).await {
            Ok(list) => nodes.push((node, list.items)),
            Err(e) => {
                tracing::debug!(node = %node.node, error = %e, "reading the pods on a GPU node");
                return None;
            }
        }
    }
    held(&resource, engine.gpus(), namespace, &nodes, more)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(ns: &str, name: &str, gpus: u32, phase: &str) -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "namespace": ns},
            "spec": {"containers": [
                {"name": "a", "resources": {"limits": {"nvidia.com/gpu": gpus.to_string()}}},
                {"name": "b"},
            ]},
            "status": {"phase": phase},
        }))
        .unwrap()
    }

    fn node(name: &str, gpus: u32) -> Usable {
        Usable {
            node: name.into(),
            gpus,
        }
    }

    #[test]
    fn the_gpus_a_replica_waits_for_are_told_with_their_holders_of_its_own_namespace_only() {
        let r = "nvidia.com/gpu";
        let nodes = [
            (
                node("two", 2),
                vec![
                    pod("team-a", "first-abc", 2, "Running"),
                    pod("team-a", "done-xyz", 2, "Succeeded"),
                ],
            ),
            (
                node("four", 4),
                vec![
                    pod("team-b", "secret-model", 3, "Running"),
                    pod("team-a", "small", 0, "Running"),
                ],
            ),
        ];
        let m = held(r, 2, "team-a", &nodes, 0).unwrap();
        assert_eq!(
            m,
            "the nodes whose GPUs the replica may use have fewer than 2 nvidia.com/gpu free: two: 2 of 2 requested (2 by first-abc); four: 3 of 4 requested (3 by pods of other namespaces); a replica starts when another model frees them (scale it down or delete it) or a GPU node is added"
        );
        assert!(!m.contains("secret-model"), "{m}");
        // One node with enough free: the scheduler's words are about something else.
        assert_eq!(held(r, 1, "team-a", &nodes, 0), None);
        assert_eq!(held(r, 1, "team-a", &[], 0), None);
        let m = held(r, 2, "team-a", &nodes[..1], 5).unwrap();
        assert!(
            m.contains("2 by first-abc); 5 more nodes the replica may use were not read;"),
            "{m}"
        );
    }

    #[test]
    fn a_node_whose_gpu_memory_is_unknown_is_usable_only_where_no_label_is_asked() {
        let gpus = |name: &str, count: u32, memory: Option<u64>| gpu::NodeGpus {
            node: name.into(),
            count,
            memory: memory.ok_or_else(|| "no nvidia.com/gpu.memory label".to_string()),
            shared_by: 1,
            labelled: memory.is_some(),
            gke: None,
            instance_type: None,
            amd_mixed: None,
            product: None,
            driver_major: None,
            host_memory: 0,
        };
        let nodes = || {
            vec![
                gpus("unknown", 2, None),
                gpus("small", 2, Some(8 << 30)),
                gpus("large", 2, Some(24 << 30)),
                gpus("one", 1, Some(24 << 30)),
            ]
        };
        let names = |u: Vec<Usable>| u.into_iter().map(|u| u.node).collect::<Vec<_>>();
        assert_eq!(names(admitted(nodes(), 2, 16 << 30, true)), ["large"]);
        assert_eq!(
            names(admitted(nodes(), 2, 16 << 30, false)),
            ["large", "unknown"]
        );
    }

    #[test]
    fn a_pod_requests_what_the_scheduler_counts() {
        let mut spec = pod("a", "p", 1, "Running").spec.unwrap();
        assert_eq!(requested(&spec, "nvidia.com/gpu"), 1);
        assert_eq!(requested(&spec, "amd.com/gpu"), 0);
        // A larger init container counts instead of the containers' sum.
        spec.init_containers = pod("a", "i", 3, "Running").spec.map(|s| s.containers);
        assert_eq!(requested(&spec, "nvidia.com/gpu"), 3);
    }
}

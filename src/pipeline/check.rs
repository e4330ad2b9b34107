//! Stage 2, Check, before any download: read the GGUF header over HTTP ranges, decide whether
//! the nodes' llama.cpp build loads it, estimate a replica's memory, and stop if no node can
//! hold it.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Toleration};
use kube::api::ListParams;
use kube::{Api, ResourceExt};

use super::Outcome;
use crate::api::{CheckStatus, EngineSpec, ModelServe, ResolvedStatus};
use crate::controller::Context;
use crate::gguf::memory::{self, Flags};
use crate::gguf::{self, ReadError, SourceError, support};
use crate::hub::Hub;
use crate::units::{gi_quantity, human_bytes, parse_quantity};

/// llama-server's --ubatch-size, as the Catalog stage runs it.
pub const UBATCH: u64 = 512;

/// The settings the check is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    pub build: u32,
    /// Said in messages when the build is an assumption rather than read from the image tag.
    pub build_note: Option<String>,
    pub flags: Flags,
}

/// The nodes' build and the server flags for `ms`, from the spec and the operator's configuration.
pub fn plan(ms: &ModelServe, default_image: &str, build_override: Option<u32>) -> Plan {
    let image = ms
        .spec
        .engine
        .as_ref()
        .and_then(|e| e.image.clone())
        .unwrap_or_else(|| default_image.to_string());
    let (build, build_note) = match (support::build_of_image(&image), build_override) {
        (_, Some(b)) => (
            b,
            Some(format!("build b{b} as configured (--engine-build)")),
        ),
        (Some(b), None) => (b, None),
        (None, None) => (
            LATEST_KNOWN_BUILD,
            Some(format!(
                "the image {image} names no build, so b{LATEST_KNOWN_BUILD} is assumed; set --engine-build to be exact"
            )),
        ),
    };
    let parallel = (ms.spec.context_size / ms.spec.context_length.max(1)).max(1) as u64;
    Plan {
        build,
        build_note,
        flags: Flags {
            ctx_size: ms.spec.context_size.max(1) as u64,
            parallel,
            ubatch: UBATCH,
            build,
        },
    }
}

/// The newest build the data tables describe.
pub const LATEST_KNOWN_BUILD: u32 = 10587;

/// What status.check.request records for this check.
pub fn request(r: &ResolvedStatus, p: &Plan) -> String {
    format!(
        "{}@{} ctx={} parallel={} build=b{}",
        r.set, r.commit, p.flags.ctx_size, p.flags.parallel, p.build
    )
}

/// Reads the model's header from the registry and judges build support and memory.
pub async fn inspect(
    hub: &Hub,
    repo: &str,
    r: &ResolvedStatus,
    p: &Plan,
) -> Result<CheckStatus, Outcome> {
    let paths: Vec<String> = r.files.iter().map(|f| f.path.clone()).collect();
    let (header, _) = gguf::read_model(hub, repo, &r.commit, &paths)
        .await
        .map_err(read_failure)?;
    let first =
        support::first_build(&header, paths.len() > 1, p.build).map_err(|e| Outcome::Failed {
            reason: e.reason().into(),
            message: with_note(e.to_string(), p),
            retry: None,
        })?;
    let e = memory::estimate(&header, &p.flags);
    Ok(CheckStatus {
        request: Some(request(r, p)),
        architecture: header.architecture().map(String::from),
        engine_build: Some(format!("b{}", p.build)),
        first_build: Some(format!("b{first}")),
        parallel: Some(p.flags.parallel as i32),
        memory_bytes: Some(e.total as i64),
        memory: Some(gi_quantity(e.total)),
        kv_bytes_per_token: Some(e.kv_bytes_per_token as i64),
        basis: Some(e.basis.clone()),
    })
}

fn with_note(message: String, p: &Plan) -> String {
    match &p.build_note {
        Some(n) => format!("{message} ({n})"),
        None => message,
    }
}

fn read_failure(e: ReadError) -> Outcome {
    match e {
        ReadError::Source(SourceError::Hub(h)) if h.is_transient() => Outcome::Waiting {
            reason: h.reason().into(),
            message: format!("reading the GGUF header: {h}"),
            after: Duration::from_secs(15),
        },
        ReadError::Source(SourceError::Hub(h)) => Outcome::Failed {
            reason: h.reason().into(),
            message: format!("reading the GGUF header: {h}"),
            retry: None,
        },
        ReadError::Source(other) => Outcome::Failed {
            reason: "InvalidGGUF".into(),
            message: other.to_string(),
            retry: None,
        },
        ReadError::Invalid { .. } => Outcome::Failed {
            reason: "InvalidGGUF".into(),
            message: e.to_string(),
            retry: None,
        },
    }
}

/// A node the replicas may land on, with its allocatable memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub name: String,
    pub memory: u64,
}

/// The nodes a replica could be scheduled on, by nodeSelector, taints and cordons.
pub fn candidates(
    nodes: &[Node],
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
        .map(|n| Candidate {
            name: n.name_any(),
            memory: n
                .status
                .as_ref()
                .and_then(|s| s.allocatable.as_ref())
                .and_then(|a| a.get("memory"))
                .and_then(|q| parse_quantity(&q.0))
                .unwrap_or(0),
        })
        .collect()
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

/// Runs the stage.
pub async fn run(
    ctx: &Context,
    ms: &ModelServe,
    resolved: &ResolvedStatus,
    check: &mut Option<CheckStatus>,
) -> Outcome {
    let p = plan(ms, &ctx.config.engine_image, ctx.config.engine_build);
    let key = request(resolved, &p);
    let cached = check
        .clone()
        .filter(|c| c.request.as_deref() == Some(key.as_str()));
    // A check that passed for this generation holds: later stages reconcile every few seconds
    // and must not list every node each time. Place reports what the scheduler says after that.
    if cached.is_some()
        && let Some(c) = ms
            .status
            .as_ref()
            .and_then(|s| crate::conditions::get(&s.conditions, "Checked"))
        && c.status == "True"
        && c.observed_generation.is_some()
        && c.observed_generation == ms.metadata.generation
    {
        return Outcome::Done {
            reason: c.reason.clone(),
            message: c.message.clone(),
        };
    }
    let status = match cached {
        Some(done) => done,
        None => {
            let token = match super::resolve::token(ctx, ms).await {
                Ok(t) => t,
                Err(outcome) => return outcome,
            };
            let hub = match Hub::new(
                &ctx.config.registry_endpoint,
                token.map(crate::secret::Secret::new),
            ) {
                Ok(h) => h,
                Err(e) => {
                    return Outcome::Failed {
                        reason: e.reason().into(),
                        message: e.to_string(),
                        retry: None,
                    };
                }
            };
            match inspect(&hub, &ms.spec.repo, resolved, &p).await {
                Ok(s) => s,
                Err(outcome) => {
                    *check = None;
                    return outcome;
                }
            }
        }
    };
    *check = Some(status.clone());
    let needed = status.memory_bytes.unwrap_or(0).max(0) as u64;
    let nodes = match Api::<Node>::all(ctx.client.clone())
        .list(&ListParams::default())
        .await
    {
        Ok(l) => l.items,
        Err(e) => {
            return Outcome::Waiting {
                reason: "KubernetesApiError".into(),
                message: format!("cannot list nodes to compare memory: {e}"),
                after: Duration::from_secs(30),
            };
        }
    };
    let engine = ms.spec.engine.clone().unwrap_or_default();
    // The scheduler places a replica by the memory its pod requests: the user's, when set.
    let (asked, asked_note) = match requested(&engine, needed) {
        Ok(r) => r,
        Err(message) => {
            return Outcome::Failed {
                reason: "InvalidResources".into(),
                message,
                retry: None,
            };
        }
    };
    let verdict = fit(
        asked,
        &candidates(&nodes, &engine.node_selector, &engine.tolerations),
    );
    let mut summary = format!(
        "{} loads from {} (nodes run {}); {}",
        status.architecture.as_deref().unwrap_or("the model"),
        status.first_build.as_deref().unwrap_or("?"),
        status.engine_build.as_deref().unwrap_or("?"),
        status.basis.as_deref().unwrap_or_default()
    );
    if let Some(n) = asked_note {
        summary = format!("{summary}; {n}");
    }
    match verdict {
        Ok(fits) => Outcome::Done {
            reason: "Checked".into(),
            message: with_note(format!("{summary}; {fits}"), &p),
        },
        // Nodes can be added without a spec change, so look again now and then.
        Err(why) => Outcome::Failed {
            reason: "NoNodeFits".into(),
            message: format!("{why}. {summary}"),
            retry: Some(Duration::from_secs(300)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus, Taint};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    fn node(name: &str, mem: &str, labels: &[(&str, &str)], taint: Option<&str>) -> Node {
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
        n
    }

    fn engine(resources: serde_json::Value) -> EngineSpec {
        serde_json::from_value(serde_json::json!({ "resources": resources })).unwrap()
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

    #[test]
    fn the_build_comes_from_the_image_or_is_a_stated_assumption() {
        let mut ms = ModelServe::new(
            "m",
            serde_json::from_value(
                serde_json::json!({"repo": "a/b", "contextSize": 16384, "contextLength": 4096}),
            )
            .unwrap(),
        );
        let p = plan(&ms, "ghcr.io/ggml-org/llama.cpp:server-b6500", None);
        assert_eq!(
            (p.build, p.build_note.clone(), p.flags.parallel),
            (6500, None, 4)
        );
        let p = plan(&ms, "llama.cpp:latest", None);
        assert!(p.build_note.unwrap().contains("names no build"));
        ms.spec.engine = Some(crate::api::EngineSpec {
            image: Some("x:server-cuda-b7000".into()),
            ..Default::default()
        });
        assert_eq!(
            plan(&ms, "ghcr.io/ggml-org/llama.cpp:server-b6500", None).build,
            7000
        );
        assert_eq!(plan(&ms, "y", Some(5000)).build, 5000);
    }
}

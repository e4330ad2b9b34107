//! The Place stage on the test bed: the real scheduler decides where a replica goes, and kwok's
//! stages (the default pod-ready one and testbed/kwok/pod-faults.yaml) play the kubelet.
//! The first tests run the stage's own observe + decide on a Deployment shaped like the
//! Catalog stage's; the last ones go through a ModelServe and the operator.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{ListParams, PostParams};
use modelserve::api::{ModelServe, ModelServeSpec, ModelServeStatus};
use modelserve::pipeline::Outcome;
use modelserve::pipeline::place::{Decision, Limits, Observed, decide};
use support::fake_hub::{FakeHub, HubFile};
use support::models::Dense;
use support::{Operator, Testbed, condition, eventually, start_mirror};

const LIMITS: Limits = Limits {
    grace: Duration::from_secs(2),
    timeout: Duration::from_secs(600),
    restarts: 3,
};

/// Fails, saying how to fix it, when the test bed's kwok was started without the fault stages.
fn require_fault_stages(tb: &Testbed) {
    let stages = tb.kubeconfig.with_file_name("stages.yaml");
    let loaded = std::fs::read_to_string(&stages).unwrap_or_default();
    assert!(
        loaded.contains("name: modelserve-fault-crashloop"),
        "the test bed's kwok runs without testbed/kwok/pod-faults.yaml ({} has no such stage): it was started before that file existed; restart it with `scripts/testbed down && scripts/testbed up`",
        stages.display()
    );
}

/// A Deployment shaped like the Catalog stage's: the contract's labels, an init container
/// `pull`, the server container with port `http` and memory request = limit.
fn deployment(name: &str, memory: &str) -> Deployment {
    let labels = serde_json::json!({
        "app.kubernetes.io/name": "llama-server",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/component": "model-server",
        "app.kubernetes.io/managed-by": "modelserve",
        "modelserve.dev/model": name,
    });
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"modelserve.dev/model": name}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "initContainers": [{"name": "pull", "image": "modelserve:test",
                                        "command": ["modelserve", "pull"]}],
                    "containers": [{
                        "name": "llama-server", "image": "llama.cpp:server-test",
                        "ports": [{"name": "http", "containerPort": 8080}],
                        "resources": {"requests": {"memory": memory}, "limits": {"memory": memory}}
                    }]
                }
            }
        }
    }))
    .unwrap()
}

fn reason(o: &Outcome) -> &str {
    o.reason()
}

fn message(o: &Outcome) -> &str {
    o.message()
}

/// What the Place stage's cache would hold for the model `name`, read from the API server.
async fn observe(client: &kube::Client, ns: &str, name: &str) -> Result<Observed, kube::Error> {
    let lp = ListParams::default().labels(&format!("modelserve.dev/model={name}"));
    Ok(Observed {
        deployment: Api::<Deployment>::namespaced(client.clone(), ns)
            .get_opt(name)
            .await?,
        replica_sets: Api::<ReplicaSet>::namespaced(client.clone(), ns)
            .list(&lp)
            .await?
            .items
            .into_iter()
            .map(modelserve::pipeline::place::observe::slim_replica_set)
            .collect(),
        pods: Api::<Pod>::namespaced(client.clone(), ns)
            .list(&lp)
            .await?
            .items,
    })
}

/// Creates the Deployment in a fresh namespace named `prefix-...` and runs the stage's decision
/// until it gives `want` (and `also` holds), or fails with the last decision.
async fn place(
    prefix: &str,
    memory: &str,
    want: &str,
    also: impl Fn(&Decision) -> bool,
) -> Decision {
    let tb = Testbed::get();
    let ns = tb.namespace(prefix);
    let client = tb.client().await;
    Api::<Deployment>::namespaced(client.clone(), &ns.name)
        .create(&PostParams::default(), &deployment("m", memory))
        .await
        .unwrap();
    let mut last = None;
    let found = eventually(Duration::from_secs(30), async || {
        let observed = observe(&client, &ns.name, "m").await.ok()?;
        let d = decide(
            "m",
            &ns.name,
            &observed,
            Timestamp::now(),
            &LIMITS,
            None,
            None,
        );
        let hit = reason(&d.outcome) == want && also(&d);
        last = Some(d.clone());
        hit.then_some(d)
    })
    .await;
    match found {
        Some(d) => d,
        None => panic!(
            "Place did not give {want} in namespace {}; last: {last:#?}",
            ns.name
        ),
    }
}

#[tokio::test]
async fn a_ready_replica_is_placed_with_its_pod_node_and_loopback_address() {
    let d = place("place-ok", "1Gi", "Placed", |d| d.ready_replicas == 1).await;
    let p = d.placement.clone().expect("placement");
    assert!(p.pod.starts_with("m-"), "{p:?}");
    assert!(
        matches!(p.node.as_deref(), Some("kwok-small" | "kwok-large")),
        "{p:?}"
    );
    assert!(p.uid.is_some());
    let addr: SocketAddr = p.address.parse().expect("IP:port");
    assert_eq!(addr.port(), 8080, "the port named http");
    assert!(
        addr.ip().is_loopback() && addr.ip().to_string() != "127.0.0.1",
        "kwok hands out pod IPs from the test bed's loopback range: {addr}"
    );
    assert_eq!((d.replicas, d.ready_replicas), (1, 1));
    let m = message(&d.outcome);
    assert!(
        m.starts_with(&format!(
            "{} is ready on {} at {}",
            p.pod,
            p.node.unwrap(),
            p.address
        )) && m.contains("(1/1 replicas ready); clients use http://m.place-ok-"),
        "{m}"
    );
}

#[tokio::test]
async fn a_replica_bigger_than_every_node_is_unschedulable_in_the_schedulers_words() {
    let d = place("place-big", "100Gi", "Unschedulable", |_| true).await;
    let m = message(&d.outcome);
    assert!(
        // The real node (tainted) may be counted too: the two kwok nodes lack the memory.
        m.contains("cannot be scheduled: 0/") && m.contains("2 Insufficient memory"),
        "{m}"
    );
    assert!(m.ends_with("(a replica requests 100Gi of memory)"), "{m}");
    assert!(
        matches!(
            d.outcome,
            Outcome::Failed {
                recovery: modelserve::pipeline::Recovery::Heals(_),
                ..
            }
        ),
        "a node may be added: retried, not permanent"
    );
    assert_eq!(d.placement, None);
}

#[tokio::test]
async fn a_crash_looping_server_fails_with_its_last_exit() {
    require_fault_stages(&Testbed::get());
    let d = place("fault-crashloop", "1Gi", "CrashLoop", |_| true).await;
    let m = message(&d.outcome);
    assert!(
        m.contains("container llama-server of m-")
            && m.contains("keeps crashing: restarted")
            && m.contains("now in CrashLoopBackOff; last exit code 1 (Error): error loading model"),
        "{m}"
    );
    assert_eq!(d.ready_replicas, 0);
}

#[tokio::test]
async fn an_oom_killed_server_fails_naming_its_memory_limit() {
    require_fault_stages(&Testbed::get());
    let d = place("fault-oomkill", "2Gi", "OOMKilled", |_| true).await;
    let m = message(&d.outcome);
    assert!(
        m.contains("container llama-server of m-")
            && m.contains("was OOMKilled (exit code 137) at its memory limit of 2Gi"),
        "{m}"
    );
}

#[tokio::test]
async fn a_failing_pull_init_container_is_a_crash_loop_naming_it() {
    require_fault_stages(&Testbed::get());
    let d = place("fault-initcrash", "1Gi", "CrashLoop", |_| true).await;
    let m = message(&d.outcome);
    assert!(
        m.contains("init container pull of m-") && m.contains("last exit code 1 (Error)"),
        "{m}"
    );
}

// Through a ModelServe and the operator: the pipeline reaches Place and reports it.

struct Served {
    api: Api<ModelServe>,
    _op: Operator,
    _hub: FakeHub,
    _mirror: tempfile::TempDir,
}

/// A tiny model served with `extra` spec fields by an operator watching `ns`.
async fn serve(tb: &Testbed, ns: &str, name: &str, extra: serde_json::Value) -> Served {
    tb.install_crd();
    let hub = FakeHub::start().await;
    hub.add_repo(
        "acme/Tiny-GGUF",
        vec![HubFile::with_bytes(
            "tiny-Q4_K_M.gguf",
            Dense::tiny("llama").gguf(),
        )],
    );
    let (mirror_url, dir) = start_mirror(&hub.url).await;
    let op = Operator::start_with(
        tb,
        ns,
        &hub.url,
        &["--mirror-url", &mirror_url, "--place-grace", "2s"],
    );
    let api: Api<ModelServe> = Api::namespaced(tb.client().await, ns);
    let mut spec =
        serde_json::json!({"repo": "acme/Tiny-GGUF", "contextSize": 4096, "contextLength": 4096});
    spec.as_object_mut()
        .unwrap()
        .extend(extra.as_object().cloned().unwrap_or_default());
    let spec: ModelServeSpec = serde_json::from_value(spec).unwrap();
    api.create(&PostParams::default(), &ModelServe::new(name, spec))
        .await
        .unwrap();
    Served {
        api,
        _op: op,
        _hub: hub,
        _mirror: dir,
    }
}

/// Waits until the Placed condition has `status` and `reason`.
async fn placed_as(
    api: &Api<ModelServe>,
    name: &str,
    status: &str,
    reason: &str,
) -> ModelServeStatus {
    let found = eventually(Duration::from_secs(60), async || {
        let s = api.get(name).await.ok()?.status?;
        let c = s.conditions.iter().find(|c| c.type_ == "Placed")?;
        (c.status == status && c.reason == reason).then_some(s)
    })
    .await;
    match found {
        Some(s) => s,
        None => panic!(
            "{name}: Placed did not become {status}/{reason}: {:#?}",
            api.get(name).await.ok().and_then(|m| m.status)
        ),
    }
}

#[tokio::test]
async fn a_served_model_is_placed_and_status_names_the_replica_and_endpoint() {
    let tb = Testbed::get();
    let ns = tb.namespace("place-e2e");
    let s = serve(&tb, &ns.name, "tiny", serde_json::json!({})).await;
    let st = placed_as(&s.api, "tiny", "True", "Placed").await;
    let p = st.placement.clone().expect("status.placement");
    assert!(p.pod.starts_with("tiny-"), "{p:?}");
    assert!(p.address.ends_with(":8080"), "{p:?}");
    assert_eq!(
        st.endpoint.as_deref(),
        Some(format!("http://tiny.{}.svc:8080/v1", ns.name).as_str())
    );
    assert_eq!(st.selector.as_deref(), Some("modelserve.dev/model=tiny"));
    let (_, _, m) = condition(&st, "Placed");
    assert!(m.contains(&p.address), "{m}");
}

#[tokio::test]
async fn a_served_model_that_crash_loops_stops_at_place_with_the_reason() {
    let tb = Testbed::get();
    require_fault_stages(&tb);
    let ns = tb.namespace("fault-crashloop");
    let s = serve(&tb, &ns.name, "tiny", serde_json::json!({})).await;
    let st = placed_as(&s.api, "tiny", "False", "CrashLoop").await;
    assert_eq!(st.stage.as_deref(), Some("Place"));
    assert_eq!(st.placement, None);
    let (ready, reason, m) = condition(&st, "Ready");
    assert_eq!((ready.as_str(), reason.as_str()), ("False", "CrashLoop"));
    assert!(m.contains("container llama-server of tiny-"), "{m}");
}

#[tokio::test]
async fn a_served_model_killed_at_its_memory_limit_says_so_and_how_to_fix_it() {
    let tb = Testbed::get();
    require_fault_stages(&tb);
    let ns = tb.namespace("fault-oomkill");
    let s = serve(&tb, &ns.name, "tiny", serde_json::json!({})).await;
    let st = placed_as(&s.api, "tiny", "False", "OOMKilled").await;
    let memory = st
        .check
        .as_ref()
        .and_then(|c| c.memory.clone())
        .unwrap_or_default();
    let (_, _, m) = condition(&st, "Placed");
    assert!(
        m.contains("container llama-server of tiny-")
            && m.contains("was OOMKilled (exit code 137) at its memory limit of ")
            && m.ends_with("raise engine.resources memory or lower contextSize"),
        "{m} (Check estimated {memory})"
    );
}

#[tokio::test]
async fn a_served_model_no_node_has_room_for_is_unschedulable() {
    // Check passes (it compares memory, and a few MiB fit), but the user's CPU request is more
    // than any node has, so the scheduler refuses the pod. (Filling the nodes with other pods
    // would do the same, but the test bed's nodes are shared by tests running at once; a memory
    // request no node holds stops at Check already.)
    let tb = Testbed::get();
    let ns = tb.namespace("place-big");
    let s = serve(
        &tb,
        &ns.name,
        "tiny",
        serde_json::json!({"engine": {"resources": {"requests": {"cpu": "1000", "memory": "64Mi"}}}}),
    )
    .await;
    let st = placed_as(&s.api, "tiny", "False", "Unschedulable").await;
    assert_eq!(st.stage.as_deref(), Some("Place"));
    let (_, _, m) = condition(&st, "Placed");
    assert!(
        m.contains("cannot be scheduled: 0/")
            && m.contains("2 Insufficient cpu")
            && m.ends_with("(a replica requests 64Mi of memory)"),
        "{m}"
    );
}

#[tokio::test]
async fn a_pod_the_api_server_refuses_is_failed_create_in_its_words_within_a_minute() {
    // A quota on the namespace that the replica's memory limit exceeds: the ReplicaSet's create
    // is refused by the API server's admission, and no pod ever exists.
    let tb = Testbed::get();
    let ns = tb.namespace("place-quota");
    let quota = serde_json::json!({
        "apiVersion": "v1", "kind": "ResourceQuota",
        "metadata": {"name": "mem", "namespace": ns.name},
        "spec": {"hard": {"limits.memory": "100Mi"}},
    });
    let applied = tb.kubectl_stdin(&["apply", "-f", "-"], &quota.to_string());
    assert!(applied.status.success(), "{applied:?}");
    let s = serve(&tb, &ns.name, "tiny", serde_json::json!({})).await;
    let st = placed_as(&s.api, "tiny", "False", "FailedCreate").await;
    assert_eq!(st.stage.as_deref(), Some("Place"));
    let (_, _, m) = condition(&st, "Placed");
    assert!(
        m.starts_with("the API server refused the replica's pod (FailedCreate): pods \"tiny-")
            && m.contains("is forbidden: exceeded quota: mem, requested: limits.memory=")
            && m.contains("limited: limits.memory=100Mi"),
        "{m}"
    );
    // From the Deployment's creation (Cataloged) to the failure, by the conditions' own times.
    let at = |type_: &str| {
        st.conditions
            .iter()
            .find(|c| c.type_ == type_)
            .map(|c| c.last_transition_time.0.as_second())
            .unwrap()
    };
    let secs = at("Placed") - at("Cataloged");
    println!("FailedCreate {secs} s after Cataloged: {m}");
}

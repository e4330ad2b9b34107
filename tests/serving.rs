//! Catalog, Place and Smoke test on the test bed, end to end: the operator's Deployment is
//! scheduled by the real scheduler onto a kwok node, pod-runner plays its kubelet (a real
//! `modelserve pull` from the mirror, a real llama-server on the pod IP), and the operator's
//! smoke test reaches the replica at its pod IP as it would in production.

mod support;

use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use modelserve::api::{ModelServe, ModelServeStatus};
use support::fake_hub::FakeHub;
use support::pod_runner::PodRunner;
use support::{Namespace, Operator, Testbed, condition, eventually, start_mirror};

/// Everything one test needs running: registry, mirror, operator and pod-runner.
struct Bed<'a> {
    tb: &'a Testbed,
    ns: Namespace<'a>,
    api: Api<ModelServe>,
    _hub: FakeHub,
    _mirror: tempfile::TempDir,
    op: Operator,
    runner: PodRunner,
}

async fn bed<'a>(tb: &'a Testbed, prefix: &str) -> Bed<'a> {
    tb.install_crd();
    let ns = tb.namespace(prefix);
    let hub = FakeHub::with_tiny_llama().await;
    let (mirror_url, mirror) = start_mirror(&hub.url).await;
    let op = Operator::start_with(
        tb,
        &ns.name,
        &hub.url,
        &["--mirror-url", &mirror_url, "--place-grace", "20s"],
    );
    let runner = PodRunner::start(tb, &ns.name);
    let api = Api::namespaced(tb.client().await, &ns.name);
    Bed {
        tb,
        ns,
        api,
        _hub: hub,
        _mirror: mirror,
        op,
        runner,
    }
}

impl Bed<'_> {
    async fn create(&self, name: &str, spec: serde_json::Value) {
        let spec = serde_json::from_value(spec).unwrap();
        self.api
            .create(&PostParams::default(), &ModelServe::new(name, spec))
            .await
            .unwrap();
    }

    /// Waits until `type_` has `status`, then returns the whole status.
    async fn until(&self, name: &str, type_: &str, status: &str, secs: u64) -> ModelServeStatus {
        let got = eventually(Duration::from_secs(secs), async || {
            let s = self.api.get(name).await.ok()?.status?;
            let c = s.conditions.iter().find(|c| c.type_ == type_)?;
            (c.status == status).then_some(s)
        })
        .await;
        match got {
            Some(s) => s,
            None => panic!(
                "{type_} never became {status} on {name}: {:#?}\npod-runner log:\n{}",
                self.api.get(name).await.ok().and_then(|m| m.status),
                self.runner.log()
            ),
        }
    }

    /// `kubectl scale modelserve/NAME --replicas=N`, as a user scales it.
    fn scale(&self, name: &str, replicas: i32) {
        let scaled = self.tb.kubectl(&[
            "scale",
            &format!("modelserve/{name}"),
            &format!("--replicas={replicas}"),
            "-n",
            &self.ns.name,
        ]);
        assert!(scaled.status.success(), "{scaled:?}");
    }

    async fn pods(&self, name: &str) -> Vec<Pod> {
        let pods: Api<Pod> = Api::namespaced(self.tb.client().await, &self.ns.name);
        pods.list(&ListParams::default().labels(&format!("modelserve.dev/model={name}")))
            .await
            .unwrap()
            .items
    }
}

fn tiny(replicas: i32) -> serde_json::Value {
    serde_json::json!({
        "repo": "acme/TinyLlama-GGUF",
        "replicas": replicas,
        "contextSize": 2048,
        "contextLength": 1024,
        "smokeTest": {"prompt": "Say hello.", "maxTokens": 8},
    })
}

#[tokio::test]
async fn a_model_is_placed_and_answers_its_smoke_test_at_the_pod_ip() {
    let tb = Testbed::get();
    let b = bed(&tb, "serve").await;
    b.create("tiny", tiny(1)).await;
    let s = b.until("tiny", "Ready", "True", 240).await;
    for c in ["Cataloged", "Placed", "SmokeTested"] {
        assert_eq!(condition(&s, c).0, "True", "{c}: {:?}", condition(&s, c));
    }
    let place = s.placement.clone().expect("status.placement");
    assert!(
        place.address.starts_with("127.1.") && place.address.ends_with(":8080"),
        "the pod IP from the kwok range: {}",
        place.address
    );
    let smoke = s.smoke.clone().expect("status.smoke");
    assert!(
        smoke.completion_tokens.unwrap_or(0) > 0,
        "the model generated tokens: {smoke:?}"
    );
    let speed = smoke.tokens_per_second.expect("tokens/s");
    assert!(speed > 0.0);
    assert_eq!(s.ready_replicas, 1);
    assert_eq!(
        s.endpoint.as_deref(),
        Some(format!("http://tiny.{}.svc:8080/v1", b.ns.name).as_str())
    );

    // What a user sees.
    let table = b.tb.kubectl_ok(&["get", "modelserves", "-n", &b.ns.name]);
    let row = table.lines().find(|l| l.starts_with("tiny ")).unwrap();
    assert!(row.contains("1/1"), "READY 1/1 in {table}");
    assert!(
        row.contains(&format!("{speed}")),
        "TOK/S {speed} in {table}"
    );
    let wait = b.tb.kubectl(&[
        "wait",
        "--for=condition=Ready",
        "modelserve/tiny",
        "-n",
        &b.ns.name,
        "--timeout=10s",
    ]);
    assert!(wait.status.success(), "{wait:?}");
    // The timeline: one Event per stage transition.
    let described =
        b.tb.kubectl_ok(&["describe", "modelserve", "tiny", "-n", &b.ns.name]);
    let events = described.split("Events:").nth(1).unwrap_or_default();
    for reason in [
        "Resolved",
        "Checked",
        "Mirrored",
        "Cataloged",
        "Placed",
        "Answered",
        "AllStagesDone",
    ] {
        assert!(
            events
                .lines()
                .any(|l| l.split_whitespace().nth(1) == Some(reason)),
            "no {reason} Event in:\n{events}"
        );
    }
    // Ready is False until the end of a normal rollout, which is no cause for a Warning.
    assert!(
        !events
            .lines()
            .any(|l| l.split_whitespace().next() == Some("Warning")),
        "a Warning Event in a rollout that went well:\n{events}"
    );
    // The operator's metrics after a full run.
    let (_, metrics) = b.op.get("/metrics").await.expect("metrics answer");
    let value = |name: &str| -> f64 {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing from:\n{metrics}"))
    };
    for stage in [
        "Resolved",
        "Checked",
        "Mirrored",
        "Cataloged",
        "Placed",
        "SmokeTested",
    ] {
        assert!(
            value(&format!(
                "modelserve_stage_duration_seconds_count{{stage=\"{stage}\"}}"
            )) >= 1.0
        );
    }
    assert!(value("modelserve_smoke_tokens_per_second_sum") > 0.0);
    assert!(value("modelserve_reconciles_total{result=\"ok\"}") > 0.0);
    assert!(value("modelserve_models{stage=\"Ready\"}") >= 1.0);

    // Someone scales the Deployment by hand: the next reconcile puts it back, once.
    let deployments: Api<Deployment> = Api::namespaced(b.tb.client().await, &b.ns.name);
    deployments
        .patch(
            "tiny",
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"replicas": 3}})),
        )
        .await
        .unwrap();
    let back = eventually(Duration::from_secs(30), async || {
        let d = deployments.get("tiny").await.ok()?;
        (d.spec?.replicas == Some(1)).then_some(())
    })
    .await;
    assert!(
        back.is_some(),
        "the Deployment is scaled back to the spec's 1"
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let d = deployments.get("tiny").await.unwrap();
    assert_eq!(d.spec.unwrap().replicas, Some(1), "and stays there");

    // Deleting the ModelServe leaves nothing behind: the garbage collector takes its objects.
    b.api
        .delete("tiny", &DeleteParams::default())
        .await
        .unwrap();
    let client = b.tb.client().await;
    let gone = eventually(Duration::from_secs(60), async || {
        let d: Api<Deployment> = Api::namespaced(client.clone(), &b.ns.name);
        let sv: Api<Service> = Api::namespaced(client.clone(), &b.ns.name);
        let se: Api<Secret> = Api::namespaced(client.clone(), &b.ns.name);
        let none = d.get_opt("tiny").await.ok()?.is_none()
            && sv.get_opt("tiny").await.ok()?.is_none()
            && se.get_opt("tiny-engine-key").await.ok()?.is_none();
        none.then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "Deployment, Service and Secret are collected"
    );
}

#[tokio::test]
async fn zero_replicas_is_ready_on_demand_and_a_scale_up_places_and_smoke_tests() {
    let tb = Testbed::get();
    let b = bed(&tb, "ondemand").await;
    b.create("later", tiny(0)).await;
    let s = b.until("later", "Ready", "True", 120).await;
    assert_eq!(condition(&s, "Ready").1, "OnDemand");
    assert_eq!(condition(&s, "Cataloged").0, "True");
    assert!(b.pods("later").await.is_empty(), "no pod while on demand");

    b.scale("later", 1);
    let s = b.until("later", "SmokeTested", "True", 240).await;
    assert_eq!(condition(&s, "Placed").0, "True");
    assert!(s.smoke.is_some());
    let s = b.until("later", "Ready", "True", 30).await;
    assert_ne!(condition(&s, "Ready").1, "OnDemand");

    // Back to zero: on demand again, and no word of a replica that is gone.
    b.scale("later", 0);
    let s = b.until("later", "Placed", "Unknown", 60).await;
    assert_eq!(condition(&s, "Placed").1, "OnDemand");
    assert_eq!(condition(&s, "Ready").1, "OnDemand");
    assert!(s.placement.is_none(), "{:?}", s.placement);
    assert!(s.smoke.is_none(), "{:?}", s.smoke);
}

#[tokio::test]
async fn a_new_engine_key_rolls_the_replicas_and_the_new_one_answers_with_it() {
    let tb = Testbed::get();
    let b = bed(&tb, "newkey").await;
    b.create("keyed", tiny(1)).await;
    let s = b.until("keyed", "Ready", "True", 240).await;
    let first = s.placement.clone().expect("placed");

    // Someone replaces the key: llama-server reads its key file only at start, so the operator
    // rolls the replicas, and the new one answers with the new key and refuses the old.
    let secrets: Api<Secret> = Api::namespaced(b.tb.client().await, &b.ns.name);
    let mut secret = secrets.get("keyed-engine-key").await.unwrap();
    let old = String::from_utf8(secret.data.as_ref().unwrap()["key"].0.clone()).unwrap();
    let new = "a-key-someone-else-chose";
    secret
        .data
        .as_mut()
        .unwrap()
        .insert("key".into(), ByteString(new.as_bytes().to_vec()));
    secret.metadata.managed_fields = None;
    secrets
        .replace("keyed-engine-key", &PostParams::default(), &secret)
        .await
        .unwrap();
    let rolled = eventually(Duration::from_secs(240), async || {
        let s = b.api.get("keyed").await.ok()?.status?;
        let p = s.placement.clone()?;
        let smoke = s.smoke.clone()?;
        (p.pod != first.pod && smoke.pod.as_deref() == Some(p.pod.as_str())).then_some(s)
    })
    .await;
    let Some(s) = rolled else {
        panic!(
            "no new replica answered: {:#?}\n{}",
            b.api.get("keyed").await.ok().and_then(|m| m.status),
            b.runner.log()
        )
    };
    assert_eq!(condition(&s, "SmokeTested").0, "True");
    let address = s.placement.unwrap().address;
    let ask = async |key: &str| {
        reqwest::Client::builder()
            .no_proxy()
            .build()
            .unwrap()
            .post(format!("http://{address}/v1/chat/completions"))
            .bearer_auth(key)
            .json(&serde_json::json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}))
            .send()
            .await
            .map(|r| r.status().as_u16())
            .ok()
    };
    assert_eq!(ask(new).await, Some(200), "the new key is accepted");
    assert_eq!(ask(&old).await, Some(401), "the old key is refused");
}

//! The controller against the real control plane: conditions, Events, health and metrics.

mod support;

use std::time::Duration;

use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{ListParams, PostParams};
use modelserve::api::{ModelServe, ModelServeSpec};
use support::fake_hub::{FakeHub, HubFile};
use support::models::Dense;
use support::{Operator, Testbed, eventually};

#[tokio::test]
async fn a_new_modelserve_gets_its_conditions_and_events_within_five_seconds() {
    let tb = Testbed::get();
    tb.install_crd();
    let ns = tb.namespace("ctrl");
    let hub = FakeHub::start().await;
    let model = Dense::tiny("llama").gguf();
    hub.add_repo(
        "bartowski/Llama-3.2-1B-Instruct-GGUF",
        vec![HubFile::with_bytes(
            "Llama-3.2-1B-Instruct-Q4_K_M.gguf",
            model,
        )],
    );
    let op = Operator::start(&tb, &ns.name, &hub.url);
    let client = tb.client().await;
    let api: Api<ModelServe> = Api::namespaced(client.clone(), &ns.name);
    let ready = eventually(Duration::from_secs(20), async || {
        op.get("/readyz").await.filter(|(s, _)| *s == 200)
    })
    .await;
    assert!(
        ready.is_some(),
        "the controller's /readyz never answered 200"
    );

    let spec: ModelServeSpec =
        serde_json::from_value(serde_json::json!({"repo": "bartowski/Llama-3.2-1B-Instruct-GGUF"}))
            .unwrap();
    let created = api
        .create(&PostParams::default(), &ModelServe::new("qwen", spec))
        .await
        .unwrap();
    let generation = created.metadata.generation;

    let status = eventually(Duration::from_secs(5), async || {
        let ms = api.get("qwen").await.ok()?;
        let s = ms.status?;
        (s.observed_generation == generation && s.conditions.len() == 7).then_some(s)
    })
    .await
    .expect("within 5 s the ModelServe should have observedGeneration and seven conditions");

    let types: Vec<&str> = status.conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(
        types,
        [
            "Resolved",
            "Checked",
            "Mirrored",
            "Cataloged",
            "Placed",
            "SmokeTested",
            "Ready"
        ]
    );
    let resolved = &status.conditions[0];
    assert_eq!(
        (resolved.status.as_str(), resolved.reason.as_str()),
        ("True", "Resolved")
    );
    let checked = &status.conditions[1];
    assert_eq!(
        (checked.status.as_str(), checked.reason.as_str()),
        ("True", "Checked")
    );
    // This operator runs without a mirror, and says so.
    let mirrored = &status.conditions[2];
    assert_eq!(
        (mirrored.status.as_str(), mirrored.reason.as_str()),
        ("False", "MirrorNotConfigured")
    );
    assert_eq!(status.stage.as_deref(), Some("Mirror"));
    assert_eq!(
        status.conditions[6].status, "False",
        "Ready stays False until every stage is done"
    );
    assert_eq!(status.ready.as_deref(), Some("0/1"));

    let events: Api<Event> = Api::namespaced(client, &ns.name);
    let found = eventually(Duration::from_secs(5), async || {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("qwen")
                && e.reason.as_deref() == Some("Resolved")
        })
    })
    .await;
    assert!(
        found.is_some(),
        "an Event should record the Resolved condition's transition"
    );

    // Nothing changes on its own: the status is not rewritten (resourceVersion stays).
    let rv = api.get("qwen").await.unwrap().metadata.resource_version;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        api.get("qwen").await.unwrap().metadata.resource_version,
        rv,
        "an idle ModelServe must not be rewritten"
    );

    let (code, body) = op.get("/healthz").await.unwrap();
    assert_eq!((code, body.as_str()), (200, "ok"));
    let (code, metrics) = op.get("/metrics").await.unwrap();
    assert_eq!(code, 200);
    assert!(
        metrics.contains("modelserve_reconciles_total{result=\"ok\"}"),
        "{metrics}"
    );
    assert!(
        metrics.contains("modelserve_condition_transitions_total"),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_spec_change_is_observed_with_the_new_generation() {
    let tb = Testbed::get();
    tb.install_crd();
    let ns = tb.namespace("ctrlgen");
    let hub = FakeHub::start().await;
    hub.add_repo(
        "a/b",
        vec![HubFile::with_bytes("b-Q4_K_M.gguf", b"GGUF".to_vec())],
    );
    let _op = Operator::start(&tb, &ns.name, &hub.url);
    let api: Api<ModelServe> = Api::namespaced(tb.client().await, &ns.name);
    let spec: ModelServeSpec = serde_json::from_value(serde_json::json!({"repo": "a/b"})).unwrap();
    api.create(&PostParams::default(), &ModelServe::new("m", spec))
        .await
        .unwrap();
    let first = eventually(Duration::from_secs(20), async || {
        api.get("m").await.ok()?.status?.observed_generation
    })
    .await;
    assert_eq!(first, Some(1));
    tb.kubectl_ok(&["scale", "-n", &ns.name, "modelserve/m", "--replicas=2"]);
    let second = eventually(Duration::from_secs(10), async || {
        let s = api.get("m").await.ok()?.status?;
        (s.observed_generation == Some(2)).then_some(s)
    })
    .await
    .expect("the scaled spec is observed");
    assert!(
        second
            .conditions
            .iter()
            .all(|c| c.observed_generation == Some(2))
    );
    assert_eq!(second.ready.as_deref(), Some("0/2"));
}

//! The Resolve stage on the test bed, against the fake Hub.

mod support;

use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use modelserve::api::{ModelServe, ModelServeSpec, ModelServeStatus};
use support::fake_hub::{FakeHub, HubFile};
use support::{Operator, Testbed, condition, eventually};

async fn create(api: &Api<ModelServe>, name: &str, spec: serde_json::Value) {
    let spec: ModelServeSpec = serde_json::from_value(spec).unwrap();
    api.create(&PostParams::default(), &ModelServe::new(name, spec))
        .await
        .unwrap();
}

/// Waits until Resolved has `status` and returns the ModelServe's status.
async fn resolved_as(
    api: &Api<ModelServe>,
    name: &str,
    status: &str,
    within: Duration,
) -> ModelServeStatus {
    let found = eventually(within, async || {
        let s = api.get(name).await.ok()?.status?;
        let c = s.conditions.iter().find(|c| c.type_ == "Resolved")?;
        (c.status == status).then_some(s)
    })
    .await;
    match found {
        Some(s) => s,
        None => {
            let last = api.get(name).await.ok().and_then(|m| m.status);
            panic!("{name}: Resolved did not become {status} within {within:?}; status: {last:#?}")
        }
    }
}

fn tiny_repo() -> Vec<HubFile> {
    vec![
        HubFile::with_bytes(
            "tiny-Q4_K_M-00001-of-00002.gguf",
            b"GGUF shard one".to_vec(),
        ),
        HubFile::with_bytes(
            "tiny-Q4_K_M-00002-of-00002.gguf",
            b"GGUF shard two".to_vec(),
        ),
        HubFile::with_bytes("tiny-Q8_0.gguf", b"GGUF eight".to_vec()),
        HubFile::with_bytes("mmproj-tiny-f16.gguf", b"GGUF projector".to_vec()),
        HubFile::git("README.md", "# tiny\n"),
    ]
}

#[tokio::test]
async fn a_fake_hub_repo_resolves_within_five_seconds_and_stays_pinned() {
    let tb = Testbed::get();
    tb.install_crd();
    let ns = tb.namespace("resolve");
    let hub = FakeHub::start().await;
    let first = hub.add_repo("acme/Tiny-GGUF", tiny_repo());
    let _op = Operator::start(&tb, &ns.name, &hub.url);
    let api: Api<ModelServe> = Api::namespaced(tb.client().await, &ns.name);

    create(&api, "tiny", serde_json::json!({"repo": "acme/Tiny-GGUF"})).await;
    let s = resolved_as(&api, "tiny", "True", Duration::from_secs(5)).await;
    let r = s.resolved.clone().expect("status.resolved filled");
    assert_eq!(r.commit, first);
    assert_eq!(r.set, "tiny-Q4_K_M");
    assert_eq!(r.quant.as_deref(), Some("Q4_K_M"));
    assert_eq!(r.served_name, "tiny");
    assert_eq!(
        r.files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(),
        [
            "tiny-Q4_K_M-00001-of-00002.gguf",
            "tiny-Q4_K_M-00002-of-00002.gguf"
        ]
    );
    assert!(r.files.iter().all(|f| f.sha256.len() == 64 && f.size > 0));
    assert_eq!(r.total_bytes, 28);
    let (_, reason, message) = condition(&s, "Resolved");
    assert_eq!(reason, "Resolved");
    assert_eq!(
        message,
        format!("Q4_K_M, 28 B in 2 files, commit {}", &first[..7])
    );

    // The branch moves; a reconcile (any touch of the object) keeps the pinned commit.
    let moved = hub.move_branch("acme/Tiny-GGUF", "main", tiny_repo());
    let touch = serde_json::json!({"metadata": {"annotations": {"touched": "1"}}});
    api.patch("tiny", &PatchParams::default(), &Patch::Merge(&touch))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let s = api.get("tiny").await.unwrap().status.unwrap();
    assert_eq!(
        s.resolved.unwrap().commit,
        first,
        "a moved branch must not change a served model"
    );

    // Editing spec.quant resolves again, now at the moved commit.
    let quant = serde_json::json!({"spec": {"quant": "Q8_0"}});
    api.patch("tiny", &PatchParams::default(), &Patch::Merge(&quant))
        .await
        .unwrap();
    let s = eventually(Duration::from_secs(5), async || {
        let r = api.get("tiny").await.ok()?.status?.resolved?;
        (r.set == "tiny-Q8_0.gguf").then_some(r)
    })
    .await
    .expect("the new quant is resolved");
    assert_eq!(s.commit, moved);
    assert_eq!(s.files.len(), 1);
}

#[tokio::test]
async fn a_gated_repo_without_token_says_so_and_a_token_secret_unlocks_it() {
    let tb = Testbed::get();
    tb.install_crd();
    let ns = tb.namespace("gated");
    let hub = FakeHub::start().await;
    hub.add_repo("meta/Gated-GGUF", tiny_repo());
    hub.set_gated("meta/Gated-GGUF", "manual");
    hub.add_token("hf_approved_token", &["meta/Gated-GGUF"]);
    let _op = Operator::start(&tb, &ns.name, &hub.url);
    let client = tb.client().await;
    let api: Api<ModelServe> = Api::namespaced(client.clone(), &ns.name);

    create(
        &api,
        "gated",
        serde_json::json!({"repo": "meta/Gated-GGUF"}),
    )
    .await;
    let s = resolved_as(&api, "gated", "False", Duration::from_secs(5)).await;
    let (_, reason, message) = condition(&s, "Resolved");
    assert_eq!(reason, "GatedRepoNoToken");
    assert!(
        message.contains("meta/Gated-GGUF is gated") && message.contains("spec.tokenSecretRef"),
        "{message}"
    );
    let (ready, ready_reason, _) = condition(&s, "Ready");
    assert_eq!(
        (ready.as_str(), ready_reason.as_str()),
        ("False", "GatedRepoNoToken")
    );

    // The permanent failure is not retried in a loop.
    let before = hub.count("/revision/");
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        hub.count("/revision/"),
        before,
        "a permanent failure must wait for a spec change"
    );

    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "hf"}, "stringData": {"token": "hf_approved_token"}
    }))
    .unwrap();
    Api::<Secret>::namespaced(client, &ns.name)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let with_token = serde_json::json!({"spec": {"tokenSecretRef": {"name": "hf"}}});
    api.patch("gated", &PatchParams::default(), &Patch::Merge(&with_token))
        .await
        .unwrap();
    let s = resolved_as(&api, "gated", "True", Duration::from_secs(5)).await;
    assert_eq!(s.resolved.unwrap().set, "tiny-Q4_K_M");
}

#[tokio::test]
async fn failures_name_their_cause_and_transient_ones_recover() {
    let tb = Testbed::get();
    tb.install_crd();
    let ns = tb.namespace("rfail");
    let hub = FakeHub::start().await;
    hub.add_listing("ggml-org/gemma-3-1b-it-GGUF");
    hub.add_repo("acme/Tiny-GGUF", tiny_repo());
    let _op = Operator::start(&tb, &ns.name, &hub.url);
    let api: Api<ModelServe> = Api::namespaced(tb.client().await, &ns.name);

    create(
        &api,
        "noquant",
        serde_json::json!({"repo": "ggml-org/gemma-3-1b-it-GGUF", "quant": "Q5_K_XL"}),
    )
    .await;
    create(
        &api,
        "norepo",
        serde_json::json!({"repo": "nobody/Nothing-GGUF"}),
    )
    .await;
    create(
        &api,
        "missing-secret",
        serde_json::json!({"repo": "acme/Tiny-GGUF", "tokenSecretRef": {"name": "absent"}}),
    )
    .await;
    let s = resolved_as(&api, "noquant", "False", Duration::from_secs(5)).await;
    assert_eq!(
        condition(&s, "Resolved").2,
        "ggml-org/gemma-3-1b-it-GGUF has no file matching Q5_K_XL; it has: F16, Q4_K_M, Q8_0"
    );
    let s = resolved_as(&api, "norepo", "False", Duration::from_secs(5)).await;
    assert_eq!(condition(&s, "Resolved").1, "RepoNotFound");
    let s = resolved_as(&api, "missing-secret", "False", Duration::from_secs(5)).await;
    let (_, reason, message) = condition(&s, "Resolved");
    assert_eq!(reason, "TokenSecretMissing");
    assert!(
        message.contains("absent") && message.contains("does not exist"),
        "{message}"
    );

    // A registry that fails for a while: False with the cause, when it is tried again and the
    // attempt, then True.
    hub.fail("/api/models/acme/Tiny-GGUF/revision", 503, &[], 8);
    create(&api, "flaky", serde_json::json!({"repo": "acme/Tiny-GGUF"})).await;
    let s = resolved_as(&api, "flaky", "False", Duration::from_secs(10)).await;
    let (_, reason, message) = condition(&s, "Resolved");
    assert_eq!(reason, "RegistryUnavailable", "{message}");
    assert!(
        message.contains("HTTP 503")
            && message.contains("trying again in")
            && message.contains("(attempt 1)"),
        "{message}"
    );
    resolved_as(&api, "flaky", "True", Duration::from_secs(60)).await;
}

#[tokio::test]
async fn the_operators_default_token_secret_is_used_when_the_spec_names_none() {
    let tb = Testbed::get();
    tb.install_crd();
    let ns = tb.namespace("deftoken");
    let hub = FakeHub::start().await;
    hub.add_repo("meta/Gated-GGUF", tiny_repo());
    hub.set_gated("meta/Gated-GGUF", "auto");
    hub.add_token("hf_operator_token", &["meta/Gated-GGUF"]);
    let client = tb.client().await;
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "registry"}, "stringData": {"token": "hf_operator_token"}
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), &ns.name)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let default = format!("{}/registry", ns.name);
    let _op = Operator::start_with(
        &tb,
        &ns.name,
        &hub.url,
        &["--default-token-secret", &default],
    );
    let api: Api<ModelServe> = Api::namespaced(client, &ns.name);
    create(
        &api,
        "gated",
        serde_json::json!({"repo": "meta/Gated-GGUF"}),
    )
    .await;
    let s = resolved_as(&api, "gated", "True", Duration::from_secs(5)).await;
    assert_eq!(s.resolved.unwrap().set, "tiny-Q4_K_M");
}

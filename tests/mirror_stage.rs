//! The Mirror stage on the test bed: Resolved, Checked, then Mirrored with status.mirror filled.

mod support;

use std::time::Duration;

use kube::Api;
use kube::api::PostParams;
use modelserve::api::{ModelServe, ModelServeSpec};
use support::fake_hub::{FakeHub, HubFile};
use support::models::Dense;
use support::{Operator, Testbed, eventually, start_mirror};

#[tokio::test]
async fn a_model_is_mirrored_after_it_is_resolved_and_checked() {
    let tb = Testbed::get();
    tb.install_crd();
    let ns = tb.namespace("mirror");
    let hub = FakeHub::start().await;
    let mut bytes = Dense::tiny("llama").gguf();
    bytes.resize(bytes.len() + 3_000_000, 7); // some tensor data to move
    let commit = hub.add_repo(
        "acme/Tiny-GGUF",
        vec![HubFile::with_bytes("tiny-Q4_K_M.gguf", bytes.clone())],
    );
    let (mirror_url, dir) = start_mirror(&hub.url).await;
    let _op = Operator::start_with(&tb, &ns.name, &hub.url, &["--mirror-url", &mirror_url]);
    let api: Api<ModelServe> = Api::namespaced(tb.client().await, &ns.name);
    let spec: ModelServeSpec = serde_json::from_value(
        serde_json::json!({"repo": "acme/Tiny-GGUF", "contextSize": 4096, "contextLength": 4096}),
    )
    .unwrap();
    api.create(&PostParams::default(), &ModelServe::new("tiny", spec))
        .await
        .unwrap();

    let s = eventually(Duration::from_secs(20), async || {
        let s = api.get("tiny").await.ok()?.status?;
        let c = s.conditions.iter().find(|c| c.type_ == "Mirrored")?;
        (c.status == "True").then_some(s)
    })
    .await;
    let Some(s) = s else {
        panic!(
            "not mirrored: {:#?}",
            api.get("tiny").await.ok().and_then(|m| m.status)
        )
    };
    let types: Vec<(&str, &str)> = s
        .conditions
        .iter()
        .take(4)
        .map(|c| (c.type_.as_str(), c.status.as_str()))
        .collect();
    assert_eq!(
        types,
        [
            ("Resolved", "True"),
            ("Checked", "True"),
            ("Mirrored", "True"),
            ("Cataloged", "Unknown")
        ]
    );
    let m = s.mirror.clone().unwrap();
    assert_eq!(
        (m.percent, m.bytes_done, m.bytes_total),
        (100, bytes.len() as i64, bytes.len() as i64)
    );
    assert_eq!(m.files[0].state, "present");
    assert_eq!(s.progress.as_deref(), Some("100%"));
    let msg = &s.conditions[2].message;
    assert!(
        msg.ends_with("MiB on the mirror, checksums match the registry"),
        "{msg}"
    );
    let snap = dir.path().join(format!(
        "models--acme--Tiny-GGUF/snapshots/{commit}/tiny-Q4_K_M.gguf"
    ));
    assert_eq!(std::fs::read(snap).unwrap(), bytes);
}

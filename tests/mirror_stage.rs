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
            ("Cataloged", "True")
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

#[tokio::test]
async fn an_operator_killed_while_mirroring_is_replaced_without_a_second_download() {
    let tb = Testbed::get();
    tb.install_crd();
    let ns = tb.namespace("opkill");
    let hub = FakeHub::start().await;
    let mut bytes = Dense::tiny("llama").gguf();
    bytes.resize(bytes.len() + (24 << 20), 3);
    hub.add_repo(
        "acme/Slow-GGUF",
        vec![HubFile::with_bytes("slow-Q4_K_M.gguf", bytes.clone())],
    );
    hub.throttle(2 << 20); // about 12 s for the file
    let (mirror_url, _dir) = start_mirror(&hub.url).await;
    let first = Operator::start_with(&tb, &ns.name, &hub.url, &["--mirror-url", &mirror_url]);
    let api: Api<ModelServe> = Api::namespaced(tb.client().await, &ns.name);
    let spec: ModelServeSpec = serde_json::from_value(
        serde_json::json!({"repo": "acme/Slow-GGUF", "contextSize": 4096, "contextLength": 4096}),
    )
    .unwrap();
    api.create(&PostParams::default(), &ModelServe::new("slow", spec))
        .await
        .unwrap();

    // The PROGRESS column moves while the mirror works.
    let mut seen = std::collections::BTreeSet::new();
    let moving = eventually(Duration::from_secs(30), async || {
        let table = tb.kubectl_ok(&[
            "get",
            "modelserves",
            "-n",
            &ns.name,
            "--no-headers",
            "-o",
            "custom-columns=P:.status.progress",
        ]);
        let p = table.trim().to_string();
        if p.ends_with('%') && p != "100%" {
            seen.insert(p);
        }
        (seen.len() >= 2).then_some(())
    })
    .await;
    assert!(moving.is_some(), "PROGRESS showed {seen:?}");
    drop(first); // SIGKILL, mid-download

    let _second = Operator::start_with(&tb, &ns.name, &hub.url, &["--mirror-url", &mirror_url]);
    let done = eventually(Duration::from_secs(60), async || {
        let s = api.get("slow").await.ok()?.status?;
        let c = s.conditions.iter().find(|c| c.type_ == "Mirrored")?;
        (c.status == "True").then_some(s)
    })
    .await
    .expect("the new operator sees the mirror finish");
    assert_eq!(done.mirror.unwrap().bytes_done, bytes.len() as i64);
    // The Check stage read the header (ranges from byte 0 up to a few MiB); the mirror
    // downloaded the file (one connection: it is smaller than two segments) once.
    let whole = format!("bytes=0-{}", bytes.len() - 1);
    let downloads = hub
        .cdn_log()
        .into_iter()
        .filter(|(_, r)| r.as_deref() == Some(whole.as_str()))
        .count();
    assert_eq!(
        downloads,
        1,
        "the download did not start again: {:?}",
        hub.cdn_log()
    );
}

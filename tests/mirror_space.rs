//! The mirror's disk against the test bed: a set too large for the volume fails as
//! InsufficientCapacity before a byte is fetched; a deleted ModelServe's own blobs go after the
//! grace period while a blob another ModelServe shares stays; and a small volume over its high
//! watermark loses its unreferenced blobs early, oldest first, never a referenced one.

mod support;

use std::path::Path;
use std::time::Duration;

use kube::Api;
use kube::api::{DeleteParams, PostParams};
use modelserve::api::ModelServe;
use modelserve::mirror::space::SpaceArgs;
use support::fake_hub::{FakeHub, HubFile};
use support::models::{Dense, tiny_llama_gguf};
use support::{Operator, Testbed, condition, eventually, file_refs, start_mirror_space};

fn space(grace: u64, capacity: Option<u64>) -> SpaceArgs {
    SpaceArgs {
        grace: Duration::from_secs(grace),
        capacity,
        request_pin: Duration::from_secs(1),
        ..SpaceArgs::default()
    }
}

/// The verified blobs in a mirror's store.
fn blobs(store: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(store.join(".by-sha256"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

async fn metric(mirror: &str, name: &str) -> f64 {
    let text = reqwest::get(format!("{mirror}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

fn spec(repo: &str) -> modelserve::api::ModelServeSpec {
    serde_json::from_value(serde_json::json!({
        "repo": repo,
        "replicas": 0,
        "contextSize": 2048,
        "contextLength": 1024,
    }))
    .unwrap()
}

/// Waits until `name` has condition `type_` with `status`; returns (status, reason, message).
async fn until(
    api: &Api<ModelServe>,
    name: &str,
    type_: &str,
    status: &str,
) -> (String, String, String) {
    let got = eventually(Duration::from_secs(90), async || {
        let s = api.get(name).await.ok()?.status?;
        let c = condition(&s, type_);
        (c.0 == status).then_some(c)
    })
    .await;
    match got {
        Some(c) => c,
        None => panic!(
            "{type_} of {name} never became {status}: {:#?}",
            api.get(name).await.ok().and_then(|m| m.status)
        ),
    }
}

#[tokio::test]
async fn an_oversized_set_fails_as_insufficient_capacity_before_a_byte_is_fetched() {
    let tb = Testbed::get();
    tb.install_crd();
    let ns = tb.namespace("no-room");
    let hub = FakeHub::with_tiny_llama().await;
    let size = hub.file_size("acme/TinyLlama-GGUF", "tinyllama-Q4_K_M.gguf");
    // A volume of half the model.
    let (mirror, store) = start_mirror_space(&hub.url, space(3600, Some(size / 2))).await;
    let _op = Operator::start_with(&tb, &ns.name, &hub.url, &["--mirror-url", &mirror]);
    let api: Api<ModelServe> = Api::namespaced(tb.client().await, &ns.name);
    api.create(
        &PostParams::default(),
        &ModelServe::new("big", spec("acme/TinyLlama-GGUF")),
    )
    .await
    .unwrap();
    let (_, reason, message) = until(&api, "big", "Mirrored", "False").await;
    eprintln!("{reason}: {message}");
    assert_eq!(reason, "InsufficientCapacity", "{message}");
    assert!(
        message.contains("the set needs") && message.contains("free less"),
        "names both figures: {message}"
    );
    assert_eq!(
        metric(&mirror, "modelserve_mirror_downloaded_bytes_total").await,
        0.0,
        "not a byte fetched"
    );
    let partials = std::fs::read_dir(store.path().join(".incomplete"))
        .unwrap()
        .count();
    assert_eq!(partials, 0, "no partial file");
    assert!(blobs(store.path()).is_empty());
}

#[tokio::test]
async fn a_deleted_models_own_blobs_go_after_the_grace_and_a_shared_one_stays() {
    let tb = Testbed::get();
    tb.install_crd();
    let ns = tb.namespace("gc");
    let hub = FakeHub::start().await;
    let own = tiny_llama_gguf();
    let shared = Dense::tiny("llama").gguf();
    hub.add_repo(
        "acme/Own-GGUF",
        vec![HubFile::with_bytes("own-Q4_K_M.gguf", own)],
    );
    hub.add_repo(
        "acme/Shared-GGUF",
        vec![HubFile::with_bytes("shared-Q4_K_M.gguf", shared.clone())],
    );
    hub.add_repo(
        "acme/Also-GGUF",
        vec![HubFile::with_bytes("also-Q4_K_M.gguf", shared)],
    );
    let grace = 3;
    let (mirror, store) = start_mirror_space(&hub.url, space(grace, None)).await;
    let _op = Operator::start_with(
        &tb,
        &ns.name,
        &hub.url,
        &["--mirror-url", &mirror, "--mirror-live-set-interval", "1s"],
    );
    let api: Api<ModelServe> = Api::namespaced(tb.client().await, &ns.name);
    for (name, repo) in [
        ("own", "acme/Own-GGUF"),
        ("shared", "acme/Shared-GGUF"),
        ("also", "acme/Also-GGUF"),
    ] {
        api.create(&PostParams::default(), &ModelServe::new(name, spec(repo)))
            .await
            .unwrap();
    }
    for name in ["own", "shared", "also"] {
        until(&api, name, "Mirrored", "True").await;
    }
    let before = blobs(store.path());
    assert_eq!(before.len(), 2, "one blob per content: {before:?}");
    let sha_of = |name: &str| {
        let api = api.clone();
        let name = name.to_string();
        async move {
            api.get(&name)
                .await
                .unwrap()
                .status
                .unwrap()
                .resolved
                .unwrap()
                .files[0]
                .sha256
                .clone()
        }
    };
    let (own_sha, shared_sha) = (sha_of("own").await, sha_of("shared").await);

    // Two models go; one of them shared its content with a third, which stays.
    for name in ["own", "shared"] {
        api.delete(name, &DeleteParams::default()).await.unwrap();
    }
    let deleted = std::time::Instant::now();
    let gone = eventually(Duration::from_secs(grace + 30), async || {
        (!blobs(store.path()).contains(&own_sha)).then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "the deleted model's own blob was kept: {:?}",
        blobs(store.path())
    );
    let after = deleted.elapsed();
    eprintln!(
        "the unique blob went {:.1}s after its ModelServe was deleted (grace {grace}s)",
        after.as_secs_f64()
    );
    assert!(
        after >= Duration::from_secs(grace),
        "before the grace had passed"
    );
    // Well past another grace period, the shared blob is still there and still served.
    tokio::time::sleep(Duration::from_secs(grace * 2)).await;
    assert_eq!(blobs(store.path()), [shared_sha]);
    let also = api.get("also").await.unwrap().status.unwrap();
    assert_eq!(condition(&also, "Mirrored").0, "True");
    assert!(
        !store.path().join("models--acme--Own-GGUF").exists(),
        "its snapshot went too"
    );
    assert!(store.path().join("models--acme--Also-GGUF").exists());
    assert_eq!(
        metric(
            &mirror,
            "modelserve_mirror_evictions_total{reason=\"grace\"}"
        )
        .await,
        1.0
    );
}

#[tokio::test]
async fn a_small_volume_over_its_high_watermark_loses_its_oldest_unreferenced_blobs_early() {
    let hub = FakeHub::start().await;
    let files: Vec<HubFile> = (0..4u8)
        .map(|i| HubFile::with_bytes(&format!("m{i}.gguf"), vec![i; 1 << 20]))
        .collect();
    let commit = hub.add_repo("acme/Four", files.clone());
    // 5 MiB the store may use: four files are 80%, over a high watermark of 70%; down to 40%.
    let args = SpaceArgs {
        high_watermark: 70,
        low_watermark: 40,
        ..space(3600, Some(5 << 20))
    };
    let (mirror, store) = start_mirror_space(&hub.url, args).await;
    let http = reqwest::Client::new();
    let fetch = |some: &[HubFile]| {
        let body = serde_json::json!({"files": file_refs("acme/Four", &commit, some)});
        let (http, url) = (http.clone(), format!("{mirror}/v1/fetch"));
        async move { http.post(url).json(&body).send().await.unwrap() }
    };
    // Oldest first: m0 and m1, then m2 and m3.
    for pair in files.chunks(2) {
        support::mirror_present(&mirror, "acme/Four", &commit, pair).await;
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    assert_eq!(blobs(store.path()).len(), 4);
    // The operator's word: only m3 is referenced. Nothing is past its grace (an hour).
    let live = serde_json::json!({"sha256": [files[3].sha256]});
    let r = http
        .put(format!("{mirror}/v1/live"))
        .json(&live)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let evicted = eventually(Duration::from_secs(20), async || {
        (blobs(store.path()).len() == 2).then_some(())
    })
    .await;
    assert!(
        evicted.is_some(),
        "no early eviction: {:?}",
        blobs(store.path())
    );
    let mut left = blobs(store.path());
    let mut expect = vec![files[2].sha256.clone(), files[3].sha256.clone()];
    left.sort();
    expect.sort();
    assert_eq!(
        left, expect,
        "the two oldest unreferenced went; 2 MiB of 5 is 40%"
    );
    assert_eq!(
        metric(
            &mirror,
            "modelserve_mirror_evictions_total{reason=\"watermark\"}"
        )
        .await,
        2.0
    );
    assert_eq!(
        metric(&mirror, "modelserve_mirror_store_bytes").await,
        (2 << 20) as f64
    );
    assert_eq!(
        metric(&mirror, "modelserve_mirror_reclaimable_bytes").await,
        (1 << 20) as f64
    );

    // Asked again, a file that went is fetched again (not answered from memory).
    let asked = |hub: &FakeHub| {
        hub.cdn_log()
            .iter()
            .filter(|(path, _)| path.contains(&files[0].sha256))
            .count()
    };
    let before = asked(&hub);
    let r = fetch(&files[..1]).await;
    assert_eq!(r.status(), 202);
    support::mirror_present(&mirror, "acme/Four", &commit, &files[..1]).await;
    assert!(blobs(store.path()).contains(&files[0].sha256));
    assert!(asked(&hub) > before, "fetched again from the registry");
    // A set larger than the whole volume is refused, naming the figures, and nothing goes.
    let huge: Vec<HubFile> = vec![HubFile::listed("huge.gguf", 64 << 20)];
    let body = serde_json::json!({"files": file_refs("acme/Four", &commit, &huge)});
    let r = http
        .post(format!("{mirror}/v1/fetch"))
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 507);
    let why: serde_json::Value = r.json().await.unwrap();
    assert_eq!(why["reason"], "InsufficientCapacity");
    assert_eq!(why["neededBytes"], 64 << 20);
    assert!(why["error"].as_str().unwrap().contains("64.0 MiB"), "{why}");
    assert!(
        blobs(store.path()).contains(&files[3].sha256),
        "the referenced blob stays"
    );
}

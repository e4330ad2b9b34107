//! The Check stage on the test bed: header read over HTTP ranges from the fake Hub, build
//! support, memory estimate and node fit, all before any download.

mod support;

use std::time::Duration;

use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use modelserve::api::{ModelServe, ModelServeSpec, ModelServeStatus};
use support::fake_hub::{FakeHub, HubFile};
use support::models::Dense;
use support::{Operator, Testbed, condition, eventually};

async fn checked_as(api: &Api<ModelServe>, name: &str, status: &str) -> ModelServeStatus {
    let found = eventually(Duration::from_secs(90), async || {
        let s = api.get(name).await.ok()?.status?;
        let c = s.conditions.iter().find(|c| c.type_ == "Checked")?;
        (c.status == status).then_some(s)
    })
    .await;
    match found {
        Some(s) => s,
        None => panic!(
            "{name}: Checked did not become {status}: {:#?}",
            api.get(name).await.ok().and_then(|m| m.status)
        ),
    }
}

async fn create(api: &Api<ModelServe>, name: &str, repo: &str) {
    let spec: ModelServeSpec = serde_json::from_value(
        serde_json::json!({"repo": repo, "contextSize": 8192, "contextLength": 4096}),
    )
    .unwrap();
    api.create(&PostParams::default(), &ModelServe::new(name, spec))
        .await
        .unwrap();
}

/// A namespace whose operator reads acme/Small-GGUF (a tiny llama) from a fake Hub.
struct SmallModel<'a> {
    api: Api<ModelServe>,
    _op: Operator,
    _hub: FakeHub,
    _ns: support::Namespace<'a>,
}

async fn small_model<'a>(tb: &'a Testbed, prefix: &str) -> SmallModel<'a> {
    tb.install_crd();
    let ns = tb.namespace(prefix);
    let hub = FakeHub::start().await;
    hub.add_repo(
        "acme/Small-GGUF",
        vec![HubFile::with_bytes(
            "small-Q4_K_M.gguf",
            Dense::tiny("llama").gguf(),
        )],
    );
    let op = Operator::start(tb, &ns.name, &hub.url);
    let api: Api<ModelServe> = Api::namespaced(tb.client().await, &ns.name);
    SmallModel {
        api,
        _op: op,
        _hub: hub,
        _ns: ns,
    }
}

#[tokio::test]
async fn a_model_that_fits_is_checked_with_its_build_and_memory() {
    let tb = Testbed::get();
    let bed = small_model(&tb, "check").await;
    let api = &bed.api;
    create(api, "small", "acme/Small-GGUF").await;
    let s = checked_as(api, "small", "True").await;
    let c = s.check.clone().unwrap();
    assert_eq!(c.architecture.as_deref(), Some("llama"));
    assert_eq!(c.engine_build.as_deref(), Some("b10587"));
    assert_eq!(c.parallel, Some(2));
    assert_eq!(
        c.kv_bytes_per_token,
        Some(2 * 2 * 128 * 2),
        "2 layers x (K+V) x 2 kv heads x 64 dims x f16"
    );
    assert!(c.memory_bytes.unwrap() > 0);
    let (_, _, message) = condition(&s, "Checked");
    assert!(
        message.contains("llama loads from b") && message.contains("fits on 2 of 2 node(s)"),
        "{message}"
    );
    assert_eq!(s.stage.as_deref(), Some("Mirror"));
}

#[tokio::test]
async fn a_model_bigger_than_every_node_stops_before_mirroring() {
    let tb = Testbed::get();
    tb.install_crd();
    let ns = tb.namespace("nofit");
    let hub = FakeHub::start().await;
    // About 77 GiB of F16 weights: more than kwok-large's 64Gi.
    let big = Dense {
        arch: "llama",
        layers: 40,
        embd: 8192,
        heads: 64,
        kv_heads: 8,
        ff: 28672,
        vocab: 128_256,
        weight_type: 1,
        vocab_size_only: true,
        ..Dense::default()
    };
    hub.add_repo(
        "acme/Huge-GGUF",
        vec![HubFile::with_bytes("huge-Q4_K_M.gguf", big.gguf())],
    );
    let _op = Operator::start(&tb, &ns.name, &hub.url);
    let api: Api<ModelServe> = Api::namespaced(tb.client().await, &ns.name);
    create(&api, "huge", "acme/Huge-GGUF").await;
    let s = checked_as(&api, "huge", "False").await;
    let (_, reason, message) = condition(&s, "Checked");
    assert_eq!(reason, "NoNodeFits");
    assert!(
        message.contains("the largest, kwok-large, has 64.0 GiB allocatable"),
        "{message}"
    );
    assert!(message.contains(" short)"), "{message}");
    assert_eq!(
        condition(&s, "Mirrored").1,
        "WaitingForEarlierStage",
        "nothing is mirrored"
    );
    assert_eq!(s.stage.as_deref(), Some("Check"));
    assert!(
        hub.requests()
            .iter()
            .all(|p| !p.contains("/resolve/") || p.contains("huge-Q4_K_M.gguf"))
    );
}

#[tokio::test]
async fn the_memory_a_user_requests_is_what_must_fit_on_a_node() {
    let tb = Testbed::get();
    let bed = small_model(&tb, "asked").await;
    let api = &bed.api;
    // A tiny model, but its pods would ask for more than the largest node has.
    let spec: ModelServeSpec = serde_json::from_value(serde_json::json!({
        "repo": "acme/Small-GGUF",
        "engine": {"resources": {"requests": {"memory": "100Gi"}}}
    }))
    .unwrap();
    api.create(&PostParams::default(), &ModelServe::new("asks", spec))
        .await
        .unwrap();
    let s = checked_as(api, "asks", "False").await;
    let (_, reason, message) = condition(&s, "Checked");
    assert_eq!(reason, "NoNodeFits");
    assert!(
        message.contains("a replica needs 100.0 GiB")
            && message.contains("engine.resources asks for 100.0 GiB per replica"),
        "{message}"
    );

    // Asking for less than the estimate fits, and says what that risks.
    api.patch(
        "asks",
        &PatchParams::default(),
        &Patch::Merge(
            serde_json::json!({"spec": {"engine": {"resources": {"requests": {"memory": "1Mi"}}}}}),
        ),
    )
    .await
    .unwrap();
    let s = checked_as(api, "asks", "True").await;
    let (_, _, message) = condition(&s, "Checked");
    assert!(
        message.contains("engine.resources asks for 1.0 MiB per replica")
            && message.contains("below the estimate: llama-server may be killed for memory"),
        "{message}"
    );
}

#[tokio::test]
async fn an_architecture_newer_than_the_nodes_build_names_both_builds() {
    let tb = Testbed::get();
    tb.install_crd();
    let ns = tb.namespace("newarch");
    let hub = FakeHub::start().await;
    hub.add_repo(
        "google/Gemma4-GGUF",
        vec![HubFile::with_bytes(
            "gemma4-Q4_K_M.gguf",
            Dense::tiny("gemma4").gguf(),
        )],
    );
    let _op = Operator::start_with(
        &tb,
        &ns.name,
        &hub.url,
        &["--engine-image", "ghcr.io/ggml-org/llama.cpp:server-b6500"],
    );
    let api: Api<ModelServe> = Api::namespaced(tb.client().await, &ns.name);
    create(&api, "g4", "google/Gemma4-GGUF").await;
    let s = checked_as(&api, "g4", "False").await;
    let (_, reason, message) = condition(&s, "Checked");
    assert_eq!(reason, "UnsupportedArchitecture");
    assert_eq!(
        message,
        "architecture gemma4 needs llama.cpp b8637 or newer; the nodes run b6500"
    );
}

#[tokio::test]
async fn html_or_truncated_bytes_are_invalid_gguf_with_the_cause() {
    let tb = Testbed::get();
    tb.install_crd();
    let ns = tb.namespace("badgguf");
    let hub = FakeHub::start().await;
    let html = b"<!DOCTYPE html><html><body>Sign in to continue</body></html>".to_vec();
    hub.add_repo(
        "acme/Html-GGUF",
        vec![HubFile::with_bytes("m-Q4_K_M.gguf", html)],
    );
    let whole = Dense::tiny("llama").gguf();
    hub.add_repo(
        "acme/Cut-GGUF",
        vec![HubFile::with_bytes(
            "m-Q4_K_M.gguf",
            whole[..whole.len() / 2].to_vec(),
        )],
    );
    let _op = Operator::start(&tb, &ns.name, &hub.url);
    let api: Api<ModelServe> = Api::namespaced(tb.client().await, &ns.name);
    create(&api, "html", "acme/Html-GGUF").await;
    create(&api, "cut", "acme/Cut-GGUF").await;
    let s = checked_as(&api, "html", "False").await;
    let (_, reason, message) = condition(&s, "Checked");
    assert_eq!(reason, "InvalidGGUF");
    assert_eq!(
        message,
        "m-Q4_K_M.gguf: not a GGUF file: the server sent an HTML page instead of the file's bytes"
    );
    let s = checked_as(&api, "cut", "False").await;
    let (_, reason, message) = condition(&s, "Checked");
    assert_eq!(reason, "InvalidGGUF");
    assert!(
        message.starts_with("m-Q4_K_M.gguf: the file ends at byte"),
        "{message}"
    );
}

/// A Q4_K model: the nodes carry no CPU feature labels, so Check counts the largest CPU repack
/// the engine can make (the test bed's engine is built for AVX2: every Q4_K matmul weight with
/// rows a multiple of 8, token_embd aside), says so in the basis, and the memory includes it.
#[tokio::test]
async fn a_quantized_model_counts_the_cpu_repack_and_the_basis_names_every_part() {
    let tb = Testbed::get();
    tb.install_crd();
    let ns = tb.namespace("repack");
    let hub = FakeHub::start().await;
    let model = Dense {
        weight_type: 12, // Q4_K
        ..Dense::tiny("llama")
    };
    hub.add_repo(
        "acme/Quant-GGUF",
        vec![HubFile::with_bytes("quant-Q4_K_M.gguf", model.gguf())],
    );
    let op = Operator::start(&tb, &ns.name, &hub.url);
    let api: Api<ModelServe> = Api::namespaced(tb.client().await, &ns.name);
    create(&api, "quant", "acme/Quant-GGUF").await;
    let s = checked_as(&api, "quant", "True").await;
    let c = s.check.clone().unwrap();
    let basis = c.basis.unwrap_or_default();
    // 2 layers x (q, o: 256x256; k, v: 256x128; gate, up, down: 256x512) + output 256x512, at
    // 144 bytes per 256 weights.
    let per_layer = (2 * 256 * 256 + 2 * 256 * 128 + 3 * 256 * 512) / 256 * 144;
    let repacked = 2 * per_layer + 256 * 512 / 256 * 144;
    let kib = repacked as f64 / 1024.0;
    assert!(
        basis.contains(&format!("CPU repack {kib:.1} KiB (15 tensors, x86 AVX2; the largest of none|avx2, as the nodes' CPU features are not known)")),
        "{basis}"
    );
    // The threads llama-server starts on the largest node it may land on (kwok-large, 32
    // CPUs), with 2 slots.
    let engine = format!(
        " + engine {}",
        modelserve::units::human_bytes(modelserve::gguf::memory::engine::fixed(32, 2))
    );
    for part in [
        "weights ",
        " + KV ",
        " + compute ",
        " + output ",
        " + vocabulary ",
        "(512 tokens, 0 merges)",
        " + samplers ",
        " + matmul work ",
        " + graph ",
        &engine,
    ] {
        assert!(basis.contains(part), "{part:?} missing from {basis}");
    }
    let request = c.request.as_deref().unwrap_or_default();
    assert!(
        request.contains(" cpu=none|avx2") && request.contains(" cpus=32"),
        "{request:?}"
    );
    let (_, _, message) = condition(&s, "Checked");
    assert!(message.contains("CPU repack"), "{message}");
    drop(op);
}

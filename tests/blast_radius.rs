//! One bad model never harms another. ModelServes whose repositories hold non-ASCII names, whose
//! headers announce absurd counts, whose registry answers malformed JSON or never answers, and
//! a gated one, are all created before a good one: the good one reaches Ready in about the time
//! it takes alone, the operator keeps its process and answers /healthz, and each bad one fails
//! only itself with a condition that names its cause.

mod support;

use std::time::{Duration, Instant};

use kube::Api;
use kube::api::PostParams;
use modelserve::api::{ModelServe, ModelServeStatus};
use support::fake_hub::{FakeHub, HubFile};
use support::models::tiny_llama_gguf;
use support::{Operator, Testbed, eventually, start_mirror};

/// `gguf` with the u32 value of `key` set to `value` (the key must hold a u32).
fn with_u32(gguf: &[u8], key: &str, value: u32) -> Vec<u8> {
    let mut out = gguf.to_vec();
    let mut needle = (key.len() as u64).to_le_bytes().to_vec();
    needle.extend_from_slice(key.as_bytes());
    let at = out
        .windows(needle.len())
        .position(|w| w == needle)
        .unwrap_or_else(|| panic!("{key} is not in the header"));
    let ty = at + needle.len();
    assert_eq!(out[ty..ty + 4], 4u32.to_le_bytes(), "{key} is a u32");
    out[ty + 4..ty + 8].copy_from_slice(&value.to_le_bytes());
    out
}

fn spec(repo: &str) -> serde_json::Value {
    serde_json::json!({
        "repo": repo, "replicas": 0, "contextSize": 2048, "contextLength": 1024,
    })
}

async fn create(api: &Api<ModelServe>, name: &str, spec: serde_json::Value) {
    api.create(
        &PostParams::default(),
        &ModelServe::new(name, serde_json::from_value(spec).unwrap()),
    )
    .await
    .unwrap();
}

fn cond(s: &ModelServeStatus, type_: &str) -> Option<(String, String, String)> {
    s.conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone(), c.message.clone()))
}

/// Time from now until `name` is Ready, or None after `limit`.
async fn time_to_ready(api: &Api<ModelServe>, name: &str, limit: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    eventually(limit, async || {
        let s = api.get(name).await.ok()?.status?;
        (cond(&s, "Ready")?.0 == "True").then(|| t0.elapsed())
    })
    .await
}

#[tokio::test]
async fn bad_models_fail_only_themselves_while_a_good_one_reaches_ready() {
    let tb = Testbed::get();
    tb.install_crd();
    let hub = FakeHub::start().await;
    let tiny = tiny_llama_gguf();
    hub.add_repo(
        "acme/Tiny-GGUF",
        vec![HubFile::with_bytes("tiny-Q4_K_M.gguf", tiny.clone())],
    );
    hub.add_repo(
        "acme/Unicode-GGUF",
        vec![
            HubFile::with_bytes("xéééééééé-Q4_K_M.gguf", tiny.clone()),
            HubFile::with_bytes("Модели/модель-Q8_0-00001-of-00002.gguf", tiny.clone()),
            HubFile::with_bytes("Модели/модель-Q8_0-00002-of-00002.gguf", tiny.clone()),
            HubFile::git("README.md", "# 模型 🦙"),
        ],
    );
    hub.add_repo(
        "acme/Layers-GGUF",
        vec![HubFile::with_bytes(
            "m-Q4_K_M.gguf",
            with_u32(&tiny, "llama.block_count", 0xFFFF_FFF0),
        )],
    );
    hub.add_repo(
        "acme/Heads-GGUF",
        vec![HubFile::with_bytes(
            "m-Q4_K_M.gguf",
            with_u32(&tiny, "llama.embedding_length", 0xFFFF_FFF0),
        )],
    );
    hub.add_repo(
        "acme/Gated-GGUF",
        vec![HubFile::with_bytes("g-Q4_K_M.gguf", tiny.clone())],
    );
    hub.set_gated("acme/Gated-GGUF", "manual");
    let (mirror_url, _mirror) = start_mirror(&hub.url).await;
    let client = tb.client().await;

    // The good model alone, for the time it takes.
    let alone_ns = tb.namespace("blast-alone");
    let _alone_op = Operator::start_with(
        &tb,
        &alone_ns.name,
        &hub.url,
        &["--mirror-url", &mirror_url],
    );
    let alone: Api<ModelServe> = Api::namespaced(client.clone(), &alone_ns.name);
    create(&alone, "good", spec("acme/Tiny-GGUF")).await;
    let alone_took = time_to_ready(&alone, "good", Duration::from_secs(120))
        .await
        .expect("the good model alone reaches Ready");

    // The same after six bad ones, in a namespace of its own with its own operator.
    let ns = tb.namespace("blast");
    let mut op = Operator::start_with(&tb, &ns.name, &hub.url, &["--mirror-url", &mirror_url]);
    let pid = op.pid();
    let api: Api<ModelServe> = Api::namespaced(client.clone(), &ns.name);
    let bad = [
        ("unicode", "acme/Unicode-GGUF"),
        ("layers", "acme/Layers-GGUF"),
        ("heads", "acme/Heads-GGUF"),
        ("malformed", "faults/malformed-json"),
        ("silent", "faults/never-answers"),
        ("gated", "acme/Gated-GGUF"),
    ];
    for (name, repo) in bad {
        create(&api, name, spec(repo)).await;
    }
    create(&api, "good", spec("acme/Tiny-GGUF")).await;
    let with_bad = time_to_ready(&api, "good", Duration::from_secs(120))
        .await
        .expect("the good model reaches Ready beside the bad ones");
    println!(
        "good model to Ready: alone {:.1} s, after six bad ones {:.1} s",
        alone_took.as_secs_f64(),
        with_bad.as_secs_f64()
    );
    assert!(
        with_bad <= alone_took * 3 + Duration::from_secs(10),
        "the bad ones held the good one up: {with_bad:?} against {alone_took:?} alone"
    );

    // Every bad one fails itself, saying why; the non-ASCII one is simply resolved.
    let want: [(&str, &str, &str, &[&str]); 6] = [
        ("unicode", "Resolved", "True", &["Q4_K_M"]),
        ("layers", "Checked", "False", &["block_count", "4294967280"]),
        (
            "heads",
            "Checked",
            "False",
            &["embedding_length", "4294967280"],
        ),
        ("malformed", "Resolved", "False", &["JSON"]),
        ("silent", "Resolved", "False", &["answer"]),
        ("gated", "Resolved", "False", &["gated"]),
    ];
    let mut healthz = Vec::new();
    for (name, type_, status, words) in want {
        let found = eventually(Duration::from_secs(240), async || {
            healthz.push(op.get("/healthz").await.map(|(code, _)| code));
            let s = api.get(name).await.ok()?.status?;
            let c = cond(&s, type_)?;
            (c.0 == status).then_some(c)
        })
        .await;
        let Some((_, reason, message)) = found else {
            panic!(
                "{name}: {type_} never became {status}: {:#?}",
                api.get(name).await.ok().and_then(|m| m.status)
            )
        };
        println!("{name}: {type_} {status} {reason}: {message}");
        for w in words {
            assert!(message.contains(w), "{name}: {reason}: {message} lacks {w}");
        }
        if name == "layers" || name == "heads" {
            assert_eq!(reason, "InvalidHeader", "{name}: {message}");
        }
        if name == "unicode" {
            let s = api.get(name).await.unwrap().status.unwrap();
            let files: Vec<_> = s
                .resolved
                .unwrap()
                .files
                .into_iter()
                .map(|f| f.path)
                .collect();
            assert_eq!(files, ["xéééééééé-Q4_K_M.gguf"]);
        }
    }
    assert_eq!(op.exited(), None, "the operator keeps running");
    assert_eq!(op.pid(), pid, "the operator keeps its process");
    assert!(
        !healthz.is_empty() && healthz.iter().all(|c| *c == Some(200)),
        "/healthz answered every time: {healthz:?}"
    );
    let good = api.get("good").await.unwrap().status.unwrap();
    assert_eq!(cond(&good, "Ready").unwrap().0, "True");
}

//! The gateway on the test bed, end to end: the operator catalogs a model, pod-runner plays the
//! kubelet (a real `modelserve pull` and a real llama-server on the pod IP), and clients speak
//! OpenAI's API to `modelserve gateway`, which routes by model name, loads an on-demand model
//! from 0 replicas on its first request and unloads it when idle.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::events::v1::Event;
use kube::Api;
use kube::api::{ListParams, PostParams};
use modelserve::api::ModelServe;
use support::fake_hub::FakeHub;
use support::pod_runner::PodRunner;
use support::{GatewayProcess, Namespace, Operator, Testbed, condition, eventually, start_mirror};

/// A key with no limits, one limited to another namespace, and one limited to a model name.
const KEY: &str = "sk-gateway-test-all-0123456789";
const ELSEWHERE: &str = "sk-gateway-test-elsewhere-0123";
const ONLY_OTHER: &str = "sk-gateway-test-only-other-012";

struct Bed<'a> {
    tb: &'a Testbed,
    ns: Namespace<'a>,
    api: Api<ModelServe>,
    _hub: FakeHub,
    _mirror: tempfile::TempDir,
    _op: Operator,
    runner: PodRunner,
    gw: GatewayProcess,
    http: reqwest::Client,
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
        &["--mirror-url", &mirror_url, "--place-grace", "15s"],
    );
    let runner = PodRunner::start(tb, &ns.name);
    for (name, key, limits) in [
        ("all", KEY, vec![]),
        (
            "elsewhere",
            ELSEWHERE,
            vec!["--from-literal=namespaces=elsewhere"],
        ),
        (
            "only-other",
            ONLY_OTHER,
            vec!["--from-literal=models=other"],
        ),
    ] {
        let literal = format!("--from-literal=key={key}");
        let mut args = vec![
            "create", "secret", "generic", name, "-n", &ns.name, &literal,
        ];
        args.extend(limits);
        tb.kubectl_ok(&args);
        tb.kubectl_ok(&[
            "label",
            "secret",
            name,
            "-n",
            &ns.name,
            "modelserve.dev/gateway-key=true",
        ]);
    }
    let gw = GatewayProcess::start(
        tb,
        &ns.name,
        &["--activation-timeout", "150s", "--idle-check", "500ms"],
    );
    let api = Api::namespaced(tb.client().await, &ns.name);
    Bed {
        tb,
        ns,
        api,
        _hub: hub,
        _mirror: mirror,
        _op: op,
        runner,
        gw,
        http: reqwest::Client::new(),
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

    async fn until_ready(&self, name: &str, reason: &str) {
        let got = eventually(Duration::from_secs(240), async || {
            let s = self.api.get(name).await.ok()?.status?;
            let c = s.conditions.iter().find(|c| c.type_ == "Ready")?;
            (c.status == "True" && c.reason == reason).then_some(())
        })
        .await;
        assert!(
            got.is_some(),
            "{name} never became Ready ({reason}): {:#?}\npod-runner:\n{}",
            self.api.get(name).await.ok().and_then(|m| m.status),
            self.runner.log()
        );
    }

    fn chat(&self, model: &str, key: &str, extra: serde_json::Value) -> reqwest::RequestBuilder {
        let mut body = serde_json::json!({
            "model": model,
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 4,
        });
        if let (Some(b), Some(e)) = (body.as_object_mut(), extra.as_object()) {
            b.extend(e.clone());
        }
        self.http
            .post(format!("{}/v1/chat/completions", self.gw.url))
            .bearer_auth(key)
            .timeout(Duration::from_secs(300))
            .json(&body)
    }

    /// The gateway's Events on `name` with `reason`.
    async fn events(&self, name: &str, reason: &str) -> Vec<Event> {
        let events: Api<Event> = Api::namespaced(self.tb.client().await, &self.ns.name);
        events
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
            })
            .collect()
    }

    async fn replicas(&self, name: &str) -> i32 {
        self.api.get(name).await.unwrap().spec.replicas
    }
}

fn on_demand(idle_after: &str) -> serde_json::Value {
    serde_json::json!({
        "repo": "acme/TinyLlama-GGUF",
        "servedName": "tiny",
        "aliases": ["tiny-chat"],
        "replicas": 0,
        "onDemand": {"idleAfter": idle_after},
        "contextSize": 2048,
        "contextLength": 1024,
        "smokeTest": {"prompt": "Say hello.", "maxTokens": 4},
    })
}

#[tokio::test]
async fn an_on_demand_model_is_loaded_by_its_first_requests_once_and_unloaded_when_idle() {
    let tb = Testbed::get();
    let b = bed(&tb, "gw-demand").await;
    b.create("tiny", on_demand("8s")).await;
    b.until_ready("tiny", "OnDemand").await;
    assert_eq!(b.replicas("tiny").await, 0);
    let s = b.api.get("tiny").await.unwrap().status.unwrap();
    assert!(
        condition(&s, "Ready")
            .2
            .contains("the gateway loads the model"),
        "{:?}",
        condition(&s, "Ready")
    );

    // 50 requests at once, while the model is at 0: one activation, all answered by the engine.
    let t0 = Instant::now();
    let answers = futures::future::join_all((0..50).map(|i| {
        let name = if i % 2 == 0 { "tiny" } else { "tiny-chat" };
        let req = b.chat(name, KEY, serde_json::json!({}));
        async move {
            let r = req.send().await.unwrap();
            let status = r.status().as_u16();
            let body: serde_json::Value = r.json().await.unwrap_or_default();
            (status, body, t0.elapsed())
        }
    }))
    .await;
    for (status, body, _) in &answers {
        assert_eq!(*status, 200, "{body}");
        assert!(
            body["choices"][0]["message"]["content"].is_string(),
            "the engine's reply: {body}"
        );
        assert!(
            body["usage"]["completion_tokens"].as_u64().unwrap_or(0) > 0,
            "{body}"
        );
    }
    let slowest = answers.iter().map(|a| a.2).max().unwrap();
    println!(
        "gateway: 50 concurrent requests during one activation: all 200, the first reply {:?}, the last after {slowest:?}",
        answers[0].1["choices"][0]["message"]["content"]
    );
    assert_eq!(b.replicas("tiny").await, 1, "scaled to 1 by the gateway");
    let activated = b.events("tiny", "Activated").await;
    assert_eq!(activated.len(), 1, "exactly one scale-up: {activated:#?}");
    assert_eq!(
        b.gw.metric(
            "modelserve_gateway_activations_total",
            &["model=\"tiny\"", "result=\"ready\""]
        )
        .await,
        1.0
    );
    assert_eq!(
        b.gw.metric(
            "modelserve_gateway_requests_total",
            &["model=\"tiny\"", "code=\"200\""]
        )
        .await,
        50.0
    );
    // When it was last asked for is in status and in `kubectl get`.
    let s = b.api.get("tiny").await.unwrap().status.unwrap();
    let demand = s.demand.expect("status.demand");
    assert!(demand.last_request_at.is_some() && demand.activated_at.is_some());
    let table = tb.kubectl_ok(&["get", "modelserves", "-n", &b.ns.name]);
    assert!(table.contains("ASKED"), "{table}");
    assert!(
        !table.lines().nth(1).unwrap_or("").contains("<none>"),
        "{table}"
    );

    // 8 s without a request: back to 0, with an Event, Ready OnDemand again.
    let idle_from = Instant::now();
    let down = eventually(Duration::from_secs(60), async || {
        (b.replicas("tiny").await == 0).then_some(())
    })
    .await;
    assert!(down.is_some(), "scaled back to 0:\n{}", b.gw.log());
    println!(
        "gateway: scaled back to 0 {:?} after the last request (idleAfter 8s)",
        idle_from.elapsed()
    );
    let down = b.events("tiny", "ScaledToZero").await;
    assert_eq!(down.len(), 1, "{down:#?}");
    assert!(
        down[0]
            .note
            .as_deref()
            .unwrap_or("")
            .contains("idleAfter 8s"),
        "{down:#?}"
    );
    b.until_ready("tiny", "OnDemand").await;
}

/// The count of tokens the replica generated, from its /metrics.
async fn predicted(http: &reqwest::Client, addr: &str, key: &str) -> (f64, f64) {
    let text = http
        .get(format!("http://{addr}/metrics"))
        .bearer_auth(key)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let value = |name: &str| {
        text.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or(0.0)
    };
    (
        value("llamacpp:tokens_predicted_total"),
        value("llamacpp:requests_processing"),
    )
}

#[tokio::test]
async fn a_stream_passes_through_as_it_comes_and_a_client_that_hangs_up_stops_the_engine() {
    let tb = Testbed::get();
    let b = bed(&tb, "gw-stream").await;
    let mut spec = on_demand("1h");
    spec["replicas"] = 1.into();
    spec["contextSize"] = 16384.into();
    spec["contextLength"] = 16384.into();
    b.create("tiny", spec).await;
    b.until_ready("tiny", "AllStagesDone").await;

    // `modelserve ask` through the gateway: the reply, then the engine's speed.
    let ask = |key: &str| {
        std::process::Command::new(support::modelserve_bin())
            .args(["ask", "tiny", "Say hello.", "--max-tokens", "8"])
            .args(["--gateway", &b.gw.url, "--key", key])
            .output()
            .unwrap()
    };
    let out = ask(KEY);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    println!("gateway: modelserve ask: {stdout:?} {}", stderr.trim());
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stderr.contains("tokens/s (the engine's figure)"),
        "{stderr}"
    );
    let out = ask("sk-not-a-key-of-the-gateway");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("the gateway answered 401") && stderr.contains("--key"),
        "{stderr}"
    );

    let t0 = Instant::now();
    let mut r = b
        .chat(
            "tiny",
            KEY,
            serde_json::json!({"stream": true, "max_tokens": 512, "ignore_eos": true}),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert!(
        r.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let mut chunks = Vec::new();
    while let Some(c) = r.chunk().await.unwrap() {
        chunks.push((t0.elapsed(), c));
    }
    let first = chunks.first().expect("a chunk").0;
    let last = chunks.last().unwrap().0;
    let text: String = chunks
        .iter()
        .map(|(_, c)| String::from_utf8_lossy(c).into_owned())
        .collect();
    println!(
        "gateway: stream of {} chunks: the first at {first:?}, the last at {last:?}",
        chunks.len()
    );
    assert!(text.starts_with("data: "), "{text:.200}");
    assert!(
        text.trim_end().ends_with("data: [DONE]"),
        "{:?}",
        &text[text.len().saturating_sub(200)..]
    );
    assert!(chunks.len() > 16, "the tokens came in many chunks");
    assert!(
        first < last,
        "the first chunk reached the client before the completion ended"
    );

    // A client that hangs up after the first chunk: the replica stops generating.
    let s = b.api.get("tiny").await.unwrap().status.unwrap();
    let addr = s.placement.expect("status.placement").address;
    let secret: Api<k8s_openapi::api::core::v1::Secret> =
        Api::namespaced(tb.client().await, &b.ns.name);
    let key = secret.get("tiny-engine-key").await.unwrap().data.unwrap()["key"].clone();
    let key = String::from_utf8(key.0).unwrap();
    let (before, _) = predicted(&b.http, &addr, &key).await;
    let max = 15000.0;
    let mut r = b
        .chat(
            "tiny",
            KEY,
            serde_json::json!({"stream": true, "max_tokens": max as u64, "ignore_eos": true}),
        )
        .send()
        .await
        .unwrap();
    assert!(r.chunk().await.unwrap().is_some());
    drop(r);
    let idle = eventually(Duration::from_secs(120), async || {
        let (n, busy) = predicted(&b.http, &addr, &key).await;
        (busy == 0.0).then_some(n)
    })
    .await
    .expect("the replica went idle");
    let generated = idle - before;
    println!(
        "gateway: a client hung up after the first chunk: the replica generated {generated} of the {max} tokens asked for"
    );
    assert!(
        generated < max / 2.0,
        "the hang-up cancelled the replica's work: {generated} tokens"
    );
}

#[tokio::test]
async fn the_gateway_refuses_with_reasons_a_client_can_act_on() {
    let tb = Testbed::get();
    let b = bed(&tb, "gw-refuse").await;
    b.create("tiny", on_demand("1h")).await;
    // On demand, but no node has 1000 CPUs: the scheduler refuses its pod.
    let mut big = on_demand("1h");
    big["servedName"] = "big".into();
    big["aliases"] = serde_json::json!([]);
    big["engine"] =
        serde_json::json!({"resources": {"requests": {"cpu": "1000", "memory": "64Mi"}}});
    b.create("big", big).await;
    b.until_ready("tiny", "OnDemand").await;
    b.until_ready("big", "OnDemand").await;

    let json =
        async |r: reqwest::Response| -> (u16, serde_json::Value, reqwest::header::HeaderMap) {
            let status = r.status().as_u16();
            let headers = r.headers().clone();
            (status, r.json().await.unwrap_or_default(), headers)
        };
    // An unknown model: 404 in OpenAI's shape, listing the names the key can use.
    let (status, body, _) = json(
        b.chat("llama-9000", KEY, serde_json::json!({}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 404, "{body}");
    assert_eq!(body["error"]["code"], "model_not_found");
    let m = body["error"]["message"].as_str().unwrap();
    assert!(m.contains("big, tiny"), "{m}");
    println!("gateway: unknown model: 404 {m}");
    // No key, a wrong key: 401.
    for key in ["", "sk-not-a-key-of-the-gateway"] {
        let (status, body, headers) = json(
            b.chat("tiny", key, serde_json::json!({}))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(status, 401, "{body}");
        assert!(headers.contains_key("www-authenticate"));
        println!("gateway: key {key:?}: 401 {}", body["error"]["message"]);
    }
    // A key for another namespace, a key for another model: 403.
    for key in [ELSEWHERE, ONLY_OTHER] {
        let (status, body, _) = json(
            b.chat("tiny", key, serde_json::json!({}))
                .send()
                .await
                .unwrap(),
        )
        .await;
        assert_eq!(status, 403, "{body}");
        println!("gateway: a limited key: 403 {}", body["error"]["message"]);
    }
    // /v1/models shows a limited key only what it may use.
    let listed: serde_json::Value = b
        .http
        .get(format!("{}/v1/models", b.gw.url))
        .bearer_auth(KEY)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let ids: Vec<&str> = listed["data"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["id"].as_str())
        .collect();
    assert_eq!(ids.len(), 3, "{listed}");
    for id in ["tiny", "tiny-chat", "big"] {
        assert!(ids.contains(&id), "{listed}");
    }

    // A model that cannot be placed: 503 in the scheduler's words, with Retry-After.
    let t0 = Instant::now();
    let (status, body, headers) = json(
        b.chat("big", KEY, serde_json::json!({}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    let m = body["error"]["message"].as_str().unwrap_or_default();
    println!(
        "gateway: unplaceable model after {:?}: {status} {m}",
        t0.elapsed()
    );
    assert_eq!(status, 503, "{body}");
    assert!(headers.contains_key("retry-after"));
    assert!(m.contains("Insufficient cpu"), "{m}");
    assert!(m.contains("Placed is False (Unschedulable)"), "{m}");
    assert_eq!(
        b.gw.metric(
            "modelserve_gateway_activations_total",
            &["model=\"big\"", "result=\"failed\""]
        )
        .await,
        1.0
    );
    // A model at 0 without onDemand is not the gateway's to load.
    let mut parked = on_demand("1h");
    parked.as_object_mut().unwrap().remove("onDemand");
    parked["servedName"] = "parked".into();
    parked["aliases"] = serde_json::json!([]);
    b.create("parked", parked).await;
    b.until_ready("parked", "OnDemand").await;
    let (status, body, _) = json(
        b.chat("parked", KEY, serde_json::json!({}))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(status, 503, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not on demand"),
        "{body}"
    );
    assert_eq!(b.replicas("parked").await, 0);
}

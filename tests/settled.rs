//! Settled stages stay settled, drift is repaired, and an idle model costs no request.
//!
//! - While a model serves, its mirror is killed for a minute, its token Secret rotated and
//!   briefly missing, and it is scaled to two: the scale-up is applied at once, the serving
//!   replica keeps answering, Ready never turns False and no Warning is published; the second
//!   replica serves once the mirror is back.
//! - A deleted Service or Secret and a hand-edited Deployment come back within seconds.
//! - An idle Ready model, looked at every few seconds, costs no request to the API server; a
//!   change of its Deployment's status costs at most one.

mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Event, Pod, Secret, Service};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use modelserve::api::{ModelServe, ModelServeStatus};
use support::fake_hub::FakeHub;
use support::pod_runner::PodRunner;
use support::{MirrorProcess, Operator, Testbed, eventually};

fn ready(s: &ModelServeStatus) -> Option<(String, String)> {
    s.conditions
        .iter()
        .find(|c| c.type_ == "Ready")
        .map(|c| (c.status.clone(), c.reason.clone()))
}

async fn until_ready(api: &Api<ModelServe>, name: &str, secs: u64) -> ModelServeStatus {
    let got = eventually(Duration::from_secs(secs), async || {
        let s = api.get(name).await.ok()?.status?;
        (ready(&s)?.0 == "True").then_some(s)
    })
    .await;
    match got {
        Some(s) => s,
        None => panic!(
            "{name} never became Ready: {:#?}",
            api.get(name).await.ok().and_then(|m| m.status)
        ),
    }
}

fn tiny(replicas: i32, smoke: bool) -> serde_json::Value {
    serde_json::json!({
        "repo": "acme/TinyLlama-GGUF",
        "replicas": replicas,
        "contextSize": 2048,
        "contextLength": 1024,
        "tokenSecretRef": {"name": "hf-token"},
        "smokeTest": {"enabled": smoke, "prompt": "Say hello.", "maxTokens": 8},
    })
}

fn token_secret(value: &str) -> Secret {
    Secret {
        metadata: kube::api::ObjectMeta {
            name: Some("hf-token".into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "token".to_string(),
            ByteString(value.as_bytes().to_vec()),
        )])),
        ..Default::default()
    }
}

async fn chat(address: &str, key: &str) -> Option<u16> {
    let r = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(60))
        .build()
        .ok()?
        .post(format!("http://{address}/v1/chat/completions"))
        .bearer_auth(key)
        .json(
            &serde_json::json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
        )
        .send()
        .await
        .ok()?;
    Some(r.status().as_u16())
}

async fn health(ip: &str) -> bool {
    let Ok(c) = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()
    else {
        return false;
    };
    c.get(format!("http://{ip}:8080/health"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}

#[tokio::test]
async fn a_serving_model_rides_out_a_mirror_outage_a_token_rotation_and_a_scale_up() {
    let tb = Testbed::get();
    tb.install_crd();
    let ns = tb.namespace("settled");
    let hub = FakeHub::with_tiny_llama().await;
    hub.add_token("hf_first", &["acme/TinyLlama-GGUF"]);
    hub.add_token("hf_second", &["acme/TinyLlama-GGUF"]);
    let client = tb.client().await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    secrets
        .create(&PostParams::default(), &token_secret("hf_first"))
        .await
        .unwrap();
    let mut mirror = MirrorProcess::start(&hub.url);
    let op = Operator::start_with(
        &tb,
        &ns.name,
        &hub.url,
        &["--mirror-url", &mirror.url, "--place-grace", "20s"],
    );
    let runner = PodRunner::start(&tb, &ns.name);
    let api: Api<ModelServe> = Api::namespaced(client.clone(), &ns.name);
    api.create(
        &PostParams::default(),
        &ModelServe::new("tiny", serde_json::from_value(tiny(1, true)).unwrap()),
    )
    .await
    .unwrap();
    let s = until_ready(&api, "tiny", 300).await;
    let serving = s.placement.clone().expect("placed");
    let key = String::from_utf8(
        secrets.get("tiny-engine-key").await.unwrap().data.unwrap()["key"]
            .0
            .clone(),
    )
    .unwrap();
    assert_eq!(
        chat(&serving.address, &key).await,
        Some(200),
        "serving before"
    );

    // Every status the operator writes from here on, and the Events of the namespace.
    let seen: Arc<Mutex<Vec<(Duration, String, String)>>> = Arc::default();
    let t0 = Instant::now();
    let recorder = {
        let seen = seen.clone();
        let api = api.clone();
        tokio::spawn(async move {
            let cfg = watcher::Config::default().fields("metadata.name=tiny");
            let mut stream = watcher(api, cfg).applied_objects().boxed();
            while let Some(Ok(ms)) = stream.next().await {
                if let Some((status, reason)) = ms.status.as_ref().and_then(ready) {
                    seen.lock().unwrap().push((t0.elapsed(), status, reason));
                }
            }
        })
    };

    mirror.kill();
    secrets
        .delete("hf-token", &DeleteParams::default())
        .await
        .unwrap();
    let scaled = tb.kubectl(&["scale", "modelserve/tiny", "--replicas=2", "-n", &ns.name]);
    assert!(scaled.status.success(), "{scaled:?}");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let applied = eventually(Duration::from_secs(15), async || {
        let d = deployments.get("tiny").await.ok()?;
        (d.spec?.replicas == Some(2)).then(|| t0.elapsed())
    })
    .await
    .expect("the Deployment is scaled to 2 while the mirror is down");
    println!(
        "scale-up applied {:.1} s after the mirror went down",
        applied.as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    secrets
        .create(&PostParams::default(), &token_secret("hf_second"))
        .await
        .unwrap();

    // A minute without the mirror: the first replica answers, the second cannot pull yet.
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let second_ip = eventually(Duration::from_secs(30), async || {
        let list = pods
            .list(&ListParams::default().labels("modelserve.dev/model=tiny"))
            .await
            .ok()?;
        list.items
            .into_iter()
            .filter(|p| p.metadata.name.as_deref() != Some(serving.pod.as_str()))
            .find_map(|p| p.status?.pod_ip)
    })
    .await
    .expect("the second replica has a pod IP");
    let mut answers = Vec::new();
    while t0.elapsed() < Duration::from_secs(60) {
        answers.push(chat(&serving.address, &key).await);
        assert!(
            !health(&second_ip).await,
            "the second replica cannot have pulled yet"
        );
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    assert!(
        answers.iter().all(|a| *a == Some(200)),
        "the serving replica kept answering: {answers:?}"
    );

    mirror.restart();
    let second = eventually(Duration::from_secs(180), async || {
        health(&second_ip).await.then(|| t0.elapsed())
    })
    .await;
    assert!(
        second.is_some(),
        "the second replica did not serve after the mirror came back\n{}",
        runner.log()
    );
    println!(
        "mirror back at 60 s; second replica serving at {:.1} s",
        second.unwrap_or_default().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_secs(5)).await;
    recorder.abort();

    let seen = seen.lock().unwrap().clone();
    println!("Ready as written: {seen:?}");
    assert!(
        seen.iter().all(|(_, status, _)| status == "True"),
        "Ready went False: {seen:?}"
    );
    let events: Api<Event> = Api::namespaced(client.clone(), &ns.name);
    let warnings: Vec<String> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        // The test bed's endpoint controller warns that kwok's loopback pod IPs cannot be
        // endpoints; only what is said about the ModelServe counts here.
        .filter(|e| e.involved_object.kind.as_deref() == Some("ModelServe"))
        .filter(|e| e.type_.as_deref() == Some("Warning"))
        .map(|e| format!("{:?}: {:?}", e.reason, e.message))
        .collect();
    assert!(warnings.is_empty(), "Warning Events: {warnings:?}");
    let s = api.get("tiny").await.unwrap().status.unwrap();
    assert_eq!(
        s.placement.map(|p| p.pod),
        Some(serving.pod),
        "the placed replica stayed"
    );
    drop(op);
}

#[tokio::test]
async fn a_deleted_service_or_secret_and_a_hand_edited_deployment_come_back() {
    let tb = Testbed::get();
    tb.install_crd();
    let ns = tb.namespace("drift");
    let hub = FakeHub::with_tiny_llama().await;
    hub.add_token("hf_first", &["acme/TinyLlama-GGUF"]);
    hub.add_token("hf_second", &["acme/TinyLlama-GGUF"]);
    let client = tb.client().await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    secrets
        .create(&PostParams::default(), &token_secret("hf_first"))
        .await
        .unwrap();
    let mirror = MirrorProcess::start(&hub.url);
    let _op = Operator::start_with(&tb, &ns.name, &hub.url, &["--mirror-url", &mirror.url]);
    let api: Api<ModelServe> = Api::namespaced(client.clone(), &ns.name);
    api.create(
        &PostParams::default(),
        &ModelServe::new("tiny", serde_json::from_value(tiny(0, false)).unwrap()),
    )
    .await
    .unwrap();
    until_ready(&api, "tiny", 120).await;
    let services: Api<Service> = Api::namespaced(client.clone(), &ns.name);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let old_key = secrets.get("tiny-engine-key").await.unwrap().metadata.uid;

    let t = Instant::now();
    services
        .delete("tiny", &DeleteParams::default())
        .await
        .unwrap();
    secrets
        .delete("tiny-engine-key", &DeleteParams::default())
        .await
        .unwrap();
    let back = eventually(Duration::from_secs(10), async || {
        let s = services.get_opt("tiny").await.ok()??;
        let k = secrets.get_opt("tiny-engine-key").await.ok()??;
        (s.metadata.deletion_timestamp.is_none() && k.metadata.uid != old_key).then(|| t.elapsed())
    })
    .await
    .expect("the Service and the engine-key Secret come back within 10 s");
    println!("Service and Secret back after {:.1} s", back.as_secs_f64());

    let t = Instant::now();
    tb.kubectl_ok(&["scale", "deployment/tiny", "--replicas=3", "-n", &ns.name]);
    let undone = eventually(Duration::from_secs(10), async || {
        let d = deployments.get("tiny").await.ok()?;
        let replicas = d.spec?.replicas;
        // The hand edit lands first, then the operator puts its 0 back.
        (replicas == Some(0) && t.elapsed() > Duration::from_millis(200)).then(|| t.elapsed())
    })
    .await
    .expect("a hand-scaled Deployment is put back within 10 s");
    println!("hand edit undone after {:.1} s", undone.as_secs_f64());
}

/// Requests the operator sent, by verb and resource, from its own counter (watches left out:
/// they are long-lived streams renewed every few minutes, not requests per reconcile).
async fn counted(op: &Operator) -> BTreeMap<String, f64> {
    let (_, text) = op.get("/metrics").await.expect("metrics");
    text.lines()
        .filter(|l| l.starts_with("modelserve_kube_requests_total{"))
        .filter(|l| !l.contains("verb=\"watch\""))
        .filter_map(|l| {
            let (labels, value) = l.rsplit_once(' ')?;
            Some((labels.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// (reads, writes) in `after` less `before`, and what they were. The leader's Lease is left
/// out: it is the operator's heartbeat, the same with one model or a thousand, and
/// `lease_requests` counts it.
fn delta(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> (f64, f64, Vec<String>) {
    let (mut reads, mut writes, mut what) = (0.0, 0.0, Vec::new());
    for (k, v) in after {
        let d = v - before.get(k).copied().unwrap_or(0.0);
        if d == 0.0 || is_lease(k) {
            continue;
        }
        what.push(format!("{k} +{d}"));
        if k.contains("verb=\"get\"") || k.contains("verb=\"list\"") {
            reads += d;
        } else {
            writes += d;
        }
    }
    (reads, writes, what)
}

fn is_lease(counter: &str) -> bool {
    counter.contains("resource=\"leases\"")
}

/// Requests for the leader's Lease in `after` less `before`.
fn lease_requests(before: &BTreeMap<String, f64>, after: &BTreeMap<String, f64>) -> f64 {
    after
        .iter()
        .filter(|(k, _)| is_lease(k))
        .map(|(k, v)| v - before.get(k).copied().unwrap_or(0.0))
        .sum()
}

fn reconciles(text: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with("modelserve_reconciles_total{"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

#[tokio::test]
async fn an_idle_model_costs_no_request_and_a_deployment_status_change_at_most_one() {
    let tb = Testbed::get();
    tb.install_crd();
    let ns = tb.namespace("requests");
    let hub = FakeHub::with_tiny_llama().await;
    hub.add_token("hf_first", &["acme/TinyLlama-GGUF"]);
    hub.add_token("hf_second", &["acme/TinyLlama-GGUF"]);
    let client = tb.client().await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &ns.name);
    secrets
        .create(&PostParams::default(), &token_secret("hf_first"))
        .await
        .unwrap();
    let mirror = MirrorProcess::start(&hub.url);
    // Looked at every 3 s, so the idle window holds many reconciles.
    let op = Operator::start_with(
        &tb,
        &ns.name,
        &hub.url,
        &["--mirror-url", &mirror.url, "--resync", "3s"],
    );
    let api: Api<ModelServe> = Api::namespaced(client.clone(), &ns.name);
    api.create(
        &PostParams::default(),
        &ModelServe::new("tiny", serde_json::from_value(tiny(2, false)).unwrap()),
    )
    .await
    .unwrap();
    let s = until_ready(&api, "tiny", 180).await;
    let placed = s.placement.expect("placed").pod;
    // Let the rollout's last changes pass.
    tokio::time::sleep(Duration::from_secs(10)).await;

    let before = counted(&op).await;
    let r0 = reconciles(&op.get("/metrics").await.unwrap().1);
    tokio::time::sleep(Duration::from_secs(30)).await;
    let after = counted(&op).await;
    let r1 = reconciles(&op.get("/metrics").await.unwrap().1);
    let (reads, writes, what) = delta(&before, &after);
    let heartbeat = lease_requests(&before, &after);
    println!(
        "idle 30 s: {} reconciles, {reads} reads, {writes} writes {what:?}; {heartbeat} Lease requests",
        r1 - r0
    );
    // The default 15 s lease: the fence reads it every 2.5 s and the renewal (a read and a
    // patch) comes every 10 s, so 30 s hold at most 13 + 2 × 4 of them.
    assert!(
        heartbeat <= 21.0,
        "the leader's heartbeat cost {heartbeat} Lease requests in 30 s"
    );
    assert!(
        r1 - r0 >= 5.0,
        "the idle model was looked at ({} reconciles)",
        r1 - r0
    );
    assert_eq!(
        (reads, writes),
        (0.0, 0.0),
        "an idle model cost requests: {what:?}"
    );

    // One replica goes away and comes back: each change of the Deployment's status wakes the
    // operator, which writes status when what it reports changed.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), &ns.name);
    let changes = Arc::new(Mutex::new(0u32));
    let counter = {
        let changes = changes.clone();
        let deployments = deployments.clone();
        tokio::spawn(async move {
            let cfg = watcher::Config::default().fields("metadata.name=tiny");
            let mut last = None;
            let mut stream = watcher(deployments, cfg).applied_objects().boxed();
            while let Some(Ok(d)) = stream.next().await {
                let status = serde_json::to_string(&d.status).ok();
                if last.is_some() && status != last {
                    *changes.lock().unwrap() += 1;
                }
                last = status;
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = counted(&op).await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns.name);
    let other = pods
        .list(&ListParams::default().labels("modelserve.dev/model=tiny"))
        .await
        .unwrap()
        .items
        .into_iter()
        .find(|p| p.metadata.name.as_deref() != Some(placed.as_str()))
        .expect("a second replica");
    pods.delete(&other.metadata.name.unwrap(), &DeleteParams::default())
        .await
        .unwrap();
    let back = eventually(Duration::from_secs(60), async || {
        let d = deployments.get("tiny").await.ok()?;
        let st = d.status?;
        (st.ready_replicas == Some(2) && st.replicas == Some(2)).then_some(())
    })
    .await;
    assert!(back.is_some(), "the replica came back");
    tokio::time::sleep(Duration::from_secs(8)).await;
    counter.abort();
    let after = counted(&op).await;
    let n = *changes.lock().unwrap();
    let (reads, writes, what) = delta(&before, &after);
    let sent = reads + writes;
    println!("{n} Deployment status changes cost {sent} requests: {what:?}");
    assert!(n >= 1, "the Deployment's status changed");
    assert!(
        sent <= f64::from(n),
        "{sent} requests for {n} Deployment status changes"
    );
}

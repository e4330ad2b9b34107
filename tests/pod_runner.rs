//! pod-runner on the test bed: a pod that follows the serving contract (engine-key Secret,
//! `models` emptyDir, init container `modelserve pull` from a real mirror, a `llama-server`
//! container on 0.0.0.0:8080) runs for real, and answers at its kwok pod IP exactly as the
//! operator will call it; deleting the pod stops the server. A pod whose pull fails never
//! starts its server.

mod support;

use std::time::Duration;

use support::fake_hub::{FakeHub, HubFile};
use support::pod_runner::PodRunner;
use support::{Testbed, eventually, start_mirror};

const REPO: &str = "acme/Tiny-GGUF";
const PATH: &str = "Q8/llama-tiny-f16.gguf";

/// A pod as the Catalog stage writes its template (see the serving pod contract).
fn pod_yaml(name: &str, mirror: &str, commit: &str, f: &HubFile, sha256: &str) -> String {
    format!(
        r#"apiVersion: v1
kind: Pod
metadata:
  name: {name}
  labels:
    app.kubernetes.io/name: llama-server
    app.kubernetes.io/instance: tiny
    app.kubernetes.io/component: model-server
    app.kubernetes.io/managed-by: modelserve
    modelserve.dev/model: tiny
spec:
  volumes:
  - name: models
    emptyDir: {{sizeLimit: "{size}"}}
  - name: engine-key
    secret: {{secretName: tiny-engine-key}}
  initContainers:
  - name: pull
    image: modelserve:test
    command: [modelserve, pull]
    args: [--mirror, "{mirror}", --repo, {REPO}, --commit, "{commit}", --dest, /models,
           --file, "{sha256}:{size}:{path}"]
    volumeMounts: [{{name: models, mountPath: /models}}]
  containers:
  - name: llama-server
    image: ghcr.io/ggml-org/llama.cpp:server
    args: [--model, /models/{path}, --ctx-size, "512", --parallel, "1",
           --api-key-file, /etc/modelserve/engine-key/key, --alias, tiny,
           --host, 0.0.0.0, --port, "8080", --metrics, --cache-ram, "0"]
    ports: [{{name: http, containerPort: 8080}}]
    volumeMounts:
    - {{name: models, mountPath: /models, readOnly: true}}
    - {{name: engine-key, mountPath: /etc/modelserve/engine-key, readOnly: true}}
"#,
        size = f.size,
        path = f.path,
    )
}

fn pod_ip(tb: &Testbed, ns: &str, pod: &str) -> Option<String> {
    let ip = tb.kubectl_ok(&[
        "get",
        "pod",
        pod,
        "-n",
        ns,
        "-o",
        "jsonpath={.status.podIP}",
    ]);
    let ip = ip.trim();
    (!ip.is_empty()).then(|| ip.to_string())
}

async fn chat(ip: &str, key: &str) -> Option<(u16, serde_json::Value)> {
    let r = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
        .post(format!("http://{ip}:8080/v1/chat/completions"))
        .bearer_auth(key)
        .json(&serde_json::json!({
            "model": "tiny",
            "messages": [{"role": "user", "content": "Say hello."}],
            "max_tokens": 4,
        }))
        .send()
        .await
        .ok()?;
    let status = r.status().as_u16();
    Some((status, r.json().await.unwrap_or_default()))
}

fn port_open(ip: &str) -> bool {
    std::net::TcpStream::connect_timeout(
        &format!("{ip}:8080").parse().unwrap(),
        Duration::from_millis(300),
    )
    .is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_contract_pod_pulls_from_the_mirror_and_serves_at_its_pod_ip_until_deleted() {
    let tb = Testbed::get();
    let ns = tb.namespace("podrun");
    let hub = FakeHub::start().await;
    let file = HubFile::with_bytes(PATH, support::models::tiny_llama_gguf());
    let commit = hub.add_repo(REPO, vec![file.clone()]);
    let (mirror, _store) = start_mirror(&hub.url).await;
    support::mirror_present(&mirror, REPO, &commit, std::slice::from_ref(&file)).await;
    let key = format!(
        "key-{}-{}",
        std::process::id(),
        file.sha256.get(..8).unwrap()
    );
    tb.kubectl_ok(&[
        "create",
        "secret",
        "generic",
        "tiny-engine-key",
        "-n",
        &ns.name,
        &format!("--from-literal=key={key}"),
    ]);
    let runner = PodRunner::start(&tb, &ns.name);
    let good = pod_yaml("tiny-0", &mirror, &commit, &file, &file.sha256);
    // A pod whose file list names another sha256 than the mirror's bytes have.
    let bad = pod_yaml("tiny-bad", &mirror, &commit, &file, &"ab".repeat(32));
    for yaml in [&good, &bad] {
        let out = tb.kubectl_stdin(&["apply", "-n", &ns.name, "-f", "-"], yaml);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let ip = eventually(Duration::from_secs(30), async || {
        pod_ip(&tb, &ns.name, "tiny-0")
    })
    .await
    .expect("kwok gives the pod an IP");
    assert!(
        ip.starts_with("127."),
        "pod IPs come from 127.1.0.0/16: {ip}"
    );

    let answer = eventually(Duration::from_secs(90), async || {
        chat(&ip, &key).await.filter(|(s, _)| *s == 200)
    })
    .await;
    let Some((_, body)) = answer else {
        panic!(
            "no 200 from http://{ip}:8080/v1/chat/completions\n--- pull\n{}\n--- llama-server\n{}",
            runner.container_log(&ns.name, "tiny-0", "pull"),
            runner.container_log(&ns.name, "tiny-0", "llama-server"),
        )
    };
    assert!(
        body["choices"][0]["message"]["content"].is_string(),
        "{body}"
    );
    assert!(
        body["usage"]["completion_tokens"].as_u64() > Some(0),
        "{body}"
    );
    let models: serde_json::Value = reqwest::Client::builder()
        .no_proxy()
        .build()
        .unwrap()
        .get(format!("http://{ip}:8080/v1/models"))
        .bearer_auth(&key)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(
        models["data"][0]["id"], "tiny",
        "--alias reached the server: {models}"
    );
    let (status, _) = chat(&ip, "not-the-key").await.expect("an answer");
    assert_eq!(status, 401, "a wrong key is refused");
    let pull_log = runner.container_log(&ns.name, "tiny-0", "pull");
    assert!(
        pull_log.contains("all 1 file(s) present and verified in /")
            && pull_log.contains("/volumes/models"),
        "the pull wrote into the pod's models volume: {pull_log}"
    );

    // The pod whose pull fails: its init container's error is in its log, it is run again as a
    // kubelet would, and its server never runs.
    let bad_ip = eventually(Duration::from_secs(30), async || {
        pod_ip(&tb, &ns.name, "tiny-bad")
    })
    .await
    .expect("kwok gives the pod an IP");
    let failed = eventually(Duration::from_secs(30), async || {
        (runner
            .log()
            .matches("init container failed; running it again")
            .count()
            >= 2)
            .then_some(())
    })
    .await;
    assert!(failed.is_some(), "{}", runner.log());
    let bad_log = runner.container_log(&ns.name, "tiny-bad", "pull");
    assert!(
        bad_log.contains(&format!(
            "modelserve: {PATH} arrived with sha256 {}, the mirror published {}",
            file.sha256,
            "ab".repeat(32)
        )),
        "{bad_log}"
    );
    assert!(!port_open(&bad_ip), "no server for a pod whose pull failed");

    // Deleting the pod stops its server and removes its directory.
    let dir = runner.pod_dir(&ns.name, "tiny-0");
    assert!(dir.is_dir());
    tb.kubectl_ok(&["delete", "pod", "tiny-0", "-n", &ns.name, "--wait=false"]);
    let gone = eventually(Duration::from_secs(30), async || {
        (!port_open(&ip) && !dir.exists()).then_some(())
    })
    .await;
    assert!(
        gone.is_some(),
        "llama-server still answers at {ip}:8080 or {} remains\n{}",
        dir.display(),
        runner.log()
    );
}

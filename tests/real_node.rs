//! The serving path on the test bed's real node (testbed/real-node.sh): a real kubelet and
//! containerd run the Deployment the operator generates. The `pull` init container in the
//! modelserve image copies the model from the mirror, llama-server in the engine image serves at
//! a real pod IP of the node's bridge, and the operator's smoke test reaches it there. The
//! kubelet enforces what pod-runner cannot: the image's user, a read-only root, and above all
//! the memory limit, which is the Check estimate: the kernel OOM-kills past it.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::Api;
use kube::api::{ListParams, PostParams};
use modelserve::api::{ModelServe, ModelServeStatus};
use modelserve::names::SERVER_CONTAINER;
use support::fake_hub::{FakeHub, HubFile};
use support::{Operator, Testbed, condition, eventually};

const NODE: &str = "testbed-real";
const TAINT: &str = "modelserve.dev/real-node";

/// The real node's directory in the test bed's state, and its containerd socket.
fn node_dir(tb: &Testbed) -> PathBuf {
    tb.kubeconfig.parent().unwrap().join(format!("node-{NODE}"))
}

/// Builds the two images (cached) and imports them into the node's containerd; returns the
/// modelserve image and the engine image.
fn images(tb: &Testbed) -> (String, String) {
    let dir = node_dir(tb);
    let node_bin = std::fs::read_to_string(dir.join("bin")).unwrap_or_else(|e| {
        panic!(
            "the test bed has no real node at {}: {e}; start it with `scripts/testbed up` (without TESTBED_REAL_NODES=0)",
            dir.display()
        )
    });
    let path = format!(
        "{}:{}",
        node_bin.trim(),
        std::env::var("PATH").unwrap_or_default()
    );
    let sock = dir.join("containerd/containerd.sock");
    let out = Command::new("bash")
        .arg(support::repo_path("testbed/build-image.sh"))
        .args(["all", "--import"])
        .arg(&sock)
        .env("PATH", path)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "build-image.sh all --import: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let version = env!("CARGO_PKG_VERSION");
    let versions = std::fs::read_to_string(support::repo_path("testbed/versions.env")).unwrap();
    let build = versions
        .lines()
        .find_map(|l| l.strip_prefix("LLAMA_CPP_BUILD="))
        .unwrap()
        .trim()
        .to_string();
    (
        format!("ghcr.io/modelserve/modelserve:{version}"),
        format!("localhost/modelserve-testbed/llama.cpp:server-b{build}"),
    )
}

/// The mirror, listening on the node bridge's gateway: where the pods reach the host.
async fn mirror_for_pods(tb: &Testbed, registry: &str) -> (String, tempfile::TempDir) {
    let gateway = std::fs::read_to_string(node_dir(tb).join("gateway")).unwrap();
    support::start_mirror_at(registry, &format!("{}:0", gateway.trim())).await
}

fn spec(engine_image: &str, memory_limit: Option<&str>) -> serde_json::Value {
    let mut engine = serde_json::json!({
        "image": engine_image,
        "nodeSelector": {"type": "real"},
        "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
    });
    if let Some(m) = memory_limit {
        engine["resources"] = serde_json::json!({"limits": {"memory": m}});
    }
    serde_json::json!({
        "repo": "acme/TinyLlama-GGUF",
        "replicas": 1,
        "contextSize": 2048,
        "contextLength": 1024,
        "smokeTest": {"prompt": "Say hello.", "maxTokens": 8},
        "engine": engine,
    })
}

async fn until(
    api: &Api<ModelServe>,
    name: &str,
    type_: &str,
    pred: impl Fn(&str, &str) -> bool,
    secs: u64,
) -> ModelServeStatus {
    let got = eventually(Duration::from_secs(secs), async || {
        let s = api.get(name).await.ok()?.status?;
        let c = s.conditions.iter().find(|c| c.type_ == type_)?;
        pred(&c.status, &c.reason).then_some(s)
    })
    .await;
    got.unwrap_or_else(|| {
        panic!(
            "{name}: {type_} never came: {:#?}",
            futures::executor::block_on(api.get(name))
                .ok()
                .and_then(|m| m.status)
        )
    })
}

/// The memory cgroup (v1 or v2) of one container of the node: its peak usage, in bytes.
fn cgroup_peak(container_id: &str) -> Option<u64> {
    let id = container_id.strip_prefix("containerd://")?;
    for (root, file) in [
        ("/sys/fs/cgroup/memory", "memory.max_usage_in_bytes"),
        ("/sys/fs/cgroup", "memory.peak"),
    ] {
        let base = Path::new(root).join(format!("modelserve-testbed-{NODE}"));
        if let Some(dir) = find_dir(&base, id, 6) {
            return std::fs::read_to_string(dir.join(file))
                .ok()?
                .trim()
                .parse()
                .ok();
        }
    }
    None
}

fn find_dir(dir: &Path, name: &str, depth: usize) -> Option<PathBuf> {
    if depth == 0 {
        return None;
    }
    for e in std::fs::read_dir(dir).ok()?.flatten() {
        let p = e.path();
        if !p.is_dir() {
            continue;
        }
        if p.file_name().is_some_and(|n| n == name) {
            return Some(p);
        }
        if let Some(found) = find_dir(&p, name, depth - 1) {
            return Some(found);
        }
    }
    None
}

#[tokio::test]
async fn a_model_is_served_by_the_real_kubelet_under_its_estimate_and_an_undersized_one_is_oomkilled()
 {
    let tb = Testbed::get();
    let nodes: Api<Node> = Api::all(tb.client().await);
    let node = nodes.get(NODE).await.unwrap_or_else(|e| {
        panic!("no node {NODE} ({e}): start the test bed with its real node, `scripts/testbed up`")
    });
    assert!(
        node.status
            .and_then(|s| s.node_info)
            .is_some_and(|i| i.container_runtime_version.starts_with("containerd://")),
        "{NODE} runs containerd"
    );
    let (pull_image, engine_image) = images(&tb);
    tb.install_crd();
    let ns = tb.namespace("realnode");
    let hub = FakeHub::start().await;
    hub.add_repo(
        "acme/TinyLlama-GGUF",
        vec![HubFile::with_bytes(
            "tinyllama-Q4_K_M.gguf",
            support::models::tiny_llama_gguf(),
        )],
    );
    let (mirror_url, _mirror) = mirror_for_pods(&tb, &hub.url).await;
    let _op = Operator::start_with(
        &tb,
        &ns.name,
        &hub.url,
        &[
            "--mirror-url",
            &mirror_url,
            "--pull-image",
            &pull_image,
            "--place-grace",
            "20s",
        ],
    );
    let api: Api<ModelServe> = Api::namespaced(tb.client().await, &ns.name);
    let pods: Api<Pod> = Api::namespaced(tb.client().await, &ns.name);

    // Sized by Check: Ready with the smoke reply, every step on the node.
    let ms = ModelServe::new(
        "onnode",
        serde_json::from_value(spec(&engine_image, None)).unwrap(),
    );
    api.create(&PostParams::default(), &ms).await.unwrap();
    let s = until(&api, "onnode", "Ready", |st, _| st == "True", 300).await;
    let smoke = s.smoke.clone().expect("status.smoke");
    assert!(!smoke.reply.is_empty(), "{smoke:?}");
    let address = s.placement.clone().expect("status.placement").address;
    assert!(
        address.starts_with("10.213.0."),
        "a pod IP of the node's bridge: {address}"
    );
    let estimate = s
        .check
        .as_ref()
        .and_then(|c| c.memory_bytes)
        .expect("check.memoryBytes") as u64;

    let pod = pods
        .list(&ListParams::default().labels("modelserve.dev/model=onnode"))
        .await
        .unwrap()
        .items
        .remove(0);
    let name = pod.metadata.name.clone().unwrap();
    assert_eq!(pod.spec.as_ref().unwrap().node_name.as_deref(), Some(NODE));
    let status = pod.status.clone().unwrap();
    let server = status
        .container_statuses
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.name == SERVER_CONTAINER)
        .expect("the server container");
    let id = server.container_id.clone().unwrap_or_default();
    assert!(
        id.starts_with("containerd://"),
        "the container ID comes from containerd: {id}"
    );
    let pull = status.init_container_statuses.unwrap_or_default();
    assert!(
        pull.iter().all(|c| c
            .state
            .as_ref()
            .and_then(|s| s.terminated.as_ref())
            .is_some_and(|t| t.exit_code == 0)),
        "the pull init container ran and succeeded: {pull:?}"
    );
    let logs = tb.kubectl_ok(&["logs", "-n", &ns.name, &name, "-c", SERVER_CONTAINER]);
    assert!(
        logs.contains("model loaded"),
        "kubectl logs shows the engine's log:\n{logs}"
    );
    // kubectl exec into the server container, busybox as its shell.
    let exec = |args: &[&str]| {
        let mut all = vec![
            "exec",
            "-n",
            &ns.name,
            &name,
            "-c",
            SERVER_CONTAINER,
            "--",
            "busybox",
        ];
        all.extend_from_slice(args);
        tb.kubectl(&all)
    };
    let uid = exec(&["id", "-u"]);
    assert!(uid.status.success(), "{uid:?}");
    assert_eq!(String::from_utf8_lossy(&uid.stdout).trim(), "65532");
    // /tmp is world-writable in the image: only a read-only root refuses the write.
    let write = exec(&["touch", "/tmp/x"]);
    assert!(!write.status.success(), "the root filesystem is read-only");
    assert!(
        String::from_utf8_lossy(&write.stderr).contains("Read-only file system"),
        "{write:?}"
    );

    // A few completions at the model's full context, under the limit Check set.
    let secrets: Api<Secret> = Api::namespaced(tb.client().await, &ns.name);
    let secret = secrets.get("onnode-engine-key").await.unwrap();
    let key = String::from_utf8(secret.data.unwrap()["key"].0.clone()).unwrap();
    let http = reqwest::Client::new();
    // About 900 tokens of the tiny model's byte-level vocabulary: its slot holds 1024.
    let filler = "the quick brown fox jumps over the lazy dog ".repeat(25);
    for _ in 0..3 {
        let r = http
            .post(format!("http://{address}/v1/chat/completions"))
            .bearer_auth(&key)
            .json(&serde_json::json!({
                "messages": [{"role": "user", "content": filler}],
                "max_tokens": 16,
            }))
            .send()
            .await
            .unwrap();
        assert!(
            r.status().is_success(),
            "{}",
            r.text().await.unwrap_or_default()
        );
    }
    let peak = cgroup_peak(&id).expect("the server container's memory cgroup");
    let restarts = pods
        .get(&name)
        .await
        .unwrap()
        .status
        .unwrap()
        .container_statuses
        .unwrap()
        .iter()
        .map(|c| c.restart_count)
        .sum::<i32>();
    assert_eq!(
        restarts, 0,
        "no container restarted (OOMKilled or otherwise)"
    );
    println!(
        "real node: cgroup peak {:.1} MiB of the estimate {:.1} MiB ({:.3})",
        peak as f64 / (1 << 20) as f64,
        estimate as f64 / (1 << 20) as f64,
        peak as f64 / estimate as f64
    );
    assert!(
        peak <= estimate,
        "the engine stayed under the estimate it was limited to"
    );

    // Undersized by hand (the tiny model peaks near 11 MiB): the kernel OOM-kills the server,
    // and Place says so from the kubelet.
    let small = ModelServe::new(
        "toosmall",
        serde_json::from_value(spec(&engine_image, Some("6Mi"))).unwrap(),
    );
    api.create(&PostParams::default(), &small).await.unwrap();
    let s = until(
        &api,
        "toosmall",
        "Placed",
        |st, r| st == "False" && r == "OOMKilled",
        300,
    )
    .await;
    let (_, reason, message) = condition(&s, "Placed");
    assert_eq!(reason, "OOMKilled", "{message}");
    println!("real node: undersized model: Placed False OOMKilled: {message}");
}

//! The serving path on the test bed's real node (testbed/real-node.sh): a real kubelet and
//! containerd run the Deployment the operator generates. The `pull` init container in the
//! modelserve image copies the model from the mirror, llama-server in the engine image serves at
//! a real pod IP of the node's bridge, and the operator's smoke test reaches it there. The
//! kubelet enforces what pod-runner cannot: the image's user, a read-only root, and above all
//! the memory limit, which is the Check estimate: the kernel OOM-kills past it.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::Api;
use kube::api::{ListParams, PostParams};
use modelserve::api::{ModelServe, ModelServeStatus};
use modelserve::names::SERVER_CONTAINER;
use support::fake_hub::{FakeHub, HubFile};
use support::{Operator, Testbed, condition, eventually, model_pod};

const NODE: &str = "testbed-real";
const TAINT: &str = "modelserve.dev/real-node";

/// The real node's directory in the test bed's state, and its containerd socket.
fn node_dir(tb: &Testbed) -> PathBuf {
    tb.kubeconfig.parent().unwrap().join(format!("node-{NODE}"))
}

/// Builds the two images (cached) and imports them into the node's containerd, once for all the
/// tests of this file; returns the modelserve image and the engine image.
fn images(tb: &Testbed) -> (String, String) {
    static IMAGES: OnceLock<(String, String)> = OnceLock::new();
    IMAGES.get_or_init(|| build_images(tb)).clone()
}

fn build_images(tb: &Testbed) -> (String, String) {
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

/// The fake Hub with the tiny model, the mirror where the node's pods reach it, and an
/// operator for `namespace` using both, with the node's pull image and `extra` flags; dropped
/// in that order's reverse.
struct Serving {
    _op: Operator,
    _mirror: tempfile::TempDir,
    _hub: FakeHub,
}

async fn serving(tb: &Testbed, namespace: &str, pull_image: &str, extra: &[&str]) -> Serving {
    let hub = FakeHub::with_tiny_llama().await;
    let (mirror_url, mirror) = mirror_for_pods(tb, &hub.url).await;
    let mut flags = vec![
        "--mirror-url",
        &mirror_url,
        "--pull-image",
        pull_image,
        "--place-grace",
        "20s",
    ];
    flags.extend_from_slice(extra);
    Serving {
        _op: Operator::start_with(tb, namespace, &hub.url, &flags),
        _mirror: mirror,
        _hub: hub,
    }
}

/// A ModelServe of `repo` whose replicas run on the real node, with `slots` of `slot` tokens.
fn spec(
    repo: &str,
    engine_image: &str,
    memory_limit: Option<&str>,
    (slot, slots): (u32, u32),
) -> serde_json::Value {
    let mut engine = serde_json::json!({
        "image": engine_image,
        "nodeSelector": {"type": "real"},
        "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
    });
    if let Some(m) = memory_limit {
        engine["resources"] = serde_json::json!({"limits": {"memory": m}});
    }
    serde_json::json!({
        "repo": repo,
        "replicas": 1,
        "contextSize": slot * slots,
        "contextLength": slot,
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
    match got {
        Some(s) => s,
        // Awaited, not blocked on: the test's runtime is one thread, which the mirror shares.
        None => panic!(
            "{name}: {type_} never came: {:#?}",
            api.get(name).await.ok().and_then(|m| m.status)
        ),
    }
}

/// The memory cgroup (v1 or v2) of one container of the node: its peak usage, and its pod's (the
/// parent cgroup, which also holds what the pod's other containers were charged: the page cache
/// of the model file the pull init container wrote), in bytes.
fn cgroup_peak(container_id: &str) -> Option<(u64, u64)> {
    let id = container_id.strip_prefix("containerd://")?;
    let read = |dir: &Path, file: &str| -> Option<u64> {
        std::fs::read_to_string(dir.join(file))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    for (root, file) in [
        ("/sys/fs/cgroup/memory", "memory.max_usage_in_bytes"),
        ("/sys/fs/cgroup", "memory.peak"),
    ] {
        let base = Path::new(root).join(format!("modelserve-testbed-{NODE}"));
        if let Some(dir) = find_dir(&base, id, 6) {
            return Some((read(&dir, file)?, read(dir.parent()?, file)?));
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

/// A replica the real node serves, as the tests found it.
struct OnNode {
    pod: String,
    container_id: String,
    address: String,
    estimate: u64,
    key: String,
}

/// Waits for `name` to be Ready, then checks that every step happened on the node: the pod is
/// the node's, its container IDs come from containerd, the pull init container succeeded,
/// `kubectl logs` shows the engine's log, and `kubectl exec` finds uid 65532 and a read-only
/// root.
async fn served_on_node(tb: &Testbed, namespace: &str, name: &str) -> OnNode {
    let api: Api<ModelServe> = Api::namespaced(tb.client().await, namespace);
    let pods: Api<Pod> = Api::namespaced(tb.client().await, namespace);
    let s = until(&api, name, "Ready", |st, _| st == "True", 300).await;
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

    let pod = model_pod(&pods, name).await;
    let pod_name = pod.metadata.name.clone().unwrap();
    assert_eq!(pod.spec.as_ref().unwrap().node_name.as_deref(), Some(NODE));
    let status = pod.status.clone().unwrap();
    let server = status
        .container_statuses
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.name == SERVER_CONTAINER)
        .expect("the server container");
    let container_id = server.container_id.clone().unwrap_or_default();
    assert!(
        container_id.starts_with("containerd://"),
        "the container ID comes from containerd: {container_id}"
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
    let logs = tb.kubectl_ok(&["logs", "-n", namespace, &pod_name, "-c", SERVER_CONTAINER]);
    assert!(
        logs.contains("model loaded"),
        "kubectl logs shows the engine's log:\n{logs}"
    );
    // kubectl exec into the server container, busybox as its shell.
    let exec = |args: &[&str]| {
        let mut all = vec![
            "exec",
            "-n",
            namespace,
            &pod_name,
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
    let secrets: Api<Secret> = Api::namespaced(tb.client().await, namespace);
    let secret = secrets.get(&format!("{name}-engine-key")).await.unwrap();
    let key = String::from_utf8(secret.data.unwrap()["key"].0.clone()).unwrap();
    OnNode {
        pod: pod_name,
        container_id,
        address,
        estimate,
        key,
    }
}

/// `rounds` chat completions whose prompt fills the slot of `slot` tokens (less the chat
/// template and the reply); then the server container's cgroup peak, which must stay under the
/// estimate it was limited to, with no restart. Prints peak / estimate.
async fn full_context_under_estimate(
    tb: &Testbed,
    namespace: &str,
    what: &str,
    served: &OnNode,
    slot: usize,
    rounds: usize,
) {
    let http = reqwest::Client::new();
    let url = |path: &str| format!("http://{}{path}", served.address);
    let tokens = async |text: &str| -> usize {
        let r: serde_json::Value = http
            .post(url("/tokenize"))
            .bearer_auth(&served.key)
            .json(&serde_json::json!({ "content": text }))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        r["tokens"].as_array().map_or(0, Vec::len)
    };
    let sentence = "the quick brown fox jumps over the lazy dog. ";
    let want = slot - 64;
    let mut repeats = want / tokens(sentence).await.max(1);
    let mut prompt = sentence.repeat(repeats);
    let mut used = tokens(&prompt).await;
    // The vocabulary merges across repeats: shrink until the slot holds it (a few steps).
    for _ in 0..16 {
        if used <= want {
            break;
        }
        repeats = (repeats * want / used).saturating_sub(1).max(1);
        prompt = sentence.repeat(repeats);
        used = tokens(&prompt).await;
    }
    assert!(
        used <= want && used * 10 >= want * 9,
        "{what}: a prompt of {used} tokens for a slot of {slot}"
    );
    for _ in 0..rounds {
        let r = http
            .post(url("/v1/chat/completions"))
            .bearer_auth(&served.key)
            .timeout(Duration::from_secs(600))
            .json(&serde_json::json!({
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": 16,
            }))
            .send()
            .await
            .unwrap();
        assert!(
            r.status().is_success(),
            "{what}: {}",
            r.text().await.unwrap_or_default()
        );
    }
    let (peak, pod_peak) =
        cgroup_peak(&served.container_id).expect("the server container's memory cgroup");
    let pods: Api<Pod> = Api::namespaced(tb.client().await, namespace);
    let restarts = pods
        .get(&served.pod)
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
        "{what}: no container restarted (OOMKilled or otherwise)"
    );
    println!(
        "real node: {what}: {rounds} completions of {used} prompt tokens in a slot of {slot}: cgroup peak {:.1} MiB of the estimate {:.1} MiB ({:.3}); the pod's {:.1} MiB, with the model file's page cache",
        mib(peak),
        mib(served.estimate),
        peak as f64 / served.estimate as f64,
        mib(pod_peak),
    );
    assert!(
        peak <= served.estimate,
        "{what}: the engine stayed under the estimate it was limited to"
    );
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// The node the test bed must have, running containerd.
async fn real_node(tb: &Testbed) {
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
}

#[tokio::test]
async fn a_model_is_served_by_the_real_kubelet_under_its_estimate_and_failing_ones_say_why_in_its_words()
 {
    let tb = Testbed::get();
    real_node(&tb).await;
    let (pull_image, engine_image) = images(&tb);
    tb.install_crd();
    let ns = tb.namespace("realnode");
    // The model's pods go through the restricted Pod Security level, enforced by the API
    // server's admission, and run under it on the kubelet.
    tb.kubectl_ok(&[
        "label",
        "namespace",
        &ns.name,
        "pod-security.kubernetes.io/enforce=restricted",
    ]);
    let _serving = serving(&tb, &ns.name, &pull_image, &[]).await;
    let api: Api<ModelServe> = Api::namespaced(tb.client().await, &ns.name);

    // Sized by Check: Ready with the smoke reply, every step on the node, and a few completions
    // at the model's full context (two slots of 1024) under the limit Check set.
    let tiny = "acme/TinyLlama-GGUF";
    let ms = ModelServe::new(
        "onnode",
        serde_json::from_value(spec(tiny, &engine_image, None, (1024, 2))).unwrap(),
    );
    api.create(&PostParams::default(), &ms).await.unwrap();
    let served = served_on_node(&tb, &ns.name, "onnode").await;
    full_context_under_estimate(&tb, &ns.name, "the demo model", &served, 1024, 3).await;

    // Undersized by hand (the tiny model peaks near 11 MiB): the kernel OOM-kills the server,
    // and Place says so from the kubelet.
    let small = ModelServe::new(
        "toosmall",
        serde_json::from_value(spec(tiny, &engine_image, Some("6Mi"), (1024, 2))).unwrap(),
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

    // An engine that exits at once: Place says why in the engine's own words, the end of its log
    // that the kubelet keeps as the termination message (FallbackToLogsOnError); without it the
    // message is the exit code alone.
    let mut exits = spec(tiny, &engine_image, None, (1024, 2));
    exits["engine"]["extraArgs"] = serde_json::json!(["--no-such-flag"]);
    let exits = ModelServe::new("exits", serde_json::from_value(exits).unwrap());
    api.create(&PostParams::default(), &exits).await.unwrap();
    let s = until(
        &api,
        "exits",
        "Placed",
        |st, r| st == "False" && r == "CrashLoop",
        300,
    )
    .await;
    let (_, _, message) = condition(&s, "Placed");
    assert!(
        message.contains("last exit code 1 (Error): error: invalid argument: --no-such-flag"),
        "{message}"
    );
    println!("real node: an engine that exits: Placed False CrashLoop: {message}");
}

/// The test bed's API server port, from its kubeconfig (`server: "https://127.0.0.1:PORT"`).
fn api_port(tb: &Testbed) -> u16 {
    let kubeconfig = std::fs::read_to_string(&tb.kubeconfig).unwrap();
    kubeconfig
        .split("https://127.0.0.1:")
        .nth(1)
        .and_then(|rest| {
            rest.split(|c: char| !c.is_ascii_digit())
                .next()?
                .parse()
                .ok()
        })
        .expect("the kubeconfig names the API server on 127.0.0.1")
}

/// What the chart test made outside its namespace: the mirror's PersistentVolume and the node
/// directory behind it, removed when the test ends however it ends.
struct Store<'a> {
    tb: &'a Testbed,
    pv: String,
    dir: PathBuf,
}

impl Drop for Store<'_> {
    fn drop(&mut self) {
        let _ = self.tb.kubectl(&["delete", "pv", &self.pv, "--wait=false"]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A Helm release, uninstalled when the test ends.
struct Release<'a> {
    tb: &'a Testbed,
    name: String,
    namespace: String,
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        let _ = self
            .tb
            .command("helm")
            .args(["uninstall", &self.name, "--namespace", &self.namespace])
            .args(["--wait", "--timeout=60s"])
            .output();
    }
}

/// The chart as a user installs it, on the test bed: the operator and the mirror run as real
/// pods of the real node in the image built here (imported, never pulled), and take a quantized
/// model of the memory benchmark to Ready; its replica serves at full context under the
/// estimate. The test bed's API server listens on the node's loopback, so the operator runs
/// with hostNetwork and that address, and the mirror with hostNetwork on the bridge's gateway,
/// where the replicas' pull init containers reach it (the test bed has no cluster DNS).
#[tokio::test]
async fn the_chart_runs_the_operator_and_the_mirror_on_the_real_node_and_they_serve_a_quantized_model()
 {
    let tb = Testbed::get();
    real_node(&tb).await;
    let (image, engine_image) = images(&tb);
    let (repository, tag) = image.rsplit_once(':').unwrap();
    tb.install_crd();

    // deepseek2 at Q4_K_M (latent attention, a 128k vocabulary), a row of the memory benchmark.
    let quantize = support::testbed_script_with("build-llama-tool.sh", &["llama-quantize"]);
    let models = tempfile::tempdir().unwrap();
    let path = support::models::quantized(
        models.path(),
        &quantize,
        ("deepseek2", "llama-bpe", "bench", "Q4_K_M"),
    );
    let file = path.file_name().unwrap().to_string_lossy().into_owned();
    let hub = FakeHub::start().await;
    let repo = "bench/DeepSeek2-GGUF";
    hub.add_repo(
        repo,
        vec![HubFile::with_bytes(&file, std::fs::read(&path).unwrap())],
    );

    let ns = tb.namespace("realchart");
    let release = Release {
        tb: &tb,
        name: "ms".into(),
        namespace: ns.name.clone(),
    };
    // The mirror's volume: a directory of the node, owned by the mirror's user (a hostPath
    // volume takes no fsGroup), bound to the StatefulSet's claim in advance.
    let dir = std::env::temp_dir().join(format!("modelserve-realnode-store-{}", ns.name));
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(65532), Some(65532)).unwrap();
    let store = Store {
        tb: &tb,
        pv: format!("{}-store", ns.name),
        dir,
    };
    let pv = serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": store.pv},
        "spec": {
            "capacity": {"storage": "2Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": store.dir, "type": "Directory"},
            "claimRef": {"namespace": ns.name, "name": "store-ms-modelserve-mirror-0"},
        },
    });
    let applied = tb.kubectl_stdin(&["apply", "-f", "-"], &pv.to_string());
    assert!(applied.status.success(), "{applied:?}");

    let gateway = std::fs::read_to_string(node_dir(&tb).join("gateway")).unwrap();
    let mirror_port = support::free_port();
    let metrics_port = support::free_port();
    let on_node = [
        "nodeSelector.type=real".to_string(),
        format!("tolerations[0].key={TAINT}"),
        "tolerations[0].operator=Exists".into(),
        "tolerations[0].effect=NoSchedule".into(),
    ];
    let mut values = vec![
        format!("image.repository={repository}"),
        format!("image.tag={tag}"),
        format!("engine.image={engine_image}"),
        // The test bed's llama-server is built for any x86-64 with AVX2 (no -march=native).
        "engine.cpu=avx2".into(),
        format!("registry.endpoint={}", hub.url),
        format!("operator.watchNamespace={}", ns.name),
        "operator.hostNetwork=true".into(),
        // One node: two replicas on its network would share the metrics port, and the chart
        // keeps them on different nodes, so a second would wait Pending. tests/leader.rs runs two.
        "operator.replicas=1".into(),
        "operator.apiServer.host=127.0.0.1".into(),
        format!("operator.apiServer.port={}", api_port(&tb)),
        format!("operator.metricsPort={metrics_port}"),
        "operator.placeGrace=20s".into(),
        "mirror.hostNetwork=true".into(),
        format!("mirror.port={mirror_port}"),
        format!("mirror.url=http://{}:{mirror_port}", gateway.trim()),
        "mirror.storage.size=2Gi".into(),
    ];
    for part in ["operator", "mirror"] {
        values.extend(on_node.iter().map(|v| format!("{part}.{v}")));
    }
    let mut args = vec![
        "install".to_string(),
        release.name.clone(),
        support::repo_path("charts/modelserve"),
        "--namespace".into(),
        ns.name.clone(),
        "--skip-crds".into(),
    ];
    for v in values {
        args.extend(["--set".into(), v]);
    }
    let out = tb.command("helm").args(&args).output().unwrap();
    assert!(
        out.status.success(),
        "helm install: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for workload in [
        "deployment/ms-modelserve",
        "statefulset/ms-modelserve-mirror",
    ] {
        let rollout = tb.kubectl(&[
            "rollout",
            "status",
            "-n",
            &ns.name,
            workload,
            "--timeout=180s",
        ]);
        assert!(
            rollout.status.success(),
            "{workload}: {}{}\n{}",
            String::from_utf8_lossy(&rollout.stdout),
            String::from_utf8_lossy(&rollout.stderr),
            tb.kubectl_ok(&["get", "pods,events", "-n", &ns.name, "-o", "wide"])
        );
    }
    // Both run on the node, in containerd, from the imported image.
    let pods: Api<Pod> = Api::namespaced(tb.client().await, &ns.name);
    let mut ran = Vec::new();
    for component in ["controller", "mirror"] {
        let pod = pods
            .list(
                &ListParams::default().labels(&format!("app.kubernetes.io/component={component}")),
            )
            .await
            .unwrap()
            .items
            .remove(0);
        assert_eq!(pod.spec.as_ref().unwrap().node_name.as_deref(), Some(NODE));
        let c = pod.status.unwrap().container_statuses.unwrap().remove(0);
        let id = c.container_id.unwrap_or_default();
        assert!(id.starts_with("containerd://"), "{component}: {id}");
        assert_eq!(c.image, image, "{component}");
        ran.push(format!("{component} {}", id.get(..26).unwrap_or(&id)));
    }
    println!("real node: the chart's pods: {}", ran.join(", "));

    let api: Api<ModelServe> = Api::namespaced(tb.client().await, &ns.name);
    let slot = 4096;
    let ms = ModelServe::new(
        "deepseek2",
        serde_json::from_value(spec(repo, &engine_image, None, (slot, 1))).unwrap(),
    );
    api.create(&PostParams::default(), &ms).await.unwrap();
    let served = served_on_node(&tb, &ns.name, "deepseek2").await;
    // The operator in the pod took it there (no other operator watches the namespace): its
    // metrics, on the node's network, count the model at the stage its status names.
    let stage = api.get("deepseek2").await.unwrap().status.unwrap().stage;
    let metrics = reqwest::get(format!("http://127.0.0.1:{metrics_port}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let counted = format!(
        "modelserve_models{{stage=\"{}\"}} 1",
        stage.unwrap_or_default()
    );
    assert!(
        metrics.contains(&counted),
        "the operator pod's metrics count {counted}:\n{metrics}"
    );
    full_context_under_estimate(&tb, &ns.name, "deepseek2 Q4_K_M", &served, slot as usize, 3).await;
    api.delete("deepseek2", &Default::default()).await.unwrap();
    drop(release);
    drop(store);
}

/// A token for ServiceAccount `namespace/name` with the mirror's audience, from the API server's
/// TokenRequest (what a projected volume holds; `kubectl create token` does the same).
async fn mirror_token(tb: &Testbed, namespace: &str, name: &str) -> String {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let sas: Api<ServiceAccount> = Api::namespaced(tb.client().await, namespace);
    let mut sa = ServiceAccount::default();
    sa.metadata.name = Some(name.into());
    match sas.create(&PostParams::default(), &sa).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("ServiceAccount {namespace}/{name}: {e}"),
    }
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: Some(vec![modelserve::mirror::auth::DEFAULT_AUDIENCE.into()]),
            expiration_seconds: Some(3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let answer = eventually(Duration::from_secs(30), async || {
        sas.create_token_request(name, &PostParams::default(), &request)
            .await
            .ok()
    })
    .await
    .expect("a TokenRequest");
    answer.status.and_then(|s| s.token).expect("a token")
}

/// A pod of the real node in `namespace` that runs `modelserve pull` of `file` (SHA:SIZE:PATH)
/// from the mirror, as a replica's init container does, with a projected token for the
/// mirror's audience or none; returns its exit code and its log once it has ended.
async fn pull_from_node(
    tb: &Testbed,
    namespace: &str,
    name: &str,
    image: &str,
    (mirror, repo, commit, file): (&str, &str, &str, &str),
    with_token: bool,
) -> (i32, String) {
    let token_dir = "/var/run/secrets/modelserve/mirror";
    let mut args = vec![
        "pull",
        "--mirror",
        mirror,
        "--repo",
        repo,
        "--commit",
        commit,
        "--dest",
        "/tmp/m",
        "--file",
        file,
        "--attempts",
        "1",
    ];
    let token_file = format!("{token_dir}/token");
    if with_token {
        args.extend(["--token-file", &token_file]);
    }
    let mut mounts = vec![serde_json::json!({"name": "tmp", "mountPath": "/tmp"})];
    let mut volumes = vec![serde_json::json!({"name": "tmp", "emptyDir": {}})];
    if with_token {
        mounts.push(serde_json::json!({"name": "token", "mountPath": token_dir, "readOnly": true}));
        volumes.push(
            serde_json::json!({"name": "token", "projected": {"sources": [
                {"serviceAccountToken": {
                    "audience": modelserve::mirror::auth::DEFAULT_AUDIENCE,
                    "expirationSeconds": 3600, "path": "token"}}
            ]}}),
        );
    }
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "nodeSelector": {"type": "real"},
            "tolerations": [{"key": TAINT, "operator": "Exists", "effect": "NoSchedule"}],
            "securityContext": {"runAsNonRoot": true, "runAsUser": 65532,
                                "seccompProfile": {"type": "RuntimeDefault"}},
            "containers": [{
                "name": "pull", "image": image, "imagePullPolicy": "Never",
                "args": args,
                "volumeMounts": mounts,
                "securityContext": {"allowPrivilegeEscalation": false,
                                    "readOnlyRootFilesystem": true,
                                    "capabilities": {"drop": ["ALL"]}},
            }],
            "volumes": volumes,
        },
    }))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(tb.client().await, namespace);
    pods.create(&PostParams::default(), &pod).await.unwrap();
    let code = eventually(Duration::from_secs(120), async || {
        let p = pods.get(name).await.ok()?;
        p.status?
            .container_statuses?
            .first()?
            .state
            .as_ref()?
            .terminated
            .as_ref()
            .map(|t| t.exit_code)
    })
    .await
    .unwrap_or_else(|| panic!("pod {namespace}/{name} did not end within 120s"));
    let log = tb.kubectl_ok(&["logs", "-n", namespace, name]);
    (code, log)
}

/// The mirror's authentication with the real kubelet's projected tokens: the operator alone may
/// ask for downloads, the model's own pod (its namespace's ServiceAccount, a token for the
/// mirror's audience) pulls a gated model and starts, while a pod of another namespace gets 403
/// for the same blob and a pod without a token 401, each saying why. No token reaches the
/// mirror's log.
#[tokio::test]
async fn the_mirror_serves_a_gated_blob_to_its_models_pods_only_with_real_projected_tokens() {
    let tb = Testbed::get();
    real_node(&tb).await;
    let (pull_image, engine_image) = images(&tb);
    tb.install_crd();
    let ns = tb.namespace("mirrorauth");
    tb.kubectl_ok(&[
        "label",
        "namespace",
        &ns.name,
        "pod-security.kubernetes.io/enforce=restricted",
    ]);
    let other = tb.namespace("intruder");

    // A gated model, and its registry token in the model's namespace.
    let hub = FakeHub::with_tiny_llama().await;
    let repo = "acme/TinyLlama-GGUF";
    hub.set_gated(repo, "manual");
    hub.add_token("hf_team_a", &[repo]);
    tb.kubectl_ok(&[
        "create",
        "secret",
        "generic",
        "hf",
        "-n",
        &ns.name,
        "--from-literal=token=hf_team_a",
    ]);

    // The operator runs as ServiceAccount NS/operator, the one the mirror takes downloads from.
    let operator_token = mirror_token(&tb, &ns.name, "operator").await;
    let token_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(token_file.path(), &operator_token).unwrap();
    let gateway = std::fs::read_to_string(node_dir(&tb).join("gateway")).unwrap();
    let mirror = support::MirrorProcess::start_checked_at(
        &tb,
        &hub.url,
        &format!("{}/operator", ns.name),
        gateway.trim(),
    );
    let _op = Operator::start_with(
        &tb,
        &ns.name,
        &hub.url,
        &[
            "--mirror-url",
            &mirror.url,
            "--mirror-token-file",
            &token_file.path().to_string_lossy(),
            "--pull-image",
            &pull_image,
            "--place-grace",
            "20s",
        ],
    );
    let api: Api<ModelServe> = Api::namespaced(tb.client().await, &ns.name);
    let mut spec = spec(repo, &engine_image, None, (1024, 2));
    spec["tokenSecretRef"] = serde_json::json!({"name": "hf"});
    let ms = ModelServe::new("gated", serde_json::from_value(spec).unwrap());
    api.create(&PostParams::default(), &ms).await.unwrap();

    // The model's own pod pulls with its projected token and serves.
    let served = served_on_node(&tb, &ns.name, "gated").await;
    println!(
        "mirror auth: the model's own pod {} pulled the gated blob and serves at {}",
        served.pod, served.address
    );
    let s = api.get("gated").await.unwrap().status.unwrap();
    let resolved = s.resolved.expect("status.resolved");
    let f = &resolved.files[0];
    let file = format!("{}:{}:{}", f.sha256, f.size, f.path);
    let target = (
        mirror.url.as_str(),
        repo,
        resolved.commit.as_str(),
        file.as_str(),
    );

    // A ServiceAccount of another namespace, with a real projected token: 403, saying why.
    let (code, log) = pull_from_node(&tb, &other.name, "stranger", &pull_image, target, true).await;
    println!(
        "mirror auth: another namespace's pod: exit {code}: {}",
        log.trim()
    );
    assert_ne!(code, 0, "{log}");
    assert!(log.contains("HTTP 403"), "{log}");
    assert!(
        log.contains(&format!(
            "no ModelServe in namespace {} has this file in its resolved set",
            other.name
        )),
        "the mirror's reason, whole: {log}"
    );
    // No token at all: 401, saying what to send.
    let (code, log) =
        pull_from_node(&tb, &other.name, "tokenless", &pull_image, target, false).await;
    println!(
        "mirror auth: a pod without a token: exit {code}: {}",
        log.trim()
    );
    assert_ne!(code, 0, "{log}");
    assert!(log.contains("HTTP 401"), "{log}");
    assert!(log.contains("no token"), "{log}");
    // The same pod in the model's namespace reads it: the namespace decides, not the pod.
    let (code, log) = pull_from_node(&tb, &ns.name, "neighbour", &pull_image, target, true).await;
    assert_eq!(code, 0, "a pod of the model's namespace pulls: {log}");

    // Downloads and the live set are the operator's alone.
    let http = reqwest::Client::new();
    let stranger = mirror_token(&tb, &other.name, "default").await;
    let fetch = serde_json::json!({"files": [{
        "repo": repo, "commit": resolved.commit, "path": f.path,
        "sha256": f.sha256, "size": f.size}]});
    for (what, req) in [
        (
            "POST /v1/fetch",
            http.post(format!("{}/v1/fetch", mirror.url)).json(&fetch),
        ),
        (
            "PUT /v1/live",
            http.put(format!("{}/v1/live", mirror.url))
                .json(&serde_json::json!({"sha256": []})),
        ),
    ] {
        let r = req.bearer_auth(&stranger).send().await.unwrap();
        let code = r.status().as_u16();
        let body = r.text().await.unwrap();
        println!("mirror auth: {what} with another namespace's token: {code} {body}");
        assert_eq!(code, 403, "{what}: {body}");
        assert!(
            body.contains("only the operator's ServiceAccount"),
            "{body}"
        );
    }
    let r = http
        .post(format!("{}/v1/fetch", mirror.url))
        .json(&fetch)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 401, "a fetch without a token");

    // The refusals were counted, and no token is in the mirror's log.
    let metrics = http
        .get(format!("{}/metrics", mirror.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for result in ["forbidden", "unauthenticated"] {
        assert!(
            metrics.contains(&format!("refused_requests_total{{result=\"{result}\"}}")),
            "{metrics}"
        );
    }
    let log = mirror.log();
    assert!(
        log.contains("refused a caller"),
        "the mirror logs its refusals"
    );
    for token in [&operator_token, &stranger] {
        assert!(!log.contains(token.as_str()), "a token in the mirror's log");
    }
}

/// What the GPU test adds to the real node (a GPU of the extended resource, GPU Feature
/// Discovery's labels), taken away when it ends however it ends.
struct FakeGpu<'a> {
    tb: &'a Testbed,
}

const GPU_LABELS: [(&str, &str); 4] = [
    ("nvidia.com/gpu.count", "1"),
    ("nvidia.com/gpu.memory", "2048"),
    ("nvidia.com/gpu.product", "NVIDIA-TEST"),
    ("nvidia.com/cuda.driver.major", "12"),
];

/// kubectl's arguments for a JSON `patch` of the real node's status.
fn status_patch(patch: &str) -> [&str; 7] {
    [
        "patch",
        "node",
        NODE,
        "--subresource=status",
        "--type=json",
        "-p",
        patch,
    ]
}

impl<'a> FakeGpu<'a> {
    /// The kubelet keeps an extended resource it has no device plugin for once the node's
    /// status says it has it (how a cluster advertises one by hand), and admits pods asking
    /// for it; it derives the allocatable figure from the capacity.
    fn add(tb: &'a Testbed) -> FakeGpu<'a> {
        let g = FakeGpu { tb };
        let mut label = vec!["label", "node", NODE, "--overwrite"];
        let pairs: Vec<String> = GPU_LABELS.iter().map(|(k, v)| format!("{k}={v}")).collect();
        label.extend(pairs.iter().map(String::as_str));
        tb.kubectl_ok(&label);
        tb.kubectl_ok(&status_patch(
            r#"[{"op":"add","path":"/status/capacity/nvidia.com~1gpu","value":"1"}]"#,
        ));
        // The kubelet's next status update (every 10 s) copies it to allocatable, which the
        // Check stage and the scheduler read.
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        loop {
            let a = tb.kubectl_ok(&[
                "get",
                "node",
                NODE,
                "-o",
                r"jsonpath={.status.allocatable.nvidia\.com/gpu}",
            ]);
            if a.trim() == "1" {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{NODE}'s allocatable has no nvidia.com/gpu 90 s after its capacity had one"
            );
            std::thread::sleep(Duration::from_secs(1));
        }
        g
    }
}

impl Drop for FakeGpu<'_> {
    fn drop(&mut self) {
        // One patch each: a JSON patch removing what is not there fails whole, and the test
        // may end before the kubelet copied the capacity to allocatable.
        for field in ["capacity", "allocatable"] {
            let _ = self.tb.kubectl(&status_patch(&format!(
                r#"[{{"op":"remove","path":"/status/{field}/nvidia.com~1gpu"}}]"#
            )));
        }
        let mut label = vec!["label", "node", NODE];
        let keys: Vec<String> = GPU_LABELS.iter().map(|(k, _)| format!("{k}-")).collect();
        label.extend(keys.iter().map(String::as_str));
        let _ = self.tb.kubectl(&label);
    }
}

/// The failure LLMKube's users meet: a GPU model whose image is a CPU build is Ready and
/// answers, on the CPU, many times slower. Here the real kubelet gives the pod the node's one
/// GPU (an extended resource, as the scheduler and the kubelet count it), the test bed's CPU
/// engine gets `--n-gpu-layers` and has no device for it (its RPC backend is built in, so it
/// still logs the layers as offloaded), and the smoke test reads the engine's log through the
/// API server (the kubelet serves it), finds every weights buffer in host memory, and says so:
/// SmokeTested False, OffloadBelowPlan, with what to check.
#[tokio::test]
async fn a_gpu_model_whose_engine_runs_on_the_cpu_is_not_ready_and_says_why() {
    let tb = Testbed::get();
    real_node(&tb).await;
    let (pull_image, engine_image) = images(&tb);
    tb.install_crd();
    let _gpu = FakeGpu::add(&tb);
    let ns = tb.namespace("realgpu");
    let _serving = serving(&tb, &ns.name, &pull_image, &["--gpu-headroom", "64Mi"]).await;
    let api: Api<ModelServe> = Api::namespaced(tb.client().await, &ns.name);
    let mut spec = spec("acme/TinyLlama-GGUF", &engine_image, None, (1024, 2));
    spec["engine"]["accelerator"] = "cuda".into();
    spec["engine"]["gpus"] = 1.into();
    // llama.cpp logs the layers it offloaded and the weights' buffers at -lv 4 only.
    spec["engine"]["extraArgs"] = serde_json::json!(["-lv", "4"]);
    let ms = ModelServe::new("cpuimage", serde_json::from_value(spec).unwrap());
    api.create(&PostParams::default(), &ms).await.unwrap();
    let s = until(
        &api,
        "cpuimage",
        "SmokeTested",
        |st, r| st == "False" && r == "OffloadBelowPlan",
        300,
    )
    .await;
    let (_, _, message) = condition(&s, "SmokeTested");
    println!("real node: CPU image for a GPU model: SmokeTested False OffloadBelowPlan: {message}");
    let planned = s
        .check
        .as_ref()
        .and_then(|c| c.gpu_layers)
        .expect("check.gpuLayers");
    assert!(
        planned > 0,
        "Check planned the layers on the GPU: {:?}",
        s.check
    );
    assert!(message.contains("no usable GPU"), "{message}");
    assert!(
        message.contains("server-cuda"),
        "it says what to check: {message}"
    );
    assert_eq!(s.smoke.as_ref().and_then(|m| m.gpu_layers), Some(0));
    let (ready, _, _) = condition(&s, "Ready");
    assert_eq!(ready, "False", "not Ready while it runs on the CPU");
    // The pod really had the GPU, by the scheduler's and the kubelet's count.
    let pods: Api<Pod> = Api::namespaced(tb.client().await, &ns.name);
    let pod = model_pod(&pods, "cpuimage").await;
    assert_eq!(pod.spec.as_ref().unwrap().node_name.as_deref(), Some(NODE));
    let spec = pod.spec.unwrap();
    let server = spec
        .containers
        .iter()
        .find(|c| c.name == SERVER_CONTAINER)
        .expect("the server container");
    let limits = server.resources.clone().unwrap().limits.unwrap();
    assert_eq!(limits["nvidia.com/gpu"].0, "1");
}

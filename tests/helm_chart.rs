//! The Helm chart lints, renders objects the real API server accepts, rejects a wrong value by
//! name, installs and uninstalls cleanly, and gives the operator's ServiceAccount exactly the
//! permissions the controller needs — enough to run it, and nothing more.

mod support;

use std::collections::BTreeSet;
use std::process::Output;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use kube::Api;
use kube::api::PostParams;
use modelserve::api::{ModelServe, ModelServeSpec};
use serde::Deserialize;
use serde_json::{Value, json};
use support::fake_hub::{FakeHub, HubFile};
use support::models::Dense;
use support::{Operator, Testbed, eventually, repo_path, start_mirror};

fn chart() -> String {
    repo_path("charts/modelserve")
}

fn both(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn helm(tb: &Testbed, args: &[&str]) -> Output {
    tb.command("helm").args(args).output().expect("run helm")
}

/// `--set` arguments for each value.
fn sets(values: &[String]) -> Vec<&str> {
    values.iter().flat_map(|v| ["--set", v.as_str()]).collect()
}

/// Values other than the defaults in every part of the chart; `watch` and `token_ns` are
/// namespaces.
fn non_default_values(watch: &str, token_ns: &str) -> Vec<String> {
    [
        format!("operator.watchNamespace={watch}"),
        format!("registry.defaultTokenSecret={token_ns}/hf"),
        "logFormat=json".into(),
        "image.repository=registry.example:5000/team/modelserve".into(),
        "image.tag=0.1.0-rc1".into(),
        "image.pullPolicy=Always".into(),
        "imagePullSecrets[0].name=regcred".into(),
        "operator.replicas=0".into(),
        "operator.metricsPort=9100".into(),
        "operator.pullImage=registry.example:5000/team/modelserve-pull@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef".into(),
        "operator.resources.requests.cpu=0.1".into(),
        "operator.nodeSelector.pool=system".into(),
        "operator.tolerations[0].key=dedicated".into(),
        "operator.tolerations[0].operator=Exists".into(),
        "operator.tolerations[0].effect=NoSchedule".into(),
        "engine.image=ghcr.io/ggml-org/llama.cpp:server-cuda-b6500".into(),
        "engine.build=6500".into(),
        "engine.imageCuda=ghcr.io/ggml-org/llama.cpp:server-cuda13-b6500".into(),
        "engine.gpuHeadroom=512Mi".into(),
        "registry.endpoint=https://hub.internal.example/hf".into(),
        "operator.placeGrace=5m".into(),
        "operator.placeTimeout=1h30m".into(),
        "operator.crashRestarts=5".into(),
        "mirror.port=9000".into(),
        "mirror.connections=8".into(),
        "mirror.segmentSize=16Mi".into(),
        "mirror.downloads=3".into(),
        "mirror.storage.size=1.5Ti".into(),
        "mirror.storage.storageClass=fast-ssd".into(),
        "mirror.nodeSelector.disk=ssd".into(),
        "mirror.url=http://10.0.0.5:9000".into(),
        "mirror.hostNetwork=true".into(),
        "operator.hostNetwork=true".into(),
        "operator.apiServer.host=10.0.0.1".into(),
        "operator.apiServer.port=6443".into(),
        "mirror.auth.audience=team-mirror".into(),
        "gateway.replicas=3".into(),
        "gateway.auth=none".into(),
        "gateway.activationTimeout=90s".into(),
        "gateway.upstreamTimeout=30m".into(),
        "gateway.port=8081".into(),
        "gateway.metricsPort=9091".into(),
        "gateway.service.type=LoadBalancer".into(),
        "gateway.service.port=8000".into(),
        "gateway.resources.requests.cpu=0.5".into(),
        "gateway.nodeSelector.pool=edge".into(),
    ]
    .into()
}

/// The rendered documents, as text and parsed.
fn render(tb: &Testbed, namespace: &str, values: &[String]) -> (String, Vec<Value>) {
    let chart = chart();
    let mut args = vec![
        "template",
        "ms",
        &*chart,
        "--namespace",
        namespace,
        "--include-crds",
    ];
    args.extend(sets(values));
    let out = helm(tb, &args);
    assert!(out.status.success(), "helm template: {}", both(&out));
    let rendered = String::from_utf8(out.stdout).unwrap();
    let docs = serde_yaml::Deserializer::from_str(&rendered)
        .filter_map(|d| Option::<Value>::deserialize(d).unwrap())
        .collect();
    (rendered, docs)
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
}

fn env<'a>(container: &'a Value, name: &str) -> Option<&'a str> {
    container["env"]
        .as_array()?
        .iter()
        .find(|e| e["name"] == name)?["value"]
        .as_str()
}

/// Every container of a workload runs hardened, with probes.
fn assert_hardened(workload: &Value) {
    let pod = &workload["spec"]["template"]["spec"];
    let what = workload["metadata"]["name"].clone();
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true, "{what}");
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"], "RuntimeDefault",
        "{what}"
    );
    for c in pod["containers"].as_array().unwrap() {
        let sc = &c["securityContext"];
        assert_eq!(sc["runAsNonRoot"], true, "{what}");
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{what}");
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{what}");
        assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{what}");
        assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{what}");
        assert!(c["livenessProbe"]["httpGet"].is_object(), "{what}");
        assert!(c["readinessProbe"]["httpGet"].is_object(), "{what}");
        assert!(c["resources"]["limits"]["memory"].is_string(), "{what}");
        let mounts: Vec<&str> = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["mountPath"].as_str().unwrap())
            .collect();
        assert!(mounts.contains(&"/tmp"), "{what}: a writable /tmp");
    }
}

#[test]
fn helm_lint_passes() {
    let tb = Testbed::get();
    for values in [vec![], non_default_values("apps", "tokens")] {
        let mut args = vec!["lint", "--strict"];
        let chart = chart();
        args.push(&chart);
        let s = sets(&values);
        args.extend(s);
        let out = helm(&tb, &args);
        assert!(out.status.success(), "{}", both(&out));
    }
}

#[test]
fn rendered_chart_passes_server_side_dry_run() {
    let tb = Testbed::get();
    tb.install_crd();
    let ns = tb.namespace("helm");
    let watched = tb.namespace("helm-w");
    let tokens = tb.namespace("helm-t");
    for values in [
        vec![],
        non_default_values(&watched.name, &tokens.name),
        vec![
            "mirror.enabled=false".into(),
            "registry.token=hf_example".into(),
            format!("operator.watchNamespace={}", watched.name),
        ],
    ] {
        let (rendered, _) = render(&tb, &ns.name, &values);
        assert!(rendered.contains("kind: Deployment") && rendered.contains("kind: ServiceAccount"));
        // Every namespaced object names its namespace (the release's, the watched one, the
        // default token's).
        let applied = tb.kubectl_stdin(&["apply", "--dry-run=server", "-f", "-"], &rendered);
        assert!(
            applied.status.success(),
            "values {values:?}: {}",
            String::from_utf8_lossy(&applied.stderr)
        );
    }
}

#[test]
fn the_operator_and_the_mirror_pass_the_restricted_pod_security_level() {
    let tb = Testbed::get();
    tb.install_crd();
    let ns = tb.namespace("helm-psa");
    tb.kubectl_ok(&[
        "label",
        "namespace",
        &ns.name,
        "pod-security.kubernetes.io/enforce=restricted",
        "pod-security.kubernetes.io/warn=restricted",
    ]);
    // The API server's Pod Security admission checks each workload's pod template and warns
    // about every field the level forbids; the defaults draw no warning.
    let (rendered, _) = render(&tb, &ns.name, &[]);
    let applied = tb.kubectl_stdin(&["apply", "--dry-run=server", "-f", "-"], &rendered);
    let text = both(&applied);
    assert!(applied.status.success(), "{text}");
    assert!(
        !text.contains("PodSecurity"),
        "the chart's pods violate restricted: {text}"
    );
    // hostNetwork (for a cluster whose pods cannot reach its API server) is outside every level
    // but privileged, and admission says so.
    let (rendered, _) = render(&tb, &ns.name, &["operator.hostNetwork=true".into()]);
    let applied = tb.kubectl_stdin(&["apply", "--dry-run=server", "-f", "-"], &rendered);
    assert!(
        both(&applied).contains("would violate PodSecurity \"restricted:latest\": host namespaces"),
        "{}",
        both(&applied)
    );
}

#[test]
fn the_operator_and_the_mirror_run_hardened_and_find_each_other() {
    let tb = Testbed::get();
    let (_, docs) = render(&tb, "ops", &[]);
    let operator = find(&docs, "Deployment", "ms-modelserve");
    let mirror = find(&docs, "StatefulSet", "ms-modelserve-mirror");
    assert_hardened(operator);
    assert_hardened(mirror);

    let c = &operator["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(c["livenessProbe"]["httpGet"]["port"], "metrics");
    assert_eq!(
        env(c, "MODELSERVE_MIRROR_URL"),
        Some("http://ms-modelserve-mirror.ops.svc:8090")
    );
    // The pull init container runs the operator's own image unless told otherwise.
    assert_eq!(c["image"], "ghcr.io/modelserve/modelserve:0.1.0");
    assert_eq!(
        env(c, "MODELSERVE_PULL_IMAGE"),
        Some("ghcr.io/modelserve/modelserve:0.1.0")
    );
    assert_eq!(env(c, "MODELSERVE_WATCH_NAMESPACE"), None);
    assert_eq!(env(c, "MODELSERVE_DEFAULT_TOKEN_SECRET"), None);
    assert_eq!(
        env(c, "KUBERNETES_SERVICE_HOST"),
        None,
        "the in-cluster address"
    );
    assert_eq!(
        operator["spec"]["template"]["spec"]["hostNetwork"],
        Value::Null
    );
    // Two replicas on one Lease in the release namespace, a standby first in a rollout, and a
    // budget that keeps one through a drain.
    assert_eq!(operator["spec"]["replicas"], 2);
    assert_eq!(
        operator["spec"]["strategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 0, "maxSurge": 1}})
    );
    for (name, value) in [
        ("MODELSERVE_LEADER_ELECT", "true"),
        ("MODELSERVE_LEASE_NAME", "ms-modelserve"),
        ("MODELSERVE_LEASE_NAMESPACE", "ops"),
        ("MODELSERVE_LEASE_DURATION", "15s"),
    ] {
        assert_eq!(env(c, name), Some(value), "{name}");
    }
    let spread = &operator["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"];
    assert_eq!(
        spread["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"]["topologyKey"],
        "kubernetes.io/hostname"
    );
    let pdb = find(&docs, "PodDisruptionBudget", "ms-modelserve");
    assert_eq!(pdb["spec"]["minAvailable"], 1);
    assert_eq!(
        pdb["spec"]["selector"], operator["spec"]["selector"],
        "the budget covers the operator's pods"
    );
    let lease_role = find(&docs, "Role", "ms-modelserve-leader");
    assert_eq!(lease_role["metadata"]["namespace"], "ops");
    assert_eq!(
        lease_role["rules"][1]["resourceNames"],
        json!(["ms-modelserve"])
    );

    // The mirror writes only to its volume and /tmp. Its API token is for reviewing callers'
    // tokens (and reading which namespace holds which file); downloads are the operator's alone.
    let pod = &mirror["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], true);
    let m = &pod["containers"][0];
    assert_eq!(env(m, "MODELSERVE_MIRROR_AUTH"), Some("kubernetes"));
    assert_eq!(
        env(m, "MODELSERVE_MIRROR_AUDIENCE"),
        Some("modelserve-mirror")
    );
    assert_eq!(
        env(m, "MODELSERVE_MIRROR_OPERATORS"),
        Some("ops/ms-modelserve")
    );
    let mirror_role = find(&docs, "ClusterRole", "ms-modelserve-mirror");
    assert_eq!(
        mirror_role["rules"],
        json!([
            {"apiGroups": ["authentication.k8s.io"], "resources": ["tokenreviews"], "verbs": ["create"]},
            {"apiGroups": ["modelserve.dev"], "resources": ["modelserves"], "verbs": ["get", "list", "watch"]},
        ])
    );
    // The operator presents a projected token for the mirror's audience.
    assert_eq!(
        env(c, "MODELSERVE_MIRROR_TOKEN_FILE"),
        Some("/var/run/secrets/modelserve/mirror/token")
    );
    let token = operator["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "mirror-token")
        .expect("the operator's mirror token volume");
    assert_eq!(
        token["projected"]["sources"][0]["serviceAccountToken"]["audience"],
        "modelserve-mirror"
    );

    // The gateway: hardened, two replicas apart with a budget, behind a Service.
    let gateway = find(&docs, "Deployment", "ms-modelserve-gateway");
    assert_hardened(gateway);
    assert_eq!(gateway["spec"]["replicas"], 2);
    let g = &gateway["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(g["args"][0], "gateway");
    assert_eq!(env(g, "MODELSERVE_GATEWAY_AUTH"), Some("keys"));
    assert_eq!(env(g, "MODELSERVE_GATEWAY_KEYS_NAMESPACE"), Some("ops"));
    assert_eq!(g["readinessProbe"]["httpGet"]["path"], "/readyz");
    let gsvc = find(&docs, "Service", "ms-modelserve-gateway");
    assert_eq!(gsvc["spec"]["ports"][0]["port"], 80);
    assert_eq!(gsvc["spec"]["ports"][0]["targetPort"], "http");
    let gpdb = find(&docs, "PodDisruptionBudget", "ms-modelserve-gateway");
    assert_eq!(gpdb["spec"]["selector"], gateway["spec"]["selector"]);
    assert_eq!(env(m, "MODELSERVE_MIRROR_DIR"), Some("/store"));
    assert!(
        m["volumeMounts"]
            .as_array()
            .unwrap()
            .contains(&json!({"name": "store", "mountPath": "/store"}))
    );
    assert_eq!(
        mirror["spec"]["volumeClaimTemplates"][0]["metadata"]["name"],
        "store"
    );
    assert_eq!(
        mirror["spec"]["volumeClaimTemplates"][0]["spec"]["resources"]["requests"]["storage"],
        "200Gi"
    );
    let svc = find(&docs, "Service", "ms-modelserve-mirror");
    assert_eq!(svc["spec"]["ports"][0]["port"], 8090);

    // Only the operator and model replicas reach the mirror, on its port.
    let np = find(&docs, "NetworkPolicy", "ms-modelserve-mirror");
    let from = &np["spec"]["ingress"][0]["from"];
    assert_eq!(
        from[0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"],
        "controller"
    );
    assert_eq!(
        from[1]["podSelector"]["matchLabels"],
        json!({"app.kubernetes.io/managed-by": "modelserve"})
    );
    assert_eq!(from.as_array().unwrap().len(), 2);
    assert_eq!(
        np["spec"]["ingress"][0]["ports"],
        json!([{"port": 8090, "protocol": "TCP"}])
    );

    // Non-default values reach the objects.
    let (_, docs) = render(&tb, "ops", &non_default_values("apps", "tokens"));
    let operator = find(&docs, "Deployment", "ms-modelserve");
    let c = &operator["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(operator["spec"]["replicas"], 0);
    assert_eq!(
        c["image"],
        "registry.example:5000/team/modelserve:0.1.0-rc1"
    );
    assert_eq!(
        c["args"],
        json!(["controller", "--log-format=json"]),
        "log format"
    );
    for (name, value) in [
        ("MODELSERVE_MIRROR_URL", "http://10.0.0.5:9000"),
        ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
        ("KUBERNETES_SERVICE_PORT", "6443"),
        ("MODELSERVE_WATCH_NAMESPACE", "apps"),
        ("MODELSERVE_DEFAULT_TOKEN_SECRET", "tokens/hf"),
        (
            "MODELSERVE_ENGINE_IMAGE",
            "ghcr.io/ggml-org/llama.cpp:server-cuda-b6500",
        ),
        ("MODELSERVE_ENGINE_BUILD", "6500"),
        (
            "MODELSERVE_ENGINE_IMAGE_CUDA",
            "ghcr.io/ggml-org/llama.cpp:server-cuda13-b6500",
        ),
        ("MODELSERVE_GPU_HEADROOM", "512Mi"),
        (
            "MODELSERVE_REGISTRY_ENDPOINT",
            "https://hub.internal.example/hf",
        ),
        ("MODELSERVE_METRICS_ADDR", "0.0.0.0:9100"),
        ("MODELSERVE_PLACE_GRACE", "5m"),
        ("MODELSERVE_PLACE_TIMEOUT", "1h30m"),
        ("MODELSERVE_CRASH_RESTARTS", "5"),
        (
            "MODELSERVE_PULL_IMAGE",
            "registry.example:5000/team/modelserve-pull@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        ),
    ] {
        assert_eq!(env(c, name), Some(value), "{name}");
    }
    assert_eq!(operator["spec"]["template"]["spec"]["hostNetwork"], true);
    assert_eq!(
        operator["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
            [0]["topologyKey"],
        "kubernetes.io/hostname",
        "two replicas on the node's network never share a node (and its metrics port)"
    );
    assert!(
        !docs
            .iter()
            .any(|d| d["kind"] == "PodDisruptionBudget" && d["metadata"]["name"] == "ms-modelserve"),
        "no budget for 0 operator replicas"
    );
    let gateway = find(&docs, "Deployment", "ms-modelserve-gateway");
    assert_eq!(gateway["spec"]["replicas"], 3);
    let g = &gateway["spec"]["template"]["spec"]["containers"][0];
    for (name, value) in [
        ("MODELSERVE_GATEWAY_AUTH", "none"),
        ("MODELSERVE_GATEWAY_ACTIVATION_TIMEOUT", "90s"),
        ("MODELSERVE_GATEWAY_UPSTREAM_TIMEOUT", "30m"),
        ("MODELSERVE_GATEWAY_ADDR", "0.0.0.0:8081"),
        ("MODELSERVE_GATEWAY_METRICS_ADDR", "0.0.0.0:9091"),
        ("MODELSERVE_WATCH_NAMESPACE", "apps"),
        ("KUBERNETES_SERVICE_HOST", "10.0.0.1"),
    ] {
        assert_eq!(env(g, name), Some(value), "gateway {name}");
    }
    assert_eq!(g["resources"]["requests"]["cpu"], "0.5");
    assert_eq!(
        gateway["spec"]["template"]["spec"]["nodeSelector"],
        json!({"pool": "edge"})
    );
    let gsvc = find(&docs, "Service", "ms-modelserve-gateway");
    assert_eq!(gsvc["spec"]["type"], "LoadBalancer");
    assert_eq!(gsvc["spec"]["ports"][0]["port"], 8000);
    let grole = find(&docs, "Role", "ms-modelserve-gateway");
    assert_eq!(grole["metadata"]["namespace"], "apps");
    let mirror = find(&docs, "StatefulSet", "ms-modelserve-mirror");
    assert_eq!(mirror["spec"]["template"]["spec"]["hostNetwork"], true);
    let m = &mirror["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(env(m, "MODELSERVE_MIRROR_ADDR"), Some("0.0.0.0:9000"));
    assert_eq!(env(m, "MODELSERVE_MIRROR_CONNECTIONS"), Some("8"));
    assert_eq!(env(m, "MODELSERVE_MIRROR_SEGMENT"), Some("16Mi"));
    assert_eq!(env(m, "MODELSERVE_MIRROR_DOWNLOADS"), Some("3"));
    assert_eq!(
        env(m, "MODELSERVE_REGISTRY_ENDPOINT"),
        Some("https://hub.internal.example/hf")
    );
    let claim = &mirror["spec"]["volumeClaimTemplates"][0]["spec"];
    assert_eq!(claim["storageClassName"], "fast-ssd");
    assert_eq!(claim["resources"]["requests"]["storage"], "1.5Ti");
    let np = find(&docs, "NetworkPolicy", "ms-modelserve-mirror");
    assert_eq!(
        np["spec"]["ingress"][0]["from"][1]["namespaceSelector"]["matchLabels"],
        json!({"kubernetes.io/metadata.name": "apps"}),
        "replicas live in the watched namespace only"
    );

    // One operator without leader election: replaced with Recreate, no Lease, no budget.
    let (_, docs) = render(
        &tb,
        "ops",
        &[
            "operator.replicas=1".into(),
            "operator.leaderElection.enabled=false".into(),
        ],
    );
    let operator = find(&docs, "Deployment", "ms-modelserve");
    assert_eq!(operator["spec"]["strategy"], json!({"type": "Recreate"}));
    let c = &operator["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(env(c, "MODELSERVE_LEADER_ELECT"), Some("false"));
    assert_eq!(env(c, "MODELSERVE_LEASE_NAME"), None);
    assert!(!docs.iter().any(|d| (d["kind"] == "PodDisruptionBudget"
        && d["metadata"]["name"] == "ms-modelserve")
        || d["metadata"]["name"] == "ms-modelserve-leader"));

    // The gateway switched off: nothing of it is installed.
    let (_, docs) = render(&tb, "ops", &["gateway.enabled=false".into()]);
    assert!(
        !docs.iter().any(|d| d["metadata"]["name"]
            .as_str()
            .is_some_and(|n| n.starts_with("ms-modelserve-gateway"))),
        "gateway.enabled=false"
    );

    // A mirror outside the chart: the operator is told where, and no mirror is installed.
    let (_, docs) = render(
        &tb,
        "ops",
        &[
            "mirror.enabled=false".into(),
            "mirror.url=https://models.internal.example".into(),
        ],
    );
    let c =
        &find(&docs, "Deployment", "ms-modelserve")["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        env(c, "MODELSERVE_MIRROR_URL"),
        Some("https://models.internal.example")
    );
    assert!(!docs.iter().any(|d| d["kind"] == "StatefulSet"));

    // registry.token becomes a Secret of the chart, used as the default.
    let (_, docs) = render(&tb, "ops", &["registry.token=hf_abc".into()]);
    let secret = find(&docs, "Secret", "ms-modelserve-registry-token");
    assert_eq!(secret["stringData"]["token"], "hf_abc");
    let c =
        &find(&docs, "Deployment", "ms-modelserve")["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        env(c, "MODELSERVE_DEFAULT_TOKEN_SECRET"),
        Some("ops/ms-modelserve-registry-token")
    );
}

#[test]
fn wrong_values_are_rejected_with_a_message_naming_the_value() {
    let tb = Testbed::get();
    for (value, expected) in [
        (
            "mirror.storage.size=5",
            "at '/mirror/storage/size': got number, want string",
        ),
        (
            "mirror.storage.size=200GB",
            "at '/mirror/storage/size': '200GB' does not match pattern",
        ),
        (
            "operator.replicas=abc",
            "at '/operator/replicas': got string, want integer",
        ),
        (
            "operator.replicas=9",
            "at '/operator/replicas': maximum: got 9, want 5",
        ),
        (
            "operator.replicas=2,operator.leaderElection.enabled=false",
            "operator.replicas: 2 replicas need operator.leaderElection.enabled=true",
        ),
        (
            "operator.leaderElection.leaseDuration=15",
            "at '/operator/leaderElection/leaseDuration': got number, want string",
        ),
        (
            "operator.placeGrace=1d",
            "at '/operator/placeGrace': '1d' does not match pattern",
        ),
        (
            "mirror.connections=100",
            "at '/mirror/connections': maximum: got 100, want 64",
        ),
        (
            "logFormat=xml",
            "at '/logFormat': value must be one of 'human', 'json'",
        ),
        (
            "operator.replica=1",
            "at '/operator': additional properties 'replica' not allowed",
        ),
        (
            "engine.image=ghcr.io/ggml-org/llama.cpp:server b6500",
            "at '/engine/image': 'ghcr.io/ggml-org/llama.cpp:server b6500' does not match pattern",
        ),
        (
            "registry.endpoint=huggingface.co",
            "at '/registry/endpoint': 'huggingface.co' does not match pattern",
        ),
        (
            "mirror.url=mirror:8090",
            "at '/mirror/url': 'mirror:8090' does not match pattern",
        ),
        (
            "operator.watchNamespace=Team_A",
            "at '/operator/watchNamespace': 'Team_A' does not match pattern",
        ),
    ] {
        let out = helm(&tb, &["template", "ms", &chart(), "--set", value]);
        let text = both(&out);
        assert!(!out.status.success(), "{value} was accepted");
        assert!(text.contains(expected), "{value}: {text}");
    }
    let out = helm(
        &tb,
        &[
            "template",
            "ms",
            &chart(),
            "--set",
            "registry.token=hf_abc",
            "--set",
            "registry.defaultTokenSecret=ns/hf",
        ],
    );
    assert!(!out.status.success());
    assert!(
        both(&out).contains(
            "registry.token and registry.defaultTokenSecret both name the default token: set one of them"
        ),
        "{}",
        both(&out)
    );
}

/// A chart release in a namespace of its own; uninstalled and deleted when dropped.
struct Release<'a> {
    tb: &'a Testbed,
    name: String,
    namespace: String,
    /// The release's object name prefix.
    fullname: String,
}

impl<'a> Release<'a> {
    /// `helm install` into a fresh namespace; the CRD comes from crds/ unless already installed.
    fn install(tb: &'a Testbed, values: &[String]) -> Release<'a> {
        static N: AtomicU32 = AtomicU32::new(0);
        let n = N.fetch_add(1, Ordering::Relaxed);
        let name = format!("hc{}-{n}", std::process::id());
        let namespace = format!("helm-r-{}-{n}", std::process::id());
        let crd_present = tb
            .kubectl(&["get", "crd", "modelserves.modelserve.dev"])
            .status
            .success();
        let chart = chart();
        let mut args = vec![
            "install",
            &*name,
            &*chart,
            "--namespace",
            &*namespace,
            "--create-namespace",
        ];
        if crd_present {
            args.push("--skip-crds");
        }
        args.extend(sets(values));
        let out = helm(tb, &args);
        let release = Release {
            tb,
            fullname: format!("{name}-modelserve"),
            name,
            namespace,
        };
        assert!(out.status.success(), "helm install: {}", both(&out));
        assert!(
            both(&out).contains("STATUS: deployed"),
            "helm install: {}",
            both(&out)
        );
        release
    }

    fn service_account(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.fullname)
    }

    /// Whether `kubectl get` finds the object.
    fn exists(&self, namespace: Option<&str>, kind: &str, name: &str) -> bool {
        let mut args = vec!["get", kind, name];
        if let Some(ns) = namespace {
            args.extend(["-n", ns]);
        }
        self.tb.kubectl(&args).status.success()
    }

    fn uninstall(&self) -> Output {
        helm(
            self.tb,
            &[
                "uninstall",
                &self.name,
                "--namespace",
                &self.namespace,
                "--wait",
                "--timeout=60s",
            ],
        )
    }
}

impl Drop for Release<'_> {
    fn drop(&mut self) {
        let _ = self.uninstall();
        let _ = self
            .tb
            .kubectl(&["delete", "namespace", &self.namespace, "--wait=false"]);
    }
}

/// What `kubectl auth can-i --list` grants `user` in `namespace`, one normalized line per rule
/// ("resource [names] [verbs]", verbs sorted).
fn granted(tb: &Testbed, namespace: &str, user: &str) -> BTreeSet<String> {
    let out = tb.kubectl_ok(&[
        "auth",
        "can-i",
        "--list",
        "--no-headers",
        "-n",
        namespace,
        &format!("--as={user}"),
    ]);
    out.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let resource = if l.starts_with(char::is_whitespace) {
                ""
            } else {
                l.split_whitespace().next().unwrap_or_default()
            };
            let groups: Vec<String> = l
                .split('[')
                .skip(1)
                .map(|g| {
                    let mut words: Vec<&str> = g
                        .split(']')
                        .next()
                        .unwrap_or_default()
                        .split_whitespace()
                        .collect();
                    words.sort();
                    format!("[{}]", words.join(" "))
                })
                .collect();
            match resource {
                // Non-resource URLs: [urls] [] [verbs].
                "" => groups.join(" "),
                // Resources: [] [names] [verbs].
                r => format!(
                    "{r} {}",
                    groups.iter().skip(1).cloned().collect::<Vec<_>>().join(" ")
                ),
            }
        })
        .collect()
}

/// What the chart grants the operator in `namespace`: its rules there minus what every
/// ServiceAccount of its namespace has anyway (discovery, self reviews).
fn chart_grants(release: &Release, namespace: &str) -> BTreeSet<String> {
    let baseline = granted(
        release.tb,
        namespace,
        &format!("system:serviceaccount:{}:nobody", release.namespace),
    );
    granted(release.tb, namespace, &release.service_account())
        .difference(&baseline)
        .cloned()
        .collect()
}

/// What the chart grants `user` in `namespace`, less what every ServiceAccount has anyway.
fn grants_of(release: &Release, namespace: &str, user: &str) -> BTreeSet<String> {
    let baseline = granted(
        release.tb,
        namespace,
        &format!("system:serviceaccount:{}:nobody", release.namespace),
    );
    granted(release.tb, namespace, user)
        .difference(&baseline)
        .cloned()
        .collect()
}

/// The gateway's rules on namespaced resources.
const GATEWAY_RULES: [&str; 6] = [
    "modelserves.modelserve.dev [] [get list watch]",
    "modelserves.modelserve.dev/scale [] [get patch]",
    "modelserves.modelserve.dev/status [] [patch]",
    "pods [] [list watch]",
    "secrets [] [list watch]",
    "events.events.k8s.io [] [create]",
];

/// `kubectl auth can-i` as the operator; `resource` is `RESOURCE[/NAME][:SUBRESOURCE]`.
fn can_i(release: &Release, namespace: &str, verb: &str, resource: &str) -> bool {
    let (resource, sub) = resource.split_once(':').unwrap_or((resource, ""));
    let subresource = format!("--subresource={sub}");
    let mut args = vec!["auth", "can-i", verb, resource, "-n", namespace];
    if !sub.is_empty() {
        args.push(&subresource);
    }
    let user = format!("--as={}", release.service_account());
    args.push(&user);
    let out = release.tb.kubectl(&args);
    String::from_utf8_lossy(&out.stdout).trim() == "yes"
}

fn set(lines: &[&str]) -> BTreeSet<String> {
    lines.iter().map(|s| s.to_string()).collect()
}

/// The controller's rules on namespaced resources.
const NAMESPACED_RULES: [&str; 9] = [
    "modelserves.modelserve.dev [] [get list patch update watch]",
    "modelserves.modelserve.dev/status [] [get patch update]",
    "events.events.k8s.io [] [create]",
    "secrets [] [create get list patch watch]",
    "services [] [create get list patch watch]",
    "deployments.apps [] [create get list patch watch]",
    "replicasets.apps [] [list watch]",
    "pods [] [get list watch]",
    "pods/log [] [get]",
];
const NODES_RULE: &str = "nodes [] [list watch]";

/// The leader-election rules, in the release namespace: create any Lease, get and patch its own.
fn lease_rules(fullname: &str) -> [String; 2] {
    [
        "leases.coordination.k8s.io [] [create]".into(),
        format!("leases.coordination.k8s.io [{fullname}] [get patch]"),
    ]
}

/// Least privilege in any case: no wildcard, no delete, no changing Secrets it does not make (the
/// operator watches only its own engine-key Secrets, by label; RBAC cannot say so), no node or
/// pod changes, no scaling users' ModelServes.
fn assert_nothing_broad(release: &Release, namespace: &str) {
    for (verb, resource) in [
        ("*", "*"),
        ("delete", "pods"),
        ("create", "pods"),
        ("patch", "pods"),
        ("delete", "secrets"),
        ("update", "secrets"),
        ("delete", "deployments.apps"),
        ("patch", "replicasets.apps"),
        ("delete", "services"),
        ("create", "modelserves.modelserve.dev"),
        ("delete", "modelserves.modelserve.dev"),
        ("patch", "modelserves.modelserve.dev:scale"),
        ("update", "modelserves.modelserve.dev:scale"),
        ("get", "nodes"),
        ("patch", "nodes"),
        ("create", "pods:exec"),
        ("get", "configmaps"),
    ] {
        assert!(
            !can_i(release, namespace, verb, resource),
            "the operator may {verb} {resource} in {namespace}"
        );
    }
}

#[test]
fn helm_install_creates_the_objects_and_uninstall_removes_them() {
    let tb = Testbed::get();
    tb.install_crd();
    let release = Release::install(
        &tb,
        &[
            "mirror.storage.size=1Gi".into(),
            "mirror.storage.storageClass=standard".into(),
        ],
    );
    let (ns, full) = (release.namespace.as_str(), release.fullname.as_str());
    let mirror = format!("{full}-mirror");
    let gateway = format!("{full}-gateway");
    for (namespace, kind, name) in [
        (Some(ns), "deployment", full),
        (Some(ns), "serviceaccount", full),
        (Some(ns), "serviceaccount", &*mirror),
        (Some(ns), "statefulset", &*mirror),
        (Some(ns), "service", &*mirror),
        (Some(ns), "networkpolicy", &*mirror),
        (Some(ns), "poddisruptionbudget", full),
        (Some(ns), "role", &format!("{full}-leader")),
        (None, "clusterrole", full),
        (None, "clusterrolebinding", full),
        (None, "clusterrole", &format!("{full}-nodes")),
        (None, "clusterrolebinding", &format!("{full}-nodes")),
        (None, "clusterrole", &*mirror),
        (None, "clusterrolebinding", &*mirror),
        (Some(ns), "deployment", &*gateway),
        (Some(ns), "service", &*gateway),
        (Some(ns), "serviceaccount", &*gateway),
        (Some(ns), "poddisruptionbudget", &*gateway),
        (Some(ns), "role", &format!("{gateway}-keys")),
        (None, "clusterrole", &*gateway),
        (None, "clusterrolebinding", &*gateway),
    ] {
        assert!(
            release.exists(namespace, kind, name),
            "{kind} {name} was not installed"
        );
    }
    // The operator's pod passes admission and scheduling and becomes available (kwok runs it).
    let rollout = tb.kubectl(&[
        "rollout",
        "status",
        "-n",
        ns,
        &format!("deployment/{full}"),
        "--timeout=60s",
    ]);
    assert!(rollout.status.success(), "{}", both(&rollout));
    // The mirror's volume is claimed with the size and class asked for.
    let claim = format!("store-{mirror}-0");
    let pvc = eventually_sync(Duration::from_secs(30), || {
        let out = tb.kubectl(&["get", "pvc", &claim, "-n", ns, "-o", "json"]);
        out.status
            .success()
            .then(|| serde_json::from_slice::<Value>(&out.stdout).unwrap())
    })
    .unwrap_or_else(|| panic!("PVC {claim} was not created"));
    assert_eq!(pvc["spec"]["storageClassName"], "standard");
    assert_eq!(pvc["spec"]["resources"]["requests"]["storage"], "1Gi");

    // Cluster-wide: the same rules in every namespace; the smoke test calls pod IPs, so no
    // port-forward.
    let mut expected = set(&NAMESPACED_RULES);
    expected.insert(NODES_RULE.into());
    assert!(!can_i(&release, "default", "create", "pods:portforward"));
    assert!(can_i(
        &release,
        "default",
        "patch",
        "modelserves.modelserve.dev:status"
    ));
    assert_eq!(chart_grants(&release, "default"), expected);
    expected.extend(lease_rules(full));
    assert_eq!(chart_grants(&release, ns), expected, "in {ns}");
    for namespace in [ns, "default"] {
        assert_nothing_broad(&release, namespace);
    }
    // The gateway reads models, pods and keys, scales models and records their request times;
    // its own keys only in the release namespace.
    let gateway_user = format!("system:serviceaccount:{ns}:{gateway}");
    let mut gateway_rules = set(&GATEWAY_RULES);
    assert_eq!(grants_of(&release, "default", &gateway_user), gateway_rules);
    gateway_rules.insert("secrets [] [list watch]".into());
    assert_eq!(grants_of(&release, ns, &gateway_user), gateway_rules);
    // Two operator pods (kwok plays their kubelet, so neither really runs here; tests/leader.rs
    // runs two operators for real), and a budget that lets a drain take one of them.
    let pods = tb.kubectl_ok(&[
        "get",
        "pods",
        "-n",
        ns,
        "-l",
        "app.kubernetes.io/component=controller",
        "-o",
        "name",
    ]);
    assert_eq!(pods.lines().count(), 2, "{pods}");
    let pdb = eventually_sync(Duration::from_secs(30), || {
        let out = tb.kubectl_ok(&[
            "get",
            "pdb",
            full,
            "-n",
            ns,
            "-o",
            "jsonpath={.status.disruptionsAllowed}",
        ]);
        (out.trim() == "1").then_some(out)
    });
    assert!(
        pdb.is_some(),
        "one of two operators may be evicted at a time"
    );

    let out = release.uninstall();
    assert!(out.status.success(), "helm uninstall: {}", both(&out));
    for (namespace, kind, name) in [
        (Some(ns), "deployment", full),
        (Some(ns), "statefulset", &*mirror),
        (None, "clusterrole", full),
        (None, "clusterrolebinding", &format!("{full}-nodes")),
    ] {
        assert!(
            !release.exists(namespace, kind, name),
            "{kind} {name} outlived helm uninstall"
        );
    }
    assert!(chart_grants(&release, ns).is_empty());
}

/// Polls a blocking check.
fn eventually_sync<T>(timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if std::time::Instant::now() > deadline {
            return None;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

#[tokio::test]
async fn one_namespace_install_grants_exactly_the_controllers_rules_and_they_suffice() {
    let tb = Testbed::get();
    tb.install_crd();
    let watched = tb.namespace("helm-w");
    let tokens = tb.namespace("helm-t");
    let release = Release::install(
        &tb,
        &[
            format!("operator.watchNamespace={}", watched.name),
            format!("registry.defaultTokenSecret={}/hf", tokens.name),
        ],
    );
    for (namespace, kind, name) in [
        (&*watched.name, "role", release.fullname.clone()),
        (&*watched.name, "rolebinding", release.fullname.clone()),
        (
            &*tokens.name,
            "role",
            format!("{}-default-token", release.fullname),
        ),
    ] {
        assert!(
            release.exists(Some(namespace), kind, &name),
            "{kind} {name} in {namespace}"
        );
    }
    assert!(!release.exists(None, "clusterrole", &release.fullname));

    // The watched namespace: the controller's rules, no port-forward (off by default).
    let mut expected = set(&NAMESPACED_RULES);
    expected.insert(NODES_RULE.into());
    assert_eq!(chart_grants(&release, &watched.name), expected);
    // The default token's namespace: that one Secret, read only.
    assert_eq!(
        chart_grants(&release, &tokens.name),
        set(&["secrets [hf] [get]", NODES_RULE])
    );
    // The release's own namespace: its Lease; anywhere else: nodes only.
    let mut own = set(&[NODES_RULE]);
    own.extend(lease_rules(&release.fullname));
    assert_eq!(chart_grants(&release, &release.namespace), own);
    assert_eq!(chart_grants(&release, "default"), set(&[NODES_RULE]));
    for namespace in [&*watched.name, &*tokens.name, &*release.namespace] {
        assert_nothing_broad(&release, namespace);
    }
    assert!(!can_i(
        &release,
        &watched.name,
        "create",
        "pods:portforward"
    ));
    assert!(can_i(&release, &tokens.name, "get", "secrets/hf"));
    assert!(!can_i(&release, &tokens.name, "get", "secrets/other"));

    // Enough: the operator, with this ServiceAccount's token, takes a gated model through
    // Resolve (the default token), Check (nodes), Mirror, Catalog (Secret, Service, Deployment)
    // and Place (ReplicaSets, pods), recording Events, without a single Forbidden.
    let hub = FakeHub::start().await;
    hub.add_repo(
        "acme/Gated-GGUF",
        vec![HubFile::with_bytes(
            "tiny-Q4_K_M.gguf",
            Dense::tiny("llama").gguf(),
        )],
    );
    hub.set_gated("acme/Gated-GGUF", "auto");
    hub.add_token("hf_chart_token", &["acme/Gated-GGUF"]);
    tb.kubectl_ok(&[
        "create",
        "secret",
        "generic",
        "hf",
        "-n",
        &tokens.name,
        "--from-literal=token=hf_chart_token",
    ]);
    let token = tb.kubectl_ok(&[
        "create",
        "token",
        &release.fullname,
        "-n",
        &release.namespace,
        "--duration=1h",
    ]);
    let admin: Value = serde_json::from_str(
        &tb.kubectl_ok(&["config", "view", "--minify", "--raw", "-o", "json"]),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "testbed", "cluster": admin["clusters"][0]["cluster"]}],
            "users": [{"name": "operator", "user": {"token": token.trim()}}],
            "contexts": [{"name": "operator", "context": {"cluster": "testbed", "user": "operator"}}],
            "current-context": "operator",
        })
        .to_string(),
    )
    .unwrap();
    let as_operator = Testbed {
        kubeconfig,
        bin: tb.bin.clone(),
    };
    let (mirror_url, _store) = start_mirror(&hub.url).await;
    let default_token = format!("{}/hf", tokens.name);
    let _op = Operator::start_with(
        &as_operator,
        &watched.name,
        &hub.url,
        &[
            "--mirror-url",
            &mirror_url,
            "--default-token-secret",
            &default_token,
            // As the chart's Deployment sets it: the Lease lives in the release namespace.
            "--lease-name",
            &release.fullname,
            "--lease-namespace",
            &release.namespace,
        ],
    );
    let api: Api<ModelServe> = Api::namespaced(tb.client().await, &watched.name);
    let spec: ModelServeSpec = serde_json::from_value(
        json!({"repo": "acme/Gated-GGUF", "contextSize": 4096, "contextLength": 4096}),
    )
    .unwrap();
    api.create(&PostParams::default(), &ModelServe::new("tiny", spec))
        .await
        .unwrap();
    let cataloged = eventually(Duration::from_secs(60), async || {
        let s = api.get("tiny").await.ok()?.status?;
        let c = s.conditions.iter().find(|c| c.type_ == "Cataloged")?;
        (c.status == "True").then_some(s)
    })
    .await;
    let status = api.get("tiny").await.unwrap().status;
    assert!(cataloged.is_some(), "not cataloged: {status:#?}");
    // The Place stage finds the ready replica (kwok plays the kubelet) from the Deployment, its
    // ReplicaSets and pods; a version without it says NotImplemented.
    let placed = eventually(Duration::from_secs(60), async || {
        let s = api.get("tiny").await.ok()?.status?;
        let c = s.conditions.iter().find(|c| c.type_ == "Placed")?;
        (c.status == "True" || c.reason == "NotImplemented").then_some(s)
    })
    .await;
    let status = api.get("tiny").await.unwrap().status;
    assert!(placed.is_some(), "not placed: {status:#?}");
    for c in &status.unwrap().conditions {
        assert!(
            !c.message.to_lowercase().contains("forbidden"),
            "{}: {}",
            c.type_,
            c.message
        );
    }
    for (kind, name) in [
        ("secret", "tiny-engine-key"),
        ("service", "tiny"),
        ("deployment", "tiny"),
    ] {
        assert!(
            release.exists(Some(&watched.name), kind, name),
            "the operator did not create {kind} {name}"
        );
    }
    let events: Value = serde_json::from_str(&tb.kubectl_ok(&[
        "get",
        "events.events.k8s.io",
        "-n",
        &watched.name,
        "-o",
        "json",
    ]))
    .unwrap();
    let recorded = events["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| {
            e["reportingController"] == "modelserve-controller" && e["regarding"]["name"] == "tiny"
        })
        .count();
    assert!(recorded > 0, "no Events recorded: {events:#}");
}

/// Every sample name the operator and the mirror export: from each registered family's TYPE
/// line, with the suffixes its type gives its samples.
fn exported_metric_names() -> BTreeSet<String> {
    use modelserve::telemetry::{ReasonLabel, ResultLabel, RetryLabel, StageLabel};
    // A family is exported once it has a sample: give each one, as a running binary would.
    let op = modelserve::telemetry::Metrics::default();
    let label = |s: &str| s.to_string();
    op.reconciles
        .get_or_create(&ResultLabel {
            result: label("ok"),
        })
        .inc();
    op.errors
        .get_or_create(&ReasonLabel { reason: label("x") })
        .inc();
    op.transitions
        .get_or_create(&StageLabel { stage: label("x") })
        .inc();
    op.stage_seconds
        .get_or_create(&StageLabel { stage: label("x") })
        .observe(1.0);
    op.retries
        .get_or_create(&RetryLabel {
            stage: label("x"),
            reason: label("x"),
        })
        .inc();
    op.api_requests
        .get_or_create(&modelserve::telemetry::requests::RequestLabel {
            verb: label("get"),
            resource: label("pods"),
        })
        .inc();
    op.set_models(["Ready"]);
    let mirror = modelserve::mirror::metrics::Metrics::default();
    mirror.file("downloaded");
    mirror.failure("size");
    mirror.evicted("grace", 1);
    mirror.refused("forbidden");
    let gateway = modelserve::gateway::metrics::Metrics::default();
    let model = modelserve::gateway::metrics::ModelLabel {
        namespace: label("ns"),
        model: label("m"),
    };
    gateway
        .requests
        .get_or_create(&modelserve::gateway::metrics::CodeLabel {
            namespace: label("ns"),
            model: label("m"),
            code: label("200"),
        })
        .inc();
    gateway.first_byte.get_or_create(&model).observe(0.1);
    gateway.in_flight.get_or_create(&model).inc();
    gateway
        .activations
        .get_or_create(&modelserve::gateway::metrics::ResultLabel {
            namespace: label("ns"),
            model: label("m"),
            result: label("ready"),
        })
        .inc();
    gateway
        .activation_seconds
        .get_or_create(&model)
        .observe(1.0);
    gateway.scale_downs.get_or_create(&model).inc();
    let text = op.encode() + &mirror.encode() + &gateway.encode();
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else {
            continue;
        };
        let (name, kind) = rest.split_once(' ').unwrap();
        match kind {
            "counter" => {
                names.insert(format!("{name}_total"));
            }
            "histogram" => {
                for s in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{s}"));
                }
            }
            _ => {
                names.insert(name.to_string());
            }
        }
    }
    names
}

/// The `modelserve_...` names a PromQL expression uses.
fn metric_names_in(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("modelserve_") {
        let name: String = rest[at..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        rest = &rest[at + name.len()..];
        out.push(name);
    }
    out
}

#[test]
fn the_monitoring_objects_use_only_metrics_the_binaries_export() {
    let tb = Testbed::get();
    let (_, docs) = render(
        &tb,
        "ops",
        &[
            "monitoring.serviceMonitor.enabled=true".into(),
            "monitoring.prometheusRule.enabled=true".into(),
            "monitoring.grafanaDashboard.enabled=true".into(),
            "monitoring.serviceMonitor.labels.release=prom".into(),
        ],
    );
    let exported = exported_metric_names();
    assert!(exported.contains("modelserve_leader"), "{exported:?}");
    assert!(
        exported.contains("modelserve_mirror_evictions_total"),
        "{exported:?}"
    );

    let rule = find(&docs, "PrometheusRule", "ms-modelserve");
    let rules = rule["spec"]["groups"][0]["rules"].as_array().unwrap();
    let alerts: Vec<&str> = rules.iter().map(|r| r["alert"].as_str().unwrap()).collect();
    assert_eq!(
        alerts,
        [
            "ModelServeNotReady",
            "ModelServeReconcileErrors",
            "ModelServeMirrorVolumeNearlyFull",
            "ModelServeActivationsFailing",
            "ModelServeOperatorNotLeading"
        ]
    );
    let mut exprs: Vec<String> = rules
        .iter()
        .map(|r| r["expr"].as_str().unwrap().to_string())
        .collect();
    let dashboard = find(&docs, "ConfigMap", "ms-modelserve-dashboard");
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
    let board: Value =
        serde_json::from_str(dashboard["data"]["modelserve.json"].as_str().unwrap()).unwrap();
    for panel in board["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            exprs.push(target["expr"].as_str().unwrap().to_string());
        }
    }
    let mut used = 0;
    for expr in &exprs {
        let names = metric_names_in(expr);
        assert!(!names.is_empty(), "{expr} uses no modelserve metric");
        for name in names {
            used += 1;
            assert!(
                exported.contains(&name),
                "{name} (in {expr}) is not a metric the binaries export; they export {exported:?}"
            );
        }
    }
    eprintln!(
        "{} expressions use {used} metric names, all exported",
        exprs.len()
    );

    // The ServiceMonitor finds the operators' metrics Service and the mirror's; the mirror's
    // NetworkPolicy lets Prometheus in.
    let sm = find(&docs, "ServiceMonitor", "ms-modelserve");
    assert_eq!(sm["metadata"]["labels"]["release"], "prom");
    let ports: Vec<&str> = sm["spec"]["endpoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["port"].as_str().unwrap())
        .collect();
    assert_eq!(ports, ["metrics", "http"]);
    let svc = find(&docs, "Service", "ms-modelserve-metrics");
    assert_eq!(svc["spec"]["ports"][0]["name"], "metrics");
    // The gateways' metrics have their own Service; their clients' port is not scraped.
    let svc = find(&docs, "Service", "ms-modelserve-gateway-metrics");
    assert_eq!(svc["spec"]["ports"][0]["name"], "metrics");
    assert_eq!(svc["spec"]["ports"][0]["port"], 9090);
    let api = find(&docs, "Service", "ms-modelserve-gateway");
    assert_eq!(api["spec"]["ports"][0]["name"], "api");
    let np = find(&docs, "NetworkPolicy", "ms-modelserve-mirror");
    assert_eq!(
        np["spec"]["ingress"][1]["from"][0]["namespaceSelector"]["matchLabels"],
        json!({"kubernetes.io/metadata.name": "monitoring"})
    );

    // Off by default.
    let (_, docs) = render(&tb, "ops", &[]);
    for kind in ["ServiceMonitor", "PrometheusRule", "ConfigMap"] {
        assert!(!docs.iter().any(|d| d["kind"] == kind), "{kind} by default");
    }
}

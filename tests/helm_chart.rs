//! The Helm chart lints, renders objects the real API server accepts, and rejects a wrong value
//! by name.

mod support;

use std::process::Output;

use serde::Deserialize;
use serde_json::{Value, json};
use support::{Testbed, repo_path};

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
        "operator.smokeViaPortForward=true".into(),
        "operator.resources.requests.cpu=0.1".into(),
        "operator.nodeSelector.pool=system".into(),
        "operator.tolerations[0].key=dedicated".into(),
        "operator.tolerations[0].operator=Exists".into(),
        "operator.tolerations[0].effect=NoSchedule".into(),
        "engine.image=ghcr.io/ggml-org/llama.cpp:server-cuda-b6500".into(),
        "engine.build=6500".into(),
        "registry.endpoint=https://hub.internal.example/hf".into(),
        "operator.placeGrace=5m".into(),
        "operator.placeTimeout=1h30m".into(),
        "operator.crashRestarts=5".into(),
        "mirror.port=9000".into(),
        "mirror.connections=8".into(),
        "mirror.segmentSize=16Mi".into(),
        "mirror.storage.size=1.5Ti".into(),
        "mirror.storage.storageClass=fast-ssd".into(),
        "mirror.nodeSelector.disk=ssd".into(),
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

    // The mirror writes only to its volume and /tmp; it has no API token.
    let pod = &mirror["spec"]["template"]["spec"];
    assert_eq!(pod["automountServiceAccountToken"], false);
    let m = &pod["containers"][0];
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
        (
            "MODELSERVE_MIRROR_URL",
            "http://ms-modelserve-mirror.ops.svc:9000",
        ),
        ("MODELSERVE_WATCH_NAMESPACE", "apps"),
        ("MODELSERVE_DEFAULT_TOKEN_SECRET", "tokens/hf"),
        (
            "MODELSERVE_ENGINE_IMAGE",
            "ghcr.io/ggml-org/llama.cpp:server-cuda-b6500",
        ),
        ("MODELSERVE_ENGINE_BUILD", "6500"),
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
    let mirror = find(&docs, "StatefulSet", "ms-modelserve-mirror");
    let m = &mirror["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(env(m, "MODELSERVE_MIRROR_ADDR"), Some("0.0.0.0:9000"));
    assert_eq!(env(m, "MODELSERVE_MIRROR_CONNECTIONS"), Some("8"));
    assert_eq!(env(m, "MODELSERVE_MIRROR_SEGMENT"), Some("16Mi"));
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
            "operator.replicas=2",
            "at '/operator/replicas': maximum: got 2, want 1",
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

//! The ModelServe API as the real API server enforces it: descriptions, validation, columns, scale.

mod support;

use support::{Testbed, repo_path};

fn apply(tb: &Testbed, ns: &str, yaml: &str) -> std::process::Output {
    tb.kubectl_stdin(&["apply", "-n", ns, "-f", "-"], yaml)
}

fn model(name: &str, spec: &str) -> String {
    format!(
        "apiVersion: modelserve.dev/v1alpha1\nkind: ModelServe\nmetadata:\n  name: {name}\nspec:\n{spec}"
    )
}

#[test]
fn kubectl_explain_documents_the_fields() {
    let tb = Testbed::get();
    tb.install_crd();
    let out = tb.kubectl_ok(&["explain", "modelserve.spec.repo"]);
    assert!(
        out.contains("Repository on the model registry, as owner/name"),
        "{out}"
    );
    let out = tb.kubectl_ok(&["explain", "modelserve.spec.contextLength"]);
    assert!(out.contains("parallel slots"), "{out}");
}

#[test]
fn every_example_applies() {
    let tb = Testbed::get();
    tb.install_crd();
    let ns = tb.namespace("examples");
    let examples = std::fs::read_dir(repo_path("examples")).unwrap();
    let mut n = 0;
    for e in examples {
        let path = e.unwrap().path();
        if path.extension().is_some_and(|x| x == "yaml") {
            tb.kubectl_ok(&["apply", "-n", &ns.name, "-f", path.to_str().unwrap()]);
            n += 1;
        }
    }
    assert!(
        n >= 3,
        "examples/ should hold the small, on-demand and gated cases"
    );
}

#[test]
fn the_api_server_rejects_each_invalid_spec_naming_the_field() {
    let tb = Testbed::get();
    tb.install_crd();
    let ns = tb.namespace("invalid");
    let cases = [
        ("  repo: no-slash\n", "spec.repo"),
        ("  repo: a/b/c\n", "spec.repo"),
        ("  repo: a/b\n  replicas: -1\n", "spec.replicas"),
        (
            "  repo: a/b\n  contextSize: 4096\n  contextLength: 8192\n",
            "spec.contextLength",
        ),
        ("  repo: a/b\n  quant: \"Q4 K M\"\n", "spec.quant"),
        ("  repo: a/b\n  quant: \"Q4;rm\"\n", "spec.quant"),
        ("  repo: a/b\n  file: ../secrets.gguf\n", "spec.file"),
        ("  repo: a/b\n  file: /etc/passwd\n", "spec.file"),
        (
            "  repo: a/b\n  quant: Q8_0\n  file: model.gguf\n",
            "spec.file",
        ),
        (
            "  repo: a/b\n  smokeTest:\n    maxTokens: 0\n",
            "spec.smokeTest.maxTokens",
        ),
        (
            "  repo: a/b\n  smokeTest:\n    maxTokens: 100000\n",
            "spec.smokeTest.maxTokens",
        ),
        (
            "  repo: a/b\n  servedName: Has_Capitals\n",
            "spec.servedName",
        ),
        ("  quant: Q8_0\n", "spec.repo"),
        // GPUs only with a GPU accelerator; the CEL rule says what to set.
        (
            "  repo: a/b\n  engine:\n    gpus: 2\n",
            "engine.gpus above 0 needs a GPU accelerator",
        ),
        (
            "  repo: a/b\n  engine:\n    accelerator: cpu\n    gpuLayers: 10\n",
            "apply to a GPU accelerator only",
        ),
        (
            "  repo: a/b\n  engine:\n    accelerator: tpu\n",
            "spec.engine.accelerator",
        ),
        (
            "  repo: a/b\n  engine:\n    accelerator: cuda\n    gpus: 17\n",
            "spec.engine.gpus",
        ),
        (
            "  repo: a/b\n  onDemand:\n    idleAfter: soon\n",
            "spec.onDemand.idleAfter",
        ),
    ];
    for (i, (spec, field)) in cases.iter().enumerate() {
        let out = apply(&tb, &ns.name, &model(&format!("bad-{i}"), spec));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success(),
            "the API server accepted an invalid spec:\n{spec}"
        );
        assert!(
            err.contains(field),
            "the rejection of\n{spec}should name {field}, got: {err}"
        );
    }
    // And the valid neighbour of each rule is accepted.
    let ok = "  repo: bartowski/Qwen2.5-7B-Instruct-GGUF\n  quant: UD-Q4_K_XL\n  contextSize: 8192\n  contextLength: 8192\n  replicas: 0\n  onDemand:\n    idleAfter: 30m\n  engine:\n    accelerator: cuda\n    gpus: 2\n    splitMode: row\n";
    let out = apply(&tb, &ns.name, &model("good", ok));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn get_prints_the_columns_and_scale_changes_spec_replicas() {
    let tb = Testbed::get();
    tb.install_crd();
    let ns = tb.namespace("columns");
    let out = apply(&tb, &ns.name, &model("scaled", "  repo: a/b\n"));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let table = tb.kubectl_ok(&["get", "modelserves", "-n", &ns.name]);
    let header: Vec<&str> = table.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME", "REPO", "QUANT", "STAGE", "PROGRESS", "MEMORY", "READY", "TOK/S", "ASKED",
            "AGE"
        ]
    );
    // The short name works too.
    tb.kubectl_ok(&["get", "ms", "-n", &ns.name, "scaled"]);

    tb.kubectl_ok(&["scale", "-n", &ns.name, "modelserve/scaled", "--replicas=3"]);
    let replicas = tb.kubectl_ok(&[
        "get",
        "-n",
        &ns.name,
        "modelserve/scaled",
        "-o",
        "jsonpath={.spec.replicas}",
    ]);
    assert_eq!(replicas, "3");
    let scale = tb.kubectl_ok(&[
        "get",
        "--raw",
        &format!(
            "/apis/modelserve.dev/v1alpha1/namespaces/{}/modelserves/scaled/scale",
            ns.name
        ),
    ]);
    assert!(scale.contains("\"replicas\":3"), "{scale}");
}

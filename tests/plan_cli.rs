//! `modelserve plan` against the fake Hub: what would be served, or why not, without a cluster.

mod support;

use support::fake_hub::FakeHub;
use support::modelserve_bin;

/// Environment variables that would change where the plan's requests go.
const AMBIENT: [&str; 9] = [
    "HF_TOKEN",
    "MODELSERVE_REGISTRY_ENDPOINT",
    "MODELSERVE_REGISTRY_CA_BUNDLE",
    "HTTP_PROXY",
    "http_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "ALL_PROXY",
    "all_proxy",
];

async fn plan(hub: &FakeHub, args: &[&str]) -> (bool, String, String) {
    let mut with_endpoint = args.to_vec();
    with_endpoint.extend(["--endpoint", &hub.url]);
    plan_with(&with_endpoint, &[]).await
}

/// `modelserve plan ARGS` in an environment holding only `env` of the variables above.
async fn plan_with(args: &[&str], env: &[(&str, &str)]) -> (bool, String, String) {
    let mut cmd = tokio::process::Command::new(modelserve_bin());
    cmd.arg("plan").args(args);
    for name in AMBIENT.iter().chain(["NO_PROXY", "no_proxy"].iter()) {
        cmd.env_remove(name);
    }
    cmd.envs(env.iter().copied());
    let out = cmd.output().await.unwrap();
    (
        out.status.success(),
        String::from_utf8(out.stdout).unwrap(),
        String::from_utf8(out.stderr).unwrap(),
    )
}

#[tokio::test]
async fn plan_prints_the_chosen_set_with_sizes_commit_and_name() {
    let hub = FakeHub::start().await;
    let commit = hub.add_listing("Qwen/Qwen2.5-7B-Instruct-GGUF");
    let (ok, out, err) = plan(&hub, &["Qwen/Qwen2.5-7B-Instruct-GGUF"]).await;
    assert!(ok, "{err}");
    assert!(out.contains(&format!("main -> commit {commit}")), "{out}");
    assert!(
        out.contains("qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf"),
        "{out}"
    );
    assert!(
        out.contains("qwen2.5-7b-instruct-q4_k_m-00002-of-00002.gguf"),
        "{out}"
    );
    assert!(out.contains("Served as   qwen2.5-7b-instruct"), "{out}");
    assert!(out.contains("Total       4.4 GiB in 2 file(s)"), "{out}");
}

#[tokio::test]
async fn plan_json_is_the_status_the_controller_would_write() {
    let hub = FakeHub::start().await;
    hub.add_listing("unsloth/Qwen3-32B-GGUF");
    let (ok, out, _) = plan(
        &hub,
        &[
            "unsloth/Qwen3-32B-GGUF",
            "--quant",
            "BF16",
            "--output",
            "json",
        ],
    )
    .await;
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["resolved"]["set"], "BF16/Qwen3-32B-BF16");
    assert_eq!(v["resolved"]["files"].as_array().unwrap().len(), 2);
    assert_eq!(
        v["resolved"]["totalBytes"],
        49_871_764_512u64 + 15_659_811_424
    );
}

#[tokio::test]
async fn plan_fails_with_one_line_naming_what_the_repo_has() {
    let hub = FakeHub::start().await;
    hub.add_listing("ggml-org/gemma-3-1b-it-GGUF");
    let (ok, out, err) = plan(&hub, &["ggml-org/gemma-3-1b-it-GGUF", "--quant", "Q5_K_XL"]).await;
    assert!(!ok);
    assert!(out.is_empty());
    assert_eq!(
        err.trim(),
        "modelserve: ggml-org/gemma-3-1b-it-GGUF has no file matching Q5_K_XL; it has: F16, Q4_K_M, Q8_0 (NoMatchingQuant)"
    );
    let (ok, _, err) = plan(&hub, &["not-a-repo"]).await;
    assert!(!ok);
    assert!(
        err.contains("repository \"not-a-repo\" is not valid: it must be owner/name"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

#[tokio::test]
async fn plan_chooses_and_prints_non_ascii_files() {
    let hub = FakeHub::start().await;
    let repo = "modelserve-test/unicode-names-GGUF";
    let commit = hub.add_listing(repo);
    let (ok, out, err) = plan(&hub, &[repo]).await;
    assert!(ok, "{err}\n{out}");
    assert!(out.contains(&format!("main -> commit {commit}")), "{out}");
    assert!(
        out.contains("Set         Модели/Модель-Q4_K_M (Q4_K_M)"),
        "{out}"
    );
    for n in 1..=3 {
        let file = format!("Модели/Модель-Q4_K_M-0000{n}-of-00003.gguf");
        assert!(out.contains(&file), "{file} in {out}");
    }
    assert!(out.contains("in 3 file(s)"), "{out}");
    assert!(out.contains("Check       llama loads"), "{out}");

    let (ok, out, err) = plan(&hub, &[repo, "--file", "xéééééééé.gguf"]).await;
    assert!(ok, "{err}\n{out}");
    assert!(out.contains("  xéééééééé.gguf  "), "{out}");

    let (ok, out, _) = plan(&hub, &[repo, "--quant", "q5_k_m", "-o", "json"]).await;
    assert!(ok, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["resolved"]["files"][0]["path"], "🦙-Q5_K_M.gguf");
}

#[tokio::test]
async fn plan_reaches_the_registry_through_the_proxy_the_environment_names() {
    // The fake Hub doubles as an HTTP proxy: it routes absolute-form requests by their path.
    // registry.invalid cannot resolve, so an answer proves the request went through the proxy;
    // the CDN on 127.0.0.1 is reached directly, as NO_PROXY says.
    let hub = FakeHub::start().await;
    let commit = hub.add_listing("ggml-org/gemma-3-1b-it-GGUF");
    let args = [
        "ggml-org/gemma-3-1b-it-GGUF",
        "--registry-endpoint",
        "http://registry.invalid",
    ];
    let proxied = [("HTTP_PROXY", hub.url.as_str()), ("NO_PROXY", "127.0.0.1")];
    let (ok, out, err) = plan_with(&args, &proxied).await;
    assert!(ok, "{err}\n{out}");
    assert!(out.contains(&format!("main -> commit {commit}")), "{out}");
    assert!(hub.count("/api/models/ggml-org/gemma-3-1b-it-GGUF/revision/main") >= 1);

    let (ok, _, err) = plan_with(&args, &[]).await;
    assert!(!ok);
    assert!(err.contains("(RegistryUnavailable)"), "{err}");
}

#[tokio::test]
async fn plan_reads_the_registry_from_the_shared_flags_and_their_environment() {
    let hub = FakeHub::start().await;
    hub.add_listing("ggml-org/gemma-3-1b-it-GGUF");
    let repo = "ggml-org/gemma-3-1b-it-GGUF";
    let (ok, _, err) = plan_with(&[repo], &[("MODELSERVE_REGISTRY_ENDPOINT", &hub.url)]).await;
    assert!(ok, "{err}");
    let (ok, _, err) = plan_with(&[repo, "--registry-endpoint", &hub.url], &[]).await;
    assert!(ok, "{err}");
    let (ok, _, err) = plan_with(
        &[
            repo,
            "--endpoint",
            &hub.url,
            "--registry-ca-bundle",
            "/nonexistent/ca.pem",
        ],
        &[],
    )
    .await;
    assert!(!ok);
    assert!(
        err.contains("--registry-ca-bundle: the registry CA bundle /nonexistent/ca.pem cannot be used: cannot read it"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
}

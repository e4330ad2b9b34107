//! `modelserve plan` against the fake Hub: what would be served, or why not, without a cluster.

mod support;

use support::fake_hub::FakeHub;
use support::modelserve_bin;

async fn plan(hub: &FakeHub, args: &[&str]) -> (bool, String, String) {
    let out = tokio::process::Command::new(modelserve_bin())
        .arg("plan")
        .args(args)
        .args(["--endpoint", &hub.url])
        .env_remove("HF_TOKEN")
        .output()
        .await
        .unwrap();
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

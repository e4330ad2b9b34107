//! The registry client against the fake Hub: every error cause, retries, pagination, the token.

mod support;

use std::time::{Duration, Instant};

use modelserve::hub::{Hub, HubError, Retry};
use support::fake_hub::{FakeHub, HubFile};

fn quick() -> Retry {
    Retry {
        attempts: 3,
        base: Duration::from_millis(50),
        max_delay: Duration::from_millis(200),
        max_rate_limit_wait: Duration::from_secs(3),
        request_timeout: Duration::from_secs(5),
        read_timeout: Duration::from_secs(5),
    }
}

fn hub(fake: &FakeHub, token: Option<&str>) -> Hub {
    Hub::new(&fake.url, token.map(String::from))
        .unwrap()
        .with_retry(quick())
        .unwrap()
}

async fn gguf_repo(fake: &FakeHub, repo: &str) -> String {
    fake.add_repo(
        repo,
        vec![
            HubFile::with_bytes("m-Q8_0.gguf", b"GGUF-bytes-of-the-model".to_vec()),
            HubFile::git("README.md", "hi\n"),
        ],
    )
}

#[tokio::test]
async fn model_info_pins_the_commit_and_the_tree_carries_sha256_and_size() {
    let fake = FakeHub::start().await;
    let commit = fake.add_listing("Qwen/Qwen2.5-7B-Instruct-GGUF");
    fake.set_page_size(4);
    let h = hub(&fake, None);
    let info = h
        .model_info("Qwen/Qwen2.5-7B-Instruct-GGUF", "main")
        .await
        .unwrap();
    assert_eq!(info.commit, commit);
    assert_eq!(info.gated, None);
    let files = h
        .tree("Qwen/Qwen2.5-7B-Instruct-GGUF", &info.commit)
        .await
        .unwrap();
    assert_eq!(files.len(), 19, "all pages are followed (page size 4)");
    assert!(fake.count("/tree/") >= 5);
    let f = files
        .iter()
        .find(|f| f.path == "qwen2.5-7b-instruct-q2_k.gguf")
        .unwrap();
    assert_eq!(f.size, 3_015_940_000);
    assert_eq!(f.sha256.as_ref().map(String::len), Some(64));
}

#[tokio::test]
async fn a_missing_repo_is_repo_not_found_with_and_without_token() {
    let fake = FakeHub::start().await;
    fake.add_token("hf_good", &[]);
    for token in [None, Some("hf_good")] {
        let e = hub(&fake, token)
            .model_info("nobody/nothing", "main")
            .await
            .unwrap_err();
        assert_eq!(e.reason(), "RepoNotFound", "{e}");
        assert!(e.to_string().contains("nobody/nothing"), "{e}");
    }
}

#[tokio::test]
async fn a_private_repo_without_access_reads_as_not_found_and_with_access_works() {
    let fake = FakeHub::start().await;
    gguf_repo(&fake, "acme/secret-GGUF").await;
    fake.set_private("acme/secret-GGUF");
    fake.add_token("hf_member", &["acme/secret-GGUF"]);
    let e = hub(&fake, None)
        .model_info("acme/secret-GGUF", "main")
        .await
        .unwrap_err();
    assert!(e.to_string().contains("or it is private"), "{e}");
    assert!(
        hub(&fake, Some("hf_member"))
            .model_info("acme/secret-GGUF", "main")
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn a_missing_revision_is_revision_not_found() {
    let fake = FakeHub::start().await;
    gguf_repo(&fake, "o/r").await;
    let e = hub(&fake, None).model_info("o/r", "v9").await.unwrap_err();
    assert_eq!(
        e,
        HubError::RevisionNotFound {
            repo: "o/r".into(),
            revision: "v9".into()
        }
    );
    assert!(e.to_string().contains("check spec.revision"));
}

#[tokio::test]
async fn gated_repos_name_the_gate() {
    let fake = FakeHub::start().await;
    let commit = gguf_repo(&fake, "meta/gated").await;
    fake.set_gated("meta/gated", "manual");
    fake.add_token("hf_waiting", &[]);
    fake.add_token("hf_approved", &["meta/gated"]);
    let info = hub(&fake, None)
        .model_info("meta/gated", "main")
        .await
        .unwrap();
    assert_eq!(
        info.gated.as_deref(),
        Some("manual"),
        "model info is public for gated repos"
    );

    let e = hub(&fake, None)
        .check_access("meta/gated", &commit, "m-Q8_0.gguf")
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "GatedRepoNoToken");
    assert!(e.to_string().contains("set spec.tokenSecretRef"), "{e}");
    let e = hub(&fake, Some("hf_waiting"))
        .check_access("meta/gated", &commit, "m-Q8_0.gguf")
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "GatedRepoNotApproved");
    assert!(
        e.to_string()
            .contains(&format!("ask for access at {}/meta/gated", fake.url)),
        "{e}"
    );
    hub(&fake, Some("hf_approved"))
        .check_access("meta/gated", &commit, "m-Q8_0.gguf")
        .await
        .unwrap();
}

#[tokio::test]
async fn a_disabled_repo_and_a_bad_token_have_their_own_reasons() {
    let fake = FakeHub::start().await;
    gguf_repo(&fake, "o/off").await;
    fake.set_disabled("o/off");
    assert_eq!(
        hub(&fake, None)
            .model_info("o/off", "main")
            .await
            .unwrap_err()
            .reason(),
        "RepoDisabled"
    );
    gguf_repo(&fake, "o/on").await;
    let e = hub(&fake, Some("hf_wrong"))
        .model_info("o/on", "main")
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "InvalidToken");
    assert!(e.to_string().contains("check the Secret"), "{e}");
}

#[tokio::test]
async fn rate_limits_are_waited_out_after_the_advertised_reset() {
    let fake = FakeHub::start().await;
    gguf_repo(&fake, "o/r").await;
    fake.fail(
        "/revision/",
        429,
        &[
            ("ratelimit", "\"api\";r=0;t=1"),
            ("ratelimit-policy", "\"fixed window\";\"api\";q=500;w=300"),
        ],
        1,
    );
    let started = Instant::now();
    hub(&fake, None).model_info("o/r", "main").await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_secs(1),
        "the retry came before the advertised reset"
    );
    assert_eq!(fake.count("/revision/"), 2);
}

#[tokio::test]
async fn a_long_rate_limit_is_returned_as_transient_with_its_reset() {
    let fake = FakeHub::start().await;
    gguf_repo(&fake, "o/r").await;
    fake.fail("/revision/", 429, &[("retry-after", "120")], 1);
    let e = hub(&fake, None)
        .model_info("o/r", "main")
        .await
        .unwrap_err();
    assert_eq!(
        e,
        HubError::RateLimited {
            retry_after: Duration::from_secs(120)
        }
    );
    assert!(e.is_transient());
    assert_eq!(fake.count("/revision/"), 1, "no request before the reset");
}

#[tokio::test]
async fn server_errors_are_retried_then_reported_as_unavailable() {
    let fake = FakeHub::start().await;
    gguf_repo(&fake, "o/r").await;
    fake.fail("/revision/", 503, &[], 2);
    hub(&fake, None).model_info("o/r", "main").await.unwrap();
    fake.fail("/revision/", 502, &[], 3);
    let e = hub(&fake, None)
        .model_info("o/r", "main")
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "RegistryUnavailable");
    assert!(e.is_transient());
    assert!(
        e.to_string().contains("HTTP 502") && e.to_string().contains("after 3 attempts"),
        "{e}"
    );
    fake.fail("/revision/", 408, &[], 1);
    hub(&fake, None).model_info("o/r", "main").await.unwrap();
}

#[tokio::test]
async fn a_slow_registry_times_out_and_is_retried() {
    let fake = FakeHub::start().await;
    gguf_repo(&fake, "o/r").await;
    fake.slow("/revision/", Duration::from_secs(3), 1);
    let mut r = quick();
    r.request_timeout = Duration::from_millis(500);
    let h = Hub::new(&fake.url, None).unwrap().with_retry(r).unwrap();
    h.model_info("o/r", "main").await.unwrap();
    fake.slow("/revision/", Duration::from_secs(3), 5);
    let e = h.model_info("o/r", "main").await.unwrap_err();
    assert!(e.to_string().contains("timed out"), "{e}");
}

#[tokio::test]
async fn the_token_never_reaches_the_cdn_host() {
    let fake = FakeHub::start().await;
    let commit = gguf_repo(&fake, "o/r").await;
    fake.add_token("hf_secret", &["o/r"]);
    let h = hub(&fake, Some("hf_secret"));
    let bytes = h
        .read_range("o/r", &commit, "m-Q8_0.gguf", 0, 4)
        .await
        .unwrap();
    assert_eq!(bytes, b"GGUF");
    let bytes = h
        .read_range("o/r", &commit, "m-Q8_0.gguf", 5, 5)
        .await
        .unwrap();
    assert_eq!(bytes, b"bytes");
    assert!(
        fake.cdn_authorizations().is_empty(),
        "the CDN saw: {:?}",
        fake.cdn_authorizations()
    );
}

#[tokio::test]
async fn a_missing_file_is_file_not_found() {
    let fake = FakeHub::start().await;
    let commit = gguf_repo(&fake, "o/r").await;
    let e = hub(&fake, None)
        .read_range("o/r", &commit, "nope.gguf", 0, 4)
        .await
        .unwrap_err();
    assert_eq!(e.reason(), "FileNotFound");
}

#[tokio::test]
async fn malformed_input_never_reaches_the_network() {
    let fake = FakeHub::start().await;
    let h = hub(&fake, None);
    for (repo, rev) in [
        ("../etc", "main"),
        ("a/b", "../../x"),
        ("a/b?x", "main"),
        ("a/b", "x y"),
    ] {
        let e = h.model_info(repo, rev).await.unwrap_err();
        assert_eq!(e.reason(), "InvalidSpec", "{repo} {rev}: {e}");
    }
    assert!(fake.requests().is_empty());
}

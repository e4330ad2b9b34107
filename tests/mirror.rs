//! The mirror service against the fake Hub: verified, resumable, deduplicated downloads.

mod support;

use std::time::Duration;

use modelserve::mirror::store::FileRef;
use modelserve::mirror::{Request, Status};
use support::fake_hub::{FakeHub, HubFile};
use support::{eventually, file_refs as refs, start_mirror};

struct Running {
    url: String,
    dir: tempfile::TempDir,
}

async fn mirror(hub: &FakeHub) -> Running {
    let (url, dir) = start_mirror(&hub.url).await;
    Running { url, dir }
}

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}

async fn post(url: &str, files: &[FileRef]) -> (u16, serde_json::Value) {
    let r = reqwest::Client::new()
        .post(format!("{url}/v1/fetch"))
        .json(&Request {
            files: files.to_vec(),
            token: None,
        })
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.json().await.unwrap())
}

async fn settled(url: &str, files: &[FileRef]) -> Status {
    eventually(Duration::from_secs(30), async || {
        let (_, v) = post(url, files).await;
        let s: Status = serde_json::from_value(v).ok()?;
        s.files
            .iter()
            .all(|f| f.state == "present" || f.state == "failed")
            .then_some(s)
    })
    .await
    .expect("the mirror settles")
}

#[tokio::test]
async fn a_sharded_set_is_mirrored_verified_and_served_in_the_hf_layout() {
    let hub = FakeHub::start().await;
    let files = vec![
        HubFile::with_bytes("Q4_K_M/m-Q4_K_M-00001-of-00002.gguf", bytes(300_000, 1)),
        HubFile::with_bytes("Q4_K_M/m-Q4_K_M-00002-of-00002.gguf", bytes(200_000, 2)),
    ];
    let commit = hub.add_repo("acme/M-GGUF", files.clone());
    let m = mirror(&hub).await;
    let want = refs("acme/M-GGUF", &commit, &files);
    let s = settled(&m.url, &want).await;
    assert!(s.files.iter().all(|f| f.state == "present"), "{s:?}");
    assert_eq!((s.bytes_done, s.bytes_total), (500_000, 500_000));
    for f in &files {
        let snap = m.dir.path().join(format!(
            "models--acme--M-GGUF/snapshots/{commit}/{}",
            f.path
        ));
        assert!(
            std::fs::symlink_metadata(&snap)
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(std::fs::read(&snap).unwrap(), **f.content.as_ref().unwrap());
    }
    // Served with Range for the replicas.
    let url = format!("{}/v1/files/acme/M-GGUF/{commit}/{}", m.url, files[0].path);
    let r = reqwest::Client::new()
        .get(&url)
        .header("range", "bytes=10-19")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 206);
    assert_eq!(
        r.bytes().await.unwrap().to_vec(),
        files[0].content.as_ref().unwrap()[10..20].to_vec()
    );
    // Asking again downloads nothing.
    let before = hub.cdn_log().len();
    settled(&m.url, &want).await;
    assert_eq!(hub.cdn_log().len(), before);
}

#[tokio::test]
async fn wrong_bytes_are_retried_then_failed_and_never_present() {
    let hub = FakeHub::start().await;
    let mut f = HubFile::with_bytes("m-Q8_0.gguf", bytes(50_000, 3));
    let commit = hub.add_repo("acme/Bad-GGUF", vec![f.clone()]);
    // The registry publishes one hash and serves other bytes.
    let published = "e".repeat(64);
    let mut file = refs("acme/Bad-GGUF", &commit, std::slice::from_ref(&f)).remove(0);
    file.sha256 = published.clone();
    f.sha256 = published.clone();
    hub.add_repo("acme/Bad-GGUF", vec![f.clone()]);
    let commit2 = hub.add_repo("acme/Bad-GGUF", vec![f]);
    file.commit = commit2;
    let m = mirror(&hub).await;
    let s = settled(&m.url, std::slice::from_ref(&file)).await;
    let st = &s.files[0];
    assert_eq!(st.state, "failed");
    let err = st.error.as_deref().unwrap();
    assert!(
        err.contains("m-Q8_0.gguf arrived with sha256 ")
            && err.contains(&format!("the registry published {published} (3 attempts)")),
        "{err}"
    );
    assert_eq!(hub.cdn_log().len(), 3, "retried from scratch, then gave up");
    assert!(
        !m.dir
            .path()
            .join(format!(
                "models--acme--Bad-GGUF/snapshots/{}/m-Q8_0.gguf",
                file.commit
            ))
            .exists()
    );
    assert!(
        !m.dir
            .path()
            .join(format!(".incomplete/{published}.part"))
            .exists(),
        "no wrong bytes kept"
    );
}

#[tokio::test]
async fn a_broken_connection_resumes_from_where_it_stopped() {
    let hub = FakeHub::start().await;
    let f = HubFile::with_bytes("m-F16.gguf", bytes(1_000_000, 4));
    let commit = hub.add_repo("acme/Cut-GGUF", vec![f.clone()]);
    hub.cut(&f.sha256, 400_000, 1);
    let m = mirror(&hub).await;
    let want = refs("acme/Cut-GGUF", &commit, std::slice::from_ref(&f));
    let s = settled(&m.url, &want).await;
    assert_eq!(s.files[0].state, "present", "{s:?}");
    let log = hub.cdn_log();
    assert_eq!(log.len(), 2, "{log:?}");
    let resumed = log[1].1.as_deref().unwrap();
    let from: u64 = resumed
        .trim_start_matches("bytes=")
        .split('-')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(
        from >= 300_000,
        "resumed from byte {from}, not from the start"
    );
}

#[tokio::test]
async fn a_server_error_mid_download_resumes() {
    let hub = FakeHub::start().await;
    let f = HubFile::with_bytes("m-Q6_K.gguf", bytes(600_000, 5));
    let commit = hub.add_repo("acme/Flaky-GGUF", vec![f.clone()]);
    hub.cut(&f.sha256, 250_000, 1);
    hub.fail("/resolve/", 502, &[], 2);
    let m = mirror(&hub).await;
    let want = refs("acme/Flaky-GGUF", &commit, std::slice::from_ref(&f));
    let s = settled(&m.url, &want).await;
    assert_eq!(s.files[0].state, "present", "{s:?}");
}

#[tokio::test]
async fn the_same_blob_asked_for_twice_at_once_is_downloaded_once() {
    let hub = FakeHub::start().await;
    let f = HubFile::with_bytes("m-Q8_0.gguf", bytes(2_000_000, 6));
    let c1 = hub.add_repo("acme/One-GGUF", vec![f.clone()]);
    let c2 = hub.add_repo("acme/Two-GGUF", vec![f.clone()]);
    let m = mirror(&hub).await;
    let a = refs("acme/One-GGUF", &c1, std::slice::from_ref(&f));
    let b = refs("acme/Two-GGUF", &c2, std::slice::from_ref(&f));
    let (x, y) = tokio::join!(post(&m.url, &a), post(&m.url, &a));
    assert_eq!((x.0, y.0), (202, 202));
    post(&m.url, &b).await;
    let sa = settled(&m.url, &a).await;
    let sb = settled(&m.url, &b).await;
    assert_eq!(
        (sa.files[0].state.as_str(), sb.files[0].state.as_str()),
        ("present", "present")
    );
    assert_eq!(
        hub.cdn_log().len(),
        1,
        "one download for one content, across requests and repos"
    );
}

#[tokio::test]
async fn traversal_and_unpinned_requests_are_rejected() {
    let hub = FakeHub::start().await;
    let m = mirror(&hub).await;
    let good = FileRef {
        repo: "a/b".into(),
        commit: "c".repeat(40),
        path: "m.gguf".into(),
        sha256: "d".repeat(64),
        size: 1,
    };
    for bad in [
        FileRef {
            path: "../../etc/passwd".into(),
            ..good.clone()
        },
        FileRef {
            path: "/etc/passwd".into(),
            ..good.clone()
        },
        FileRef {
            repo: "a/..".into(),
            ..good.clone()
        },
        FileRef {
            commit: "main".into(),
            ..good.clone()
        },
    ] {
        let (code, body) = post(&m.url, std::slice::from_ref(&bad)).await;
        assert_eq!(code, 400, "{bad:?}");
        assert!(
            body["error"].as_str().unwrap().contains("is not valid"),
            "{body}"
        );
    }
    let r = reqwest::get(format!(
        "{}/v1/files/a/b/{}/..%2F..%2Fetc%2Fpasswd",
        m.url,
        "c".repeat(40)
    ))
    .await
    .unwrap();
    assert_eq!(r.status(), 400);
    assert!(hub.requests().is_empty());
}

#[tokio::test]
async fn a_file_larger_than_the_free_space_fails_before_downloading() {
    let hub = FakeHub::start().await;
    let f = HubFile::listed("huge-BF16.gguf", 10 << 40);
    let commit = hub.add_repo("acme/Huge-GGUF", vec![f.clone()]);
    let m = mirror(&hub).await;
    let want = refs("acme/Huge-GGUF", &commit, std::slice::from_ref(&f));
    // The whole set is refused before any of it is queued (507 Insufficient Storage).
    let (code, v) = post(&m.url, &want).await;
    assert_eq!(code, 507, "{v}");
    assert_eq!(v["reason"], "InsufficientCapacity");
    assert_eq!(v["neededBytes"], 10u64 << 40);
    let err = v["error"].as_str().unwrap();
    assert!(
        err.starts_with("the set needs 10.0 TiB on the mirror's volume, which has "),
        "{err}"
    );
    assert!(hub.cdn_log().is_empty(), "nothing was downloaded");
}

#[tokio::test]
async fn a_registry_that_stalls_or_redirects_in_a_loop_gets_a_bounded_specific_failure() {
    let hub = FakeHub::start().await;
    let stalled = HubFile::with_bytes("stall-Q8_0.gguf", bytes(10_000, 8));
    let looping = HubFile::with_bytes("loop-Q8_0.gguf", bytes(10_000, 9));
    let commit = hub.add_repo(
        "acme/Bad-Registry-GGUF",
        vec![stalled.clone(), looping.clone()],
    );
    hub.slow("/resolve/", Duration::from_secs(5), 1000);
    let m = mirror(&hub).await;
    let started = std::time::Instant::now();
    let s = settled(
        &m.url,
        &refs(
            "acme/Bad-Registry-GGUF",
            &commit,
            std::slice::from_ref(&stalled),
        ),
    )
    .await;
    let err = s.files[0].error.as_deref().unwrap_or_default();
    assert_eq!(s.files[0].state, "failed");
    assert!(
        err.contains("timed out") && err.contains("without progress"),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "a stalled registry must fail in bounded time"
    );

    let hub = FakeHub::start().await;
    let commit = hub.add_repo("acme/Loop-GGUF", vec![looping.clone()]);
    let own = format!("/acme/Loop-GGUF/resolve/{commit}/loop-Q8_0.gguf");
    hub.fail("/resolve/", 302, &[("location", own.as_str())], 10_000);
    let m = mirror(&hub).await;
    let s = settled(
        &m.url,
        &refs("acme/Loop-GGUF", &commit, std::slice::from_ref(&looping)),
    )
    .await;
    let err = s.files[0].error.as_deref().unwrap_or_default();
    assert_eq!(s.files[0].state, "failed");
    assert!(err.contains("redirect"), "{err}");
    assert!(
        !m.dir
            .path()
            .join(format!(
                "models--acme--Loop-GGUF/snapshots/{commit}/loop-Q8_0.gguf"
            ))
            .exists()
    );
}

/// A mirror that splits files into 512 KiB segments over four connections.
async fn segmented(hub: &FakeHub) -> Running {
    let policy = modelserve::mirror::fetch::Policy {
        connections: 4,
        segment: 512 << 10,
        ..support::test_policy()
    };
    let (url, dir) = support::start_mirror_with(&hub.url, policy).await;
    Running { url, dir }
}

fn snapshot_bytes(m: &Running, repo_dir: &str, commit: &str, path: &str) -> Vec<u8> {
    std::fs::read(
        m.dir
            .path()
            .join(format!("{repo_dir}/snapshots/{commit}/{path}")),
    )
    .unwrap()
}

#[tokio::test]
async fn a_large_file_comes_over_several_range_connections_at_once() {
    let hub = FakeHub::start().await;
    let f = HubFile::with_bytes("big-Q8_0.gguf", bytes(4 << 20, 9));
    let commit = hub.add_repo("acme/Par-GGUF", vec![f.clone()]);
    // Slow connections, so the segments overlap in time.
    hub.throttle(4 << 20);
    let m = segmented(&hub).await;
    let want = refs("acme/Par-GGUF", &commit, std::slice::from_ref(&f));
    let s = settled(&m.url, &want).await;
    assert_eq!(s.files[0].state, "present", "{s:?}");
    assert_eq!(
        snapshot_bytes(&m, "models--acme--Par-GGUF", &commit, &f.path),
        **f.content.as_ref().unwrap()
    );
    let mut ranges: Vec<String> = hub.cdn_log().into_iter().filter_map(|(_, r)| r).collect();
    ranges.sort_by_key(|r| r[6..].split('-').next().unwrap().parse::<u64>().unwrap());
    let expected: Vec<String> = (0..8u64)
        .map(|i| format!("bytes={}-{}", i * (512 << 10), (i + 1) * (512 << 10) - 1))
        .collect();
    assert_eq!(ranges, expected, "each segment asked for exactly once");
    assert_eq!(
        hub.max_concurrent_downloads(),
        4,
        "four connections at once"
    );
    assert_eq!(hub.cdn_bytes_sent(), f.size, "no byte sent twice");
}

#[tokio::test]
async fn a_registry_that_ignores_range_gets_one_connection_and_the_file_is_still_right() {
    let hub = FakeHub::start().await;
    let f = HubFile::with_bytes("norange-Q8_0.gguf", bytes(3 << 20, 5));
    let commit = hub.add_repo("acme/NoRange-GGUF", vec![f.clone()]);
    hub.ignore_ranges();
    let m = segmented(&hub).await;
    let want = refs("acme/NoRange-GGUF", &commit, std::slice::from_ref(&f));
    let s = settled(&m.url, &want).await;
    assert_eq!(s.files[0].state, "present", "{s:?}");
    assert_eq!(
        snapshot_bytes(&m, "models--acme--NoRange-GGUF", &commit, &f.path),
        **f.content.as_ref().unwrap()
    );
    let last = hub.cdn_log().last().cloned().unwrap();
    assert_eq!(
        last.1.as_deref(),
        Some(format!("bytes=0-{}", f.size - 1).as_str()),
        "after the 200s, one request for the whole file"
    );
}

#[tokio::test]
async fn a_registry_whose_download_disagrees_with_the_published_size_fails_with_both_sizes() {
    let hub = FakeHub::start().await;
    let f = HubFile::with_bytes("liar-Q8_0.gguf", bytes(2 << 20, 6));
    let commit = hub.add_repo("acme/Liar-GGUF", vec![f.clone()]);
    hub.lie_about_size(5 << 20);
    let m = segmented(&hub).await;
    let want = refs("acme/Liar-GGUF", &commit, std::slice::from_ref(&f));
    let s = settled(&m.url, &want).await;
    assert_eq!(s.files[0].state, "failed", "{s:?}");
    let err = s.files[0].error.clone().unwrap();
    assert!(
        err.contains("published 2097152 bytes but its download says 5242880"),
        "{err}"
    );
    let served = reqwest::get(format!(
        "{}/v1/files/acme/Liar-GGUF/{commit}/{}",
        m.url, f.path
    ))
    .await
    .unwrap();
    assert_eq!(served.status(), 404, "nothing half-written is served");
}

#[tokio::test]
async fn the_mirror_exposes_prometheus_metrics() {
    let hub = FakeHub::start().await;
    let f = HubFile::with_bytes("metrics-Q8_0.gguf", bytes(1 << 20, 7));
    let commit = hub.add_repo("acme/Metrics-GGUF", vec![f.clone()]);
    let m = mirror(&hub).await;
    let want = refs("acme/Metrics-GGUF", &commit, std::slice::from_ref(&f));
    settled(&m.url, &want).await;
    let text = reqwest::get(format!("{}/metrics", m.url))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    for line in [
        "modelserve_mirror_downloaded_bytes_total 1048576",
        "modelserve_mirror_files_total{outcome=\"downloaded\"} 1",
        "modelserve_mirror_downloads_active 0",
    ] {
        assert!(text.contains(line), "{line} missing from:\n{text}");
    }
    assert!(text.contains("modelserve_mirror_throughput_bytes_per_second"));
}

#[tokio::test]
async fn files_beyond_the_download_limit_wait_queued_and_all_arrive() {
    let hub = FakeHub::start().await;
    // Six shards of 512 KiB at 2 MiB/s each: about a quarter of a second per file.
    let files: Vec<HubFile> = (1..=6)
        .map(|i| {
            HubFile::with_bytes(
                &format!("big-Q8_0-0000{i}-of-00006.gguf"),
                bytes(512 << 10, i as u8),
            )
        })
        .collect();
    let commit = hub.add_repo("acme/Shards-GGUF", files.clone());
    hub.throttle(2 << 20);
    let policy = modelserve::mirror::fetch::Policy {
        downloads: 2,
        ..support::test_policy()
    };
    let (url, _dir) = support::start_mirror_with(&hub.url, policy).await;
    let want = refs("acme/Shards-GGUF", &commit, &files);
    let (code, _) = post(&url, &want).await;
    assert_eq!(code, 202);
    // While the first two download, the others say they wait.
    let seen_queued = eventually(Duration::from_secs(5), async || {
        let (_, v) = post(&url, &want).await;
        let s: Status = serde_json::from_value(v).ok()?;
        let count = |state: &str| s.files.iter().filter(|f| f.state == state).count();
        (count("downloading") == 2 && count("queued") == 4).then_some(())
    })
    .await;
    assert!(seen_queued.is_some(), "two downloading and four queued");
    let s = settled(&url, &want).await;
    assert!(s.files.iter().all(|f| f.state == "present"), "{s:?}");
    assert_eq!(
        hub.max_concurrent_downloads(),
        2,
        "never more than two files from the registry at once"
    );
    assert_eq!(hub.cdn_log().len(), 6, "each shard fetched once");
}

// ---------------------------------------------------------------------------------------------
// Hostile requests: whatever a client sends, the mirror answers with a 4xx naming what was
// wrong, and keeps serving.

async fn post_raw(url: &str, body: Vec<u8>) -> (u16, serde_json::Value) {
    let r = reqwest::Client::new()
        .post(format!("{url}/v1/fetch"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    let code = r.status().as_u16();
    (code, r.json().await.unwrap_or_default())
}

fn good_ref() -> serde_json::Value {
    serde_json::json!({
        "repo": "acme/M-GGUF", "commit": "c".repeat(40), "path": "m.gguf",
        "sha256": "d".repeat(64), "size": 10
    })
}

#[tokio::test]
async fn a_request_body_over_one_mib_is_refused_with_413_before_it_is_read() {
    let hub = FakeHub::start().await;
    let m = mirror(&hub).await;
    let (code, body) = post_raw(&m.url, vec![b' '; 2 << 20]).await;
    assert_eq!(code, 413, "{body}");
    assert_eq!(body["field"], "body");
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("at most 1048576 bytes"),
        "{body}"
    );
    assert!(hub.requests().is_empty());
    assert_eq!(post(&m.url, &[]).await.0, 202, "the mirror still answers");
}

#[tokio::test]
async fn a_request_naming_more_than_1000_files_is_refused_naming_the_limit() {
    let hub = FakeHub::start().await;
    let m = mirror(&hub).await;
    let files = serde_json::Value::Array(vec![good_ref(); 1001]);
    let (code, body) = post_raw(
        &m.url,
        serde_json::json!({ "files": files })
            .to_string()
            .into_bytes(),
    )
    .await;
    assert_eq!(code, 400, "{body}");
    assert_eq!(body["field"], "files");
    assert!(
        body["valid"]
            .as_str()
            .unwrap()
            .contains("at most 1000 files"),
        "{body}"
    );
    assert!(hub.requests().is_empty());
}

#[tokio::test]
async fn each_bad_field_of_a_request_gets_a_400_naming_it_and_what_would_be_valid() {
    let hub = FakeHub::start().await;
    let m = mirror(&hub).await;
    let with = |k: &str, v: serde_json::Value| {
        let mut f = good_ref();
        f[k] = v;
        serde_json::json!({ "files": [good_ref(), f] }).to_string()
    };
    let without = |k: &str| {
        let mut f = good_ref();
        f.as_object_mut().unwrap().remove(k);
        serde_json::json!({ "files": [f] }).to_string()
    };
    for (body, field, valid) in [
        (
            with("sha256", "D".repeat(64).into()),
            "files[1].sha256",
            "64 lowercase hex digits",
        ),
        (
            with("sha256", "d".repeat(63).into()),
            "files[1].sha256",
            "64 lowercase hex digits",
        ),
        (
            with("commit", "main".into()),
            "files[1].commit",
            "40 lowercase hex digits",
        ),
        (with("repo", "acme".into()), "files[1].repo", "owner/name"),
        (
            with("path", "a/../../b".into()),
            "files[1].path",
            "no empty, '.' or '..' segment",
        ),
        (with("path", "".into()), "files[1].path", "relative path"),
        (with("size", (1u64 << 50).into()), "files[1].size", "64 TiB"),
        (with("size", (-5).into()), "files[1].size", "whole number"),
        (with("size", "10".into()), "files[1].size", "not a number"),
        (without("sha256"), "files[0].sha256", "missing"),
        (r#"{"files": [1]}"#.into(), "files[0]", "must be an object"),
        (r#"{"files": "m.gguf"}"#.into(), "files", "a list of files"),
        (r#"{"files": [], "token": 42}"#.into(), "token", "a string"),
        (r#"{"files": [" "#.into(), "body", "JSON object"),
        ("\u{feff}{}".into(), "body", "JSON object"),
    ] {
        let (code, answer) = post_raw(&m.url, body.clone().into_bytes()).await;
        assert_eq!(code, 400, "{body}: {answer}");
        assert_eq!(answer["field"], field, "{body}: {answer}");
        assert!(
            answer["valid"].as_str().unwrap_or_default().contains(valid),
            "{body}: {answer}"
        );
        assert!(
            answer["error"]
                .as_str()
                .unwrap_or_default()
                .contains(&format!("{field} ")),
            "the sentence names the field: {answer}"
        );
    }
    let (code, answer) = post_raw(&m.url, vec![0xff, 0xfe, 0x00]).await;
    assert_eq!(
        (code, answer["field"].as_str()),
        (400, Some("body")),
        "{answer}"
    );
    assert!(hub.requests().is_empty(), "nothing reached the registry");
}

/// The mirror with one file of `content` present, and its URL under `/v1/files`.
async fn mirror_with(hub: &FakeHub, repo: &str, path: &str, content: Vec<u8>) -> (Running, String) {
    let f = HubFile::with_bytes(path, content);
    let commit = hub.add_repo(repo, vec![f.clone()]);
    let m = mirror(hub).await;
    let s = settled(&m.url, &refs(repo, &commit, std::slice::from_ref(&f))).await;
    assert_eq!(s.files[0].state, "present", "{s:?}");
    let url = format!("{}/v1/files/{repo}/{commit}/{path}", m.url);
    (m, url)
}

async fn get_range(url: &str, range: &[u8]) -> reqwest::Response {
    reqwest::Client::new()
        .get(url)
        .header(
            "range",
            reqwest::header::HeaderValue::from_bytes(range).unwrap(),
        )
        .send()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_garbage_inverted_or_out_of_bounds_range_gets_400_or_416_and_the_file_is_still_served() {
    let hub = FakeHub::start().await;
    let content = bytes(1000, 11);
    let (_m, url) = mirror_with(&hub, "acme/Range-GGUF", "m-Q4_0.gguf", content.clone()).await;
    for garbage in [
        &b"bytes=abc"[..],
        b"bytes=1-2,5-6",
        b"pages=1-2",
        b"bytes=-",
        b"bytes=\xff-1",
    ] {
        let r = get_range(&url, garbage).await;
        let shown = String::from_utf8_lossy(garbage);
        assert_eq!(r.status(), 400, "{shown}");
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(body["field"], "Range", "{shown}: {body}");
        assert!(
            body["valid"].as_str().unwrap().contains("bytes=START-END"),
            "{body}"
        );
    }
    for unsatisfiable in [
        &b"bytes=500-100"[..],
        b"bytes=1000-",
        b"bytes=5000-6000",
        b"bytes=-0",
    ] {
        let r = get_range(&url, unsatisfiable).await;
        assert_eq!(
            r.status(),
            416,
            "{}",
            String::from_utf8_lossy(unsatisfiable)
        );
        assert_eq!(r.headers()["content-range"], "bytes */1000");
    }
    let r = get_range(&url, b"bytes=-10").await;
    assert_eq!(r.status(), 206);
    assert_eq!(r.headers()["content-range"], "bytes 990-999/1000");
    assert_eq!(r.bytes().await.unwrap().to_vec(), content[990..].to_vec());
    let r = get_range(&url, b"bytes=900-5000").await;
    assert_eq!(r.status(), 206, "an end beyond the file is cut at its end");
    assert_eq!(r.bytes().await.unwrap().len(), 100);
    let whole = reqwest::get(&url).await.unwrap();
    assert_eq!(whole.status(), 200);
    assert_eq!(whole.bytes().await.unwrap().to_vec(), content);
}

#[tokio::test]
async fn a_malformed_non_utf8_or_folder_path_gets_a_4xx_and_never_a_file() {
    let hub = FakeHub::start().await;
    let (m, url) = mirror_with(&hub, "acme/Path-GGUF", "Q4_0/m-Q4_0.gguf", bytes(100, 12)).await;
    let base = url.trim_end_matches("/Q4_0/m-Q4_0.gguf").to_string();
    for (path, code) in [
        ("%FF%FE.gguf", 400),
        ("Q4_0//m-Q4_0.gguf", 400),
        ("Q4_0%2F..%2F..%2Fx", 400),
        ("Q4_0%5Cm.gguf", 400),
        ("m%00.gguf", 400),
        ("Q4_0", 404),
        ("Q4_0/other.gguf", 404),
    ] {
        let r = reqwest::get(format!("{base}/{path}")).await.unwrap();
        assert_eq!(r.status().as_u16(), code, "{path}");
        let body: serde_json::Value = r.json().await.unwrap_or_default();
        assert!(body["error"].is_string(), "{path}: {body}");
    }
    let r = reqwest::get(format!(
        "{}/v1/files/acme/Path-GGUF/{}/m.gguf",
        m.url,
        "C".repeat(40)
    ))
    .await
    .unwrap();
    assert_eq!(r.status(), 400, "an unpinned or upper-case commit");
    assert_eq!(reqwest::get(&url).await.unwrap().status(), 200);
}

#[tokio::test]
async fn a_cyrillic_file_name_is_mirrored_verified_and_served() {
    let hub = FakeHub::start().await;
    let path = "Модели/модель-Q4_K_M-ёж.gguf";
    let content = bytes(300_000, 13);
    let (m, url) = mirror_with(&hub, "acme/Cyrillic-GGUF", path, content.clone()).await;
    let commit = url.split('/').nth(7).unwrap().to_string();
    let snap = m.dir.path().join(format!(
        "models--acme--Cyrillic-GGUF/snapshots/{commit}/{path}"
    ));
    assert_eq!(std::fs::read(&snap).unwrap(), content);
    let r = get_range(&url, b"bytes=100-199").await;
    assert_eq!(r.status(), 206);
    assert_eq!(
        r.bytes().await.unwrap().to_vec(),
        content[100..200].to_vec()
    );
}

// ---------------------------------------------------------------------------------------------
// A hostile registry: answers that lie about what they carry fail or resume in bounded time,
// and nothing wrong is ever present.

#[derive(Clone, Copy, Debug)]
enum Hostile {
    /// Answers each Range with bytes from one past where it was asked.
    ShiftedRange,
    /// Sends the whole file and then more, chunked (no length announced).
    LongerBody,
    /// Refuses with 403, quoting the request's Authorization header in the body.
    EchoesAuthorization,
}

/// A registry whose resolve endpoint misbehaves as `how` says for a file of `content`.
async fn hostile_registry(content: Vec<u8>, how: Hostile) -> String {
    use axum::body::Body;
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::Response;
    let content = std::sync::Arc::new(content);
    let app = axum::Router::new().route(
        "/{owner}/{name}/resolve/{rev}/{*path}",
        axum::routing::get(move |headers: HeaderMap| {
            let content = content.clone();
            async move {
                let size = content.len() as u64;
                let range = headers
                    .get("range")
                    .and_then(|v| v.to_str().ok())
                    .and_then(|v| v.strip_prefix("bytes="))
                    .and_then(|v| v.split_once('-'))
                    .and_then(|(s, e)| Some((s.parse::<u64>().ok()?, e.parse::<u64>().ok()?)));
                match how {
                    Hostile::ShiftedRange => {
                        let (s, e) = range.unwrap_or((0, size - 1));
                        let s = s + 1;
                        Response::builder()
                            .status(StatusCode::PARTIAL_CONTENT)
                            .header("content-range", format!("bytes {s}-{e}/{size}"))
                            .body(Body::from(content[s as usize..=e as usize].to_vec()))
                            .unwrap()
                    }
                    Hostile::LongerBody => {
                        let chunks = vec![
                            Ok::<_, std::io::Error>(content.to_vec()),
                            Ok(vec![0u8; 4096]),
                        ];
                        Response::builder()
                            .status(StatusCode::OK)
                            .body(Body::from_stream(futures::stream::iter(chunks)))
                            .unwrap()
                    }
                    Hostile::EchoesAuthorization => {
                        let auth = headers
                            .get("authorization")
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("none")
                            .to_string();
                        Response::builder()
                            .status(StatusCode::FORBIDDEN)
                            .body(Body::from(format!("no access for {auth}")))
                            .unwrap()
                    }
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    url
}

fn hostile_ref(content: &[u8]) -> FileRef {
    use sha2::Digest;
    FileRef {
        repo: "acme/Hostile-GGUF".into(),
        commit: "e".repeat(40),
        path: "m-Q8_0.gguf".into(),
        sha256: hex::encode(sha2::Sha256::digest(content)),
        size: content.len() as u64,
    }
}

#[tokio::test]
async fn a_registry_whose_content_range_is_not_the_range_asked_for_fails_in_bounded_time() {
    let content = bytes(100_000, 14);
    let registry = hostile_registry(content.clone(), Hostile::ShiftedRange).await;
    let (url, dir) = start_mirror(&registry).await;
    let file = hostile_ref(&content);
    let started = std::time::Instant::now();
    let s = settled(&url, std::slice::from_ref(&file)).await;
    assert_eq!(s.files[0].state, "failed", "{s:?}");
    let err = s.files[0].error.as_deref().unwrap();
    assert!(
        err.contains("asked for bytes 0-99999, the registry sent 1-99999")
            && err.contains("without progress"),
        "{err}"
    );
    assert!(started.elapsed() < Duration::from_secs(20));
    assert!(
        !dir.path()
            .join(format!(
                "models--acme--Hostile-GGUF/snapshots/{}",
                file.commit
            ))
            .exists(),
        "nothing shifted is present"
    );
}

#[tokio::test]
async fn a_registry_that_sends_more_than_the_file_fails_with_the_size_and_keeps_nothing() {
    let content = bytes(50_000, 15);
    let registry = hostile_registry(content.clone(), Hostile::LongerBody).await;
    let (url, dir) = start_mirror(&registry).await;
    let file = hostile_ref(&content);
    let s = settled(&url, std::slice::from_ref(&file)).await;
    assert_eq!(s.files[0].state, "failed", "{s:?}");
    let err = s.files[0].error.as_deref().unwrap();
    assert!(
        err.contains(
            "m-Q8_0.gguf: the registry sent more than the 50000 bytes expected from byte 0"
        ),
        "{err}"
    );
    let metrics = reqwest::get(format!("{url}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains("modelserve_mirror_failures_total{kind=\"size\"} 1"),
        "{metrics}"
    );
    assert!(
        !dir.path()
            .join(format!(
                "models--acme--Hostile-GGUF/snapshots/{}",
                file.commit
            ))
            .exists()
    );
}

/// A buffer that a tracing subscriber writes every event into.
#[derive(Clone, Default)]
struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

#[tokio::test]
async fn a_token_sent_with_a_fetch_never_reaches_a_log_line_a_status_or_the_metrics() {
    // Every event of this test's runtime (one thread), at every level, is kept.
    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    let token = "hf_ThisIsTheSecretToken0123456789";

    // A gated repository the token may read: the download works and logs as usual.
    let hub = FakeHub::start().await;
    let f = HubFile::with_bytes("gated-Q4_0.gguf", bytes(200_000, 16));
    let commit = hub.add_repo("acme/Gated-GGUF", vec![f.clone()]);
    hub.set_gated("acme/Gated-GGUF", "manual");
    hub.add_token(token, &["acme/Gated-GGUF"]);
    let m = mirror(&hub).await;
    let req = Request {
        files: refs("acme/Gated-GGUF", &commit, std::slice::from_ref(&f)),
        token: Some(modelserve::secret::Secret::new(token)),
    };
    assert!(!format!("{req:?}").contains(token));
    let ask = async |url: &str, req: &Request| {
        eventually(Duration::from_secs(30), async || {
            let r = reqwest::Client::new()
                .post(format!("{url}/v1/fetch"))
                .json(req)
                .send()
                .await
                .ok()?;
            let text = r.text().await.ok()?;
            let s: Status = serde_json::from_str(&text).ok()?;
            s.files
                .iter()
                .all(|f| f.state == "present" || f.state == "failed")
                .then_some((s, text))
        })
        .await
        .expect("the mirror settles")
    };
    let (s, answer) = ask(&m.url, &req).await;
    assert_eq!(s.files[0].state, "present", "{s:?}");
    assert!(!answer.contains(token), "{answer}");

    // A registry that quotes the token back in its refusal.
    let content = bytes(1000, 17);
    let registry = hostile_registry(content.clone(), Hostile::EchoesAuthorization).await;
    let (url, _dir) = start_mirror(&registry).await;
    let req = Request {
        files: vec![hostile_ref(&content)],
        token: Some(modelserve::secret::Secret::new(token)),
    };
    let (s, answer) = ask(&url, &req).await;
    assert_eq!(s.files[0].state, "failed", "{s:?}");
    let err = s.files[0].error.as_deref().unwrap();
    assert!(err.contains("no access for Bearer <redacted>"), "{err}");
    assert!(!answer.contains(token), "{answer}");

    for u in [&m.url, &url] {
        let metrics = reqwest::get(format!("{u}/metrics"))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert!(!metrics.contains(token), "{metrics}");
    }
    let logs = logs.text();
    assert!(
        logs.contains("mirrored and verified") && logs.contains("mirroring failed"),
        "the capture sees the mirror's log lines:\n{logs}"
    );
    assert!(!logs.contains(token), "the token is in the log:\n{logs}");
}

#[tokio::test]
async fn more_files_than_the_mirror_queues_are_refused_with_503_until_some_finish() {
    let hub = FakeHub::start().await;
    let files: Vec<HubFile> = (1..=3)
        .map(|i| HubFile::with_bytes(&format!("q-{i}-Q8_0.gguf"), bytes(256 << 10, i)))
        .collect();
    let commit = hub.add_repo("acme/Queue-GGUF", files.clone());
    // About half a second per file.
    hub.throttle(512 << 10);
    let policy = modelserve::mirror::fetch::Policy {
        queue: 2,
        ..support::test_policy()
    };
    let (url, _dir) = support::start_mirror_with(&hub.url, policy).await;
    let all = refs("acme/Queue-GGUF", &commit, &files);
    let (first, third) = all.split_at(2);
    assert_eq!(post(&url, first).await.0, 202);
    let r = reqwest::Client::new()
        .post(format!("{url}/v1/fetch"))
        .json(&Request {
            files: third.to_vec(),
            token: None,
        })
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert_eq!(r.headers()["retry-after"], "30");
    let body: serde_json::Value = r.json().await.unwrap();
    assert!(
        body["error"]
            .as_str()
            .unwrap()
            .contains("has 2 files queued or downloading and takes at most 2"),
        "{body}"
    );
    assert_eq!(
        post(&url, first).await.0,
        202,
        "asking after queued files is no new work"
    );
    let s = settled(&url, first).await;
    assert!(s.files.iter().all(|f| f.state == "present"), "{s:?}");
    let s = settled(&url, third).await;
    assert_eq!(
        s.files[0].state, "present",
        "taken once the others finished: {s:?}"
    );
}

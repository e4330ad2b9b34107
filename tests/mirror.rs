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
    let s = settled(&m.url, &want).await;
    assert_eq!(s.files[0].state, "failed");
    let err = s.files[0].error.as_deref().unwrap();
    assert!(
        err.starts_with("huge-BF16.gguf needs 10.0 TiB more on the mirror's volume, which has "),
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

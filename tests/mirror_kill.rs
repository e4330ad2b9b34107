//! Killing things (SIGKILL, real processes) in the middle of a download loses nothing.

mod support;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use modelserve::mirror::store::FileRef;
use modelserve::mirror::{Request, Status};
use support::fake_hub::{FakeHub, HubFile};
use support::{eventually, free_port, modelserve_bin};

fn start_mirror(dir: &std::path::Path, port: u16, registry: &str) -> Child {
    Command::new(modelserve_bin())
        .args([
            "mirror",
            "--dir",
            dir.to_str().unwrap(),
            "--addr",
            &format!("127.0.0.1:{port}"),
            "--registry-endpoint",
            registry,
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the mirror")
}

async fn ask(port: u16, files: &[FileRef]) -> Option<Status> {
    let r = reqwest::Client::new()
        .post(format!("http://127.0.0.1:{port}/v1/fetch"))
        .json(&Request {
            files: files.to_vec(),
            token: None,
        })
        .send()
        .await
        .ok()?;
    r.json().await.ok()
}

#[tokio::test]
async fn a_mirror_killed_at_half_of_a_1_gib_file_resumes_after_restart() {
    let hub = FakeHub::start().await;
    let size = 1usize << 30;
    let content: Vec<u8> = (0..size)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1])
        .collect();
    let f = HubFile::with_bytes("big-F16.gguf", content);
    let commit = hub.add_repo("acme/Big-GGUF", vec![f.clone()]);
    // Four connections of 64 MiB/s each: about four seconds for the whole file.
    hub.throttle(64 << 20);
    let file = FileRef {
        repo: "acme/Big-GGUF".into(),
        commit,
        path: f.path.clone(),
        sha256: f.sha256.clone(),
        size: f.size,
    };
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut mirror = start_mirror(dir.path(), port, &hub.url);

    let half = eventually(Duration::from_secs(120), async || {
        let s = ask(port, std::slice::from_ref(&file)).await?;
        // Past half and between segment ends: four segments are under way.
        (s.bytes_done >= f.size * 6 / 10).then_some(s.bytes_done)
    })
    .await
    .expect("the download gets past half");
    mirror.kill().unwrap(); // SIGKILL
    mirror.wait().unwrap();
    let sent_before = hub.cdn_bytes_sent();
    let requests_before = hub.cdn_log().len();

    let mut mirror = start_mirror(dir.path(), port, &hub.url);
    let done = eventually(Duration::from_secs(180), async || {
        let s = ask(port, std::slice::from_ref(&file)).await?;
        (s.files[0].state == "present" || s.files[0].state == "failed").then_some(s)
    })
    .await
    .expect("the download finishes after the restart");
    mirror.kill().unwrap();
    let _ = mirror.wait();
    assert_eq!(done.files[0].state, "present", "{done:?}");

    // Segments that were under way at the kill continue mid-segment, not from their start.
    let segment = 64u64 << 20;
    let starts: Vec<u64> = hub.cdn_log()[requests_before..]
        .iter()
        .map(|(_, r)| {
            r.as_deref()
                .unwrap()
                .trim_start_matches("bytes=")
                .split('-')
                .next()
                .unwrap()
                .parse()
                .unwrap()
        })
        .collect();
    assert!(
        starts.iter().any(|s| s % segment != 0),
        "no segment resumed where it stopped: {starts:?}"
    );
    let refetched = hub.cdn_bytes_sent() - f.size;
    eprintln!(
        "killed at {half} bytes reported, {sent_before} sent by then; {} requests after the restart, from {starts:?}; re-fetched {refetched} bytes",
        starts.len()
    );
    assert!(
        refetched <= segment,
        "re-fetched {refetched} bytes: more than one {segment}-byte segment"
    );
    let snap = dir.path().join(format!(
        "models--acme--Big-GGUF/snapshots/{}/big-F16.gguf",
        file.commit
    ));
    assert_eq!(std::fs::metadata(snap).unwrap().len(), f.size);
}

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
    let file = support::file_refs("acme/Big-GGUF", &commit, std::slice::from_ref(&f)).remove(0);
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

/// Runs the mirror on a tmpfs of `mib` MiB of its own (a user and mount namespace: no root
/// needed), so its volume really fills up.
fn start_mirror_on_small_volume(
    dir: &std::path::Path,
    mib: u64,
    port: u16,
    registry: &str,
) -> Child {
    let script = format!(
        "mount -t tmpfs -o size={mib}m tmpfs '{dir}' && exec '{bin}' mirror --dir '{dir}' --addr 127.0.0.1:{port} --registry-endpoint '{registry}'",
        dir = dir.display(),
        bin = modelserve_bin(),
    );
    Command::new("unshare")
        .args(["--user", "--map-root-user", "--mount", "sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the mirror under unshare (util-linux)")
}

#[tokio::test]
async fn a_volume_that_fills_up_during_downloads_fails_clearly_and_serves_nothing_half_written() {
    let hub = FakeHub::start().await;
    // Each file fits in the free space on its own, so both start; together they do not fit.
    let files: Vec<HubFile> = (0..2u8)
        .map(|n| {
            let content = (0..30usize << 20)
                .map(|i| (i as u8).wrapping_mul(7).wrapping_add(n))
                .collect();
            HubFile::with_bytes(&format!("part{n}-Q8_0.gguf"), content)
        })
        .collect();
    let commit = hub.add_repo("acme/Full-GGUF", files.clone());
    hub.throttle(8 << 20);
    let refs = support::file_refs("acme/Full-GGUF", &commit, &files);
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut mirror = start_mirror_on_small_volume(dir.path(), 40, port, &hub.url);
    let s = eventually(Duration::from_secs(60), async || {
        let s = ask(port, &refs).await?;
        s.files
            .iter()
            .all(|f| f.state == "present" || f.state == "failed")
            .then_some(s)
    })
    .await
    .expect("the mirror settles");
    let failed: Vec<_> = s.files.iter().filter(|f| f.state == "failed").collect();
    assert!(!failed.is_empty(), "60 MiB cannot fit in 40 MiB: {s:?}");
    for f in &failed {
        let err = f.error.as_deref().unwrap_or_default();
        assert!(
            err.contains(&format!("{} needs", f.path)) && err.contains("on the mirror's volume"),
            "{err}"
        );
    }
    // Whatever is served is whole and right; what failed is not served at all.
    for (r, f) in refs.iter().zip(&files) {
        let resp = reqwest::get(format!(
            "http://127.0.0.1:{port}/v1/files/acme/Full-GGUF/{commit}/{}",
            r.path
        ))
        .await
        .unwrap();
        let present = s
            .files
            .iter()
            .any(|x| x.path == r.path && x.state == "present");
        if present {
            assert_eq!(
                resp.bytes().await.unwrap().to_vec(),
                **f.content.as_ref().unwrap()
            );
        } else {
            assert_eq!(resp.status(), 404, "{} half-written but served", r.path);
        }
    }
    mirror.kill().unwrap();
    let _ = mirror.wait();
}

/// As PID 1 of a container a process has no default action for SIGTERM; the mirror must act on
/// it itself, or every rollout would wait out the pod's grace period before a SIGKILL.
#[tokio::test]
async fn sigterm_stops_the_mirror_with_success() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut mirror = start_mirror(dir.path(), port, "http://127.0.0.1:9");
    let up = eventually(Duration::from_secs(60), async || {
        let r = reqwest::get(format!("http://127.0.0.1:{port}/healthz"))
            .await
            .ok()?;
        r.status().is_success().then_some(())
    })
    .await;
    assert!(up.is_some(), "the mirror did not come up on port {port}");
    let pid = rustix::process::Pid::from_raw(mirror.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    let status = eventually(Duration::from_secs(30), async || {
        let s = mirror.try_wait().unwrap();
        if s.is_none() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        s
    })
    .await;
    let Some(status) = status else {
        mirror.kill().unwrap();
        panic!("the mirror was still running 30 s after SIGTERM");
    };
    // Killed by the signal, a process has no exit code; handling it, the mirror exits 0.
    assert_eq!(status.code(), Some(0), "{status:?}");
}

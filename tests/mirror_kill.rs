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
            "--auth",
            "none",
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
        "mount -t tmpfs -o size={mib}m tmpfs '{dir}' && exec '{bin}' mirror --dir '{dir}' --addr 127.0.0.1:{port} --registry-endpoint '{registry}' --auth none",
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
async fn a_set_the_small_volume_cannot_hold_is_refused_clearly_and_nothing_is_half_written() {
    let hub = FakeHub::start().await;
    // Each file fits in the free space on its own; together they do not.
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
    let post = |files: Vec<FileRef>| async move {
        let r = reqwest::Client::new()
            .post(format!("http://127.0.0.1:{port}/v1/fetch"))
            .json(&Request { files, token: None })
            .send()
            .await
            .ok()?;
        let code = r.status().as_u16();
        Some((code, r.json::<serde_json::Value>().await.ok()?))
    };
    // Both at once: refused before a byte is fetched (a real 40 MiB tmpfs).
    let (code, v) = eventually(Duration::from_secs(30), async || post(refs.clone()).await)
        .await
        .expect("the mirror answers");
    assert_eq!(code, 507, "{v}");
    let err = v["error"].as_str().unwrap();
    assert!(
        err.starts_with("the set needs 60.0 MiB on the mirror's volume, which has "),
        "{err}"
    );
    assert!(hub.cdn_log().is_empty(), "nothing was fetched");
    // One, then the other while the first downloads: the second finds its room reserved.
    let (code, _) = post(refs[..1].to_vec()).await.unwrap();
    assert_eq!(code, 202);
    let (code, v) = post(refs[1..].to_vec()).await.unwrap();
    assert_eq!(code, 507, "{v}");
    let err = v["error"].as_str().unwrap();
    assert!(err.contains("reserved by downloads under way"), "{err}");
    assert_ne!(v["reservedBytes"], 0, "{v}");
    let s = eventually(Duration::from_secs(60), async || {
        let s = ask(port, &refs[..1]).await?;
        (s.files[0].state == "present").then_some(s)
    })
    .await;
    assert!(s.is_some(), "the first file did not arrive");
    // What is served is whole and right; what was refused is not served at all.
    for (i, (r, f)) in refs.iter().zip(&files).enumerate() {
        let resp = reqwest::get(format!(
            "http://127.0.0.1:{port}/v1/files/acme/Full-GGUF/{commit}/{}",
            r.path
        ))
        .await
        .unwrap();
        if i == 0 {
            assert_eq!(
                resp.bytes().await.unwrap().to_vec(),
                **f.content.as_ref().unwrap()
            );
        } else {
            assert_eq!(resp.status(), 404, "{} served though refused", r.path);
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

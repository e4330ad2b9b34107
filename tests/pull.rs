//! `modelserve pull`, the replicas' init container, run as a real process: against a real mirror
//! for a sharded set in a sub-folder, and against a small file server of this test that cuts,
//! stalls, ignores Range or sends wrong bytes on demand; a full filesystem is a real 1 MiB tmpfs.

mod support;

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Path as AxPath, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sha2::{Digest, Sha256};
use support::fake_hub::{FakeHub, HubFile};
use support::{eventually, free_port, modelserve_bin, start_mirror};

const REPO: &str = "acme/M-GGUF";
const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

fn bytes(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 9) as u8)
        .collect()
}

fn sha(b: &[u8]) -> String {
    hex::encode(Sha256::digest(b))
}

/// `SHA256:SIZE:PATH` for the pull's `--file`.
fn spec(path: &str, content: &[u8]) -> String {
    format!("{}:{}:{path}", sha(content), content.len())
}

/// What one run of the binary did.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn ok(&self) -> bool {
        self.code == Some(0)
    }
}

impl std::fmt::Debug for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?}\n--- stderr\n{}--- stdout\n{}",
            self.code, self.stderr, self.stdout
        )
    }
}

async fn output(cmd: &mut tokio::process::Command) -> Run {
    let out = cmd
        .env("RUST_LOG", "warn")
        .kill_on_drop(true)
        .output()
        .await
        .expect("run the command");
    Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into(),
        stderr: String::from_utf8_lossy(&out.stderr).into(),
    }
}

/// The contract's flags of one `modelserve pull`; tests change what they need.
#[derive(Clone)]
struct Flags {
    mirror: String,
    repo: String,
    commit: String,
    dest: PathBuf,
    files: Vec<String>,
    extra: Vec<String>,
}

impl Flags {
    fn new(mirror: &str, dest: &Path, files: &[String]) -> Flags {
        Flags {
            mirror: mirror.into(),
            repo: REPO.into(),
            commit: COMMIT.into(),
            dest: dest.into(),
            files: files.to_vec(),
            extra: Vec::new(),
        }
    }

    fn cmd(&self) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(modelserve_bin());
        c.args(["pull", "--mirror", &self.mirror, "--repo", &self.repo])
            .args(["--commit", &self.commit])
            .arg("--dest")
            .arg(&self.dest);
        for f in &self.files {
            c.args(["--file", f]);
        }
        c.args(&self.extra);
        c
    }

    async fn run(&self) -> Run {
        output(&mut self.cmd()).await
    }
}

async fn pull(mirror: &str, dest: &Path, files: &[String]) -> Run {
    Flags::new(mirror, dest, files).run().await
}

/// Every file under `dir`, relative, sorted.
fn listing(dir: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                out.push(p.strip_prefix(root).unwrap().to_string_lossy().into());
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, dir, &mut out);
    out.sort();
    out
}

// ---------------------------------------------------------------------------------------------
// Against the real mirror.

#[tokio::test]
async fn a_sharded_set_in_a_sub_folder_is_pulled_from_the_mirror_verified_and_kept() {
    let hub = FakeHub::start().await;
    let shards = [
        ("Q4_K_M/m-Q4_K_M-00001-of-00002.gguf", bytes(700_000, 1)),
        ("Q4_K_M/m-Q4_K_M-00002-of-00002.gguf", bytes(300_000, 2)),
    ];
    let files: Vec<HubFile> = shards
        .iter()
        .map(|(p, b)| HubFile::with_bytes(p, b.clone()))
        .collect();
    let commit = hub.add_repo(REPO, files.clone());
    let (mirror, _store) = start_mirror(&hub.url).await;
    support::mirror_present(&mirror, REPO, &commit, &files).await;
    let dest = tempfile::tempdir().unwrap();
    let models = dest.path().join("models");
    let specs: Vec<String> = shards.iter().map(|(p, b)| spec(p, b)).collect();

    let mut flags = Flags::new(&mirror, &models, &specs);
    flags.commit = commit.clone();
    let run = flags.run().await;
    assert!(run.ok(), "{run:?}");
    for (p, b) in &shards {
        assert_eq!(&std::fs::read(models.join(p)).unwrap(), b, "{p}");
    }
    assert_eq!(
        listing(&models),
        shards
            .iter()
            .map(|(p, _)| p.to_string())
            .collect::<Vec<_>>(),
        "nothing but the two shards (no .part left)"
    );
    assert!(
        run.stderr.contains(&format!(
            "all 2 file(s) present and verified in {}",
            models.display()
        )),
        "{run:?}"
    );

    // A second run (a restarted init container) checks what is there and fetches nothing: the
    // mirror's address is now a closed port.
    let closed = format!("http://127.0.0.1:{}", free_port());
    let again = Flags {
        mirror: closed,
        ..flags.clone()
    }
    .run()
    .await;
    assert!(again.ok(), "{again:?}");
    assert_eq!(
        again
            .stderr
            .matches("already present, sha256 verified")
            .count(),
        2,
        "{again:?}"
    );

    // A damaged copy in place (same size) is replaced, not trusted.
    let first = models.join(shards[0].0);
    let mut damaged = shards[0].1.clone();
    damaged[1234] ^= 0xff;
    std::fs::write(&first, &damaged).unwrap();
    let repaired = flags.run().await;
    assert!(repaired.ok(), "{repaired:?}");
    assert_eq!(std::fs::read(&first).unwrap(), shards[0].1);

    // A file the mirror does not have fails at once, saying so.
    let missing = spec("Q4_K_M/other.gguf", &bytes(10, 3));
    let run = Flags {
        files: vec![missing],
        ..flags.clone()
    }
    .run()
    .await;
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(
        run.stderr
            .contains("Q4_K_M/other.gguf is not on the mirror (http://127.0.0.1:"),
        "{run:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Against a file server that misbehaves on demand.

/// What the server does with one request.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// Sends up to this offset of the file, then breaks the connection.
    CutAt(u64),
    /// Sends up to this offset, then sends nothing more (the connection stays open).
    StallAt(u64),
    /// Sends up to this offset, waits, then sends the rest.
    PauseAt(u64, Duration),
    /// Answers a Range request with 200 and the whole file.
    IgnoreRange,
    /// Sends the right number of bytes with one of them wrong.
    Corrupt,
    /// Answers a Range request with 206 and bytes from one past where it was asked.
    ShiftedRange,
    /// Sends the whole file and this many bytes more, chunked (no length announced).
    Longer(u64),
    /// Refuses with this status and an error body that never ends.
    RefuseEndlessly(u16),
}

#[derive(Default)]
struct Served {
    /// Faults for the next requests, in order; requests after them are served normally.
    faults: VecDeque<Fault>,
    /// The Range header of every request.
    ranges: Vec<Option<String>>,
}

/// A file server speaking the mirror's file API for one file.
#[derive(Clone)]
struct FileServer {
    url: String,
    content: Arc<Vec<u8>>,
    state: Arc<Mutex<Served>>,
    sent: Arc<AtomicU64>,
}

impl FileServer {
    async fn start(content: Vec<u8>) -> FileServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let s = FileServer {
            url: format!("http://{}", listener.local_addr().unwrap()),
            content: Arc::new(content),
            state: Arc::default(),
            sent: Arc::default(),
        };
        let app = Router::new()
            .route("/v1/files/{owner}/{name}/{commit}/{*path}", get(serve))
            .with_state(s.clone());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        s
    }

    fn fault(&self, f: Fault) {
        self.state.lock().unwrap().faults.push_back(f);
    }

    fn ranges(&self) -> Vec<Option<String>> {
        self.state.lock().unwrap().ranges.clone()
    }

    fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }
}

async fn serve(
    State(s): State<FileServer>,
    AxPath((_, _, _, _)): AxPath<(String, String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let range = headers
        .get(header::RANGE)
        .and_then(|v| v.to_str().ok())
        .map(String::from);
    let fault = {
        let mut st = s.state.lock().unwrap();
        st.ranges.push(range.clone());
        st.faults.pop_front()
    };
    let size = s.content.len() as u64;
    if let Some(early) = hostile(&s, fault, range.as_deref()) {
        return early;
    }
    let start = range
        .as_deref()
        .and_then(|r| {
            r.strip_prefix("bytes=")?
                .strip_suffix('-')?
                .parse::<u64>()
                .ok()
        })
        .filter(|_| !matches!(fault, Some(Fault::IgnoreRange)))
        .unwrap_or(0);
    let mut body = s.content[start as usize..].to_vec();
    if let Some(Fault::Corrupt) = fault {
        let mid = body.len() / 2;
        body[mid] ^= 0x55;
    }
    let (stop, pause) = match fault {
        Some(Fault::CutAt(at)) => (Some((at, false)), None),
        Some(Fault::StallAt(at)) => (Some((at, true)), None),
        Some(Fault::PauseAt(at, d)) => (None, Some((at, d))),
        _ => (None, None),
    };
    let sent = s.sent.clone();
    let chunks = futures::stream::unfold(start, move |pos| {
        let body = body.clone();
        let sent = sent.clone();
        async move {
            let end = start + body.len() as u64;
            if pos >= end {
                return None;
            }
            let mut next = (pos + 16 * 1024).min(end);
            if let Some((at, _)) = pause.filter(|(at, _)| pos < *at) {
                next = next.min(at);
            }
            if let Some((at, stall)) = stop {
                if pos >= at {
                    // Time for the connection to hand over what was sent before it breaks.
                    let wait = if stall { 3600 } else { 1 };
                    tokio::time::sleep(Duration::from_secs(wait)).await;
                    return Some((Err(std::io::Error::other("cut")), end));
                }
                next = next.min(at);
            }
            if let Some((at, d)) = pause
                && pos == at
            {
                tokio::time::sleep(d).await;
            }
            let chunk = body[(pos - start) as usize..(next - start) as usize].to_vec();
            sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            Some((Ok::<_, std::io::Error>(chunk), next))
        }
    });
    let len = size - start;
    let mut resp = Response::builder()
        .header(header::ACCEPT_RANGES, "bytes")
        .header(header::CONTENT_LENGTH, len.to_string());
    resp = if start > 0 {
        resp.status(StatusCode::PARTIAL_CONTENT).header(
            header::CONTENT_RANGE,
            format!("bytes {start}-{}/{size}", size - 1),
        )
    } else {
        resp.status(StatusCode::OK)
    };
    resp.body(Body::from_stream(chunks))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// The answer of a fault that is not a well-formed copy of the file, if `fault` is one.
fn hostile(s: &FileServer, fault: Option<Fault>, range: Option<&str>) -> Option<Response> {
    let size = s.content.len() as u64;
    match fault? {
        Fault::ShiftedRange => {
            let asked: u64 = range?
                .strip_prefix("bytes=")?
                .strip_suffix('-')?
                .parse()
                .ok()?;
            let from = asked + 1;
            let body = s.content[from as usize..].to_vec();
            s.sent.fetch_add(body.len() as u64, Ordering::Relaxed);
            Response::builder()
                .status(StatusCode::PARTIAL_CONTENT)
                .header(
                    header::CONTENT_RANGE,
                    format!("bytes {from}-{}/{size}", size - 1),
                )
                .body(Body::from(body))
                .ok()
        }
        Fault::Longer(extra) => {
            let chunks = vec![
                Ok::<_, std::io::Error>(s.content.to_vec()),
                Ok(vec![0u8; extra as usize]),
            ];
            Response::builder()
                .status(StatusCode::OK)
                .body(Body::from_stream(futures::stream::iter(chunks)))
                .ok()
        }
        Fault::RefuseEndlessly(status) => {
            let sent = s.sent.clone();
            let endless = futures::stream::repeat_with(move || {
                sent.fetch_add(64 << 10, Ordering::Relaxed);
                Ok::<_, std::io::Error>(vec![b'x'; 64 << 10])
            });
            Response::builder()
                .status(status)
                .body(Body::from_stream(endless))
                .ok()
        }
        _ => None,
    }
}

#[tokio::test]
async fn a_broken_connection_resumes_from_where_it_stopped() {
    let content = bytes(1_000_000, 5);
    let server = FileServer::start(content.clone()).await;
    server.fault(Fault::CutAt(300_000));
    let dest = tempfile::tempdir().unwrap();
    let run = pull(&server.url, dest.path(), &[spec("m.gguf", &content)]).await;
    assert!(run.ok(), "{run:?}");
    assert_eq!(std::fs::read(dest.path().join("m.gguf")).unwrap(), content);
    assert_eq!(
        server.ranges(),
        [None, Some("bytes=300000-".into())],
        "the second request continues at the cut"
    );
    assert_eq!(server.sent(), 1_000_000, "no byte is sent twice");
}

#[tokio::test]
async fn a_copy_killed_midway_is_resumed_by_the_next_run_without_fetching_its_bytes_again() {
    let content = bytes(1_000_000, 6);
    let server = FileServer::start(content.clone()).await;
    server.fault(Fault::StallAt(400_000));
    let dest = tempfile::tempdir().unwrap();
    let part = dest.path().join("Q8_0/m.gguf.part");
    let mut first = Flags::new(&server.url, dest.path(), &[spec("Q8_0/m.gguf", &content)])
        .cmd()
        .kill_on_drop(true)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let reached = eventually(Duration::from_secs(20), async || {
        (std::fs::metadata(&part).ok()?.len() == 400_000).then_some(())
    })
    .await;
    assert!(
        reached.is_some(),
        "the first run did not write 400000 bytes"
    );
    // As a kubelet does to an init container of a pod being replaced.
    first.start_kill().unwrap();
    first.wait().await.unwrap();
    assert!(!dest.path().join("Q8_0/m.gguf").exists());

    let second = pull(&server.url, dest.path(), &[spec("Q8_0/m.gguf", &content)]).await;
    assert!(second.ok(), "{second:?}");
    assert!(
        second
            .stderr
            .contains("Q8_0/m.gguf: resuming at 390.6 KiB of 976.6 KiB"),
        "{second:?}"
    );
    assert_eq!(
        std::fs::read(dest.path().join("Q8_0/m.gguf")).unwrap(),
        content
    );
    assert!(!part.exists());
    assert_eq!(server.ranges(), [None, Some("bytes=400000-".into())]);
    assert_eq!(
        server.sent(),
        1_000_000,
        "the second run sent only the rest"
    );
}

#[tokio::test]
async fn a_stalled_mirror_is_abandoned_after_the_stall_timeout_and_the_copy_resumes() {
    let content = bytes(500_000, 7);
    let server = FileServer::start(content.clone()).await;
    server.fault(Fault::StallAt(200_000));
    let dest = tempfile::tempdir().unwrap();
    let started = std::time::Instant::now();
    let mut flags = Flags::new(&server.url, dest.path(), &[spec("m.gguf", &content)]);
    flags.extra = vec!["--stall-timeout".into(), "1".into()];
    let run = flags.run().await;
    assert!(run.ok(), "{run:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "took {:?}",
        started.elapsed()
    );
    assert!(
        run.stderr
            .contains("the mirror sent nothing for 1s at byte 200000"),
        "{run:?}"
    );
    assert_eq!(server.ranges(), [None, Some("bytes=200000-".into())]);
    assert_eq!(std::fs::read(dest.path().join("m.gguf")).unwrap(), content);
}

#[tokio::test]
async fn a_server_answering_a_range_with_the_whole_file_is_copied_from_the_start() {
    let content = bytes(300_000, 8);
    let server = FileServer::start(content.clone()).await;
    server.fault(Fault::IgnoreRange);
    let dest = tempfile::tempdir().unwrap();
    // Left by an earlier run: the right first 100000 bytes.
    std::fs::write(dest.path().join("m.gguf.part"), &content[..100_000]).unwrap();
    let run = pull(&server.url, dest.path(), &[spec("m.gguf", &content)]).await;
    assert!(run.ok(), "{run:?}");
    assert_eq!(server.ranges(), [Some("bytes=100000-".into())]);
    assert_eq!(server.sent(), 300_000);
    assert_eq!(std::fs::read(dest.path().join("m.gguf")).unwrap(), content);
}

#[tokio::test]
async fn a_mirror_file_of_another_size_than_published_fails_at_once() {
    let content = bytes(100_000, 2);
    let server = FileServer::start(content.clone()).await;
    let dest = tempfile::tempdir().unwrap();
    let published = format!("{}:100001:m.gguf", sha(&content));
    let run = pull(&server.url, dest.path(), &[published]).await;
    assert_eq!(run.code, Some(1), "{run:?}");
    assert!(
        run.stderr.ends_with(
            "modelserve: m.gguf: the mirror has a file of 100000 bytes where the registry published 100001; the mirror's copy is not the published file\n"
        ),
        "{run:?}"
    );
    assert_eq!(server.ranges().len(), 1, "one request, no retries");
    assert!(
        listing(dest.path()).is_empty(),
        "{:?}",
        listing(dest.path())
    );
}

#[tokio::test]
async fn wrong_bytes_are_fetched_three_times_then_refused_and_never_put_in_place() {
    let content = bytes(200_000, 9);
    let mut corrupt = content.clone();
    corrupt[100_000] ^= 0x55;
    let server = FileServer::start(content.clone()).await;
    for _ in 0..3 {
        server.fault(Fault::Corrupt);
    }
    let dest = tempfile::tempdir().unwrap();
    let run = pull(&server.url, dest.path(), &[spec("sub/m.gguf", &content)]).await;
    assert_eq!(run.code, Some(1), "{run:?}");
    let last = run.stderr.lines().last().unwrap_or_default();
    assert_eq!(
        last,
        format!(
            "modelserve: sub/m.gguf arrived with sha256 {}, the mirror published {} (3 attempts)",
            sha(&corrupt),
            sha(&content)
        )
    );
    assert_eq!(server.ranges().len(), 3, "three whole copies, no fourth");
    assert!(
        listing(dest.path()).is_empty(),
        "{:?}",
        listing(dest.path())
    );
}

#[tokio::test]
async fn bad_flags_fail_in_one_line_naming_the_flag_before_anything_is_fetched() {
    let server = FileServer::start(bytes(10, 1)).await;
    let dest = tempfile::tempdir().unwrap();
    let models = dest.path().join("models");
    let good = Flags::new(&server.url, &models, &[spec("m.gguf", &bytes(10, 1))]);
    let x = sha(b"x");
    let with_file = |f: &str| Flags {
        files: vec![f.into()],
        ..good.clone()
    };
    let cases = [
        (
            with_file("abc:10:m.gguf"),
            "modelserve: --file \"abc:10:m.gguf\": the sha256 must be 64 hex digits",
        ),
        (
            with_file(&format!("{x}:ten:m.gguf")),
            "the size must be a whole number of bytes",
        ),
        (
            with_file(&format!("{x}:10:../etc/passwd")),
            "the path must be relative, inside the destination, without '..'",
        ),
        (
            with_file(&format!("{x}:10:/etc/passwd")),
            "the path must be relative",
        ),
        (with_file(&format!("{x}:10")), "it must be SHA256:SIZE:PATH"),
        (
            Flags {
                repo: "acme".into(),
                ..good.clone()
            },
            "modelserve: --repo \"acme\": it must be owner/name",
        ),
        (
            Flags {
                commit: "main".into(),
                ..good.clone()
            },
            "modelserve: --commit \"main\": it must be the pinned commit, 40 hex digits",
        ),
        (
            Flags {
                mirror: "mirror:8090".into(),
                ..good.clone()
            },
            "modelserve: --mirror \"mirror:8090\": it must be an http(s) URL",
        ),
    ];
    for (flags, want) in cases {
        let run = flags.run().await;
        assert_eq!(run.code, Some(1), "{want}: {run:?}");
        assert_eq!(run.stderr.lines().count(), 1, "{want}: {run:?}");
        assert!(run.stderr.contains(want), "{want}: {run:?}");
    }
    let run = Flags {
        files: vec![],
        ..good.clone()
    }
    .run()
    .await;
    assert_eq!(
        run.code,
        Some(2),
        "no --file at all is a usage error: {run:?}"
    );
    assert!(run.stderr.contains("--file <SHA256:SIZE:PATH>"), "{run:?}");
    assert!(server.ranges().is_empty(), "nothing was fetched");
    assert!(!models.exists(), "nothing was created");
}

// ---------------------------------------------------------------------------------------------
// A full filesystem: a real 1 MiB tmpfs, mounted in a private mount namespace of the child (a
// user namespace makes that work without root), so nothing is left mounted on the host.

/// Runs `script` with `$DEST` a fresh 1 MiB tmpfs and `$PULL` the binary, in its own namespace.
async fn in_tiny_tmpfs(script: &str) -> Run {
    let mount_point = tempfile::tempdir().unwrap();
    let probe = output(tokio::process::Command::new("unshare").args(["-rm", "true"])).await;
    assert!(
        probe.ok(),
        "this test mounts a tmpfs in a user+mount namespace: `unshare -rm true` must work \
         (util-linux, unprivileged user namespaces): {probe:?}"
    );
    let full = format!("set -u; mount -t tmpfs -o size=1m tmpfs \"$DEST\" || exit 97\n{script}");
    output(
        tokio::process::Command::new("unshare")
            .args(["-rm", "sh", "-c", &full])
            .env("DEST", mount_point.path())
            .env("PULL", modelserve_bin()),
    )
    .await
}

#[tokio::test]
async fn a_file_larger_than_the_free_space_fails_before_any_byte_moves() {
    let content = bytes(2 << 20, 3);
    let server = FileServer::start(content.clone()).await;
    let script = format!(
        "\"$PULL\" pull --mirror {} --repo {REPO} --commit {COMMIT} --dest \"$DEST\" --file {}\n\
         rc=$?; find \"$DEST\" -type f; exit $rc",
        server.url,
        spec("big.gguf", &content)
    );
    let run = in_tiny_tmpfs(&script).await;
    assert_ne!(run.code, Some(97), "mount failed: {run:?}");
    assert_eq!(run.code, Some(1), "{run:?}");
    let last = run.stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("modelserve: big.gguf needs 2.0 MiB more in /")
            && last.ends_with(", which has 1.0 MiB free"),
        "{run:?}"
    );
    assert!(server.ranges().is_empty(), "nothing was requested");
    assert_eq!(run.stdout, "", "no file was written");

    // Shards that each fit but not together fail before the first one is copied.
    let half = &content[..600_000];
    let script = format!(
        "\"$PULL\" pull --mirror {} --repo {REPO} --commit {COMMIT} --dest \"$DEST\" --file {} --file {}\n\
         rc=$?; find \"$DEST\" -type f; exit $rc",
        server.url,
        spec("a.gguf", half),
        spec("b.gguf", half)
    );
    let run = in_tiny_tmpfs(&script).await;
    assert_eq!(run.code, Some(1), "{run:?}");
    let last = run.stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("modelserve: the 2 files still to pull need 1.1 MiB in /")
            && last.ends_with(", which has 1.0 MiB free"),
        "{run:?}"
    );
    assert!(server.ranges().is_empty(), "nothing was requested");
    assert_eq!(run.stdout, "", "no file was written");
}

#[tokio::test]
async fn a_filesystem_that_fills_up_while_writing_fails_clearly_and_leaves_nothing_in_place() {
    let content = bytes(819_200, 4);
    let server = FileServer::start(content.clone()).await;
    // The server pauses after 100000 bytes; meanwhile something else fills the volume.
    server.fault(Fault::PauseAt(100_000, Duration::from_secs(3)));
    let script = format!(
        "\"$PULL\" pull --mirror {} --repo {REPO} --commit {COMMIT} --dest \"$DEST\" --file {} &\n\
         pid=$!\n\
         i=0; while [ \"$(stat -c %s \"$DEST/m.gguf.part\" 2>/dev/null || echo 0)\" -lt 100000 ]; do\n\
           i=$((i+1)); [ $i -gt 200 ] && echo 'no partial copy appeared' >&2 && exit 98; sleep 0.05; done\n\
         dd if=/dev/zero of=\"$DEST/other\" bs=4096 2>/dev/null\n\
         wait $pid; rc=$?; find \"$DEST\" -type f | sed \"s|$DEST/||\"; exit $rc",
        server.url,
        spec("m.gguf", &content)
    );
    let run = in_tiny_tmpfs(&script).await;
    assert_ne!(run.code, Some(97), "mount failed: {run:?}");
    assert_eq!(run.code, Some(1), "{run:?}");
    let last = run.stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("modelserve: /")
            && last.contains(" filled up while writing m.gguf: it needs 800.0 KiB, "),
        "{run:?}"
    );
    assert!(last.contains("(the partial copy of "), "{run:?}");
    assert_eq!(
        run.stdout.trim(),
        "other",
        "neither m.gguf nor its partial copy remain"
    );
}

// ---------------------------------------------------------------------------------------------
// Hostile answers from the mirror, and names in any script.

#[tokio::test]
async fn a_range_answered_from_the_wrong_byte_is_not_written_and_the_copy_still_arrives_right() {
    let content = bytes(600_000, 10);
    let server = FileServer::start(content.clone()).await;
    server.fault(Fault::CutAt(200_000));
    server.fault(Fault::ShiftedRange);
    let dest = tempfile::tempdir().unwrap();
    let run = pull(&server.url, dest.path(), &[spec("m.gguf", &content)]).await;
    assert!(run.ok(), "{run:?}");
    assert!(
        run.stderr.contains(
            "the mirror answered a Range from byte 200000 to the end with bytes 200001-599999"
        ),
        "{run:?}"
    );
    assert_eq!(std::fs::read(dest.path().join("m.gguf")).unwrap(), content);
    assert_eq!(
        server.ranges(),
        [
            None,
            Some("bytes=200000-".into()),
            Some("bytes=200000-".into())
        ],
        "the shifted answer is dropped and asked for again"
    );
}

#[tokio::test]
async fn a_mirror_sending_more_than_the_file_fails_as_the_wrong_size_and_leaves_nothing() {
    let content = bytes(100_000, 11);
    let server = FileServer::start(content.clone()).await;
    server.fault(Fault::Longer(5000));
    let dest = tempfile::tempdir().unwrap();
    let run = pull(&server.url, dest.path(), &[spec("m.gguf", &content)]).await;
    assert_eq!(run.code, Some(1), "{run:?}");
    let last = run.stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("modelserve: m.gguf: the mirror has a file of ")
            && last.contains("bytes where the registry published 100000"),
        "{run:?}"
    );
    assert!(
        listing(dest.path()).is_empty(),
        "{:?}",
        listing(dest.path())
    );
}

#[tokio::test]
async fn an_endless_error_answer_is_quoted_in_one_short_line_and_not_read_to_its_end() {
    let content = bytes(1000, 12);
    let server = FileServer::start(content.clone()).await;
    server.fault(Fault::RefuseEndlessly(403));
    let dest = tempfile::tempdir().unwrap();
    let run = tokio::time::timeout(
        Duration::from_secs(20),
        pull(&server.url, dest.path(), &[spec("m.gguf", &content)]),
    )
    .await
    .expect("the pull ends although the error body never does");
    assert_eq!(run.code, Some(1), "{run:?}");
    let last = run.stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("modelserve: m.gguf: the mirror refused the request: HTTP 403 xxx"),
        "{run:?}"
    );
    assert!(last.len() < 300, "{} characters: {last}", last.len());
}

#[tokio::test]
async fn a_cyrillic_file_name_is_pulled_from_the_mirror_verified() {
    let hub = FakeHub::start().await;
    let path = "Модели/модель-Q4_K_M-ёж.gguf";
    let content = bytes(400_000, 13);
    let files = vec![HubFile::with_bytes(path, content.clone())];
    let commit = hub.add_repo(REPO, files.clone());
    let (mirror, _store) = start_mirror(&hub.url).await;
    support::mirror_present(&mirror, REPO, &commit, &files).await;
    let dest = tempfile::tempdir().unwrap();
    let mut flags = Flags::new(&mirror, dest.path(), &[spec(path, &content)]);
    flags.commit = commit;
    let run = flags.run().await;
    assert!(run.ok(), "{run:?}");
    assert!(
        run.stderr.contains(&format!("{path}: 390.6 KiB verified")),
        "{run:?}"
    );
    assert_eq!(std::fs::read(dest.path().join(path)).unwrap(), content);
    assert_eq!(listing(dest.path()), [path.to_string()]);
}

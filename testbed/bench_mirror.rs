//! Mirror throughput against `curl -o`, over loopback, measured in one run (this machine is
//! noisy, so only ratios between runs made side by side mean anything).
//!
//! 1. A large file (default 2 GiB) from the fake Hub: the mirror (Range segments, sha256
//!    verified, moved into the store) against `curl -L -o` (no hash). Goal: >= 0.9x.
//! 2. The same with every CDN connection capped (default 32 MiB/s): the mirror's parallel
//!    Range connections against one curl stream. Goal: >= 3x.
//!
//!   cargo run --release --example mirror-bench -- [--size-mib 2048] [--capped-mib 256]
//!       [--cap-mib-per-s 32] [--runs 3]

#[path = "../tests/support/fake_hub.rs"]
mod fake_hub;
#[path = "../tests/support/models.rs"]
mod models;

use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fake_hub::{FakeHub, HubFile};
use modelserve::mirror::fetch::Policy;
use modelserve::mirror::store::{FileRef, Store};
use modelserve::mirror::{Mirror, Request, Status, router};

struct Args {
    size_mib: u64,
    capped_mib: u64,
    cap_mib_per_s: u64,
    runs: usize,
    policy: Policy,
}

fn args() -> Args {
    let mut a = Args {
        size_mib: 2048,
        capped_mib: 256,
        cap_mib_per_s: 32,
        runs: 3,
        policy: Policy::default(),
    };
    let argv: Vec<String> = std::env::args().skip(1).collect();
    for pair in argv.chunks(2) {
        let value = || -> u64 {
            pair.get(1)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{} needs a number", pair[0]))
        };
        match pair[0].as_str() {
            "--size-mib" => a.size_mib = value(),
            "--capped-mib" => a.capped_mib = value(),
            "--cap-mib-per-s" => a.cap_mib_per_s = value(),
            "--runs" => a.runs = value() as usize,
            "--connections" => a.policy.connections = value() as usize,
            "--segment-mib" => a.policy.segment = value() << 20,
            other => panic!(
                "unknown argument {other}; valid: --size-mib --capped-mib --cap-mib-per-s --runs --connections --segment-mib"
            ),
        }
    }
    a
}

/// Pseudo-random bytes (xorshift), so nothing along the way can shortcut on patterns.
fn content(bytes: u64, seed: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(bytes as usize);
    let mut x = seed | 1;
    while (out.len() as u64) < bytes {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(bytes as usize);
    out
}

/// CPU seconds used so far by this process (the fake Hub and the mirror) and by its waited-for
/// children (curl), from /proc/self/stat.
fn cpu() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name, which ends with the last ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r).unwrap_or("");
    let f: Vec<f64> = rest
        .split_whitespace()
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    // utime, stime, cutime, cstime are fields 14..=17, that is 11..=14 after the name.
    let tick = 100.0;
    let get = |i: usize| f.get(i).copied().unwrap_or(0.0) / tick;
    (get(11) + get(12), get(13) + get(14))
}

fn curl(url: &str, out: &Path, size: u64) -> Duration {
    let _ = std::fs::remove_file(out);
    let t = Instant::now();
    let status = Command::new("curl")
        .args(["-sS", "-L", "--fail", "-o"])
        .arg(out)
        .arg(url)
        .status()
        .expect("run curl");
    let took = t.elapsed();
    assert!(status.success(), "curl failed: {status}");
    assert_eq!(
        std::fs::metadata(out).unwrap().len(),
        size,
        "curl got the whole file"
    );
    std::fs::remove_file(out).unwrap();
    took
}

async fn mirror_once(registry: &str, file: &FileRef, work: &Path, policy: Policy) -> Duration {
    let dir = work.join("store");
    let _ = std::fs::remove_dir_all(&dir);
    let m = Mirror::new(Store::open(&dir).unwrap(), registry, policy).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, router(m)).await });
    let http = reqwest::Client::new();
    let req = Request {
        files: vec![file.clone()],
        token: None,
    };
    let t = Instant::now();
    let mut arrived = None;
    loop {
        let s: Status = http
            .post(format!("{url}/v1/fetch"))
            .json(&req)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        if arrived.is_none() && s.bytes_done == file.size {
            arrived = Some(t.elapsed());
        }
        match s.files[0].state.as_str() {
            "present" => break,
            "failed" => panic!("the mirror failed: {:?}", s.files[0].error),
            _ => tokio::time::sleep(Duration::from_millis(10)).await,
        }
    }
    let took = t.elapsed();
    if let Some(a) = arrived {
        println!(
            "    (mirror: all bytes in after {:.2} s, verified and in place {:.2} s later)",
            a.as_secs_f64(),
            (took - a).as_secs_f64()
        );
    }
    server.abort();
    std::fs::remove_dir_all(&dir).unwrap();
    took
}

/// Bytes per second one core hashes with sha256 here: no verifying download of one file can be
/// faster, however many connections bring the bytes (the hash of a file is one sequential chain).
fn sha256_rate() -> f64 {
    use sha2::{Digest, Sha256};
    let data = content(256 << 20, 7);
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        std::hint::black_box(Sha256::digest(&data));
        best = best.min(t.elapsed().as_secs_f64());
    }
    data.len() as f64 / best
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn rate(bytes: u64, d: Duration) -> String {
    format!(
        "{:.0} MiB/s",
        bytes as f64 / (1 << 20) as f64 / d.as_secs_f64()
    )
}

async fn compare(
    hub: &FakeHub,
    name: &str,
    bytes: u64,
    runs: usize,
    work: &Path,
    policy: Policy,
) -> (f64, Duration) {
    let f = HubFile::with_bytes(&format!("{name}.gguf"), content(bytes, bytes));
    let repo = format!("bench/{name}-GGUF");
    let commit = hub.add_repo(&repo, vec![f.clone()]);
    let url = format!("{}/{repo}/resolve/{commit}/{}", hub.url, f.path);
    let file = FileRef {
        repo,
        commit,
        path: f.path.clone(),
        sha256: f.sha256.clone(),
        size: f.size,
    };
    let (mut c, mut m) = (Vec::new(), Vec::new());
    for run in 1..=runs {
        // Alternate, so drift on the machine hits both sides alike.
        let curl_url = url.clone();
        let out = work.join("curl.out");
        let before = cpu();
        c.push(
            tokio::task::spawn_blocking(move || curl(&curl_url, &out, bytes))
                .await
                .unwrap(),
        );
        let between = cpu();
        m.push(mirror_once(&hub.url, &file, work, policy).await);
        let after = cpu();
        println!(
            "  run {run}: curl {:>7.2} s ({}), mirror {:>7.2} s ({})",
            c[run - 1].as_secs_f64(),
            rate(bytes, c[run - 1]),
            m[run - 1].as_secs_f64(),
            rate(bytes, m[run - 1]),
        );
        println!(
            "    CPU: curl side {:.2} core-s (Hub {:.2}, curl {:.2}); mirror side {:.2} core-s (Hub and mirror)",
            between.0 - before.0 + between.1 - before.1,
            between.0 - before.0,
            between.1 - before.1,
            after.0 - between.0,
        );
    }
    let (c, m) = (median(c), median(m));
    (c.as_secs_f64() / m.as_secs_f64(), c)
}

#[tokio::main]
async fn main() {
    let a = args();
    let work = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    let hub = Arc::new(FakeHub::start().await);
    let policy = a.policy;
    println!(
        "mirror: {} connections of {} MiB segments, sha256 verified; curl: one stream, no hash",
        policy.connections,
        policy.segment >> 20
    );

    println!("1. {} MiB, uncapped loopback", a.size_mib);
    // Hashing speed at the start and at the end of the run: the better of both counts.
    let sha_before = sha256_rate();
    let (full, curl_full) =
        compare(&hub, "full", a.size_mib << 20, a.runs, work.path(), policy).await;

    println!(
        "2. {} MiB, each CDN connection capped at {} MiB/s",
        a.capped_mib, a.cap_mib_per_s
    );
    hub.throttle(a.cap_mib_per_s << 20);
    let (capped, _) = compare(
        &hub,
        "capped",
        a.capped_mib << 20,
        a.runs,
        work.path(),
        policy,
    )
    .await;

    let sha = sha256_rate().max(sha_before);
    let curl_rate = (a.size_mib << 20) as f64 / curl_full.as_secs_f64();
    println!(
        "sha256 on one core here: {:.0} MiB/s; curl's median uncapped: {:.0} MiB/s; so no verifying \
         download can beat {:.2}x curl on this machine",
        sha / (1 << 20) as f64,
        curl_rate / (1 << 20) as f64,
        sha / curl_rate
    );
    println!("mirror / curl throughput (median of {} runs):", a.runs);
    println!(
        "  uncapped {:.2}x (goal >= 0.9x) {}",
        full,
        if full >= 0.9 { "met" } else { "NOT met" }
    );
    println!(
        "  capped   {:.2}x (goal >= 3x)   {}",
        capped,
        if capped >= 3.0 { "met" } else { "NOT met" }
    );
}

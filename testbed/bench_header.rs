//! Benchmark (not a test): reading the largest vocab GGUF of the llama.cpp sources over HTTP from
//! the fake Hub. Prints bytes fetched against the header's size, and parse time against gguf-py's
//! GGUFReader on the same file, as ratios measured in the same run.
//!   cargo run --release --example header-bench

#[path = "../tests/support/fake_hub.rs"]
mod fake_hub;
#[path = "../tests/support/models.rs"]
mod models;

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

use fake_hub::{FakeHub, HubFile};
use modelserve::gguf::{HubSource, header, read_header};
use modelserve::hub::Hub;

fn sdist() -> PathBuf {
    let out = Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/testbed/llama-sdist.sh"
        ))
        .output()
        .expect("run llama-sdist.sh");
    assert!(
        out.status.success(),
        "llama-sdist.sh failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    PathBuf::from(
        String::from_utf8(out.stdout)
            .unwrap()
            .lines()
            .last()
            .unwrap()
            .trim(),
    )
}

#[tokio::main]
async fn main() {
    let models = sdist().join("vendor/llama.cpp/models");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&models)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    files.sort_by_key(|p| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0));
    let largest = files.last().expect("vocab files").clone();
    let bytes = std::fs::read(&largest).unwrap();
    let name = largest.file_name().unwrap().to_string_lossy().to_string();

    let hub = FakeHub::start().await;
    let commit = hub.add_repo(
        "bench/vocab",
        vec![HubFile::with_bytes(&name, bytes.clone())],
    );
    let client = Hub::new(&hub.url, None).unwrap();
    let mut src = HubSource {
        hub: &client,
        repo: "bench/vocab",
        commit: &commit,
        path: &name,
    };
    let started = Instant::now();
    let read = read_header(&mut src, &name).await.unwrap();
    let http = started.elapsed();
    let header_len = read.header.data_offset;

    const RUNS: u32 = 20;
    let started = Instant::now();
    for _ in 0..RUNS {
        std::hint::black_box(header::parse(&bytes, true).unwrap());
    }
    let ours = started.elapsed() / RUNS;

    let py = format!(
        "import sys,time; sys.path.insert(0, {:?}); from gguf import GGUFReader\n\
         t=time.perf_counter(); n={RUNS}\nfor _ in range(n): r=GGUFReader({:?})\nprint((time.perf_counter()-t)/n)",
        sdist()
            .join("vendor/llama.cpp/gguf-py")
            .display()
            .to_string(),
        largest.display().to_string()
    );
    let out = Command::new("python3")
        .args(["-c", &py])
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "gguf-py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let theirs: f64 = String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap();

    println!(
        "file                 {name} ({} bytes, header {header_len} bytes)",
        bytes.len()
    );
    println!(
        "fetched over HTTP    {} bytes in {:.1} ms = {:.3} x the header",
        read.fetched,
        http.as_secs_f64() * 1e3,
        read.fetched as f64 / header_len as f64
    );
    println!(
        "parse, modelserve    {:.2} ms (mean of {RUNS})",
        ours.as_secs_f64() * 1e3
    );
    println!(
        "parse, gguf-py       {:.2} ms (mean of {RUNS})",
        theirs * 1e3
    );
    println!("speed-up             {:.1} x", theirs / ours.as_secs_f64());
}

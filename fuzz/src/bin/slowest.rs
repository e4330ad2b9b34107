//! Times every input of the given corpus directories through `check` and prints the slowest:
//!   cargo +nightly run --release --bin slowest -- corpus/gguf_header
use std::time::{Duration, Instant};

fn main() {
    let mut times: Vec<(Duration, usize, String)> = Vec::new();
    for dir in std::env::args().skip(1) {
        let entries = std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{dir}: {e}"));
        for entry in entries.flatten() {
            let path = entry.path();
            let Ok(data) = std::fs::read(&path) else {
                continue;
            };
            let start = Instant::now();
            modelserve_fuzz::check(&data);
            times.push((start.elapsed(), data.len(), path.display().to_string()));
        }
    }
    times.sort();
    let total: Duration = times.iter().map(|t| t.0).sum();
    println!("{} inputs, {:?} in all", times.len(), total);
    for (took, len, path) in times.iter().rev().take(5) {
        println!("{took:?}  {len} bytes  {path}");
    }
}

//! llama.cpp's RPC backend as devices for the offload tests: each rpc-server process on a
//! loopback port is one device for `llama-server --rpc` (built with the other tools by
//! testbed/build-llama-tool.sh), the per-buffer figures of the engine's log by buffer name, and
//! llama-fit-params' choice.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running rpc-server: one device.
pub struct RpcServer {
    child: Child,
    /// `127.0.0.1:PORT`, what `--rpc` takes and what the device's buffer names carry.
    pub endpoint: String,
    pub log: PathBuf,
}

impl Drop for RpcServer {
    /// Kills it, and removes its log as `Server` does.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        super::drop_log(&self.log);
    }
}

impl RpcServer {
    /// Starts `bin` on a free loopback port and waits until it accepts connections.
    pub fn start(bin: &Path) -> RpcServer {
        let port = super::free_port();
        let log = std::env::temp_dir().join(format!("rpc-server-{port}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let child = Command::new(bin)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .stdout(file.try_clone().unwrap())
            .stderr(Stdio::from(file))
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        let mut s = RpcServer {
            child,
            endpoint: format!("127.0.0.1:{port}"),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(&s.endpoint).is_err() {
            if let Ok(Some(status)) = s.child.try_wait() {
                panic!(
                    "rpc-server exited ({status}): {}",
                    std::fs::read_to_string(&s.log).unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < deadline,
                "rpc-server not listening in 60 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        s
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// The `--rpc` argument for `servers`.
pub fn rpc_arg(servers: &[RpcServer]) -> String {
    servers
        .iter()
        .map(|s| s.endpoint.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

/// What one kind of buffer ("model", "KV", "RS", "compute", "output", ...) holds, in MiB as
/// the engine prints it (two decimals), summed over its lines, by buffer name (`CPU_Mapped`,
/// `CPU_REPACK`, `CPU`, `RPC0[127.0.0.1:PORT]`).
#[derive(Debug, Default)]
pub struct Buffers(pub BTreeMap<(String, String), f64>);

impl Buffers {
    /// The `"<func>: <name> <kind> buffer size = <MiB> MiB"` lines of `log`.
    pub fn parse(log: &str) -> Buffers {
        let mut b = Buffers::default();
        for line in log.lines() {
            let Some((head, tail)) = line.split_once(" buffer size = ") else {
                continue;
            };
            let Some(mib) = tail
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<f64>().ok())
            else {
                continue;
            };
            // "llama_kv_cache: RPC0[127.0.0.1:1234] KV" or "load_tensors:   CPU_Mapped model".
            let Some((_, rest)) = head.rsplit_once(": ") else {
                continue;
            };
            let mut words = rest.split_whitespace();
            let (Some(name), Some(kind)) = (words.next(), words.next_back()) else {
                continue;
            };
            *b.0.entry((name.to_string(), kind.to_string())).or_default() += mib;
        }
        b
    }

    /// MiB of `kind` in the buffers whose names `on` accepts.
    pub fn sum(&self, kind: &str, on: impl Fn(&str) -> bool) -> f64 {
        self.0
            .iter()
            .filter(|((name, k), _)| k == kind && on(name))
            .map(|(_, mib)| *mib)
            // From 0.0: an empty f64 sum is -0.0, which prints as "-0.00".
            .fold(0.0, |a, b| a + b)
    }

    /// MiB of `kind` on the device at `endpoint` (`RPC<n>[endpoint]`).
    pub fn device(&self, kind: &str, endpoint: &str) -> f64 {
        let tag = format!("[{endpoint}]");
        self.sum(kind, |name| name.starts_with("RPC") && name.ends_with(&tag))
    }

    /// MiB of `kind` in host memory (every buffer not on an RPC device).
    pub fn host(&self, kind: &str) -> f64 {
        self.sum(kind, |name| !name.starts_with("RPC"))
    }

    /// Every kind of buffer on the host, summed.
    pub fn host_total(&self) -> f64 {
        self.0
            .iter()
            .filter(|((name, _), _)| !name.starts_with("RPC"))
            .map(|(_, mib)| *mib)
            .fold(0.0, |a, b| a + b)
    }
}

/// The process's peak resident set (VmHWM) in bytes.
pub fn peak_rss(pid: u32) -> u64 {
    status_kb(pid, "VmHWM:") * 1024
}

/// A `/proc/<pid>/status` figure in kB.
fn status_kb(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().strip_suffix("kB")?.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// Sets the process's peak resident set back to what is resident now (`clear_refs` 5).
pub fn reset_peak_rss(pid: u32) {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
        .unwrap_or_else(|e| panic!("resetting the peak RSS of {pid}: {e}"));
}

/// What llama-fit-params chose: the layers on the devices (`-ngl`; -1: all, the engine's
/// default, nothing changed) and the layers of each (`-ts`, none: the free-memory split).
#[derive(Debug, PartialEq)]
pub struct Fitted {
    pub ngl: i64,
    pub split: Vec<u32>,
    /// `-ot` overrides it added (MoE experts moved to the host).
    pub overrides: bool,
    pub log: String,
}

/// Runs llama-fit-params on `model` with `args` (the devices, the context, `--fit-target`) and
/// `env` in its environment. It loads the model's header only (no weights), several times.
pub fn fit_params(bin: &Path, model: &Path, args: &[String], env: &[(&str, &str)]) -> Fitted {
    let out = Command::new(bin)
        .arg("--model")
        .arg(model)
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("run {}: {e}", bin.display()));
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let log = format!("{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "llama-fit-params failed: {log}");
    let line = stdout
        .lines()
        .rev()
        .find(|l| l.starts_with("-c "))
        .unwrap_or_else(|| panic!("llama-fit-params printed no arguments: {log}"));
    let words: Vec<&str> = line.split_whitespace().collect();
    let after = |flag: &str| {
        words
            .iter()
            .position(|w| *w == flag)
            .and_then(|i| words.get(i + 1))
            .copied()
    };
    Fitted {
        ngl: after("-ngl").and_then(|v| v.parse().ok()).expect("-ngl N"),
        split: after("-ts")
            .map(|v| v.split(',').map(|n| n.parse().unwrap()).collect())
            .unwrap_or_default(),
        overrides: words.contains(&"-ot"),
        log,
    }
}

/// The host's memory as the CPU backend reports it to llama.cpp (`sysconf`, all of it "free"),
/// so to rpc-server, which offers it as its device's free memory.
pub fn host_memory() -> u64 {
    let conf = |name: &str| -> u64 {
        let out = Command::new("getconf")
            .arg(name)
            .output()
            .expect("run getconf");
        String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("getconf {name}: {out:?}"))
    };
    conf("_PHYS_PAGES") * conf("PAGE_SIZE")
}

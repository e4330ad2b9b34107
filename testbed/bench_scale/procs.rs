//! The processes the benchmark runs beside the test bed (the fake Hub, the mirror, one operator
//! per row), found next to the benchmark's own binary, with logs in a directory of their own.
//! Each is stopped by its own PID: SIGTERM, then SIGKILL if it does not go.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio::process::{Child, Command};

/// The running test bed, as `scripts/testbed env` describes it.
pub struct Testbed {
    pub kubeconfig: PathBuf,
    /// The test bed's binaries (kubectl).
    pub bin: PathBuf,
}

/// The repository the benchmark was built from.
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

impl Testbed {
    /// The running test bed; an error saying how to start it when there is none.
    pub fn find() -> Result<Testbed, String> {
        let script = repo_root().join("scripts/testbed");
        let status = std::process::Command::new("bash")
            .arg(&script)
            .arg("status")
            .output()
            .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
        if !status.status.success() {
            return Err(format!(
                "the test bed is not running ({}); the lead starts it with `scripts/testbed up`",
                String::from_utf8_lossy(&status.stderr).trim()
            ));
        }
        let env = std::process::Command::new("bash")
            .arg(&script)
            .arg("env")
            .output()
            .map_err(|e| format!("cannot run {} env: {e}", script.display()))?;
        let text = String::from_utf8_lossy(&env.stdout);
        let value = |key: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("export {key}=")))
                .map(str::to_string)
        };
        let kubeconfig = value("KUBECONFIG").ok_or("`scripts/testbed env` named no KUBECONFIG")?;
        let path = value("PATH").ok_or("`scripts/testbed env` named no PATH")?;
        let bin = path.split(':').next().unwrap_or_default();
        Ok(Testbed {
            kubeconfig: kubeconfig.into(),
            bin: bin.into(),
        })
    }

    /// kubectl of the test bed with its kubeconfig; stdout when it succeeds.
    pub async fn kubectl(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new(self.bin.join("kubectl"))
            .args(args)
            .env("KUBECONFIG", &self.kubeconfig)
            .output()
            .await
            .map_err(|e| format!("cannot run kubectl: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "kubectl {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        String::from_utf8(out.stdout).map_err(|e| format!("kubectl printed no text: {e}"))
    }
}

/// Builds the operator binary and the fake Hub with the cargo that runs this benchmark, so a
/// run never measures a stale operator.
pub fn build() -> Result<(), String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = repo_root().join("Cargo.toml");
    eprintln!("building the operator and the fake Hub (cargo build --release) ...");
    let status = std::process::Command::new(&cargo)
        .args([
            "build",
            "--release",
            "--bin",
            "modelserve",
            "--example",
            "fake-hub",
        ])
        .arg("--manifest-path")
        .arg(&manifest)
        .status()
        .map_err(|e| format!("cannot run {cargo}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("cargo build --release failed ({status})"))
    }
}

/// `target/release/modelserve` and `target/release/examples/fake-hub` beside this binary
/// (`target/release/examples/scale-bench`).
pub fn binaries() -> Result<(PathBuf, PathBuf), String> {
    let me = std::env::current_exe().map_err(|e| format!("where am I: {e}"))?;
    let examples = me.parent().ok_or("the benchmark binary has no directory")?;
    let release = examples
        .parent()
        .ok_or("the examples directory has no parent")?;
    let modelserve = release.join("modelserve");
    let hub = examples.join("fake-hub");
    for p in [&modelserve, &hub] {
        if !p.exists() {
            return Err(format!(
                "{} is missing: build it with `cargo build --release --bin modelserve --example fake-hub`",
                p.display()
            ));
        }
    }
    Ok((modelserve, hub))
}

/// A TCP port free right now on 127.0.0.1.
pub fn free_port() -> Result<u16, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free port: {e}"))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

/// One started process, its log, and its PID for /proc.
pub struct Proc {
    pub name: &'static str,
    pub log: PathBuf,
    child: Child,
}

impl Proc {
    /// Starts `program args` with stdout and stderr into `logs/NAME.log`.
    pub fn start(
        name: &'static str,
        program: &Path,
        args: &[String],
        env: &[(&str, &Path)],
        logs: &Path,
    ) -> Result<Proc, String> {
        let log = logs.join(format!("{name}.log"));
        let file = std::fs::File::create(&log)
            .map_err(|e| format!("cannot create {}: {e}", log.display()))?;
        let err = file
            .try_clone()
            .map_err(|e| format!("cannot open {} twice: {e}", log.display()))?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            // A group of its own: Ctrl-C in the terminal reaches the benchmark, which stops
            // them in order, and not them at once.
            .process_group(0)
            .kill_on_drop(true);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", program.display()))?;
        Ok(Proc { name, log, child })
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// An error naming the log when the process has exited.
    pub fn check_alive(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!(
                "the {} exited ({status}); its log: {}",
                self.name,
                self.log.display()
            )),
            Err(e) => Err(format!("cannot look at the {}: {e}", self.name)),
        }
    }

    /// SIGTERM, up to 5 s to go, then SIGKILL.
    pub async fn stop(mut self) {
        let pid = self
            .child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .and_then(rustix::process::Pid::from_raw);
        if let Some(pid) = pid {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
            if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
                .await
                .is_ok()
            {
                return;
            }
        }
        let _ = self.child.kill().await;
    }
}

/// Memory of a process from /proc/PID/status: (VmHWM, VmRSS) in bytes, the peak and now.
pub fn rss(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |key: &str| -> Option<u64> {
        let line = status.lines().find(|l| l.starts_with(key))?;
        let n: u64 = line
            .get(key.len()..)?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()?;
        n.checked_mul(1024)
    };
    Some((kib("VmHWM:")?, kib("VmRSS:")?))
}

/// Waits until `addr` accepts TCP connections, for up to `limit`.
pub async fn wait_for_port(p: &mut Proc, addr: &str, limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        if tokio::net::TcpStream::connect(addr).await.is_ok() {
            return Ok(());
        }
        p.check_alive()?;
        if Instant::now() > deadline {
            return Err(format!(
                "the {} does not listen on {addr} after {}s; its log: {}",
                p.name,
                limit.as_secs(),
                p.log.display()
            ));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until GET `url` answers 200, for up to `limit`.
pub async fn wait_for_ok(p: &mut Proc, url: &str, limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    let http = reqwest::Client::new();
    loop {
        let ok = http
            .get(url)
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        if ok {
            return Ok(());
        }
        p.check_alive()?;
        if Instant::now() > deadline {
            return Err(format!(
                "the {} does not answer {url} after {}s; its log: {}",
                p.name,
                limit.as_secs(),
                p.log.display()
            ));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_has_a_peak_and_a_current_rss() {
        let (peak, now) = rss(std::process::id()).unwrap();
        assert!(peak >= now && now > 0, "{peak} {now}");
        assert_eq!(rss(u32::MAX), None);
    }
}

//! pod-runner (testbed/pod_runner.rs) as the kubelet of one namespace: the modelserve pods kwok
//! pretends to run get real processes, a real `modelserve pull` and a real llama-server on the
//! pod IP. `PodRunner::start(&tb, &ns.name)` returns a guard that stops it (and so every pod
//! process) when dropped.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::{Testbed, modelserve_bin, testbed_script};

/// A running pod-runner; stopped with SIGTERM (then SIGKILL) when dropped.
pub struct PodRunner {
    child: Child,
    /// Holds `<namespace>/<pod>/` for every pod it runs.
    pub workdir: tempfile::TempDir,
    log: PathBuf,
}

/// The pod-runner example of the profile this test was built in, built once per test binary.
pub fn pod_runner_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        // target/<profile>/modelserve -> target/<profile>/examples/pod-runner
        let profile_dir = Path::new(modelserve_bin())
            .parent()
            .expect("the binary has a directory")
            .to_path_buf();
        let mut cargo = Command::new(env!("CARGO"));
        cargo
            .args(["build", "--quiet", "--example", "pod-runner"])
            .current_dir(env!("CARGO_MANIFEST_DIR"));
        if profile_dir.file_name().is_some_and(|n| n == "release") {
            cargo.arg("--release");
        }
        let out = cargo.output().expect("run cargo");
        assert!(
            out.status.success(),
            "cargo build --example pod-runner failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        profile_dir.join("examples").join("pod-runner")
    })
    .clone()
}

impl PodRunner {
    /// Starts pod-runner for the modelserve pods of `namespace`.
    pub fn start(tb: &Testbed, namespace: &str) -> PodRunner {
        let llama_server = testbed_script("build-llama-server.sh");
        let workdir = tempfile::Builder::new()
            .prefix("pod-runner-")
            .tempdir()
            .unwrap();
        let log = workdir.path().join("pod-runner.log");
        let child = Command::new(pod_runner_bin())
            .arg("--modelserve-bin")
            .arg(modelserve_bin())
            .arg("--llama-server-bin")
            .arg(&llama_server)
            .arg("--workdir")
            .arg(workdir.path())
            .args(["--namespace", namespace])
            .env("KUBECONFIG", &tb.kubeconfig)
            .env("RUST_LOG", "info,kube=warn")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start pod-runner");
        PodRunner {
            child,
            workdir,
            log,
        }
    }

    /// pod-runner's own log.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The directory of a pod while it runs.
    pub fn pod_dir(&self, namespace: &str, pod: &str) -> PathBuf {
        self.workdir.path().join(namespace).join(pod)
    }

    /// A container's log (`pull`, `llama-server`, ...) of a running pod.
    pub fn container_log(&self, namespace: &str, pod: &str, container: &str) -> String {
        std::fs::read_to_string(
            self.pod_dir(namespace, pod)
                .join("logs")
                .join(format!("{container}.log")),
        )
        .unwrap_or_default()
    }

    /// Whether pod-runner still runs.
    pub fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

impl Drop for PodRunner {
    fn drop(&mut self) {
        // SIGTERM lets it stop every pod's process group before it exits.
        if let Some(pid) = rustix::process::Pid::from_raw(self.child.id() as i32) {
            let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        while matches!(self.child.try_wait(), Ok(None)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("--- pod-runner log\n{}", self.log());
        }
    }
}

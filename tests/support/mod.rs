//! Harness for tests against the test bed started by `scripts/testbed up`.
#![allow(dead_code)]

pub mod engine;
pub mod fake_hub;
pub mod models;
pub mod pod_runner;
pub mod rpc;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// The running test bed: its kubeconfig and the directory of its binaries.
pub struct Testbed {
    pub kubeconfig: PathBuf,
    pub bin: PathBuf,
}

/// Where `scripts/testbed` keeps its state (the same rule as the script).
fn state_dir() -> PathBuf {
    if let Ok(d) = std::env::var("MODELSERVE_TESTBED_DIR") {
        return d.into();
    }
    let cache = std::env::var("MODELSERVE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            std::env::var("XDG_CACHE_HOME")
                .map(PathBuf::from)
                .unwrap_or_else(|_| {
                    PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache")
                })
                .join("modelserve")
        });
    cache.join("testbed-run")
}

impl Testbed {
    /// The running test bed; fails the test, saying how to start it, when there is none.
    pub fn get() -> Testbed {
        let state = state_dir();
        let kubeconfig = state.join("kubeconfig");
        let bin = std::fs::read_to_string(state.join("bin")).map(|s| PathBuf::from(s.trim()));
        let (Ok(bin), true) = (bin, kubeconfig.exists()) else {
            panic!(
                "this test needs the test bed, and none runs at {}: start it with `scripts/testbed up` (or run `scripts/test`)",
                state.display()
            )
        };
        let tb = Testbed { kubeconfig, bin };
        let out = tb.kubectl(&["get", "--raw", "/readyz"]);
        assert!(
            out.status.success(),
            "the test bed at {} does not answer: {}; restart it with `scripts/testbed down && scripts/testbed up`",
            state.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        tb
    }

    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.command("kubectl")
            .args(args)
            .output()
            .expect("run kubectl")
    }

    /// kubectl with `stdin` piped in.
    pub fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> Output {
        use std::io::Write;
        let mut child = self
            .command("kubectl")
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("run kubectl");
        child
            .stdin
            .take()
            .unwrap()
            .write_all(stdin.as_bytes())
            .unwrap();
        child.wait_with_output().unwrap()
    }

    /// kubectl that must succeed; returns stdout.
    pub fn kubectl_ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            out.status.success(),
            "kubectl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// A command from the test bed's binaries (kubectl, helm) with KUBECONFIG set.
    pub fn command(&self, name: &str) -> Command {
        let mut c = Command::new(self.bin.join(name));
        c.env("KUBECONFIG", &self.kubeconfig);
        c
    }

    pub async fn client(&self) -> kube::Client {
        let kc = kube::config::Kubeconfig::read_from(&self.kubeconfig).expect("read kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .expect("kubeconfig");
        kube::Client::try_from(config).expect("client")
    }

    /// Installs the committed CRD and waits until it is served.
    pub fn install_crd(&self) {
        self.kubectl_ok(&[
            "apply",
            "--server-side",
            "--force-conflicts",
            "-f",
            &repo_path("crds/modelserve.yaml"),
        ]);
        // kubectl wait fails at once, instead of waiting, while the new CRD has no conditions
        // yet ("status.conditions accessor error"): ask again, a bounded number of times.
        for _ in 0..60 {
            let out = self.kubectl(&[
                "wait",
                "--for=condition=Established",
                "crd/modelserves.modelserve.dev",
                "--timeout=30s",
            ]);
            if out.status.success() {
                return;
            }
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(
                err.contains("accessor error"),
                "kubectl wait for the CRD: {err}"
            );
            std::thread::sleep(std::time::Duration::from_millis(500));
        }
        panic!("the ModelServe CRD had no conditions after 60 tries");
    }

    /// A fresh namespace, deleted when the returned guard drops.
    pub fn namespace(&self, prefix: &str) -> Namespace<'_> {
        static N: AtomicU32 = AtomicU32::new(0);
        let name = format!(
            "{prefix}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        );
        self.kubectl_ok(&["create", "namespace", &name]);
        // The controller-manager creates the default ServiceAccount shortly after.
        Namespace { tb: self, name }
    }
}

/// A second kube-apiserver of the test bed's build on the same etcd under a prefix of its own:
/// a cluster with nothing in it (no CRD), for tests that need one. Stopped, and its keys
/// removed from etcd, when dropped.
pub struct EmptyApiServer {
    child: std::process::Child,
    prefix: String,
    _dir: tempfile::TempDir,
    pub kubeconfig: PathBuf,
}

impl Testbed {
    pub fn empty_apiserver(&self) -> EmptyApiServer {
        let state = self.kubeconfig.parent().expect("state dir").to_path_buf();
        let pki = state.join("pki");
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let prefix = format!("/modelserve-empty-{}", std::process::id());
        let child = Command::new(self.bin.join("kube-apiserver"))
            .args([
                &format!("--etcd-servers=http://127.0.0.1:{}", etcd_port()),
                &format!("--etcd-prefix={prefix}"),
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                &format!("--secure-port={port}"),
                &format!("--cert-dir={}", dir.path().display()),
                &format!("--token-auth-file={}", pki.join("tokens.csv").display()),
                "--authorization-mode=RBAC",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                &format!(
                    "--service-account-key-file={}",
                    pki.join("sa.pub").display()
                ),
                &format!(
                    "--service-account-signing-key-file={}",
                    pki.join("sa.key").display()
                ),
                "--service-cluster-ip-range=10.97.0.0/16",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start a second kube-apiserver");
        let kc = std::fs::read_to_string(&self.kubeconfig).unwrap();
        let token = kc
            .split("token: ")
            .nth(1)
            .and_then(|t| t.split('}').next())
            .expect("the test bed's token")
            .trim()
            .to_string();
        let kubeconfig = dir.path().join("kubeconfig");
        std::fs::write(
            &kubeconfig,
            format!(
                "apiVersion: v1\nkind: Config\nclusters: [{{name: e, cluster: {{server: \"https://127.0.0.1:{port}\", insecure-skip-tls-verify: true}}}}]\nusers: [{{name: e, user: {{token: {token}}}}}]\ncontexts: [{{name: e, context: {{cluster: e, user: e}}}}]\ncurrent-context: e\n"
            ),
        )
        .unwrap();
        let server = EmptyApiServer {
            child,
            prefix,
            _dir: dir,
            kubeconfig,
        };
        let deadline = Instant::now() + Duration::from_secs(90);
        loop {
            let out = Command::new(self.bin.join("kubectl"))
                .args(["get", "--raw", "/readyz"])
                .env("KUBECONFIG", &server.kubeconfig)
                .output()
                .unwrap();
            if out.status.success() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the second kube-apiserver did not become ready: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        server
    }
}

/// The test bed's etcd client port (the same default as scripts/testbed).
fn etcd_port() -> u16 {
    std::env::var("TESTBED_ETCD_PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(23790)
}

impl Drop for EmptyApiServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Remove every key it wrote, through etcd's JSON gateway (keys are base64).
        let b64 = base64_lite;
        let start = b64(self.prefix.as_bytes());
        let mut end = self.prefix.clone().into_bytes();
        if let Some(last) = end.last_mut() {
            *last += 1;
        }
        let body = format!("{{\"key\":\"{start}\",\"range_end\":\"{}\"}}", b64(&end));
        let _ = Command::new("curl")
            .args(["-fsS", "-X", "POST", "-d", &body])
            .arg(format!(
                "http://127.0.0.1:{}/v3/kv/deleterange",
                etcd_port()
            ))
            .output();
    }
}

/// Standard base64 of `b`, for etcd's gateway.
fn base64_lite(b: &[u8]) -> String {
    const T: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in b.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, v)| n | u32::from(*v) << (16 - 8 * i));
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(T[(n >> (18 - 6 * i) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

pub struct Namespace<'a> {
    tb: &'a Testbed,
    pub name: String,
}

impl Drop for Namespace<'_> {
    fn drop(&mut self) {
        let _ = self
            .tb
            .kubectl(&["delete", "namespace", &self.name, "--wait=false"]);
    }
}

/// Runs a testbed/ script (they cache what they build) and returns the path it prints last.
pub fn testbed_script(name: &str) -> PathBuf {
    testbed_script_with(name, &[])
}

/// [`testbed_script`] with arguments.
pub fn testbed_script_with(name: &str, args: &[&str]) -> PathBuf {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("testbed")
        .join(name);
    let out = Command::new("bash")
        .arg(&path)
        .args(args)
        .output()
        .expect("run bash");
    assert!(
        out.status.success(),
        "testbed/{name} {} failed: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    PathBuf::from(stdout.lines().last().unwrap_or_default().trim())
}

/// (status, reason, message) of condition `type_`.
pub fn condition(s: &modelserve::api::ModelServeStatus, type_: &str) -> (String, String, String) {
    let c = s
        .conditions
        .iter()
        .find(|c| c.type_ == type_)
        .expect("condition present");
    (c.status.clone(), c.reason.clone(), c.message.clone())
}

/// A path inside the repository.
pub fn repo_path(rel: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join(rel)
        .to_string_lossy()
        .into_owned()
}

/// Polls `f` until it returns Some or `timeout` passes.
pub async fn eventually<T>(timeout: Duration, mut f: impl AsyncFnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if Instant::now() > deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The first pod of the model `model` that `pods` lists (by the label every replica carries).
pub async fn model_pod(
    pods: &kube::Api<k8s_openapi::api::core::v1::Pod>,
    model: &str,
) -> k8s_openapi::api::core::v1::Pod {
    let label = format!("{}={model}", modelserve::names::MODEL_LABEL);
    let mut list = pods
        .list(&kube::api::ListParams::default().labels(&label))
        .await
        .unwrap();
    assert!(!list.items.is_empty(), "no pod of {model}");
    list.items.remove(0)
}

/// Removes a dropped process's log file, or keeps it and names it on stderr when the test is
/// failing, so that the failure can be read and a passing run leaves nothing behind.
pub fn drop_log(log: &Path) {
    if std::thread::panicking() {
        eprintln!("kept for the failure: {}", log.display());
    } else {
        let _ = std::fs::remove_file(log);
    }
}

/// A TCP port free right now on 127.0.0.1, for a server started next, outside the kernel's
/// ephemeral range ([`ports_outside_ephemeral`]). A port that bind(0) hands out comes from that
/// range, and until the server binds it, any outgoing connection of the tests (to the API server,
/// say) may take it as its source port: CI once saw the operator refuse to start, its metrics
/// port "already in use". Each call takes the next port of a sequence that starts where the
/// process ID says, so the tests of one binary, which run at once, never get the same port.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok();
    let (first, ports) = ports_outside_ephemeral(range.as_deref());
    let start = std::process::id().wrapping_mul(2_654_435_761) % ports;
    for _ in 0..ports {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = (first + (start + n) % ports) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!(
        "no free port on 127.0.0.1 from {first} to {}",
        first + ports - 1
    )
}

/// The first port and how many follow it that the tests' servers take: 20000 to 31999 where the
/// ephemeral range (Linux's `ip_local_port_range`, "32768\t60999" by default) leaves them out;
/// else the ports above the range, or from 10000 to below it, where there are at least 4000;
/// else, with a range that leaves no such block, 20000 to 31999 all the same.
fn ports_outside_ephemeral(range: Option<&str>) -> (u32, u32) {
    const USUAL: (u32, u32) = (20_000, 12_000);
    const LEAST: u32 = 4_000;
    let mut bounds = range
        .unwrap_or_default()
        .split_whitespace()
        .map(|v| v.parse::<u32>().ok().filter(|p| *p <= 65_535));
    let (Some(Some(low)), Some(Some(high))) = (bounds.next(), bounds.next()) else {
        return USUAL;
    };
    if low >= USUAL.0 + USUAL.1 || high < USUAL.0 {
        USUAL
    } else if 65_535 - high >= LEAST {
        (high + 1, (65_535 - high).min(USUAL.1))
    } else if low >= 10_000 + LEAST {
        (10_000, (low - 10_000).min(USUAL.1))
    } else {
        USUAL
    }
}

/// A mirror service on a free loopback port, storing into a temporary directory.
pub async fn start_mirror(registry: &str) -> (String, tempfile::TempDir) {
    start_mirror_with(registry, test_policy()).await
}

/// The mirror's limits in tests: short waits.
pub fn test_policy() -> modelserve::mirror::fetch::Policy {
    use modelserve::mirror::fetch::Policy;
    Policy {
        hash_attempts: 3,
        stalls: 4,
        backoff: Duration::from_millis(50),
        retry_failed_after: Duration::from_secs(60),
        read_timeout: Duration::from_millis(500),
        ..Policy::default()
    }
}

/// A mirror service with the given limits.
pub async fn start_mirror_with(
    registry: &str,
    policy: modelserve::mirror::fetch::Policy,
) -> (String, tempfile::TempDir) {
    serve_mirror(registry, policy, "127.0.0.1:0").await
}

/// A mirror service listening on `addr` (the real node's pods reach the host on its bridge).
pub async fn start_mirror_at(registry: &str, addr: &str) -> (String, tempfile::TempDir) {
    serve_mirror(registry, test_policy(), addr).await
}

/// A mirror service with the given disk settings (capacity, grace, watermarks).
pub async fn start_mirror_space(
    registry: &str,
    space: modelserve::mirror::space::SpaceArgs,
) -> (String, tempfile::TempDir) {
    serve_mirror_space(registry, test_policy(), "127.0.0.1:0", space).await
}

async fn serve_mirror(
    registry: &str,
    policy: modelserve::mirror::fetch::Policy,
    addr: &str,
) -> (String, tempfile::TempDir) {
    serve_mirror_space(registry, policy, addr, Default::default()).await
}

async fn serve_mirror_space(
    registry: &str,
    policy: modelserve::mirror::fetch::Policy,
    addr: &str,
    space: modelserve::mirror::space::SpaceArgs,
) -> (String, tempfile::TempDir) {
    use modelserve::mirror::{Mirror, router, store::Store};
    let dir = tempfile::tempdir().unwrap();
    let registry = modelserve::hub::RegistryArgs {
        registry_endpoint: registry.into(),
        registry_ca_bundle: None,
    };
    let m = Mirror::build(Store::open(dir.path()).unwrap(), registry, policy, space).unwrap();
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .unwrap_or_else(|e| panic!("the mirror cannot listen on {addr}: {e}"));
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router(m)).await.unwrap() });
    (url, dir)
}

/// The operator binary this test run built.
pub fn modelserve_bin() -> &'static str {
    env!("CARGO_BIN_EXE_modelserve")
}

/// The operator binary running as the controller for one namespace; killed when dropped.
pub struct Operator {
    child: std::process::Child,
    pub port: u16,
}

impl Operator {
    /// Starts the controller watching `namespace`, with the registry at `registry`.
    pub fn start(tb: &Testbed, namespace: &str, registry: &str) -> Operator {
        Operator::start_with(tb, namespace, registry, &[])
    }

    /// The same with more controller flags.
    pub fn start_with(tb: &Testbed, namespace: &str, registry: &str, extra: &[&str]) -> Operator {
        let port = free_port();
        let child = Command::new(modelserve_bin())
            .args([
                "controller",
                "--metrics-addr",
                &format!("127.0.0.1:{port}"),
                "--watch-namespace",
                namespace,
            ])
            .args(["--registry-endpoint", registry])
            // The test bed's llama-server is built for any x86-64 with AVX2 (no -march=native).
            .args(["--engine-cpu", "avx2"])
            .args(extra)
            .env("KUBECONFIG", &tb.kubeconfig)
            .env(
                "RUST_LOG",
                std::env::var("MODELSERVE_TEST_LOG")
                    .unwrap_or_else(|_| "info,modelserve=debug".into()),
            )
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .expect("start the controller");
        Operator { child, port }
    }

    /// The operator's process ID.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Whether (and how) the operator's process has ended.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// GET on the controller's health and metrics port.
    pub async fn get(&self, path: &str) -> Option<(u16, String)> {
        let r = reqwest::get(format!("http://127.0.0.1:{}{path}", self.port))
            .await
            .ok()?;
        Some((r.status().as_u16(), r.text().await.ok()?))
    }
}

impl Drop for Operator {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the mirror is asked for to fetch `files` of `repo` at `commit`.
pub fn file_refs(
    repo: &str,
    commit: &str,
    files: &[fake_hub::HubFile],
) -> Vec<modelserve::mirror::store::FileRef> {
    files
        .iter()
        .map(|f| modelserve::mirror::store::FileRef {
            repo: repo.into(),
            commit: commit.into(),
            path: f.path.clone(),
            sha256: f.sha256.clone(),
            size: f.size,
        })
        .collect()
}

/// Has the mirror at `mirror` fetch `files` of `repo` at `commit` from its registry, as the
/// Mirror stage does, and waits until every one is present.
pub async fn mirror_present(mirror: &str, repo: &str, commit: &str, files: &[fake_hub::HubFile]) {
    use modelserve::mirror::{Request, Status};
    let req = Request {
        files: file_refs(repo, commit, files),
        token: None,
    };
    let done = eventually(Duration::from_secs(30), async || {
        let s: Status = reqwest::Client::new()
            .post(format!("{mirror}/v1/fetch"))
            .json(&req)
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        s.files.iter().all(|f| f.state == "present").then_some(())
    })
    .await;
    assert!(done.is_some(), "the mirror did not get the files of {repo}");
}

/// `modelserve mirror` as its own process on a loopback port, so a test can kill it and start
/// it again on the same port and store.
pub struct MirrorProcess {
    child: Option<std::process::Child>,
    dir: tempfile::TempDir,
    registry: String,
    port: u16,
    pub url: String,
    /// The host it listens on, its authentication flags, and the kubeconfig its TokenReviews go
    /// through.
    host: String,
    auth: Vec<String>,
    kubeconfig: Option<std::path::PathBuf>,
    /// Where its log goes (appended across restarts).
    log: std::path::PathBuf,
}

impl MirrorProcess {
    /// A mirror that lets anyone on loopback in (`--auth none`).
    pub fn start(registry: &str) -> MirrorProcess {
        Self::start_with(
            registry,
            vec!["--auth".into(), "none".into()],
            None,
            "127.0.0.1",
        )
    }

    /// A mirror on `host` that checks every caller's token with the test bed's API server, and
    /// lets `operator` (NAMESPACE/NAME of a ServiceAccount) ask for downloads.
    pub fn start_checked_at(
        tb: &Testbed,
        registry: &str,
        operator: &str,
        host: &str,
    ) -> MirrorProcess {
        let auth = vec![
            "--auth".into(),
            "kubernetes".into(),
            "--operator-service-account".into(),
            operator.into(),
        ];
        Self::start_with(registry, auth, Some(tb.kubeconfig.clone()), host)
    }

    fn start_with(
        registry: &str,
        auth: Vec<String>,
        kubeconfig: Option<std::path::PathBuf>,
        host: &str,
    ) -> MirrorProcess {
        let port = free_port();
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().with_extension("log");
        let mut m = MirrorProcess {
            child: None,
            dir,
            registry: registry.into(),
            port,
            url: format!("http://{host}:{port}"),
            host: host.into(),
            auth,
            kubeconfig,
            log,
        };
        m.restart();
        m
    }

    /// Everything the mirror has logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Kills the mirror (SIGKILL).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts the mirror again on the same port and store, and waits until it answers.
    pub fn restart(&mut self) {
        self.kill();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .expect("the mirror's log file");
        let child = Command::new(modelserve_bin())
            .args(["mirror", "--addr", &format!("{}:{}", self.host, self.port)])
            .arg("--dir")
            .arg(self.dir.path())
            .args(["--registry-endpoint", &self.registry])
            .args(&self.auth)
            .envs(self.kubeconfig.iter().map(|k| ("KUBECONFIG", k)))
            .env("RUST_LOG", "info,modelserve=debug")
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start the mirror");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect((self.host.as_str(), self.port)).is_err() {
            assert!(Instant::now() < deadline, "the mirror did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for MirrorProcess {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            let log = self.log();
            let tail = log.len().saturating_sub(16 << 10);
            eprintln!(
                "the mirror's log, its end:\n{}",
                log.get(tail..).unwrap_or(&log)
            );
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

/// `modelserve gateway` as its own process for one namespace (its models and its API-key
/// Secrets), on loopback ports; killed when dropped.
pub struct GatewayProcess {
    child: std::process::Child,
    pub url: String,
    pub metrics_url: String,
    log: tempfile::NamedTempFile,
}

impl GatewayProcess {
    pub fn start(tb: &Testbed, namespace: &str, extra: &[&str]) -> GatewayProcess {
        let (port, metrics) = (free_port(), free_port());
        let log = tempfile::NamedTempFile::new().unwrap();
        let child = Command::new(modelserve_bin())
            .args(["gateway", "--addr", &format!("127.0.0.1:{port}")])
            .args(["--metrics-addr", &format!("127.0.0.1:{metrics}")])
            .args([
                "--watch-namespace",
                namespace,
                "--keys-namespace",
                namespace,
            ])
            .args(extra)
            .env("KUBECONFIG", &tb.kubeconfig)
            .env("RUST_LOG", "info,modelserve=debug")
            .stdout(std::process::Stdio::null())
            .stderr(log.reopen().unwrap())
            .spawn()
            .expect("start the gateway");
        let g = GatewayProcess {
            child,
            url: format!("http://127.0.0.1:{port}"),
            metrics_url: format!("http://127.0.0.1:{metrics}"),
            log,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = http_get_status(&format!("127.0.0.1:{metrics}"), "/readyz") == Some(200);
            if ready {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the gateway did not become ready: {}",
                g.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        g
    }

    /// Everything the gateway has logged.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// The sum of the samples of `name` whose labels contain every one of `labels`.
    pub async fn metric(&self, name: &str, labels: &[&str]) -> f64 {
        let text = reqwest::get(format!("{}/metrics", self.metrics_url))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .filter(|l| {
                l.starts_with(name)
                    && l[name.len()..].starts_with(['{', ' '])
                    && labels.iter().all(|x| l.contains(x))
            })
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

impl Drop for GatewayProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let log = self.log();
            let tail = log.len().saturating_sub(16 << 10);
            eprintln!(
                "the gateway's log, its end:\n{}",
                log.get(tail..).unwrap_or(&log)
            );
        }
    }
}

/// The status code of a plain HTTP/1.0 GET, without an async runtime.
pub fn http_get_status(addr: &str, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(addr).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(c, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut head = [0u8; 64];
    let n = c.read(&mut head).ok()?;
    std::str::from_utf8(&head[..n])
        .ok()?
        .split(' ')
        .nth(1)?
        .parse()
        .ok()
}

/// This machine's online logical CPUs, as llama-server counts them to start its threads
/// (`std::thread::hardware_concurrency`): the node size the engine tests estimate for.
pub fn cpus() -> u64 {
    std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|s| {
            s.trim()
                .split(',')
                .map(|r| match r.split_once('-') {
                    Some((a, b)) => Some(b.parse::<u64>().ok()? + 1 - a.parse::<u64>().ok()?),
                    None => r.parse::<u64>().ok().map(|_| 1),
                })
                .sum::<Option<u64>>()
        })
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u64))
}

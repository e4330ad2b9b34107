//! pod-runner: the test bed's kubelet for the pods modelserve makes. kwok only pretends to run
//! pods; this runs them for real on this machine, so the operator reaches a real llama-server at
//! the pod's IP exactly as in production (kwok hands out pod IPs from 127.1.0.0/16, and all of
//! 127/8 is local on Linux).
//!
//! For each pod labelled `app.kubernetes.io/managed-by=modelserve` that has a loopback pod IP (a
//! kwok node's: a real node's pods have their own kubelet) and is not terminating, it makes `<workdir>/<namespace>/<pod>/`, maps the pod's volumes to directories in
//! it (emptyDir: empty; secret: one file per key, read from the API), runs the init containers in
//! order (`modelserve` is the binary given by `--modelserve-bin`), then the main container with
//! the binary given by `--llama-server-bin`, listening on the pod IP. Arguments that start with a
//! mount path point into the mapped directories instead. An init container that fails, and a
//! main container that exits, are started again with a growing pause, as a kubelet does. Logs go to `<pod dir>/logs/<container>.log`.
//! When the pod is deleted or replaced its processes (their whole process groups) are killed and
//! its directory removed; SIGTERM or SIGINT kills every child.
//!
//!   cargo run --example pod-runner -- --modelserve-bin target/debug/modelserve \
//!     --llama-server-bin ~/.cache/modelserve/llama-cpp-0.3.36-rpc/llama-server \
//!     --workdir /tmp/pods [--namespace NS]

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Container, Pod, Secret};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Api, Client, ResourceExt};
use rustix::process::{Pid, Signal};
use tokio_util::sync::CancellationToken;

/// Runs modelserve's kwok pods as local processes.
#[derive(Parser, Debug, Clone)]
#[command(name = "pod-runner")]
struct Args {
    /// The modelserve binary, run for init containers whose command is `modelserve`.
    #[arg(long)]
    modelserve_bin: PathBuf,
    /// The llama-server binary, run for the main container.
    #[arg(long)]
    llama_server_bin: PathBuf,
    /// Where each pod gets its directory (`<workdir>/<namespace>/<pod>/`).
    #[arg(long)]
    workdir: PathBuf,
    /// Only pods of this namespace (default: all namespaces).
    #[arg(long)]
    namespace: Option<String>,
    /// Which pods to run.
    #[arg(long, default_value = "app.kubernetes.io/managed-by=modelserve")]
    selector: String,
    /// Seconds a process gets after SIGTERM before SIGKILL.
    #[arg(long, default_value_t = 3)]
    grace: u64,
}

/// A pod being run: its task, and how to stop it.
struct Running {
    key: String,
    ip: String,
    dir: PathBuf,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    modelserve::telemetry::init_logs(modelserve::telemetry::LogFormat::Human);
    let args = Args::parse();
    match run(args).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("pod-runner: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

async fn run(args: Args) -> Result<(), String> {
    for (flag, bin) in [
        ("--modelserve-bin", &args.modelserve_bin),
        ("--llama-server-bin", &args.llama_server_bin),
    ] {
        if !bin.is_file() {
            return Err(format!("{flag} {}: no such file", bin.display()));
        }
    }
    let args = Args {
        modelserve_bin: std::path::absolute(&args.modelserve_bin).map_err(|e| e.to_string())?,
        llama_server_bin: std::path::absolute(&args.llama_server_bin).map_err(|e| e.to_string())?,
        workdir: std::path::absolute(&args.workdir).map_err(|e| e.to_string())?,
        ..args
    };
    std::fs::create_dir_all(&args.workdir)
        .map_err(|e| format!("--workdir {}: {e}", args.workdir.display()))?;
    let client = Client::try_default()
        .await
        .map_err(|e| format!("no usable kubeconfig: {e}"))?;
    let pods: Api<Pod> = match &args.namespace {
        Some(ns) => Api::namespaced(client.clone(), ns),
        None => Api::all(client.clone()),
    };
    let (store, writer) = reflector::store();
    let events = reflector(
        writer,
        watcher(pods, watcher::Config::default().labels(&args.selector)),
    )
    .default_backoff();
    let mut events = std::pin::pin!(events);
    let mut running: HashMap<String, Running> = HashMap::new();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| e.to_string())?;
    tracing::info!(workdir = %args.workdir.display(), namespace = ?args.namespace, selector = %args.selector, "pod-runner watching");
    let args = Arc::new(args);
    loop {
        tokio::select! {
            ev = events.next() => match ev {
                Some(Ok(_)) => sync(&client, &args, &store.state(), &mut running).await,
                Some(Err(e)) => tracing::warn!(error = %e, "watching pods failed; retrying"),
                None => break,
            },
            _ = tokio::signal::ctrl_c() => break,
            _ = term.recv() => break,
        }
    }
    tracing::info!(pods = running.len(), "stopping every pod");
    let all: Vec<Running> = running.drain().map(|(_, r)| r).collect();
    futures::future::join_all(all.into_iter().map(|r| stop(r, &args))).await;
    Ok(())
}

/// Starts what should run and is not, stops what runs and should not (stops first: a replaced
/// pod may reuse the name, and kwok reuses IPs).
async fn sync(
    client: &Client,
    args: &Arc<Args>,
    pods: &[Arc<Pod>],
    running: &mut HashMap<String, Running>,
) {
    let wanted: HashMap<String, (&Arc<Pod>, String)> = pods
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let ip = p
                .status
                .as_ref()?
                .pod_ip
                .clone()
                .filter(|ip| runs_here(ip))?;
            Some((p.uid()?, (p, ip)))
        })
        .collect();
    let gone: Vec<String> = running
        .iter()
        .filter(|(uid, r)| wanted.get(*uid).is_none_or(|(_, ip)| *ip != r.ip))
        .map(|(uid, _)| uid.clone())
        .collect();
    let stopping: Vec<Running> = gone.iter().filter_map(|u| running.remove(u)).collect();
    futures::future::join_all(stopping.into_iter().map(|r| stop(r, args))).await;
    for (uid, (pod, ip)) in wanted {
        if running.contains_key(&uid) {
            continue;
        }
        let ns = pod.namespace().unwrap_or_default();
        let key = format!("{ns}/{}", pod.name_any());
        let dir = args.workdir.join(&ns).join(pod.name_any());
        let token = CancellationToken::new();
        tracing::info!(pod = %key, %ip, %uid, dir = %dir.display(), "starting pod");
        let task = tokio::spawn(run_pod(
            client.clone(),
            args.clone(),
            Arc::clone(pod),
            ip.clone(),
            dir.clone(),
            token.clone(),
        ));
        running.insert(
            uid,
            Running {
                key,
                ip,
                dir,
                stop: token,
                task,
            },
        );
    }
}

/// Whether a pod at this IP is pod-runner's to run: kwok's pod IPs are loopback addresses, and a
/// process here can listen on them. A real node's pods (an address of its bridge) are its kubelet's.
fn runs_here(ip: &str) -> bool {
    ip.parse::<std::net::IpAddr>()
        .is_ok_and(|a| a.is_loopback())
}

/// Kills a pod's processes and removes its directory.
async fn stop(r: Running, args: &Args) {
    tracing::info!(pod = %r.key, "pod gone; stopping it");
    r.stop.cancel();
    let mut task = r.task;
    // The task kills its process group and waits for it; it needs at most the grace period.
    if tokio::time::timeout(Duration::from_secs(args.grace + 5), &mut task)
        .await
        .is_err()
    {
        tracing::warn!(pod = %r.key, "the pod's task did not stop; aborting it");
        task.abort();
    }
    if let Err(e) = std::fs::remove_dir_all(&r.dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(pod = %r.key, error = %e, "cannot remove the pod's directory");
    }
}

/// The whole life of one pod: volumes, init containers in order, then the main container,
/// restarted when it exits, until `stop` is cancelled.
async fn run_pod(
    client: Client,
    args: Arc<Args>,
    pod: Arc<Pod>,
    ip: String,
    dir: PathBuf,
    stop: CancellationToken,
) {
    let key = format!("{}/{}", pod.namespace().unwrap_or_default(), pod.name_any());
    // A new pod starts with empty volumes, whatever an earlier pod-runner left behind.
    if let Err(e) = std::fs::remove_dir_all(&dir)
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::error!(pod = %key, error = %e, "cannot clear the pod's directory; not running it");
        return;
    }
    let volumes = match prepare_volumes(&client, &pod, &dir, &stop).await {
        Ok(Some(v)) => v,
        Ok(None) => return,
        Err(e) => {
            tracing::error!(pod = %key, error = %e, "cannot prepare the pod's volumes; not running it");
            return;
        }
    };
    let Some(spec) = &pod.spec else { return };
    for c in spec.init_containers.iter().flatten() {
        // As a kubelet does for restartPolicy Always: a failed init container runs again after
        // a growing pause, and the pod goes no further until it succeeds.
        let mut pause = Duration::from_secs(1);
        loop {
            let Some(cmd) = command(c, &volumes, &args, None) else {
                tracing::error!(pod = %key, container = %c.name, "an init container without a command; not running the pod");
                return;
            };
            tracing::info!(pod = %key, container = %c.name, "running init container");
            match run_process(&key, &c.name, cmd, &dir, &stop, args.grace).await {
                Exit::Stopped => return,
                Exit::Code(0) => {
                    tracing::info!(pod = %key, container = %c.name, "init container succeeded");
                    break;
                }
                Exit::Code(code) => {
                    let tail = log_tail(&dir, &c.name);
                    tracing::warn!(pod = %key, container = %c.name, code, ?pause, %tail, "init container failed; running it again");
                }
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(pause) => {}
            }
            pause = (pause * 2).min(Duration::from_secs(10));
        }
    }
    let Some(main) = spec
        .containers
        .iter()
        .find(|c| c.name == "llama-server")
        .or(spec.containers.first())
    else {
        tracing::error!(pod = %key, "the pod has no container");
        return;
    };
    let mut pause = Duration::from_secs(1);
    loop {
        let Some(cmd) = command(main, &volumes, &args, Some(&ip)) else {
            return;
        };
        tracing::info!(pod = %key, container = %main.name, %ip, "starting the main container");
        let started = std::time::Instant::now();
        match run_process(&key, &main.name, cmd, &dir, &stop, args.grace).await {
            Exit::Stopped => return,
            Exit::Code(code) => {
                if started.elapsed() > Duration::from_secs(60) {
                    pause = Duration::from_secs(1);
                }
                let tail = log_tail(&dir, &main.name);
                tracing::warn!(pod = %key, container = %main.name, code, ?pause, %tail, "the main container exited; restarting it");
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(Duration::from_secs(30));
    }
}

/// The last lines of a container's log, for pod-runner's own log (the pod's directory goes away
/// with the pod).
fn log_tail(dir: &Path, container: &str) -> String {
    let text = std::fs::read_to_string(dir.join("logs").join(format!("{container}.log")))
        .unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines
        .get(lines.len().saturating_sub(5)..)
        .unwrap_or_default()
        .join(" | ")
}

/// Each volume's directory, by volume name; None when stopped while waiting for a Secret.
async fn prepare_volumes(
    client: &Client,
    pod: &Pod,
    dir: &Path,
    stop: &CancellationToken,
) -> Result<Option<BTreeMap<String, PathBuf>>, String> {
    let ns = pod.namespace().unwrap_or_default();
    let mut out = BTreeMap::new();
    let volumes = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.clone())
        .unwrap_or_default();
    for v in volumes {
        let path = dir.join("volumes").join(&v.name);
        std::fs::create_dir_all(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        if let Some(s) = &v.secret {
            let name = s.secret_name.clone().unwrap_or_default();
            let api: Api<Secret> = Api::namespaced(client.clone(), &ns);
            // As a kubelet does, wait for a Secret that is not there yet.
            let secret = loop {
                match api.get_opt(&name).await {
                    Ok(Some(secret)) => break secret,
                    Ok(None) if s.optional == Some(true) => break Secret::default(),
                    Ok(None) => tracing::info!(secret = %name, "waiting for the Secret"),
                    Err(e) => tracing::warn!(secret = %name, error = %e, "cannot read the Secret"),
                }
                tokio::select! {
                    _ = stop.cancelled() => return Ok(None),
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            };
            let data = secret.data.unwrap_or_default();
            let items: Vec<(String, String)> = match &s.items {
                Some(items) => items
                    .iter()
                    .map(|i| (i.key.clone(), i.path.clone()))
                    .collect(),
                None => data.keys().map(|k| (k.clone(), k.clone())).collect(),
            };
            for (key, rel) in items {
                let Some(value) = data.get(&key) else {
                    return Err(format!("Secret {name} has no key {key}"));
                };
                let file = path.join(&rel);
                if let Some(parent) = file.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
                }
                std::fs::write(&file, &value.0).map_err(|e| format!("{}: {e}", file.display()))?;
            }
        } else if let Some(p) = &v.projected {
            // As a kubelet does: each ServiceAccount token source is a TokenRequest for the
            // pod's ServiceAccount and audience, bound to the pod. Other sources are left empty.
            for source in p.sources.iter().flatten() {
                let Some(t) = &source.service_account_token else {
                    tracing::debug!(volume = %v.name, "only ServiceAccount tokens of a projected volume are made here");
                    continue;
                };
                let token = token_request(client, pod, t).await?;
                let file = path.join(&t.path);
                if let Some(parent) = file.parent() {
                    std::fs::create_dir_all(parent).map_err(|e| e.to_string())?;
                }
                std::fs::write(&file, token).map_err(|e| format!("{}: {e}", file.display()))?;
            }
        } else if v.empty_dir.is_none() {
            tracing::warn!(volume = %v.name, "only emptyDir and secret volumes are mapped; this one is an empty directory");
        }
        out.insert(v.name.clone(), path);
    }
    Ok(Some(out))
}

/// A token for the pod's ServiceAccount, for the projection's audience and bound to the pod,
/// from the API server's TokenRequest (what a kubelet writes into the volume).
async fn token_request(
    client: &Client,
    pod: &Pod,
    t: &k8s_openapi::api::core::v1::ServiceAccountTokenProjection,
) -> Result<String, String> {
    use k8s_openapi::api::authentication::v1::{
        BoundObjectReference, TokenRequest, TokenRequestSpec,
    };
    let ns = pod.namespace().unwrap_or_default();
    let sa = pod
        .spec
        .as_ref()
        .and_then(|s| s.service_account_name.clone())
        .unwrap_or_else(|| "default".into());
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            audiences: t.audience.clone().map(|a| vec![a]),
            expiration_seconds: t.expiration_seconds,
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.name_any()),
                uid: pod.uid(),
            }),
        }),
        ..Default::default()
    };
    let api: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(client.clone(), &ns);
    let answer = api
        .create_token_request(&sa, &Default::default(), &request)
        .await
        .map_err(|e| format!("cannot get a token for ServiceAccount {ns}/{sa}: {e}"))?;
    answer
        .status
        .and_then(|s| s.token)
        .ok_or_else(|| format!("the TokenRequest for {ns}/{sa} came back without a token"))
}

/// What a container runs here.
struct Exec {
    program: PathBuf,
    argv: Vec<String>,
    env: Vec<(String, String)>,
}

/// The program and arguments of a container here: binaries replaced, mount paths mapped, and
/// for the main container (`ip` given) the server bound to the pod IP.
fn command(
    c: &Container,
    volumes: &BTreeMap<String, PathBuf>,
    args: &Args,
    ip: Option<&str>,
) -> Option<Exec> {
    let mut mounts: Vec<(String, PathBuf)> = c
        .volume_mounts
        .iter()
        .flatten()
        .filter_map(|m| {
            let base = volumes.get(&m.name)?;
            let host = match m.sub_path.as_deref().filter(|s| !s.is_empty()) {
                Some(sub) => base.join(sub),
                None => base.clone(),
            };
            Some((m.mount_path.trim_end_matches('/').to_string(), host))
        })
        .collect();
    // The longest mount path wins: /models/sub before /models.
    mounts.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
    let map = |arg: &str| map_arg(arg, &mounts);
    let mut words: Vec<String> = c
        .command
        .iter()
        .flatten()
        .chain(c.args.iter().flatten())
        .cloned()
        .collect();
    let program = match ip {
        Some(ip) => {
            // The image's ENTRYPOINT is llama-server; a command naming it is dropped too.
            if words.first().is_some_and(|w| w.ends_with("llama-server")) {
                words.remove(0);
            }
            let mut host_given = false;
            let mut i = 0;
            while i < words.len() {
                if words[i] == "--host" && i + 1 < words.len() {
                    words[i + 1] = ip.to_string();
                    host_given = true;
                    i += 1;
                } else if words[i].starts_with("--host=") {
                    words[i] = format!("--host={ip}");
                    host_given = true;
                }
                i += 1;
            }
            if !host_given {
                words.extend(["--host".into(), ip.to_string()]);
            }
            args.llama_server_bin.clone()
        }
        None => {
            if words.is_empty() {
                return None;
            }
            let first = words.remove(0);
            if first == "modelserve" || first.ends_with("/modelserve") {
                args.modelserve_bin.clone()
            } else {
                PathBuf::from(first)
            }
        }
    };
    let env: Vec<(String, String)> = c
        .env
        .iter()
        .flatten()
        .filter_map(|e| Some((e.name.clone(), map(e.value.as_deref()?))))
        .collect();
    Some(Exec {
        program,
        argv: words.iter().map(|w| map(w)).collect(),
        env,
    })
}

/// `arg` with a leading mount path (alone, as `PATH/...`, or after `--flag=`) pointing into the
/// mapped directory.
fn map_arg(arg: &str, mounts: &[(String, PathBuf)]) -> String {
    let (prefix, value) = match arg.split_once('=') {
        Some((flag, v)) if flag.starts_with('-') => (format!("{flag}="), v),
        _ => (String::new(), arg),
    };
    for (mount, host) in mounts {
        if let Some(rest) = value.strip_prefix(mount.as_str())
            && (rest.is_empty() || rest.starts_with('/'))
        {
            return format!("{prefix}{}{rest}", host.display());
        }
    }
    arg.to_string()
}

enum Exit {
    Code(i32),
    Stopped,
}

/// Runs one container's process in a process group of its own, logging to
/// `<dir>/logs/<name>.log`, until it exits or `stop` is cancelled (then the group is killed).
async fn run_process(
    pod: &str,
    name: &str,
    Exec { program, argv, env }: Exec,
    dir: &Path,
    stop: &CancellationToken,
    grace: u64,
) -> Exit {
    let logs = dir.join("logs");
    let log = std::fs::create_dir_all(&logs).and_then(|()| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(logs.join(format!("{name}.log")))
    });
    let log = match log {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(%pod, container = name, error = %e, "cannot open the log");
            return Exit::Code(-1);
        }
    };
    let mut cmd = tokio::process::Command::new(&program);
    cmd.args(&argv)
        .envs(env)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(
            log.try_clone()
                .map(Stdio::from)
                .unwrap_or_else(|_| Stdio::null()),
        )
        .stderr(Stdio::from(log))
        .process_group(0)
        .kill_on_drop(true);
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent. It makes the
    // kernel kill the child if pod-runner dies without cleaning up (SIGKILL, a crash).
    unsafe {
        cmd.pre_exec(|| {
            rustix::process::set_parent_process_death_signal(Some(Signal::KILL))
                .map_err(std::io::Error::from)
        });
    }
    tracing::debug!(%pod, container = name, program = %program.display(), ?argv, "exec");
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            tracing::error!(%pod, container = name, program = %program.display(), error = %e, "cannot start the container's process");
            return Exit::Code(-1);
        }
    };
    let group = child.id().and_then(|id| Pid::from_raw(id as i32));
    tokio::select! {
        status = child.wait() => Exit::Code(status.ok().and_then(|s| s.code()).unwrap_or(-1)),
        _ = stop.cancelled() => {
            // The group is signalled only while its leader is unreaped, so its id cannot have
            // been reused by an unrelated process.
            if let Some(g) = group {
                let _ = rustix::process::kill_process_group(g, Signal::TERM);
                if tokio::time::timeout(Duration::from_secs(grace), child.wait()).await.is_err() {
                    tracing::info!(%pod, container = name, "still running after SIGTERM; SIGKILL");
                    let _ = rustix::process::kill_process_group(g, Signal::KILL);
                }
            }
            let _ = child.kill().await;
            tracing::info!(%pod, container = name, "stopped");
            Exit::Stopped
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_pods_at_loopback_addresses_are_run_here() {
        assert!(runs_here("127.1.0.7"));
        assert!(!runs_here("10.213.0.4"), "a real node's pod");
        assert!(!runs_here(""));
        assert!(!runs_here("not an ip"));
    }

    #[test]
    fn mount_paths_are_mapped_alone_in_folders_and_after_flags() {
        let mounts = vec![
            (
                "/etc/modelserve/engine-key".to_string(),
                PathBuf::from("/w/engine-key"),
            ),
            ("/models".to_string(), PathBuf::from("/w/models")),
        ];
        assert_eq!(map_arg("/models", &mounts), "/w/models");
        assert_eq!(map_arg("/models/a/b.gguf", &mounts), "/w/models/a/b.gguf");
        assert_eq!(
            map_arg("--model=/models/b.gguf", &mounts),
            "--model=/w/models/b.gguf"
        );
        assert_eq!(
            map_arg("/etc/modelserve/engine-key/key", &mounts),
            "/w/engine-key/key"
        );
        assert_eq!(map_arg("/modelsx", &mounts), "/modelsx");
        assert_eq!(map_arg("0.0.0.0", &mounts), "0.0.0.0");
    }
}

//! `modelserve serve` on the test bed, against the fake Hub, the mirror and a running operator:
//! the stages as they change, the progress bar (in a real pseudo-terminal too), --detach,
//! --output json, a quant the repository lacks, and the follow-up commands status and list.

mod support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use kube::Api;
use modelserve::api::ModelServe;
use support::fake_hub::{FakeHub, HubFile};
use support::models::Dense;
use support::pod_runner::PodRunner;
use support::{Namespace, Operator, Testbed, eventually, modelserve_bin, start_mirror};

/// A namespace with its own fake Hub, mirror and operator.
struct Bed {
    tb: &'static Testbed,
    ns: Namespace<'static>,
    hub: FakeHub,
    _mirror: tempfile::TempDir,
    _operator: Operator,
}

impl Bed {
    async fn start(prefix: &str) -> Bed {
        // The namespace guard borrows the test bed for the whole test; one leak per test is fine.
        let tb: &'static Testbed = Box::leak(Box::new(Testbed::get()));
        tb.install_crd();
        let ns = tb.namespace(prefix);
        let hub = FakeHub::start().await;
        let (mirror_url, mirror) = start_mirror(&hub.url).await;
        let operator = Operator::start_with(tb, &ns.name, &hub.url, &["--mirror-url", &mirror_url]);
        Bed {
            tb,
            ns,
            hub,
            _mirror: mirror,
            _operator: operator,
        }
    }

    /// acme/Tiny-GGUF with a Q4_K_M and a Q8_0 file of `bytes` each (a valid header, then filler).
    fn add_tiny_repo(&self, bytes: usize) {
        let file = |name: &str| {
            let mut b = Dense::tiny("llama").gguf();
            b.resize(bytes.max(b.len()), 7);
            HubFile::with_bytes(name, b)
        };
        self.hub.add_repo(
            "acme/Tiny-GGUF",
            vec![file("tiny-Q4_K_M.gguf"), file("tiny-Q8_0.gguf")],
        );
    }

    async fn api(&self) -> Api<ModelServe> {
        Api::namespaced(self.tb.client().await, &self.ns.name)
    }

    /// Runs the CLI with stdout and stderr piped (not a terminal); after 180 s it is killed and
    /// the test fails with what it printed so far.
    async fn run(&self, args: &[&str]) -> Run {
        use tokio::io::AsyncReadExt;
        let started = Instant::now();
        let mut child = tokio::process::Command::new(modelserve_bin())
            .args(args)
            .env("KUBECONFIG", &self.tb.kubeconfig)
            .env_remove("NO_COLOR")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let (mut out, mut err) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
        let stdout = tokio::spawn(async move {
            let mut s = String::new();
            let _ = out.read_to_string(&mut s).await;
            s
        });
        let stderr = tokio::spawn(async move {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s).await;
            s
        });
        let code = match tokio::time::timeout(Duration::from_secs(180), child.wait()).await {
            Ok(status) => status.unwrap().code(),
            Err(_) => {
                let _ = child.kill().await;
                None
            }
        };
        let run = Run {
            code,
            stdout: stdout.await.unwrap(),
            stderr: stderr.await.unwrap(),
            took: started.elapsed(),
        };
        assert!(
            run.code.is_some(),
            "modelserve {} did not end in 180 s: {run:#?}",
            args.join(" ")
        );
        run
    }

    /// `serve acme/Tiny-GGUF -n NS` with a context the tiny model's check accepts, plus `more`.
    async fn serve_tiny(&self, more: &[&str]) -> Run {
        let mut args = vec![
            "serve",
            "acme/Tiny-GGUF",
            "-n",
            &self.ns.name,
            "--context-size",
            "4096",
            "--context-length",
            "4096",
        ];
        args.extend_from_slice(more);
        self.run(&args).await
    }
}

#[derive(Debug)]
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
}

/// (stage, status) of every condition line, in the order printed.
fn stage_lines(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            let (stage, status) = (w.next()?, w.next()?);
            ["True", "False", "Unknown"]
                .contains(&status)
                .then(|| (stage.to_string(), status.to_string()))
        })
        .collect()
}

/// A non-terminal progress line: `Mirror    41%  1.2 MiB of 3.0 MiB ...`.
fn plain_progress(line: &str) -> bool {
    line.strip_prefix("Mirror    ")
        .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()) && r.contains(" of "))
}

fn settled(lines: &[(String, String)]) -> Vec<String> {
    lines
        .iter()
        .filter(|(_, s)| s != "Unknown")
        .map(|(stage, s)| format!("{stage} {s}"))
        .collect()
}

#[tokio::test]
async fn serve_on_demand_prints_each_stage_in_order_with_mirror_progress_and_exits_0() {
    let bed = Bed::start("cli-ondemand").await;
    bed.add_tiny_repo(4 << 20);
    bed.hub.throttle(1 << 20); // about 4 s of mirroring: progress lines
    let r = bed.serve_tiny(&["--on-demand"]).await;
    assert_eq!(r.code, Some(0), "{r:#?}");
    let ns = &bed.ns.name;
    let mut lines = r.stdout.lines();
    assert_eq!(
        lines.next(),
        Some(
            format!(
                "ModelServe {ns}/tiny created (acme/Tiny-GGUF); Ctrl-C stops watching, not the model"
            )
            .as_str()
        )
    );
    assert_eq!(
        settled(&stage_lines(&r.stdout)),
        [
            "Resolve True",
            "Check True",
            "Mirror True",
            "Catalog True",
            "Ready True"
        ],
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains("Mirror    Unknown  Mirroring"),
        "the running stage is shown before it is done: {}",
        r.stdout
    );
    let progress: Vec<&str> = r.stdout.lines().filter(|l| plain_progress(l)).collect();
    assert!(!progress.is_empty(), "plain progress lines: {}", r.stdout);
    assert!(
        !r.stdout.contains('\x1b'),
        "no escape codes when stdout is not a terminal: {:?}",
        r.stdout
    );
    assert_eq!(
        r.stdout.lines().last().unwrap(),
        format!(
            "tiny is on demand: replicas is 0: on demand, the gateway loads the model on its first request. Ask it through the gateway (`modelserve ask tiny \"Hello\"`), or start it now with `kubectl scale modelserve/tiny -n {ns} --replicas=1`"
        )
    );
    assert!(r.stderr.is_empty(), "{}", r.stderr);
}

#[tokio::test]
async fn a_quant_the_repo_lacks_exits_1_with_the_quants_it_has() {
    let bed = Bed::start("cli-noquant").await;
    bed.add_tiny_repo(0);
    let r = bed.serve_tiny(&["--quant", "Q5_K_XL"]).await;
    assert_eq!(r.code, Some(1), "{r:#?}");
    assert!(
        r.stdout.contains(
            "Resolve   False    NoMatchingQuant  acme/Tiny-GGUF has no file matching Q5_K_XL; it has: Q4_K_M, Q8_0"
        ),
        "{}",
        r.stdout
    );
    assert_eq!(
        r.stderr,
        "modelserve: the Resolve stage of tiny failed (NoMatchingQuant): acme/Tiny-GGUF has no file matching Q5_K_XL; it has: Q4_K_M, Q8_0\n"
    );
}

#[tokio::test]
async fn detach_returns_at_once_while_the_model_proceeds_and_status_follows_it() {
    let bed = Bed::start("cli-detach").await;
    bed.add_tiny_repo(6 << 20);
    bed.hub.throttle(1 << 20); // about 6 s of mirroring after serve returned
    let r = bed.serve_tiny(&["--detach", "--on-demand"]).await;
    let ns = &bed.ns.name;
    assert_eq!(r.code, Some(0), "{r:#?}");
    assert_eq!(
        r.stdout,
        format!(
            "ModelServe {ns}/tiny created (acme/Tiny-GGUF); follow it with `modelserve status tiny -n {ns} --watch`\n"
        )
    );
    assert!(
        r.took < Duration::from_secs(5),
        "--detach waits for nothing: {:?}",
        r.took
    );
    let api = bed.api().await;
    let mirrored = |ms: &ModelServe| {
        ms.status.as_ref().is_some_and(|s| {
            s.conditions
                .iter()
                .any(|c| c.type_ == "Mirrored" && c.status == "True")
        })
    };
    assert!(
        !mirrored(&api.get("tiny").await.unwrap()),
        "serve returned before the mirror finished"
    );
    let done = eventually(Duration::from_secs(60), async || {
        let ms = api.get("tiny").await.ok()?;
        mirrored(&ms).then_some(())
    })
    .await;
    assert!(done.is_some(), "the model went on without the terminal");

    // Resuming: status --watch follows to the verdict as serve does.
    let w = bed.run(&["status", "tiny", "-n", ns, "--watch"]).await;
    assert_eq!(w.code, Some(0), "{w:#?}");
    assert!(
        settled(&stage_lines(&w.stdout)).ends_with(&["Catalog True".into(), "Ready True".into()]),
        "{}",
        w.stdout
    );

    let s = bed.run(&["status", "tiny", "-n", ns]).await;
    assert_eq!(s.code, Some(0), "{s:#?}");
    assert!(
        s.stdout.starts_with(&format!("Name:       {ns}/tiny\n")),
        "{}",
        s.stdout
    );
    let table: Vec<&str> = s
        .stdout
        .lines()
        .skip_while(|l| !l.starts_with("STAGE"))
        .take_while(|l| !l.is_empty())
        .collect();
    let header: Vec<&str> = table[0].split_whitespace().collect();
    assert_eq!(header, ["STAGE", "STATUS", "REASON", "AGE", "MESSAGE"]);
    let stages: Vec<&str> = table[1..]
        .iter()
        .filter_map(|l| l.split_whitespace().next())
        .collect();
    assert_eq!(
        stages,
        [
            "Resolve",
            "Check",
            "Mirror",
            "Catalog",
            "Place",
            "SmokeTest",
            "Ready"
        ]
    );
    assert!(
        s.stdout
            .contains("\nMirror:     100% (6.0 MiB of 6.0 MiB)\n"),
        "{}",
        s.stdout
    );
    assert!(s.stdout.contains("served as \"tiny\""), "{}", s.stdout);

    let l = bed.run(&["list", "-n", ns]).await;
    assert_eq!(l.code, Some(0), "{l:#?}");
    let rows: Vec<Vec<&str>> = l
        .stdout
        .lines()
        .map(|r| r.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows[0],
        [
            "NAME", "REPO", "QUANT", "STAGE", "PROGRESS", "MEMORY", "READY", "TOK/S", "AGE"
        ]
    );
    assert_eq!(
        &rows[1][..4],
        ["tiny", "acme/Tiny-GGUF", "Q4_K_M", "OnDemand"]
    );
}

#[tokio::test]
async fn output_json_prints_the_final_status_and_a_second_run_changes_nothing() {
    let bed = Bed::start("cli-json").await;
    bed.add_tiny_repo(0);
    let r = bed.serve_tiny(&["--on-demand", "--output", "json"]).await;
    assert_eq!(r.code, Some(0), "{r:#?}");
    let v: serde_json::Value = serde_json::from_str(&r.stdout)
        .unwrap_or_else(|e| panic!("stdout is one JSON document ({e}): {}", r.stdout));
    let ready = v["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == "Ready")
        .unwrap();
    assert_eq!(
        (&ready["status"], &ready["reason"]),
        (&"True".into(), &"OnDemand".into())
    );
    assert_eq!(v["resolved"]["servedName"], "tiny");
    assert_eq!(v["resolved"]["quant"], "Q4_K_M");
    assert!(
        r.stderr.contains("Catalog   True"),
        "the stages go to stderr so stdout stays JSON: {}",
        r.stderr
    );

    let again = bed.serve_tiny(&["--on-demand", "--output", "json"]).await;
    assert_eq!(again.code, Some(0), "{again:#?}");
    assert!(again.stderr.contains("tiny unchanged"), "{}", again.stderr);
    let ms = bed.api().await.get("tiny").await.unwrap();
    assert_eq!(
        ms.metadata.generation,
        Some(1),
        "the same flags apply the same spec"
    );
    let managers: Vec<_> = ms
        .metadata
        .managed_fields
        .unwrap_or_default()
        .into_iter()
        .filter(|m| m.operation.as_deref() == Some("Apply"))
        .filter_map(|m| m.manager)
        .collect();
    assert!(
        managers.contains(&"modelserve-cli".to_string()),
        "{managers:?}"
    );
}

/// Runs `modelserve ARGS` inside `script`, so its stdout is a real pseudo-terminal.
async fn in_terminal(bed: &Bed, args: &[&str], no_color: bool) -> (Option<i32>, String) {
    let quoted: Vec<String> = std::iter::once(modelserve_bin())
        .chain(args.iter().copied())
        .map(|a| format!("'{}'", a.replace('\'', r"'\''")))
        .collect();
    let mut cmd = tokio::process::Command::new("script");
    cmd.args(["-q", "-e", "-c", &quoted.join(" "), "/dev/null"])
        .env("KUBECONFIG", &bed.tb.kubeconfig)
        .env("TERM", "xterm")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if no_color {
        cmd.env("NO_COLOR", "1");
    } else {
        cmd.env_remove("NO_COLOR");
    }
    let out = tokio::time::timeout(Duration::from_secs(180), cmd.output())
        .await
        .expect("serve in a terminal ends")
        .expect("run script (util-linux)");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[tokio::test]
async fn in_a_terminal_the_progress_bar_is_redrawn_in_place_and_stages_are_coloured() {
    let bed = Bed::start("cli-tty").await;
    bed.add_tiny_repo(8 << 20);
    bed.hub.throttle(1 << 20); // about 8 s of mirroring: several redraws
    let ns = bed.ns.name.clone();
    let args = [
        "serve",
        "acme/Tiny-GGUF",
        "-n",
        &ns,
        "--on-demand",
        "--context-size",
        "4096",
        "--context-length",
        "4096",
    ];
    let (code, out) = in_terminal(&bed, &args, false).await;
    assert_eq!(code, Some(0), "{out}");
    // Each redraw returns to the start of the line and clears it.
    let frames: Vec<&str> = out
        .split("\r\x1b[2K")
        .filter(|f| f.starts_with("Mirror    ["))
        .collect();
    let percents: std::collections::BTreeSet<&str> = frames
        .iter()
        .filter_map(|f| f.split(']').nth(1)?.split('%').next())
        .map(str::trim)
        .collect();
    assert!(
        percents.len() >= 2,
        "the bar was redrawn with moving progress: {frames:?}"
    );
    assert!(
        frames.iter().any(|f| f.contains("/s  ETA ")),
        "speed and time left from successive observations: {frames:?}"
    );
    assert!(
        out.contains("\x1b[32mTrue    \x1b[0m"),
        "True is green on a terminal: {out:?}"
    );
    assert!(
        !out.lines().any(plain_progress),
        "no plain progress lines on a terminal: {out:?}"
    );

    let (code, out) = in_terminal(&bed, &args, true).await;
    assert_eq!(code, Some(0), "{out}");
    assert!(out.contains("Catalog   True"), "{out:?}");
    assert!(!out.contains("\x1b["), "NO_COLOR: no colour codes: {out:?}");
}

#[tokio::test]
async fn serve_prints_every_stage_in_order_and_exits_0_with_the_smoke_reply() {
    let bed = Bed::start("cli-full").await;
    bed.hub.add_repo(
        "acme/Tiny-GGUF",
        vec![HubFile::with_bytes(
            "llama-tiny-f16.gguf",
            support::models::tiny_llama_gguf(),
        )],
    );
    let runner = PodRunner::start(bed.tb, &bed.ns.name);

    let r = bed.serve_tiny(&["--quant", "F16"]).await;
    assert_eq!(r.code, Some(0), "{r:#?}\npod-runner log:\n{}", runner.log());
    assert_eq!(
        settled(&stage_lines(&r.stdout)),
        [
            "Resolve True",
            "Check True",
            "Mirror True",
            "Catalog True",
            "Place True",
            "SmokeTest True",
            "Ready True"
        ],
        "{}",
        r.stdout
    );
    let reply = r
        .stdout
        .lines()
        .find(|l| l.starts_with("Smoke test reply: \""))
        .unwrap_or_else(|| panic!("no smoke reply: {}", r.stdout));
    assert!(reply.ends_with(" tokens/s)"), "{reply}");
    assert!(
        r.stdout.lines().last().unwrap().starts_with("Endpoint: "),
        "{}",
        r.stdout
    );
    let status = bed.api().await.get("tiny").await.unwrap().status.unwrap();
    let smoke = status.smoke.expect("status.smoke");
    // The CLI shows the reply as one line (whitespace runs and control chars as one space,
    // bounded), and a tiny random model's reply is any bytes at all.
    let shown = modelserve::cli::text::shown(&smoke.reply, modelserve::cli::text::MESSAGE_CHARS);
    assert!(reply.contains(&format!("{shown:?}")), "{reply}");
}

#[tokio::test]
async fn timeout_and_ctrl_c_stop_the_watch_not_the_model() {
    let bed = Bed::start("cli-stop").await;
    bed.add_tiny_repo(12 << 20);
    bed.hub.throttle(1 << 20); // about 12 s of mirroring
    let ns = bed.ns.name.clone();
    let d = bed.serve_tiny(&["--on-demand", "--detach"]).await;
    assert_eq!(d.code, Some(0), "{d:#?}");
    let api = bed.api().await;
    let mirroring = eventually(Duration::from_secs(20), async || {
        let s = api.get("tiny").await.ok()?.status?;
        let c = s.conditions.iter().find(|c| c.type_ == "Mirrored")?;
        (c.reason == "Mirroring").then_some(())
    })
    .await;
    assert!(mirroring.is_some(), "the mirror started");
    let r = bed.serve_tiny(&["--on-demand", "--timeout", "2s"]).await;
    assert_eq!(r.code, Some(1), "{r:#?}");
    let err = r.stderr.trim_end();
    assert!(
        err.starts_with(
            "modelserve: tiny is not ready after 2s: the Mirror stage is Unknown (Mirroring): "
        ) && err.ends_with(&format!(
            "It keeps going in the cluster; watch it with `modelserve status tiny -n {ns} --watch`"
        )),
        "{err}"
    );

    // Ctrl-C while the mirror works: the CLI stops, says how to watch again, and the model goes on.
    let child = tokio::process::Command::new(modelserve_bin())
        .args(["status", "tiny", "-n", &ns, "--watch"])
        .env("KUBECONFIG", &bed.tb.kubeconfig)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let interrupted = std::process::Command::new("kill")
        .args(["-INT", &child.id().unwrap().to_string()])
        .status()
        .unwrap();
    assert!(interrupted.success());
    let out = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output())
        .await
        .expect("Ctrl-C ends the watch at once")
        .unwrap();
    assert_eq!(out.status.code(), Some(130), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stderr),
        format!(
            "modelserve: stopped watching; tiny keeps going in the cluster. Watch it again with `modelserve status tiny -n {ns} --watch`\n"
        )
    );
    let before = api.get("tiny").await.unwrap().status.unwrap();
    assert!(
        before
            .conditions
            .iter()
            .any(|c| c.type_ == "Mirrored" && c.status == "Unknown"),
        "Ctrl-C came while the mirror worked: {before:#?}"
    );
    let ready = eventually(Duration::from_secs(60), async || {
        let s = api.get("tiny").await.ok()?.status?;
        let c = s.conditions.iter().find(|c| c.type_ == "Ready")?;
        (c.status == "True").then_some(())
    })
    .await;
    assert!(ready.is_some(), "the model went on after the CLI stopped");
}

#[tokio::test]
async fn what_the_api_server_refuses_is_one_line_quoting_it() {
    let tb = Testbed::get();
    tb.install_crd();
    let ns = tb.namespace("cli-refused");
    let run = |args: Vec<&str>| {
        let out = std::process::Command::new(modelserve_bin())
            .args(args)
            .env("KUBECONFIG", &tb.kubeconfig)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        let lines = if out.status.success() { 0 } else { 1 };
        assert_eq!(err.lines().count(), lines, "{err}");
        (out.status.code(), err.trim_end().to_string())
    };
    let (code, err) = run(vec![
        "serve",
        "acme/Tiny-GGUF",
        "-n",
        "no-such-namespace-cli",
    ]);
    assert_eq!(code, Some(1));
    assert_eq!(
        err,
        "modelserve: cannot apply ModelServe no-such-namespace-cli/tiny: namespaces \"no-such-namespace-cli\" not found (NotFound)"
    );
    let (code, err) = run(vec![
        "serve",
        "acme/Tiny-GGUF",
        "-n",
        &ns.name,
        "--file",
        "../x.gguf",
    ]);
    assert_eq!(code, Some(1));
    assert_eq!(
        err,
        format!(
            "modelserve: cannot apply ModelServe {}/tiny: ModelServe.modelserve.dev \"tiny\" is invalid: spec.file: Invalid value: \"../x.gguf\": file must be a path inside the repository: '..' is not allowed (Invalid)",
            ns.name
        )
    );
    // A name already serving another repository is not silently repointed.
    let (code, _) = run(vec!["serve", "acme/Tiny-GGUF", "-n", &ns.name, "--detach"]);
    assert_eq!(code, Some(0));
    let (code, err) = run(vec!["serve", "other/Tiny-GGUF", "-n", &ns.name]);
    assert_eq!(code, Some(1));
    assert_eq!(
        err,
        format!(
            "modelserve: ModelServe {}/tiny already serves acme/Tiny-GGUF; choose another --name to serve other/Tiny-GGUF",
            ns.name
        )
    );
}

//! Bad input to the CLI, through the real binary: each gives one line saying what is wrong and
//! what would do, a non-zero exit code, and never a panic or a stack trace.
//! One test removes the CRD for a moment, so these live in their own test binary.

mod support;

use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use support::{Testbed, free_port, modelserve_bin};

const NO_KUBECONFIG: &str = "/nonexistent/kubeconfig";

fn run(args: &[&str], kubeconfig: &Path) -> Output {
    Command::new(modelserve_bin())
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .unwrap()
}

/// stderr is exactly one line, returned without its newline; stdout is empty.
fn one_line(out: &Output) -> String {
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        !err.contains("panicked") && !err.contains("backtrace") && !err.contains("RUST_BACKTRACE"),
        "no panic or stack trace: {err}"
    );
    assert_eq!(err.lines().count(), 1, "one line: {err:?}");
    assert!(
        out.stdout.is_empty(),
        "{:?}",
        String::from_utf8_lossy(&out.stdout)
    );
    err.trim_end().to_string()
}

#[test]
fn an_unknown_flag_is_one_line_naming_it_and_exits_2() {
    let out = run(
        &["serve", "--bogus", "acme/Tiny-GGUF"],
        Path::new(NO_KUBECONFIG),
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        one_line(&out),
        "modelserve serve: unexpected argument '--bogus' found; see `modelserve serve --help`"
    );
    let out = run(
        &["serve", "acme/Tiny-GGUF", "-o", "yaml"],
        Path::new(NO_KUBECONFIG),
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        one_line(&out),
        "modelserve serve: invalid value 'yaml' for '--output <OUTPUT>' [possible values: text, json]; see `modelserve serve --help`"
    );
    let out = run(&["status"], Path::new(NO_KUBECONFIG));
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        one_line(&out),
        "modelserve status: the following required arguments were not provided: <NAME>; see `modelserve status --help`"
    );
    let out = run(&["list", "-A", "-n", "x"], Path::new(NO_KUBECONFIG));
    assert_eq!(out.status.code(), Some(2));
    assert!(
        one_line(&out).starts_with("modelserve list: the argument '--all-namespaces' cannot be used with '--namespace <NAMESPACE>'"),
        "{out:?}"
    );
}

#[test]
fn a_malformed_repo_or_name_is_refused_before_any_cluster_is_asked() {
    // The kubeconfig does not exist: the input is checked first.
    for repo in ["not-a-repo", "a/b/c", "/model", "owner/-x"] {
        let out = run(&["serve", repo], Path::new(NO_KUBECONFIG));
        assert_eq!(out.status.code(), Some(2), "{repo}");
        assert_eq!(
            one_line(&out),
            format!(
                "modelserve: repository {repo:?} is not valid: it must be owner/name, letters, digits, '-', '_' and '.' (for example bartowski/Qwen2.5-7B-Instruct-GGUF)"
            )
        );
    }
    let out = run(
        &["serve", "acme/Tiny-GGUF", "--name", "Tiny_1"],
        Path::new(NO_KUBECONFIG),
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        one_line(&out),
        "modelserve: --name \"Tiny_1\" is not a valid name: use lowercase letters, digits and '-', start with a letter, end with a letter or digit, at most 63 characters (it also names the model's Service)"
    );
    let out = run(
        &[
            "serve",
            "acme/Tiny-GGUF",
            "--context-size",
            "1024",
            "--context-length",
            "4096",
        ],
        Path::new(NO_KUBECONFIG),
    );
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        one_line(&out),
        "modelserve: --context-length 4096 is larger than --context-size 1024: one request cannot use more than the server's whole context"
    );
    let out = run(
        &["serve", "acme/Tiny-GGUF", "--token-secret", "HF:token"],
        Path::new(NO_KUBECONFIG),
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        one_line(&out).contains("\"HF\" is not a Secret name (lowercase letters, digits, '-' and '.'); write NAME or NAME:KEY"),
        "{out:?}"
    );
}

#[test]
fn a_missing_kubeconfig_is_named() {
    for args in [
        &["serve", "acme/Tiny-GGUF"][..],
        &["status", "tiny"],
        &["list"],
    ] {
        let out = run(args, Path::new(NO_KUBECONFIG));
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert_eq!(
            one_line(&out),
            "modelserve: no kubeconfig: KUBECONFIG names /nonexistent/kubeconfig, which does not exist; point KUBECONFIG at your cluster's kubeconfig"
        );
    }
    let home = tempfile::tempdir().unwrap();
    let out = Command::new(modelserve_bin())
        .args(["list"])
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("HOME", home.path())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(
        one_line(&out),
        format!(
            "modelserve: no kubeconfig: KUBECONFIG is not set and {}/.kube/config does not exist; point KUBECONFIG at your cluster's kubeconfig",
            home.path().display()
        )
    );
}

#[test]
fn an_unreachable_api_server_is_named_with_the_cause() {
    let port = free_port(); // nothing listens there
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    std::fs::write(
        &kc,
        format!("apiVersion: v1\nkind: Config\nclusters: [{{name: x, cluster: {{server: \"https://127.0.0.1:{port}\"}}}}]\nusers: [{{name: x, user: {{token: t}}}}]\ncontexts: [{{name: x, context: {{cluster: x, user: x, namespace: models}}}}]\ncurrent-context: x\n"),
    )
    .unwrap();
    for args in [
        &["serve", "acme/Tiny-GGUF"][..],
        &["status", "tiny"],
        &["list", "-A"],
    ] {
        let started = Instant::now();
        let out = run(args, &kc);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        assert_eq!(
            one_line(&out),
            format!(
                "modelserve: cannot reach the Kubernetes API server at https://127.0.0.1:{port}/: Connection refused (os error 111); check KUBECONFIG and that the cluster is up"
            )
        );
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{args:?} gave up quickly"
        );
    }
}

#[test]
fn completions_are_printed_for_each_shell() {
    let out = run(&["completions", "bash"], Path::new(NO_KUBECONFIG));
    assert!(out.status.success());
    let bash = String::from_utf8(out.stdout).unwrap();
    assert!(
        bash.contains("complete -F _modelserve") && bash.contains("serve"),
        "{bash}"
    );
    let zsh =
        String::from_utf8(run(&["completions", "zsh"], Path::new(NO_KUBECONFIG)).stdout).unwrap();
    assert!(zsh.starts_with("#compdef modelserve"), "{zsh}");
    let fish =
        String::from_utf8(run(&["completions", "fish"], Path::new(NO_KUBECONFIG)).stdout).unwrap();
    assert!(fish.contains("complete -c modelserve"), "{fish}");
    let out = run(&["completions", "tcsh"], Path::new(NO_KUBECONFIG));
    assert_eq!(out.status.code(), Some(2));
    assert!(one_line(&out).starts_with("modelserve completions: invalid value 'tcsh'"));
}

/// A directory with `kubectl-modelserve` linked to the binary, for kubectl to find as a plugin.
fn plugin_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(modelserve_bin(), dir.path().join("kubectl-modelserve")).unwrap();
    dir
}

/// `kubectl ARGS` with the plugin on PATH.
/// kubectl of the test bed, finding the plugin in `plugins`.
fn kubectl_plugin(tb: &Testbed, plugins: &Path, args: &[&str]) -> std::process::Command {
    let path = format!(
        "{}:{}:{}",
        plugins.display(),
        tb.bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut c = tb.command("kubectl");
    c.args(args).env("PATH", path);
    c
}

#[test]
fn as_a_kubectl_plugin_the_usage_says_kubectl_modelserve() {
    let tb = Testbed::get();
    let plugins = plugin_dir();
    let help = kubectl_plugin(&tb, plugins.path(), &["modelserve", "serve", "--help"])
        .output()
        .unwrap();
    assert!(help.status.success(), "{help:?}");
    let text = String::from_utf8(help.stdout).unwrap();
    assert!(
        text.contains("Usage: kubectl modelserve serve [OPTIONS] <REPO>"),
        "{text}"
    );
    let out = kubectl_plugin(&tb, plugins.path(), &["modelserve", "serve", "--bogus"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(
        one_line(&out),
        "kubectl modelserve serve: unexpected argument '--bogus' found; see `kubectl modelserve serve --help`"
    );
}

/// Reinstalls the CRD when dropped, even when an assertion failed in between.
#[test]
fn a_missing_crd_says_how_to_install_it() {
    // A second, empty API server: the test bed's CRD (and every ModelServe) stays as it is.
    let tb = Testbed::get();
    let empty = tb.empty_apiserver();
    let plugins = plugin_dir();
    let ns = "default";
    let mut outs = Vec::new();
    for args in [
        &["serve", "acme/Tiny-GGUF", "-n", ns][..],
        &["status", "tiny", "-n", ns],
        &["list", "-A"],
    ] {
        outs.push((args.join(" "), "modelserve", run(args, &empty.kubeconfig)));
    }
    outs.push((
        "kubectl modelserve list".into(),
        "kubectl modelserve",
        kubectl_plugin(&tb, plugins.path(), &["modelserve", "list", "-n", ns])
            .env("KUBECONFIG", &empty.kubeconfig)
            .output()
            .unwrap(),
    ));
    for (args, program, out) in outs {
        assert_eq!(out.status.code(), Some(1), "{args}");
        assert_eq!(
            one_line(&out),
            format!(
                "{program}: the ModelServe CRD (modelserves.modelserve.dev) is not installed in this cluster; install it with `kubectl apply -f crds/` or `modelserve crd | kubectl apply -f -`"
            ),
            "{args}"
        );
    }
}

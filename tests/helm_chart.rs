//! The Helm chart lints and renders objects the real API server accepts.

mod support;

use support::{Testbed, repo_path};

#[test]
fn helm_lint_passes() {
    let tb = Testbed::get();
    let out = tb
        .command("helm")
        .args(["lint", "--strict", &repo_path("charts/modelserve")])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn rendered_chart_passes_server_side_dry_run() {
    let tb = Testbed::get();
    tb.install_crd();
    let ns = tb.namespace("helm");
    let chart = repo_path("charts/modelserve");
    let watch = format!("watchNamespace={}", ns.name);
    for values in [
        vec![],
        vec!["--set", watch.as_str(), "--set", "logFormat=json"],
    ] {
        let mut args = vec![
            "template",
            "ms",
            chart.as_str(),
            "--namespace",
            ns.name.as_str(),
            "--include-crds",
        ];
        args.extend(values);
        let out = tb.command("helm").args(&args).output().unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rendered = String::from_utf8(out.stdout).unwrap();
        assert!(rendered.contains("kind: Deployment") && rendered.contains("kind: ServiceAccount"));
        let applied = tb.kubectl_stdin(
            &["apply", "--dry-run=server", "-n", &ns.name, "-f", "-"],
            &rendered,
        );
        assert!(
            applied.status.success(),
            "{}",
            String::from_utf8_lossy(&applied.stderr)
        );
    }
}

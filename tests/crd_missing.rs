//! Without the CRD the controller exits at once with a message saying how to install it.
//! The test bed's CRD stays where it is (deleting it would delete every ModelServe, the demo's
//! included): the controller is pointed at a second, empty API server of the same build instead.

mod support;

use std::process::Command;
use support::{Testbed, modelserve_bin};

#[test]
fn the_controller_exits_with_a_clear_message_when_the_crd_is_missing() {
    let tb = Testbed::get();
    let empty = tb.empty_apiserver();
    let out = Command::new(modelserve_bin())
        .args(["controller", "--metrics-addr", "127.0.0.1:0"])
        .env("KUBECONFIG", &empty.kubeconfig)
        .output()
        .unwrap();
    assert!(
        !out.status.success(),
        "the controller must not run without its CRD"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("ModelServe CRD (modelserves.modelserve.dev) is not installed"),
        "{err}"
    );
    assert!(
        err.contains("kubectl apply -f crds/"),
        "the message says how to fix it: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn the_controller_explains_an_unreachable_api_server() {
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    std::fs::write(
        &kc,
        "apiVersion: v1\nkind: Config\nclusters: [{name: x, cluster: {server: \"https://127.0.0.1:9\"}}]\nusers: [{name: x, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: x, user: x}}]\ncurrent-context: x\n",
    )
    .unwrap();
    let out = Command::new(modelserve_bin())
        .args(["controller"])
        .env("KUBECONFIG", &kc)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    let last = err.trim().lines().last().unwrap_or_default();
    assert!(
        last.contains("cannot reach the Kubernetes API server at https://127.0.0.1:9/"),
        "{err}"
    );
    assert!(
        !err.contains("panicked") && !err.contains("backtrace"),
        "no stack trace: {err}"
    );
}

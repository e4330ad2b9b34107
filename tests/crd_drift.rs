//! crds/ is generated from the Rust types; these fail when someone forgets to regenerate it.

mod support;

#[test]
fn committed_crd_matches_the_rust_types() {
    let generated = modelserve::api::crd_yaml().unwrap();
    let committed = std::fs::read_to_string(support::repo_path("crds/modelserve.yaml")).unwrap();
    assert!(
        generated == committed,
        "crds/modelserve.yaml is stale: regenerate it with `cargo run -- crd > crds/modelserve.yaml && cp crds/modelserve.yaml charts/modelserve/crds/`"
    );
}

#[test]
fn the_chart_ships_the_same_crd() {
    let committed = std::fs::read_to_string(support::repo_path("crds/modelserve.yaml")).unwrap();
    let chart =
        std::fs::read_to_string(support::repo_path("charts/modelserve/crds/modelserve.yaml"))
            .unwrap();
    assert!(
        committed == chart,
        "charts/modelserve/crds/modelserve.yaml differs from crds/: `cp crds/modelserve.yaml charts/modelserve/crds/`"
    );
}

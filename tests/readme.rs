//! README.md stays true to the code: every spec field of the CRD is in the spec reference, and
//! every condition reason a stage can set is in the reasons table with what to do about it.

use kube::CustomResourceExt;
use modelserve::api::ModelServe;

fn readme() -> String {
    std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap()
}

/// Dotted paths of the spec's fields, nested objects included (not inside `engine.resources`,
/// which is Kubernetes' own type).
fn spec_fields() -> Vec<String> {
    let crd = serde_json::to_value(ModelServe::crd()).unwrap();
    let spec = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"];
    let mut out = Vec::new();
    fn walk(v: &serde_json::Value, prefix: &str, out: &mut Vec<String>) {
        let Some(props) = v["properties"].as_object() else {
            return;
        };
        for (k, child) in props {
            let path = format!("{prefix}{k}");
            out.push(path.clone());
            if k != "resources" {
                walk(child, &format!("{path}."), out);
            }
        }
    }
    walk(spec, "", &mut out);
    out
}

#[test]
fn every_spec_field_is_in_the_spec_reference() {
    let text = readme();
    let fields = spec_fields();
    assert!(fields.len() > 15, "{fields:?}");
    let missing: Vec<_> = fields
        .iter()
        .filter(|f| !text.contains(&format!("| `{f}` |")))
        .collect();
    assert!(
        missing.is_empty(),
        "README's spec reference lacks {missing:?}"
    );
}

/// The reasons README's table explains: the backticked words of its first column.
fn table_reasons(text: &str) -> Vec<String> {
    let start = text
        .find("| reason | status | what to do |")
        .expect("README has the reasons table");
    let mut out = Vec::new();
    for line in text[start..].lines().skip(2) {
        if !line.starts_with('|') {
            break;
        }
        let first = line.split('|').nth(1).unwrap_or_default();
        for (i, part) in first.split('`').enumerate() {
            if i % 2 == 1 {
                out.push(part.to_string());
            }
        }
    }
    out
}

#[test]
fn the_reasons_table_explains_every_reason_the_code_can_write_and_no_other() {
    let text = readme();
    let table = table_reasons(&text);
    let code = modelserve::pipeline::reasons::all();
    let missing: Vec<_> = code
        .iter()
        .filter(|r| !table.iter().any(|t| t == *r))
        .collect();
    assert!(
        missing.is_empty(),
        "README's reasons table lacks {missing:?}"
    );
    let stale: Vec<_> = table
        .iter()
        .filter(|t| !code.contains(&t.as_str()))
        .collect();
    assert!(
        stale.is_empty(),
        "README's reasons table explains reasons the code never writes: {stale:?}"
    );
}

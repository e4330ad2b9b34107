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

/// Reason strings the stages write: `reason: "X"` and `failed("X", ...)` in src/pipeline.
fn stage_reasons() -> Vec<String> {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/src/pipeline");
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let src = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for marker in ["reason: \"", "failed(\""] {
            for (i, _) in src.match_indices(marker) {
                let rest = &src[i + marker.len()..];
                let word: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric())
                    .collect();
                if rest[word.len()..].starts_with('"') && word.len() > 2 && word != "Ok" {
                    out.push(word);
                }
            }
        }
    }
    out.sort();
    out.dedup();
    out
}

#[test]
fn every_reason_a_stage_sets_is_explained() {
    let text = readme();
    let reasons = stage_reasons();
    assert!(reasons.len() > 25, "{reasons:?}");
    let missing: Vec<_> = reasons
        .iter()
        .filter(|r| !text.contains(&format!("`{r}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "README's reasons table lacks {missing:?}"
    );
}

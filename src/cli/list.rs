//! `modelserve list`: the ModelServes of a namespace (or all), with the columns of
//! `kubectl get modelserves`.

use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::ListParams;

use crate::api::{ModelServe, ModelServeStatus};
use crate::cli::status::{age, table};
use crate::cli::text::{NAME_CHARS, WORD_CHARS, shown};
use crate::cli::{Failure, cluster};

/// Flags of `modelserve list`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Namespace (default: the kubeconfig context's, else default).
    #[arg(long, short = 'n', conflicts_with = "all_namespaces")]
    pub namespace: Option<String>,
    /// List the ModelServes of every namespace.
    #[arg(long, short = 'A')]
    pub all_namespaces: bool,
}

/// Prints the table, or says that there is nothing to list.
pub async fn run(args: Args) -> Result<(), Failure> {
    let cluster = cluster::connect().await?;
    let namespace = match (args.all_namespaces, &args.namespace) {
        (true, _) => None,
        (false, Some(ns)) => Some(ns.clone()),
        (false, None) => Some(cluster.default_namespace.clone()),
    };
    cluster.ensure_crd(namespace.as_deref()).await?;
    let api: Api<ModelServe> = match &namespace {
        Some(ns) => Api::namespaced(cluster.client.clone(), ns),
        None => Api::all(cluster.client.clone()),
    };
    let mut items = api
        .list(&ListParams::default())
        .await
        .map_err(|e| cluster.explain(e, "list ModelServes"))?
        .items;
    if items.is_empty() {
        match &namespace {
            Some(ns) => eprintln!("No ModelServes in namespace {ns}."),
            None => eprintln!("No ModelServes in any namespace."),
        }
        return Ok(());
    }
    items.sort_by(|a, b| {
        (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name))
    });
    print!("{}", render(&items, namespace.is_none(), Timestamp::now()));
    Ok(())
}

/// The table: NAME REPO QUANT STAGE PROGRESS MEMORY READY TOK/S AGE, with NAMESPACE first for -A.
pub fn render(items: &[ModelServe], with_namespace: bool, now: Timestamp) -> String {
    let mut header = vec![
        "NAME", "REPO", "QUANT", "STAGE", "PROGRESS", "MEMORY", "READY", "TOK/S", "AGE",
    ];
    if with_namespace {
        header.insert(0, "NAMESPACE");
    }
    let mut rows = vec![header.into_iter().map(String::from).collect::<Vec<_>>()];
    let none = ModelServeStatus::default();
    for ms in items {
        let s = ms.status.as_ref().unwrap_or(&none);
        let name = |v: Option<&str>| shown(v.unwrap_or_default(), NAME_CHARS);
        let word = |v: Option<&str>| shown(v.unwrap_or_default(), WORD_CHARS);
        let mut row = vec![
            name(ms.metadata.name.as_deref()),
            name(Some(&ms.spec.repo)),
            word(s.resolved.as_ref().and_then(|r| r.quant.as_deref())),
            word(s.stage.as_deref()),
            word(s.progress.as_deref()),
            word(s.check.as_ref().and_then(|c| c.memory.as_deref())),
            word(s.ready.as_deref()),
            s.smoke
                .as_ref()
                .and_then(|m| m.tokens_per_second)
                .filter(|t| t.is_finite())
                .map(|t| format!("{t:.1}"))
                .unwrap_or_default(),
            age(ms.metadata.creation_timestamp.as_ref(), now),
        ];
        if with_namespace {
            row.insert(0, name(ms.metadata.namespace.as_deref()));
        }
        rows.push(row);
    }
    table(&rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ModelServeSpec, SmokeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    #[test]
    fn the_columns_are_those_of_kubectl_get() {
        let spec: ModelServeSpec =
            serde_json::from_value(serde_json::json!({"repo": "acme/Tiny-GGUF"})).unwrap();
        let mut ms = ModelServe::new("tiny", spec);
        ms.metadata.namespace = Some("ns".into());
        let t0 = Timestamp::from_second(1_800_000_000).unwrap();
        ms.metadata.creation_timestamp = Some(Time(t0));
        ms.status = Some(ModelServeStatus {
            stage: Some("Ready".into()),
            ready: Some("1/1".into()),
            smoke: Some(SmokeStatus {
                reply: "hi".into(),
                tokens_per_second: Some(85.33),
                ..Default::default()
            }),
            ..Default::default()
        });
        let now = Timestamp::from_second(1_800_000_000 + 180).unwrap();
        assert_eq!(
            render(&[ms.clone()], false, now),
            "NAME   REPO             QUANT   STAGE   PROGRESS   MEMORY   READY   TOK/S   AGE\n\
             tiny   acme/Tiny-GGUF           Ready                       1/1     85.3    3m\n"
        );
        assert!(render(&[ms], true, now).starts_with("NAMESPACE   NAME"));
    }

    #[test]
    fn a_hostile_row_stays_one_line_of_bounded_cells() {
        let spec: ModelServeSpec =
            serde_json::from_value(serde_json::json!({"repo": "acme/Tiny-GGUF"})).unwrap();
        let mut ms = ModelServe::new("tiny", spec);
        ms.status = Some(ModelServeStatus {
            stage: Some("Mirror\nFAKE ROW\x1b[2J".into()),
            progress: Some("😀".repeat(10_000)),
            ready: None,
            smoke: Some(SmokeStatus {
                tokens_per_second: Some(f64::NAN),
                ..Default::default()
            }),
            ..Default::default()
        });
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let text = render(&[ms], false, now);
        assert_eq!(text.lines().count(), 2, "{text}");
        assert!(!text.contains('\x1b') && !text.contains("NaN"), "{text}");
        let row = text.lines().nth(1).unwrap();
        assert!(row.contains("Mirror FAKE ROW [2J"), "{row}");
        assert_eq!(row.matches('😀').count(), WORD_CHARS - 1, "{row}");
    }
}

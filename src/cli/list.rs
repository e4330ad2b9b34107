//! `modelserve list`: the ModelServes of a namespace (or all), with the columns of
//! `kubectl get modelserves`.

use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::ListParams;

use crate::api::ModelServe;
use crate::cli::status::{age, table};
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
    for ms in items {
        let s = ms.status.clone().unwrap_or_default();
        let mut row = vec![
            ms.metadata.name.clone().unwrap_or_default(),
            ms.spec.repo.clone(),
            s.resolved
                .as_ref()
                .and_then(|r| r.quant.clone())
                .unwrap_or_default(),
            s.stage.clone().unwrap_or_default(),
            s.progress.clone().unwrap_or_default(),
            s.check
                .as_ref()
                .and_then(|c| c.memory.clone())
                .unwrap_or_default(),
            s.ready.clone().unwrap_or_default(),
            s.smoke
                .as_ref()
                .and_then(|m| m.tokens_per_second)
                .map(|t| format!("{t:.1}"))
                .unwrap_or_default(),
            age(ms.metadata.creation_timestamp.as_ref(), now),
        ];
        if with_namespace {
            row.insert(0, ms.metadata.namespace.clone().unwrap_or_default());
        }
        rows.push(row);
    }
    table(&rows)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ModelServeSpec, ModelServeStatus, SmokeStatus};
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
}

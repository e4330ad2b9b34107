//! Tells the mirror the live set: every sha256 in the resolved set of every ModelServe this
//! operator watches, so that the mirror deletes only what nothing references and never guesses.
//! Only the leader sends it, and only once its watch cache has listed: an empty cache must not
//! read as "nothing is referenced".

use std::collections::BTreeSet;
use std::time::Duration;

use kube::runtime::reflector::Store;
use tracing::{debug, warn};

use crate::api::ModelServe;

/// How long one PUT may take.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Every sha256 the ModelServes' resolved sets hold.
pub fn live_set(models: &[std::sync::Arc<ModelServe>]) -> BTreeSet<String> {
    models
        .iter()
        .filter_map(|m| m.status.as_ref()?.resolved.as_ref())
        .flat_map(|r| r.files.iter().map(|f| f.sha256.clone()))
        .collect()
}

/// Sends the live set to the mirror at `url` every `interval`, until the task is dropped.
pub async fn publish(
    http: reqwest::Client,
    url: String,
    settings: crate::pipeline::env::Settings,
    models: Store<ModelServe>,
    mut listed: tokio::sync::watch::Receiver<bool>,
    interval: Duration,
) {
    if listed.wait_for(|l| *l).await.is_err() {
        return;
    }
    let endpoint = format!("{}/v1/live", url.trim_end_matches('/'));
    loop {
        let live = live_set(&models.state());
        let body = serde_json::json!({ "sha256": live });
        let mut put = http.put(&endpoint).timeout(TIMEOUT).json(&body);
        match settings.mirror_token() {
            Ok(Some(token)) => put = put.bearer_auth(token),
            Ok(None) => {}
            Err(e) => warn!(error = %e, "the live set goes without a token"),
        }
        match put.send().await {
            Ok(r) if r.status().is_success() => {
                debug!(blobs = live.len(), "told the mirror the live set")
            }
            Ok(r) => {
                let code = r.status();
                let why = crate::http::read_capped(r, 4096)
                    .await
                    .map(|b| String::from_utf8_lossy(&b).into_owned())
                    .unwrap_or_default();
                warn!(status = %code, %endpoint, %why, "the mirror refused the live set")
            }
            Err(e) => warn!(error = %e, %endpoint, "cannot tell the mirror the live set"),
        }
        tokio::time::sleep(interval).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_live_set_is_every_resolved_file_of_every_model_once() {
        let model = |shas: &[&str]| {
            let mut ms = ModelServe::new(
                "m",
                serde_json::from_value(serde_json::json!({"repo": "o/r"})).unwrap(),
            );
            let files: Vec<_> = shas
                .iter()
                .map(|s| serde_json::json!({"path": format!("{s}.gguf"), "size": 1, "sha256": s}))
                .collect();
            ms.status = Some(
                serde_json::from_value(serde_json::json!({
                    "resolved": {"request": "r", "commit": "c", "set": "s", "totalBytes": 1, "servedName": "m", "files": files}
                }))
                .unwrap(),
            );
            std::sync::Arc::new(ms)
        };
        let unresolved = std::sync::Arc::new(ModelServe::new(
            "n",
            serde_json::from_value(serde_json::json!({"repo": "o/r"})).unwrap(),
        ));
        let set = live_set(&[model(&["a", "b"]), model(&["b", "c"]), unresolved]);
        assert_eq!(set.into_iter().collect::<Vec<_>>(), ["a", "b", "c"]);
    }
}

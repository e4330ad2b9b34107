//! The CLI's way into a cluster: a client from the kubeconfig, and one-line explanations of
//! everything that can stand in the way (no kubeconfig, an API server that does not answer,
//! no CRD, no permission).

use std::path::PathBuf;

use kube::api::ListParams;
use kube::{Api, Client};

use crate::api::ModelServe;
use crate::cli::Failure;

/// A client, the namespace the kubeconfig's context names (or `default`), and the server URL.
pub struct Cluster {
    pub client: Client,
    pub default_namespace: String,
    pub url: String,
}

/// Connects with the kubeconfig (KUBECONFIG, else ~/.kube/config) or the in-cluster configuration.
pub async fn connect() -> Result<Cluster, Failure> {
    if let Some(why) = missing_kubeconfig() {
        return Err(Failure::new(why));
    }
    let config = kube::Config::infer()
        .await
        .map_err(|e| Failure::new(format!("the kubeconfig cannot be used: {e}")))?;
    let url = config.cluster_url.to_string();
    let default_namespace = config.default_namespace.clone();
    let client = Client::try_from(config)
        .map_err(|e| Failure::new(format!("the kubeconfig cannot be used: {e}")))?;
    Ok(Cluster {
        client,
        default_namespace,
        url,
    })
}

/// Why no kubeconfig can be read, when that is so and no in-cluster configuration exists either.
fn missing_kubeconfig() -> Option<String> {
    if std::env::var_os("KUBERNETES_SERVICE_HOST").is_some() {
        return None;
    }
    match std::env::var_os("KUBECONFIG").filter(|v| !v.is_empty()) {
        Some(list) => {
            let paths: Vec<PathBuf> = std::env::split_paths(&list).collect();
            if paths.iter().any(|p| p.exists()) {
                return None;
            }
            let names: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
            Some(format!(
                "no kubeconfig: KUBECONFIG names {}, which does not exist; point KUBECONFIG at your cluster's kubeconfig",
                names.join(", ")
            ))
        }
        None => {
            let home = std::env::var_os("HOME").map(PathBuf::from)?;
            let default = home.join(".kube").join("config");
            (!default.exists()).then(|| {
                format!(
                    "no kubeconfig: KUBECONFIG is not set and {} does not exist; point KUBECONFIG at your cluster's kubeconfig",
                    default.display()
                )
            })
        }
    }
}

impl Cluster {
    /// The namespace to use (the flag's, else the kubeconfig context's) and its ModelServes,
    /// after checking that the API server answers and the CRD is installed.
    pub async fn models(
        &self,
        namespace: Option<&str>,
    ) -> Result<(String, Api<ModelServe>), Failure> {
        let namespace = namespace.map_or_else(|| self.default_namespace.clone(), str::to_string);
        self.ensure_crd(Some(&namespace)).await?;
        let api = Api::namespaced(self.client.clone(), &namespace);
        Ok((namespace, api))
    }

    /// Fails with one line when the API server cannot be reached or the CRD is not installed.
    /// Lists in `namespace` only, so a user with rights in one namespace can pass.
    pub async fn ensure_crd(&self, namespace: Option<&str>) -> Result<(), Failure> {
        let api: Api<ModelServe> = match namespace {
            Some(ns) => Api::namespaced(self.client.clone(), ns),
            None => Api::all(self.client.clone()),
        };
        match api.list(&ListParams::default().limit(1)).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => {
                Err(Failure::new(crate::Error::CrdMissing.to_string()))
            }
            // Not allowed to list is not the same as missing: the apply or get says more.
            Err(kube::Error::Api(s)) if s.code == 403 => Ok(()),
            Err(e) => Err(self.explain(e, "list ModelServes")),
        }
    }

    /// One line for a failed API request: what was tried, and what the server or network said.
    pub fn explain(&self, e: kube::Error, doing: &str) -> Failure {
        match e {
            kube::Error::Api(s) => match s.code {
                401 => Failure::new(format!(
                    "the API server at {} refused the kubeconfig's credentials (401 Unauthorized); log in again or fix the kubeconfig",
                    self.url
                )),
                403 => Failure::new(format!("not allowed to {doing}: {}", one_line(&s.message))),
                _ => Failure::new(format!(
                    "cannot {doing}: {} ({})",
                    one_line(&s.message),
                    if s.reason.is_empty() {
                        s.code.to_string()
                    } else {
                        s.reason.clone()
                    }
                )),
            },
            other => Failure::new(format!(
                "cannot reach the Kubernetes API server at {}: {}; check KUBECONFIG and that the cluster is up",
                self.url,
                root_cause(&other)
            )),
        }
    }
}

/// The innermost cause of an error: "Connection refused (os error 111)" rather than "client error".
pub fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    one_line(&cur.to_string())
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_innermost_cause_is_reported() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let outer = kube::Error::Service(Box::new(io));
        assert_eq!(root_cause(&outer), "Connection refused");
    }

    #[test]
    fn messages_are_kept_on_one_line() {
        assert_eq!(one_line("a\n  b\tc"), "a b c");
    }
}

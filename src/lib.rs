//! modelserve: a Kubernetes operator that serves a GGUF model from a Hugging Face repository.

pub mod api;
pub mod cli;
pub mod conditions;
pub mod controller;
pub mod gateway;
pub mod gguf;
pub mod http;
pub mod hub;
pub mod mirror;
pub mod names;
pub mod pipeline;
pub mod pull;
pub mod retry;
pub mod secret;
pub mod telemetry;
pub mod units;

/// The crate's error; `reason()` feeds condition reasons, Event reasons and metric labels.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API request failed: {0}")]
    Kube(#[source] kube::Error),

    #[error(
        "the ModelServe CRD (modelserves.modelserve.dev) is not installed in this cluster; install it with `kubectl apply -f crds/` or `modelserve crd | kubectl apply -f -`"
    )]
    CrdMissing,

    #[error(
        "cannot reach the Kubernetes API server at {url}: {source}; check KUBECONFIG and that the cluster is up"
    )]
    Unreachable {
        url: String,
        #[source]
        source: kube::Error,
    },

    #[error("no usable kubeconfig or in-cluster configuration: {0}")]
    Config(String),

    #[error("{flag}: {message}")]
    BadFlag { flag: &'static str, message: String },

    #[error("cannot serialise {what}: {source}")]
    Serialize {
        what: &'static str,
        #[source]
        source: serde_json::Error,
    },

    #[error("cannot serve {what} on {addr}: {source}")]
    Listen {
        what: &'static str,
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },

    #[error("leader election on the Lease {lease}: {message}")]
    Lease { lease: String, message: String },

    #[error(
        "stopped leading: {0}; this replica exits so that only one operator writes, and runs again as a standby"
    )]
    LostLease(String),
}

impl Error {
    /// A PascalCase reason for conditions, Events and metric labels.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Kube(_) => "KubernetesApiError",
            Error::CrdMissing => "CrdMissing",
            Error::Unreachable { .. } => "ApiServerUnreachable",
            Error::Config(_) => "NoKubeconfig",
            Error::BadFlag { .. } => "InvalidConfiguration",
            Error::Serialize { .. } => "SerializationFailed",
            Error::Listen { .. } => "ListenFailed",
            Error::Lease { .. } => "LeaderElectionFailed",
            Error::LostLease(_) => "LeaseLost",
        }
    }
}

impl From<kube::Error> for Error {
    fn from(e: kube::Error) -> Self {
        Error::Kube(e)
    }
}

//! The registry settings every command that talks to the registry shares (the controller, the
//! mirror, `plan`): `#[command(flatten)]` them.

use std::path::PathBuf;

use super::{DEFAULT_ENDPOINT, Hub, HubError};
use crate::secret::Secret;

/// Where the registry is and which extra roots its TLS certificate may chain to.
#[derive(clap::Args, Clone, Debug)]
pub struct RegistryArgs {
    /// Model registry speaking the Hugging Face Hub API (like HF_ENDPOINT); point it at an
    /// internal mirror if the cluster has no internet. HTTPS_PROXY, HTTP_PROXY and NO_PROXY
    /// are honoured.
    #[arg(long, env = "MODELSERVE_REGISTRY_ENDPOINT", default_value = DEFAULT_ENDPOINT)]
    pub registry_endpoint: String,
    /// PEM file of extra root certificates the registry's TLS certificate may chain to (an
    /// internal CA); the built-in roots stay trusted.
    #[arg(long, env = "MODELSERVE_REGISTRY_CA_BUNDLE")]
    pub registry_ca_bundle: Option<PathBuf>,
}

impl RegistryArgs {
    /// A client for this registry, sending `token` to the endpoint's host only.
    pub fn hub(&self, token: Option<Secret>) -> Result<Hub, HubError> {
        Hub::new(&self.registry_endpoint, token)?.with_ca_bundle(self.registry_ca_bundle.as_deref())
    }

    /// The flag a failure of [`RegistryArgs::hub`] is about, for a usage error.
    pub fn flag_of(e: &HubError) -> &'static str {
        match e {
            HubError::CaBundle { .. } => "--registry-ca-bundle",
            _ => "--registry-endpoint",
        }
    }
}

impl Default for RegistryArgs {
    fn default() -> Self {
        Self {
            registry_endpoint: DEFAULT_ENDPOINT.into(),
            registry_ca_bundle: None,
        }
    }
}

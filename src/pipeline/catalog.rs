//! Stage 4, Catalog: the serving objects, applied server-side and owned by the ModelServe: an
//! engine-key Secret, a Deployment running the llama.cpp server (sized by the Check stage, fed by
//! an init container that copies the files from the mirror), and a Service.
//!
//! What the objects look like is a pure function of the ModelServe and the operator's
//! configuration ([`objects`]); applying them is idempotent, and a hand edit of a field we own
//! (such as the Deployment's replicas) is put back by the next reconcile.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, HTTPGetAction, PodSpec,
    PodTemplateSpec, Probe, ResourceRequirements, Secret, SecretKeySelector, SecretVolumeSource,
    SecurityContext, Service, ServicePort, ServiceSpec, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource, ResourceExt};

use super::Outcome;
use crate::api::{CheckStatus, ModelServe, ModelServeStatus, ResolvedStatus};
use crate::controller::{Context, FIELD_MANAGER};
use crate::units::{gi_quantity, human_bytes};

/// The llama.cpp server's port in the pod and on the Service.
pub const PORT: i32 = 8080;
/// Where the init container puts the files and the server reads them.
pub const MODELS_DIR: &str = "/models";
/// Where the engine key is mounted.
pub const KEY_DIR: &str = "/etc/modelserve/engine-key";
/// The data key of the engine-key Secret.
pub const KEY_FIELD: &str = "key";
/// The label every object and pod of one ModelServe carries.
pub const MODEL_LABEL: &str = "modelserve.dev/model";

/// Names of the objects of one ModelServe.
pub fn secret_name(ms: &ModelServe) -> String {
    format!("{}-engine-key", ms.name_any())
}

/// The pods' labels; the Deployment and the Service select on them.
pub fn pod_labels(ms: &ModelServe) -> BTreeMap<String, String> {
    let name = ms.name_any();
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), "llama-server".into()),
        ("app.kubernetes.io/instance".into(), name.clone()),
        ("app.kubernetes.io/component".into(), "model-server".into()),
        ("app.kubernetes.io/managed-by".into(), "modelserve".into()),
        (MODEL_LABEL.into(), name),
    ])
}

/// The label selector of the pods, as the scale subresource wants it.
pub fn selector(ms: &ModelServe) -> String {
    format!("{MODEL_LABEL}={}", ms.name_any())
}

/// What the Catalog stage needs from the operator's configuration.
#[derive(Clone, Debug)]
pub struct Settings {
    pub engine_image: String,
    pub build: u32,
    pub pull_image: String,
    pub mirror_url: String,
}

/// The Deployment and Service of a resolved and checked ModelServe.
pub fn objects(
    ms: &ModelServe,
    resolved: &ResolvedStatus,
    check: &CheckStatus,
    s: &Settings,
) -> Result<(Deployment, Service), String> {
    let name = ms.name_any();
    let owner = owner(ms)?;
    let labels = pod_labels(ms);
    if resolved.files.is_empty() {
        return Err("the resolved set has no files".into());
    }
    let memory = check
        .memory_bytes
        .filter(|m| *m > 0)
        .ok_or("the Check stage recorded no memory estimate")? as u64;
    let total = resolved.total_bytes.max(0) as u64;
    // The emptyDir holds the files; a little room for the .part files' directory entries.
    let disk = Quantity(format!("{}Mi", (total + (64 << 20)).div_ceil(1 << 20)));
    let engine = ms.spec.engine.clone().unwrap_or_default();
    let image = engine
        .image
        .clone()
        .unwrap_or_else(|| s.engine_image.clone());
    let parallel = check.parallel.unwrap_or(1).max(1);

    let mut pull_args = vec![
        "--mirror".to_string(),
        s.mirror_url.clone(),
        "--repo".into(),
        ms.spec.repo.clone(),
        "--commit".into(),
        resolved.commit.clone(),
        "--dest".into(),
        MODELS_DIR.into(),
    ];
    for f in &resolved.files {
        pull_args.push("--file".into());
        pull_args.push(format!("{}:{}:{}", f.sha256, f.size, f.path));
    }
    let pull = Container {
        name: "pull".into(),
        image: Some(s.pull_image.clone()),
        command: Some(vec!["modelserve".into(), "pull".into()]),
        args: Some(pull_args),
        volume_mounts: Some(vec![mount("models", MODELS_DIR, false)]),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".into(), Quantity("100m".into())),
                ("memory".into(), Quantity("64Mi".into())),
                ("ephemeral-storage".into(), disk.clone()),
            ])),
            limits: Some(BTreeMap::from([(
                "memory".into(),
                Quantity("256Mi".into()),
            )])),
            ..Default::default()
        }),
        security_context: Some(restricted()),
        ..Default::default()
    };

    let (args, env) = server_args(ms, resolved, s.build, parallel);
    let user_request = engine.memory_request().cloned();
    let mut resources = engine.resources.clone().unwrap_or_default();
    // Memory request = limit = the estimate, unless the user set them. A user's request alone
    // becomes the limit too, and a user's limit alone the request (as Kubernetes does), so a
    // request is never above its limit.
    let request = resources
        .requests
        .get_or_insert_with(Default::default)
        .entry("memory".into())
        .or_insert_with(|| {
            user_request.unwrap_or_else(|| Quantity(format!("{}Mi", memory.div_ceil(1 << 20))))
        })
        .clone();
    resources
        .limits
        .get_or_insert_with(Default::default)
        .entry("memory".into())
        .or_insert(request);
    let http = |path: &str, period, failures| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String("http".into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Default::default()
    };
    let server = Container {
        name: "llama-server".into(),
        image: Some(image),
        args: Some(args),
        env: (!env.is_empty()).then_some(env),
        ports: Some(vec![ContainerPort {
            name: Some("http".into()),
            container_port: PORT,
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
        volume_mounts: Some(vec![
            mount("models", MODELS_DIR, true),
            mount("engine-key", KEY_DIR, true),
        ]),
        resources: Some(resources),
        // Loading tens of GiB can take minutes: up to 30 of them before liveness applies.
        startup_probe: Some(http("/health", 5, 360)),
        readiness_probe: Some(http("/health", 5, 3)),
        liveness_probe: Some(http("/health", 10, 6)),
        security_context: Some(SecurityContext {
            allow_privilege_escalation: Some(false),
            ..Default::default()
        }),
        ..Default::default()
    };

    let meta = |n: String| ObjectMeta {
        name: Some(n),
        namespace: ms.namespace(),
        labels: Some(labels.clone()),
        owner_references: Some(vec![owner.clone()]),
        ..Default::default()
    };
    let pod_annotations = BTreeMap::from([
        ("modelserve.dev/commit".to_string(), resolved.commit.clone()),
        ("modelserve.dev/set".to_string(), resolved.set.clone()),
    ]);
    let deployment = Deployment {
        metadata: meta(name.clone()),
        spec: Some(DeploymentSpec {
            replicas: Some(ms.spec.replicas),
            selector: LabelSelector {
                match_labels: Some(BTreeMap::from([(MODEL_LABEL.into(), name.clone())])),
                ..Default::default()
            },
            // A replacement never needs room for a second copy of the model on the way.
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".into()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::Int(0)),
                    max_unavailable: Some(IntOrString::Int(1)),
                }),
            }),
            template: PodTemplateSpec {
                metadata: Some(ObjectMeta {
                    labels: Some(labels.clone()),
                    annotations: Some(pod_annotations),
                    ..Default::default()
                }),
                spec: Some(PodSpec {
                    init_containers: Some(vec![pull]),
                    containers: vec![server],
                    volumes: Some(vec![
                        Volume {
                            name: "models".into(),
                            empty_dir: Some(EmptyDirVolumeSource {
                                size_limit: Some(disk),
                                ..Default::default()
                            }),
                            ..Default::default()
                        },
                        Volume {
                            name: "engine-key".into(),
                            secret: Some(SecretVolumeSource {
                                secret_name: Some(secret_name(ms)),
                                default_mode: Some(0o440),
                                ..Default::default()
                            }),
                            ..Default::default()
                        },
                    ]),
                    node_selector: (!engine.node_selector.is_empty())
                        .then(|| engine.node_selector.clone()),
                    tolerations: (!engine.tolerations.is_empty())
                        .then(|| engine.tolerations.clone()),
                    automount_service_account_token: Some(false),
                    enable_service_links: Some(false),
                    ..Default::default()
                }),
            },
            ..Default::default()
        }),
        ..Default::default()
    };
    let service = Service {
        metadata: meta(name.clone()),
        spec: Some(ServiceSpec {
            selector: Some(BTreeMap::from([(MODEL_LABEL.into(), name)])),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: PORT,
                target_port: Some(IntOrString::String("http".into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    Ok((deployment, service))
}

/// The llama.cpp server's arguments, each flag only when the build knows it (an unknown flag
/// makes the server exit), and the environment they refer to.
pub fn server_args(
    ms: &ModelServe,
    resolved: &ResolvedStatus,
    build: u32,
    parallel: i32,
) -> (Vec<String>, Vec<EnvVar>) {
    let first = resolved.files.first().map_or("", |f| f.path.as_str());
    let mut args = vec!["--model".to_string(), format!("{MODELS_DIR}/{first}")];
    let mut env = Vec::new();
    let mut flag = |since: u32, name: &str, value: Option<String>| {
        if build >= since {
            args.push(name.to_string());
            args.extend(value);
        }
    };
    flag(532, "--ctx-size", Some(ms.spec.context_size.to_string()));
    flag(1283, "--parallel", Some(parallel.to_string()));
    flag(
        2413,
        "--ubatch-size",
        Some(super::check::UBATCH.to_string()),
    );
    flag(583, "--host", Some("0.0.0.0".into()));
    flag(583, "--port", Some(PORT.to_string()));
    let served = std::iter::once(resolved.served_name.clone())
        .chain(ms.spec.aliases.iter().cloned())
        .collect::<Vec<_>>()
        .join(",");
    flag(600, "--alias", Some(served));
    flag(2258, "--metrics", None);
    // The memory estimate leaves out the prompt cache in RAM: switch it off.
    flag(6723, "--cache-ram", Some("0".into()));
    flag(4297, "--no-webui", None);
    // Chat templates are on by default from b7170; before that they need --jinja.
    if (4524..7170).contains(&build) {
        args.push("--jinja".into());
    }
    if build >= 1824 {
        args.push("--api-key-file".into());
        args.push(format!("{KEY_DIR}/{KEY_FIELD}"));
    } else {
        // Older servers take the key only on the command line: expanded by the kubelet from the
        // Secret, so it never appears in the pod spec.
        env.push(EnvVar {
            name: "MODELSERVE_ENGINE_KEY".into(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: secret_name(ms),
                    key: KEY_FIELD.into(),
                    optional: Some(false),
                }),
                ..Default::default()
            }),
            ..Default::default()
        });
        args.push("--api-key".into());
        args.push("$(MODELSERVE_ENGINE_KEY)".into());
    }
    if let Some(e) = &ms.spec.engine {
        args.extend(e.extra_args.iter().cloned());
    }
    (args, env)
}

fn mount(volume: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: volume.into(),
        mount_path: path.into(),
        read_only: Some(read_only),
        ..Default::default()
    }
}

fn restricted() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        run_as_user: Some(65532),
        capabilities: Some(k8s_openapi::api::core::v1::Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn owner(ms: &ModelServe) -> Result<OwnerReference, String> {
    ms.controller_owner_ref(&())
        .ok_or_else(|| "the ModelServe has no uid yet".to_string())
}

/// A new random engine key: 32 bytes from the OS, hex.
fn new_key() -> Result<String, String> {
    let mut b = [0u8; 32];
    getrandom::fill(&mut b).map_err(|e| format!("the OS gave no random bytes: {e}"))?;
    Ok(hex::encode(b))
}

/// Applies the objects and reports them.
pub async fn run(ctx: &Context, ms: &ModelServe, status: &mut ModelServeStatus) -> Outcome {
    let (Some(resolved), Some(check)) = (status.resolved.clone(), status.check.clone()) else {
        return super::not_resolved();
    };
    let Some(mirror_url) = ctx.config.mirror_url.clone() else {
        return Outcome::Failed {
            reason: "MirrorNotConfigured".into(),
            message:
                "the operator has no --mirror-url, so replicas have nowhere to copy the model from"
                    .into(),
            retry: None,
        };
    };
    let plan = super::check::plan(ms, &ctx.config.engine_image, ctx.config.engine_build);
    let settings = Settings {
        engine_image: ctx.config.engine_image.clone(),
        build: plan.build,
        pull_image: ctx.config.pull_image.clone(),
        mirror_url,
    };
    let (deployment, service) = match objects(ms, &resolved, &check, &settings) {
        Ok(o) => o,
        Err(message) => {
            return Outcome::Failed {
                reason: "CatalogInvalid".into(),
                message,
                retry: None,
            };
        }
    };
    match apply(ctx, ms, &deployment, &service).await {
        Ok(applied) => {
            status.selector = Some(selector(ms));
            if let Some(st) = &applied.status {
                status.replicas = st.replicas.unwrap_or(0);
                status.ready_replicas = st.ready_replicas.unwrap_or(0);
            }
            let memory = check
                .memory_bytes
                .map(|m| gi_quantity(m.max(0) as u64))
                .unwrap_or_default();
            let n = ms.spec.replicas;
            Outcome::Done {
                reason: "Cataloged".into(),
                message: format!(
                    "Deployment {name} ({n} replica{s} of {memory} memory, {files} copied from the mirror), Service {name}:{PORT}, key in Secret {key}",
                    name = ms.name_any(),
                    s = if n == 1 { "" } else { "s" },
                    files = human_bytes(resolved.total_bytes.max(0) as u64),
                    key = secret_name(ms),
                ),
            }
        }
        Err(Failure::Taken(message)) => Outcome::Failed {
            reason: "NameTaken".into(),
            message,
            retry: Some(Duration::from_secs(60)),
        },
        Err(Failure::Api(e)) => Outcome::Waiting {
            reason: "ApiError".into(),
            message: format!("applying the serving objects failed, trying again: {e}"),
            after: Duration::from_secs(10),
        },
    }
}

enum Failure {
    /// An object of that name exists and belongs to something else: never taken over.
    Taken(String),
    Api(String),
}

async fn apply(
    ctx: &Context,
    ms: &ModelServe,
    deployment: &Deployment,
    service: &Service,
) -> Result<Deployment, Failure> {
    let ns = ms.namespace().unwrap_or_else(|| "default".into());
    let uid = ms.uid().unwrap_or_default();
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let api_err = |what: &str, e: kube::Error| Failure::Api(format!("{what}: {e}"));

    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let key_name = secret_name(ms);
    let existing = secrets
        .get_opt(&key_name)
        .await
        .map_err(|e| api_err("reading the engine-key Secret", e))?;
    ensure_ours(
        existing.as_ref().map(|s| &s.metadata),
        "Secret",
        &key_name,
        &uid,
    )?;
    // The key is made once; re-applying it would change it under running replicas.
    let has_key = existing
        .and_then(|s| s.data)
        .is_some_and(|d| d.contains_key(KEY_FIELD));
    if !has_key {
        let key = new_key().map_err(Failure::Api)?;
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(key_name.clone()),
                namespace: Some(ns.clone()),
                labels: Some(pod_labels(ms)),
                owner_references: Some(vec![owner(ms).map_err(Failure::Api)?]),
                ..Default::default()
            },
            data: Some(BTreeMap::from([(
                KEY_FIELD.to_string(),
                ByteString(key.into_bytes()),
            )])),
            type_: Some("Opaque".into()),
            ..Default::default()
        };
        secrets
            .patch(&key_name, &pp, &Patch::Apply(&secret))
            .await
            .map_err(|e| api_err("creating the engine-key Secret", e))?;
    }

    let name = ms.name_any();
    let deployments: Api<Deployment> = Api::namespaced(ctx.client.clone(), &ns);
    let current = deployments
        .get_opt(&name)
        .await
        .map_err(|e| api_err("reading the Deployment", e))?;
    ensure_ours(
        current.as_ref().map(|d| &d.metadata),
        "Deployment",
        &name,
        &uid,
    )?;
    let applied = deployments
        .patch(&name, &pp, &Patch::Apply(deployment))
        .await
        .map_err(|e| api_err("applying the Deployment", e))?;

    let services: Api<Service> = Api::namespaced(ctx.client.clone(), &ns);
    let current = services
        .get_opt(&name)
        .await
        .map_err(|e| api_err("reading the Service", e))?;
    ensure_ours(
        current.as_ref().map(|s| &s.metadata),
        "Service",
        &name,
        &uid,
    )?;
    services
        .patch(&name, &pp, &Patch::Apply(service))
        .await
        .map_err(|e| api_err("applying the Service", e))?;
    Ok(applied)
}

fn ensure_ours(
    meta: Option<&ObjectMeta>,
    kind: &str,
    name: &str,
    uid: &str,
) -> Result<(), Failure> {
    let Some(meta) = meta else { return Ok(()) };
    let ours = meta.owner_references.iter().flatten().any(|o| o.uid == uid);
    if ours {
        Ok(())
    } else {
        Err(Failure::Taken(format!(
            "a {kind} named {name} already exists and does not belong to this ModelServe; delete or rename it, or give the ModelServe another name"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{ModelServeSpec, ResolvedFile};

    fn model(spec: serde_json::Value) -> ModelServe {
        let spec: ModelServeSpec = serde_json::from_value(spec).unwrap();
        let mut ms = ModelServe::new("qwen", spec);
        ms.metadata.namespace = Some("models".into());
        ms.metadata.uid = Some("0000-uid".into());
        ms
    }

    fn resolved(files: &[(&str, i64)]) -> ResolvedStatus {
        ResolvedStatus {
            request: "r".into(),
            commit: "c".repeat(40),
            set: "qwen-q4_k_m".into(),
            quant: Some("Q4_K_M".into()),
            files: files
                .iter()
                .enumerate()
                .map(|(i, (p, s))| ResolvedFile {
                    path: p.to_string(),
                    size: *s,
                    sha256: format!("{i}").repeat(64),
                })
                .collect(),
            total_bytes: files.iter().map(|f| f.1).sum(),
            served_name: "qwen".into(),
        }
    }

    fn checked(memory: i64, parallel: i32) -> CheckStatus {
        CheckStatus {
            memory_bytes: Some(memory),
            parallel: Some(parallel),
            ..Default::default()
        }
    }

    fn settings(build: u32) -> Settings {
        Settings {
            engine_image: format!("ghcr.io/ggml-org/llama.cpp:server-b{build}"),
            build,
            pull_image: "modelserve:test".into(),
            mirror_url: "http://mirror:8090".into(),
        }
    }

    fn pod(d: &Deployment) -> &PodSpec {
        d.spec.as_ref().unwrap().template.spec.as_ref().unwrap()
    }

    fn args_of(d: &Deployment) -> Vec<String> {
        pod(d).containers[0].args.clone().unwrap()
    }

    fn value_after(args: &[String], flag: &str) -> Option<String> {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1).cloned())
    }

    #[test]
    fn a_sharded_model_loads_from_its_first_shard_and_every_shard_is_pulled() {
        let ms = model(
            serde_json::json!({"repo": "o/Qwen-GGUF", "contextSize": 8192, "contextLength": 4096}),
        );
        let r = resolved(&[
            ("Q4_K_M/qwen-00001-of-00002.gguf", 3 << 30),
            ("Q4_K_M/qwen-00002-of-00002.gguf", 1 << 30),
        ]);
        let (d, _) = objects(&ms, &r, &checked(5 << 30, 2), &settings(10587)).unwrap();
        let args = args_of(&d);
        assert_eq!(
            value_after(&args, "--model").as_deref(),
            Some("/models/Q4_K_M/qwen-00001-of-00002.gguf")
        );
        assert_eq!(value_after(&args, "--ctx-size").as_deref(), Some("8192"));
        assert_eq!(value_after(&args, "--parallel").as_deref(), Some("2"));
        assert_eq!(value_after(&args, "--cache-ram").as_deref(), Some("0"));
        assert_eq!(
            value_after(&args, "--api-key-file").as_deref(),
            Some("/etc/modelserve/engine-key/key")
        );
        let init = &pod(&d).init_containers.as_ref().unwrap()[0];
        let pull = init.args.clone().unwrap();
        let files: Vec<_> = pull
            .iter()
            .enumerate()
            .filter(|(_, a)| *a == "--file")
            .map(|(i, _)| pull[i + 1].clone())
            .collect();
        assert_eq!(files.len(), 2);
        assert!(files[1].ends_with(":1073741824:Q4_K_M/qwen-00002-of-00002.gguf"));
        assert_eq!(
            value_after(&pull, "--commit").as_deref(),
            Some("c".repeat(40).as_str())
        );
        // The emptyDir holds both shards.
        let size = pod(&d).volumes.as_ref().unwrap()[0]
            .empty_dir
            .as_ref()
            .unwrap()
            .size_limit
            .clone()
            .unwrap();
        assert_eq!(size.0, format!("{}Mi", 4096 + 64));
    }

    #[test]
    fn memory_request_and_limit_are_the_checked_estimate() {
        let ms = model(serde_json::json!({"repo": "o/Qwen-GGUF"}));
        let (d, _) = objects(
            &ms,
            &resolved(&[("q.gguf", 100)]),
            &checked(7 * (1 << 30) + 1, 1),
            &settings(10587),
        )
        .unwrap();
        let res = pod(&d).containers[0].resources.clone().unwrap();
        let want = Quantity(format!("{}Mi", 7 * 1024 + 1));
        assert_eq!(res.requests.unwrap()["memory"], want);
        assert_eq!(res.limits.unwrap()["memory"], want);
    }

    #[test]
    fn user_resources_win_over_the_estimate() {
        let ms = model(
            serde_json::json!({"repo": "o/Qwen-GGUF", "engine": {"resources": {
            "requests": {"cpu": "2", "memory": "9Gi"}}}}),
        );
        let (d, _) = objects(
            &ms,
            &resolved(&[("q.gguf", 100)]),
            &checked(1 << 30, 1),
            &settings(10587),
        )
        .unwrap();
        let res = pod(&d).containers[0].resources.clone().unwrap();
        let req = res.requests.unwrap();
        assert_eq!(req["memory"], Quantity("9Gi".into()));
        assert_eq!(req["cpu"], Quantity("2".into()));
        assert_eq!(res.limits.unwrap()["memory"], Quantity("9Gi".into()));
    }

    #[test]
    fn a_users_memory_limit_alone_is_the_request_too() {
        let ms = model(
            serde_json::json!({"repo": "o/Qwen-GGUF", "engine": {"resources": {
            "limits": {"memory": "3Gi"}}}}),
        );
        let (d, _) = objects(
            &ms,
            &resolved(&[("q.gguf", 100)]),
            &checked(5 << 30, 1),
            &settings(10587),
        )
        .unwrap();
        let res = pod(&d).containers[0].resources.clone().unwrap();
        // Not the 5 GiB estimate: a request above its limit is refused by the API server.
        assert_eq!(res.requests.unwrap()["memory"], Quantity("3Gi".into()));
        assert_eq!(res.limits.unwrap()["memory"], Quantity("3Gi".into()));
    }

    #[test]
    fn flags_an_old_build_does_not_know_are_left_out() {
        let ms = model(serde_json::json!({"repo": "o/Qwen-GGUF"}));
        let r = resolved(&[("q.gguf", 100)]);
        let c = checked(1 << 30, 1);
        let old = args_of(&objects(&ms, &r, &c, &settings(1500)).unwrap().0);
        for absent in [
            "--cache-ram",
            "--metrics",
            "--no-webui",
            "--ubatch-size",
            "--api-key-file",
            "--jinja",
        ] {
            assert!(!old.contains(&absent.to_string()), "{absent} in {old:?}");
        }
        assert_eq!(
            value_after(&old, "--api-key").as_deref(),
            Some("$(MODELSERVE_ENGINE_KEY)"),
            "before --api-key-file the key comes from the Secret through the environment"
        );
        let mid = args_of(&objects(&ms, &r, &c, &settings(5000)).unwrap().0);
        assert!(mid.contains(&"--jinja".to_string()));
        assert!(!mid.contains(&"--cache-ram".to_string()));
        let new = args_of(&objects(&ms, &r, &c, &settings(10587)).unwrap().0);
        assert!(!new.contains(&"--jinja".to_string()), "on by default");
        assert!(!new.contains(&"--api-key".to_string()));
    }

    #[test]
    fn aliases_and_extra_args_reach_the_server() {
        let ms = model(
            serde_json::json!({"repo": "o/Qwen-GGUF", "aliases": ["gpt-4o"],
            "engine": {"extraArgs": ["--threads", "4"]}}),
        );
        let args = args_of(
            &objects(
                &ms,
                &resolved(&[("q.gguf", 100)]),
                &checked(1 << 30, 1),
                &settings(10587),
            )
            .unwrap()
            .0,
        );
        assert_eq!(
            value_after(&args, "--alias").as_deref(),
            Some("qwen,gpt-4o")
        );
        assert_eq!(&args[args.len() - 2..], ["--threads", "4"]);
    }

    #[test]
    fn objects_are_owned_and_labelled_and_the_service_selects_the_pods() {
        let ms = model(serde_json::json!({"repo": "o/Qwen-GGUF", "replicas": 3}));
        let (d, s) = objects(
            &ms,
            &resolved(&[("q.gguf", 100)]),
            &checked(1 << 30, 1),
            &settings(10587),
        )
        .unwrap();
        let owners = d.metadata.owner_references.clone().unwrap();
        assert_eq!(owners[0].uid, "0000-uid");
        assert_eq!(owners[0].controller, Some(true));
        assert_eq!(d.spec.as_ref().unwrap().replicas, Some(3));
        let pod_labels = d
            .spec
            .as_ref()
            .unwrap()
            .template
            .metadata
            .clone()
            .unwrap()
            .labels
            .unwrap();
        for (k, v) in s.spec.unwrap().selector.unwrap() {
            assert_eq!(pod_labels.get(&k), Some(&v));
        }
        assert_eq!(pod_labels["app.kubernetes.io/managed-by"], "modelserve");
    }

    #[test]
    fn a_model_without_a_memory_estimate_is_not_cataloged() {
        let ms = model(serde_json::json!({"repo": "o/Qwen-GGUF"}));
        let err = objects(
            &ms,
            &resolved(&[("q.gguf", 100)]),
            &CheckStatus::default(),
            &settings(10587),
        )
        .unwrap_err();
        assert!(err.contains("memory"), "{err}");
    }

    #[test]
    fn keys_are_random_and_long() {
        let (a, b) = (new_key().unwrap(), new_key().unwrap());
        assert_ne!(a, b);
        assert_eq!(a.len(), 64);
    }
}

//! What the serving objects of a ModelServe look like: a pure function of the ModelServe, what
//! the earlier stages found, and the operator's settings.

use std::collections::BTreeMap;

use k8s_openapi::api::apps::v1::{
    Deployment, DeploymentSpec, DeploymentStrategy, RollingUpdateDeployment,
};
use k8s_openapi::api::core::v1::{
    Container, ContainerPort, EmptyDirVolumeSource, HTTPGetAction, PodSpec, PodTemplateSpec, Probe,
    ProjectedVolumeSource, ResourceRequirements, SecretVolumeSource, Service,
    ServiceAccountTokenProjection, ServicePort, ServiceSpec, Volume, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::{Resource, ResourceExt};

use super::container::{LOG_ON_ERROR, mount, restricted};
use crate::api::{CheckStatus, ModelServe, ResolvedStatus};
use crate::names::{
    COMMIT_ANNOTATION, KEY_DIGEST_ANNOTATION, KEY_DIR, MIRROR_TOKEN_DIR, MIRROR_TOKEN_FILE,
    MIRROR_TOKEN_VOLUME, MODEL_LABEL, MODELS_DIR, PORT, PORT_NAME, PULL_CONTAINER,
    SERVER_CONTAINER, SET_ANNOTATION, pod_labels, secret_name,
};

/// What the Catalog stage needs from the operator's configuration.
#[derive(Clone, Debug)]
pub struct Settings {
    pub engine_image: String,
    pub build: u32,
    pub pull_image: String,
    pub mirror_url: String,
    /// The audience of the token the init container presents to the mirror.
    pub mirror_audience: String,
}

/// The Deployment and Service of a resolved and checked ModelServe.
pub fn objects(
    ms: &ModelServe,
    resolved: &ResolvedStatus,
    check: &CheckStatus,
    s: &Settings,
    key_digest: &str,
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
        "--token-file".into(),
        format!("{MIRROR_TOKEN_DIR}/{MIRROR_TOKEN_FILE}"),
    ];
    for f in &resolved.files {
        pull_args.push("--file".into());
        pull_args.push(format!("{}:{}:{}", f.sha256, f.size, f.path));
    }
    let pull = Container {
        name: PULL_CONTAINER.into(),
        image: Some(s.pull_image.clone()),
        command: Some(vec!["modelserve".into(), "pull".into()]),
        args: Some(pull_args),
        volume_mounts: Some(vec![
            mount("models", MODELS_DIR, false),
            mount(MIRROR_TOKEN_VOLUME, MIRROR_TOKEN_DIR, true),
        ]),
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
        termination_message_policy: Some(LOG_ON_ERROR.into()),
        ..Default::default()
    };

    let gpu_flags = super::gpu::server_flags(&engine, check, s.build);
    let (args, env) = super::args::server_args(ms, resolved, s.build, parallel, &gpu_flags);
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
    super::gpu::add_limits(&engine, &mut resources);
    let tolerations = crate::pipeline::check::gpu::tolerations(&engine);
    let http = |path: &str, period, failures| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.into()),
            port: IntOrString::String(PORT_NAME.into()),
            ..Default::default()
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        ..Default::default()
    };
    let server = Container {
        name: SERVER_CONTAINER.into(),
        image: Some(image),
        args: Some(args),
        env: (!env.is_empty()).then_some(env),
        ports: Some(vec![ContainerPort {
            name: Some(PORT_NAME.into()),
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
        // As restricted as the init container: llama-server writes nothing outside its
        // volumes, and needs no capability on its port above 1024. An image that runs as
        // root by default runs as 65532 here, which a world-executable binary allows.
        security_context: Some(restricted()),
        termination_message_policy: Some(LOG_ON_ERROR.into()),
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
        (COMMIT_ANNOTATION.to_string(), resolved.commit.clone()),
        (SET_ANNOTATION.to_string(), resolved.set.clone()),
        (KEY_DIGEST_ANNOTATION.to_string(), key_digest.to_string()),
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
                        mirror_token(&s.mirror_audience),
                    ]),
                    node_selector: (!engine.node_selector.is_empty())
                        .then(|| engine.node_selector.clone()),
                    tolerations: (!tolerations.is_empty()).then_some(tolerations),
                    affinity: super::gpu::affinity(&engine, check),
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
                name: Some(PORT_NAME.into()),
                port: PORT,
                target_port: Some(IntOrString::String(PORT_NAME.into())),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    Ok((stamped(deployment)?, stamped(service)?))
}

/// The annotation that records a digest of everything the operator applied to an object, so
/// a later reconcile can tell "as applied" from "changed since" without asking the API server.
pub const APPLIED_ANNOTATION: &str = "modelserve.dev/applied";

/// `object` with [`APPLIED_ANNOTATION`] set to the digest of the rest of it.
pub fn stamped<K: kube::Resource + serde::Serialize>(mut object: K) -> Result<K, String> {
    let json = serde_json::to_vec(&object).map_err(|e| format!("cannot serialise: {e}"))?;
    object
        .meta_mut()
        .annotations
        .get_or_insert_with(Default::default)
        .insert(APPLIED_ANNOTATION.into(), crate::units::digest(&json));
    Ok(object)
}

/// The init container's token for the mirror: the pod's ServiceAccount, for the mirror's
/// audience only, rotated by the kubelet. The pod mounts no other token. No mode is set: as
/// both containers run as one user, the kubelet makes the file that user's, mode 0600.
fn mirror_token(audience: &str) -> Volume {
    Volume {
        name: MIRROR_TOKEN_VOLUME.into(),
        projected: Some(ProjectedVolumeSource {
            sources: Some(vec![VolumeProjection {
                service_account_token: Some(ServiceAccountTokenProjection {
                    audience: Some(audience.into()),
                    expiration_seconds: Some(3600),
                    path: MIRROR_TOKEN_FILE.into(),
                }),
                ..Default::default()
            }]),
            default_mode: None,
        }),
        ..Default::default()
    }
}

pub fn owner(ms: &ModelServe) -> Result<OwnerReference, String> {
    ms.controller_owner_ref(&())
        .ok_or_else(|| "the ModelServe has no uid yet".to_string())
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::*;

    #[test]
    fn the_init_container_alone_presents_a_token_for_the_mirror_audience() {
        let ms = model(serde_json::json!({"repo": "o/Tiny-GGUF"}));
        let r = resolved(&[("tiny-Q4_K_M.gguf", 1 << 20)]);
        let (d, _) = objects(&ms, &r, &checked(64 << 20, 1), &settings(10587), "kd").unwrap();
        let pod = pod(&d);
        assert_eq!(pod.automount_service_account_token, Some(false));
        let token = pod
            .volumes
            .iter()
            .flatten()
            .find(|v| v.name == MIRROR_TOKEN_VOLUME)
            .and_then(|v| v.projected.as_ref())
            .expect("a projected token volume");
        let sources = token.sources.as_deref().unwrap_or_default();
        assert_eq!(sources.len(), 1, "the token and nothing else");
        let sa = sources[0].service_account_token.as_ref().unwrap();
        assert_eq!(sa.audience.as_deref(), Some("modelserve-mirror"));
        let init = &pod.init_containers.as_ref().unwrap()[0];
        assert_eq!(
            value_after(init.args.as_ref().unwrap(), "--token-file").as_deref(),
            Some("/var/run/secrets/modelserve/mirror/token")
        );
        let mounts = |c: &Container| {
            c.volume_mounts
                .iter()
                .flatten()
                .any(|m| m.name == MIRROR_TOKEN_VOLUME)
        };
        assert!(mounts(init));
        assert!(
            !mounts(&pod.containers[0]),
            "the server never sees the token"
        );
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
        let (d, _) = objects(&ms, &r, &checked(5 << 30, 2), &settings(10587), "kd").unwrap();
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
            "kd",
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
            "kd",
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
            "kd",
        )
        .unwrap();
        let res = pod(&d).containers[0].resources.clone().unwrap();
        // Not the 5 GiB estimate: a request above its limit is refused by the API server.
        assert_eq!(res.requests.unwrap()["memory"], Quantity("3Gi".into()));
        assert_eq!(res.limits.unwrap()["memory"], Quantity("3Gi".into()));
    }

    #[test]
    fn a_new_engine_key_or_an_edit_of_the_names_rolls_the_replicas() {
        let ms = model(serde_json::json!({"repo": "o/Qwen-GGUF"}));
        let r = resolved(&[("q.gguf", 100)]);
        let c = checked(1 << 30, 1);
        let template = |ms: &ModelServe, key: &str| {
            let d = objects(ms, &r, &c, &settings(10587), key).unwrap().0;
            serde_json::to_value(d.spec.unwrap().template).unwrap()
        };
        let before = template(&ms, "k1");
        assert_ne!(
            before,
            template(&ms, "k2"),
            "the key digest is in the template"
        );
        let mut renamed = ms.clone();
        renamed.spec.served_name = Some("chat".into());
        renamed.spec.aliases = vec!["gpt-4o".into()];
        let after = template(&renamed, "k1");
        assert_ne!(before, after);
        let args = args_of(&objects(&renamed, &r, &c, &settings(10587), "k1").unwrap().0);
        assert_eq!(
            value_after(&args, "--alias").as_deref(),
            Some("chat,gpt-4o")
        );
    }

    #[test]
    fn what_is_applied_is_stamped_with_its_digest() {
        let ms = model(serde_json::json!({"repo": "o/Qwen-GGUF"}));
        let r = resolved(&[("q.gguf", 100)]);
        let c = checked(1 << 30, 1);
        let (d1, s1) = objects(&ms, &r, &c, &settings(10587), "k").unwrap();
        let (d2, _) = objects(&ms, &r, &c, &settings(10587), "k").unwrap();
        let stamp = |m: &ObjectMeta| m.annotations.clone().unwrap()[APPLIED_ANNOTATION].clone();
        assert_eq!(stamp(&d1.metadata), stamp(&d2.metadata), "stable");
        assert_eq!(stamp(&s1.metadata).len(), 16);
        let mut bigger = ms.clone();
        bigger.spec.replicas = 2;
        let (d3, _) = objects(&bigger, &r, &c, &settings(10587), "k").unwrap();
        assert_ne!(stamp(&d1.metadata), stamp(&d3.metadata));
    }

    #[test]
    fn objects_are_owned_and_labelled_and_the_service_selects_the_pods() {
        let ms = model(serde_json::json!({"repo": "o/Qwen-GGUF", "replicas": 3}));
        let (d, s) = objects(
            &ms,
            &resolved(&[("q.gguf", 100)]),
            &checked(1 << 30, 1),
            &settings(10587),
            "kd",
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
            "kd",
        )
        .unwrap_err();
        assert!(err.contains("memory"), "{err}");
    }
}

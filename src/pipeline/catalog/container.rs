//! What every container of a replica gets besides its own command and resources: the settings
//! of the `restricted` Pod Security level, its volume mounts, and its log as the termination
//! message when it fails.

use k8s_openapi::api::core::v1::{SecurityContext, VolumeMount};

/// The containers' `terminationMessagePolicy`. Neither llama-server nor `modelserve pull` writes
/// /dev/termination-log, so with the default (`File`) a failing container's termination message
/// is empty and the Place stage could say only its exit code. With this, the kubelet puts the end
/// of its log (at most 80 lines and 2 KiB) there, which is what tells a driver older than the
/// image's CUDA, a GPU out of memory, or the engine's own error.
pub(super) const LOG_ON_ERROR: &str = "FallbackToLogsOnError";

/// The volume `volume` mounted at `path`.
pub(super) fn mount(volume: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: volume.into(),
        mount_path: path.into(),
        // The API server drops a false readOnly (omitempty); leaving it out keeps what is
        // applied equal to what is read back, so no drift is seen where there is none.
        read_only: read_only.then_some(true),
        ..Default::default()
    }
}

/// What the `restricted` Pod Security level asks of a container, and a read-only root: both
/// containers write only to their volumes.
pub(super) fn restricted() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        seccomp_profile: Some(k8s_openapi::api::core::v1::SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..Default::default()
        }),
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

#[cfg(test)]
mod tests {
    use super::super::objects::objects;
    use super::super::testing::*;
    use k8s_openapi::api::core::v1::{Container, PodSpec};

    /// The pod of a small model's replica, and its containers (init first).
    fn replica() -> (PodSpec, Vec<Container>) {
        let ms = model(serde_json::json!({"repo": "o/Tiny-GGUF"}));
        let r = resolved(&[("tiny-Q4_K_M.gguf", 1 << 20)]);
        let (d, _) = objects(&ms, &r, &checked(64 << 20, 1), &settings(10587), "kd").unwrap();
        let pod = d.spec.unwrap().template.spec.unwrap();
        let all = (pod.init_containers.iter().flatten())
            .chain(&pod.containers)
            .cloned()
            .collect();
        (pod, all)
    }

    #[test]
    fn every_container_of_a_replica_meets_the_restricted_pod_security_level() {
        let (pod, all) = replica();
        assert_eq!(all.len(), 2);
        for c in all {
            let sc = c.security_context.as_ref().expect("securityContext");
            assert_eq!(sc.allow_privilege_escalation, Some(false), "{}", c.name);
            assert_eq!(sc.run_as_non_root, Some(true), "{}", c.name);
            assert_ne!(sc.run_as_user, Some(0), "{}", c.name);
            assert_eq!(sc.read_only_root_filesystem, Some(true), "{}", c.name);
            assert_eq!(
                sc.seccomp_profile.as_ref().map(|p| p.type_.as_str()),
                Some("RuntimeDefault"),
                "{}",
                c.name
            );
            let caps = sc.capabilities.as_ref().expect("capabilities");
            assert_eq!(caps.drop.as_deref(), Some(&["ALL".to_string()][..]));
            assert_eq!(caps.add, None, "{}", c.name);
        }
        // Nothing of the host, no volume types restricted forbids.
        assert_eq!(pod.host_network, None);
        assert!(
            pod.volumes
                .iter()
                .flatten()
                .all(|v| v.empty_dir.is_some() || v.secret.is_some() || v.projected.is_some())
        );
    }

    #[test]
    fn a_failing_container_reports_the_end_of_its_log() {
        let (_, all) = replica();
        assert_eq!(all.len(), 2);
        for c in all {
            assert_eq!(
                c.termination_message_policy.as_deref(),
                Some("FallbackToLogsOnError"),
                "{}",
                c.name
            );
        }
    }
}

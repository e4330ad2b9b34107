//! The llama.cpp server's command line: each flag only when the image's build knows it.

use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, SecretKeySelector};

use crate::api::{ModelServe, ResolvedStatus};
use crate::gguf::memory::{CHECKPOINTS_FROM, CTX_CHECKPOINTS, CTX_CHECKPOINTS_FLAG_FROM};
use crate::names::{KEY_DIR, KEY_FIELD, MODELS_DIR, PORT, model_names, secret_name};

/// The llama.cpp server's arguments, each flag only when the build knows it (an unknown flag
/// makes the server exit), and the environment they refer to.
pub fn server_args(
    ms: &ModelServe,
    resolved: &ResolvedStatus,
    build: u32,
    parallel: i32,
    gpu: &[String],
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
        Some(crate::pipeline::check::UBATCH.to_string()),
    );
    flag(583, "--host", Some("0.0.0.0".into()));
    flag(583, "--port", Some(PORT.to_string()));
    // The names come from the spec as it is now: an edit of servedName or aliases rolls out.
    let served = model_names(ms).join(",");
    flag(600, "--alias", Some(served));
    flag(2258, "--metrics", None);
    // The memory estimate leaves out the prompt cache in RAM: switch it off.
    flag(6723, "--cache-ram", Some("0".into()));
    // Checkpoints grow with use up to the count per slot: the estimate counts this many.
    let checkpoints = Some(CTX_CHECKPOINTS.to_string());
    if (CHECKPOINTS_FROM..CTX_CHECKPOINTS_FLAG_FROM).contains(&build) {
        flag(CHECKPOINTS_FROM, "--swa-checkpoints", checkpoints);
    } else {
        flag(CTX_CHECKPOINTS_FLAG_FROM, "--ctx-checkpoints", checkpoints);
    }
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
    // The offload the Check stage decided, then the user's own flags, which come last.
    args.extend(gpu.iter().cloned());
    if let Some(e) = &ms.spec.engine {
        args.extend(e.extra_args.iter().cloned());
    }
    (args, env)
}

#[cfg(test)]
mod tests {
    use super::super::objects;
    use super::super::testing::*;

    #[test]
    fn flags_an_old_build_does_not_know_are_left_out() {
        let ms = model(serde_json::json!({"repo": "o/Qwen-GGUF"}));
        let r = resolved(&[("q.gguf", 100)]);
        let c = checked(1 << 30, 1);
        let old = args_of(&objects(&ms, &r, &c, &settings(1500), "kd").unwrap().0);
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
        let mid = args_of(&objects(&ms, &r, &c, &settings(5000), "kd").unwrap().0);
        assert!(mid.contains(&"--jinja".to_string()));
        assert!(!mid.contains(&"--cache-ram".to_string()));
        let new = args_of(&objects(&ms, &r, &c, &settings(10587), "kd").unwrap().0);
        assert!(!new.contains(&"--jinja".to_string()), "on by default");
        assert!(!new.contains(&"--api-key".to_string()));
    }

    #[test]
    fn context_checkpoints_are_capped_under_the_name_the_build_knows() {
        let ms = model(serde_json::json!({"repo": "o/Qwen-GGUF"}));
        let r = resolved(&[("q.gguf", 100)]);
        let c = checked(1 << 30, 1);
        let at = |build| args_of(&objects(&ms, &r, &c, &settings(build), "kd").unwrap().0);
        let count = crate::gguf::memory::CTX_CHECKPOINTS.to_string();
        assert_eq!(
            value_after(&at(10587), "--ctx-checkpoints"),
            Some(count.clone())
        );
        assert_eq!(value_after(&at(6500), "--swa-checkpoints"), Some(count));
        assert!(!at(6500).contains(&"--ctx-checkpoints".to_string()));
        let old = at(6000);
        assert!(
            !old.iter().any(|a| a.ends_with("-checkpoints")),
            "no checkpoints before b6160: {old:?}"
        );
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
                "kd",
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
}

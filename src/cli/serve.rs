//! `modelserve serve OWNER/REPO`: create or update a ModelServe from flags (server-side apply, so
//! running it again changes nothing), then follow it stage by stage until it answers or fails.

use std::time::Duration;

use kube::api::{Patch, PatchParams};

use crate::cli::watch::{self, Display};
use crate::cli::{Failure, Output, cluster};

/// The field manager of everything the CLI applies.
pub const FIELD_MANAGER: &str = "modelserve-cli";

/// Flags of `modelserve serve`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    #[command(flatten)]
    pub target: super::Target,
    /// Name of the ModelServe (default: from the repository, e.g. qwen2-5-7b-instruct).
    #[arg(long)]
    pub name: Option<String>,
    /// Serving replicas (default 1).
    #[arg(long, value_parser = clap::value_parser!(i32).range(0..=1000), conflicts_with = "on_demand")]
    pub replicas: Option<i32>,
    /// On demand: prepare everything but start no replica (replicas 0); the gateway loads the model on its first request and unloads it after --idle-after without one.
    #[arg(long)]
    pub on_demand: bool,
    /// With --on-demand: how long the model stays loaded after its last request (1s to 7d, default 15m).
    #[arg(long, requires = "on_demand", value_parser = parse_idle_after)]
    pub idle_after: Option<String>,
    /// Namespace (default: the kubeconfig context's, else default).
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// Total context of the server in tokens (default 16384).
    #[arg(long, value_parser = clap::value_parser!(i32).range(256..=4_194_304))]
    pub context_size: Option<i32>,
    /// Context of one request in tokens (default 4096); slots = context-size / context-length.
    #[arg(long, value_parser = clap::value_parser!(i32).range(256..=4_194_304))]
    pub context_length: Option<i32>,
    /// Secret with the registry token for gated or private repositories, as NAME or NAME:KEY (key default "token").
    #[arg(long, value_name = "NAME[:KEY]", value_parser = parse_token_secret)]
    pub token_secret: Option<(String, String)>,
    /// Do not send the smoke-test chat completion to the first ready replica.
    #[arg(long)]
    pub no_smoke_test: bool,
    /// Apply and return at once; the controller goes on without this terminal.
    #[arg(long, short = 'd')]
    pub detach: bool,
    /// Output format: text while watching, or the final status as JSON.
    #[arg(long, short = 'o', value_enum, default_value = "text")]
    pub output: Output,
    /// Stop watching after this long (90s, 30m, 2h; default: until ready or failed).
    #[arg(long, value_parser = crate::units::parse_duration)]
    pub timeout: Option<Duration>,
}

/// Applies the ModelServe and, unless detached, follows it to a verdict.
pub async fn run(args: Args) -> Result<(), Failure> {
    crate::hub::check_repo(&args.target.repo).map_err(|e| Failure::usage(e.to_string()))?;
    if let Some(rev) = &args.target.revision {
        crate::hub::check_revision(rev).map_err(|e| Failure::usage(e.to_string()))?;
    }
    if let (Some(size), Some(len)) = (args.context_size, args.context_length)
        && len > size
    {
        return Err(Failure::usage(format!(
            "--context-length {len} is larger than --context-size {size}: one request cannot use more than the server's whole context"
        )));
    }
    let name = match &args.name {
        Some(n) => check_name(n).map(|()| n.clone())?,
        None => object_name(&args.target.repo),
    };
    let cluster = cluster::connect().await?;
    let (namespace, api) = cluster.models(args.namespace.as_deref()).await?;

    let before = api
        .get_opt(&name)
        .await
        .map_err(|e| cluster.explain(e, &format!("read ModelServe {namespace}/{name}")))?;
    if let Some(old) = &before
        && old.spec.repo != args.target.repo
    {
        return Err(Failure::new(format!(
            "ModelServe {namespace}/{name} already serves {}; choose another --name to serve {}",
            old.spec.repo, args.target.repo
        )));
    }
    let applied = api
        .patch(
            &name,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(manifest(&args, &name)),
        )
        .await
        .map_err(|e| cluster.explain(e, &format!("apply ModelServe {namespace}/{name}")))?;
    let generation = applied.metadata.generation.unwrap_or(1);
    let verb = match &before {
        None => "created",
        Some(old) if old.metadata.generation == applied.metadata.generation => "unchanged",
        Some(_) => "configured",
    };
    let hint = watch::resume_hint(&name, &namespace);

    if args.detach {
        match args.output {
            Output::Json => {
                let mut shown = applied.clone();
                shown.metadata.managed_fields = None;
                let text = serde_json::to_string_pretty(&shown)
                    .map_err(|e| Failure::new(format!("cannot print the ModelServe: {e}")))?;
                println!("{text}");
            }
            Output::Text => println!(
                "ModelServe {namespace}/{name} {verb} ({}); follow it with `{hint}`",
                args.target.repo
            ),
        }
        return Ok(());
    }

    let mut display = Display::for_output(args.output);
    display.line(&format!(
        "ModelServe {namespace}/{name} {verb} ({}); Ctrl-C stops watching, not the model",
        args.target.repo
    ));
    let outcome = watch::follow(&api, &name, generation, &mut display, args.timeout).await;
    watch::conclude(
        outcome,
        &name,
        &namespace,
        &mut display,
        args.output,
        args.timeout,
    )
}

/// The object to apply: only what the flags say, so the API server's defaults fill the rest and
/// a field left out on a later run returns to its default.
pub fn manifest(args: &Args, name: &str) -> serde_json::Value {
    let mut spec = serde_json::Map::new();
    spec.insert("repo".into(), args.target.repo.clone().into());
    let mut set = |key: &str, value: Option<serde_json::Value>| {
        if let Some(v) = value {
            spec.insert(key.into(), v);
        }
    };
    set("quant", args.target.quant.clone().map(Into::into));
    set("file", args.target.file.clone().map(Into::into));
    set("revision", args.target.revision.clone().map(Into::into));
    let replicas = if args.on_demand {
        Some(0)
    } else {
        args.replicas
    };
    set("replicas", replicas.map(Into::into));
    set(
        "onDemand",
        args.on_demand.then(|| match &args.idle_after {
            Some(idle) => serde_json::json!({"idleAfter": idle}),
            None => serde_json::json!({}),
        }),
    );
    set("contextSize", args.context_size.map(Into::into));
    set("contextLength", args.context_length.map(Into::into));
    set(
        "tokenSecretRef",
        args.token_secret
            .as_ref()
            .map(|(name, key)| serde_json::json!({"name": name, "key": key})),
    );
    set(
        "smokeTest",
        args.no_smoke_test
            .then(|| serde_json::json!({"enabled": false})),
    );
    serde_json::json!({
        "apiVersion": "modelserve.dev/v1alpha1",
        "kind": "ModelServe",
        "metadata": {"name": name},
        "spec": spec,
    })
}

/// The ModelServe name suggested for a repository: the served name made a DNS label, since it
/// also names the model's Deployment and Service (`bartowski/Qwen2.5-7B-Instruct-GGUF` becomes
/// `qwen2-5-7b-instruct`).
pub fn object_name(repo: &str) -> String {
    let served = crate::names::served_name(repo);
    let mut out = String::with_capacity(served.len() + 2);
    for c in served.chars() {
        let c = if c.is_ascii_lowercase() || c.is_ascii_digit() {
            c
        } else {
            '-'
        };
        if c == '-' && (out.is_empty() || out.ends_with('-')) {
            continue;
        }
        out.push(c);
    }
    // A Service name must start with a letter.
    if !out.starts_with(|c: char| c.is_ascii_lowercase()) {
        out.insert_str(0, "m-");
    }
    out.truncate(63);
    out.trim_end_matches('-').to_string()
}

/// An idleAfter the API server accepts: a duration from 1s to 7d.
fn parse_idle_after(s: &str) -> Result<String, String> {
    let spec = crate::api::OnDemandSpec {
        idle_after: s.to_string(),
    };
    spec.idle_after()
        .map_err(|e| e.replace("spec.onDemand.idleAfter: ", ""))?;
    Ok(s.to_string())
}

/// A name the Deployment and Service can share: a DNS-1035 label.
pub fn check_name(name: &str) -> Result<(), Failure> {
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase())
        && name.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if ok {
        Ok(())
    } else {
        Err(Failure::usage(format!(
            "--name {name:?} is not a valid name: use lowercase letters, digits and '-', start with a letter, end with a letter or digit, at most 63 characters (it also names the model's Service)"
        )))
    }
}

/// `NAME` or `NAME:KEY` of the token Secret.
fn parse_token_secret(s: &str) -> Result<(String, String), String> {
    let (name, key) = s.split_once(':').unwrap_or((s, "token"));
    let name_ok = !name.is_empty()
        && name.len() <= 253
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name.ends_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.');
    let key_ok = !key.is_empty()
        && key.len() <= 253
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    match (name_ok, key_ok) {
        (true, true) => Ok((name.into(), key.into())),
        (false, _) => Err(format!(
            "{name:?} is not a Secret name (lowercase letters, digits, '-' and '.'); write NAME or NAME:KEY"
        )),
        (true, false) => Err(format!(
            "{key:?} is not a Secret key (letters, digits, '-', '_' and '.'); write NAME or NAME:KEY"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct T {
        #[command(flatten)]
        args: Args,
    }

    fn args(argv: &[&str]) -> Args {
        T::try_parse_from(std::iter::once("serve").chain(argv.iter().copied()))
            .unwrap()
            .args
    }

    #[test]
    fn the_default_name_is_a_dns_label_from_the_repo() {
        assert_eq!(
            object_name("bartowski/Qwen2.5-7B-Instruct-GGUF"),
            "qwen2-5-7b-instruct"
        );
        assert_eq!(object_name("unsloth/Qwen3-0.6B-GGUF"), "qwen3-0-6b");
        assert_eq!(object_name("TheBloke/7B_Model-GGUF"), "m-7b-model");
        assert_eq!(object_name("a/__GGUF"), "model");
        let long = object_name(&format!("a/{}", "x".repeat(200)));
        assert_eq!(long.len(), 63);
        for repo in ["acme/Tiny-GGUF", "x/Foo..Bar", "x/-a-", "x/9"] {
            let n = object_name(repo);
            assert!(check_name(&n).is_ok(), "{repo} -> {n}");
        }
    }

    #[test]
    fn names_that_cannot_name_a_service_are_refused() {
        for bad in [
            "Tiny",
            "1tiny",
            "tiny-",
            "ti_ny",
            "ti.ny",
            "",
            &"a".repeat(64),
        ] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_name("tiny-2").is_ok());
    }

    #[test]
    fn the_manifest_holds_only_what_the_flags_say() {
        let m = manifest(&args(&["acme/Tiny-GGUF"]), "tiny");
        assert_eq!(m["spec"], serde_json::json!({"repo": "acme/Tiny-GGUF"}));
        assert_eq!(m["metadata"]["name"], "tiny");
        let m = manifest(
            &args(&[
                "acme/Tiny-GGUF",
                "--quant",
                "Q8_0",
                "--on-demand",
                "--context-size",
                "8192",
                "--token-secret",
                "hf",
                "--no-smoke-test",
            ]),
            "tiny",
        );
        assert_eq!(
            m["spec"],
            serde_json::json!({"repo": "acme/Tiny-GGUF", "quant": "Q8_0", "replicas": 0,
                "onDemand": {}, "contextSize": 8192,
                "tokenSecretRef": {"name": "hf", "key": "token"},
                "smokeTest": {"enabled": false}})
        );
    }

    #[test]
    fn token_secret_takes_an_optional_key() {
        assert_eq!(
            parse_token_secret("hf-token:HF_TOKEN"),
            Ok(("hf-token".into(), "HF_TOKEN".into()))
        );
        assert!(parse_token_secret("Bad_Name").is_err());
        assert!(parse_token_secret("ok:").is_err());
    }

    #[test]
    fn the_timeout_reads_like_kubectl_wait() {
        let a = args(&["a/b", "--timeout", "1h30m"]);
        assert_eq!(a.timeout, Some(Duration::from_secs(5400)));
        assert!(T::try_parse_from(["serve", "a/b", "--timeout", "soon"]).is_err());
    }

    #[test]
    fn on_demand_is_replicas_zero_with_the_gateway_owning_them() {
        let m = manifest(&args(&["a/b", "--on-demand", "--idle-after", "30m"]), "b");
        assert_eq!(m["spec"]["replicas"], 0);
        assert_eq!(
            m["spec"]["onDemand"],
            serde_json::json!({"idleAfter": "30m"})
        );
        let m = manifest(&args(&["a/b", "--on-demand"]), "b");
        assert_eq!(
            m["spec"]["onDemand"],
            serde_json::json!({}),
            "the API server defaults it"
        );
        assert!(
            manifest(&args(&["a/b"]), "b")["spec"]
                .get("onDemand")
                .is_none()
        );
        // --idle-after alone, or out of range, is refused before anything is applied.
        assert!(T::try_parse_from(["serve", "a/b", "--idle-after", "30m"]).is_err());
        assert!(T::try_parse_from(["serve", "a/b", "--on-demand", "--idle-after", "8d"]).is_err());
        assert!(
            T::try_parse_from(["serve", "a/b", "--on-demand", "--idle-after", "soon"]).is_err()
        );
    }

    #[test]
    fn replicas_and_on_demand_exclude_each_other() {
        assert!(T::try_parse_from(["serve", "a/b", "--replicas", "2", "--on-demand"]).is_err());
        assert!(T::try_parse_from(["serve", "a/b", "--replicas", "-1"]).is_err());
    }
}

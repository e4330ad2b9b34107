//! `modelserve ask MODEL "prompt"`: one chat completion through the gateway, as any OpenAI
//! client sends it; prints the reply and how fast the engine produced it. An on-demand model at 0
//! replicas is loaded by this request, so the wait includes the load.

use std::time::{Duration, Instant};

use crate::cli::{Failure, Output};

/// Flags of `modelserve ask`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// The model, by its servedName or an alias (NAMESPACE/NAME when two namespaces serve that name).
    pub model: String,
    /// The user message.
    pub prompt: String,
    /// The gateway's URL.
    #[arg(
        long,
        env = "MODELSERVE_GATEWAY_URL",
        default_value = "http://127.0.0.1:8080"
    )]
    pub gateway: String,
    /// A gateway key (the data.key of a Secret labelled modelserve.dev/gateway-key=true).
    #[arg(long, env = "MODELSERVE_GATEWAY_KEY", hide_env_values = true)]
    pub key: Option<String>,
    /// Upper bound of generated tokens.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u32).range(1..=32768))]
    pub max_tokens: u32,
    /// Longest wait for the answer, loading the model included (90s, 10m).
    #[arg(long, default_value = "10m", value_parser = crate::units::parse_duration)]
    pub timeout: Duration,
    /// Output format: the reply and its speed, or the gateway's whole answer as JSON.
    #[arg(long, short = 'o', value_enum, default_value = "text")]
    pub output: Output,
}

/// What the answer says, for people.
#[derive(Clone, Debug, PartialEq)]
pub struct Answer {
    pub reply: String,
    pub tokens: u64,
    /// The engine's own generation speed when it reports one, else tokens over the wall clock.
    pub tokens_per_second: Option<f64>,
    pub engine_timed: bool,
}

/// Reads an OpenAI chat completion (llama-server adds `timings`).
pub fn answer(body: &serde_json::Value, elapsed: Duration) -> Option<Answer> {
    let reply = body["choices"][0]["message"]["content"]
        .as_str()?
        .to_string();
    let tokens = body["usage"]["completion_tokens"].as_u64().unwrap_or(0);
    let engine = body["timings"]["predicted_per_second"]
        .as_f64()
        .filter(|v| v.is_finite() && *v > 0.0);
    let wall =
        (tokens > 0 && elapsed.as_secs_f64() > 0.0).then(|| tokens as f64 / elapsed.as_secs_f64());
    Some(Answer {
        reply,
        tokens,
        tokens_per_second: engine.or(wall),
        engine_timed: engine.is_some(),
    })
}

/// Sends the question and prints the answer.
pub async fn run(args: Args) -> Result<(), Failure> {
    let base = url::Url::parse(&args.gateway)
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https"))
        .ok_or_else(|| {
            Failure::usage(format!(
                "--gateway {:?} is not an http(s) URL such as http://127.0.0.1:8080",
                args.gateway
            ))
        })?;
    let url = format!(
        "{}/v1/chat/completions",
        base.as_str().trim_end_matches('/')
    );
    let mut req = reqwest::Client::new()
        .post(&url)
        .timeout(args.timeout)
        .json(&serde_json::json!({
            "model": args.model,
            "messages": [{"role": "user", "content": args.prompt}],
            "max_tokens": args.max_tokens,
        }));
    if let Some(key) = &args.key {
        req = req.bearer_auth(key);
    }
    let started = Instant::now();
    let resp = req.send().await.map_err(|e| {
        Failure::new(format!(
            "cannot reach the gateway at {base}: {e}; run `modelserve gateway`, or port-forward its Service, and pass --gateway"
        ))
    })?;
    let status = resp.status();
    let bytes = crate::http::read_capped(resp, 16 << 20)
        .await
        .map_err(|e| Failure::new(format!("the gateway's answer broke off: {e}")))?;
    let elapsed = started.elapsed();
    let body: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    if !status.is_success() {
        let why = body["error"]["message"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| String::from_utf8_lossy(&bytes).chars().take(500).collect());
        let hint = match status.as_u16() {
            401 => "; pass a gateway key with --key or MODELSERVE_GATEWAY_KEY",
            _ => "",
        };
        return Err(Failure::new(format!(
            "the gateway answered {}: {why}{hint}",
            status.as_u16()
        )));
    }
    if args.output == Output::Json {
        println!(
            "{}",
            serde_json::to_string_pretty(&body).unwrap_or_default()
        );
        return Ok(());
    }
    let a = answer(&body, elapsed)
        .ok_or_else(|| Failure::new("the gateway's answer has no choices[0].message.content"))?;
    println!("{}", a.reply.trim_end());
    let speed = match a.tokens_per_second {
        Some(t) if a.engine_timed => format!("{t:.1} tokens/s (the engine's figure)"),
        Some(t) => format!("{t:.1} tokens/s (over the wall clock)"),
        None => "no speed reported".into(),
    };
    eprintln!(
        "\n{} tokens, {speed}; answered in {:.2}s, loading included",
        a.tokens,
        elapsed.as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_engines_own_speed_is_preferred_over_the_wall_clock() {
        let body = serde_json::json!({
            "choices": [{"message": {"content": "Hello there."}}],
            "usage": {"completion_tokens": 4},
            "timings": {"predicted_per_second": 812.5},
        });
        let a = answer(&body, Duration::from_secs(2)).unwrap();
        assert_eq!(a.reply, "Hello there.");
        assert_eq!(a.tokens_per_second, Some(812.5));
        assert!(a.engine_timed);
        let plain = serde_json::json!({
            "choices": [{"message": {"content": "Hi"}}],
            "usage": {"completion_tokens": 4},
        });
        let a = answer(&plain, Duration::from_secs(2)).unwrap();
        assert_eq!(a.tokens_per_second, Some(2.0));
        assert!(!a.engine_timed);
        assert!(answer(&serde_json::json!({}), Duration::from_secs(1)).is_none());
    }
}

//! Stage 6, Smoke test: one short chat completion to the ready replica the Place stage found,
//! with its engine key; the reply and tokens per second go into status and an Event.
//!
//! The replica is called at its pod IP and container port, as any client in the cluster would;
//! a replaced pod is tested again, an unchanged one is not.

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{Api, ResourceExt};
use serde_json::{Value, json};

use super::Outcome;
use super::catalog::{KEY_FIELD, secret_name};
use crate::api::{ModelServe, ModelServeStatus, PlacementStatus, SmokeStatus};
use crate::controller::Context;

/// Longest wait for one answer: a few dozen tokens on a CPU.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a ready replica may refuse connections or still be loading before that is a failure.
const UNREACHABLE_ATTEMPTS: u32 = 60;
const RETRY: Duration = Duration::from_secs(5);

/// What one call of the replica came to.
#[derive(Debug, PartialEq)]
pub enum Answer {
    Reply(SmokeStatus),
    /// Not answering yet (connection refused, loading): try again shortly.
    NotYet(String),
    /// Answered, but not with a chat completion.
    Wrong(String),
}

/// Runs the smoke test once per ready pod.
pub async fn run(ctx: &Context, ms: &ModelServe, status: &mut ModelServeStatus) -> Outcome {
    let spec = ms.spec.smoke_test();
    if !spec.enabled {
        status.smoke = None;
        return Outcome::Done {
            reason: "Skipped".into(),
            message: "smokeTest.enabled is false".into(),
        };
    }
    let Some(place) = status.placement.clone() else {
        return Outcome::Waiting {
            reason: "WaitingForPlace".into(),
            message: "no ready replica yet".into(),
            after: RETRY,
        };
    };
    if let Some(done) = &status.smoke
        && done.uid.is_some()
        && done.uid == place.uid
    {
        return Outcome::Done {
            reason: "Answered".into(),
            message: summary(done),
        };
    }
    let ns = ms.namespace().unwrap_or_else(|| "default".into());
    let key = match engine_key(ctx, &ns, &secret_name(ms)).await {
        Ok(k) => k,
        Err(message) => {
            return Outcome::Waiting {
                reason: "EngineKeyMissing".into(),
                message,
                after: RETRY,
            };
        }
    };
    let served = status
        .resolved
        .as_ref()
        .map_or_else(|| ms.name_any(), |r| r.served_name.clone());
    let retry_key = format!("smoke/{ns}/{}/{}", ms.name_any(), place.pod);
    match call(
        &ctx.http,
        &place,
        &key,
        &served,
        &spec.prompt,
        spec.max_tokens,
    )
    .await
    {
        Answer::Reply(mut smoke) => {
            ctx.retries.reset(&retry_key).await;
            smoke.at = Some(Time(ctx.clock.now()));
            let message = summary(&smoke);
            ctx.metrics.smoke_tokens_per_second(smoke.tokens_per_second);
            status.smoke = Some(smoke);
            Outcome::Done {
                reason: "Answered".into(),
                message,
            }
        }
        Answer::NotYet(why) => {
            let attempt = ctx.retries.bump(&retry_key).await;
            if attempt >= UNREACHABLE_ATTEMPTS {
                ctx.retries.reset(&retry_key).await;
                return Outcome::Failed {
                    reason: "Unreachable".into(),
                    message: format!(
                        "{} at {} did not answer for {} s although ready: {why}",
                        place.pod,
                        place.address,
                        UNREACHABLE_ATTEMPTS as u64 * RETRY.as_secs()
                    ),
                    retry: Some(Duration::from_secs(60)),
                };
            }
            Outcome::Waiting {
                reason: "Asking".into(),
                message: format!(
                    "{} at {} is not answering yet: {why}",
                    place.pod, place.address
                ),
                after: RETRY,
            }
        }
        Answer::Wrong(message) => Outcome::Failed {
            reason: "SmokeTestFailed".into(),
            message: format!("{} at {}: {message}", place.pod, place.address),
            retry: Some(Duration::from_secs(60)),
        },
    }
}

fn summary(s: &SmokeStatus) -> String {
    let speed = s
        .tokens_per_second
        .map(|t| format!(" at {t:.1} tokens/s"))
        .unwrap_or_default();
    format!(
        "{} answered{speed}: {:?}",
        s.pod.as_deref().unwrap_or("the replica"),
        excerpt(&s.reply, 200)
    )
}

async fn engine_key(ctx: &Context, ns: &str, name: &str) -> Result<String, String> {
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), ns);
    let secret = secrets
        .get_opt(name)
        .await
        .map_err(|e| format!("reading Secret {name}: {e}"))?
        .ok_or_else(|| {
            format!("the engine-key Secret {name} is gone; the Catalog stage makes it again")
        })?;
    let bytes = secret
        .data
        .and_then(|mut d| d.remove(KEY_FIELD))
        .ok_or_else(|| format!("Secret {name} has no key {KEY_FIELD:?}"))?;
    String::from_utf8(bytes.0)
        .map(|k| k.trim().to_string())
        .map_err(|_| format!("Secret {name}: the key is not text"))
}

/// One chat completion against the replica.
pub async fn call(
    http: &reqwest::Client,
    place: &PlacementStatus,
    key: &str,
    model: &str,
    prompt: &str,
    max_tokens: i32,
) -> Answer {
    let url = format!("http://{}/v1/chat/completions", place.address);
    let body = json!({
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "stream": false,
    });
    let started = Instant::now();
    let resp = http
        .post(&url)
        .bearer_auth(key)
        .json(&body)
        .timeout(ANSWER_TIMEOUT)
        .send()
        .await;
    let resp = match resp {
        Ok(r) => r,
        Err(e) if e.is_timeout() => {
            return Answer::Wrong(format!("no answer within {} s", ANSWER_TIMEOUT.as_secs()));
        }
        Err(e) => return Answer::NotYet(cause(&e)),
    };
    let code = resp.status();
    let text = match resp.text().await {
        Ok(t) => t,
        Err(e) => return Answer::NotYet(format!("the answer broke off: {}", cause(&e))),
    };
    let elapsed = started.elapsed();
    // 503 is llama-server still loading the model.
    if code == reqwest::StatusCode::SERVICE_UNAVAILABLE {
        return Answer::NotYet(format!("HTTP 503 {}", excerpt(&text, 200)));
    }
    if !code.is_success() {
        return Answer::Wrong(format!(
            "HTTP {} from POST /v1/chat/completions: {}",
            code.as_u16(),
            excerpt(&text, 300)
        ));
    }
    let mut smoke = match parse(&text, elapsed) {
        Ok(s) => s,
        Err(why) => {
            return Answer::Wrong(format!("HTTP 200 but {why}: {}", excerpt(&text, 300)));
        }
    };
    smoke.pod = Some(place.pod.clone());
    smoke.uid = place.uid.clone();
    Answer::Reply(smoke)
}

/// The reply and speed of a chat completion body. Speed: the server's own
/// timings.predicted_per_second when it sends one, else completion tokens over elapsed time.
pub fn parse(text: &str, elapsed: Duration) -> Result<SmokeStatus, String> {
    let v: Value = serde_json::from_str(text).map_err(|_| "the body is not JSON".to_string())?;
    let message = v
        .pointer("/choices/0/message")
        .ok_or("the body has no choices[0].message, so it is not a chat completion")?;
    let content = message.get("content").and_then(Value::as_str).unwrap_or("");
    let reasoning = message
        .get("reasoning_content")
        .and_then(Value::as_str)
        .unwrap_or("");
    let reply = if content.is_empty() {
        reasoning
    } else {
        content
    };
    let completion_tokens = v
        .pointer("/usage/completion_tokens")
        .and_then(Value::as_i64);
    let tokens_per_second = v
        .pointer("/timings/predicted_per_second")
        .and_then(Value::as_f64)
        .filter(|t| t.is_finite() && *t > 0.0)
        .or_else(|| {
            let n = completion_tokens? as f64;
            let secs = elapsed.as_secs_f64();
            (n > 0.0 && secs > 0.0).then(|| n / secs)
        })
        .map(|t| (t * 10.0).round() / 10.0);
    Ok(SmokeStatus {
        reply: excerpt(reply.trim(), 1000),
        tokens_per_second,
        completion_tokens,
        ..Default::default()
    })
}

fn cause(e: &reqwest::Error) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s = format!("{s}: {inner}");
        src = inner.source();
    }
    s
}

/// At most `n` characters of `s`, on one line.
fn excerpt(s: &str, n: usize) -> String {
    let one_line: String = s
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if one_line.chars().count() <= n {
        one_line
    } else {
        let cut: String = one_line.chars().take(n).collect();
        format!("{cut}…")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_servers_own_speed_is_preferred() {
        let body = r#"{"choices":[{"index":0,"message":{"role":"assistant","content":" Hello there! "}}],
            "usage":{"completion_tokens":4,"prompt_tokens":10},"timings":{"predicted_per_second":42.123}}"#;
        let s = parse(body, Duration::from_secs(10)).unwrap();
        assert_eq!(s.reply, "Hello there!");
        assert_eq!(s.tokens_per_second, Some(42.1));
        assert_eq!(s.completion_tokens, Some(4));
    }

    #[test]
    fn without_timings_speed_is_tokens_over_elapsed_time() {
        let body = r#"{"choices":[{"message":{"content":"hi"}}],"usage":{"completion_tokens":10}}"#;
        let s = parse(body, Duration::from_secs(4)).unwrap();
        assert_eq!(s.tokens_per_second, Some(2.5));
    }

    #[test]
    fn a_reasoning_model_with_no_content_yet_reports_its_reasoning() {
        let body = r#"{"choices":[{"message":{"content":"","reasoning_content":"Let me think"}}]}"#;
        assert_eq!(parse(body, Duration::ZERO).unwrap().reply, "Let me think");
    }

    #[test]
    fn a_body_that_is_not_a_completion_is_refused_with_the_reason() {
        assert!(
            parse("<html>proxy</html>", Duration::ZERO)
                .unwrap_err()
                .contains("not JSON")
        );
        assert!(
            parse(r#"{"object":"list","data":[]}"#, Duration::ZERO)
                .unwrap_err()
                .contains("not a chat completion")
        );
    }

    #[test]
    fn excerpts_are_one_short_line() {
        assert_eq!(excerpt("a\nb", 10), "a b");
        assert_eq!(excerpt(&"x".repeat(20), 5), "xxxxx…");
    }
}

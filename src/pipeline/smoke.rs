//! Stage 6, Smoke test: one short chat completion to the ready replica the Place stage found,
//! with its engine key; the reply and tokens per second go into status and an Event.
//!
//! The replica is called at its pod IP and container port, as any client in the cluster would;
//! a replaced pod is tested again, an unchanged one is not.

use std::time::{Duration, Instant};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use serde_json::{Value, json};

use super::Stage;
use super::catalog::apply::key_of;
use super::env::Env;
use super::offloaded;
use super::outcome::{Failure, Outcome, Progress, Recovery};
use crate::api::{ModelServe, ModelServeStatus, PlacementStatus, SmokeStatus};
use crate::names::{secret_name, served_name_of};

/// Longest wait for one answer: a few dozen tokens on a CPU.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(120);
/// How long a ready replica may refuse connections or still be loading before that is a failure.
const UNREACHABLE_AFTER: Duration = Duration::from_secs(300);
const RETRY: Duration = Duration::from_secs(5);
/// When a replica that answered wrongly is asked again.
const RETRY_FAILED: Duration = Duration::from_secs(60);
/// The most of an answer read into memory.
const MAX_ANSWER: usize = 1 << 20;

/// What one call of the replica came to.
#[derive(Debug, PartialEq)]
pub enum Answer {
    Reply(SmokeStatus),
    /// Not answering yet (connection refused, loading): try again shortly.
    NotYet(String),
    /// Answered, but not with a chat completion.
    Wrong(String),
}

/// Why the smoke test did not pass.
#[derive(Debug, thiserror::Error, strum::IntoStaticStr, strum::VariantNames)]
pub enum SmokeFailure {
    #[error("{pod} at {address} did not answer for {secs} s although ready: {why}")]
    Unreachable {
        pod: String,
        address: String,
        secs: u64,
        why: String,
    },
    #[error("{pod} at {address}: {why}")]
    SmokeTestFailed {
        pod: String,
        address: String,
        why: String,
    },
    #[error("{0}")]
    EngineKeyMissing(String),
    /// The replica answers, but on fewer GPU layers than the Check stage planned.
    #[error("{pod} answers, but {why}")]
    OffloadBelowPlan { pod: String, why: String },
}

impl Failure for SmokeFailure {
    fn reason(&self) -> &'static str {
        self.into()
    }

    fn recovery(&self) -> Recovery {
        match self {
            // The Catalog stage of the same reconcile makes it again.
            SmokeFailure::EngineKeyMissing(_) => Recovery::TRANSIENT,
            _ => Recovery::Heals(RETRY_FAILED),
        }
    }
}

/// Runs the smoke test once per ready pod.
pub async fn run(env: &Env, ms: &ModelServe, status: &mut ModelServeStatus) -> Outcome {
    let spec = ms.spec.smoke_test();
    if !spec.enabled {
        status.smoke = None;
        return Outcome::done(Progress::Skipped, "smokeTest.enabled is false");
    }
    let Some(place) = status.placement.clone() else {
        return Outcome::waiting(Progress::WaitingForPlace, "no ready replica yet", RETRY);
    };
    let served = served_name_of(&ms.spec);
    let asked = request(&served, &spec.prompt, spec.max_tokens);
    let planned = planned_gpu_layers(ms, status);
    let ns = ms.namespace().unwrap_or_else(|| "default".into());
    if let Some(done) = &mut status.smoke
        && done.uid.is_some()
        && done.uid == place.uid
        && done.request.as_deref() == Some(asked.as_str())
    {
        let mut message = summary(done);
        if planned.is_some() && done.gpu_layers.is_none() {
            // A log that could not be read is read again; one that did not say is not.
            let unread = status
                .conditions
                .iter()
                .any(|c| c.type_ == Stage::SmokeTest.condition() && c.message.contains(UNREAD));
            if unread {
                let (seen, said) = offload_in_log(env, &ns, &place.pod).await;
                done.gpu_layers = seen;
                message += &said;
            } else {
                message += &unknown(UNSAID);
            }
        }
        return offload_verdict(&place, planned, done.gpu_layers)
            .unwrap_or_else(|| Outcome::done(Progress::Answered, message));
    }
    let key = match engine_key(env, &ns, &secret_name(ms)) {
        Ok(k) => k,
        Err(message) => return Outcome::failed(&SmokeFailure::EngineKeyMissing(message)),
    };
    match call(
        &env.http,
        &place,
        &key,
        &served,
        &spec.prompt,
        spec.max_tokens,
    )
    .await
    {
        Answer::Reply(mut smoke) => {
            smoke.at = Some(Time(env.clock.now()));
            smoke.request = Some(asked);
            let mut message = summary(&smoke);
            if planned.is_some() {
                let (seen, said) = offload_in_log(env, &ns, &place.pod).await;
                smoke.gpu_layers = seen;
                message += &said;
            }
            let verdict = offload_verdict(&place, planned, smoke.gpu_layers);
            status.smoke = Some(smoke);
            verdict.unwrap_or_else(|| Outcome::done(Progress::Answered, message))
        }
        Answer::NotYet(why) => {
            let since = ready_since(env, &ns, &place);
            let waited = since.map_or(Duration::ZERO, |t| {
                Duration::from_secs(
                    env.clock
                        .now()
                        .as_second()
                        .saturating_sub(t.as_second())
                        .max(0) as u64,
                )
            });
            if waited >= UNREACHABLE_AFTER {
                return Outcome::failed(&SmokeFailure::Unreachable {
                    pod: place.pod.clone(),
                    address: place.address.clone(),
                    secs: waited.as_secs(),
                    why,
                });
            }
            Outcome::waiting(
                Progress::Asking,
                format!(
                    "{} at {} is not answering yet: {why}",
                    place.pod, place.address
                ),
                RETRY,
            )
        }
        Answer::Wrong(why) => Outcome::failed(&SmokeFailure::SmokeTestFailed {
            pod: place.pod.clone(),
            address: place.address.clone(),
            why,
        }),
    }
}

/// Why what a GPU model's engine offloaded is unknown: its log does not say.
const UNSAID: &str = "its log does not say (llama.cpp logs its layers and their buffers at -lv 4, which engine.extraArgs can pass)";
/// Or its log could not be read (then it is read again on the next pass).
const UNREAD: &str = "its log cannot be read";

fn unknown(why: &str) -> String {
    format!("; what the engine offloaded is unknown: {why}")
}

/// The GPU layers the engine's log says it offloaded (0: no GPU used), and what the message
/// adds where the log does not say or cannot be read.
async fn offload_in_log(env: &Env, ns: &str, pod: &str) -> (Option<i32>, String) {
    match engine_log(env, ns, pod).await {
        Ok(log) => match offloaded::seen(&log) {
            offloaded::Seen::Layers { done, .. } => (Some(done as i32), String::new()),
            offloaded::Seen::NoGpu => (Some(0), String::new()),
            offloaded::Seen::Unknown => (None, unknown(UNSAID)),
        },
        Err(e) => (None, unknown(&format!("{UNREAD} ({e})"))),
    }
}

/// What a smoke test asks, as recorded in status.smoke.request.
/// The GPU layers the Check stage planned, for a model with a GPU accelerator.
fn planned_gpu_layers(ms: &ModelServe, status: &ModelServeStatus) -> Option<u32> {
    let gpu = ms
        .spec
        .engine
        .as_ref()
        .is_some_and(|e| e.accelerator().is_gpu());
    let planned = status.check.as_ref()?.gpu_layers?;
    gpu.then_some(planned.max(0) as u32)
}

/// A failure when the engine offloaded fewer layers than planned.
fn offload_verdict(
    place: &PlacementStatus,
    planned: Option<u32>,
    seen: Option<i32>,
) -> Option<Outcome> {
    let seen = match seen? {
        0 => offloaded::Seen::NoGpu,
        n => offloaded::Seen::Layers {
            done: n.max(0) as u32,
            of: planned?,
        },
    };
    let why = offloaded::shortfall(planned?, seen)?;
    Some(Outcome::failed(&SmokeFailure::OffloadBelowPlan {
        pod: place.pod.clone(),
        why,
    }))
}

/// The server container's log, its first part (where the engine says what it loaded where).
async fn engine_log(env: &Env, ns: &str, pod: &str) -> Result<String, kube::Error> {
    let pods: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(env.client.clone(), ns);
    let params = kube::api::LogParams {
        container: Some(crate::names::SERVER_CONTAINER.into()),
        limit_bytes: Some(offloaded::MAX_LOG),
        ..Default::default()
    };
    tokio::time::timeout(Duration::from_secs(20), pods.logs(pod, &params))
        .await
        .unwrap_or_else(|_| {
            Err(kube::Error::Service(
                "no log within 20 s".to_string().into(),
            ))
        })
}

pub fn request(served: &str, prompt: &str, max_tokens: i32) -> String {
    crate::units::digest(format!("{served}\n{max_tokens}\n{prompt}").as_bytes())
}

/// When the placed pod last turned Ready, from the cache.
fn ready_since(env: &Env, namespace: &str, place: &PlacementStatus) -> Option<Timestamp> {
    let model = env
        .cache
        .pods
        .get(&kube::runtime::reflector::ObjectRef::new(&place.pod).within(namespace))?;
    model
        .status
        .as_ref()?
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "Ready" && c.status == "True")?
        .last_transition_time
        .as_ref()
        .map(|t| t.0)
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

/// The engine key from the cached engine-key Secret.
fn engine_key(env: &Env, ns: &str, name: &str) -> Result<String, String> {
    let secret = env.cache.secret(ns, name).ok_or_else(|| {
        format!("the engine-key Secret {name} is gone; the Catalog stage makes it again")
    })?;
    let bytes = key_of(&secret).ok_or_else(|| format!("Secret {name} has no key"))?;
    std::str::from_utf8(bytes)
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
    let text = match crate::http::read_capped(resp, MAX_ANSWER).await {
        Ok(b) => String::from_utf8_lossy(&b).into_owned(),
        Err(e @ crate::http::BodyError::TooLarge { .. }) => return Answer::Wrong(e.to_string()),
        Err(e) => return Answer::NotYet(format!("the answer broke off: {e}")),
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

    /// A loopback server answering every chat completion with `code` and `body`.
    async fn replica(code: u16, body: &'static str) -> PlacementStatus {
        use axum::http::StatusCode;
        let app = axum::Router::new().route(
            "/v1/chat/completions",
            axum::routing::post(move || async move { (StatusCode::from_u16(code).unwrap(), body) }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move { axum::serve(listener, app).await });
        PlacementStatus {
            pod: "m-1".into(),
            node: None,
            address,
            uid: Some("u".into()),
        }
    }

    #[tokio::test]
    async fn a_server_running_with_another_key_fails_with_its_401_quoted() {
        let place = replica(401, r#"{"error":{"code":401,"message":"Invalid API Key"}}"#).await;
        let http = reqwest::Client::builder().no_proxy().build().unwrap();
        let Answer::Wrong(why) = call(&http, &place, "k", "m", "hi", 4).await else {
            panic!("a 401 is a wrong answer")
        };
        assert!(
            why.starts_with("HTTP 401 from POST /v1/chat/completions: ")
                && why.contains("Invalid API Key"),
            "{why}"
        );
        let loading = replica(503, "Loading model").await;
        assert!(matches!(
            call(&http, &loading, "k", "m", "hi", 4).await,
            Answer::NotYet(m) if m.contains("503")
        ));
    }

    #[test]
    fn excerpts_are_one_short_line() {
        assert_eq!(excerpt("a\nb", 10), "a b");
        assert_eq!(excerpt(&"x".repeat(20), 5), "xxxxx…");
    }
}

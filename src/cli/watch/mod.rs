//! Following one ModelServe through its stages: a line per condition transition, a progress bar
//! while mirroring, and the verdict that ends the watch (ready, on demand, or a failed stage).
//!
//! Split along its seams: [`observe`] reads what the API server sent (and trusts none of it),
//! [`decide`] turns successive snapshots into updates and a verdict, [`describe`] puts them into
//! words, and [`display`] prints them for a terminal or a log. [`follow`] connects them to a
//! watch on the API server, and [`conclude`] turns its end into the command's result.

pub mod decide;
pub mod describe;
pub mod display;
pub mod observe;

use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::Api;
use kube::runtime::WatchStreamExt;

pub use decide::{Follower, MirrorProgress, StageLine, Update, Verdict, verdict};
pub use describe::{current_stage_text, duration_text, progress_plain, ready_summary};
pub use display::Display;

use crate::api::ModelServe;
use crate::cli::text::{MESSAGE_CHARS, WORD_CHARS, shown};
use crate::cli::{EXIT_INTERRUPTED, Failure, Output, program_name};

/// How long a watch waits for the controller's first status before saying so.
const CONTROLLER_SILENCE: Duration = Duration::from_secs(30);

/// Why a watch stopped before a verdict.
#[derive(Debug)]
pub enum Stop {
    Interrupted,
    TimedOut(Option<Box<ModelServe>>),
    Deleted,
}

/// Watches `name` and shows every update until a verdict, Ctrl-C, the timeout or deletion.
pub async fn follow(
    api: &Api<ModelServe>,
    name: &str,
    generation: i64,
    display: &mut Display,
    timeout: Option<Duration>,
) -> Result<(Verdict, ModelServe), Stop> {
    let stream = kube::runtime::watcher::watch_object(api.clone(), name).default_backoff();
    futures::pin_mut!(stream);
    // Installed once: from here SIGINT ends the watch, not the process mid-write.
    let ctrl_c = tokio::signal::ctrl_c();
    futures::pin_mut!(ctrl_c);
    let deadline = tokio::time::sleep(timeout.unwrap_or(Duration::from_secs(100 * 365 * 86400)));
    futures::pin_mut!(deadline);
    let mut follower = Follower::new(generation);
    let mut last: Option<ModelServe> = None;
    let mut lost = false;
    // A status that never comes usually means no controller watches this namespace.
    let silence = tokio::time::sleep(CONTROLLER_SILENCE);
    futures::pin_mut!(silence);
    let mut heard = false;
    loop {
        tokio::select! {
            _ = &mut silence, if !heard => {
                heard = true;
                display.line(&format!(
                    "(no status for generation {generation} after {}s: is the modelserve controller running and watching this namespace?)",
                    CONTROLLER_SILENCE.as_secs()
                ));
            }
            _ = &mut ctrl_c => {
                display.clear_bar();
                return Err(Stop::Interrupted);
            }
            _ = &mut deadline, if timeout.is_some() => {
                display.clear_bar();
                return Err(Stop::TimedOut(last.map(Box::new)));
            }
            item = stream.next() => match item {
                Some(Ok(Some(ms))) => {
                    if lost {
                        display.line("(watching again)");
                        lost = false;
                    }
                    let now = Instant::now();
                    heard |= ms
                        .status
                        .as_ref()
                        .and_then(|s| s.observed_generation)
                        .is_some_and(|g| g >= generation);
                    for u in follower.observe(&ms, now) {
                        display.show(&u, now);
                        if let Update::Finished(v) = u {
                            return Ok((v, ms));
                        }
                    }
                    last = Some(ms);
                }
                Some(Ok(None)) | None => {
                    display.clear_bar();
                    return Err(Stop::Deleted);
                }
                Some(Err(e)) => {
                    if !lost {
                        display.line(&format!(
                            "(lost the watch: {}; retrying)",
                            crate::cli::cluster::root_cause(&e)
                        ));
                        lost = true;
                    }
                }
            }
        }
    }
}

/// The command that watches `name` again.
pub fn resume_hint(name: &str, namespace: &str) -> String {
    format!("{} status {name} -n {namespace} --watch", program_name())
}

/// Prints how a watch ended and turns it into the command's result.
pub fn conclude(
    outcome: Result<(Verdict, ModelServe), Stop>,
    name: &str,
    namespace: &str,
    display: &mut Display,
    output: Output,
    timeout: Option<Duration>,
) -> Result<(), Failure> {
    let (verdict, ms) = match outcome {
        Ok(found) => found,
        Err(Stop::Interrupted) => {
            return Err(Failure {
                message: format!(
                    "stopped watching; {name} keeps going in the cluster. Watch it again with `{}`",
                    resume_hint(name, namespace)
                ),
                code: EXIT_INTERRUPTED,
            });
        }
        Err(Stop::Deleted) => {
            return Err(Failure::new(format!(
                "ModelServe {namespace}/{name} was deleted while being watched"
            )));
        }
        Err(Stop::TimedOut(last)) => {
            if let Some(ms) = &last {
                print_json(ms, output);
            }
            let now = last
                .as_ref()
                .and_then(|ms| ms.status.as_ref())
                .map(current_stage_text)
                .unwrap_or_else(|| "the controller has not written a status yet".into());
            return Err(Failure::new(format!(
                "{name} is not ready after {}: {now}. It keeps going in the cluster; watch it with `{}`",
                duration_text(timeout.unwrap_or_default().as_secs()),
                resume_hint(name, namespace)
            )));
        }
    };
    print_json(&ms, output);
    let status = ms.status.clone().unwrap_or_default();
    match verdict {
        Verdict::Ready => {
            if output == Output::Text {
                for line in ready_summary(&status) {
                    display.line(&line);
                }
            }
            Ok(())
        }
        Verdict::OnDemand { message } => {
            if output == Output::Text {
                let start = if ms.spec.on_demand.is_some() {
                    format!(
                        "Ask it through the gateway (`modelserve ask {} \"Hello\"`), or start it now with `kubectl scale modelserve/{name} -n {namespace} --replicas=1`",
                        crate::names::served_name_of(&ms.spec)
                    )
                } else {
                    format!(
                        "Start it with `kubectl scale modelserve/{name} -n {namespace} --replicas=1`"
                    )
                };
                display.line(&format!(
                    "{name} is on demand: {}. {start}",
                    shown(&message, MESSAGE_CHARS)
                ));
            }
            Ok(())
        }
        Verdict::Failed {
            stage,
            reason,
            message,
        } => Err(Failure::new(format!(
            "the {stage} stage of {name} failed ({}): {}",
            shown(&reason, WORD_CHARS),
            shown(&message, MESSAGE_CHARS)
        ))),
    }
}

fn print_json(ms: &ModelServe, output: Output) {
    if output == Output::Json {
        let status = serde_json::to_string_pretty(&ms.status).unwrap_or_else(|_| "null".into());
        println!("{status}");
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::api::{ModelServeSpec, ModelServeStatus};
    use crate::conditions::READY;
    use crate::pipeline::Stage;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    pub(crate) fn cond(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
        Condition {
            type_: type_.into(),
            status: status.into(),
            reason: reason.into(),
            message: message.into(),
            observed_generation: Some(1),
            last_transition_time: Time(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
        }
    }

    /// A ModelServe whose first conditions have the given (status, reason); the rest wait.
    pub(crate) fn model(generation: i64, stage: &str, given: &[(&str, &str)]) -> ModelServe {
        let spec: ModelServeSpec =
            serde_json::from_value(serde_json::json!({"repo": "a/b"})).unwrap();
        let mut ms = ModelServe::new("m", spec);
        ms.metadata.generation = Some(generation);
        let mut conditions: Vec<Condition> = Stage::ALL
            .iter()
            .enumerate()
            .map(|(i, s)| match given.get(i) {
                Some((st, r)) => cond(s.condition(), st, r, &format!("{} {r}", s.name())),
                None => cond(s.condition(), "Unknown", "WaitingForEarlierStage", "waits"),
            })
            .collect();
        conditions.push(cond(READY, "False", "X", "not yet"));
        ms.status = Some(ModelServeStatus {
            observed_generation: Some(generation),
            stage: Some(stage.into()),
            conditions,
            ..Default::default()
        });
        ms
    }

    #[test]
    fn a_failed_stage_ends_in_one_bounded_line_whatever_the_server_wrote() {
        let ms = model(1, "Resolve", &[("False", "NoMatchingQuant")]);
        let mut d = Display::new(Box::new(std::io::sink()), false);
        let v = Verdict::Failed {
            stage: "Resolve".into(),
            reason: "R".repeat(5000),
            message: format!("{}\n\x1b[31mred", "ж".repeat(10_000)),
        };
        let f = conclude(Ok((v, ms)), "m", "ns", &mut d, Output::Text, None).unwrap_err();
        assert!(
            !f.message.contains('\n') && !f.message.contains('\x1b'),
            "{}",
            f.message
        );
        assert!(f.message.starts_with("the Resolve stage of m failed (RRR"));
        assert!(f.message.chars().count() < MESSAGE_CHARS + WORD_CHARS + 40);
    }

    #[test]
    fn a_timeout_before_any_status_says_so() {
        let mut ms = model(1, "Resolve", &[]);
        ms.status = None;
        let mut d = Display::new(Box::new(std::io::sink()), false);
        let stop = Stop::TimedOut(Some(Box::new(ms)));
        let timeout = Some(Duration::from_secs(90));
        let f = conclude(Err(stop), "m", "ns", &mut d, Output::Text, timeout).unwrap_err();
        assert_eq!(
            f.message,
            "m is not ready after 1m30s: the controller has not written a status yet. It keeps going in the cluster; watch it with `modelserve status m -n ns --watch`"
        );
    }
}

//! Following one ModelServe through its stages: a line per condition transition, a progress bar
//! while mirroring, and the verdict that ends the watch (ready, on demand, or a failed stage).
//!
//! [`Follower`] is the pure part (status snapshots in, updates out); [`Display`] prints them for
//! a terminal or a log; [`follow`] connects the two to a watch on the API server.

use std::collections::{BTreeMap, VecDeque};
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::Api;
use kube::runtime::WatchStreamExt;

use crate::api::{ModelServe, ModelServeStatus};
use crate::cli::{EXIT_INTERRUPTED, Failure, Output, program_name};
use crate::conditions::READY;
use crate::pipeline::Stage;
use crate::units::human_bytes;

/// One condition that changed status or reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StageLine {
    pub stage: String,
    pub status: String,
    pub reason: String,
    pub message: String,
}

/// Where the mirror stands, with a speed measured from successive observations.
#[derive(Clone, Debug, PartialEq)]
pub struct MirrorProgress {
    pub done: u64,
    pub total: u64,
    pub percent: i32,
    pub bytes_per_second: Option<f64>,
}

/// How the watch ends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every stage is done and the model answers.
    Ready,
    /// replicas is 0: cataloged, started by a later scale-up.
    OnDemand { message: String },
    /// A stage's condition is False: it waits for a change of spec (or of the cluster).
    Failed {
        stage: String,
        reason: String,
        message: String,
    },
    /// The pipeline stops at a stage this operator version has not built.
    NotBuilt { stage: String, message: String },
}

/// What one observation changed, in the order to show it.
#[derive(Clone, Debug, PartialEq)]
pub enum Update {
    Stage(StageLine),
    Mirror(MirrorProgress),
    Finished(Verdict),
}

/// Turns successive snapshots of one ModelServe into updates.
pub struct Follower {
    /// The spec generation the caller cares about; older statuses describe another spec.
    generation: i64,
    seen: BTreeMap<String, (String, String)>,
    speed: Speed,
}

impl Follower {
    /// Follows the status written for `generation` (the one the caller applied) or later.
    pub fn new(generation: i64) -> Follower {
        Follower {
            generation,
            seen: BTreeMap::new(),
            speed: Speed::default(),
        }
    }

    /// The updates since the previous snapshot.
    pub fn observe(&mut self, ms: &ModelServe, now: Instant) -> Vec<Update> {
        let Some(status) = &ms.status else {
            return vec![];
        };
        if status.observed_generation.unwrap_or(0) < self.generation {
            return vec![];
        }
        let mut updates = Vec::new();
        for (stage, type_) in condition_order() {
            let Some(c) = status.conditions.iter().find(|c| c.type_ == type_) else {
                continue;
            };
            let key = (c.status.clone(), c.reason.clone());
            if self.seen.get(type_) == Some(&key) {
                continue;
            }
            self.seen.insert(type_.to_string(), key);
            // Waiting stages and a not-yet-Ready summary repeat what the current stage says.
            let noise = c.reason == "WaitingForEarlierStage"
                || (type_ != READY && c.reason == "OnDemand")
                || (type_ == READY && c.status != "True");
            if !noise {
                updates.push(Update::Stage(StageLine {
                    stage: stage.to_string(),
                    status: c.status.clone(),
                    reason: c.reason.clone(),
                    message: c.message.clone(),
                }));
            }
        }
        if let Some(p) = self.mirror_progress(status, now) {
            updates.push(Update::Mirror(p));
        }
        if let Some(v) = verdict(status) {
            updates.push(Update::Finished(v));
        }
        updates
    }

    fn mirror_progress(
        &mut self,
        status: &ModelServeStatus,
        now: Instant,
    ) -> Option<MirrorProgress> {
        let mirroring = status.stage.as_deref() == Some(Stage::Mirror.name())
            && status
                .conditions
                .iter()
                .any(|c| c.type_ == Stage::Mirror.condition() && c.status == "Unknown");
        let m = status.mirror.as_ref().filter(|_| mirroring)?;
        let done = u64::try_from(m.bytes_done).unwrap_or(0);
        self.speed.add(now, done);
        Some(MirrorProgress {
            done,
            total: u64::try_from(m.bytes_total).unwrap_or(0),
            percent: m.percent,
            bytes_per_second: self.speed.rate(),
        })
    }
}

/// (stage name, condition type) in pipeline order, then Ready.
fn condition_order() -> impl Iterator<Item = (&'static str, &'static str)> {
    Stage::ALL
        .iter()
        .map(|s| (s.name(), s.condition()))
        .chain(std::iter::once((READY, READY)))
}

/// The verdict a status gives, if the watch is over.
pub fn verdict(status: &ModelServeStatus) -> Option<Verdict> {
    let cond = |t: &str| status.conditions.iter().find(|c| c.type_ == t);
    if let Some(ready) = cond(READY).filter(|c| c.status == "True") {
        return Some(if ready.reason == "OnDemand" {
            Verdict::OnDemand {
                message: ready.message.clone(),
            }
        } else {
            Verdict::Ready
        });
    }
    for (stage, type_) in condition_order() {
        let Some(c) = cond(type_) else { continue };
        if c.status == "False" && type_ != READY {
            return Some(Verdict::Failed {
                stage: stage.to_string(),
                reason: c.reason.clone(),
                message: c.message.clone(),
            });
        }
        if c.reason == "NotImplemented" {
            return Some(Verdict::NotBuilt {
                stage: stage.to_string(),
                message: c.message.clone(),
            });
        }
    }
    None
}

/// Bytes per second over the last observations.
#[derive(Default)]
struct Speed {
    samples: VecDeque<(Instant, u64)>,
}

impl Speed {
    /// How far back the speed looks: long enough to smooth the controller's 3 s writes.
    const WINDOW: Duration = Duration::from_secs(15);

    fn add(&mut self, now: Instant, done: u64) {
        if self.samples.back().is_some_and(|&(_, d)| done < d) {
            // The download started over (a file failed its checksum): measure afresh.
            self.samples.clear();
        }
        self.samples.push_back((now, done));
        while self.samples.len() > 2
            && self
                .samples
                .front()
                .is_some_and(|&(t, _)| now.duration_since(t) > Self::WINDOW)
        {
            self.samples.pop_front();
        }
    }

    fn rate(&self) -> Option<f64> {
        let (&(t0, d0), &(t1, d1)) = (self.samples.front()?, self.samples.back()?);
        let secs = t1.duration_since(t0).as_secs_f64();
        (secs >= 1.0).then(|| d1.saturating_sub(d0) as f64 / secs)
    }
}

/// A duration for people: 45s, 3m20s, 2h05m.
pub fn duration_text(secs: u64) -> String {
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m{:02}s", secs / 60, secs % 60),
        _ => format!("{}h{:02}m", secs / 3600, secs % 3600 / 60),
    }
}

/// Prints updates: in place on a terminal, as plain lines every few seconds otherwise.
pub struct Display {
    out: Box<dyn Write + Send>,
    tty: bool,
    color: bool,
    bar_visible: bool,
    last_plain: Option<(Instant, u64)>,
    plain_every: Duration,
}

const CLEAR_LINE: &str = "\r\x1b[2K";

impl Display {
    /// A display on stdout, or on stderr when stdout carries JSON.
    pub fn for_output(output: Output) -> Display {
        match output {
            Output::Text => {
                let tty = std::io::stdout().is_terminal();
                Display::new(Box::new(std::io::stdout()), tty)
            }
            Output::Json => {
                let tty = std::io::stderr().is_terminal();
                Display::new(Box::new(std::io::stderr()), tty)
            }
        }
    }

    /// A display on `out`; colour only on a terminal and when NO_COLOR is not set.
    pub fn new(out: Box<dyn Write + Send>, tty: bool) -> Display {
        let no_color = std::env::var_os("NO_COLOR").is_some_and(|v| !v.is_empty());
        Display {
            out,
            tty,
            color: tty && !no_color,
            bar_visible: false,
            last_plain: None,
            plain_every: Duration::from_secs(5),
        }
    }

    /// Prints one update.
    pub fn show(&mut self, update: &Update, now: Instant) {
        match update {
            Update::Stage(l) => {
                let line = self.stage_line(l);
                self.line(&line);
            }
            Update::Mirror(p) => self.progress(p, now),
            Update::Finished(_) => self.clear_bar(),
        }
    }

    /// A whole line, above the progress bar if one is shown.
    pub fn line(&mut self, text: &str) {
        self.clear_bar();
        // A closed stdout (`| head`) must not stop the watch or panic.
        let _ = writeln!(self.out, "{text}");
        let _ = self.out.flush();
    }

    fn clear_bar(&mut self) {
        if self.bar_visible {
            let _ = write!(self.out, "{CLEAR_LINE}");
            let _ = self.out.flush();
            self.bar_visible = false;
        }
    }

    fn progress(&mut self, p: &MirrorProgress, now: Instant) {
        if self.tty {
            let bar = progress_bar(p, 24);
            let _ = write!(self.out, "{CLEAR_LINE}{bar}");
            let _ = self.out.flush();
            self.bar_visible = true;
            return;
        }
        let due = match self.last_plain {
            None => true,
            Some((at, done)) => now.duration_since(at) >= self.plain_every && done != p.done,
        };
        if due {
            self.last_plain = Some((now, p.done));
            let line = progress_plain(p);
            self.line(&line);
        }
    }

    fn stage_line(&self, l: &StageLine) -> String {
        let status = format!("{:<8}", l.status);
        let status = if self.color {
            let code = match l.status.as_str() {
                "True" => "32",
                "False" => "31",
                _ => "33",
            };
            format!("\x1b[{code}m{status}\x1b[0m")
        } else {
            status
        };
        format!("{:<10}{status} {:<16} {}", l.stage, l.reason, l.message)
    }
}

fn speed_and_eta(p: &MirrorProgress) -> String {
    match p.bytes_per_second {
        Some(r) if r >= 1.0 => {
            let left = p.total.saturating_sub(p.done) as f64 / r;
            format!(
                "  {}/s  ETA {}",
                human_bytes(r as u64),
                duration_text(left.ceil() as u64)
            )
        }
        Some(_) => "  stalled".into(),
        None => String::new(),
    }
}

/// `Mirror    [=========>              ]  41%  1.2 MiB / 3.0 MiB  512.0 KiB/s  ETA 4s`
pub fn progress_bar(p: &MirrorProgress, width: usize) -> String {
    let filled = (p.percent.clamp(0, 100) as usize * width) / 100;
    let mut bar = "=".repeat(filled);
    if filled < width {
        bar.push('>');
        bar.push_str(&" ".repeat(width - filled - 1));
    }
    format!(
        "{:<10}[{bar}] {:>3}%  {} / {}{}",
        Stage::Mirror.name(),
        p.percent,
        human_bytes(p.done),
        human_bytes(p.total),
        speed_and_eta(p)
    )
}

/// `Mirror    41%  1.2 MiB of 3.0 MiB  512.0 KiB/s  ETA 4s`
pub fn progress_plain(p: &MirrorProgress) -> String {
    format!(
        "{:<10}{}%  {} of {}{}",
        Stage::Mirror.name(),
        p.percent,
        human_bytes(p.done),
        human_bytes(p.total),
        speed_and_eta(p)
    )
}

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
                display.line(&format!(
                    "{name} is on demand: {message}. Start it with `kubectl scale modelserve/{name} -n {namespace} --replicas=1`"
                ));
            }
            Ok(())
        }
        Verdict::Failed {
            stage,
            reason,
            message,
        } => Err(Failure::new(format!(
            "the {stage} stage of {name} failed ({reason}): {message}"
        ))),
        Verdict::NotBuilt { stage, message } => Err(Failure::new(format!(
            "{name} stops at the {stage} stage: {message}"
        ))),
    }
}

fn print_json(ms: &ModelServe, output: Output) {
    if output == Output::Json {
        let status = serde_json::to_string_pretty(&ms.status).unwrap_or_else(|_| "null".into());
        println!("{status}");
    }
}

/// "the Mirror stage is Unknown (Mirroring): 41% (...)"
pub fn current_stage_text(status: &ModelServeStatus) -> String {
    let stage = status.stage.as_deref().unwrap_or("Resolve");
    let cond = Stage::ALL
        .iter()
        .find(|s| s.name() == stage)
        .and_then(|s| status.conditions.iter().find(|c| c.type_ == s.condition()));
    match cond {
        Some(c) => format!(
            "the {stage} stage is {} ({}): {}",
            c.status, c.reason, c.message
        ),
        None => format!("at the {stage} stage"),
    }
}

/// The closing lines of a ready model: the smoke test's reply and speed, and where it answers.
pub fn ready_summary(status: &ModelServeStatus) -> Vec<String> {
    let mut lines = Vec::new();
    if let Some(s) = &status.smoke {
        let mut facts = Vec::new();
        if let Some(n) = s.completion_tokens {
            facts.push(format!("{n} tokens"));
        }
        if let Some(t) = s.tokens_per_second {
            facts.push(format!("{t:.1} tokens/s"));
        }
        let facts = if facts.is_empty() {
            String::new()
        } else {
            format!(" ({})", facts.join(", "))
        };
        lines.push(format!("Smoke test reply: {:?}{facts}", s.reply.trim()));
    }
    let model = status
        .resolved
        .as_ref()
        .map(|r| format!(" as model {:?}", r.served_name))
        .unwrap_or_default();
    match &status.endpoint {
        Some(e) => lines.push(format!("Endpoint: {e}{model}")),
        None => lines.push(format!("Ready{model}")),
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{MirrorStatus, ModelServeSpec, SmokeStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

    fn cond(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
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
    fn model(generation: i64, stage: &str, given: &[(&str, &str)]) -> ModelServe {
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

    fn lines(updates: &[Update]) -> Vec<String> {
        updates
            .iter()
            .filter_map(|u| match u {
                Update::Stage(l) => Some(format!("{} {} {}", l.stage, l.status, l.reason)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn each_transition_is_one_line_in_pipeline_order_and_waiting_stages_are_quiet() {
        let mut f = Follower::new(1);
        let t = Instant::now();
        let u = f.observe(&model(1, "Resolve", &[("Unknown", "Resolving")]), t);
        assert_eq!(lines(&u), ["Resolve Unknown Resolving"]);
        let u = f.observe(
            &model(
                1,
                "Mirror",
                &[
                    ("True", "Resolved"),
                    ("True", "Checked"),
                    ("Unknown", "Mirroring"),
                ],
            ),
            t,
        );
        assert_eq!(
            lines(&u),
            [
                "Resolve True Resolved",
                "Check True Checked",
                "Mirror Unknown Mirroring"
            ]
        );
        let again = f.observe(
            &model(
                1,
                "Mirror",
                &[
                    ("True", "Resolved"),
                    ("True", "Checked"),
                    ("Unknown", "Mirroring"),
                ],
            ),
            t,
        );
        assert!(lines(&again).is_empty(), "nothing changed: {again:?}");
    }

    #[test]
    fn a_status_of_an_older_generation_is_not_reported() {
        let mut f = Follower::new(2);
        let old = model(1, "Resolve", &[("False", "NoMatchingQuant")]);
        assert!(
            f.observe(&old, Instant::now()).is_empty(),
            "the failure belongs to the spec before this apply"
        );
        let new = model(2, "Resolve", &[("True", "Resolved")]);
        assert_eq!(
            lines(&f.observe(&new, Instant::now())),
            ["Resolve True Resolved"]
        );
    }

    #[test]
    fn a_false_stage_ends_the_watch_with_its_message() {
        let ms = model(1, "Resolve", &[("False", "NoMatchingQuant")]);
        assert_eq!(
            verdict(ms.status.as_ref().unwrap()),
            Some(Verdict::Failed {
                stage: "Resolve".into(),
                reason: "NoMatchingQuant".into(),
                message: "Resolve NoMatchingQuant".into()
            })
        );
    }

    #[test]
    fn ready_true_ends_the_watch_and_on_demand_is_told_apart() {
        let mut ms = model(1, "Ready", &[("True", "Ok"); 6]);
        let st = ms.status.as_mut().unwrap();
        st.conditions[6] = cond(READY, "True", "AllStagesDone", "done");
        assert_eq!(verdict(st), Some(Verdict::Ready));
        st.conditions[6] = cond(READY, "True", "OnDemand", "replicas is 0");
        assert_eq!(
            verdict(st),
            Some(Verdict::OnDemand {
                message: "replicas is 0".into()
            })
        );
    }

    #[test]
    fn a_stage_not_built_ends_the_watch_instead_of_waiting_forever() {
        let ms = model(
            1,
            "Catalog",
            &[
                ("True", "a"),
                ("True", "b"),
                ("True", "c"),
                ("Unknown", "NotImplemented"),
            ],
        );
        assert!(matches!(
            verdict(ms.status.as_ref().unwrap()),
            Some(Verdict::NotBuilt { stage, .. }) if stage == "Catalog"
        ));
    }

    #[test]
    fn a_waiting_stage_is_not_a_verdict() {
        let ms = model(
            1,
            "Mirror",
            &[("True", "a"), ("True", "b"), ("Unknown", "Mirroring")],
        );
        assert_eq!(verdict(ms.status.as_ref().unwrap()), None);
    }

    #[test]
    fn mirror_progress_gets_a_speed_from_successive_observations() {
        let mut f = Follower::new(1);
        let t0 = Instant::now();
        let at = |done: i64| {
            let mut ms = model(
                1,
                "Mirror",
                &[("True", "a"), ("True", "b"), ("Unknown", "Mirroring")],
            );
            ms.status.as_mut().unwrap().mirror = Some(MirrorStatus {
                request: None,
                bytes_done: done,
                bytes_total: 10 << 20,
                percent: (done * 100 / (10 << 20)) as i32,
                files: vec![],
            });
            ms
        };
        let progress = |u: Vec<Update>| {
            u.into_iter()
                .find_map(|u| match u {
                    Update::Mirror(p) => Some(p),
                    _ => None,
                })
                .unwrap()
        };
        let first = progress(f.observe(&at(0), t0));
        assert_eq!(first.bytes_per_second, None, "one observation has no speed");
        let p = progress(f.observe(&at(2 << 20), t0 + Duration::from_secs(2)));
        assert_eq!(p.bytes_per_second, Some((1 << 20) as f64));
        assert_eq!(
            progress_plain(&p),
            "Mirror    20%  2.0 MiB of 10.0 MiB  1.0 MiB/s  ETA 8s"
        );
        assert_eq!(
            progress_bar(&p, 10),
            "Mirror    [==>       ]  20%  2.0 MiB / 10.0 MiB  1.0 MiB/s  ETA 8s"
        );
    }

    #[test]
    fn the_bar_is_full_at_100_percent() {
        let p = MirrorProgress {
            done: 10,
            total: 10,
            percent: 100,
            bytes_per_second: None,
        };
        assert_eq!(progress_bar(&p, 4), "Mirror    [====] 100%  10 B / 10 B");
    }

    #[test]
    fn a_plain_display_prints_progress_every_few_seconds_and_no_escape_codes() {
        let buf = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        struct Shared(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl Write for Shared {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut d = Display::new(Box::new(Shared(buf.clone())), false);
        let t0 = Instant::now();
        let p = |done| {
            Update::Mirror(MirrorProgress {
                done,
                total: 100,
                percent: done as i32,
                bytes_per_second: None,
            })
        };
        d.show(&p(10), t0);
        d.show(&p(20), t0 + Duration::from_secs(1));
        d.show(&p(30), t0 + Duration::from_secs(6));
        let text = String::from_utf8(buf.lock().unwrap().clone()).unwrap();
        assert_eq!(
            text,
            "Mirror    10%  10 B of 100 B\nMirror    30%  30 B of 100 B\n"
        );
    }

    #[test]
    fn the_ready_summary_gives_reply_speed_and_endpoint() {
        let status = ModelServeStatus {
            endpoint: Some("http://m.ns.svc:8080/v1".into()),
            smoke: Some(SmokeStatus {
                reply: "Hello there!\n".into(),
                tokens_per_second: Some(42.26),
                completion_tokens: Some(4),
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            ready_summary(&status),
            [
                "Smoke test reply: \"Hello there!\" (4 tokens, 42.3 tokens/s)",
                "Endpoint: http://m.ns.svc:8080/v1"
            ]
        );
    }

    #[test]
    fn durations_read_like_a_clock() {
        assert_eq!(duration_text(45), "45s");
        assert_eq!(duration_text(200), "3m20s");
        assert_eq!(duration_text(7500), "2h05m");
    }
}

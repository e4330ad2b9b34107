//! How a model's pods fail: OOMKilled, a crash loop, an image that cannot be pulled, each said
//! with the container, the exit and the kubelet's words.

use k8s_openapi::api::core::v1::{Container, ContainerStateTerminated, ContainerStatus, Pod};
use kube::ResourceExt;

/// Init containers first, as the kubelet runs them, then the others.
pub(super) fn statuses(pod: &Pod) -> impl Iterator<Item = (&'static str, &ContainerStatus)> {
    let s = pod.status.as_ref();
    let init = s
        .and_then(|s| s.init_container_statuses.as_ref())
        .into_iter()
        .flatten()
        .map(|c| ("init container", c));
    let main = s
        .and_then(|s| s.container_statuses.as_ref())
        .into_iter()
        .flatten()
        .map(|c| ("container", c));
    init.chain(main)
}

pub(super) fn spec_of<'a>(pod: &'a Pod, name: &str) -> Option<&'a Container> {
    let spec = pod.spec.as_ref()?;
    spec.init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .find(|c| c.name == name)
}

pub(super) fn waiting_reason(s: &ContainerStatus) -> Option<&str> {
    s.state.as_ref()?.waiting.as_ref()?.reason.as_deref()
}

/// The termination to report: the current one if the container is down, else the last.
pub(super) fn termination(s: &ContainerStatus) -> Option<&ContainerStateTerminated> {
    s.state
        .as_ref()
        .and_then(|st| st.terminated.as_ref())
        .or_else(|| s.last_state.as_ref()?.terminated.as_ref())
}

pub fn describe_exit(t: &ContainerStateTerminated) -> String {
    let mut s = format!("exit code {}", t.exit_code);
    if let Some(r) = t.reason.as_deref().filter(|r| !r.is_empty()) {
        s += &format!(" ({r})");
    }
    if let Some(m) = t.message.as_deref().map(telling).filter(|m| !m.is_empty()) {
        s += &format!(": {m}");
    }
    s
}

/// The most lines of a termination message said.
const TELLING_LINES: usize = 6;
/// The most bytes of one line said.
const TELLING_LINE: usize = 400;

/// What a termination message says, on one line. A container's log tail (its termination
/// message under FallbackToLogsOnError: up to 80 lines) is cut to its last six error lines
/// (llama.cpp's level E, or words that say one), or its last three lines when none is, each
/// without llama.cpp's time and level prefix, joined by " | ".
fn telling(message: &str) -> String {
    let lines: Vec<(&str, bool)> = message
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| {
            let (text, level) = unprefixed(l);
            (text, level == Some("E") || says_error(text))
        })
        .collect();
    let errors: Vec<&str> = lines.iter().filter(|l| l.1).map(|l| l.0).collect();
    let (chosen, most) = if errors.is_empty() {
        (lines.iter().map(|l| l.0).collect(), 3)
    } else {
        (errors, TELLING_LINES)
    };
    let from = chosen.len().saturating_sub(most);
    chosen[from..]
        .iter()
        .map(|l| crate::conditions::truncate(l, TELLING_LINE))
        .collect::<Vec<_>>()
        .join(" | ")
}

/// A log line without llama.cpp's prefix (`0.00.124.126 E `), and its level letter if it had one.
fn unprefixed(line: &str) -> (&str, Option<&str>) {
    let mut parts = line.splitn(3, ' ');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(time), Some(level), Some(rest))
            if time.contains('.')
                && time.bytes().all(|b| b.is_ascii_digit() || b == b'.')
                && level.len() == 1
                && level.bytes().all(|b| b.is_ascii_uppercase()) =>
        {
            (rest.trim_start(), Some(level))
        }
        _ => (line, None),
    }
}

/// Whether a log line's text (without its prefix) says an error.
fn says_error(text: &str) -> bool {
    let text = text.to_ascii_lowercase();
    [
        "error",
        "fail",
        "abort",
        "panic",
        "exception",
        "insufficient",
        "out of memory",
        "unable",
        "invalid",
    ]
    .iter()
    .any(|w| text.contains(w))
}

pub(super) fn oom_killed(pod: &Pod) -> Option<String> {
    statuses(pod).find_map(|(kind, s)| {
        let now = s.state.as_ref().and_then(|st| st.terminated.as_ref());
        let last = s.last_state.as_ref().and_then(|st| st.terminated.as_ref());
        let t = [now, last]
            .into_iter()
            .flatten()
            .find(|t| t.reason.as_deref() == Some("OOMKilled"))?;
        let limit = spec_of(pod, &s.name)
            .and_then(|c| c.resources.as_ref()?.limits.as_ref()?.get("memory"))
            .map(|q| q.0.clone());
        let at = match limit {
            Some(l) => format!("at its memory limit of {l}"),
            None => "with no memory limit set (the node ran out of memory)".to_string(),
        };
        Some(format!(
            "{kind} {} of {} was OOMKilled (exit code {}) {at}: the model needs more memory than the replica has; raise engine.resources memory or lower contextSize",
            s.name,
            pod.name_any(),
            t.exit_code
        ))
    })
}

pub(super) fn crash_loop(pod: &Pod, budget: i32) -> Option<String> {
    statuses(pod).find_map(|(kind, s)| {
        let backing_off = waiting_reason(s) == Some("CrashLoopBackOff");
        if !backing_off && s.restart_count <= budget {
            return None;
        }
        let times = if s.restart_count == 1 {
            "time"
        } else {
            "times"
        };
        let mut m = format!(
            "{kind} {} of {} keeps crashing: restarted {} {times}",
            s.name,
            pod.name_any(),
            s.restart_count
        );
        if backing_off {
            m += ", now in CrashLoopBackOff";
        }
        if let Some(t) = termination(s) {
            m += &format!("; last {}", describe_exit(t));
        }
        Some(m)
    })
}

pub(super) fn image_pull(pod: &Pod) -> Option<String> {
    statuses(pod).find_map(|(kind, s)| {
        let w = s.state.as_ref()?.waiting.as_ref()?;
        let reason = w.reason.as_deref()?;
        // ErrImagePull alone is a first failure the kubelet retries; the back-off is not.
        if !matches!(
            reason,
            "ImagePullBackOff" | "InvalidImageName" | "ErrImageNeverPull"
        ) {
            return None;
        }
        let mut m = format!(
            "{kind} {} of {} cannot pull its image {}: {reason}",
            s.name,
            pod.name_any(),
            s.image
        );
        if let Some(msg) = w.message.as_deref().filter(|m| !m.is_empty()) {
            m += &format!(": {msg}");
        }
        Some(m)
    })
}

#[cfg(test)]
mod tests {
    use super::super::testing::*;
    use super::super::verdict::Verdict;
    use super::telling;
    use serde_json::json;

    #[test]
    fn crash_loop_back_off_fails_with_the_last_exit() {
        let v = judge(&[fixture(CRASHLOOP)], 20);
        let Verdict::CrashLoop(m) = &v else {
            panic!("{v:?}")
        };
        assert!(
            m.starts_with("container llama-server of m-6f4bd78f57-7j8qg keeps crashing: restarted 8 times, now in CrashLoopBackOff; last exit code 1 (Error): error loading model"),
            "{m}"
        );
    }

    #[test]
    fn restarts_past_the_budget_are_a_crash_loop_even_while_running() {
        let running = json!({"running": {"startedAt": "2026-11-29T20:01:00Z"}});
        let at_budget = pod("m-a", "rs", Some("n"), main_status(running.clone(), 3));
        assert!(matches!(judge(&[at_budget], 60), Verdict::Progress(_)));
        let mut past = main_status(running, 4);
        past["containerStatuses"][0]["lastState"] =
            json!({"terminated": {"exitCode": 139, "reason": "Error"}});
        let v = judge(&[pod("m-a", "rs", Some("n"), past)], 60);
        let Verdict::CrashLoop(m) = &v else {
            panic!("{v:?}")
        };
        assert_eq!(
            m,
            "container llama-server of m-a keeps crashing: restarted 4 times; last exit code 139 (Error)"
        );
    }

    #[test]
    fn oom_killed_in_the_last_state_names_the_container_and_its_limit() {
        let v = judge(&[fixture(OOMKILLED)], 20);
        let Verdict::OomKilled(m) = &v else {
            panic!("{v:?}")
        };
        assert!(
            m.starts_with("container llama-server of m-6f4bd78f57-57ftm was OOMKilled (exit code 137) at its memory limit of 1Gi"),
            "{m}"
        );
    }

    #[test]
    fn oom_killed_right_now_is_reported_before_any_restart() {
        let state = json!({"terminated": {"exitCode": 137, "reason": "OOMKilled"}});
        let v = judge(&[pod("m-a", "rs", Some("n"), main_status(state, 0))], 10);
        let Verdict::OomKilled(m) = &v else {
            panic!("{v:?}")
        };
        assert!(
            m.contains("llama-server of m-a") && m.contains("limit of 8Gi"),
            "{m}"
        );
    }

    #[test]
    fn a_failing_init_container_is_a_crash_loop_naming_it() {
        let v = judge(&[fixture(INIT_CRASHLOOP)], 20);
        let Verdict::CrashLoop(m) = &v else {
            panic!("{v:?}")
        };
        assert!(
            m.starts_with("init container pull of m-6f4bd78f57-v76ff keeps crashing: restarted 5 times, now in CrashLoopBackOff; last exit code 1 (Error): pull failed"),
            "{m}"
        );
    }

    #[test]
    fn a_log_tail_is_said_by_its_error_lines_without_their_prefix() {
        // The end of llama-server's log when a GPU has too little free memory (b11312's words).
        let tail = "0.00.120.001 I load_tensors: loading model tensors, this can take a while... (mmap = true)
0.00.121.310 E ggml_backend_cuda_buffer_type_alloc_buffer: allocating 21504.00 MiB on device 0: cudaMalloc failed: out of memory
0.00.121.311 E alloc_tensor_range: failed to allocate CUDA0 buffer of size 22548578304
0.00.124.100 E llama_model_load: error loading model: unable to allocate CUDA0 buffer
0.00.124.101 E llama_model_load_from_file_impl: failed to load model
0.00.124.200 I srv    operator(): operator(): cleaning up before exit...
";
        assert_eq!(
            telling(tail),
            "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 21504.00 MiB on device 0: cudaMalloc failed: out of memory | alloc_tensor_range: failed to allocate CUDA0 buffer of size 22548578304 | llama_model_load: error loading model: unable to allocate CUDA0 buffer | llama_model_load_from_file_impl: failed to load model"
        );
        // No line says error: the last three, as they are.
        let quiet = "a\nb\n\nc\nd\n";
        assert_eq!(telling(quiet), "b | c | d");
        // One line is said whole; a flood is cut to the last six error lines, each bounded.
        assert_eq!(telling("  error loading model  "), "error loading model");
        let flood: String = (0..80)
            .map(|i| format!("error {i} {}\n", "x".repeat(2000)))
            .collect();
        let said = telling(&flood);
        assert_eq!(said.matches(" | ").count(), 5);
        assert!(
            said.starts_with("error 74 ") && said.len() < 6 * 410,
            "{}",
            said.len()
        );
    }

    #[test]
    fn an_image_that_cannot_be_pulled_fails_with_the_kubelets_words() {
        let state = json!({"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image \"srv:1\""}});
        let v = judge(&[pod("m-a", "rs", Some("n"), main_status(state, 0))], 10);
        assert_eq!(
            v,
            Verdict::ImagePull(
                "container llama-server of m-a cannot pull its image srv:1: ImagePullBackOff: Back-off pulling image \"srv:1\"".into()
            )
        );
    }
}

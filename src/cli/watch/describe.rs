//! How a watch puts what it saw into words: the line of a stage, the progress line or the tail of
//! the progress bar, and the closing summary. Everything from the API server passes through
//! [`shown`] first, so a message of any length or content stays one line of bounded size.

use crate::api::ModelServeStatus;
use crate::cli::text::{MESSAGE_CHARS, NAME_CHARS, WORD_CHARS, shown};
use crate::cli::watch::decide::{MirrorProgress, StageLine};
use crate::cli::watch::observe;
use crate::pipeline::Stage;
use crate::units::human_bytes;

/// The stage column: as wide as the longest stage name, plus room.
pub const STAGE_WIDTH: usize = 10;

/// An ETA past this many seconds says only that it is far off.
const FAR_OFF: u64 = 86_400;

/// `Check     True     Checked          llama, 1.2 GiB per replica`; the status coloured when
/// `color` (green True, red False, yellow otherwise).
pub fn stage_text(l: &StageLine, color: bool) -> String {
    let status = shown(&l.status, WORD_CHARS);
    let padded = format!("{status:<8}");
    let status = if color {
        let code = match status.as_str() {
            "True" => "32",
            "False" => "31",
            _ => "33",
        };
        format!("\x1b[{code}m{padded}\x1b[0m")
    } else {
        padded
    };
    format!(
        "{:<STAGE_WIDTH$}{status} {:<16} {}",
        shown(&l.stage, WORD_CHARS),
        shown(&l.reason, WORD_CHARS),
        shown(&l.message, MESSAGE_CHARS)
    )
}

/// `  2.0 MiB/s  ETA 8s`, `  stalled`, or nothing before a speed is known.
fn speed_and_eta(p: &MirrorProgress) -> String {
    match p.bytes_per_second {
        Some(r) if r >= 1.0 => {
            let left = (p.total.saturating_sub(p.done) as f64 / r).ceil();
            // `as` saturates: an absurd total gives u64::MAX, which reads as far off.
            let left = left as u64;
            let eta = if left > FAR_OFF {
                format!(">{}", duration_text(FAR_OFF))
            } else {
                duration_text(left)
            };
            format!("  {}/s  ETA {eta}", human_bytes(r as u64))
        }
        Some(_) => "  stalled".into(),
        None => String::new(),
    }
}

/// What the progress bar shows after the bar: ` 41%  1.2 MiB / 3.0 MiB  512.0 KiB/s  ETA 4s`.
pub fn bar_tail(p: &MirrorProgress) -> String {
    format!(
        "{:>3}%  {} / {}{}",
        p.percent,
        human_bytes(p.done),
        human_bytes(p.total),
        speed_and_eta(p)
    )
}

/// `Mirror    41%  1.2 MiB of 3.0 MiB  512.0 KiB/s  ETA 4s`
pub fn progress_plain(p: &MirrorProgress) -> String {
    format!(
        "{:<STAGE_WIDTH$}{}%  {} of {}{}",
        Stage::Mirror.name(),
        p.percent,
        human_bytes(p.done),
        human_bytes(p.total),
        speed_and_eta(p)
    )
}

/// A duration for people: 45s, 3m20s, 2h05m.
pub fn duration_text(secs: u64) -> String {
    match secs {
        0..60 => format!("{secs}s"),
        60..3600 => format!("{}m{:02}s", secs / 60, secs % 60),
        _ => format!("{}h{:02}m", secs / 3600, secs % 3600 / 60),
    }
}

/// "the Mirror stage is Unknown (Mirroring): 41% (...)"
pub fn current_stage_text(status: &ModelServeStatus) -> String {
    let Some(stage) = status.stage.as_deref() else {
        return "the controller has not named a stage yet".into();
    };
    let cond = Stage::ALL
        .iter()
        .find(|s| s.name() == stage)
        .and_then(|s| observe::condition(status, s.condition()));
    let stage = shown(stage, WORD_CHARS);
    match cond {
        Some(c) => format!(
            "the {stage} stage is {} ({}): {}",
            shown(&c.status, WORD_CHARS),
            shown(&c.reason, WORD_CHARS),
            shown(&c.message, MESSAGE_CHARS)
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
        if let Some(t) = s.tokens_per_second.filter(|t| t.is_finite()) {
            facts.push(format!("{t:.1} tokens/s"));
        }
        let facts = if facts.is_empty() {
            String::new()
        } else {
            format!(" ({})", facts.join(", "))
        };
        lines.push(format!(
            "Smoke test reply: {:?}{facts}",
            shown(&s.reply, MESSAGE_CHARS)
        ));
    }
    let model = status
        .resolved
        .as_ref()
        .map(|r| format!(" as model {:?}", shown(&r.served_name, NAME_CHARS)))
        .unwrap_or_default();
    match &status.endpoint {
        Some(e) => lines.push(format!("Endpoint: {}{model}", shown(e, NAME_CHARS))),
        None => lines.push(format!("Ready{model}")),
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::SmokeStatus;

    fn progress(done: u64, total: u64, percent: u8, rate: Option<f64>) -> MirrorProgress {
        MirrorProgress {
            done,
            total,
            percent,
            bytes_per_second: rate,
        }
    }

    #[test]
    fn progress_reads_with_speed_and_time_left() {
        let p = progress(2 << 20, 10 << 20, 20, Some((1 << 20) as f64));
        assert_eq!(
            progress_plain(&p),
            "Mirror    20%  2.0 MiB of 10.0 MiB  1.0 MiB/s  ETA 8s"
        );
        assert_eq!(bar_tail(&p), " 20%  2.0 MiB / 10.0 MiB  1.0 MiB/s  ETA 8s");
        assert_eq!(bar_tail(&progress(10, 10, 100, None)), "100%  10 B / 10 B");
        assert_eq!(
            progress_plain(&progress(1, 2, 50, Some(0.5))),
            "Mirror    50%  1 B of 2 B  stalled"
        );
    }

    #[test]
    fn an_absurd_total_gives_a_far_off_eta_not_an_overflow() {
        let p = progress(0, u64::MAX, 0, Some(1.0));
        assert!(bar_tail(&p).ends_with("ETA >24h00m"), "{}", bar_tail(&p));
        let p = progress(u64::MAX, 1, 100, Some(f64::MAX));
        assert!(bar_tail(&p).ends_with("ETA 0s"), "{}", bar_tail(&p));
    }

    #[test]
    fn a_stage_line_keeps_a_huge_message_on_one_bounded_line() {
        let l = StageLine {
            stage: "Check".into(),
            status: "False".into(),
            reason: "TooBig".into(),
            message: format!("слишком {}\nвелико", "б".repeat(10_000)),
        };
        let text = stage_text(&l, false);
        assert!(!text.contains('\n'));
        assert!(text.starts_with("Check     False    TooBig           слишком ббб"));
        assert!(text.ends_with('…'));
        assert!(text.chars().count() < MESSAGE_CHARS + 40, "{}", text.len());
        assert_eq!(
            stage_text(&l, true)
                .matches("\x1b[31mFalse   \x1b[0m")
                .count(),
            1
        );
    }

    #[test]
    fn a_status_with_no_stage_or_conditions_is_said_so() {
        assert_eq!(
            current_stage_text(&ModelServeStatus::default()),
            "the controller has not named a stage yet"
        );
        let status = ModelServeStatus {
            stage: Some("Mirror".into()),
            ..Default::default()
        };
        assert_eq!(current_stage_text(&status), "at the Mirror stage");
        let status = ModelServeStatus {
            stage: Some("\x1b[2Jx".repeat(100)),
            ..Default::default()
        };
        assert!(!current_stage_text(&status).contains('\x1b'));
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
        assert_eq!(duration_text(u64::MAX), "5124095576030431h00m");
    }
}

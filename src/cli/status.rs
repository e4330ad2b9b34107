//! `modelserve status NAME`: the stage table of one ModelServe and what its stages found; with
//! `--watch`, follows it as `serve` does.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::api::{ModelServe, ModelServeStatus};
use crate::cli::text::{MESSAGE_CHARS, NAME_CHARS, WORD_CHARS, shown};
use crate::cli::watch::{self, Display};
use crate::cli::{Failure, Output, cluster, program_name};
use crate::pipeline::Stage;
use crate::units::human_bytes;

/// Flags of `modelserve status`.
#[derive(Clone, Debug, clap::Args)]
pub struct Args {
    /// Name of the ModelServe.
    pub name: String,
    /// Namespace (default: the kubeconfig context's, else default).
    #[arg(long, short = 'n')]
    pub namespace: Option<String>,
    /// Follow the stages until the model is ready or a stage fails, as `serve` does.
    #[arg(long, short = 'w')]
    pub watch: bool,
    /// Output format: the table, or the status as JSON.
    #[arg(long, short = 'o', value_enum, default_value = "text")]
    pub output: Output,
    /// With --watch, stop after this long (90s, 30m, 2h).
    #[arg(long, requires = "watch", value_parser = crate::units::parse_duration)]
    pub timeout: Option<Duration>,
}

/// Prints the status, or follows it.
pub async fn run(args: Args) -> Result<(), Failure> {
    let cluster = cluster::connect().await?;
    let (namespace, api) = cluster.models(args.namespace.as_deref()).await?;
    let name = &args.name;
    let Some(ms) = api
        .get_opt(name)
        .await
        .map_err(|e| cluster.explain(e, &format!("read ModelServe {namespace}/{name}")))?
    else {
        return Err(Failure::new(format!(
            "there is no ModelServe {name:?} in namespace {namespace}; `{} list -n {namespace}` shows the ones there are",
            program_name()
        )));
    };
    if args.watch {
        let generation = ms.metadata.generation.unwrap_or(1);
        let mut display = Display::for_output(args.output);
        let outcome = watch::follow(&api, name, generation, &mut display, args.timeout).await;
        return watch::conclude(
            outcome,
            name,
            &namespace,
            &mut display,
            args.output,
            args.timeout,
        );
    }
    match args.output {
        Output::Json => {
            let text = serde_json::to_string_pretty(&ms.status)
                .map_err(|e| Failure::new(format!("cannot print the status: {e}")))?;
            println!("{text}");
        }
        Output::Text => print!("{}", render(&ms, Timestamp::now())),
    }
    Ok(())
}

/// The status page of one ModelServe; everything the server wrote passes through [`shown`].
pub fn render(ms: &ModelServe, now: Timestamp) -> String {
    let status = ms.status.clone().unwrap_or_default();
    let spec = &ms.spec;
    let mut s = String::new();
    let field = |s: &mut String, k: &str, v: String| s.push_str(&format!("{k:<12}{v}\n"));
    field(
        &mut s,
        "Name:",
        format!(
            "{}/{}",
            shown(
                ms.metadata.namespace.as_deref().unwrap_or_default(),
                NAME_CHARS
            ),
            shown(ms.metadata.name.as_deref().unwrap_or_default(), NAME_CHARS)
        ),
    );
    let choice = match (&spec.file, &spec.quant) {
        (Some(f), _) => format!("file {}", shown(f, NAME_CHARS)),
        (None, _) => format!("quant {}", shown(spec.quant(), WORD_CHARS)),
    };
    field(
        &mut s,
        "Repo:",
        format!(
            "{} (revision {}, {choice})",
            shown(&spec.repo, NAME_CHARS),
            shown(spec.revision(), NAME_CHARS)
        ),
    );
    let observed = match (status.observed_generation, ms.metadata.generation) {
        (Some(o), Some(g)) if o < g => format!(" (status describes generation {o} of {g})"),
        (None, _) => " (the controller has not looked at it yet)".into(),
        _ => String::new(),
    };
    field(
        &mut s,
        "Stage:",
        format!(
            "{}{}{observed}",
            shown(status.stage.as_deref().unwrap_or("-"), WORD_CHARS),
            // status.progress is the mirror's; after the Mirror stage it only says 100%.
            status
                .progress
                .as_deref()
                .filter(|_| status.stage.as_deref() == Some(Stage::Mirror.name()))
                .map(|p| format!(" {}", shown(p, WORD_CHARS)))
                .unwrap_or_default()
        ),
    );
    field(
        &mut s,
        "Ready:",
        status
            .ready
            .as_deref()
            .map(|r| shown(r, WORD_CHARS))
            .unwrap_or_else(|| format!("0/{}", spec.replicas)),
    );
    s.push('\n');

    let mut rows = vec![vec![
        "STAGE".to_string(),
        "STATUS".into(),
        "REASON".into(),
        "AGE".into(),
        "MESSAGE".into(),
    ]];
    for (stage, _, c) in watch::observe::conditions(&status) {
        rows.push(vec![
            stage.to_string(),
            shown(&c.status, WORD_CHARS),
            shown(&c.reason, WORD_CHARS),
            age(Some(&c.last_transition_time), now),
            shown(&c.message, MESSAGE_CHARS),
        ]);
    }
    if rows.len() == 1 {
        s.push_str("No stage has run yet: is the modelserve controller running?\n");
    } else {
        s.push_str(&table(&rows));
    }
    s.push('\n');
    s.push_str(&findings(&status));
    s
}

/// The most files of the mirror listed one by one.
const MAX_FILES: usize = 20;

/// What the stages found: resolved set, check, mirror, smoke test, endpoint.
fn findings(status: &ModelServeStatus) -> String {
    let mut s = String::new();
    let field = |s: &mut String, k: &str, v: String| s.push_str(&format!("{k:<12}{v}\n"));
    if let Some(r) = &status.resolved {
        field(
            &mut s,
            "Resolved:",
            format!(
                "{}{} at commit {}, {} in {} file(s), served as {:?}",
                shown(&r.set, NAME_CHARS),
                r.quant
                    .as_deref()
                    .map(|q| format!(" ({})", shown(q, WORD_CHARS)))
                    .unwrap_or_default(),
                shown(&r.commit, WORD_CHARS),
                human_bytes(u64::try_from(r.total_bytes).unwrap_or(0)),
                r.files.len(),
                shown(&r.served_name, NAME_CHARS)
            ),
        );
    }
    if let Some(c) = &status.check {
        let word = |v: &Option<String>| shown(v.as_deref().unwrap_or("?"), WORD_CHARS);
        let mut v = format!(
            "{} (loads from {}, nodes run {})",
            word(&c.architecture),
            word(&c.first_build),
            word(&c.engine_build),
        );
        if let Some(m) = &c.memory {
            v += &format!("; {} per replica", shown(m, WORD_CHARS));
        }
        if let Some(b) = &c.basis {
            v += &format!(": {}", shown(b, MESSAGE_CHARS));
        }
        field(&mut s, "Check:", v);
    }
    if let Some(m) = &status.mirror {
        field(
            &mut s,
            "Mirror:",
            format!(
                "{}% ({} of {})",
                watch::observe::clamp_percent(m.percent),
                human_bytes(u64::try_from(m.bytes_done).unwrap_or(0)),
                human_bytes(u64::try_from(m.bytes_total).unwrap_or(0))
            ),
        );
        // A listing of thousands of files says how many more there are after the first ones.
        for f in m.files.iter().take(MAX_FILES) {
            s.push_str(&format!(
                "{:<12}  {}  {}  {}\n",
                "",
                shown(&f.path, NAME_CHARS),
                shown(&f.state, WORD_CHARS),
                human_bytes(u64::try_from(f.bytes_done).unwrap_or(0))
            ));
        }
        if let Some(more) = m.files.len().checked_sub(MAX_FILES).filter(|&n| n > 0) {
            s.push_str(&format!("{:<12}  and {more} more file(s)\n", ""));
        }
    }
    if let Some(p) = &status.placement {
        field(
            &mut s,
            "Placement:",
            format!(
                "pod {} on {} at {}",
                shown(&p.pod, NAME_CHARS),
                shown(p.node.as_deref().unwrap_or("?"), NAME_CHARS),
                shown(&p.address, NAME_CHARS)
            ),
        );
    }
    if status.smoke.is_some() || status.endpoint.is_some() {
        for line in watch::ready_summary(status) {
            let (k, v) = line.split_once(": ").unwrap_or(("", &line));
            let k = match k {
                "Smoke test reply" => "Smoke:",
                "Endpoint" => "Endpoint:",
                _ => "",
            };
            field(&mut s, k, v.to_string());
        }
    }
    s
}

/// Rows as columns three spaces apart, like kubectl's tables.
pub fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            line.push_str(cell);
            if i + 1 < row.len() {
                let width = widths.get(i).copied().unwrap_or(0);
                let pad = width.saturating_sub(cell.chars().count()) + 3;
                line.push_str(&" ".repeat(pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Time since `t` as kubectl prints ages: 45s, 3m20s, 42m, 5h10m, 30h, 3d4h, 12d.
pub fn age(t: Option<&Time>, now: Timestamp) -> String {
    let Some(t) = t else {
        return "<unknown>".into();
    };
    let secs = (now.as_second() - t.0.as_second()).max(0);
    let (m, h, d) = (secs / 60, secs / 3600, secs / 86400);
    match secs {
        s if s < 120 => format!("{s}s"),
        s if s < 600 && s % 60 != 0 => format!("{m}m{}s", s % 60),
        s if s < 3 * 3600 => format!("{m}m"),
        s if s < 8 * 3600 && m % 60 != 0 => format!("{h}h{}m", m % 60),
        s if s < 48 * 3600 => format!("{h}h"),
        s if s < 8 * 86400 && h % 24 != 0 => format!("{d}d{}h", h % 24),
        _ => format!("{d}d"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{MirrorFileStatus, MirrorStatus, ModelServeSpec, ResolvedStatus};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;

    fn at(s: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + s).unwrap()
    }

    #[test]
    fn ages_read_like_kubectl() {
        let t = Time(at(0));
        assert_eq!(age(Some(&t), at(45)), "45s");
        assert_eq!(age(Some(&t), at(200)), "3m20s");
        assert_eq!(age(Some(&t), at(42 * 60)), "42m");
        assert_eq!(age(Some(&t), at(5 * 3600 + 600)), "5h10m");
        assert_eq!(age(Some(&t), at(30 * 3600)), "30h");
        assert_eq!(age(Some(&t), at(3 * 86400 + 4 * 3600)), "3d4h");
        assert_eq!(age(Some(&t), at(12 * 86400)), "12d");
        assert_eq!(age(None, at(0)), "<unknown>");
    }

    #[test]
    fn tables_align_columns_without_trailing_spaces() {
        let rows = vec![
            vec!["A".to_string(), "BB".into(), "C".into()],
            vec!["aaaa".to_string(), "b".into(), "".into()],
        ];
        assert_eq!(table(&rows), "A      BB   C\naaaa   b\n");
    }

    #[test]
    fn the_status_page_has_the_stage_table_and_the_findings() {
        let spec: ModelServeSpec =
            serde_json::from_value(serde_json::json!({"repo": "acme/Tiny-GGUF"})).unwrap();
        let mut ms = ModelServe::new("tiny", spec);
        ms.metadata.namespace = Some("ns".into());
        ms.metadata.generation = Some(1);
        let c = |t: &str, st: &str, r: &str, m: &str| Condition {
            type_: t.into(),
            status: st.into(),
            reason: r.into(),
            message: m.into(),
            observed_generation: Some(1),
            last_transition_time: Time(at(0)),
        };
        ms.status = Some(ModelServeStatus {
            observed_generation: Some(1),
            stage: Some("Mirror".into()),
            progress: Some("50%".into()),
            ready: Some("0/1".into()),
            conditions: vec![
                c("Resolved", "True", "Resolved", "Q4_K_M, 2.0 MiB in 1 file"),
                c(
                    "Mirrored",
                    "Unknown",
                    "Mirroring",
                    "50%\n(1.0 MiB of 2.0 MiB)",
                ),
            ],
            resolved: Some(ResolvedStatus {
                request: "r".into(),
                commit: "c0ffee".into(),
                set: "tiny-Q4_K_M.gguf".into(),
                quant: Some("Q4_K_M".into()),
                files: vec![],
                total_bytes: 2 << 20,
                served_name: "tiny".into(),
            }),
            mirror: Some(MirrorStatus {
                bytes_per_second: None,
                eta_seconds: None,
                request: None,
                bytes_done: 1 << 20,
                bytes_total: 2 << 20,
                percent: 50,
                files: vec![MirrorFileStatus {
                    path: "tiny-Q4_K_M.gguf".into(),
                    state: "downloading".into(),
                    bytes_done: 1 << 20,
                }],
            }),
            ..Default::default()
        });
        let page = render(&ms, at(90));
        assert_eq!(
            page,
            "\
Name:       ns/tiny
Repo:       acme/Tiny-GGUF (revision main, quant Q4_K_M)
Stage:      Mirror 50%
Ready:      0/1

STAGE     STATUS    REASON      AGE   MESSAGE
Resolve   True      Resolved    90s   Q4_K_M, 2.0 MiB in 1 file
Mirror    Unknown   Mirroring   90s   50% (1.0 MiB of 2.0 MiB)

Resolved:   tiny-Q4_K_M.gguf (Q4_K_M) at commit c0ffee, 2.0 MiB in 0 file(s), served as \"tiny\"
Mirror:     50% (1.0 MiB of 2.0 MiB)
              tiny-Q4_K_M.gguf  downloading  1.0 MiB
"
        );
    }

    #[test]
    fn a_hostile_status_still_gives_a_bounded_page() {
        let spec: ModelServeSpec =
            serde_json::from_value(serde_json::json!({"repo": "acme/Tiny-GGUF"})).unwrap();
        let mut ms = ModelServe::new("tiny", spec);
        ms.status = Some(ModelServeStatus::default());
        let page = render(&ms, at(0));
        assert!(
            page.contains("No stage has run yet: is the modelserve controller running?"),
            "{page}"
        );
        ms.status = Some(ModelServeStatus {
            stage: Some("Mirror\x1b[2J".into()),
            progress: Some("9".repeat(10_000)),
            conditions: vec![Condition {
                type_: "Mirrored".into(),
                status: "Unknown".into(),
                reason: "Mirroring".into(),
                message: "щ".repeat(10_000),
                observed_generation: None,
                last_transition_time: Time(at(0)),
            }],
            mirror: Some(MirrorStatus {
                bytes_per_second: None,
                eta_seconds: None,
                request: None,
                bytes_done: -7,
                bytes_total: i64::MAX,
                percent: 1000,
                files: (0..5000)
                    .map(|i| MirrorFileStatus {
                        path: format!("f{i}.gguf"),
                        state: "queued".into(),
                        bytes_done: 0,
                    })
                    .collect(),
            }),
            ..Default::default()
        });
        let page = render(&ms, at(0));
        assert!(!page.contains('\x1b'), "no escape codes reach the terminal");
        assert!(page.contains("\nMirror:     100% (0 B of "), "{page}");
        assert!(page.contains("and 4980 more file(s)"));
        assert!(page.lines().count() < 50, "{} lines", page.lines().count());
        assert!(
            page.lines()
                .all(|l| l.chars().count() <= MESSAGE_CHARS + 60),
            "every line is bounded"
        );
        let row = page.lines().find(|l| l.starts_with("Mirror  ")).unwrap();
        assert!(row.ends_with('…'), "{row}");
    }
}

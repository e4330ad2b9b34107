//! The command-line side: commands people run against a registry or a cluster.

pub mod ask;
pub mod cluster;
pub mod estimate;
pub mod list;
pub mod plan;
pub mod serve;
pub mod status;
pub mod text;
pub mod watch;

use std::process::ExitCode;

/// Which model of the registry a command is about: flags `serve` and `plan` share.
#[derive(Clone, Debug, clap::Args)]
pub struct Target {
    /// Repository on the registry, as owner/name (for example bartowski/Qwen2.5-7B-Instruct-GGUF).
    pub repo: String,
    /// Quantisation to serve (default Q4_K_M), matched as a whole token of the file names.
    #[arg(long, conflicts_with = "file")]
    pub quant: Option<String>,
    /// A GGUF file path or shard-set name to serve instead of choosing by quant.
    #[arg(long)]
    pub file: Option<String>,
    /// Branch, tag or commit (default main); pinned to a commit once resolved.
    #[arg(long)]
    pub revision: Option<String>,
}

/// How a command prints its result.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// Exit code of a command that failed, or of a model whose stage failed.
pub const EXIT_FAILED: u8 = 1;
/// Exit code of a command line that could not be parsed.
pub const EXIT_USAGE: u8 = 2;
/// Exit code after Ctrl-C stopped watching (128 + SIGINT, as shells report it).
pub const EXIT_INTERRUPTED: u8 = 130;

/// Why a cluster command failed: one line for people, and the exit code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub message: String,
    pub code: u8,
}

impl Failure {
    /// A failure with exit code 1.
    pub fn new(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            code: EXIT_FAILED,
        }
    }

    /// A failure of the command line itself (exit code 2).
    pub fn usage(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            code: EXIT_USAGE,
        }
    }
}

/// Prints a failure as one line on stderr and turns the result into the process's exit code.
pub fn finish(result: Result<(), Failure>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("{}: {}", program_name(), f.message);
            ExitCode::from(f.code)
        }
    }
}

/// How the user invoked us: `kubectl modelserve` when run as the kubectl plugin
/// (installed or linked as `kubectl-modelserve`), else `modelserve`.
pub fn program_name() -> &'static str {
    let argv0 = std::env::args_os().next().unwrap_or_default();
    program_name_for(&argv0.to_string_lossy())
}

fn program_name_for(argv0: &str) -> &'static str {
    let base = argv0.rsplit(['/', '\\']).next().unwrap_or(argv0);
    if base.starts_with("kubectl-") {
        "kubectl modelserve"
    } else {
        "modelserve"
    }
}

/// Reports a command line clap refused: help and version as clap prints them, an error as one
/// line naming what was wrong and where to read more.
pub fn usage_error(e: clap::Error, cmd: &clap::Command) -> ExitCode {
    use clap::error::ErrorKind;
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = e.print();
        return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(EXIT_USAGE));
    }
    // Errors without a usage line (an invalid value) still name the subcommand that was run.
    let sub = std::env::args()
        .skip(1)
        .find(|a| !a.starts_with('-'))
        .filter(|a| cmd.find_subcommand(a).is_some());
    let command = match sub {
        Some(sub) => format!("{} {sub}", program_name()),
        None => program_name().to_string(),
    };
    eprintln!("{}", one_line_usage(&e.render().to_string(), &command));
    ExitCode::from(EXIT_USAGE)
}

/// clap's multi-line error as one line: the error and its details, then the command's --help.
fn one_line_usage(rendered: &str, command: &str) -> String {
    let mut parts = Vec::new();
    let mut command = command.to_string();
    for line in rendered.lines() {
        let line = line.trim();
        if let Some(usage) = line.strip_prefix("Usage: ") {
            // "Usage: modelserve serve [OPTIONS] <REPO>" names the command that refused.
            let words: Vec<&str> = usage
                .split_whitespace()
                .take_while(|w| !w.starts_with(['[', '<', '-']))
                .collect();
            if !words.is_empty() {
                command = words.join(" ");
            }
            break;
        }
        if line.starts_with("For more information") {
            break;
        }
        if line.is_empty() || line.starts_with("tip:") {
            continue;
        }
        parts.push(line.strip_prefix("error: ").unwrap_or(line).to_string());
    }
    format!(
        "{command}: {}; see `{command} --help`",
        parts.join(" ").trim_end_matches(['.', ' '])
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kubectl_plugin_name_comes_from_argv0() {
        assert_eq!(
            program_name_for("/usr/local/bin/kubectl-modelserve"),
            "kubectl modelserve"
        );
        assert_eq!(program_name_for("kubectl-modelserve"), "kubectl modelserve");
        assert_eq!(program_name_for("./target/debug/modelserve"), "modelserve");
    }

    #[test]
    fn a_clap_error_becomes_one_line_naming_the_command() {
        let rendered = "error: unexpected argument '--bogus' found\n\n  tip: to pass '--bogus' as a value, use '-- --bogus'\n\nUsage: modelserve serve [OPTIONS] <REPO>\n\nFor more information, try '--help'.\n";
        assert_eq!(
            one_line_usage(rendered, "modelserve"),
            "modelserve serve: unexpected argument '--bogus' found; see `modelserve serve --help`"
        );
        let rendered = "error: invalid value 'yaml' for '--output <OUTPUT>'\n  [possible values: text, json]\n\nFor more information, try '--help'.\n";
        assert_eq!(
            one_line_usage(rendered, "kubectl modelserve serve"),
            "kubectl modelserve serve: invalid value 'yaml' for '--output <OUTPUT>' [possible values: text, json]; see `kubectl modelserve serve --help`"
        );
        let rendered = "error: the following required arguments were not provided:\n  <REPO>\n\nUsage: kubectl modelserve serve <REPO>\n\nFor more information, try '--help'.\n";
        assert_eq!(
            one_line_usage(rendered, "kubectl modelserve"),
            "kubectl modelserve serve: the following required arguments were not provided: <REPO>; see `kubectl modelserve serve --help`"
        );
    }
}

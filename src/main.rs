use std::process::ExitCode;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};
use modelserve::telemetry::{self, LogFormat};

/// Serve a GGUF model from a Hugging Face repository on Kubernetes with llama.cpp.
#[derive(Parser)]
#[command(name = "modelserve", version, about)]
struct Cli {
    /// Log format.
    #[arg(
        long,
        global = true,
        value_enum,
        default_value = "human",
        env = "MODELSERVE_LOG_FORMAT"
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start: the controller's many flags make its variant large, which costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Run the ModelServe controller.
    Controller(modelserve::controller::Config),
    /// Print the ModelServe CustomResourceDefinition as YAML.
    Crd,
    /// Run the verifying model mirror.
    Mirror(modelserve::mirror::Config),
    /// Run the OpenAI-compatible gateway: routes by model name, loads on-demand models on their first request.
    Gateway(modelserve::gateway::Config),
    /// Copy a model's files from the mirror and verify them (the replicas' init container).
    Pull(modelserve::pull::Args),
    /// Show what a repository resolves to, without a cluster.
    Plan(modelserve::cli::plan::Args),
    /// Estimate the memory of local GGUF files, without a registry or a cluster.
    Estimate(modelserve::cli::estimate::Args),
    /// Create or update a ModelServe for OWNER/REPO and follow its stages until it answers.
    Serve(modelserve::cli::serve::Args),
    /// Show the stages of one ModelServe and what they found.
    Status(modelserve::cli::status::Args),
    /// List ModelServes, as `kubectl get modelserves` does.
    List(modelserve::cli::list::Args),
    /// Ask a model one question through the gateway; prints the reply and tokens per second.
    Ask(modelserve::cli::ask::Args),
    /// Print shell completions (bash, zsh, fish, elvish, powershell).
    Completions {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[tokio::main]
async fn main() -> ExitCode {
    // Installed or linked as kubectl-modelserve, the usage says `kubectl modelserve`.
    let program = modelserve::cli::program_name();
    let cli = match Cli::command()
        .bin_name(program)
        .try_get_matches()
        .and_then(|m| Cli::from_arg_matches(&m))
    {
        Ok(cli) => cli,
        Err(e) => return modelserve::cli::usage_error(e, &Cli::command()),
    };
    let result = match cli.command {
        Command::Serve(args) => {
            return modelserve::cli::finish(modelserve::cli::serve::run(args).await);
        }
        Command::Status(args) => {
            return modelserve::cli::finish(modelserve::cli::status::run(args).await);
        }
        Command::List(args) => {
            return modelserve::cli::finish(modelserve::cli::list::run(args).await);
        }
        Command::Ask(args) => {
            return modelserve::cli::finish(modelserve::cli::ask::run(args).await);
        }
        Command::Completions { shell } => {
            let bin = std::env::args_os()
                .next()
                .and_then(|a| {
                    std::path::Path::new(&a)
                        .file_name()
                        .map(|f| f.to_string_lossy().into_owned())
                })
                .unwrap_or_else(|| "modelserve".into());
            clap_complete::generate(shell, &mut Cli::command(), bin, &mut std::io::stdout());
            return ExitCode::SUCCESS;
        }
        Command::Crd => modelserve::api::crd_yaml()
            .map(|y| print!("{y}"))
            .map_err(|e| e.to_string()),
        Command::Plan(args) => modelserve::cli::plan::run(args, &mut std::io::stdout()).await,
        Command::Estimate(args) => {
            modelserve::cli::estimate::run(args, &mut std::io::stdout()).await
        }
        Command::Mirror(config) => {
            telemetry::init_logs(cli.log_format);
            until_sigterm("mirror", modelserve::mirror::run(config), 0).await
        }
        Command::Gateway(config) => {
            telemetry::init_logs(cli.log_format);
            until_sigterm("gateway", modelserve::gateway::run(config), 0).await
        }
        Command::Pull(args) => {
            telemetry::init_logs(cli.log_format);
            // Stopped before the copy is whole: the pod must not start its server.
            until_sigterm("pull", modelserve::pull::run(args), 143).await
        }
        Command::Controller(config) => {
            telemetry::init_logs(cli.log_format);
            // It handles SIGTERM itself: a leader gives up its Lease first, so a standby takes
            // over at once.
            match modelserve::controller::run(config).await {
                // Exit here, not by returning, as until_sigterm does.
                Ok(()) => std::process::exit(0),
                Err(e) => Err(e.to_string()),
            }
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("modelserve: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Runs a long-lived command until it ends or the process gets SIGTERM, then exits with
/// status `on_term`. In a container the command is PID 1, which the kernel gives no default action for
/// SIGTERM: without a handler the kubelet would wait out the whole grace period and SIGKILL it
/// on every rollout. Nothing is lost by stopping at once: the mirror and pull write each file
/// under a temporary name and rename it only once verified, so a stop mid-copy resumes later.
async fn until_sigterm(
    what: &str,
    work: impl std::future::Future<Output = Result<(), String>>,
    on_term: i32,
) -> Result<(), String> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())
        .map_err(|e| format!("{what}: cannot handle SIGTERM: {e}"))?;
    tokio::select! {
        r = work => r,
        _ = term.recv() => {
            tracing::info!(command = what, "SIGTERM: stopping");
            // Exit here, not by returning: tasks still hashing or writing would hold up the
            // runtime's shutdown.
            std::process::exit(on_term)
        }
    }
}

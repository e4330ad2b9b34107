use std::process::ExitCode;

use clap::{Parser, Subcommand};
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

#[derive(Subcommand)]
enum Command {
    /// Run the ModelServe controller.
    Controller(modelserve::controller::Config),
    /// Print the ModelServe CustomResourceDefinition as YAML.
    Crd,
    /// Run the verifying model mirror.
    Mirror(modelserve::mirror::Config),
    /// Show what a repository resolves to, without a cluster.
    Plan(modelserve::cli::plan::Args),
    /// Estimate the memory of local GGUF files, without a registry or a cluster.
    Estimate(modelserve::cli::estimate::Args),
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Crd => modelserve::api::crd_yaml()
            .map(|y| print!("{y}"))
            .map_err(|e| e.to_string()),
        Command::Plan(args) => modelserve::cli::plan::run(args, &mut std::io::stdout()).await,
        Command::Estimate(args) => {
            modelserve::cli::estimate::run(args, &mut std::io::stdout()).await
        }
        Command::Mirror(config) => {
            telemetry::init_logs(cli.log_format);
            modelserve::mirror::run(config).await
        }
        Command::Controller(config) => {
            telemetry::init_logs(cli.log_format);
            modelserve::controller::run(config)
                .await
                .map_err(|e| e.to_string())
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

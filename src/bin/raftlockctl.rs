//! `raftlockctl`: the command-line client for raftlock (and any etcd v3
//! endpoint). This version carries the benchmark; the lock and cluster
//! commands join it as the native API lands.

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "raftlockctl", version, about = "Command-line client for raftlock")]
struct Cli {
    /// Comma-separated client URLs.
    #[arg(
        long,
        env = "RAFTLOCK_ENDPOINTS",
        default_value = "http://127.0.0.1:2379",
        value_delimiter = ',',
        global = true
    )]
    endpoints: Vec<String>,
    /// Output format: simple or json.
    #[arg(short = 'w', long = "write-out", default_value = "simple", global = true)]
    write_out: String,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Drive the endpoints with concurrent clients and report ops/s and latency.
    Bench(raftlock::bench::BenchArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let endpoints: Vec<String> =
        cli.endpoints.iter().map(|e| if e.contains("://") { e.clone() } else { format!("http://{e}") }).collect();
    match cli.command {
        Cmd::Bench(args) => {
            let report = raftlock::bench::run(&endpoints, &args).await?;
            if cli.write_out == "json" {
                println!("{}", serde_json::to_string(&report)?);
            } else {
                println!("{report}");
            }
            anyhow::ensure!(report.errors == 0, "{} requests failed", report.errors);
        }
    }
    Ok(())
}

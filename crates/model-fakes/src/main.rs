//! `model-fakes --api anthropic|openai-responses|openai-chat --port 0`: serves one fake model API
//! on loopback, prints its base URL (`http://127.0.0.1:PORT`) as the first line of stdout, logs
//! each request it answers as a JSON line on stderr, and runs until SIGINT or SIGTERM.

use std::{
    io::Write,
    net::{IpAddr, Ipv4Addr, SocketAddr},
};

use agent_harness_model_fakes::{Api, FakeServer};
use clap::Parser;

#[derive(Debug, Parser)]
#[command(
    name = "model-fakes",
    about = "A scripted fake model API server for offline agent tests (prompt directives: [write NAME], [stall N], [error 401|429|500], [think])"
)]
struct Args {
    /// The API to fake.
    #[arg(long, default_value = "anthropic")]
    api: Api,
    /// The port to listen on (0: any free one).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// The address to listen on.
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    host: IpAddr,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::io::Result<()> {
    let args = Args::parse();
    let server = FakeServer::bind(args.api, SocketAddr::new(args.host, args.port)).await?;
    {
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "{}", server.base_url())?;
        stdout.flush()?;
    }
    let recorder = server.recorder().clone();
    let log = tokio::spawn(async move {
        let mut next = 0;
        loop {
            let request = recorder.wait_after(next, |_| true).await;
            next = request.seq + 1;
            eprintln!(
                "{}",
                serde_json::to_string(&request).expect("a request serializes")
            );
        }
    });
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    log.abort();
    Ok(())
}

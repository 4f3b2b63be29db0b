//! The baseline of the round-trip figure: the mock agent driven directly over its stdio by the
//! benchmark, with the same `session/prompt` frame the harness would send (the hidden invocation
//! block included), and the reply found the same way (each line parsed, the response to the
//! prompt's id picked out).

use std::{path::Path, process::Stdio, time::Duration};

use anyhow::{Context, bail};
use serde_json::{Value, json};
use tokio::{
    io::{AsyncBufReadExt, AsyncWriteExt, BufReader, BufWriter},
    process::{Child, ChildStdin, ChildStdout, Command},
    time::Instant,
};

use agent_harness::{
    acp::frames::{self as acp_frames, PromptOptions},
    domain::{ActionId, PromptAction},
};

/// How long one exchange with the agent may take before the run fails.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// A mock agent process spoken to directly.
pub struct DirectAgent {
    child: Child,
    stdin: BufWriter<ChildStdin>,
    stdout: BufReader<ChildStdout>,
    line: String,
    session_id: String,
}

impl DirectAgent {
    /// Spawns `bin mock-agent` in `cwd` and does the ACP handshake.
    pub async fn start(bin: &Path, cwd: &Path) -> anyhow::Result<Self> {
        let mut child = Command::new(bin)
            .arg("mock-agent")
            .current_dir(cwd)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .context("spawning the mock agent")?;
        let stdin = BufWriter::new(child.stdin.take().context("the agent's stdin")?);
        let stdout = BufReader::new(child.stdout.take().context("the agent's stdout")?);
        let mut agent = Self {
            child,
            stdin,
            stdout,
            line: String::new(),
            session_id: String::new(),
        };
        let id = json!("direct:0");
        agent
            .exchange(&acp_frames::initialize_request(id.clone()), &id)
            .await?;
        let id = json!("direct:1");
        let cwd = cwd.to_string_lossy();
        let created = agent
            .exchange(&acp_frames::new_session_request(id.clone(), &cwd), &id)
            .await?;
        agent.session_id = created["result"]["sessionId"]
            .as_str()
            .context("session/new answered without a sessionId")?
            .to_owned();
        Ok(agent)
    }

    /// Sends one frame and reads lines until the response to `id`.
    async fn exchange(&mut self, frame: &Value, id: &Value) -> anyhow::Result<Value> {
        let text = frame.to_string();
        self.stdin.write_all(text.as_bytes()).await?;
        self.stdin.write_all(b"\n").await?;
        self.stdin.flush().await?;
        tokio::time::timeout(EXCHANGE_TIMEOUT, async {
            loop {
                self.line.clear();
                if self.stdout.read_line(&mut self.line).await? == 0 {
                    bail!("the mock agent closed its output");
                }
                let value: Value = serde_json::from_str(self.line.trim())
                    .context("the mock agent wrote a line that is not JSON")?;
                if value.get("method").is_none() && value.get("id") == Some(id) {
                    return Ok(value);
                }
            }
        })
        .await
        .context("the mock agent did not answer in time")?
    }

    /// One timed turn: from building the prompt frame to reading its response.
    pub async fn turn(&mut self, text: &str) -> anyhow::Result<Duration> {
        let start = Instant::now();
        let action_id = ActionId::mint();
        let frame = acp_frames::prompt_request(
            &action_id,
            &self.session_id,
            &PromptAction::text(text),
            PromptOptions::default(),
        );
        let response = self.exchange(&frame, &frame["id"].clone()).await?;
        let took = start.elapsed();
        if response["result"]["stopReason"] != "end_turn" {
            bail!("the mock agent ended a turn with {response}");
        }
        Ok(took)
    }

    /// Closes stdin and waits for the agent to exit.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.stdin.shutdown().await?;
        drop(self.stdin);
        tokio::time::timeout(EXCHANGE_TIMEOUT, self.child.wait())
            .await
            .context("the mock agent did not exit after its input closed")??;
        Ok(())
    }
}

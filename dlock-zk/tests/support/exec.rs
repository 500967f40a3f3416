//! Running a program inside a fixture container and reading its output line by line (to drive
//! kazoo, the Python ZooKeeper client installed in the ZooKeeper image).

use std::time::Duration;

use anyhow::{bail, Context};
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::Docker;
use futures::StreamExt;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// A running `docker exec`.
pub struct Exec {
    docker: Docker,
    id: String,
    lines: mpsc::UnboundedReceiver<String>,
    seen: Vec<String>,
    reader: JoinHandle<()>,
}

impl Exec {
    /// Starts `cmd` in `container`.
    pub async fn start(docker: &Docker, container: &str, cmd: Vec<String>) -> anyhow::Result<Exec> {
        let created = docker
            .create_exec(
                container,
                CreateExecOptions {
                    attach_stdout: Some(true),
                    attach_stderr: Some(true),
                    cmd: Some(cmd),
                    ..Default::default()
                },
            )
            .await
            .context("docker exec create")?;
        let StartExecResults::Attached { mut output, .. } = docker
            .start_exec(&created.id, None)
            .await
            .context("docker exec start")?
        else {
            bail!("docker exec started detached");
        };
        let (tx, lines) = mpsc::unbounded_channel();
        let reader = tokio::spawn(async move {
            let mut pending = String::new();
            while let Some(Ok(chunk)) = output.next().await {
                pending.push_str(&String::from_utf8_lossy(&chunk.into_bytes()));
                while let Some(i) = pending.find('\n') {
                    let line = pending[..i].trim_end().to_owned();
                    pending.drain(..=i);
                    if tx.send(line).is_err() {
                        return;
                    }
                }
            }
            if !pending.trim().is_empty() {
                let _ = tx.send(pending.trim().to_owned());
            }
        });
        Ok(Exec {
            docker: docker.clone(),
            id: created.id,
            lines,
            seen: Vec::new(),
            reader,
        })
    }

    /// Waits up to `timeout` for a line starting with `prefix` and returns it.
    pub async fn expect(&mut self, prefix: &str, timeout: Duration) -> anyhow::Result<String> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(deadline, self.lines.recv()).await {
                Ok(Some(line)) => {
                    self.seen.push(line.clone());
                    if line.starts_with(prefix) {
                        return Ok(line);
                    }
                }
                Ok(None) => bail!(
                    "the program ended without printing {prefix:?}; output: {:?}",
                    self.seen
                ),
                Err(_) => bail!(
                    "no line {prefix:?} within {timeout:?}; output so far: {:?}",
                    self.seen
                ),
            }
        }
    }

    /// Waits for the program to end and returns its exit code.
    pub async fn finish(mut self, timeout: Duration) -> anyhow::Result<i64> {
        let deadline = tokio::time::Instant::now() + timeout;
        while let Ok(Some(line)) = tokio::time::timeout_at(deadline, self.lines.recv()).await {
            self.seen.push(line);
        }
        loop {
            let inspect = self.docker.inspect_exec(&self.id).await?;
            if inspect.running != Some(true) {
                let code = inspect.exit_code.unwrap_or(-1);
                if code != 0 {
                    bail!("the program exited with {code}; output: {:?}", self.seen);
                }
                return Ok(code);
            }
            if tokio::time::Instant::now() > deadline {
                bail!(
                    "the program did not end within {timeout:?}; output: {:?}",
                    self.seen
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Exec {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

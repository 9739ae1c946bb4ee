//! `acpd connect --provider NAME`: the `_acpd/connect` request sent before anything of the
//! editor's, and the judgement of its answer, over the socket (here) or over `--url`'s
//! WebSocket (`remote/bridge.rs`).

/// `acpd connect --provider NAME`: one `_acpd/connect` request and its one-line answer, read
/// a byte at a time so nothing of what follows is taken from the pipe. `Err` is the exit code,
/// the reason on stderr.
pub(super) async fn over_socket(
    from_daemon: &mut tokio::net::unix::OwnedReadHalf,
    to_daemon: &mut tokio::net::unix::OwnedWriteHalf,
    name: &str,
) -> Result<(), u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    const ANSWER_MAX: usize = 64 * 1024;
    let request = provider_request(name);
    let exchange = async {
        to_daemon
            .write_all(format!("{request}\n").as_bytes())
            .await?;
        let mut line = Vec::new();
        let mut byte = [0u8; 1];
        while line.len() < ANSWER_MAX {
            if from_daemon.read(&mut byte).await? == 0 {
                break;
            }
            if byte[0] == b'\n' {
                break;
            }
            line.push(byte[0]);
        }
        Ok::<_, std::io::Error>(line)
    };
    let line = match tokio::time::timeout(std::time::Duration::from_secs(30), exchange).await {
        Ok(Ok(line)) => line,
        Ok(Err(e)) => {
            errln!("acpd: cannot tell the daemon the provider: {e}");
            return Err(1);
        }
        Err(_) => {
            errln!("acpd: the daemon did not answer --provider within 30s");
            return Err(1);
        }
    };
    judge_provider_answer(&line)
}

/// The `_acpd/connect` request that makes `name` the connection's default provider.
pub(super) fn provider_request(name: &str) -> String {
    serde_json::json!({"jsonrpc": "2.0", "id": "acpd-connect",
        "method": crate::server::CONNECT, "params": {"provider": name}})
    .to_string()
}

/// Whether the answer to [`provider_request`] took it; `Err` is the exit code, the reason on
/// stderr.
pub(super) fn judge_provider_answer(line: &[u8]) -> Result<(), u8> {
    let answer: serde_json::Value = serde_json::from_slice(line).unwrap_or_default();
    if answer.get("result").is_some() {
        return Ok(());
    }
    match answer.pointer("/error/message").and_then(|m| m.as_str()) {
        // The daemon's refusal of this very request (another error, a LIMIT line, is no
        // usage error).
        Some(why) if answer["id"] == "acpd-connect" => {
            errln!("acpd: --provider: {why}");
            Err(super::EXIT_USAGE)
        }
        _ => {
            errln!(
                "acpd: the daemon did not take --provider (it answered {:?})",
                String::from_utf8_lossy(line)
            );
            Err(1)
        }
    }
}

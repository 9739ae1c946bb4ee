//! `_acpd/reload`: the operator's "re-read the config, and tell me whether it took".
//!
//! Only acpd's own user may ask, and not from inside a child's process tree (agents run as
//! acpd's user too, but reloading is the operator's). Group members (`allow_group`) cannot write the config, so a
//! reload is not theirs to trigger, and its answer would show them the file's path and, in a
//! rejection, the offending key and value of a file they may not be allowed to read.
//! (Root is not special: it is not admitted to the socket at all unless it is acpd's user or a
//! group member; `systemctl reload` runs `acpd reload` as the unit's `User=`.)

use std::sync::Arc;

use acpd_protocol::envelope::{Id, RpcError};
use acpd_protocol::errors::ErrorName;
use acpd_protocol::methods::ReloadReply;

use super::Conn;
use crate::config::{Config, ConfigError};

pub(super) async fn reload(conn: &Arc<Conn>, id: Id) {
    let Some(load) = conn.ctx.daemon.reload.clone() else {
        let e = RpcError::method_not_found(acpd_protocol::methods::name::RELOAD);
        return conn.reply_err(&id, &e).await;
    };
    let own = nix::unistd::Uid::effective().as_raw();
    if conn.ctx.peer_uid != Some(own) {
        tracing::warn!(peer_uid = ?conn.ctx.peer_uid, "refused _acpd/reload from another user");
        let why = format!("only acpd's own user (uid {own}) may reload it");
        return conn.reply_err(&id, &not_permitted(why)).await;
    }
    if !matches!(conn.lineage(), crate::registry::Lineage::Outside) {
        tracing::warn!("refused _acpd/reload from inside a child's tree");
        let why = "a connection from inside the process tree of one of this acpd's children (an \
                   agent) may not reload it; reloading is the operator's";
        return conn.reply_err(&id, &not_permitted(why.into())).await;
    }
    // Reading and checking the file is blocking work; the connection keeps being served.
    let outcome = tokio::task::spawn_blocking(move || load()).await;
    match outcome {
        Ok(Ok(config)) => {
            let _ = conn.peer.respond_ok(&id, &reply(&config)).await;
        }
        Ok(Err(e)) => conn.reply_err(&id, &rejected(&e)).await,
        Err(e) => conn.reply_err(&id, &RpcError::internal(e)).await,
    }
}

fn not_permitted(why: String) -> RpcError {
    RpcError::new(ErrorName::NotPermitted.code(), why)
        .with_data(serde_json::json!({ "code": ErrorName::NotPermitted.as_str() }))
}

fn reply(config: &Config) -> ReloadReply {
    ReloadReply {
        source: config.source.as_ref().map(|p| p.display().to_string()),
        providers: config.providers.keys().cloned().collect(),
        default_provider: config.default_provider.clone(),
    }
}

/// CONFIG_REJECTED with the message `acpd serve` logs, and its parts in `data`.
fn rejected(e: &ConfigError) -> RpcError {
    let mut data = serde_json::json!({
        "code": ErrorName::ConfigRejected.as_str(),
        "file": e.path().display().to_string(),
    });
    if let ConfigError::Invalid { line, key, .. } = e {
        data["line"] = serde_json::json!(line);
        data["key"] = serde_json::json!(key);
    }
    RpcError::new(
        ErrorName::ConfigRejected.code(),
        format!("config rejected, the previous one stays in force: {e}"),
    )
    .with_data(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rejection_names_file_line_and_key() {
        let e = ConfigError::Invalid {
            path: "/etc/acpd/config.toml".into(),
            line: Some(3),
            key: "max_children".into(),
            message: "invalid type".into(),
        };
        let r = rejected(&e);
        assert_eq!(r.code, -33014);
        assert!(
            r.message.contains("/etc/acpd/config.toml:3: max_children"),
            "{}",
            r.message
        );
        assert_eq!(
            r.data,
            Some(
                serde_json::json!({"code": "CONFIG_REJECTED", "file": "/etc/acpd/config.toml",
                "line": 3, "key": "max_children"})
            )
        );
    }
}

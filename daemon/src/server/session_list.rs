//! `session/list`: the sessions of every provider whose agent lists them, asked now and filed
//! under acpd ids, with the ones acpd opened on any other, newest first, in pages.

use std::path::PathBuf;
use std::sync::Arc;

use acpd_protocol::envelope::{Id, RpcError};
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;

use super::{Conn, bridge_error, raw};
use crate::registry::advertises;
use crate::store::{Listed, SessionRow};

/// Pages of `session/list` asked of one agent, at most (a listing that never ends is cut).
const MAX_CHILD_PAGES: usize = 20;

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ListParams {
    #[serde(default)]
    cwd: Option<PathBuf>,
    #[serde(default)]
    cursor: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ChildListing {
    #[serde(default)]
    sessions: Vec<ChildSession>,
    /// Absent, `null` (`Some(None)`: codex-acp ends its listing so) or a cursor.
    #[serde(default, deserialize_with = "present")]
    next_cursor: Option<Option<String>>,
}

/// A field that is there, even as `null`: what tells `"nextCursor": null` from no key.
fn present<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de>,
{
    T::deserialize(d).map(Some)
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ChildSession {
    session_id: String,
    cwd: PathBuf,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    updated_at: Option<String>,
}

/// `session/list`: the sessions of every provider whose agent lists them (asked now, under
/// acpd ids) and the ones acpd opened on any other, newest first, in pages.
pub(super) async fn list(conn: Arc<Conn>, id: Id, params: Option<Box<RawValue>>) {
    let req: ListParams = match acpd_protocol::methods::parse_params(params.as_deref()) {
        Ok(r) => r,
        Err(e) => return conn.reply_err(&id, &RpcError::invalid_params(e)).await,
    };
    let store = &conn.ctx.sessions.store;
    // Whether an agent ended its listing with `"nextCursor": null`: acpd's last page then says
    // so too, so an editor sees the answer it gets from that agent directly.
    let mut null_cursor = false;
    for provider in conn.ctx.registry.provider_names() {
        let Some(agent) = conn.ctx.registry.cached(&provider) else {
            continue;
        };
        if !advertises(&agent, "/sessionCapabilities/list") {
            continue;
        }
        match refresh(&conn, &provider, req.cwd.as_deref()).await {
            Ok(null) => null_cursor |= null,
            // An agent that wants a login says so to the editor, as it would directly.
            Err(e) if e.code == acpd_protocol::envelope::AUTH_REQUIRED => {
                return conn.reply_err(&id, &e).await;
            }
            Err(e) => {
                tracing::warn!(%provider, "session/list: the agent's own listing failed: {}", e.message)
            }
        }
    }
    let rows = match store.list(req.cwd.as_deref(), conn.caller()).await {
        Ok(rows) => rows,
        Err(e) => {
            return conn
                .reply_err(&id, &RpcError::internal(e.to_string()))
                .await;
        }
    };
    let infos: Vec<serde_json::Value> = rows.iter().map(session_info).collect();
    // The answer line stays within max_line: the envelope with the longest cursor, plus each
    // entry and its comma.
    let envelope = acpd_protocol::envelope::encode_result(
        &id,
        &raw(&json!({ "sessions": [], "nextCursor": format!("acpd-p{}", u64::MAX) })),
    )
    .len()
        + 1;
    let budget = conn.ctx.registry.config().max_line.saturating_sub(envelope);
    let cost = |v: &serde_json::Value| serde_json::to_string(v).map_or(usize::MAX, |t| t.len() + 1);
    let (sessions, next, skipped) = match acpd_protocol::listing::page_within(
        infos,
        req.cursor.as_deref(),
        acpd_protocol::listing::PAGE,
        budget,
        cost,
    ) {
        Ok(p) => p,
        Err(e) => return conn.reply_err(&id, &RpcError::invalid_params(e)).await,
    };
    if skipped > 0 {
        tracing::warn!(
            skipped,
            "session/list: sessions too long for one line of max_line left out; raise max_line"
        );
    }
    let mut result = json!({ "sessions": sessions });
    if let Some(next) = next {
        result["nextCursor"] = json!(next);
    } else if null_cursor {
        result["nextCursor"] = serde_json::Value::Null;
    }
    let _ = conn.peer.respond_ok(&id, &result).await;
}

fn session_info(row: &SessionRow) -> serde_json::Value {
    let mut info = json!({
        "sessionId": row.acpd_id,
        "cwd": row.cwd,
        "updatedAt": row.updated_at,
        "_meta": { "acpd": { "provider": row.provider } },
    });
    if let Some(title) = &row.title {
        info["title"] = json!(title);
    }
    info
}

/// Asks a child of `provider` for its sessions and files each under an acpd id; whether its
/// last page said `"nextCursor": null`.
async fn refresh(
    conn: &Arc<Conn>,
    provider: &str,
    cwd: Option<&std::path::Path>,
) -> Result<bool, RpcError> {
    let internal = |e: String| RpcError::internal(e);
    let auth = conn.auth_for(provider);
    let mut ready = conn
        .ctx
        .registry
        .ready(
            Some(provider),
            None,
            crate::child::ClientCaps::default(),
            auth.as_deref(),
            &conn.closing,
        )
        .await
        .map_err(|e| bridge_error(&e))?;
    // Rows written after this (a `session/new` racing the listing) are not the agent's to
    // forget: its listing may predate them.
    let since = crate::store::now();
    let listing = list_all(&mut ready, conn, provider, cwd).await;
    ready.close().await;
    let (listed, whole, null_cursor) = listing?;
    // What the agent no longer lists, it deleted; only an unfiltered listing says so. A whole
    // one forgets any row it lacks (see `forget_unlisted`); one cut at max_listed_sessions is
    // all acpd keeps of the agent's own sessions, so listed-only rows past it go, but never a
    // row someone opened: the bound is about what an agent brings in, not about them.
    let whole_since = match whole {
        Whole::Yes => Some(since.as_str()),
        Whole::Cut => None,
        Whole::No => return Ok(null_cursor),
    };
    if cwd.is_none() {
        conn.ctx
            .sessions
            .store
            .forget_unlisted(provider, &listed, whole_since)
            .await
            .map_err(|e| internal(e.to_string()))?;
    }
    Ok(null_cursor)
}

/// How much of an agent's listing [`list_all`] saw.
enum Whole {
    /// Every page.
    Yes,
    /// Cut at `max_listed_sessions`: all acpd keeps of it, not all there is.
    Cut,
    /// Cut at [`MAX_CHILD_PAGES`].
    No,
}

/// Every page of the agent's listing, each session filed, up to `max_listed_sessions`; the
/// child ids, whether the listing was whole and whether its last page said
/// `"nextCursor": null`.
async fn list_all(
    ready: &mut crate::registry::Ready,
    conn: &Arc<Conn>,
    provider: &str,
    cwd: Option<&std::path::Path>,
) -> Result<(Vec<String>, Whole, bool), RpcError> {
    let internal = |e: String| RpcError::internal(e);
    let store = &conn.ctx.sessions.store;
    let max = conn.ctx.registry.config().max_listed_sessions;
    let mut cursor: Option<String> = None;
    let mut listed = Vec::new();
    for _ in 0..MAX_CHILD_PAGES {
        let mut params = json!({});
        if let Some(cwd) = cwd {
            params["cwd"] = json!(cwd);
        }
        if let Some(c) = &cursor {
            params["cursor"] = json!(c);
        }
        let answer = ready
            .call("session/list", &raw(&params), &conn.closing)
            .await
            .map_err(|e| bridge_error(&e))?;
        let page: ChildListing =
            serde_json::from_str(answer.get()).map_err(|e| internal(e.to_string()))?;
        let room = max.saturating_sub(listed.len());
        let cut = page.sessions.len() > room;
        let page_sessions: Vec<Listed> = page
            .sessions
            .into_iter()
            .filter(plausible)
            .take(room)
            .map(|s| Listed {
                child_session_id: s.session_id,
                cwd: s.cwd,
                title: s.title,
                updated_at: s.updated_at,
            })
            .collect();
        listed.extend(page_sessions.iter().map(|s| s.child_session_id.clone()));
        store
            .adopt_listing(provider, page_sessions, max)
            .await
            .map_err(|e| internal(e.to_string()))?;
        let null_cursor = page.next_cursor == Some(None);
        cursor = page.next_cursor.flatten();
        if cut || (cursor.is_some() && listed.len() >= max) {
            tracing::warn!(%provider, max, "the agent lists more sessions than max_listed_sessions; the rest are not kept");
            return Ok((listed, Whole::Cut, false));
        }
        if cursor.is_none() {
            return Ok((listed, Whole::Yes, null_cursor));
        }
    }
    Ok((listed, Whole::No, false))
}

/// The longest child session id and cwd the map keeps from an agent's listing: an id is a
/// key, a cwd a path (PATH_MAX); anything longer is a lie, left out.
const MAX_CHILD_ID: usize = 1024;
const MAX_CWD: usize = 4096;

/// Whether a listed session is one acpd can keep: a short id, an absolute cwd of a path's
/// length.
fn plausible(s: &ChildSession) -> bool {
    let ok = s.session_id.len() <= MAX_CHILD_ID
        && s.cwd.is_absolute()
        && s.cwd.as_os_str().len() <= MAX_CWD;
    if !ok {
        tracing::warn!(
            "an agent listed a session with an id over {MAX_CHILD_ID} bytes or a cwd that is not an absolute path of at most {MAX_CWD}: left out"
        );
    }
    ok
}

//! Who may use the network face, before anything else happens: a bearer token from the
//! `Authorization` header only (one found in the URL, a cookie or a WebSocket subprotocol is
//! refused and never logged), a browser `Origin` on `allowed_origins`, and the limits of
//! connections and requests each token holds.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use hyper::HeaderMap;
use hyper::header::{AUTHORIZATION, COOKIE, ORIGIN, SEC_WEBSOCKET_PROTOCOL};

pub(crate) use crate::store::tokens::{TokenGrant as Grant, TokenRefusal as Refusal};

/// Checks bearer tokens: the daemon's token book.
pub(crate) trait Authenticator: Send + Sync {
    fn verify(&self, bearer: &str) -> Result<Grant, Refusal>;
    /// Whether a token verified earlier still stands (revoked and expired ones do not).
    fn is_live(&self, id: i64) -> bool;
    /// Changes whenever tokens may have been revoked.
    fn changed(&self) -> tokio::sync::watch::Receiver<u64>;
}

impl Authenticator for crate::store::tokens::TokenBook {
    fn verify(&self, bearer: &str) -> Result<Grant, Refusal> {
        crate::store::tokens::TokenBook::verify(self, bearer)
    }
    fn is_live(&self, id: i64) -> bool {
        crate::store::tokens::TokenBook::is_live(self, id)
    }
    fn changed(&self) -> tokio::sync::watch::Receiver<u64> {
        crate::store::tokens::TokenBook::changed(self)
    }
}

/// The prefix every acpd token starts with, so one put where tokens never go is recognised.
pub(crate) const TOKEN_PREFIX: &str = "acpd_";

/// Why a request is refused before it reaches ACP: the HTTP status and the plain-text body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refused {
    pub status: u16,
    /// The limit or rule, as counted in `/metrics` (`acpd_network_refused_total{reason}`).
    pub reason: &'static str,
    pub message: String,
}

impl Refused {
    pub(crate) fn new(status: u16, reason: &'static str, message: impl Into<String>) -> Refused {
        Refused {
            status,
            reason,
            message: message.into(),
        }
    }
}

/// Refuses credentials where they must never travel. Checked before the Authorization header,
/// so a request carrying a token in its URL is refused even with a valid header too: the URL
/// has already been written to some proxy's log, and the client must learn that.
pub(crate) fn no_misplaced_credentials(
    query: Option<&str>,
    headers: &HeaderMap,
) -> Result<(), Refused> {
    if query.is_some_and(|q| !q.is_empty()) {
        return Err(Refused::new(
            400,
            "credentials_in_url",
            "/acp takes no query string (a token in a URL ends up in logs); send the token \
             only as `Authorization: Bearer <token>`",
        ));
    }
    let holds_token = |name| {
        headers.get_all(name).iter().any(|v| {
            v.as_bytes()
                .windows(TOKEN_PREFIX.len())
                .any(|w| w == TOKEN_PREFIX.as_bytes())
        })
    };
    if holds_token(COOKIE) {
        return Err(Refused::new(
            400,
            "credentials_in_cookie",
            "a token was sent in a cookie; send it only as `Authorization: Bearer <token>`",
        ));
    }
    if holds_token(SEC_WEBSOCKET_PROTOCOL) {
        return Err(Refused::new(
            400,
            "credentials_in_subprotocol",
            "a token was sent as a WebSocket subprotocol; send it only as \
             `Authorization: Bearer <token>`",
        ));
    }
    Ok(())
}

/// A browser's `Origin` must be on `allowed_origins`; a request without one (every non-browser
/// client) is not a cross-site request.
pub(crate) fn origin_allowed(headers: &HeaderMap, allowed: &[String]) -> Result<(), Refused> {
    let Some(origin) = headers.get(ORIGIN) else {
        return Ok(());
    };
    let origin = origin.to_str().unwrap_or("");
    if allowed.iter().any(|a| a == origin) {
        return Ok(());
    }
    Err(Refused::new(
        403,
        "origin",
        format!(
            "Origin {:?} is not on allowed_origins; add it to acpd's config to let that page connect",
            origin.chars().take(200).collect::<String>()
        ),
    ))
}

/// The bearer token of `Authorization`, or the 401 to answer.
pub(crate) fn bearer(headers: &HeaderMap) -> Result<&str, Refused> {
    let missing = || {
        Refused::new(
            401,
            "unauthenticated",
            "no token: send `Authorization: Bearer <token>` (make one on the server with \
             `acpd token create NAME`)",
        )
    };
    let value = headers.get(AUTHORIZATION).ok_or_else(missing)?;
    let text = value.to_str().map_err(|_| missing())?;
    let (scheme, token) = text.split_once(' ').ok_or_else(missing)?;
    if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
        return Err(missing());
    }
    Ok(token.trim())
}

/// The 401 for a token that was presented and refused. The body is the same for every cause:
/// which tokens exist, were revoked or expired is the operator's to know (it is logged).
pub(crate) fn refused_token(why: Refusal) -> Refused {
    let reason = match why {
        Refusal::Unknown => "token_unknown",
        Refusal::Revoked => "token_revoked",
        Refusal::Expired => "token_expired",
    };
    Refused::new(
        401,
        reason,
        "the token was not accepted (unknown, revoked or expired); ask the server's operator \
         for a new one (`acpd token create NAME`)",
    )
}

/// Requests per second per token: a bucket of `rate` requests refilled at `rate` a second.
pub(crate) struct RateLimits {
    buckets: Mutex<HashMap<i64, (f64, Instant)>>,
}

impl RateLimits {
    pub(crate) fn new() -> RateLimits {
        RateLimits {
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one request from `token`'s bucket; how long to wait when it is empty.
    pub(crate) fn take(
        &self,
        token: i64,
        rate: u32,
        now: Instant,
    ) -> Result<(), std::time::Duration> {
        let rate = f64::from(rate.max(1));
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        let (level, at) = buckets.entry(token).or_insert((rate, now));
        let elapsed = now.saturating_duration_since(*at).as_secs_f64();
        *level = (*level + elapsed * rate).min(rate);
        *at = now;
        if *level >= 1.0 {
            *level -= 1.0;
            Ok(())
        } else {
            Err(std::time::Duration::from_secs_f64((1.0 - *level) / rate))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(*k, v.parse().unwrap());
        }
        h
    }

    #[test]
    fn a_token_anywhere_but_the_authorization_header_is_refused() {
        let t = "acpd_abcdefghijklmnopqrstuvwxyz0123456789ABCDEFG";
        assert_eq!(
            no_misplaced_credentials(Some(&format!("token={t}")), &HeaderMap::new())
                .unwrap_err()
                .reason,
            "credentials_in_url"
        );
        let cookie = headers(&[("cookie", &format!("a=b; acpd={t}"))]);
        assert_eq!(
            no_misplaced_credentials(None, &cookie).unwrap_err().reason,
            "credentials_in_cookie"
        );
        let proto = headers(&[("sec-websocket-protocol", &format!("acp.v1, {t}"))]);
        assert_eq!(
            no_misplaced_credentials(None, &proto).unwrap_err().reason,
            "credentials_in_subprotocol"
        );
        for refused in [
            no_misplaced_credentials(Some(&format!("token={t}")), &HeaderMap::new()),
            no_misplaced_credentials(None, &cookie),
        ] {
            assert!(
                !refused.unwrap_err().message.contains(t),
                "the token is never echoed"
            );
        }
        assert!(no_misplaced_credentials(None, &headers(&[("cookie", "theme=dark")])).is_ok());
    }

    #[test]
    fn only_a_bearer_authorization_is_read() {
        let ok = headers(&[("authorization", "Bearer acpd_x")]);
        assert_eq!(bearer(&ok).unwrap(), "acpd_x");
        for bad in ["Basic dXNlcjpwYXNz", "Bearer ", "acpd_x", "Token acpd_x"] {
            let h = headers(&[("authorization", bad)]);
            assert_eq!(bearer(&h).unwrap_err().status, 401, "{bad}");
        }
        assert_eq!(bearer(&HeaderMap::new()).unwrap_err().status, 401);
    }

    #[test]
    fn origins_off_the_list_are_refused() {
        let allowed = vec!["https://app.example".to_owned()];
        assert!(origin_allowed(&HeaderMap::new(), &allowed).is_ok());
        assert!(origin_allowed(&headers(&[("origin", "https://app.example")]), &allowed).is_ok());
        let evil = headers(&[("origin", "https://evil.example")]);
        assert_eq!(origin_allowed(&evil, &allowed).unwrap_err().status, 403);
    }

    #[test]
    fn a_token_gets_its_rate_then_waits() {
        let limits = RateLimits::new();
        let t0 = Instant::now();
        for _ in 0..5 {
            limits.take(1, 5, t0).unwrap();
        }
        let wait = limits.take(1, 5, t0).unwrap_err();
        assert!(wait <= std::time::Duration::from_millis(200), "{wait:?}");
        limits
            .take(2, 5, t0)
            .expect("another token has its own bucket");
        limits
            .take(1, 5, t0 + std::time::Duration::from_millis(200))
            .expect("refilled");
    }
}

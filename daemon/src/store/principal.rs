//! Who a session belongs to: a user (by uid, over the Unix socket) or a network token. The
//! map keeps it as two columns, `owner_uid` and `owner_token`: a token's rows carry acpd's own
//! uid and the token's id, so a user never sees a token's sessions, nor a token another's.

use std::sync::Arc;

use super::tokens::Role;

/// Who is asking, and whose sessions they see: the connection's peer user, or the token it
/// authenticated with. Two principals are the same only when they are the same uid, or the
/// same token (by id: a token created again under a revoked one's name is another token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Principal {
    Uid(u32),
    Token { id: i64, name: Arc<str>, role: Role },
}

impl Principal {
    /// The token that authenticated a connection.
    pub fn token(grant: &super::tokens::TokenGrant) -> Principal {
        Principal::Token {
            id: grant.id,
            name: grant.name.clone(),
            role: grant.role,
        }
    }

    /// The owner its session rows are written and looked up under.
    pub fn row_owner(&self) -> RowOwner {
        match self {
            Principal::Uid(uid) => RowOwner::uid(*uid),
            Principal::Token { id, .. } => RowOwner {
                uid: nix::unistd::Uid::effective().as_raw(),
                token: Some(*id),
            },
        }
    }
}

/// A session row's owner, as the map stores it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RowOwner {
    pub uid: u32,
    /// The token's id for a token's session; `None` for a user's.
    pub token: Option<i64>,
}

impl RowOwner {
    /// A user's rows.
    pub fn uid(uid: u32) -> RowOwner {
        RowOwner { uid, token: None }
    }

    /// acpd's own user's rows: those an agent listed, and those of a peer-less connection.
    pub fn own() -> RowOwner {
        RowOwner::uid(nix::unistd::Uid::effective().as_raw())
    }
}

//! acpd's own stdin and stdout as async pipes (tokio's own stdin/stdout hand
//! every read and write to a blocking thread, a hop per flush on the hot path).

use std::os::fd::{AsFd, OwnedFd};

use tokio::io::{AsyncRead, AsyncWrite};

use super::Shutdown;
use crate::server::{self, ServerContext};

pub(crate) type Reader = Box<dyn AsyncRead + Unpin + Send>;
pub(crate) type Writer = Box<dyn AsyncWrite + Unpin + Send>;

/// acpd's stdin and stdout. Pipes and sockets (what an editor or a parent agent gives a child)
/// are driven by the reactor directly; anything else (a terminal, a file) falls back to tokio's
/// blocking-thread stdio. The descriptors are duplicated so 0 and 1 themselves stay open.
pub(crate) fn stdio() -> (Reader, Writer) {
    let reader = dup(std::io::stdin().as_fd())
        .and_then(async_reader)
        .unwrap_or_else(|| Box::new(tokio::io::stdin()));
    let writer = dup(std::io::stdout().as_fd())
        .and_then(async_writer)
        .unwrap_or_else(|| Box::new(tokio::io::stdout()));
    (reader, writer)
}

fn dup(fd: std::os::fd::BorrowedFd<'_>) -> Option<OwnedFd> {
    fd.try_clone_to_owned().ok()
}

fn kind(fd: &OwnedFd) -> Option<nix::sys::stat::SFlag> {
    let mode = nix::sys::stat::fstat(fd).ok()?.st_mode;
    Some(nix::sys::stat::SFlag::from_bits_truncate(mode) & nix::sys::stat::SFlag::S_IFMT)
}

fn async_reader(fd: OwnedFd) -> Option<Reader> {
    use nix::sys::stat::SFlag;
    match kind(&fd)? {
        SFlag::S_IFIFO => tokio::net::unix::pipe::Receiver::from_owned_fd(fd)
            .ok()
            .map(|r| Box::new(r) as Reader),
        SFlag::S_IFSOCK => socket(fd).map(|s| Box::new(s) as Reader),
        _ => None,
    }
}

fn async_writer(fd: OwnedFd) -> Option<Writer> {
    use nix::sys::stat::SFlag;
    match kind(&fd)? {
        SFlag::S_IFIFO => {
            grow_pipe(&fd);
            tokio::net::unix::pipe::Sender::from_owned_fd(fd)
                .ok()
                .map(|w| Box::new(w) as Writer)
        }
        SFlag::S_IFSOCK => socket(fd).map(|s| Box::new(s) as Writer),
        _ => None,
    }
}

/// What the pipe to the parent is grown to hold (Linux's default `pipe-max-size`).
const PIPE_SIZE: i32 = 1 << 20;

/// Grows the pipe to the parent to [`PIPE_SIZE`]. With the default 64 KiB, a stream toward
/// a parent that reads in large chunks filled the pipe in every burst: each time a write
/// refused, a trip through epoll and a second write, and the parent woken for a part of what
/// acpd had ready. Pages are taken only as bytes wait in it. Never shrunk; a refusal (the
/// user's `pipe-user-pages-soft` spent) leaves the pipe as it was.
fn grow_pipe(fd: &OwnedFd) {
    use nix::fcntl::{FcntlArg, fcntl};
    if fcntl(fd, FcntlArg::F_GETPIPE_SZ).is_ok_and(|size| size < PIPE_SIZE) {
        let _ = fcntl(fd, FcntlArg::F_SETPIPE_SZ(PIPE_SIZE));
    }
}

fn socket(fd: OwnedFd) -> Option<tokio::net::UnixStream> {
    let std = std::os::unix::net::UnixStream::from(fd);
    std.set_nonblocking(true).ok()?;
    tokio::net::UnixStream::from_std(std).ok()
}

/// `acpd stdio`'s one connection on acpd's own stdin/stdout, until the parent disconnects or
/// `shutdown` is requested; then every run and bridge is cancelled and its ladder run, within
/// the largest cancel + EOF + TERM grace plus a margin (a second request SIGKILLs at once).
pub(crate) async fn serve_stdio(ctx: ServerContext, shutdown: Shutdown) {
    let registry = ctx.registry.clone();
    let cancel_all = ctx.shutdown.clone();
    let warm = cancel_all.child_token();
    let (reader, writer) = stdio();
    // Before the spares: the socket is what offers delegation in a session's MCP servers.
    let nest = super::nest_socket::NestSocket::open(&ctx);
    if let Some(cwd) = ctx.caller_cwd.as_deref().filter(|c| c.is_absolute()) {
        registry.expect_session(cwd);
    }
    registry.keep_warm(warm.clone());
    let sessions = ctx.sessions.clone();
    let serving = async {
        server::serve(reader, writer, ctx).await;
        if let Some(nest) = nest {
            nest.close().await;
        }
        warm.cancel();
        registry.drain_spares().await;
        // A session whose child died is still being reaped (its group may hold the child's
        // own children): finish those ladders before exiting.
        sessions.shut_all().await;
    };
    tokio::pin!(serving);
    tokio::select! {
        () = &mut serving => return,
        () = shutdown.requested() => {}
    }
    let bound = super::shutdown::bound(&registry.config());
    tracing::info!(?bound, "shutting down: cancelling every run and bridge");
    cancel_all.cancel();
    super::shutdown::drain(serving, &shutdown, bound).await;
}

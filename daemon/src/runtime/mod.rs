//! How acpd meets the outside world: its own stdio, the daemon's Unix socket, systemd's
//! notifications, signals, reload and shutdown, and the network face (`http`).

mod activation;
pub(crate) mod http;
mod nest_socket;
mod notify;
mod per_child;
mod serve;
mod shutdown;
mod socket;
mod stdio;

pub use activation::{Activated, ActivationError, activated_listeners};
pub(crate) use nest_socket::NestSocket;
pub(crate) use serve::{ServeError, ServeOptions, serve};
pub(crate) use shutdown::{Shutdown, bound as shutdown_bound};
pub(crate) use socket::default_socket_path;
pub(crate) use stdio::{Reader, Writer, serve_stdio, stdio};

//! How acpd meets the outside world: its own stdio, the daemon's Unix socket, systemd's
//! notifications, signals, reload and shutdown.

mod nest_socket;
mod notify;
mod per_child;
mod serve;
mod shutdown;
mod socket;
mod stdio;

pub use serve::{ServeError, ServeOptions, serve};
pub use shutdown::{Shutdown, bound as shutdown_bound};
pub use socket::default_socket_path;
pub use stdio::{Reader, Writer, serve_stdio, stdio};

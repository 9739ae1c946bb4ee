//! `acpd supervise [--setup-stdin] -- CMD…`: the far side of a remote provider (see
//! `crate::remote`): CMD in its own process group and reaped as a tree, stdio relayed byte for
//! byte, the ladder when the connection goes.

use std::time::Duration;

#[derive(Debug, clap::Args)]
pub struct SuperviseArgs {
    /// Read one JSON line `{cwd, env, graces}` from stdin before starting CMD: how acpd passes
    /// a remote child's environment without putting it in an argv or through a shell.
    #[arg(long)]
    pub setup_stdin: bool,
    /// How long CMD may take to exit after its stdin closes (a setup line overrides it).
    #[arg(long, value_name = "DURATION", default_value = "2s", value_parser = crate::config::durations::parse_flag)]
    pub eof_grace: Duration,
    /// How long CMD's group may take to exit after SIGTERM, before SIGKILL.
    #[arg(long, value_name = "DURATION", default_value = "3s", value_parser = crate::config::durations::parse_flag)]
    pub term_grace: Duration,
    /// The command and its arguments, after `--`; run directly, never through a shell.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

pub async fn supervise(args: SuperviseArgs) -> u8 {
    crate::remote::supervise(crate::remote::SuperviseArgs {
        setup_stdin: args.setup_stdin,
        eof_grace: args.eof_grace,
        term_grace: args.term_grace,
        command: args.command,
    })
    .await
}

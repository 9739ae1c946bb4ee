//! Children on other hosts and in pods, behind the tools users already have: `ssh`, or any
//! launcher argv (`kubectl exec -i POD --`, `docker exec -i CTR`), with `acpd supervise` on the
//! far side.
//!
//! acpd's own guarantees end at the local process it spawns (the `ssh` or launcher process):
//! its ladder and PDEATHSIG apply to that process only. The far side's `acpd supervise` owns
//! the far tree — its own process group, PDEATHSIG, a subreaper that keeps every descendant
//! findable — and tears it down when its stdin closes, its stdout breaks or it is signalled,
//! which is what a closed connection looks like from there.
//!
//! The provider's environment and cwd travel as one JSON line on the far side's stdin
//! ([`Setup`]), never in argv (which `ps` shows to every user) and never through a shell.

mod diagnose;
pub(crate) mod quote;
mod setup;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::Duration;

pub(crate) use diagnose::{FarFailure, SUPERVISE_MARK, classify};
pub(crate) use quote::quote;
pub(crate) use setup::{MAX_SETUP_LINE, Setup};

use acpd_protocol::subagent::{Failure, Stage};

use crate::config::ProviderConfig;
#[cfg(test)]
use crate::config::SshHost;
pub(crate) use crate::config::{Remote, Via};
use crate::supervise::{DEPTH_VAR, MAX_DEPTH_VAR, SpawnSpec, child_env};

/// Variables the local `ssh` or launcher process gets besides acpd's usual allowlist: what
/// those tools need to find their own credentials and contexts. None of them reaches the far
/// command.
const LAUNCHER_PASSTHROUGH: &[&str] = &[
    "SSH_AUTH_SOCK",
    "KUBECONFIG",
    "DOCKER_HOST",
    "DOCKER_CONTEXT",
    "DOCKER_CONFIG",
    "DOCKER_CERT_PATH",
    "DOCKER_TLS_VERIFY",
];

/// The argv and setup line of a [`Remote`] (parsed by config from `host` / `launcher`).
impl Remote {
    /// The far side's argv: `<remote_acpd> supervise --setup-stdin -- <command…>`.
    fn far_argv(&self, command: &[String]) -> Vec<String> {
        let mut argv = vec![
            self.remote_acpd.clone(),
            "supervise".into(),
            "--setup-stdin".into(),
            "--".into(),
        ];
        argv.extend(command.iter().cloned());
        argv
    }

    /// The local argv: ssh (its remote command one shell-quoted string, because sshd hands it
    /// to the login shell) or the launcher followed by the far argv as words.
    pub fn local_argv(&self, command: &[String]) -> Vec<String> {
        let far = self.far_argv(command);
        match &self.via {
            Via::Ssh { host, options } => {
                let mut argv: Vec<String> = ["ssh", "-T", "-o", "BatchMode=yes"]
                    .map(String::from)
                    .to_vec();
                argv.extend(options.iter().cloned());
                if let Some(port) = host.port {
                    argv.extend(["-p".to_string(), port.to_string()]);
                }
                if let Some(user) = &host.user {
                    argv.extend(["-l".to_string(), user.clone()]);
                }
                // `--` ends ssh's options: nothing after it is parsed as one.
                argv.push("--".into());
                argv.push(host.host.clone());
                let words: Vec<String> = far.iter().map(|w| quote(w)).collect();
                argv.push(words.join(" "));
                argv
            }
            Via::Launcher(launcher) => {
                let mut argv = launcher.clone();
                argv.extend(far);
                argv
            }
        }
    }

    /// The local spawn and the setup line for a child that would run `command` in `cwd` with
    /// `env` (acpd's allowlisted child environment) on this host. The far side gets only the
    /// provider's `env`, its `env_passthrough` values read here, and the depth pair; the
    /// local process gets the allowlist plus what launchers need, runs in `/` (the cwd is the
    /// far side's), and never sees the provider's secrets.
    pub fn wrap(
        &self,
        command: &[String],
        cwd: PathBuf,
        env: &[(OsString, OsString)],
        provider_env: &BTreeMap<String, String>,
        passthrough: &[String],
        graces: (Duration, Duration),
    ) -> (SpawnSpec, Vec<u8>) {
        let travels = |name: &str| {
            provider_env.contains_key(name)
                || passthrough.iter().any(|p| p == name)
                || name == DEPTH_VAR
                || name == MAX_DEPTH_VAR
        };
        let far_env: BTreeMap<String, String> = env
            .iter()
            .filter_map(|(k, v)| Some((k.to_str()?.to_string(), v.to_str()?.to_string())))
            .filter(|(k, _)| travels(k))
            .collect();
        let depth = |name: &str| {
            far_env
                .get(name)
                .and_then(|v| v.parse::<u32>().ok())
                .unwrap_or(0)
        };
        let local_passthrough: Vec<String> =
            LAUNCHER_PASSTHROUGH.iter().map(|s| s.to_string()).collect();
        let local_env = child_env(
            std::env::vars_os(),
            &local_passthrough,
            &BTreeMap::new(),
            depth(DEPTH_VAR),
            depth(MAX_DEPTH_VAR),
        );
        let setup = Setup::new(cwd, far_env, graces);
        let spec = SpawnSpec {
            argv: self.local_argv(command),
            cwd: PathBuf::from("/"),
            env: local_env,
        };
        (spec, setup.line())
    }
}

/// The local spawn for `provider`'s child, and for a remote provider the setup line to write
/// to its stdin first. `cwd` and `env` are the child's as resolved for this host.
pub(crate) fn spawn_spec(
    provider: &ProviderConfig,
    cwd: &std::path::Path,
    env: &[(OsString, OsString)],
) -> (SpawnSpec, Option<Vec<u8>>) {
    match &provider.remote {
        Some(remote) => {
            let (spec, line) = remote.wrap(
                &provider.command,
                cwd.to_path_buf(),
                env,
                &provider.env,
                &provider.env_passthrough,
                (provider.eof_grace, provider.term_grace),
            );
            (spec, Some(line))
        }
        None => {
            let spec = SpawnSpec {
                argv: provider.command.clone(),
                cwd: cwd.to_path_buf(),
                env: env.to_vec(),
            };
            (spec, None)
        }
    }
}

/// For a remote provider whose local process exited before the child answered (`exited`, a
/// `process-exit` failure): the failure as what went wrong on the way, with the far side's
/// name; `None` when it was not the way there (the far command itself failed).
pub(crate) fn far_failure(
    provider: &ProviderConfig,
    exited: &Failure,
    stderr: &[String],
) -> Option<(Failure, String, FarFailure)> {
    let remote = provider.remote.as_ref()?;
    let ssh = matches!(remote.via, Via::Ssh { .. });
    let far = classify(ssh, exited.exit_code, stderr)?;
    let failure = Failure {
        stage: Stage::Spawn,
        category: far.category(),
        code: None,
        exit_code: exited.exit_code,
        signal: None,
    };
    Some((failure, remote.target(), far))
}

#[cfg(test)]
mod tests;

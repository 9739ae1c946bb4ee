//! The units under a real systemd: a Debian 12 container (systemd 252 as PID 1, journald,
//! logind) booted with systemd-nspawn, acpd installed in it as README says, then tried as an
//! operator would — socket activation, the group gate, READY and STATUS, `systemctl reload`
//! with a good and a broken file, `systemctl stop` during a run with a TERM-deaf child and its
//! grandchild, the watchdog, journald fields, `systemd-analyze security`; then the user units
//! of a lingering user the same way. Skipped, saying why, when not root, when nspawn is
//! missing, when the cached root (`.ci/nspawn-root`) is absent, or when the container does not
//! boot. Durations are printed, never asserted.
#![allow(clippy::unwrap_used, clippy::expect_used)] // tests and benches may panic

use crate::nspawn;

use std::path::Path;
use std::time::{Duration, Instant};

use nspawn::{Client, Container, Layout};
use serde_json::Value;

const BIN: &str = env!("CARGO_BIN_EXE_acpd");
const SOCKET: &str = "/run/acpd/acpd.sock";

/// A turn whose child ignores cancel, stdin EOF and SIGTERM, with a TERM-deaf grandchild.
const DEAF_TURN: &str = ":ignore-term\n:ignore-eof\n:pid\n:grandchild\n:hang-deaf";

/// Each provider's graces, short so a TERM-deaf child costs ~3 s of `systemctl stop`.
const GRACES: &str = "cancel_grace = \"1s\"\neof_grace = \"1s\"\nterm_grace = \"1s\"\n";

/// An echo agent whose script leaves a `setsid` + double-forked sleeper behind: only a cgroup
/// finds it (it is in no process group of acpd's).
const SETSID_AGENT: &str = "#!/bin/sh\n\
    setsid -f sh -c 'echo $$ > \"$ESCAPED_PID_FILE\"; exec sleep 100000' </dev/null >/dev/null 2>&1\n\
    exec \"$ACPD_BIN\" agent echo\n";

fn providers_toml(acpd: &str, extra: &str) -> String {
    format!(
        "[providers.deaf]\ncommand = [\"{acpd}\", \"agent\", \"echo\"]\n{GRACES}\n\
         [providers.setsid]\ncommand = [\"/usr/local/lib/acpd-test/setsid-agent.sh\"]\n\
         env = {{ ACPD_BIN = \"{acpd}\", ESCAPED_PID_FILE = \"{extra}/escaped.pid\" }}\n{GRACES}\n"
    )
}

#[test]
fn the_units_under_a_real_systemd() {
    check_the_units(Layout::Host);
}

/// The same with cgroup2 alone in the container (nspawn can do that on a hybrid host): the
/// layout most systemd hosts have, and the one `Delegate=yes` containment is written for.
#[test]
fn the_units_under_a_real_systemd_with_cgroup2_only() {
    if nspawn::host_is_cgroup2_only() {
        eprintln!("skipped: the host is cgroup2-only, so the other test already boots that layout");
        return;
    }
    check_the_units(Layout::Cgroup2Only);
}

fn check_the_units(layout: Layout) {
    if let Some(why) = nspawn::unavailable() {
        eprintln!("skipped: {why}");
        return;
    }
    let started = Instant::now();
    let scratch = tempfile::tempdir().unwrap();
    let fixtures = scratch.path().join("fixtures");
    std::fs::create_dir(&fixtures).unwrap();
    std::fs::write(fixtures.join("setsid-agent.sh"), SETSID_AGENT).unwrap();
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let tag = layout.tag();
    let name = format!("acpd-test-{}-{tag}", std::process::id());
    let binds = [
        (Path::new(BIN), "/mnt/acpd/acpd"),
        (&repo.join("systemd"), "/mnt/acpd/systemd"),
        (&fixtures, "/mnt/acpd/fixtures"),
    ];
    let log = scratch.path().join("nspawn.log");
    let c = match Container::boot(&name, layout, &binds, &log) {
        Ok(c) => c,
        Err(why) => {
            eprintln!("skipped ({tag}): the container did not boot: {why}");
            return;
        }
    };
    let cgroups = c.sh("stat -fc %T /sys/fs/cgroup").stdout;
    c.note(&format!(
        "booted in {:.1?}; /sys/fs/cgroup inside is {}",
        started.elapsed(),
        cgroups.trim()
    ));
    system::all(&c);
    c.note(&format!(
        "system units checked at {:.1?}",
        started.elapsed()
    ));
    user::all(&c);
    c.note(&format!(
        "user units checked; total {:.1?}",
        started.elapsed()
    ));
}

/// `journalctl` lines (message only) matching `filter`, since `since` (epoch seconds inside).
fn journal(c: &Container, filter: &str, since: &str) -> String {
    c.sh(&format!(
        "journalctl --no-pager -o cat --since @{since} {filter}"
    ))
    .stdout
}

/// The container's clock, as `journalctl --since @…` takes it.
fn now(c: &Container) -> String {
    c.sh("date +%s.%N").ok("date").trim().to_string()
}

/// The first pid after `label ` in the turn's text (`pid 12`, `grandchild 13`).
fn pid_after(text: &str, label: &str) -> i32 {
    text.lines()
        .find_map(|l| l.strip_prefix(label).and_then(|r| r.trim().parse().ok()))
        .unwrap_or_else(|| panic!("no `{label}` line in {text:?}"))
}

/// Stops the unit (as `stop` says) while `client` holds a turn on a TERM-deaf child with a
/// grandchild: everything is gone afterwards, and systemd neither timed out nor SIGKILLed.
/// `journal_filter` selects the unit's messages and systemd's about it.
fn stop_during_a_run(
    c: &Container,
    mut client: Client,
    cwd: &str,
    stop: &str,
    journal_filter: &str,
) {
    let session = client.new_session(cwd, "deaf");
    // Deaf to cancel, EOF and SIGTERM: the whole ladder runs, to the group SIGKILL.
    client.prompt(&session, DEAF_TURN);
    let text = client.until_text("grandchild ");
    let (child, grandchild) = (pid_after(&text, "pid "), pid_after(&text, "grandchild "));
    assert!(c.alive(child) && c.alive(grandchild));
    let since = now(c);
    let t = Instant::now();
    c.sh(stop).ok(stop);
    c.note(&format!(
        "`{stop}` with a TERM-deaf child and grandchild took {:.1?}",
        t.elapsed()
    ));
    for pid in [child, grandchild] {
        assert!(!c.alive(pid), "pid {pid} survived `{stop}`");
    }
    let said = journal(c, journal_filter, &since);
    // The filter sees systemd's own lines about the unit, so their absence below means something.
    assert!(said.contains("Stopped acpd.service"), "{said}");
    // systemd's words when it kills what a stop left ("Killing process N (x) with signal
    // SIGKILL"); acpd's own ladder may SIGKILL, and may say so.
    assert!(
        !said.contains("with signal SIGKILL"),
        "systemd had to SIGKILL:\n{said}"
    );
    assert!(!said.contains("timed out"), "the stop timed out:\n{said}");
    drop(client);
}

mod system {
    use super::*;

    const CONFIG: &str = "/etc/acpd/config.toml";

    pub fn all(c: &Container) {
        install(c);
        activation_and_the_group_gate(c);
        acpd_refuses_outsiders_itself(c);
        reload(c);
        stop(c);
        watchdog(c);
        security(c);
    }

    fn install(c: &Container) {
        c.sh("install -d /etc/acpd").ok("mkdir /etc/acpd");
        let config = format!(
            "allow_group = \"acpd\"\n{}",
            providers_toml("/usr/local/bin/acpd", "/srv/acpd")
        );
        c.write(CONFIG, &config);
        // README's "System-wide" steps, as root inside (no sudo in a minimal image).
        c.sh(
            "set -e
            install -m755 /mnt/acpd/acpd /usr/local/bin/acpd
            useradd --system --user-group --home-dir /var/lib/acpd/home --no-create-home \
                --shell /bin/bash acpd
            useradd --create-home --shell /bin/bash alice
            usermod -aG acpd alice
            useradd --create-home --shell /bin/bash bob
            install -d -o acpd -g acpd -m 2770 /srv/acpd
            chmod 644 /etc/acpd/config.toml
            printf 'ACPD_LOG=info\\n' > /etc/acpd/env && chmod 600 /etc/acpd/env
            install -Dm755 /mnt/acpd/fixtures/setsid-agent.sh /usr/local/lib/acpd-test/setsid-agent.sh
            install -m644 -t /etc/systemd/system /mnt/acpd/systemd/system/acpd.socket \
                /mnt/acpd/systemd/system/acpd.service
            # Test only: a watchdog that fires in seconds, not 30.
            mkdir -p /etc/systemd/system/acpd.service.d
            printf '[Service]\\nWatchdogSec=3s\\n' > /etc/systemd/system/acpd.service.d/watchdog.conf
            systemctl daemon-reload
            systemctl enable --now acpd.socket",
        )
        .ok("install the system units");
    }

    fn alice_connect(c: &Container) -> Client {
        Client::spawn(c.command(&[
            "runuser",
            "-u",
            "alice",
            "--",
            "/usr/local/bin/acpd",
            "connect",
            "--socket",
            SOCKET,
        ]))
    }

    fn status_as_alice(c: &Container) -> Value {
        let out = c
            .sh(&format!(
                "runuser -u alice -- acpd status --json --socket {SOCKET}"
            ))
            .ok("acpd status as alice");
        serde_json::from_str(&out).unwrap()
    }

    fn activation_and_the_group_gate(c: &Container) {
        assert_eq!(
            c.sh("systemctl is-active acpd.socket").stdout.trim(),
            "active"
        );
        assert_eq!(
            c.sh("systemctl is-active acpd.service").stdout.trim(),
            "inactive"
        );
        // Outside the group: the socket's mode refuses bob before acpd or systemd see him.
        let bob = c.sh(&format!("runuser -u bob -- acpd status --socket {SOCKET}"));
        assert_eq!(bob.code, 1, "{bob:?}");
        assert!(bob.stderr.contains("Permission denied"), "{bob:?}");
        assert_eq!(
            c.sh("systemctl is-active acpd.service").stdout.trim(),
            "inactive"
        );

        // A member's first connection starts acpd; a turn goes through `acpd connect`.
        let since = now(c);
        let mut alice = alice_connect(c);
        alice.initialize();
        let session = alice.new_session("/srv/acpd", "echo");
        let id = alice.prompt(&session, "hello from alice");
        let answer = alice.answer(id).unwrap();
        assert_eq!(answer["stopReason"], "end_turn");
        assert!(
            alice.text().contains("hello from alice"),
            "{}",
            alice.text()
        );
        assert_eq!(alice.close().and_then(|s| s.code()), Some(0));

        // READY=1 made it active/running; the STATUS= line is in `systemctl status`.
        let show = c
            .sh("systemctl show -p ActiveState -p SubState -p StatusText acpd.service")
            .ok("systemctl show");
        assert!(
            show.contains("ActiveState=active") && show.contains("SubState=running"),
            "{show}"
        );
        assert!(
            c.until(
                Duration::from_secs(15),
                "systemctl status acpd.service --no-pager | grep -q 'Status: \".* connections, .* runs'"
            ),
            "{}",
            c.sh("systemctl status acpd.service --no-pager").stdout
        );
        // journald: the session (detached when alice left), with its structured PROVIDER= field.
        assert!(
            c.until(
                Duration::from_secs(10),
                &format!("journalctl -u acpd --since @{since} PROVIDER=echo -o cat | grep -q 'bridge session'")
            ),
            "{}",
            c.sh("journalctl -u acpd -o json --no-pager").stdout
        );
    }

    /// With the socket opened up by mistake (0666), acpd's own SO_PEERCRED check refuses bob.
    fn acpd_refuses_outsiders_itself(c: &Container) {
        let since = now(c);
        c.sh(&format!("chmod 666 {SOCKET}")).ok("chmod");
        let bob = c.sh(&format!("runuser -u bob -- acpd status --socket {SOCKET}"));
        c.sh(&format!("chmod 660 {SOCKET}")).ok("chmod back");
        assert_eq!(bob.code, 1, "{bob:?}");
        assert!(
            c.until(
                Duration::from_secs(10),
                &format!("journalctl -u acpd --since @{since} -o cat | grep -q 'refused a connection from another user'")
            ),
            "{}",
            journal(c, "-u acpd", &since)
        );
    }

    fn reload(c: &Container) {
        let good = format!(
            "allow_group = \"acpd\"\n{}[providers.extra]\ncommand = [\"/usr/local/bin/acpd\", \"agent\", \"echo\"]\n",
            providers_toml("/usr/local/bin/acpd", "/srv/acpd")
        );
        c.write(CONFIG, &good);
        c.sh("systemctl reload acpd")
            .ok("systemctl reload with a good file");
        let providers = status_as_alice(c)["providers"].clone();
        assert!(
            providers.as_array().unwrap().contains(&"extra".into()),
            "{providers}"
        );

        let since = now(c);
        c.write(CONFIG, &format!("max_children = \"lots\"\n{good}"));
        let out = c.sh("systemctl reload acpd");
        assert_ne!(out.code, 0, "a broken file reloaded: {out:?}");
        let said = journal(c, "-u acpd", &since);
        assert!(
            said.contains("/etc/acpd/config.toml:1: max_children"),
            "the journal does not say why:\n{said}"
        );
        c.note(&format!(
            "systemctl reload with a broken file: exit {}, journal: {}",
            out.code,
            said.lines()
                .find(|l| l.contains("max_children"))
                .unwrap_or("")
        ));
        assert_eq!(
            c.sh("systemctl is-active acpd.service").stdout.trim(),
            "active"
        );
        let providers = status_as_alice(c)["providers"].clone();
        assert!(
            providers.as_array().unwrap().contains(&"extra".into()),
            "{providers}"
        );
        c.write(CONFIG, &good);
        c.sh("systemctl reload acpd")
            .ok("systemctl reload after the fix");
    }

    fn stop(c: &Container) {
        let mut alice = alice_connect(c);
        alice.initialize();
        let cgroup_mode = status_as_alice(c)["containment"]["mode"] == "cgroup";
        let escaped = if cgroup_mode {
            let s = alice.new_session("/srv/acpd", "setsid");
            let _ = alice.prompt(&s, ":hang");
            assert!(c.until(Duration::from_secs(10), "test -s /srv/acpd/escaped.pid"));
            let pid: i32 = c
                .sh("cat /srv/acpd/escaped.pid")
                .stdout
                .trim()
                .parse()
                .unwrap();
            assert!(c.alive(pid));
            Some(pid)
        } else {
            c.note(
                "note: acpd reports no cgroup containment here, so the setsid descendant check \
                 (Delegate=yes) is not run",
            );
            None
        };
        stop_during_a_run(
            c,
            alice,
            "/srv/acpd",
            "systemctl stop acpd.service",
            "-u acpd",
        );
        match escaped {
            Some(pid) => assert!(!c.alive(pid), "the setsid descendant {pid} survived"),
            None => setsid_without_cgroups(c),
        }
        let procs = c.sh("systemctl show -p ControlGroup --value acpd.service");
        assert_eq!(
            procs.stdout.trim(),
            "",
            "the unit still has a cgroup: {procs:?}"
        );
        // The socket is still there: the next connection starts acpd again.
        assert_eq!(
            c.sh("systemctl is-active acpd.socket").stdout.trim(),
            "active"
        );
    }

    /// Without cgroup containment, says (does not assert) who ends a `setsid` descendant at
    /// stop: acpd's process groups cannot find it, so systemd's final SIGKILL of the unit's
    /// cgroup (KillMode=mixed) does.
    fn setsid_without_cgroups(c: &Container) {
        c.sh("rm -f /srv/acpd/escaped.pid").ok("rm");
        let mut alice = alice_connect(c);
        alice.initialize();
        let s = alice.new_session("/srv/acpd", "setsid");
        let _ = alice.prompt(&s, ":hang");
        assert!(c.until(Duration::from_secs(10), "test -s /srv/acpd/escaped.pid"));
        let pid: i32 = c
            .sh("cat /srv/acpd/escaped.pid")
            .stdout
            .trim()
            .parse()
            .unwrap();
        assert!(c.alive(pid));
        let since = now(c);
        c.sh("systemctl stop acpd.service").ok("stop");
        let said = journal(c, "-u acpd", &since);
        let killed = said
            .lines()
            .find(|l| l.contains("with signal SIGKILL"))
            .unwrap_or("no SIGKILL line");
        c.note(&format!(
            "note: without cgroups the setsid descendant {} at stop; systemd: {killed}",
            if c.alive(pid) { "survived" } else { "was gone" }
        ));
        drop(alice);
    }

    fn watchdog(c: &Container) {
        let mut alice = alice_connect(c);
        alice.initialize();
        let session = alice.new_session("/srv/acpd", "deaf");
        alice.prompt(&session, DEAF_TURN);
        let text = alice.until_text("grandchild ");
        let (child, grandchild) = (pid_after(&text, "pid "), pid_after(&text, "grandchild "));
        let main: i32 = c
            .sh("systemctl show -p MainPID --value acpd.service")
            .stdout
            .trim()
            .parse()
            .unwrap();
        let since = now(c);
        let host = c.host_pid(main).expect("acpd's host pid");
        let t = Instant::now();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(host),
            nix::sys::signal::Signal::SIGSTOP,
        )
        .unwrap();
        let restarted = c.until(
            Duration::from_secs(60),
            &format!(
                "m=$(systemctl show -p MainPID --value acpd.service); \
                 [ \"$m\" != 0 ] && [ \"$m\" != {main} ] && systemctl is-active -q acpd.service"
            ),
        );
        assert!(restarted, "{}", journal(c, "-u acpd", &since));
        c.note(&format!(
            "watchdog: a SIGSTOPped acpd was replaced after {:.1?}",
            t.elapsed()
        ));
        drop(alice);
        let said = journal(c, "-u acpd", &since);
        assert!(said.contains("Watchdog timeout"), "{said}");
        for pid in [main, child, grandchild] {
            assert!(!c.alive(pid), "pid {pid} outlived the watchdog kill");
        }
        // The new acpd swept the dead one's record; only its own is left.
        assert!(
            c.until(
                Duration::from_secs(10),
                &format!("journalctl -u acpd --since @{since} -o cat | grep -Eq 'removed records of dead acpd|swept process groups'")
            ),
            "{said}"
        );
        let records = c.sh("ls /var/lib/acpd").stdout;
        assert!(!records.contains(&format!("acpd-{main}-")), "{records}");
    }

    fn security(c: &Container) {
        let out = c.sh("systemd-analyze security acpd.service --no-pager");
        let score = out
            .stdout
            .lines()
            .find(|l| l.contains("Overall exposure level"))
            .unwrap_or_else(|| panic!("no score: {out:?}"))
            .to_string();
        c.note(&format!(
            "systemd-analyze security on the booted system: {}",
            score.trim()
        ));
    }
}

mod user {
    use super::*;

    pub fn all(c: &Container) {
        let config = providers_toml("/home/alice/.cargo/bin/acpd", "/home/alice");
        c.sh("loginctl enable-linger alice").ok("enable-linger");
        assert!(
            c.until(
                Duration::from_secs(30),
                "systemctl is-active -q user@$(id -u alice).service"
            ),
            "{}",
            c.sh("systemctl status user@$(id -u alice).service --no-pager")
                .stdout
        );
        // README's "Per user" steps, as alice (`cargo install` becomes a copy).
        c.sh_as(
            "alice",
            "set -e
            install -Dm755 /mnt/acpd/acpd ~/.cargo/bin/acpd
            install -Dm644 -t ~/.config/systemd/user /mnt/acpd/systemd/user/acpd.socket \
                /mnt/acpd/systemd/user/acpd.service
            mkdir -p ~/.config/acpd
            printf 'ACPD_LOG=info\\n' > ~/.config/acpd/env && chmod 600 ~/.config/acpd/env
            systemctl --user daemon-reload
            systemctl --user enable --now acpd.socket",
        )
        .ok("install the user units");
        c.write("/home/alice/.config/acpd/config.toml", &config);
        assert_eq!(
            c.sh_as("alice", "systemctl --user is-active acpd.service")
                .stdout
                .trim(),
            "inactive"
        );

        let connect = || {
            Client::spawn(c.command(&[
                "runuser",
                "-u",
                "alice",
                "--",
                "sh",
                "-c",
                "XDG_RUNTIME_DIR=/run/user/$(id -u) exec ~/.cargo/bin/acpd connect",
            ]))
        };
        let mut alice = connect();
        alice.initialize();
        let session = alice.new_session("/home/alice", "echo");
        let id = alice.prompt(&session, "hello from alice's own acpd");
        assert_eq!(alice.answer(id).unwrap()["stopReason"], "end_turn");
        assert!(alice.text().contains("own acpd"), "{}", alice.text());
        assert_eq!(alice.close().and_then(|s| s.code()), Some(0));
        assert_eq!(
            c.sh_as("alice", "systemctl --user is-active acpd.service")
                .stdout
                .trim(),
            "active"
        );

        let good = format!(
            "{config}[providers.extra]\ncommand = [\"/home/alice/.cargo/bin/acpd\", \"agent\", \"echo\"]\n"
        );
        c.write("/home/alice/.config/acpd/config.toml", &good);
        c.sh_as("alice", "systemctl --user reload acpd")
            .ok("user reload, good file");
        let status = c
            .sh_as("alice", "~/.cargo/bin/acpd status --json")
            .ok("status");
        assert!(status.contains("\"extra\""), "{status}");
        c.write(
            "/home/alice/.config/acpd/config.toml",
            &format!("max_children = \"lots\"\n{good}"),
        );
        let out = c.sh_as("alice", "systemctl --user reload acpd");
        assert_ne!(out.code, 0, "a broken file reloaded: {out:?}");
        let status = c
            .sh_as("alice", "~/.cargo/bin/acpd status --json")
            .ok("status");
        assert!(status.contains("\"extra\""), "{status}");

        let mut alice = connect();
        alice.initialize();
        stop_during_a_run(
            c,
            alice,
            "/home/alice",
            "runuser -u alice -- sh -c 'XDG_RUNTIME_DIR=/run/user/$(id -u) systemctl --user stop acpd.service'",
            "_SYSTEMD_USER_UNIT=acpd.service + USER_UNIT=acpd.service",
        );
    }
}

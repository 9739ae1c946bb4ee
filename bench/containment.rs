//! (7) Containment: what a child's own cgroup costs, and what the sentinel costs an acpd.
//!
//! - Per child: `_acpd/subagent/start` to published plus its dispose, in a daemon with
//!   `containment = "cgroup"` against one with `containment = "process-group"`, started side
//!   by side and measured in alternating rounds (the cgroup adds a mkdir, a write to
//!   `cgroup.procs` between fork and exec, and `cgroup.kill` + `rmdir` at the end).
//! - Per acpd: the sentinel's private memory (its file pages are the acpd binary's, shared)
//!   against the daemon's resident memory, and what spawning it costs the acpd that starts it
//!   (fork + exec, measured on its own).

use std::time::Instant;

use serde_json::{Value, json};

use crate::scale::{Ctl, median};
use crate::{ACPD, Opts};

fn config(mode: &str) -> String {
    format!(
        "containment = \"{mode}\"\n[providers.echo]\ncommand = [\"{ACPD}\", \"agent\", \"echo\"]\n"
    )
}

/// True when this process may create cgroups where acpd would.
fn cgroups_work() -> bool {
    let Ok(dir) = acpd::testing::own_dir() else {
        return false;
    };
    let probe = dir.join(format!("acpd-bench-probe-{}", std::process::id()));
    let made = std::fs::create_dir(&probe).is_ok();
    let kill = made && probe.join("cgroup.kill").exists();
    let _ = std::fs::remove_dir(&probe);
    kill
}

/// The daemon's sentinel: its child whose command line is `acpd sentinel`.
fn sentinel_of(pid: u32) -> Option<u32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let child: u32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
        let ppid: u32 = stat[stat.rfind(')')? + 1..]
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        (ppid == pid && crate::scale::is_sentinel(&e.path())).then_some(child)
    })
}

async fn cycle(ctl: &Ctl) -> f64 {
    let started = Instant::now();
    let run = ctl.start("echo", "").await;
    ctl.call("_acpd/subagent/dispose", json!({"runId": run}))
        .await;
    started.elapsed().as_secs_f64() * 1e3
}

pub async fn run(opts: &Opts) -> Value {
    let reps = if opts.quick { 5 } else { 30 };
    if !cgroups_work() {
        println!("\n(7) containment: skipped, this process cannot create cgroups here");
        return Value::Null;
    }
    let groups = Ctl::serve(&config("process-group"), 16).await;
    let cgroups = Ctl::serve(&config("cgroup"), 16).await;
    let status = cgroups.call("_acpd/status", json!({})).await;
    assert_eq!(
        status["containment"]["mode"], "cgroup",
        "the cgroup daemon fell back: {status}"
    );
    // One warm-up cycle each, then alternate.
    cycle(&groups).await;
    cycle(&cgroups).await;
    let (mut pg, mut cg) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        pg.push(cycle(&groups).await);
        cg.push(cycle(&cgroups).await);
    }
    let (pg, cg) = (median(pg), median(cg));
    let sentinel = sentinel_of(cgroups.pid()).expect("the daemon's sentinel");
    // Its file-backed pages are the acpd binary's, shared with the daemon; RssAnon is its own.
    let sentinel_kib = crate::scale::status_field(sentinel, "VmRSS:");
    let sentinel_private_kib = crate::scale::status_field(sentinel, "RssAnon:");
    let daemon_kib = cgroups.rss_kib();
    let mut spawn = Vec::new();
    for _ in 0..reps {
        let started = Instant::now();
        let mut child = std::process::Command::new(ACPD)
            .arg("sentinel")
            .stdin(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        spawn.push(started.elapsed().as_secs_f64() * 1e3);
        drop(child.stdin.take());
        child.wait().unwrap();
    }
    let spawn = median(spawn);
    println!(
        "\n(7) containment (median of {reps}): start + dispose with its own cgroup {cg:.2} ms, with a process group {pg:.2} ms, ratio {:.3}; the sentinel (one per acpd) {sentinel_private_kib} KiB private ({sentinel_kib} KiB resident with the binary's shared pages) vs the daemon's {daemon_kib} KiB resident, ratio {:.3}; spawning it costs acpd {spawn:.2} ms once",
        cg / pg,
        sentinel_private_kib as f64 / daemon_kib as f64
    );
    json!({
        "cgroupCycleMs": cg,
        "processGroupCycleMs": pg,
        "ratio": cg / pg,
        "sentinelRssKiB": sentinel_kib,
        "sentinelPrivateKiB": sentinel_private_kib,
        "daemonRssKiB": daemon_kib,
        "sentinelRssRatio": sentinel_private_kib as f64 / daemon_kib as f64,
        "sentinelSpawnMs": spawn,
    })
}

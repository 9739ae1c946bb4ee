//! The results table in docs/src/benchmarks.md (the book's Benchmarks chapter), regenerated
//! from a run (`--readme`, named when the table was in README.md), so the published
//! numbers are always what the command printed.

use std::fmt::Write as _;
use std::path::Path;

use serde_json::Value;

const BEGIN: &str = "<!-- bench:begin -->";
const END: &str = "<!-- bench:end -->";

fn f(v: &Value, digits: usize) -> String {
    v.as_f64().map_or("–".into(), |x| format!("{x:.digits$}"))
}

pub fn markdown(r: &Value) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "Measured by `cargo bench -p acpd --bench acpd -- --readme{}` on this machine ({} cores), acpd {}.\n",
        if r["quick"] == true { " --quick" } else { "" },
        r["cores"],
        r["version"].as_str().unwrap_or("?")
    );
    let h = &r["hotPath"];
    let _ = writeln!(
        md,
        "**Hot path** (CPU per forwarded `session/update`: the process's own utime + stime from `/proc/PID/stat` over {} updates of {} B text, {}-byte lines to a parent that reads as fast as it can; median of {} interleaved rounds): `acpd stdio` **{} µs** per update, the {} in the same place (two threads copying read → write, no parsing) {} µs: **{}×** the relay (schedstat: {} vs {} µs, {}×; the bench's Rust relay {} µs).\n",
        h["updates"],
        h["chunkBytes"],
        f(&h["lineBytes"], 0),
        h["rounds"],
        f(&h["acpdUsPerUpdate"], 2),
        h["baseline"].as_str().unwrap_or("relay"),
        f(&h["relayUsPerUpdate"], 2),
        f(&h["ratio"], 1),
        f(&h["acpdSchedUsPerUpdate"], 2),
        f(&h["relaySchedUsPerUpdate"], 2),
        f(&h["schedRatio"], 1),
        f(&h["rustRelayUsPerUpdate"], 2),
    );
    let p = &h["perMessage"];
    if !p.is_null() {
        let _ = writeln!(
            md,
            "**Hot path, one update per write** (the same measure, the stream written by a Python agent that writes and flushes each update on its own, as ACP agents do, so each read carries one line or a few; {} updates, median of {} rounds): `acpd stdio` **{} µs**, the {} {} µs: **{}×** (schedstat {}×).\n",
            p["updates"],
            p["rounds"],
            f(&p["acpdUsPerUpdate"], 2),
            p["baseline"].as_str().unwrap_or("relay"),
            f(&p["relayUsPerUpdate"], 2),
            f(&p["ratio"], 1),
            f(&p["schedRatio"], 1),
        );
    }
    let b = &h["cpuBound"];
    if !b.is_null() {
        let _ = writeln!(
            md,
            "**CPU-bound pair** (a Python agent streams {} {}-byte chunks, one `json.dumps` and one write each, to a Python parent that `json.loads` every line; best of {} interleaved): direct {} ms, through `acpd stdio` {} ms: **{}×** direct's throughput (through the C relay {} ms, {}×).\n",
            b["messages"],
            b["chunkBytes"],
            b["rounds"],
            f(&b["directMs"], 0),
            f(&b["acpdMs"], 0),
            f(&b["throughputRatio"], 2),
            f(&b["relayMs"], 0),
            f(&b["relayThroughputRatio"], 2),
        );
    }
    let st = &r["streaming"];
    let _ = writeln!(
        md,
        "**Streaming** ({} `agent_message_chunk` updates to an ACP Rust SDK client, best of {}; latency of {} stamped chunks sent 1 ms apart):\n",
        st["messages"], st["rounds"], st["pacedMessages"]
    );
    let _ = writeln!(
        md,
        "| path | chunk | time | throughput vs direct | p50 | p99 | added p50 | added p99 | peak RSS |"
    );
    let _ = writeln!(md, "|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for run in r["streaming"]["runs"].as_array().into_iter().flatten() {
        let rss = run["peakRssKiB"]
            .as_u64()
            .map_or("–".into(), |k| format!("{:.1} MiB", k as f64 / 1024.0));
        let _ = writeln!(
            md,
            "| {} | {} B | {} ms | {}× | {} µs | {} µs | {} µs | {} µs | {} |",
            run["path"].as_str().unwrap_or("?"),
            run["chunkBytes"],
            f(&run["ms"], 0),
            f(&run["throughputRatio"], 2),
            f(&run["latencyP50Us"], 0),
            f(&run["latencyP99Us"], 0),
            f(&run["addedP50Us"], 0),
            f(&run["addedP99Us"], 0),
            rss
        );
    }
    let slow = &r["streaming"]["slowParent"];
    let _ = writeln!(
        md,
        "\nPeak RSS of `acpd stdio` while a parent reads {} MiB of 4 KiB chunks slowly: **{:.1} MiB**.\n",
        slow["bytes"].as_u64().unwrap_or(0) >> 20,
        slow["peakRssKiB"].as_f64().unwrap_or(0.0) / 1024.0
    );
    let s = &r["start"];
    let _ = writeln!(
        md,
        "**Start**: `_acpd/subagent/start` to published {} ms vs the child's own spawn + initialize + session/new {} ms: **+{} ms**.\n",
        f(&s["acpdMs"], 2),
        f(&s["directMs"], 2),
        f(&s["addedMs"], 2)
    );
    let _ = writeln!(
        md,
        "**Scale** (K live `echo` children, each idle after one turn, all runs of one parent, in one `acpd stdio` and in one `acpd serve`; per child = (RSS with K − RSS of the same warm acpd with none) / K; dispose of all K at once, per child, against one cooperative dispose alone in the same acpd; targets: ≤ 48 KiB per child, flat from 64 to 1 024, dispose ≤ 2 ms each):\n"
    );
    let _ = writeln!(
        md,
        "| acpd | K | start all | RSS with 0 | RSS with K | per child | dispose all | per child | one alone | ratio | threads | fds | left after |"
    );
    let _ = writeln!(
        md,
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
    );
    for k in r["scale"].as_array().into_iter().flatten() {
        let _ = writeln!(
            md,
            "| {} | {} | {} ms | {:.1} MiB | {:.1} MiB | **{} KiB** | {} ms | **{} ms** | {} ms | {}× | {} | {} | {} |",
            k["host"].as_str().unwrap_or("serve"),
            k["children"],
            f(&k["startAllMs"], 0),
            k["baseRssKiB"].as_f64().unwrap_or(0.0) / 1024.0,
            k["rssKiB"].as_f64().unwrap_or(0.0) / 1024.0,
            f(&k["perChildKiB"], 1),
            f(&k["disposeAllMs"], 0),
            f(&k["disposePerChildMs"], 2),
            f(&k["disposeAloneMs"], 2),
            f(&k["disposeRatio"], 2),
            k["threads"],
            k["fds"],
            k["leftAfterDispose"]
        );
    }
    let t = &r["teardown"];
    let _ = writeln!(
        md,
        "\n**Teardown**: dispose of a cooperative child {} ms; of an EOF-deaf, SIGTERM-ignoring one {} ms = eof_grace + term_grace ({} ms) **+ {} ms**.",
        f(&t["cooperativeMs"], 2),
        f(&t["deafMs"], 1),
        f(&t["gracesMs"], 0),
        f(&t["deafOverGracesMs"], 2)
    );
    let w = &r["warm"];
    if !w.is_null() {
        let _ = writeln!(
            md,
            "\n**Warm start** (an agent whose initialize takes {} ms): bridge `session/new` through `acpd serve` with a ready spare (`warm = 1`) {} ms vs the same agent's cold spawn + initialize + session/new {} ms: **{}×** (target ≤ 0.15×).",
            w["initMs"],
            f(&w["warmMs"], 1),
            f(&w["coldMs"], 1),
            f(&w["ratio"], 3)
        );
    }
    for a in r["warmAgents"]["agents"].as_array().into_iter().flatten() {
        if a["ratio"].is_null() {
            continue;
        }
        let _ = writeln!(
            md,
            "- {} (offline, mock model): `session/new` through `acpd stdio` with `warm = 1` {} ms vs its own cold start {} ms: **{}×**.",
            a["agent"].as_str().unwrap_or("?"),
            f(&a["warmMs"], 0),
            f(&a["coldMs"], 0),
            f(&a["ratio"], 3)
        );
    }
    let c = &r["containment"];
    if !c.is_null() {
        let _ = writeln!(
            md,
            "\n**Containment**: start + dispose of a child in its own cgroup {} ms vs in a process group only {} ms: **{}×**; the sentinel (one per acpd, not per child) {} KiB private ({} KiB resident with the binary's shared pages) vs the daemon's {} KiB resident (**{}×**), spawned once for {} ms.",
            f(&c["cgroupCycleMs"], 2),
            f(&c["processGroupCycleMs"], 2),
            f(&c["ratio"], 3),
            c["sentinelPrivateKiB"],
            c["sentinelRssKiB"],
            c["daemonRssKiB"],
            f(&c["sentinelRssRatio"], 3),
            f(&c["sentinelSpawnMs"], 2)
        );
    }
    network(&mut md, &r["network"]);
    md
}

/// Row (6): the network face's doors against the Unix socket of the same daemon.
fn network(md: &mut String, n: &Value) {
    if n.is_null() {
        return;
    }
    let _ = writeln!(
        md,
        "\n**Network face** (one `acpd serve`, the echo agent streaming {} updates of {} B to a client reading as fast as it can through each door; CPU = the daemon's utime + stime per update, median of {} interleaved rounds, target ≤ 1.5× the Unix socket; first chunk = prompt sent → first `agent_message_chunk` read, median of {}; the peer `acpremote expose` + `acpremote mirror` 1.10 is charged both its processes):\n",
        n["updates"], n["chunkBytes"], n["rounds"], n["firstChunkRounds"]
    );
    let _ = writeln!(
        md,
        "| door | CPU per update | vs Unix socket | first chunk | vs Unix socket |\n|---|---:|---:|---:|---:|"
    );
    for d in n["doors"].as_array().into_iter().flatten() {
        let _ = writeln!(
            md,
            "| {} | {} µs | **{}×** | {} µs | {}× |",
            d["door"].as_str().unwrap_or("?"),
            f(&d["cpuUsPerUpdate"], 2),
            f(&d["cpuRatio"], 2),
            f(&d["firstChunkUs"], 0),
            f(&d["firstChunkRatio"], 2)
        );
    }
    if let Some(why) = n["peer"].as_str() {
        let _ = writeln!(md, "\nThe acpremote peer was skipped: {why}.");
    }
    let i = &n["idle"];
    let _ = writeln!(
        md,
        "\nIdle connections ({} initialized, none with a session): **{} KiB** of the daemon's VmRSS per WSS connection (target ≤ 64 KiB), {} KiB per Unix-socket connection ({}×).",
        i["connections"],
        f(&i["wssKiBEach"], 1),
        f(&i["unixKiBEach"], 1),
        f(&i["ratio"], 1)
    );
}

/// Replaces the block between the markers in `readme` with `table`.
pub fn update_readme(readme: &Path, table: &str) -> std::io::Result<()> {
    let text = std::fs::read_to_string(readme)?;
    let (Some(a), Some(b)) = (text.find(BEGIN), text.find(END)) else {
        return Err(std::io::Error::other(format!(
            "{} has no bench markers",
            readme.display()
        )));
    };
    let updated = format!("{}{BEGIN}\n{table}{}", &text[..a], &text[b..]);
    std::fs::write(readme, updated)
}

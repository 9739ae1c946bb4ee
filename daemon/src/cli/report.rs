//! `acpd status` and `acpd runs` for people: the daemon's answer as aligned tables (the
//! `--json` form is the answer itself). Every value is read defensively: a field that is
//! missing or of another type is shown as `-`, never a panic and never a JSON rendering
//! that ignores the column widths.

use serde_json::Value;

use super::daemon::containment_line;
use super::output::{Col, Grid, state_colour};

pub(super) fn print_status(v: &Value) -> std::io::Result<()> {
    let limits = &v["limits"];
    outln!(
        "acpd {} (pid {}), up {}",
        super::daemon::shown(v["version"].as_str().unwrap_or("?")),
        number(&v["pid"]),
        v["uptimeS"]
            .as_u64()
            .map_or("?".into(), |s| humantime::format_duration(
                std::time::Duration::from_secs(s)
            )
            .to_string())
    )?;
    outln!(
        "connections: {}   runs: {}   live children: {}/{}",
        number(&v["connections"]),
        number(&v["runs"]),
        number(&limits["liveChildren"]),
        number(&limits["maxChildren"])
    )?;
    outln!(
        "bridge sessions: {} attached, {} detached",
        number(&v["sessions"]["attached"]),
        number(&v["sessions"]["detached"]),
    )?;
    outln!("{}", containment_line(&v["containment"]))?;
    let providers = limits["providers"].as_object();
    if providers.is_none_or(|m| m.is_empty()) {
        return Ok(());
    }
    outln!("")?;
    let mut grid = Grid::new(&[
        ("PROVIDER", Col::Whole),
        ("LIVE", Col::Number),
        ("MAX", Col::Number),
        ("WARM SPARES", Col::Number),
        ("SANDBOX", Col::Whole),
    ]);
    for (name, p) in providers.into_iter().flatten() {
        grid.row([
            name.clone(),
            number(&p["live"]),
            number(&p["maxConcurrent"]),
            number(&v["spares"][name.as_str()]),
            p["sandbox"].as_str().unwrap_or("none").to_string(),
        ]);
    }
    grid.print()
}

/// A number from the daemon's answer as text; anything else (absent, a string) is `-`.
pub(super) fn number(v: &Value) -> String {
    v.as_u64()
        .map(|n| n.to_string())
        .or_else(|| v.as_i64().map(|n| n.to_string()))
        .unwrap_or_else(|| "-".into())
}

pub(super) fn print_runs(v: &Value) -> std::io::Result<()> {
    let mut grid = Grid::new(&[
        ("RUN", Col::Whole),
        ("PROVIDER", Col::Whole),
        ("LABEL", Col::Text(24)),
        ("STATE", Col::Whole),
        ("AGE", Col::Number),
        ("TOKENS", Col::Number),
        ("PID", Col::Number),
        ("DEPTH", Col::Number),
        ("CONN", Col::Number),
        ("PARENT", Col::Whole),
    ]);
    for r in v["runs"].as_array().into_iter().flatten() {
        let s = |k: &str| r[k].as_str().unwrap_or("-").to_owned();
        let state = s("state");
        let colour = state_colour(&state);
        grid.styled_row([
            (s("runId"), None),
            (s("provider"), None),
            (s("label"), None),
            (state, colour),
            (out_of(age(&r["ageS"]), &r["budget"]["wallS"], age), None),
            (
                out_of(number(&r["tokens"]), &r["budget"]["tokens"], number),
                None,
            ),
            (number(&r["pid"]), None),
            (number(&r["depth"]), None),
            (number(&r["connection"]), None),
            (s("parent"), None),
        ]);
    }
    grid.print()?;
    let sessions = v["sessions"].as_array().map_or(&[][..], |s| s.as_slice());
    if sessions.is_empty() {
        return Ok(());
    }
    outln!("")?;
    let mut grid = Grid::new(&[
        ("SESSION", Col::Whole),
        ("PROVIDER", Col::Whole),
        ("STATE", Col::Whole),
        ("PID", Col::Number),
    ]);
    for s in sessions {
        let f = |k: &str| s[k].as_str().unwrap_or("-").to_owned();
        let state = f("state");
        let colour = state_colour(&state);
        grid.styled_row([
            (f("sessionId"), None),
            (f("provider"), None),
            (state, colour),
            (number(&s["pid"]), None),
        ]);
    }
    grid.print()
}

/// What a run spent, and `/` its budget when it has one (`1200/5000`, `40s/30m`).
fn out_of(spent: String, budget: &Value, show: fn(&Value) -> String) -> String {
    if budget.is_null() {
        spent
    } else {
        format!("{spent}/{}", show(budget))
    }
}

/// A run's age in seconds as `1m 5s`.
fn age(v: &Value) -> String {
    v.as_u64().map_or("-".into(), |s| {
        humantime::format_duration(std::time::Duration::from_secs(s)).to_string()
    })
}

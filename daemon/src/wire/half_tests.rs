//! Unfinished lines bounded in time and, across readers, in bytes: readers over duplex pipes
//! sharing a small budget, in paused time.

use std::sync::Arc;
use std::time::Duration;

use acpd_protocol::envelope::Message;
use tokio::io::{AsyncWriteExt, DuplexStream};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::half::{ALLOWANCE, Exhausted, HalfBudget};
use super::*;

const TIMEOUT: Duration = Duration::from_secs(5);
const BUDGET: usize = 1 << 20;

fn limits() -> WireLimits {
    WireLimits {
        max_line: 4 << 20,
        line_timeout: TIMEOUT,
        write_timeout: TIMEOUT,
    }
}

/// A budgeted reader over a pipe that holds at most 64 KiB in flight, and its writing end.
fn budgeted(budget: &Arc<HalfBudget>) -> (LineReader<DuplexStream>, DuplexStream) {
    let (a, b) = tokio::io::duplex(64 << 10);
    (LineReader::new(a, limits()).budgeted(budget), b)
}

/// A request line's start, padded to `len` bytes, no newline.
fn partial(len: usize) -> Vec<u8> {
    let mut line = br#"{"jsonrpc":"2.0","method":"m","params":{"pad":""#.to_vec();
    line.resize(len, b'x');
    line
}

const END: &[u8] = b"\"}}\n";

/// Writes `bytes` in a task (it blocks while the reader does not read).
fn write_in_task(mut w: DuplexStream, bytes: Vec<u8>) -> JoinHandle<DuplexStream> {
    tokio::spawn(async move {
        let _ = w.write_all(&bytes).await;
        w
    })
}

/// Reads the next line in a task; the reader comes back with it.
type Reading = JoinHandle<(Option<Result<Message, LineFault>>, LineReader<DuplexStream>)>;
fn read_in_task(mut reader: LineReader<DuplexStream>) -> Reading {
    tokio::spawn(async move { (reader.next().await, reader) })
}

/// Waits (in paused time, at most 1 s of it) until `cond` holds.
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..1000 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    panic!("{what} never happened");
}

/// One byte a second after the first: the line still ends `line_timeout` after its first byte,
/// budgeted or not.
#[tokio::test(start_paused = true)]
async fn a_line_trickled_a_byte_a_second_is_dropped_line_timeout_after_its_first_byte() {
    for budget in [None, Some(HalfBudget::new(BUDGET))] {
        let (a, mut b) = tokio::io::duplex(1 << 16);
        let reader = LineReader::new(a, limits());
        let reader = match &budget {
            Some(budget) => reader.budgeted(budget),
            None => reader,
        };
        let first = Instant::now();
        b.write_all(b"{").await.unwrap();
        let reading = read_in_task(reader);
        let trickle = tokio::spawn(async move {
            for _ in 0..100 {
                tokio::time::sleep(Duration::from_secs(1)).await;
                if b.write_all(b"x").await.is_err() {
                    break;
                }
            }
            b
        });
        let (fault, reader) = reading.await.unwrap();
        assert!(
            matches!(fault, Some(Err(LineFault::Stalled(TIMEOUT)))),
            "{fault:?}"
        );
        assert_eq!(first.elapsed(), TIMEOUT, "budgeted: {}", budget.is_some());
        assert_eq!(reader.buffered_capacity(), 0, "its memory is released");
        trickle.abort();
    }
}

/// A line past its allowance takes budget while it arrives and gives it all back when it ends;
/// one that fits its allowance never touches the budget.
#[tokio::test(start_paused = true)]
async fn a_large_line_holds_budget_only_until_it_ends() {
    let budget = HalfBudget::new(BUDGET);
    let (mut reader, mut w) = budgeted(&budget);
    w.write_all(&partial(ALLOWANCE - 100)).await.unwrap();
    let idle = tokio::time::timeout(Duration::from_secs(1), reader.next()).await;
    assert!(idle.is_err(), "{idle:?}");
    assert_eq!(budget.available(), BUDGET, "a line within its allowance");

    let writing = write_in_task(w, partial(600_000)[ALLOWANCE - 100..].to_vec());
    let reading = read_in_task(reader);
    until("the line's bytes are taken from the budget", || {
        budget.available() <= BUDGET - (600_000 - ALLOWANCE)
    })
    .await;
    let mut w = writing.await.unwrap();
    w.write_all(END).await.unwrap();
    let (line, reader) = reading.await.unwrap();
    assert!(
        matches!(line, Some(Ok(Message::Notification { .. }))),
        "{line:?}"
    );
    assert_eq!(
        budget.available(),
        BUDGET,
        "the ended line gave its share back"
    );
    drop(reader);
    assert_eq!(budget.available(), BUDGET);
}

/// Two silent readers whose 500 kB lines took the whole 1 MiB budget, and a third whose line
/// started first, but within its allowance, then needed more: that one stops reading (its
/// writer is blocked) and is refused at its deadline with the budget's LIMIT; the other two
/// time out as usual; a small line on a fourth reader is served meanwhile; everything is given
/// back.
#[tokio::test(start_paused = true)]
async fn a_reader_past_the_budget_stops_reading_and_is_refused_at_its_deadline() {
    let budget = HalfBudget::new(BUDGET);
    let late_line = partial(800_000);
    let (late, mut w) = budgeted(&budget);
    w.write_all(&late_line[..1000]).await.unwrap();
    let late = read_in_task(late);
    tokio::time::sleep(Duration::from_millis(100)).await;
    let mut holders = Vec::new();
    let mut writers = Vec::new();
    for _ in 0..2 {
        let (reader, w) = budgeted(&budget);
        writers.push(write_in_task(w, partial(500_000)));
        holders.push(read_in_task(reader));
    }
    until("the budget is all taken", || budget.available() == 0).await;
    let blocked = write_in_task(w, late_line[1000..].to_vec());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        !blocked.is_finished(),
        "the reader without budget kept reading"
    );

    let (honest, mut w) = budgeted(&budget);
    w.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"small\"}\n")
        .await
        .unwrap();
    let (line, _honest) = read_in_task(honest).await.unwrap();
    assert!(
        matches!(line, Some(Ok(Message::Notification { ref method, .. })) if method == "small"),
        "{line:?}"
    );

    let (fault, reader) = late.await.unwrap();
    assert!(
        matches!(
            fault,
            Some(Err(LineFault::OverBudget(Exhausted { total: BUDGET })))
        ),
        "{fault:?}"
    );
    assert_eq!(
        reader.buffered_len(),
        0,
        "the refused line's memory is released"
    );
    for holder in holders {
        let (fault, reader) = holder.await.unwrap();
        assert!(
            matches!(fault, Some(Err(LineFault::Stalled(_)))),
            "{fault:?}"
        );
        assert_eq!(reader.buffered_len(), 0);
    }
    assert_eq!(budget.available(), BUDGET);
    // The refused line's error is the LIMIT that names the budget.
    let (_, error) = LineFault::OverBudget(Exhausted { total: BUDGET }).to_rpc_error();
    assert_eq!(
        error.data_value(),
        Some(
            serde_json::json!({"code": "LIMIT", "limit": "unfinished_message_budget", "value": BUDGET})
        )
    );
    blocked.abort();
    for w in writers {
        w.abort();
    }
}

/// While the budget is all taken, readers hold at most the budget and their allowances.
#[tokio::test(start_paused = true)]
async fn what_readers_hold_is_bounded_by_the_budget_and_their_allowances() {
    let budget = HalfBudget::new(BUDGET);
    let mut tasks = Vec::new();
    let mut readers = Vec::new();
    for _ in 0..8 {
        let (reader, w) = budgeted(&budget);
        tasks.push(write_in_task(w, partial(900_000)));
        readers.push(reader);
    }
    // Read by turns, each for as long as it reads, until none can: all wait for the budget.
    for _ in 0..200 {
        for reader in &mut readers {
            let _ = tokio::time::timeout(Duration::from_millis(1), reader.next()).await;
        }
    }
    let held: usize = readers.iter().map(LineReader::buffered_len).sum();
    assert_eq!(budget.available(), 0);
    assert!(
        held <= BUDGET + 8 * ALLOWANCE,
        "8 readers hold {held} bytes of unfinished lines"
    );
    drop(readers);
    assert_eq!(budget.available(), BUDGET);
    for t in tasks {
        t.abort();
    }
}

/// A reader waiting for the budget reads on as soon as another line ends and gives it back:
/// backpressure, not a refusal.
#[tokio::test(start_paused = true)]
async fn a_reader_waiting_for_the_budget_goes_on_when_another_line_ends() {
    let budget = HalfBudget::new(BUDGET);
    let (first, w1) = budgeted(&budget);
    let (second, w2) = budgeted(&budget);
    let w1 = write_in_task(w1, partial(900_000));
    let first = read_in_task(first);
    until("the first line takes most of the budget", || {
        budget.available() < BUDGET - 800_000
    })
    .await;
    let w2 = write_in_task(w2, partial(900_000));
    let second = read_in_task(second);
    until("the second waits", || budget.available() == 0).await;
    let mut w1 = w1.await.unwrap();
    w1.write_all(END).await.unwrap();
    let (line, _first) = first.await.unwrap();
    assert!(matches!(line, Some(Ok(_))), "{line:?}");
    let mut w2 = w2.await.unwrap();
    w2.write_all(END).await.unwrap();
    let (line, _second) = second.await.unwrap();
    assert!(matches!(line, Some(Ok(_))), "{line:?}");
}

/// The primitive itself: grants in turn, a message larger than the whole budget takes all of
/// it, a wait ends at its deadline holding what it held, and all is given back on `fit(0)` and
/// on drop.
#[tokio::test(start_paused = true)]
async fn held_grows_in_turn_and_gives_back() {
    let budget = HalfBudget::new(BUDGET);
    let deadline = Instant::now() + TIMEOUT;
    let mut a = budget.held();
    assert_eq!(a.room(), ALLOWANCE);
    a.grow(ALLOWANCE, deadline).await.unwrap();
    assert_eq!(budget.available(), BUDGET, "within the allowance");
    a.grow(ALLOWANCE + 1, deadline).await.unwrap();
    assert_eq!(budget.available(), BUDGET - (256 << 10), "one grain");
    a.grow(10 * BUDGET, deadline).await.unwrap();
    assert_eq!((budget.available(), a.room()), (0, usize::MAX), "all of it");

    let mut b = budget.held();
    let refused = b.grow(ALLOWANCE + 1, deadline).await;
    assert_eq!(refused, Err(Exhausted { total: BUDGET }));
    assert_eq!(Instant::now(), deadline);
    assert_eq!(b.room(), ALLOWANCE, "holding what it held");

    a.fit(ALLOWANCE + (300 << 10));
    assert_eq!(budget.available(), BUDGET - (512 << 10), "two grains kept");
    a.fit(0);
    assert_eq!(budget.available(), BUDGET);
    b.grow(BUDGET, Instant::now() + TIMEOUT).await.unwrap();
    drop(b);
    assert_eq!(budget.available(), BUDGET, "given back on drop");
}

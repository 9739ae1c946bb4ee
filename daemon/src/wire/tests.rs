//! The wire over duplex pipes, with paused time where deadlines matter.

use std::time::Duration;

use acpd_protocol::codec::FrameError;
use acpd_protocol::envelope::Message;
use tokio::io::AsyncWriteExt;

use super::*;

#[tokio::test]
async fn calls_complete_and_requests_reach_the_owner() {
    let (a, b) = tokio::io::duplex(1024);
    let (ar, aw) = tokio::io::split(a);
    let (br, bw) = tokio::io::split(b);
    let left = connect(ar, aw, 1024);
    let mut right = connect(br, bw, 1024);
    let call = left
        .peer
        .call("ping", &serde_json::json!({"n": 1}))
        .await
        .unwrap();
    let Some(Incoming::Request { id, method, params }) = right.incoming.recv().await else {
        panic!("expected a request")
    };
    assert_eq!(method, "ping");
    assert_eq!(params.unwrap().get(), r#"{"n":1}"#);
    right
        .peer
        .respond_ok(&id, &serde_json::json!("pong"))
        .await
        .unwrap();
    assert_eq!(call.result().await.unwrap().get(), r#""pong""#);
    left.peer.close();
    assert!(right.incoming.recv().await.is_none(), "EOF after close");
}

#[tokio::test]
async fn bad_lines_are_faults_and_eof_fails_pending_calls() {
    let (a, b) = tokio::io::duplex(1024);
    let (ar, aw) = tokio::io::split(a);
    let (br, mut bw) = tokio::io::split(b);
    let mut left = connect(ar, aw, 16);
    let call = left.peer.call("x", &serde_json::json!({})).await.unwrap();
    bw.write_all(b"{nope\n0123456789012345678901\n")
        .await
        .unwrap();
    let Some(Incoming::Fault(LineFault::Envelope(_))) = left.incoming.recv().await else {
        panic!()
    };
    let Some(Incoming::Fault(LineFault::Frame(FrameError::Oversized { .. }))) =
        left.incoming.recv().await
    else {
        panic!()
    };
    drop(bw);
    drop(br);
    assert!(matches!(call.result().await, Err(CallError::Closed)));
    assert!(left.incoming.recv().await.is_none());
    assert!(matches!(
        left.peer.call("y", &()).await,
        Err(CallError::Closed)
    ));
}

#[tokio::test(start_paused = true)]
async fn a_stalled_partial_line_is_dropped_and_the_stream_resumes() {
    let (a, mut b) = tokio::io::duplex(1 << 20);
    let limits = WireLimits {
        max_line: 1 << 20,
        line_timeout: Duration::from_secs(5),
        write_timeout: Duration::from_secs(5),
    };
    let mut reader = LineReader::new(a, limits);
    b.write_all(&vec![b'x'; 300_000]).await.unwrap();
    let fault = reader.next().await;
    assert!(
        matches!(fault, Some(Err(LineFault::Stalled(_)))),
        "{fault:?}"
    );
    assert_eq!(
        reader.buffered_capacity(),
        0,
        "the partial line's memory is released"
    );
    // The rest of the stalled line is skipped; the next line parses.
    b.write_all(b"still the old line\n{\"jsonrpc\":\"2.0\",\"method\":\"m\"}\n")
        .await
        .unwrap();
    let next = reader.next().await;
    assert!(
        matches!(next, Some(Ok(Message::Notification { ref method, .. })) if method == "m"),
        "{next:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_peer_that_stops_reading_breaks_after_write_timeout() {
    let (a, _b) = tokio::io::duplex(64);
    let out = Outbox::start(a, Duration::from_secs(3));
    let broken = out.broken();
    // More than the pipe holds: the writer blocks, then gives up.
    let _ = out.send_line(vec![b'y'; 4096]).await;
    tokio::time::timeout(Duration::from_secs(10), broken.cancelled())
        .await
        .expect("broken within write_timeout");
    assert!(out.send_line(b"{}".to_vec()).await.is_err());
}

#[tokio::test(start_paused = true)]
async fn queued_bytes_are_bounded_by_the_budget() {
    let (a, _b) = tokio::io::duplex(64);
    let out = Outbox::start(a, Duration::from_secs(3600));
    let mut sent = 0usize;
    loop {
        let send = out.send_line(vec![b'z'; 64 * 1024]);
        match tokio::time::timeout(Duration::from_secs(1), send).await {
            Ok(Ok(())) => sent += 64 * 1024,
            _ => break,
        }
    }
    assert!(
        sent <= super::OUT_BUDGET + 2 * 64 * 1024,
        "queued {sent} bytes"
    );
}

/// An owner that does not take what its peer sends holds at most `IN_BUDGET` bytes of it
/// (not `QUEUE_DEPTH` lines of up to `max_line`): past it the reader stops reading the peer,
/// and what was held is delivered once the owner takes it.
#[tokio::test(start_paused = true)]
async fn read_bytes_waiting_for_the_owner_are_bounded_by_the_budget() {
    const LINE: usize = 512 * 1024;
    let (a, b) = tokio::io::duplex(64 * 1024);
    let (ar, aw) = tokio::io::split(a);
    let (_br, mut bw) = tokio::io::split(b);
    let mut conn = connect(ar, aw, 16 * 1024 * 1024);
    let blob = "z".repeat(LINE);
    let line = format!("{{\"jsonrpc\":\"2.0\",\"method\":\"m\",\"params\":[\"{blob}\"]}}\n");
    let mut written = 0usize;
    for _ in 0..QUEUE_DEPTH {
        let write = bw.write_all(line.as_bytes());
        match tokio::time::timeout(Duration::from_secs(1), write).await {
            Ok(Ok(())) => written += 1,
            _ => break,
        }
    }
    // The budget's lines, the one the reader holds waiting for room, the pipe's share.
    let bound = IN_BUDGET / LINE + 3;
    assert!(written <= bound, "{written} lines of {LINE} bytes taken");
    for _ in 0..written {
        let next = conn.incoming.recv().await;
        assert!(
            matches!(next, Some(Incoming::Notification { .. })),
            "{next:?}"
        );
    }
}

#[tokio::test]
async fn a_repeated_unanswered_id_is_not_admitted_twice() {
    let (a, _b) = tokio::io::duplex(1024);
    let (ar, aw) = tokio::io::split(a);
    let conn = connect(ar, aw, 1024);
    conn.peer.limit_pending(2);
    let one = Id::Num(1);
    assert_eq!(conn.peer.admit(&one), Admit::Yes);
    assert_eq!(
        conn.peer.admit(&one),
        Admit::DuplicateId,
        "one id, two open requests"
    );
    assert_eq!(conn.peer.admit(&Id::Num(2)), Admit::Yes);
    assert_eq!(conn.peer.admit(&Id::Num(3)), Admit::Full);
    let raw = serde_json::value::RawValue::from_string("{}".into()).unwrap();
    conn.peer.respond(&one, Ok(&raw)).await.unwrap();
    assert_eq!(conn.peer.admit(&one), Admit::Yes, "answered, so free again");
}

#[tokio::test(start_paused = true)]
async fn an_idle_reader_holds_no_read_buffer_before_or_after_a_line() {
    let (a, mut b) = tokio::io::duplex(1 << 16);
    let limits = WireLimits {
        max_line: 1 << 20,
        line_timeout: Duration::from_secs(5),
        write_timeout: Duration::from_secs(5),
    };
    let mut reader = LineReader::new(a, limits);
    // Waiting with nothing sent: the poll finds nothing, and nothing was reserved for it.
    let idle = tokio::time::timeout(Duration::from_secs(1), reader.next()).await;
    assert!(idle.is_err(), "{idle:?}");
    assert_eq!(
        reader.buffered_capacity(),
        0,
        "an idle reader reserved a buffer"
    );
    // One whole line read: the reader waits for the next one holding nothing either.
    b.write_all(b"{\"jsonrpc\":\"2.0\",\"method\":\"m\"}\n")
        .await
        .unwrap();
    assert!(matches!(reader.next().await, Some(Ok(_))));
    let idle = tokio::time::timeout(Duration::from_secs(1), reader.next()).await;
    assert!(idle.is_err(), "{idle:?}");
    assert_eq!(
        reader.buffered_capacity(),
        0,
        "the reader kept its buffer after the line"
    );
}

/// Many lines and batches queued at once toward a real pipe (whose writes are vectored and
/// taken in part when the pipe is full): each arrives whole, in the order queued.
#[tokio::test]
async fn gathered_writes_keep_every_line_whole_and_in_order() {
    use tokio::io::AsyncReadExt;
    let (tx, mut rx) = tokio::net::unix::pipe::pipe().unwrap();
    let out = Outbox::start(tx, Duration::from_secs(30));
    let mut expected = Vec::new();
    let writer = {
        let out = out.clone();
        let mut lines = Vec::new();
        for n in 0..2_000usize {
            let body = format!("{n:05}-{}", "x".repeat(n % 700));
            if n % 3 == 0 {
                let mut batch = out.batch_buffer(0);
                for k in 0..4 {
                    batch.extend_from_slice(format!("{body}/{k}\n").as_bytes());
                }
                expected.extend_from_slice(&batch);
                lines.push((batch, true));
            } else {
                expected.extend_from_slice(format!("{body}\n").as_bytes());
                lines.push((body.into_bytes(), false));
            }
        }
        tokio::spawn(async move {
            for (line, batch) in lines {
                if batch {
                    out.send_lines(line).await.unwrap();
                } else {
                    out.send_line(line).await.unwrap();
                }
            }
            out.flush_and_close().await;
        })
    };
    let mut got = Vec::new();
    let mut chunk = [0u8; 1000];
    loop {
        let n = rx.read(&mut chunk).await.unwrap();
        if n == 0 {
            break;
        }
        got.extend_from_slice(&chunk[..n]);
    }
    writer.await.unwrap();
    assert_eq!(got.len(), expected.len());
    assert!(got == expected, "the bytes arrived out of order or torn");
}

/// Answers built by the writer are built one at a time, as it reaches each: a peer that reads
/// slowly holds one of them in memory, not all that wait.
#[tokio::test]
async fn lazy_answers_are_built_one_at_a_time() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::AsyncReadExt;
    let (a, mut b) = tokio::io::duplex(1024);
    let out = Outbox::start(a, Duration::from_secs(30));
    let built = Arc::new(AtomicUsize::new(0));
    for n in 0..5u8 {
        let built = built.clone();
        out.send_lazy(Box::new(move || {
            built.fetch_add(1, Ordering::SeqCst);
            vec![b'a' + n; 64 * 1024]
        }))
        .await
        .unwrap();
    }
    // The peer has read part of the first answer: only that one has been built.
    let mut first = vec![0u8; 4096];
    b.read_exact(&mut first).await.unwrap();
    assert_eq!(built.load(Ordering::SeqCst), 1);
    out.close();
    let mut rest = Vec::new();
    b.read_to_end(&mut rest).await.unwrap();
    first.extend_from_slice(&rest);
    assert_eq!(first.len(), 5 * (64 * 1024 + 1));
    for (n, answer) in first.chunks(64 * 1024 + 1).enumerate() {
        assert!(answer[..64 * 1024].iter().all(|&c| c == b'a' + n as u8));
        assert_eq!(answer[64 * 1024], b'\n');
    }
    assert_eq!(built.load(Ordering::SeqCst), 5);
}

/// A batch buffer the writer has written comes back for the next batch, so a stream of
/// batches reuses its memory instead of faulting in fresh pages for each.
#[tokio::test]
async fn written_batch_buffers_are_given_back() {
    use tokio::io::AsyncReadExt;
    let (a, mut b) = tokio::io::duplex(1 << 16);
    let out = Outbox::start(a, Duration::from_secs(30));
    let mut batch = out.batch_buffer(8 * 1024);
    assert_eq!(batch.capacity(), 8 * 1024, "none given back yet: a new one");
    batch.extend_from_slice(b"{}\n");
    let at = batch.as_ptr();
    out.send_lines(batch).await.unwrap();
    let mut line = [0u8; 3];
    b.read_exact(&mut line).await.unwrap();
    // Written once the peer has it; the writer gives it back right after.
    let mut tries = 0;
    let again = loop {
        let again = out.batch_buffer(0);
        if again.capacity() > 0 {
            break again;
        }
        tries += 1;
        assert!(tries < 10_000, "the written batch never came back");
        tokio::task::yield_now().await;
    };
    assert_eq!(again.as_ptr(), at, "the same allocation");
    assert!(again.is_empty());
}

#[test]
fn lone_surrogates_are_replaced_in_what_is_read_but_not_in_an_id() {
    let fixed = |line: &str| {
        let read = unicode_escapes(bytes::Bytes::copy_from_slice(line.as_bytes()));
        String::from_utf8(read.to_vec()).unwrap()
    };
    // In params and a result: replaced; an id as written.
    assert_eq!(
        fixed(r#"{"jsonrpc":"2.0","id":"\ud800","method":"m","params":{"t":"a\ud800"}}"#),
        r#"{"jsonrpc":"2.0","id":"\ud800","method":"m","params":{"t":"a\ufffd"}}"#
    );
    assert_eq!(
        fixed(r#"{"jsonrpc":"2.0","id":1,"result":{"t":"\udc00\ud83d\ude00"}}"#),
        r#"{"jsonrpc":"2.0","id":1,"result":{"t":"\ufffd\ud83d\ude00"}}"#
    );
    // An error's message does not decode with one: replaced, the line is a message again.
    let error = fixed(r#"{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"\ud800"}}"#);
    assert!(
        matches!(
            acpd_protocol::envelope::parse(error.as_bytes()),
            Ok(Message::Response { .. })
        ),
        "{error}"
    );
    // An error's data is passed on as written, so it is replaced too (ids acpd matches
    // answers by are its own, which hold none).
    assert_eq!(
        fixed(r#"{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"x","data":{"t":"\ud800"}}}"#),
        r#"{"jsonrpc":"2.0","id":1,"error":{"code":1,"message":"x","data":{"t":"\ufffd"}}}"#
    );
    // Nothing to replace: the same bytes.
    for same in [r#"{"t":"\u00e9\\ud800"}"#, "not json \\ud83d\\ude00", ""] {
        assert_eq!(fixed(same), same);
    }
}

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

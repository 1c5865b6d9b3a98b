#![allow(dead_code)] // each test binary uses part of it
//! A subscriber on 127.0.0.1 that counts the connections it has accepted and has open, so
//! tests can see what the sender's pool does with them; and https subscribers ([`tls`]).

pub mod tls;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::routing::post;
use futures::StreamExt;
use gridrelay_adapters::http_sender::HttpEventSender;
use gridrelay_ports::{DeliveryRequest, EventSender, SentAttempt};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// Connections a sink has seen.
#[derive(Debug, Default)]
pub struct Connections {
    pub accepted: AtomicUsize,
    pub open: AtomicUsize,
}

impl Connections {
    pub fn accepted(&self) -> usize {
        self.accepted.load(Ordering::SeqCst)
    }

    pub fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }
}

/// Serves 200 after `delay` on a new port; returns its hook URL and its connection counts.
pub async fn counting_sink(delay: Duration) -> (String, Arc<Connections>) {
    counting_sink_on("127.0.0.1:0", delay, false).await
}

/// As [`counting_sink`], on `listen`; with `close`, each connection is closed after its
/// answer, so every request opens a new one.
pub async fn counting_sink_on(
    listen: &str,
    delay: Duration,
    close: bool,
) -> (String, Arc<Connections>) {
    let listener = TcpListener::bind(listen).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(Connections::default());
    let app = Router::new().route(
        "/hook",
        post(move || async move {
            tokio::time::sleep(delay).await;
            if close {
                ([(axum::http::header::CONNECTION, "close")], "ok")
            } else {
                ([(axum::http::header::CONNECTION, "keep-alive")], "ok")
            }
        }),
    );
    let counting = CountingListener {
        listener,
        connections: Arc::clone(&connections),
    };
    tokio::spawn(async move { axum::serve(counting, app).await });
    (format!("http://{addr}/hook"), connections)
}

struct CountingListener {
    listener: TcpListener,
    connections: Arc<Connections>,
}

impl axum::serve::Listener for CountingListener {
    type Io = CountedStream;
    type Addr = std::net::SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            if let Ok((stream, addr)) = self.listener.accept().await {
                self.connections.accepted.fetch_add(1, Ordering::SeqCst);
                self.connections.open.fetch_add(1, Ordering::SeqCst);
                let counted = CountedStream {
                    stream,
                    connections: Arc::clone(&self.connections),
                };
                return (counted, addr);
            }
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        self.listener.local_addr()
    }
}

/// An accepted connection that is counted open until it is dropped.
pub struct CountedStream {
    stream: TcpStream,
    connections: Arc<Connections>,
}

impl Drop for CountedStream {
    fn drop(&mut self) {
        self.connections.open.fetch_sub(1, Ordering::SeqCst);
    }
}

impl AsyncRead for CountedStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for CountedStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

/// Waits up to two seconds for `done`.
pub async fn eventually(done: impl Fn() -> bool) -> bool {
    for _ in 0..200 {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    done()
}

/// Sends `requests` deliveries of an empty array to `endpoint`, all at once.
pub async fn burst(sender: &HttpEventSender, endpoint: &str, requests: usize) -> Vec<SentAttempt> {
    futures::stream::iter(0..requests)
        .map(|_| {
            sender.send(DeliveryRequest {
                answer_bytes: 0,
                endpoint: endpoint.to_string(),
                content_type: "application/json",
                body: "[]".into(),
                headers: Vec::new(),
            })
        })
        .buffer_unordered(requests)
        .collect()
        .await
}

/// Sends one delivery of an empty array to `endpoint`; what came of it.
pub async fn deliver_empty(
    sender: &HttpEventSender,
    endpoint: &str,
) -> gridrelay_shared::classify::AttemptResult {
    sender
        .send(DeliveryRequest {
            answer_bytes: 0,
            endpoint: endpoint.to_string(),
            content_type: "application/json",
            body: "[]".into(),
            headers: Vec::new(),
        })
        .await
        .result
}

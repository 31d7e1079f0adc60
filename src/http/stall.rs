//! A connection whose client stops reading is closed: hyper waits on a full
//! send buffer for as long as the client keeps its end open, past every
//! other timeout. One stranger pipelining peeks of 900 kB answers and never
//! reading held connections for over five minutes, 750 MB of the kernel's
//! TCP memory at 200 of them, and would have held every connection slot
//! (an outsider's attack). A write that makes no progress for the limit
//! fails; the socket is reset (linger 0) so that the kernel drops what it
//! still holds for the client instead of keeping it past the close.

use std::{
    io,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
    time::{Instant, Sleep},
};

pub struct StallGuard {
    /// Ahead of `stream`: dropped (and cleared) before the socket closes.
    peer: super::peer::Peer,
    stream: TcpStream,
    limit: Duration,
    /// Armed while a write waits for the client to make room.
    stalled: Option<Pin<Box<Sleep>>>,
}

impl StallGuard {
    pub fn new(stream: TcpStream, limit: Duration) -> Self {
        Self {
            peer: super::peer::Peer::of(&stream),
            stream,
            limit,
            stalled: None,
        }
    }

    /// Asks whether the caller closed its end of this connection.
    pub fn peer(&self) -> super::peer::PeerProbe {
        self.peer.probe()
    }

    /// What a write's poll says, with the stall's clock: progress disarms
    /// it; waiting arms it, and past the limit fails the write.
    fn watch<T>(
        &mut self,
        cx: &mut Context<'_>,
        polled: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if polled.is_ready() {
            self.stalled = None;
            return polled;
        }
        let limit = self.limit;
        let stalled = self
            .stalled
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(Instant::now() + limit)));
        if stalled.as_mut().poll(cx).is_ready() {
            self.stalled = None;
            let _ = self.stream.set_zero_linger();
            return Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                "the client read nothing of the answer for the idle timeout",
            )));
        }
        Poll::Pending
    }
}

impl AsyncRead for StallGuard {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl AsyncWrite for StallGuard {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write(cx, buf);
        self.watch(cx, polled)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let polled = Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        self.watch(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let polled = Pin::new(&mut self.stream).poll_flush(cx);
        self.watch(cx, polled)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.stream).poll_shutdown(cx)
    }
}

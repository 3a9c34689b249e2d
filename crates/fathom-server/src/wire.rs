//! The connection's byte stream, with one repair: hyper answers a request
//! it cannot parse (431 headers too large, 414 URI too long, 400 bad
//! method, URI, version, `Content-Length` or `Transfer-Encoding`) itself,
//! with an empty body. Those answers are recognised as they are written
//! (a 4xx head with `content-length: 0` and no `content-type`, which no
//! response of ours has) and replaced by the same status with an OpenAI
//! error object, so every error a client sees has the same shape.

use std::io;
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use serde_json::json;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// A byte stream whose bare parse-error answers get an error body.
pub struct ErrorBodies<T> {
    inner: T,
    /// A replacement answer not yet written.
    pending: Vec<u8>,
    written: usize,
}

impl<T> ErrorBodies<T> {
    pub fn new(inner: T) -> Self {
        ErrorBodies {
            inner,
            pending: Vec::new(),
            written: 0,
        }
    }
}

/// `(status, code, message)` for the heads hyper writes on parse errors.
fn describe(status: u16) -> Option<(&'static str, &'static str)> {
    Some(match status {
        400 => (
            "invalid_request",
            "the request is not valid HTTP/1.1: check the method, the URI, the version and the Content-Length and Transfer-Encoding headers",
        ),
        414 => (
            "uri_too_long",
            "the request URI is longer than this server accepts",
        ),
        431 => (
            "request_header_fields_too_large",
            "the request's headers are larger (or more numerous) than this server accepts",
        ),
        _ => return None,
    })
}

/// The replacement for `head` when it is one of hyper's bare parse-error
/// answers. Pure, so it can be fuzzed: any input gives `None` or a head
/// with a JSON body, never a panic.
pub fn replacement(head: &[u8]) -> Option<Vec<u8>> {
    let end = head.windows(4).position(|w| w == b"\r\n\r\n")?;
    if end + 4 != head.len() {
        return None;
    }
    let text = std::str::from_utf8(&head[..end]).ok()?;
    let mut lines = text.split("\r\n");
    let status_line = lines.next()?;
    let rest = status_line.strip_prefix("HTTP/1.")?;
    let status: u16 = rest.get(2..5)?.parse().ok()?;
    let (code, message) = describe(status)?;
    let mut empty = false;
    let mut extra = String::new();
    for line in lines {
        let (name, value) = line.split_once(':')?;
        let name = name.trim().to_ascii_lowercase();
        match name.as_str() {
            "content-type" => return None,
            "content-length" => empty = value.trim() == "0",
            "connection" => {}
            _ => {
                extra.push_str(line);
                extra.push_str("\r\n");
            }
        }
    }
    if !empty {
        return None;
    }
    let body = json!({"error": {
        "message": message,
        "type": "invalid_request_error",
        "param": null,
        "code": code,
    }})
    .to_string();
    Some(
        format!(
            "{status_line}\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n{extra}\r\n{body}",
            body.len()
        )
        .into_bytes(),
    )
}

impl<T: AsyncWrite + Unpin> ErrorBodies<T> {
    /// Writes what is pending; ready once nothing is.
    fn poll_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.written < self.pending.len() {
            let n =
                ready!(Pin::new(&mut self.inner).poll_write(cx, &self.pending[self.written..]))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.written += n;
        }
        self.pending.clear();
        self.written = 0;
        Poll::Ready(Ok(()))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for ErrorBodies<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for ErrorBodies<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        if buf.starts_with(b"HTTP/1.") && buf.len() < 1024 {
            if let Some(answer) = replacement(buf) {
                this.pending = answer;
                // Best effort now; flush and shutdown finish it.
                let _ = this.poll_pending(cx)?;
                return Poll::Ready(Ok(buf.len()));
            }
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_pending(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }

    // Not vectored: hyper then writes each head as one buffer.
    fn is_write_vectored(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_bare_parse_error_heads_are_replaced() {
        let head = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\ndate: Tue, 01 Dec 2026 00:00:00 GMT\r\n\r\n";
        let out = String::from_utf8(replacement(head).unwrap()).unwrap();
        assert!(out.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
        assert!(out.contains("content-type: application/json\r\n"));
        assert!(out.contains("date: Tue"));
        let (head, body) = out.split_once("\r\n\r\n").unwrap();
        let v: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(v["error"]["code"], "request_header_fields_too_large");
        assert!(head.contains(&format!("content-length: {}", body.len())));
        // Our own answers carry a content type, or a body, or another status.
        for ours in [
            &b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\ncontent-length: 0\r\n\r\n"[..],
            b"HTTP/1.1 400 Bad Request\r\ncontent-length: 12\r\n\r\n",
            b"HTTP/1.1 204 No Content\r\nallow: GET\r\n\r\n",
            b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\n\r\n{}",
        ] {
            assert_eq!(replacement(ours), None, "{}", String::from_utf8_lossy(ours));
        }
    }
}

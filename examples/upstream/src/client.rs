//! A small HTTP/1.1 client of the upstream, as a tower service: one
//! connection per request (`Connection: close`), a `Content-Length` body,
//! a timeout on the whole exchange. For the clients of the tests,
//! benchmarks and examples that call the upstream through a limiter's
//! layer.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tower_service::Service;

/// Sends each request to one address.
#[derive(Debug, Clone, Copy)]
pub struct Client {
    /// The upstream's address.
    pub addr: SocketAddr,
    /// The longest a whole exchange may take (default 10 s).
    pub timeout: Duration,
}

impl Client {
    /// A client of the upstream at `addr`.
    pub fn new(addr: SocketAddr) -> Self {
        Client {
            addr,
            timeout: Duration::from_secs(10),
        }
    }
}

impl Service<http::Request<String>> for Client {
    type Response = http::Response<String>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<http::Response<String>>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<String>) -> Self::Future {
        let (addr, timeout) = (self.addr, self.timeout);
        Box::pin(async move {
            tokio::time::timeout(timeout, exchange(addr, request))
                .await
                .map_err(|_| {
                    io::Error::new(io::ErrorKind::TimedOut, "the upstream took too long")
                })?
        })
    }
}

async fn exchange(
    addr: SocketAddr,
    request: http::Request<String>,
) -> io::Result<http::Response<String>> {
    let mut stream = TcpStream::connect(addr).await?;
    let head = format!(
        "{} {} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n\r\n",
        request.method(),
        request.uri().path(),
        request.body().len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(request.body().as_bytes()).await?;
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await?;
    parse(&raw).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "not an HTTP response"))
}

/// A whole response read to the end of the connection.
fn parse(raw: &[u8]) -> Option<http::Response<String>> {
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n")?;
    let head = std::str::from_utf8(&raw[..end]).ok()?;
    let mut lines = head.split("\r\n");
    let status: u16 = lines.next()?.split(' ').nth(1)?.parse().ok()?;
    let mut response = http::Response::builder().status(status);
    for line in lines {
        let (name, value) = line.split_once(':')?;
        response = response.header(name.trim(), value.trim());
    }
    let body = String::from_utf8_lossy(&raw[end + 4..]).into_owned();
    response.body(body).ok()
}

/// `POST /v1/complete`.
pub fn complete() -> http::Request<String> {
    http::Request::post("/v1/complete")
        .body(String::new())
        .expect("a valid request")
}

/// The tokens a `200` says its call used.
pub fn tokens(response: &http::Response<String>) -> Option<u32> {
    response
        .headers()
        .get("x-usage-tokens")?
        .to_str()
        .ok()?
        .parse()
        .ok()
}

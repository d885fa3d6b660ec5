//! A bare hyper server: every request on `127.0.0.1:PORT` gets the same `SIZE`-byte body, with
//! no routing, no middleware and nothing read. bench/run.sh measures it beside zarrgate's warm
//! one-chunk tile as the least a server on the same HTTP stack (hyper 1, tokio's multi-thread
//! runtime, one worker per core) can do per request on this machine.
//!
//! Usage: `hyper-floor PORT SIZE`

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::Full;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let port: u16 = args.next().ok_or("usage: hyper-floor PORT SIZE")?.parse()?;
    let size: usize = args.next().ok_or("usage: hyper-floor PORT SIZE")?.parse()?;
    let body = Bytes::from(vec![7u8; size]);
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
    loop {
        let (tcp, _) = listener.accept().await?;
        let body = body.clone();
        tokio::spawn(async move {
            let answer = service_fn(move |_: Request<hyper::body::Incoming>| {
                let body = body.clone();
                async move { Ok::<_, Infallible>(Response::new(Full::new(body))) }
            });
            // A connection's end or error concerns only that connection.
            let _ = http1::Builder::new().serve_connection(TokioIo::new(tcp), answer).await;
        });
    }
}

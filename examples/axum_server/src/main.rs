//! Serves the rate-limited application of this package's library; see its
//! docs for the options.

use std::error::Error;

use paceline_axum_server::{Options, app, serve};

#[tokio::main]
async fn main() -> Result<(), Box<dyn Error>> {
    let options = Options::parse(std::env::args().skip(1))?;
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", options.port)).await?;
    println!(
        "listening on http://{}: {} requests/s per client, burst {}",
        listener.local_addr()?,
        options.rate,
        options.burst
    );
    serve(listener, app(&options).await?).await?;
    Ok(())
}

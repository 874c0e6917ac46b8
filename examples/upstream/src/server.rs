//! The HTTP side: the routes, and the thread that serves them.

use std::io;
use std::sync::Arc;
use std::sync::mpsc;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::header::{CONTENT_TYPE, RETRY_AFTER};
use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use tokio::sync::watch;

use crate::headers;
use crate::limits::{Admission, Shared};

const X_USAGE_TOKENS: HeaderName = HeaderName::from_static("x-usage-tokens");

/// Serves `listener` on this thread until `stopped` turns true (or its
/// sender is gone), then waits up to `grace` for the calls in flight.
/// Tells `ready` once it serves, or why it cannot.
pub(crate) fn run(
    listener: std::net::TcpListener,
    shared: Arc<Shared>,
    mut stopped: watch::Receiver<bool>,
    grace: Duration,
    ready: mpsc::Sender<io::Result<()>>,
) {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            let _ = ready.send(Err(error));
            return;
        }
    };
    runtime.block_on(async move {
        let listener = match tokio::net::TcpListener::from_std(listener) {
            Ok(listener) => listener,
            Err(error) => {
                let _ = ready.send(Err(error));
                return;
            }
        };
        let mut signal = stopped.clone();
        let server = axum::serve(listener, router(shared)).with_graceful_shutdown(async move {
            let _ = signal.wait_for(|&stop| stop).await;
        });
        let server = tokio::spawn(server.into_future());
        let _ = ready.send(Ok(()));
        let _ = stopped.wait_for(|&stop| stop).await;
        let _ = tokio::time::timeout(grace, server).await;
    });
    // Dropping the runtime here ends the calls and connections still open.
}

/// The routes.
fn router(shared: Arc<Shared>) -> Router {
    Router::new()
        .route("/v1/complete", post(complete))
        .route("/stats", get(stats))
        .with_state(shared)
}

/// `POST /v1/complete`: a call, admitted or refused.
async fn complete(State(shared): State<Arc<Shared>>, _body: Bytes) -> Response {
    let config = &shared.config;
    match shared.admit() {
        Admission::Refused { limits, wait, view } => {
            let names: Vec<String> = limits
                .iter()
                .map(|limit| format!("\"{}\"", limit.name()))
                .collect();
            let body = format!(
                "{{\"error\":{{\"type\":\"rate_limit_exceeded\",\"limits\":[{}]}}}}",
                names.join(",")
            );
            let mut response = json(StatusCode::TOO_MANY_REQUESTS, body);
            if let Some(value) = headers::retry_after(config.retry_after, wait) {
                response.headers_mut().insert(RETRY_AFTER, value);
            }
            headers::write(response.headers_mut(), config.headers, &view);
            response
        }
        Admission::Admitted { cost, latency, due } => {
            // The call runs on its own task, so that it finishes and is
            // charged at its time even if its client goes away.
            let worker = Arc::clone(&shared);
            let call = tokio::spawn(async move {
                tokio::time::sleep(latency).await;
                worker.complete(cost, due)
            });
            let Ok(view) = call.await else {
                return StatusCode::INTERNAL_SERVER_ERROR.into_response();
            };
            let body = format!("{{\"usage\":{{\"total_tokens\":{cost}}}}}");
            let mut response = json(StatusCode::OK, body);
            response
                .headers_mut()
                .insert(X_USAGE_TOKENS, HeaderValue::from(cost));
            headers::write(response.headers_mut(), config.headers, &view);
            response
        }
    }
}

/// `GET /stats`.
async fn stats(State(shared): State<Arc<Shared>>) -> Response {
    json(StatusCode::OK, shared.stats(false).to_json())
}

fn json(status: StatusCode, body: String) -> Response {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    response
}

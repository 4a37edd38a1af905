//! What every client gRPC service is served with ([`Served`]): etcd's answer
//! to a message over the size limit (see `api::limits`), and the gRPC server
//! metrics go-grpc-prometheus exports for etcd (`grpc_server_started_total`,
//! `grpc_server_handled_total{grpc_code}`, messages received and sent, and
//! `grpc_server_handling_seconds`, from the call's arrival until its status
//! is known: a stream's whole life, a waiting Lock's wait included).
//!
//! A call is counted as started when its answer begins (a unary call's when
//! it ends), and as handled once its status is known: from the headers of a
//! trailers-only answer (an error before any message), else from the trailers
//! at the end of the response body; a body dropped before its trailers (the
//! client went away) counts as `Canceled`. A method the service does not have
//! (tonic's bare Unimplemented) is labelled `unknown`, so that made-up method
//! names cannot grow the registry.

use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::TryFutureExt;
use http_body::{Frame, SizeHint};
use tonic::body::Body;
use tonic::codegen::http;
use tonic::server::NamedService;
use tonic::Status;

use super::limits::as_etcd_answers_too_large;
use crate::base::metrics::metrics;

/// A client service as raftlock serves it (see the module doc).
#[derive(Clone)]
pub struct Served<S>(pub S);

impl<S: NamedService> NamedService for Served<S> {
    const NAME: &'static str = S::NAME;
}

type Answer = http::Response<Body>;

impl<S> tower::Service<http::Request<Body>> for Served<S>
where
    S: tower::Service<http::Request<Body>, Response = Answer, Error = Infallible>,
{
    type Response = Answer;
    type Error = Infallible;
    type Future = futures::future::MapOk<S::Future, Box<dyn FnOnce(Answer) -> Answer + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let call = Call::of(req.uri().path());
        self.0.call(req).map_ok(Box::new(move |answer| call.answered(as_etcd_answers_too_large(answer))))
    }
}

/// One call's labels.
struct Call {
    arrived: std::time::Instant,
    kind: &'static str,
    service: String,
    method: String,
}

impl Call {
    fn of(path: &str) -> Call {
        let (service, method) = path.trim_start_matches('/').split_once('/').unwrap_or((path, ""));
        let arrived = std::time::Instant::now();
        Call { arrived, kind: call_kind(method), service: service.to_string(), method: method.to_string() }
    }

    fn labels(&self) -> [&str; 3] {
        [self.kind, &self.service, &self.method]
    }

    /// Count the answer, now if its status is already known, else when its
    /// body ends.
    fn answered(mut self, answer: Answer) -> Answer {
        let status = answer.headers().get("grpc-status").and_then(|s| s.to_str().ok()?.parse::<i32>().ok());
        if status == Some(12) && !answer.headers().contains_key("grpc-message") {
            self.method = "unknown".to_string();
        }
        let m = metrics();
        m.grpc_started.with_label_values(&self.labels()).inc();
        m.grpc_received.with_label_values(&self.labels()).inc();
        match status {
            Some(code) => {
                self.handled(code);
                answer
            }
            None => answer.map(|body| Body::new(Observed { inner: body, call: Some(self) })),
        }
    }

    fn handled(&self, code: i32) {
        let m = metrics();
        if code == 0 {
            m.grpc_sent.with_label_values(&self.labels()).inc();
        }
        let [kind, service, method] = self.labels();
        m.grpc_handled.with_label_values(&[kind, service, method, code_name(code)]).inc();
        m.grpc_handling.with_label_values(&self.labels()).observe(self.arrived.elapsed().as_secs_f64());
    }
}

/// A response body that counts its call when its status goes by.
struct Observed {
    inner: Body,
    call: Option<Call>,
}

impl Observed {
    fn finish(&mut self, code: i32) {
        if let Some(call) = self.call.take() {
            call.handled(code);
        }
    }
}

impl http_body::Body for Observed {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(trailers) = frame.trailers_ref() {
                    let code = trailers.get("grpc-status").and_then(|s| s.to_str().ok()?.parse().ok());
                    self.finish(code.unwrap_or(2));
                }
            }
            Poll::Ready(Some(Err(status))) => self.finish(status.code() as i32),
            // The end without trailers: the status was lost (Unknown).
            Poll::Ready(None) => self.finish(2),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for Observed {
    fn drop(&mut self) {
        self.finish(1);
    }
}

/// go-grpc-prometheus' grpc_type of an etcd (or raftlock) method.
fn call_kind(method: &str) -> &'static str {
    match method {
        "Watch" | "LeaseKeepAlive" => "bidi_stream",
        "Snapshot" | "Observe" => "server_stream",
        _ => "unary",
    }
}

/// gRPC's canonical name of a status code, as Go spells it.
fn code_name(code: i32) -> &'static str {
    match code {
        0 => "OK",
        1 => "Canceled",
        2 => "Unknown",
        3 => "InvalidArgument",
        4 => "DeadlineExceeded",
        5 => "NotFound",
        6 => "AlreadyExists",
        7 => "PermissionDenied",
        8 => "ResourceExhausted",
        9 => "FailedPrecondition",
        10 => "Aborted",
        11 => "OutOfRange",
        12 => "Unimplemented",
        13 => "Internal",
        14 => "Unavailable",
        15 => "DataLoss",
        16 => "Unauthenticated",
        _ => "Unknown",
    }
}

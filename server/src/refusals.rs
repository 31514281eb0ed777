//! A tower layer that audits requests tonic refuses before our service sees them (oversized or
//! malformed messages, unknown methods), which would otherwise leave no trace.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tonic::body::Body;
use tonic::codegen::http;
use tonic::{Code, Status};
use tower::Service;

use crate::events::{EventSink, TransportEvent};
use crate::identity::PeerInfo;

/// Request extension the service marks once a call reaches it; an error response for an
/// unmarked request was produced by tonic itself while decoding or routing.
#[derive(Clone, Debug, Default)]
pub(crate) struct ReachedService(Arc<AtomicBool>);

impl ReachedService {
    pub(crate) fn mark(&self) {
        self.0.store(true, Ordering::Release);
    }

    fn is_marked(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// Wraps the gRPC routes of one server.
#[derive(Clone)]
pub(crate) struct RefusalAudit<S> {
    inner: S,
    events: EventSink,
}

impl<S> RefusalAudit<S> {
    pub(crate) fn new(inner: S, events: EventSink) -> Self {
        Self { inner, events }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

impl<S, B> Service<http::Request<Body>> for RefusalAudit<S>
where
    S: Service<http::Request<Body>, Response = http::Response<B>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, Self::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: http::Request<Body>) -> Self::Future {
        let reached = ReachedService::default();
        request.extensions_mut().insert(reached.clone());
        let peer = request.extensions().get::<PeerInfo>().map(|info| info.peer.clone());
        let path = request.uri().path().to_owned();
        let events = self.events.clone();
        let response = self.inner.call(request);
        Box::pin(async move {
            let response = response.await?;
            if reached.is_marked() {
                return Ok(response);
            }
            // Refusals before the service are trailers-only responses: the status is in headers.
            if let (Some(peer), Some(status)) = (peer, Status::from_header_map(response.headers())) {
                if status.code() != Code::Ok {
                    events.emit(TransportEvent::RequestRefused {
                        peer,
                        reason: format!("{path}: {:?}: {}", status.code(), status.message()),
                    });
                }
            }
            Ok(response)
        })
    }
}

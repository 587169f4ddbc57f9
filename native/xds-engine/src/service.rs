//! The gRPC service `envoy.service.discovery.v3.AggregatedDiscoveryService`, written out by hand the way
//! tonic's generator would (no protoc, no build script): its one method, `StreamAggregatedResources`, spawns a
//! task per stream that reads the client's requests into the shared state and writes the responses due.

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use tokio::sync::{mpsc, Notify};
use tokio_stream::wrappers::ReceiverStream;
use tonic::codegen::{http, BoxFuture, Service};
use tonic::server::{Grpc, NamedService, StreamingService};
use tonic::{Request, Response, Status, Streaming};

use crate::proto::{DiscoveryRequest, DiscoveryResponse};
use crate::state::State;

pub const SERVICE: &str = "envoy.service.discovery.v3.AggregatedDiscoveryService";
const METHOD: &str = "/envoy.service.discovery.v3.AggregatedDiscoveryService/StreamAggregatedResources";
/// responses handed over but not yet taken by the transport, per stream; past it pushes are marked due and
/// merge into the newest state (the client reads slowly)
const OUT_BUFFER: usize = 4;

pub type Shared = Arc<Mutex<State>>;

#[derive(Clone)]
pub struct Ads {
    pub state: Shared,
}

impl NamedService for Ads {
    const NAME: &'static str = SERVICE;
}

struct Deregister(Shared, u64);

impl Drop for Deregister {
    fn drop(&mut self) {
        self.0.lock().unwrap().deregister(self.1);
    }
}

async fn run_stream(state: Shared, id: u64, notify: Arc<Notify>, mut incoming: Streaming<DiscoveryRequest>,
                    tx: mpsc::Sender<Result<DiscoveryResponse, Status>>) {
    let _gone = Deregister(state.clone(), id);
    loop {
        tokio::select! {
            msg = incoming.message() => match msg {
                Ok(Some(req)) => state.lock().unwrap().on_request(id, req),
                _ => return, // the client closed its side or the stream broke
            },
            _ = notify.notified() => {}
            _ = tx.closed() => return,
        }
        // the responses due: each waits for room in the outbox (a slow client), then is taken as the state is
        // then, under the lock (so pushes made meanwhile keep the order of nonces)
        loop {
            let (due, stopping) = {
                let st = state.lock().unwrap();
                (st.has_pending(id), st.stopping)
            };
            if stopping {
                let _ = tx.send(Err(Status::unavailable("xds engine: the control plane is stopping"))).await;
                return;
            }
            if !due {
                break;
            }
            let Ok(permit) = tx.reserve().await else { return };
            match state.lock().unwrap().take_pending(id) {
                Some(resp) => permit.send(Ok(resp)),
                None => break,
            }
        }
    }
}

struct StreamMethod(Shared);

impl StreamingService<DiscoveryRequest> for StreamMethod {
    type Response = DiscoveryResponse;
    type ResponseStream = ReceiverStream<Result<DiscoveryResponse, Status>>;
    type Future = BoxFuture<Response<Self::ResponseStream>, Status>;

    fn call(&mut self, request: Request<Streaming<DiscoveryRequest>>) -> Self::Future {
        let state = self.0.clone();
        Box::pin(async move {
            let peer = request.remote_addr().map(|a| a.to_string()).unwrap_or_default();
            let notify = Arc::new(Notify::new());
            let (tx, rx) = mpsc::channel(OUT_BUFFER);
            let id = state.lock().unwrap().register(peer, notify.clone(), tx.clone());
            tokio::spawn(run_stream(state, id, notify, request.into_inner(), tx));
            Ok(Response::new(ReceiverStream::new(rx)))
        })
    }
}

impl<B> Service<http::Request<B>> for Ads
where
    B: tonic::codegen::Body + Send + 'static,
    B::Error: Into<tonic::codegen::StdError> + Send + 'static,
{
    type Response = http::Response<tonic::body::Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        if req.uri().path() == METHOD {
            let method = StreamMethod(self.state.clone());
            return Box::pin(async move {
                let codec = tonic_prost::ProstCodec::<DiscoveryResponse, DiscoveryRequest>::default();
                let mut grpc = Grpc::new(codec).max_decoding_message_size(64 << 20).max_encoding_message_size(usize::MAX);
                Ok(grpc.streaming(method, req).await)
            });
        }
        Box::pin(async move { Ok(Status::unimplemented("xds engine: only StreamAggregatedResources").into_http()) })
    }
}

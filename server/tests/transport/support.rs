//! Test harness: a PKI made at test time, a trivial handler, a listener on 127.0.0.1:0 that
//! records its transport events, and clients built from raw rustls configurations.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hyper_util::rt::TokioIo;
use keysync_proto::v1::key_sync_client::KeySyncClient;
use keysync_proto::v1::{
    DecisionBatch, DiffChunk, DiffRequest, FetchRequest, HelloRequest, HelloResponse, PlanRequest, PlanResponse,
    PushAck,
};
use keysync_proto::PROTOCOL_VERSION;
use keysync_server::{
    serve, CertAuthority, Handler, Items, PeerName, ServeOptions, TlsMaterial, TlsSetup, TransportEvent,
};
use rustls::pki_types::ServerName;
use time::OffsetDateTime;
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Channel, Endpoint, Uri};
use tonic::Status;

/// Upper bound of any one test.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Upper bound of any one connection attempt.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
pub const MAX_MESSAGE: usize = 1024 * 1024;

/// Runs a test body, failing it if it takes longer than [`TEST_TIMEOUT`].
pub async fn bounded<T>(body: impl Future<Output = T>) -> T {
    tokio::time::timeout(TEST_TIMEOUT, body).await.expect("test timed out")
}

/// A CA and the node certificates it issues.
pub struct Pki {
    pub ca: CertAuthority,
}

impl Pki {
    pub fn new() -> Self {
        Self::named("keysync test CA")
    }

    pub fn named(common_name: &str) -> Self {
        Self { ca: CertAuthority::new(common_name).expect("CA") }
    }

    /// Material for a node valid from an hour ago to tomorrow.
    pub fn node(&self, names: &[&str]) -> TlsMaterial {
        let now = OffsetDateTime::now_utc();
        self.node_valid(names, now - time::Duration::hours(1), now + time::Duration::days(1))
    }

    pub fn node_valid(&self, names: &[&str], not_before: OffsetDateTime, not_after: OffsetDateTime) -> TlsMaterial {
        let issued = self.ca.issue(names, not_before, not_after).expect("issue");
        TlsMaterial {
            ca_pem: self.ca.cert_pem().into_bytes(),
            cert_pem: issued.cert_pem.into_bytes(),
            key_pem: issued.key_pem.into_bytes(),
        }
    }

    pub fn setup(&self, names: &[&str]) -> TlsSetup {
        TlsSetup::new(&self.node(names)).expect("TLS setup")
    }
}

/// Answers every call predictably and remembers who called.
#[derive(Default)]
pub struct EchoHandler {
    pub callers: Mutex<Vec<(String, PeerName)>>,
}

impl EchoHandler {
    fn saw(&self, call: &str, peer: &PeerName) {
        self.callers.lock().unwrap().push((call.to_owned(), peer.clone()));
    }
}

#[tonic::async_trait]
impl Handler for EchoHandler {
    async fn hello(&self, peer: &PeerName, _req: HelloRequest) -> Result<HelloResponse, Status> {
        self.saw("hello", peer);
        Ok(HelloResponse {
            node: "b".to_owned(),
            protocol_version: PROTOCOL_VERSION,
            n_decisions: 42,
            health: None,
            forgot_through_ms: 0,
            held: Vec::new(),
            clock: None,
            joining: false,
            push_streams: 0,
        })
    }

    async fn push(&self, peer: &PeerName, batch: DecisionBatch) -> Result<PushAck, Status> {
        self.saw("push", peer);
        let n = batch.decisions.len() as u32;
        Ok(PushAck { n_received: n, n_applied: n / 2 })
    }

    async fn diff(&self, peer: &PeerName, req: DiffRequest) -> Result<Items<DiffChunk>, Status> {
        self.saw("diff", peer);
        Ok(Box::new((0..req.n_buckets).map(|bucket| DiffChunk { buckets: vec![bucket], ..Default::default() })))
    }

    async fn fetch(&self, peer: &PeerName, req: FetchRequest) -> Result<Items<DecisionBatch>, Status> {
        self.saw("fetch", peer);
        Ok(Box::new(req.minions.into_iter().map(|_| DecisionBatch::default())))
    }

    async fn plan(&self, peer: &PeerName, _req: PlanRequest) -> Result<PlanResponse, Status> {
        self.saw("plan", peer);
        Ok(PlanResponse { node: "b".to_owned(), ..PlanResponse::default() })
    }
}

/// A running listener and what it reported.
pub struct TestServer {
    pub addr: SocketAddr,
    pub handler: Arc<EchoHandler>,
    events: Arc<Mutex<Vec<TransportEvent>>>,
    pub shutdown: CancellationToken,
    pub task: JoinHandle<Result<(), keysync_server::ServeError>>,
}

impl TestServer {
    /// Starts a listener whose certificate names `own`, admitting `allowed` peers.
    pub async fn start(pki: &Pki, own: &str, allowed: &[&str]) -> Self {
        Self::start_with(
            pki,
            own,
            ServeOptions {
                allowed_peers: allowed.iter().map(|s| PeerName::new(s).unwrap()).collect(),
                // Every refusal reported: these tests count them one by one.
                refusal_window: Duration::ZERO,
                ..ServeOptions::default()
            },
        )
        .await
    }

    pub async fn start_with(pki: &Pki, own: &str, opts: ServeOptions) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let tls = pki.setup(&[own]);
        let handler = Arc::new(EchoHandler::default());
        let events = Arc::new(Mutex::new(Vec::new()));
        let sink = events.clone();
        let shutdown = CancellationToken::new();
        let task = tokio::spawn({
            let (handler, shutdown) = (handler.clone(), shutdown.clone());
            async move {
                let on_event = Arc::new(move |e| sink.lock().unwrap().push(e));
                serve(listener, &tls, opts, handler, on_event, shutdown).await
            }
        });
        Self { addr, handler, events, shutdown, task }
    }

    pub fn address(&self) -> String {
        self.addr.to_string()
    }

    /// Waits until an event matching `pred` was reported, and returns it.
    pub async fn event(&self, what: &str, pred: impl Fn(&TransportEvent) -> bool) -> TransportEvent {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        loop {
            if let Some(e) = self.events.lock().unwrap().iter().find(|e| pred(e)) {
                return e.clone();
            }
            assert!(tokio::time::Instant::now() < deadline, "no {what} event; got {:?}", self.events.lock().unwrap());
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// A legitimate peer `a` can connect and say Hello.
    pub async fn assert_serves(&self, pki: &Pki) {
        let tls = pki.setup(&["a"]);
        let mut client = keysync_server::connect(&self.address(), "b", &tls, MAX_MESSAGE, CONNECT_TIMEOUT)
            .await
            .expect("legitimate peer connects");
        let hello = client.hello(hello_from("a")).await.expect("legitimate Hello");
        assert_eq!(hello.into_inner().n_decisions, 42);
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

pub fn hello_from(node: &str) -> HelloRequest {
    HelloRequest { node: node.to_owned(), protocol_version: PROTOCOL_VERSION, ..Default::default() }
}

/// Connects with an arbitrary rustls client configuration and says Hello as `a`; the error of
/// whichever step failed, as text with its sources.
pub async fn hello_with(
    config: rustls::ClientConfig,
    addr: SocketAddr,
    server_name: &str,
) -> Result<HelloResponse, String> {
    let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
    let name = ServerName::try_from(server_name.to_owned()).unwrap();
    let connect = tower::service_fn(move |_: Uri| {
        let (connector, name) = (connector.clone(), name.clone());
        async move {
            let tcp = TcpStream::connect(addr).await?;
            connector.connect(name, tcp).await.map(TokioIo::new)
        }
    });
    let channel: Channel = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect_with_connector(connect)
        .await
        .map_err(|e| chain(&e))?;
    KeySyncClient::new(channel).hello(hello_from("a")).await.map(|r| r.into_inner()).map_err(|e| chain(&e))
}

/// An error and all its sources, one line.
pub fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

/// A rustls client configuration trusting `pki`'s CA, for TLS `versions`, presenting the
/// certificate of `identity` if given.
pub fn client_config(
    pki: &Pki,
    versions: &[&'static rustls::SupportedProtocolVersion],
    identity: Option<&TlsMaterial>,
) -> rustls::ClientConfig {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_slice(pki.ca.cert_pem().as_bytes()).unwrap()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(versions)
        .unwrap()
        .with_root_certificates(roots);
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some(material) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(&material.cert_pem).unwrap()],
                PrivateKeyDer::from_pem_slice(&material.key_pem).unwrap(),
            )
            .unwrap(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    config
}

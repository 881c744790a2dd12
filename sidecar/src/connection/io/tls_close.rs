//! Closing a TLS connection whose client stopped reading: the
//! `close_notify` it writes never leaves a full socket, so the close is
//! bounded as a write is, by the idle timeout and by the shutdown cut.

use std::io::ErrorKind;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_rustls::client::TlsStream as ClientTls;
use tokio_util::sync::CancellationToken;

use super::{Connection, Transport};
use crate::connection::ConnectionLimits;

/// How long a test waits for a close that must end, at most.
const PATIENCE: Duration = Duration::from_secs(2);

/// A TLS connection accepted with `idle_timeout` (a request in flight, so
/// only bytes not moving make it idle), its client (which never reads)
/// and its shutdown cut.
async fn tls_accepted(
    idle_timeout: Duration,
) -> (
    Connection,
    ClientTls<TcpStream>,
    CancellationToken,
    crate::in_flight::RequestGuard,
) {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let key = rcgen::KeyPair::generate().expect("key");
    let certificate = rcgen::CertificateParams::new(vec!["localhost".to_string()])
        .expect("params")
        .self_signed(&key)
        .expect("certificate");
    let private = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let server_config = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(vec![certificate.der().clone()], private)
        .expect("server config");
    let mut roots = rustls::RootCertStore::empty();
    roots.add(certificate.der().clone()).expect("root");
    let client_config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();

    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let client = TcpStream::connect(listener.local_addr().expect("addr"))
        .await
        .expect("connect");
    let (server, _) = listener.accept().await.expect("accept");
    let name = ServerName::try_from("localhost").expect("name");
    let (server, client) = tokio::time::timeout(PATIENCE, async {
        tokio::join!(
            tokio_rustls::TlsAcceptor::from(Arc::new(server_config)).accept(server),
            tokio_rustls::TlsConnector::from(Arc::new(client_config)).connect(name, client),
        )
    })
    .await
    .expect("handshake within the patience");
    let (server, client) = (
        server.expect("server handshake"),
        client.expect("client handshake"),
    );

    let cut = CancellationToken::new();
    let limits = ConnectionLimits {
        max_connections: 1,
        idle_timeout,
        first_request_timeout: idle_timeout,
        cut: cut.clone(),
        replies: crate::reply_budget::ReplyLimits::unbounded(),
    };
    let slot = Arc::new(Semaphore::new(1))
        .acquire_owned()
        .await
        .expect("slot");
    let connection = Connection::new(Transport::Tls(Box::new(server)), &limits, slot);
    let request = connection.in_flight().start();
    (connection, client, cut, request)
}

/// Writes to `server` until a write stalls (the client reads nothing, so
/// the socket fills up).
async fn fill_until_stalled(server: &mut Connection) {
    let chunk = vec![0u8; 64 * 1024];
    // 64 MiB at most: far past any loopback socket's buffers.
    for _ in 0..1024 {
        match tokio::time::timeout(Duration::from_millis(50), server.write(&chunk)).await {
            Err(_) => return,
            Ok(written) => {
                written.expect("the connection takes bytes until the socket is full");
            }
        }
    }
    panic!("the socket never filled up");
}

#[tokio::test]
async fn closing_tls_to_a_client_that_stopped_reading_ends_at_the_idle_timeout() {
    let (mut server, _client, _cut, _request) = tls_accepted(Duration::from_millis(200)).await;
    fill_until_stalled(&mut server).await;
    let closed = tokio::time::timeout(PATIENCE, server.shutdown())
        .await
        .expect("the close outlived its idle timeout");
    let error = closed.expect_err("the close_notify cannot have been sent");
    assert_eq!(error.kind(), ErrorKind::TimedOut, "{error}");
}

#[tokio::test]
async fn closing_tls_to_a_client_that_stopped_reading_ends_at_the_shutdown_cut() {
    let (mut server, _client, cut, _request) = tls_accepted(Duration::from_secs(60)).await;
    fill_until_stalled(&mut server).await;
    // The close is waiting on the socket when the cut comes.
    let (closed, ()) = tokio::join!(tokio::time::timeout(PATIENCE, server.shutdown()), async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        cut.cancel();
    });
    let error = closed
        .expect("the close outlived the shutdown cut")
        .expect_err("the close_notify cannot have been sent");
    assert_eq!(error.kind(), ErrorKind::ConnectionAborted, "{error}");
}

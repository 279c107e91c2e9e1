//! Who may write, and what a connection may cost: the TCP transfer stream under mutual TLS
//! (I11: only a peer whose certificate the listener's `authorize` accepts, a prefill, may
//! write), a bound on TLS handshakes, and a cap on open connections so that idle sockets cannot
//! make the receiver hold a page buffer each.
//!
//! TLS (rustls, ring) encrypts and authenticates every byte of the stream: a frame forged on
//! another connection fails the handshake, a frame injected into or replayed on an open one
//! fails its record's AEAD tag, and a certificate of the wrong role is refused before any frame
//! is read. Connections in their handshake have a budget of their own (`max_handshakes`), apart
//! from authenticated ones (`max_connections`), so a flood of peers that never authenticate
//! cannot take a real prefill's place. Refused connections are summarized per source
//! (`refusals.rs`) and handed to `on_refused` (decode reports them to the auditor).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use crate::seal::SealPolicy;

/// A boxed read half of a transfer connection (TCP or TLS).
pub type BoxRead = Box<dyn AsyncRead + Send + Unpin>;
/// A boxed write half of a transfer connection (TCP or TLS).
pub type BoxWrite = Box<dyn AsyncWrite + Send + Unpin>;

/// Decides whether a verified peer certificate chain may write (its leaf's role).
pub type Authorize = Arc<dyn Fn(&[CertificateDer<'static>]) -> Result<(), String> + Send + Sync>;

/// Told about every connection the listener refused.
pub type OnRefused = Arc<dyn Fn(&Refused) + Send + Sync>;

/// The listener's TLS side.
#[derive(Clone)]
pub struct ServerTls {
    /// Requires a client certificate under the suite CA.
    pub config: Arc<rustls::ServerConfig>,
    /// The role check on the peer's verified chain.
    pub authorize: Authorize,
}

/// The sender's TLS side.
#[derive(Clone)]
pub struct ClientTls {
    /// Trusts the suite CA, presents this worker's certificate.
    pub config: Arc<rustls::ClientConfig>,
    /// The name the receiver's certificate must carry (decode's role name).
    pub server_name: ServerName<'static>,
}

/// How a transfer listener guards its port.
#[derive(Clone)]
pub struct ListenOptions {
    /// Mutual TLS, or plaintext (loopback, tests, or the operator's explicit choice).
    pub tls: Option<ServerTls>,
    /// Sealed frames required on every connection (`seal.rs`): the alternative to `tls`.
    pub seal: Option<SealPolicy>,
    /// Longest a TLS handshake may take, from accept.
    pub handshake_timeout: Duration,
    /// Most connections in their handshake at once (a budget of their own: peers that have
    /// not authenticated cannot take the places of those that have); more are closed on accept.
    pub max_handshakes: usize,
    /// Most authenticated connections served at once; more are closed after their handshake.
    pub max_connections: usize,
    /// Refusals from one source address are logged and reported once per window, the rest of
    /// the window as one summary with its count (`Duration::ZERO`: every refusal).
    pub refusal_window: Duration,
    /// Hook for refused connections (each call one report: a first refusal or a summary).
    pub on_refused: Option<OnRefused>,
}

impl Default for ListenOptions {
    fn default() -> Self {
        ListenOptions {
            tls: None,
            seal: None,
            handshake_timeout: Duration::from_secs(3),
            max_handshakes: 64,
            max_connections: 256,
            refusal_window: Duration::from_secs(60),
            on_refused: None,
        }
    }
}

/// A report of refused transfer connections from one source: its first refusal in a window
/// (`count` 1), or the window's summary.
#[derive(Clone, Debug)]
pub struct Refused {
    /// The peer (of the last refusal reported).
    pub peer: SocketAddr,
    /// Why (the last refusal's reason).
    pub reason: RefusedReason,
    /// Refusals this report stands for.
    pub count: u64,
}

/// Why a transfer connection was refused.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RefusedReason {
    /// `max_connections` were already open.
    TooManyConnections,
    /// `max_handshakes` were already in their handshake.
    TooManyHandshakes,
    /// The TLS handshake did not finish in time.
    HandshakeTimeout,
    /// The TLS handshake failed (no certificate, another CA, not TLS at all).
    Handshake(String),
    /// The certificate is valid but its role may not write.
    Role(String),
    /// A frame failed its seal (forged, altered, replayed, or not sealed): the connection was
    /// closed before that frame reached the pool.
    Seal(String),
}

impl std::fmt::Display for RefusedReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RefusedReason::TooManyConnections => f.write_str("connection cap reached"),
            RefusedReason::TooManyHandshakes => f.write_str("handshake cap reached"),
            RefusedReason::HandshakeTimeout => f.write_str("TLS handshake timed out"),
            RefusedReason::Handshake(e) => write!(f, "TLS handshake failed: {e}"),
            RefusedReason::Role(e) => write!(f, "peer may not write: {e}"),
            RefusedReason::Seal(e) => write!(f, "frame refused: {e}"),
        }
    }
}

/// Socket bytes read ahead of rustls on a TLS receiver: up to sixteen 16 KiB records per socket
/// read, and this much more memory per open connection (the connection cap bounds the sum).
const TLS_READ_AHEAD: usize = 256 << 10;

/// Secures an accepted socket: TLS handshake within the timeout and the role check, or the
/// plain socket when the listener runs in clear.
pub(crate) async fn accept(
    stream: TcpStream,
    opts: &ListenOptions,
) -> Result<(BoxRead, BoxWrite), RefusedReason> {
    let Some(tls) = &opts.tls else {
        let (rd, wr) = stream.into_split();
        return Ok((Box::new(rd), Box::new(wr)));
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.config.clone());
    // rustls asks its transport for 4 KiB at a time: straight on the socket that is five reads
    // (syscalls) per 16 KiB record, the cost that dominated TLS goodput. A read-ahead buffer
    // turns them into one socket read per `TLS_READ_AHEAD` bytes.
    let stream = tokio::io::BufReader::with_capacity(TLS_READ_AHEAD, stream);
    let s = match tokio::time::timeout(opts.handshake_timeout, acceptor.accept(stream)).await {
        Err(_) => return Err(RefusedReason::HandshakeTimeout),
        Ok(Err(e)) => return Err(RefusedReason::Handshake(e.to_string())),
        Ok(Ok(s)) => s,
    };
    let certs = s.get_ref().1.peer_certificates().unwrap_or(&[]);
    (tls.authorize)(certs).map_err(RefusedReason::Role)?;
    let (rd, wr) = tokio::io::split(s);
    Ok((Box::new(rd), Box::new(wr)))
}

/// Secures a connected socket on the sending side.
pub(crate) async fn connect(
    stream: TcpStream,
    tls: Option<&ClientTls>,
    timeout: Duration,
) -> std::io::Result<(BoxRead, BoxWrite)> {
    let Some(tls) = tls else {
        let (rd, wr) = stream.into_split();
        return Ok((Box::new(rd), Box::new(wr)));
    };
    let connector = tokio_rustls::TlsConnector::from(tls.config.clone());
    let s = tokio::time::timeout(timeout, connector.connect(tls.server_name.clone(), stream))
        .await
        .map_err(|_| {
            std::io::Error::new(std::io::ErrorKind::TimedOut, "TLS handshake timed out")
        })??;
    let (rd, wr) = tokio::io::split(s);
    Ok((Box::new(rd), Box::new(wr)))
}

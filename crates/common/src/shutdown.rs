//! Graceful shutdown: one [`Shutdown`] token per process, cancelled by SIGTERM or Ctrl-C, and
//! handed to every server as an injected future (`run(listener, shutdown)`).

pub use tokio_util::sync::CancellationToken as Shutdown;

/// Resolves on Ctrl-C or (on Unix) SIGTERM.
pub async fn signal() {
    let ctrl_c = async {
        // If the handler cannot be installed we simply never resolve on Ctrl-C.
        if tokio::signal::ctrl_c().await.is_err() {
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => tracing::info!("Ctrl-C: shutting down"),
        () = term => tracing::info!("SIGTERM: shutting down"),
    }
}

/// A token cancelled when a signal arrives (spawns the watcher; needs a tokio runtime).
pub fn on_signal() -> Shutdown {
    let token = Shutdown::new();
    let t = token.clone();
    tokio::spawn(async move {
        signal().await;
        t.cancel();
    });
    token
}

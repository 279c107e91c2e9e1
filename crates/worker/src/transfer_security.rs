//! The KV transfer connection's security from a worker's configuration (I11): under mutual TLS
//! decode's listener takes writes only from prefill certificates and reports every refused
//! connection to the auditor (I8); prefill speaks TLS to it with its own certificate. With
//! `--transfer-seal` the listener instead requires every frame sealed under its grant's secret
//! (which travels only inside the grant, over gRPC), so the stream itself needs no TLS.
//! Without either, the listener must be on loopback unless `--insecure-internal`.

use std::sync::Arc;

use pagewarden_common::integrity::{IntegrityEvent, IntegrityKind, IntegritySink};
use pagewarden_common::tls::{
    peer_roles, refuse_plaintext, rustls_client_config, rustls_server_config, InternalTls,
    PlaintextRefused, RustlsError, SuiteRole,
};
use pagewarden_common::worker_config::WorkerConfig;
use pagewarden_transfer::{ClientTls, ListenOptions, Refused, SealMaster, SealPolicy, ServerTls};
use rustls_pki_types::ServerName;

/// The transfer connection could not be secured as configured.
#[derive(Debug, thiserror::Error)]
pub enum TransferSecurityError {
    /// Plaintext transfer on a non-loopback address without `--insecure-internal`.
    #[error(transparent)]
    Plaintext(#[from] PlaintextRefused),
    /// The TLS material does not make a rustls configuration.
    #[error(transparent)]
    Tls(#[from] RustlsError),
}

/// Decode's transfer listener options: TLS with the prefill-only role check when configured,
/// refused connections reported through `integrity`.
pub fn receiver_options(
    cfg: &WorkerConfig,
    integrity: Arc<dyn IntegritySink>,
    role: &'static str,
) -> Result<ListenOptions, TransferSecurityError> {
    let seal = cfg.transfer_seal.map(|mode| SealPolicy {
        mode,
        master: SealMaster::random(),
    });
    if seal.is_none() {
        refuse_plaintext(
            "KV transfer",
            cfg.transfer_addr,
            &cfg.tls,
            cfg.insecure_internal,
        )?;
    }
    let tls = match &cfg.tls {
        _ if seal.is_some() => None,
        InternalTls::Plaintext => None,
        InternalTls::Mutual(m) => Some(ServerTls {
            config: rustls_server_config(m)?,
            authorize: Arc::new(|chain| {
                let roles = chain.first().map(peer_roles).unwrap_or_default();
                if roles.contains(&SuiteRole::Prefill) {
                    Ok(())
                } else {
                    Err(format!("certificate role(s) {roles:?}, not prefill"))
                }
            }),
        }),
    };
    let node = cfg.node_id.clone();
    let on_refused = Arc::new(move |r: &Refused| {
        integrity.report(IntegrityEvent {
            node_id: node.clone(),
            role,
            kind: IntegrityKind::StaleMessage,
            request: None,
            tenant: None,
            page: None,
            // One report per source and window: `count` refusals since the last.
            detail: format!(
                "KV transfer connection from {} refused ({} from {} this window): {}",
                r.peer,
                r.count,
                r.peer.ip(),
                r.reason
            ),
        })
    });
    Ok(ListenOptions {
        tls,
        seal,
        on_refused: Some(on_refused),
        ..ListenOptions::default()
    })
}

/// Prefill's side: TLS towards a decode certificate, presenting this worker's, when
/// configured.
pub fn sender_tls(cfg: &WorkerConfig) -> Result<Option<ClientTls>, TransferSecurityError> {
    match &cfg.tls {
        InternalTls::Plaintext => Ok(None),
        InternalTls::Mutual(m) => Ok(Some(ClientTls {
            config: rustls_client_config(m)?,
            server_name: ServerName::try_from(SuiteRole::Decode.dns_name())
                .expect("a role's DNS name is a valid server name"),
        })),
    }
}

//! The HTTP API's TLS with an operator's own certificate (`coordinator
//! --http-cert`), read from PEM.

use rustls::pki_types::{CertificateDer, PrivateKeyDer};

use crate::{provider, TransportError};

/// A TLS 1.3 server configuration with an operator's own certificate
/// chain and private key, each read from PEM (the chain's first
/// certificate is the server's; the key must be its own).
pub fn server_tls_pem(
    chain_pem: &[u8],
    key_pem: &[u8],
) -> Result<rustls::ServerConfig, TransportError> {
    use rustls::pki_types::pem::PemObject;
    let chain = CertificateDer::pem_slice_iter(chain_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TransportError::Tls(format!("the certificate file: {e}")))?;
    if chain.is_empty() {
        return Err(TransportError::Tls(
            "the certificate file holds no PEM certificate".into(),
        ));
    }
    // A browser's handshake carries the whole chain: a real one is a
    // server certificate and a few intermediates.
    const MAX_CHAIN: usize = 10;
    if chain.len() > MAX_CHAIN {
        return Err(TransportError::Tls(format!(
            "the certificate file holds {} certificates: a chain has at most {MAX_CHAIN}",
            chain.len()
        )));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem)
        .map_err(|e| TransportError::Tls(format!("the key file holds no PEM private key: {e}")))?;
    rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| TransportError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(|e| TransportError::Tls(format!("the certificate and key: {e}")))
}

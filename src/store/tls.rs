//! TLS to PostgreSQL, as `DATABASE_URL` asks for it (`database_url.rs`), with rustls, for every
//! connection of the replica (pool, LISTEN, migrations).
//!
//! `sslmode` has libpq's meaning: `disable` (never), `prefer` (the default:
//! if the server offers it, unverified), `require` (always; the certificate
//! is verified against `sslrootcert` when one is given, else not at all),
//! `verify-ca` (always, the certificate chain checked against `sslrootcert`,
//! or the system's roots without one), `verify-full` (as `verify-ca`, and
//! the certificate must name the host connected to). Managed PostgreSQL
//! services (Neon, Supabase, RDS, Cloud SQL, Railway's public URL) work
//! with `sslmode=require`, or better `verify-full` with their CA.

use std::{
    future::Future,
    io,
    path::PathBuf,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use rustls::{
    ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
    client::{
        WebPkiServerVerifier,
        danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier},
    },
    crypto::CryptoProvider,
    pki_types::{CertificateDer, ServerName, UnixTime, pem::PemObject},
};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_postgres::tls::{ChannelBinding, MakeTlsConnect, TlsConnect};

/// How a connection uses TLS.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

/// The TLS connector of every connection to PostgreSQL.
#[derive(Clone)]
pub struct Tls {
    config: Arc<ClientConfig>,
}

impl Tls {
    /// The connector for `mode`, verifying against `root_cert` when given.
    pub(super) fn new(mode: SslMode, root_cert: Option<&PathBuf>) -> Result<Self, String> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let roots = match (mode, root_cert) {
            (_, Some(path)) => Some(load_roots(path)?),
            (SslMode::VerifyCa | SslMode::VerifyFull, None) => Some(system_roots()?),
            _ => None,
        };
        let verifier: Arc<dyn ServerCertVerifier> = match (mode, roots) {
            (SslMode::Disable | SslMode::Prefer, _) | (SslMode::Require, None) => {
                Arc::new(Unverified(provider.clone()))
            }
            (SslMode::VerifyFull, Some(roots)) => webpki(roots, &provider)?,
            (SslMode::Require | SslMode::VerifyCa, Some(roots)) => {
                Arc::new(AnyName(webpki(roots, &provider)?))
            }
            (SslMode::VerifyCa | SslMode::VerifyFull, None) => {
                return Err("sslmode=verify-* needs certificates to verify against".into());
            }
        };
        let config = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        Ok(Self {
            config: Arc::new(config),
        })
    }
}

fn load_roots(path: &PathBuf) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| format!("sslrootcert={}: {e}", path.display()))?;
    for cert in certs {
        let cert = cert.map_err(|e| format!("sslrootcert={}: {e}", path.display()))?;
        roots
            .add(cert)
            .map_err(|e| format!("sslrootcert={}: {e}", path.display()))?;
    }
    if roots.is_empty() {
        return Err(format!(
            "sslrootcert={} holds no certificate",
            path.display()
        ));
    }
    Ok(roots)
}

/// A TLS client configuration that verifies servers against the system's
/// CA certificates (read from disk now: build it once), for HTTPS clients
/// such as the webhook worker.
pub fn https_client_config() -> Result<ClientConfig, String> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    Ok(ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(system_roots()?)
        .with_no_client_auth())
}

fn system_roots() -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    let found = rustls_native_certs::load_native_certs();
    for cert in found.certs {
        let _ = roots.add(cert);
    }
    if roots.is_empty() {
        return Err(
            "sslmode=verify-* without sslrootcert needs the system's CA certificates, and none were found"
                .into(),
        );
    }
    Ok(roots)
}

fn webpki(
    roots: RootCertStore,
    provider: &Arc<CryptoProvider>,
) -> Result<Arc<WebPkiServerVerifier>, String> {
    WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(|e| e.to_string())
}

/// `require` without roots (and `prefer`): encrypted, the certificate not
/// checked — as libpq does. The handshake's signatures are still verified.
#[derive(Debug)]
struct Unverified(Arc<CryptoProvider>);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

/// `verify-ca`: the chain must lead to a trusted root; the name is not
/// checked.
#[derive(Debug)]
struct AnyName(Arc<WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        use rustls::{CertificateError, Error};
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp, now)
        {
            Err(Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

impl<S> MakeTlsConnect<S> for Tls
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = TlsStream<S>;
    type TlsConnect = Connect;
    type Error = rustls::pki_types::InvalidDnsNameError;

    fn make_tls_connect(&mut self, host: &str) -> Result<Connect, Self::Error> {
        Ok(Connect {
            config: self.config.clone(),
            name: ServerName::try_from(host.to_owned())?,
        })
    }
}

/// One connection's TLS handshake.
pub struct Connect {
    config: Arc<ClientConfig>,
    name: ServerName<'static>,
}

impl<S> TlsConnect<S> for Connect
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    type Stream = TlsStream<S>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TlsStream<S>>> + Send>>;

    fn connect(self, stream: S) -> Self::Future {
        Box::pin(async move {
            let stream = tokio_rustls::TlsConnector::from(self.config)
                .connect(self.name, stream)
                .await?;
            Ok(TlsStream(stream))
        })
    }
}

/// A TLS connection to PostgreSQL.
pub struct TlsStream<S>(tokio_rustls::client::TlsStream<S>);

impl<S: AsyncRead + AsyncWrite + Unpin> tokio_postgres::tls::TlsStream for TlsStream<S> {
    fn channel_binding(&self) -> ChannelBinding {
        ChannelBinding::none()
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for TlsStream<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for TlsStream<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

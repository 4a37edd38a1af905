//! TLS on the client and peer ports, configured by etcd's flags: rustls
//! configurations for the answering side ([`ServerTls`]: certificate, client
//! certificate verification, an allowed peer CN) and for a member dialling
//! its peers ([`peer_client_config`]).
//!
//! - Protocol versions: TLS 1.2 and 1.3 (`--tls-min-version`,
//!   `--tls-max-version`); rustls has no older ones, and naming one is a
//!   start-up error.
//! - `--cipher-suites` (Go's names, as etcd takes them) chooses among the
//!   TLS 1.2 suites; TLS 1.3's are not configurable (as in Go), so naming
//!   suites while only TLS 1.3 is allowed is an error, as it is in etcd.
//! - ALPN offers `h2` only: both ports speak gRPC.
//! - `--auto-tls` / `--peer-auto-tls`: a self-signed certificate for the
//!   listen and advertise hosts, made once under
//!   `<data-dir>/fixtures/{client,peer}` and reused after. Peers using it do
//!   not verify each other's certificates (as etcd), so it encrypts but does
//!   not authenticate.
//! - A handshake has [`HANDSHAKE_TIMEOUT`]; a connection that does not
//!   finish it (or whose certificate's CN is not `--peer-cert-allowed-cn`) is
//!   closed without reaching gRPC.
//!
//! Caveat: certificate files are read at start-up; a renewed certificate
//! takes a restart.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, DigitallySignedStruct, ProtocolVersion, RootCertStore, ServerConfig, SignatureScheme};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;
use tokio_rustls::TlsAcceptor;

/// How long a client or peer has to finish the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// One port's certificate flags (`--cert-file` ... or `--peer-cert-file` ...).
#[derive(Clone, Debug, Default)]
pub struct TlsFiles {
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    pub trusted_ca: Option<PathBuf>,
    /// Require a client certificate signed by `trusted_ca`.
    pub client_cert_auth: bool,
    /// Make (or reuse) a self-signed certificate when none is given.
    pub auto: bool,
    /// Only a client certificate with this CommonName is let in (peers).
    pub allowed_cn: Option<String>,
}

/// Refuse a port's `--{prefix}client-cert-auth` that could not be kept: it
/// promises that only holders of a certificate signed by the trusted CA get
/// in, which fails with no CA to check against (self-signed auto-TLS
/// certificates prove nothing) or on a plaintext listen URL, where no
/// certificate is asked for at all. Used for the peer port, where an open
/// port lets anyone act as a member.
pub fn refuse_unkept_client_auth(files: &TlsFiles, listen_urls: &[String], prefix: &str) -> anyhow::Result<()> {
    if !files.client_cert_auth {
        return Ok(());
    }
    if files.trusted_ca.is_none() {
        bail!(
            "--{prefix}client-cert-auth needs --{prefix}trusted-ca-file: {}peers could not be authenticated",
            if files.auto {
                format!("with --{prefix}auto-tls alone, every certificate is self-signed and ")
            } else {
                String::new()
            }
        );
    }
    if let Some(url) = listen_urls.iter().find(|u| !u.starts_with("https://")) {
        bail!(
            "--{prefix}client-cert-auth is set, but --listen-{prefix}urls has {url}, where peers present no \
             certificate: use https:// URLs"
        );
    }
    Ok(())
}

/// What both ports allow: protocol versions and cipher suites.
#[derive(Clone, Debug, Default)]
pub struct TlsPolicy {
    /// `TLS1.2` or `TLS1.3` (default TLS1.2).
    pub min_version: Option<String>,
    /// `TLS1.2` or `TLS1.3` (default TLS1.3).
    pub max_version: Option<String>,
    /// Go's names of TLS 1.2 suites (all of rustls's when None).
    pub cipher_suites: Option<Vec<String>>,
}

/// Where an automatic certificate goes and what it covers.
#[derive(Clone, Debug)]
pub struct AutoCert {
    /// `<data-dir>/fixtures/client` or `.../peer`.
    pub dir: PathBuf,
    /// Host names and IP addresses the certificate is valid for.
    pub hosts: Vec<String>,
    /// `--self-signed-cert-validity`, in years.
    pub validity_years: u32,
}

/// The answering side of a TLS port.
pub struct ServerTls {
    acceptor: TlsAcceptor,
    allowed_cn: Option<String>,
}

impl ServerTls {
    /// The server configuration for one port, or None when the port has no
    /// certificate (and no `auto`).
    pub fn new(files: &TlsFiles, policy: &TlsPolicy, auto: &AutoCert, flag: &str) -> anyhow::Result<Option<ServerTls>> {
        let Some((cert, key)) = certificate(files, auto, flag)? else { return Ok(None) };
        let provider = provider(policy)?;
        let builder = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&versions(policy)?)
            .context("TLS versions")?;
        let verifier = if files.client_cert_auth && !files.auto {
            let ca = files.trusted_ca.as_ref().with_context(|| {
                format!("--{flag}client-cert-auth needs --{flag}trusted-ca-file: the CA that signs client certificates")
            })?;
            WebPkiClientVerifier::builder_with_provider(Arc::new(roots(ca)?), provider)
                .build()
                .context("client certificate verifier")?
        } else {
            WebPkiClientVerifier::no_client_auth()
        };
        let mut config = builder
            .with_client_cert_verifier(verifier)
            .with_single_cert(read_certs(&cert)?, read_key(&key)?)
            .with_context(|| format!("{} and {} do not make a certificate", cert.display(), key.display()))?;
        // The client port also serves /metrics and the health endpoints to
        // HTTP/1.1 clients (curl --http1.1, Python's requests); the peer port
        // speaks HTTP/2 only.
        config.alpn_protocols = match flag {
            "" => vec![b"h2".to_vec(), b"http/1.1".to_vec()],
            _ => vec![b"h2".to_vec()],
        };
        Ok(Some(ServerTls { acceptor: TlsAcceptor::from(Arc::new(config)), allowed_cn: files.allowed_cn.clone() }))
    }

    /// The TLS handshake on an accepted connection, within [`HANDSHAKE_TIMEOUT`].
    pub async fn accept(&self, tcp: TcpStream) -> io::Result<TlsStream<TcpStream>> {
        let stream = tokio::time::timeout(HANDSHAKE_TIMEOUT, self.acceptor.accept(tcp))
            .await
            .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "TLS handshake timed out"))??;
        if let Some(allowed) = &self.allowed_cn {
            let cn = stream.get_ref().1.peer_certificates().and_then(|c| c.first()).and_then(common_name);
            if cn.as_deref() != Some(allowed.as_str()) {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("peer certificate CN {cn:?} is not the allowed {allowed:?}"),
                ));
            }
        }
        Ok(stream)
    }
}

/// The configuration a member dials its `https://` peers with, or None when
/// it has no peer certificate: it presents its certificate, and verifies
/// theirs against `--peer-trusted-ca-file` (not at all with auto TLS).
pub fn peer_client_config(
    files: &TlsFiles,
    policy: &TlsPolicy,
    auto: &AutoCert,
) -> anyhow::Result<Option<Arc<ClientConfig>>> {
    let Some((cert, key)) = certificate(files, auto, "peer-")? else { return Ok(None) };
    let provider = provider(policy)?;
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&versions(policy)?)
        .context("TLS versions")?;
    let builder = match (&files.trusted_ca, files.auto) {
        (Some(ca), false) => builder.with_root_certificates(roots(ca)?),
        (None, false) => {
            bail!("--peer-cert-file needs --peer-trusted-ca-file: the CA that signs the members' certificates")
        }
        (_, true) => builder.dangerous().with_custom_certificate_verifier(Arc::new(AnyCertificate(provider))),
    };
    let mut config = builder
        .with_client_auth_cert(read_certs(&cert)?, read_key(&key)?)
        .with_context(|| format!("{} and {} do not make a certificate", cert.display(), key.display()))?;
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(Some(Arc::new(config)))
}

/// The name a peer's certificate is checked against: the host of its URL.
pub fn server_name(host: &str) -> anyhow::Result<ServerName<'static>> {
    ServerName::try_from(host.to_string()).with_context(|| format!("`{host}` is not a host name or IP address"))
}

/// The CommonName of a certificate's subject, if it has one.
pub fn common_name(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let cn = parsed.subject().iter_common_name().next()?.as_str().ok()?.to_string();
    Some(cn)
}

/// The certificate and key files of a port: given, made automatically, or none.
fn certificate(files: &TlsFiles, auto: &AutoCert, flag: &str) -> anyhow::Result<Option<(PathBuf, PathBuf)>> {
    match (&files.cert, &files.key) {
        (Some(cert), Some(key)) => Ok(Some((cert.clone(), key.clone()))),
        (Some(_), None) | (None, Some(_)) => bail!("--{flag}cert-file and --{flag}key-file go together"),
        (None, None) if files.auto => self_signed(auto).map(Some),
        (None, None) => Ok(None),
    }
}

/// Make (once) a self-signed certificate for `auto.hosts` under `auto.dir`.
fn self_signed(auto: &AutoCert) -> anyhow::Result<(PathBuf, PathBuf)> {
    let (cert, key) = (auto.dir.join("cert.pem"), auto.dir.join("key.pem"));
    if cert.exists() && key.exists() {
        return Ok((cert, key));
    }
    std::fs::create_dir_all(&auto.dir).with_context(|| format!("creating {}", auto.dir.display()))?;
    let mut params = rcgen::CertificateParams::new(auto.hosts.clone()).context("certificate host names")?;
    params.distinguished_name.push(rcgen::DnType::OrganizationName, "raftlock");
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    let this_year = 1970 + (now.as_secs() / (365 * 86_400 + 21_600)) as i32;
    params.not_after = rcgen::date_time_ymd(this_year + auto.validity_years.max(1) as i32, 1, 1);
    let signing_key = rcgen::KeyPair::generate().context("generating a key")?;
    let certificate = params.self_signed(&signing_key).context("signing the certificate")?;
    write_private(&key, signing_key.serialize_pem().as_bytes())?;
    std::fs::write(&cert, certificate.pem()).with_context(|| format!("writing {}", cert.display()))?;
    tracing::info!(dir = %auto.dir.display(), hosts = ?auto.hosts, "made a self-signed TLS certificate");
    Ok((cert, key))
}

/// Write a file only its owner can read.
fn write_private(path: &Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    file.write_all(bytes).with_context(|| format!("writing {}", path.display()))
}

fn read_certs(path: &Path) -> anyhow::Result<Vec<CertificateDer<'static>>> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("reading certificates from {}", path.display()))?;
    if certs.is_empty() {
        bail!("{} holds no certificate", path.display());
    }
    Ok(certs)
}

fn read_key(path: &Path) -> anyhow::Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path).with_context(|| format!("reading a private key from {}", path.display()))
}

fn roots(ca: &Path) -> anyhow::Result<RootCertStore> {
    let mut roots = RootCertStore::empty();
    for cert in read_certs(ca)? {
        roots.add(cert).with_context(|| format!("{}: not a CA certificate", ca.display()))?;
    }
    Ok(roots)
}

fn version(name: &str) -> anyhow::Result<ProtocolVersion> {
    match name {
        "TLS1.2" => Ok(ProtocolVersion::TLSv1_2),
        "TLS1.3" => Ok(ProtocolVersion::TLSv1_3),
        "TLS1.0" | "TLS1.1" => bail!("{name} is not supported (raftlock speaks TLS1.2 and TLS1.3)"),
        _ => bail!("unknown TLS version {name:?} (TLS1.2 or TLS1.3)"),
    }
}

fn versions(policy: &TlsPolicy) -> anyhow::Result<Vec<&'static rustls::SupportedProtocolVersion>> {
    let min = version(policy.min_version.as_deref().unwrap_or("TLS1.2"))?;
    let max = version(policy.max_version.as_deref().unwrap_or("TLS1.3"))?;
    let rank = |v: ProtocolVersion| if v == ProtocolVersion::TLSv1_2 { 2 } else { 3 };
    if rank(min) > rank(max) {
        bail!("--tls-min-version is above --tls-max-version");
    }
    Ok([&rustls::version::TLS12, &rustls::version::TLS13]
        .into_iter()
        .filter(|v| (rank(min)..=rank(max)).contains(&rank(v.version)))
        .collect())
}

/// ring's provider, its TLS 1.2 suites narrowed to `--cipher-suites`.
fn provider(policy: &TlsPolicy) -> anyhow::Result<Arc<CryptoProvider>> {
    let mut provider = rustls::crypto::ring::default_provider();
    if let Some(names) = &policy.cipher_suites {
        if policy.min_version.as_deref() == Some("TLS1.3") {
            bail!("--cipher-suites cannot be set when only TLS1.3 is allowed: its suites are not configurable");
        }
        let name_of = |s: &rustls::SupportedCipherSuite| format!("{:?}", s.suite());
        let mut chosen = Vec::new();
        for name in names {
            // Go also names the ChaCha20 suites without their "_SHA256".
            let suite = provider
                .cipher_suites
                .iter()
                .find(|s| name_of(s) == *name || name_of(s) == format!("{name}_SHA256"))
                .filter(|s| s.version().version == ProtocolVersion::TLSv1_2);
            match suite {
                Some(s) => chosen.push(*s),
                None => {
                    let known: Vec<String> = provider
                        .cipher_suites
                        .iter()
                        .filter(|s| s.version().version == ProtocolVersion::TLSv1_2)
                        .map(name_of)
                        .collect();
                    bail!("--cipher-suites: {name} is not supported; choose from {}", known.join(","));
                }
            }
        }
        chosen.extend(provider.cipher_suites.iter().filter(|s| s.version().version == ProtocolVersion::TLSv1_3));
        provider.cipher_suites = chosen;
    }
    Ok(Arc::new(provider))
}

/// Accepts any server certificate (signatures are still checked): what
/// members with `--peer-auto-tls` do, as their certificates are self-signed.
#[derive(Debug)]
struct AnyCertificate(Arc<CryptoProvider>);

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
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
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(min: &str, suites: Option<&[&str]>) -> TlsPolicy {
        TlsPolicy {
            min_version: Some(min.into()),
            max_version: None,
            cipher_suites: suites.map(|s| s.iter().map(|n| n.to_string()).collect()),
        }
    }

    #[test]
    fn cipher_suites_take_gos_names_and_keep_tls13() {
        let p = provider(&policy("TLS1.2", Some(&["TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305"]))).unwrap();
        let tls12: Vec<_> =
            p.cipher_suites.iter().filter(|s| s.version().version == ProtocolVersion::TLSv1_2).collect();
        assert_eq!(tls12.len(), 1);
        assert!(p.cipher_suites.iter().any(|s| s.version().version == ProtocolVersion::TLSv1_3));
        let err = provider(&policy("TLS1.2", Some(&["TLS_RSA_WITH_RC4_128_SHA"]))).unwrap_err().to_string();
        assert!(err.contains("not supported"), "{err}");
        assert!(provider(&policy("TLS1.3", Some(&["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"]))).is_err());
    }

    #[test]
    fn versions_are_a_range_of_the_two_rustls_speaks() {
        assert_eq!(versions(&TlsPolicy::default()).unwrap().len(), 2);
        assert_eq!(versions(&policy("TLS1.3", None)).unwrap().len(), 1);
        assert!(versions(&policy("TLS1.1", None)).is_err());
        let inverted =
            TlsPolicy { min_version: Some("TLS1.3".into()), max_version: Some("TLS1.2".into()), ..Default::default() };
        assert!(versions(&inverted).is_err());
    }
}

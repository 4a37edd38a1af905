//! Certificates made in the test (rcgen), written as PEM files: a CA, a
//! server certificate for 127.0.0.1/localhost (members use it on both
//! ports, and present it to each other), client certificates, and a second
//! CA with a client of its own, which the servers must refuse.

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair};

/// A certificate and its key, as files.
#[derive(Clone, Debug)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

#[derive(Clone, Debug)]
pub struct Certs {
    pub ca: PathBuf,
    /// For 127.0.0.1 and localhost, CN "member"; server and client use.
    pub member: CertFiles,
    /// A client certificate with CN "alice", from the same CA.
    pub alice: CertFiles,
    /// The CA of another organisation, and a client certificate it signed.
    pub other_ca: PathBuf,
    pub stranger: CertFiles,
}

struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl Ca {
    fn new(name: &str) -> Ca {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, name);
        Ca { issuer: CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap() }
    }

    fn issue(&self, dir: &Path, file: &str, cn: &str, hosts: &[&str], server: bool) -> CertFiles {
        let mut params = CertificateParams::new(hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        if server {
            params.extended_key_usages.push(ExtendedKeyUsagePurpose::ServerAuth);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let files = CertFiles { cert: dir.join(format!("{file}.pem")), key: dir.join(format!("{file}.key")) };
        std::fs::write(&files.cert, cert.pem()).unwrap();
        std::fs::write(&files.key, key.serialize_pem()).unwrap();
        files
    }

    fn write(&self, path: PathBuf) -> PathBuf {
        std::fs::write(&path, self.issuer.pem()).unwrap();
        path
    }
}

/// Make every certificate under `dir`.
pub fn make(dir: &Path) -> Certs {
    std::fs::create_dir_all(dir).unwrap();
    let ca = Ca::new("raftlock test CA");
    let other = Ca::new("another CA");
    Certs {
        ca: ca.write(dir.join("ca.pem")),
        member: ca.issue(dir, "member", "member", &["127.0.0.1", "localhost"], true),
        alice: ca.issue(dir, "alice", "alice", &[], false),
        other_ca: other.write(dir.join("other-ca.pem")),
        stranger: other.issue(dir, "stranger", "member", &["127.0.0.1", "localhost"], true),
    }
}

impl Certs {
    /// The flags that put a member's client and peer ports under mTLS.
    pub fn member_flags(&self) -> Vec<String> {
        let p = |p: &PathBuf| p.to_str().unwrap().to_string();
        [
            ("--cert-file", p(&self.member.cert)),
            ("--key-file", p(&self.member.key)),
            ("--trusted-ca-file", p(&self.ca)),
            ("--client-cert-auth", "true".into()),
            ("--peer-cert-file", p(&self.member.cert)),
            ("--peer-key-file", p(&self.member.key)),
            ("--peer-trusted-ca-file", p(&self.ca)),
            ("--peer-client-cert-auth", "true".into()),
        ]
        .into_iter()
        .flat_map(|(flag, value)| [flag.to_string(), value])
        .collect()
    }

    /// etcd-client's TLS options for a client with `files` (the test CA
    /// verifies the server).
    pub fn client_options(&self, files: &CertFiles) -> etcd_client::ConnectOptions {
        let pem = |p: &PathBuf| std::fs::read(p).unwrap();
        let tls = etcd_client::TlsOptions::new()
            .ca_certificate(etcd_client::Certificate::from_pem(pem(&self.ca)))
            .identity(etcd_client::Identity::from_pem(pem(&files.cert), pem(&files.key)));
        etcd_client::ConnectOptions::new().with_tls(tls)
    }
}

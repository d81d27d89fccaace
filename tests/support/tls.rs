//! Certificates for TLS tests, generated per test with rcgen: a CA, a server certificate for
//! `127.0.0.1` and `localhost`, and a client certificate, as PEM files in a temporary directory.

use std::fs;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};
use tempfile::TempDir;

/// A private CA and the certificates it signed, written to files `redis-server` can read.
pub struct TlsFiles {
    dir: TempDir,
}

impl TlsFiles {
    /// A fresh CA (`name` in its common name), a server certificate and a client certificate.
    pub fn generate(name: &str) -> TlsFiles {
        let dir = tempfile::Builder::new()
            .prefix("redlimit-tls-")
            .tempdir()
            .expect("create temp dir");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, format!("redlimit test CA {name}"));
        ca_params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
        let leaf = |common_name: &str, usages: Vec<ExtendedKeyUsagePurpose>| {
            let mut params =
                CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
                    .unwrap();
            params
                .distinguished_name
                .push(DnType::CommonName, common_name);
            params.extended_key_usages = usages;
            let key = KeyPair::generate().unwrap();
            let cert = params.signed_by(&key, &ca).unwrap();
            (cert.pem(), key.serialize_pem())
        };
        // Cluster nodes present their server certificate as clients on the cluster bus, which
        // always asks for one.
        let (server_cert, server_key) = leaf(
            "redis server",
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        );
        let (client_cert, client_key) =
            leaf("redlimit client", vec![ExtendedKeyUsagePurpose::ClientAuth]);
        let files = TlsFiles { dir };
        fs::write(files.ca(), ca.pem()).unwrap();
        fs::write(files.server_cert(), server_cert).unwrap();
        fs::write(files.server_key(), server_key).unwrap();
        fs::write(files.client_cert(), client_cert).unwrap();
        fs::write(files.client_key(), client_key).unwrap();
        files
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The CA certificate (PEM).
    pub fn ca(&self) -> PathBuf {
        self.path("ca.pem")
    }

    /// The server certificate (PEM), for 127.0.0.1 and localhost.
    pub fn server_cert(&self) -> PathBuf {
        self.path("server.pem")
    }

    /// The server's private key (PEM).
    pub fn server_key(&self) -> PathBuf {
        self.path("server.key")
    }

    /// A client certificate (PEM) signed by the CA, for mutual TLS.
    pub fn client_cert(&self) -> PathBuf {
        self.path("client.pem")
    }

    /// The client's private key (PEM).
    pub fn client_key(&self) -> PathBuf {
        self.path("client.key")
    }

    /// Reads one of the files.
    pub fn read(path: &Path) -> Vec<u8> {
        fs::read(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
    }
}

/// How a TLS `redis-server` is set up.
#[derive(Clone)]
pub struct TlsSetup {
    /// The CA, server and client files.
    pub ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// Whether clients must present a certificate signed by the CA (mutual TLS).
    pub auth_clients: bool,
}

impl TlsSetup {
    /// A server on `files`' certificates; `auth_clients` asks clients for theirs.
    pub fn new(files: &TlsFiles, auth_clients: bool) -> TlsSetup {
        TlsSetup {
            ca: files.ca(),
            cert: files.server_cert(),
            key: files.server_key(),
            auth_clients,
        }
    }
}

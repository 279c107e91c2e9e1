//! A development trust root: a fresh suite CA and one certificate per role (rcgen), written
//! as PEM files into one directory (`pagewarden up` uses `.pw/tls/`; tests a temp dir).
//! Production deployments bring their own CA; the file layout is the same.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};

use super::SuiteRole;

/// The dev suite could not be written.
#[derive(Debug, thiserror::Error)]
pub enum DevSuiteError {
    /// A file could not be written.
    #[error("writing {0}: {1}")]
    Io(PathBuf, std::io::Error),
    /// rcgen failed.
    #[error("generating a certificate: {0}")]
    Cert(#[from] rcgen::Error),
}

/// The files of a dev suite: `ca.pem`, `ca.key` and `<role>.pem`/`<role>.key` per role.
#[derive(Clone, Debug)]
pub struct DevSuite {
    dir: PathBuf,
}

impl DevSuite {
    /// The suite already complete in `dir`, if there is one.
    pub fn existing(dir: &Path) -> Option<DevSuite> {
        let s = DevSuite {
            dir: dir.to_path_buf(),
        };
        s.complete().then_some(s)
    }

    /// The CA certificate.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// The certificate of `role`.
    pub fn cert(&self, role: SuiteRole) -> PathBuf {
        self.dir.join(format!("{role}.pem"))
    }

    /// The private key of `role`.
    pub fn key(&self, role: SuiteRole) -> PathBuf {
        self.dir.join(format!("{role}.key"))
    }

    /// `--tls-ca CA --tls-cert CERT --tls-key KEY` for a service of `role`.
    pub fn args(&self, role: SuiteRole) -> Vec<String> {
        vec![
            "--tls-ca".into(),
            self.ca().display().to_string(),
            "--tls-cert".into(),
            self.cert(role).display().to_string(),
            "--tls-key".into(),
            self.key(role).display().to_string(),
        ]
    }

    fn complete(&self) -> bool {
        self.ca().exists()
            && SuiteRole::ALL
                .iter()
                .all(|&r| self.cert(r).exists() && self.key(r).exists())
    }
}

fn write(path: PathBuf, text: &str, secret: bool) -> Result<(), DevSuiteError> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let err = |e| DevSuiteError::Io(path.clone(), e);
    // A key is created 0600, never readable for a moment after a plain write.
    let mode = if secret { 0o600 } else { 0o644 };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&path)
        .map_err(err)?;
    f.write_all(text.as_bytes()).map_err(err)?;
    if secret {
        // A key file left by an older run is tightened too.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    }
    Ok(())
}

/// Writes a dev suite into `dir` (created if missing), or keeps the one already complete
/// there. Every certificate is both a TLS server and client identity, signed by the CA.
pub fn write_dev_suite(dir: &Path) -> Result<DevSuite, DevSuiteError> {
    let suite = DevSuite {
        dir: dir.to_path_buf(),
    };
    if suite.complete() {
        return Ok(suite);
    }
    std::fs::create_dir_all(dir).map_err(|e| DevSuiteError::Io(dir.to_path_buf(), e))?;
    let ca_key = KeyPair::generate()?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "pagewarden dev suite CA");
    ca_params.distinguished_name = dn;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = ca_params.self_signed(&ca_key)?;
    write(suite.dir.join("ca.key"), &ca_key.serialize_pem(), true)?;
    for role in SuiteRole::ALL {
        let key = KeyPair::generate()?;
        let mut p = CertificateParams::new(vec![role.dns_name()])?;
        p.subject_alt_names
            .push(SanType::URI(role.uri().try_into()?));
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, format!("pagewarden {role}"));
        p.distinguished_name = dn;
        p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        p.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = p.signed_by(&key, &ca, &ca_key)?;
        write(suite.key(role), &key.serialize_pem(), true)?;
        write(suite.cert(role), &cert.pem(), false)?;
    }
    // The CA certificate last: its presence marks a complete suite.
    write(suite.ca(), &ca.pem(), false)?;
    Ok(suite)
}

#[cfg(test)]
mod tests {
    use super::super::{peer_roles, InternalTls, TlsFlags};
    use super::*;

    #[test]
    fn every_certificate_names_exactly_its_role() {
        let dir = tempfile::tempdir().unwrap();
        let suite = write_dev_suite(dir.path()).unwrap();
        for role in SuiteRole::ALL {
            let flags = TlsFlags {
                tls_ca: Some(suite.ca()),
                tls_cert: Some(suite.cert(role)),
                tls_key: Some(suite.key(role)),
            };
            let InternalTls::Mutual(m) = InternalTls::load(&flags).unwrap() else {
                panic!("expected mutual TLS");
            };
            assert_eq!(m.roles, vec![role]);
            super::super::rustls_server_config(&m).unwrap();
            super::super::rustls_client_config(&m).unwrap();
        }
        // A second call keeps the suite.
        let before = std::fs::read(suite.ca()).unwrap();
        write_dev_suite(dir.path()).unwrap();
        assert_eq!(std::fs::read(suite.ca()).unwrap(), before);
        let ca = std::fs::read(suite.ca()).unwrap();
        use rustls_pki_types::pem::PemObject;
        let ca = rustls_pki_types::CertificateDer::from_pem_slice(&ca).unwrap();
        assert!(peer_roles(&ca).is_empty(), "the CA names no role");
    }
}

//! Subject alternative names of an X.509 certificate, read from its DER.
//!
//! Only what peer identity needs: the SAN extension's DNS names, URIs and IP
//! addresses. The certificate has already been verified by rustls when this runs, but
//! the reader still treats it as untrusted bytes: every length is checked, nothing
//! panics, and anything it does not understand yields no names.

use std::net::IpAddr;

/// The names of one certificate's subject-alternative-name extension.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct AltNames {
    pub(crate) dns: Vec<String>,
    pub(crate) uris: Vec<String>,
    pub(crate) ips: Vec<IpAddr>,
}

/// DER tags used below.
const SEQUENCE: u8 = 0x30;
const OCTET_STRING: u8 = 0x04;
const OID: u8 = 0x06;
/// `[3] EXPLICIT Extensions` in `TBSCertificate`.
const EXTENSIONS: u8 = 0xa3;
/// `GeneralName` choices (context-specific, primitive).
const DNS_NAME: u8 = 0x82;
const URI: u8 = 0x86;
const IP_ADDRESS: u8 = 0x87;
/// `id-ce-subjectAltName`, 2.5.29.17.
const SUBJECT_ALT_NAME: &[u8] = &[0x55, 0x1d, 0x11];

/// Splits one DER element off `input`: its tag, contents and what follows (also the
/// leaf reader's, `leaf.rs`).
pub(super) fn element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    if tag & 0x1f == 0x1f {
        return None; // multi-byte tags appear nowhere in a certificate's skeleton
    }
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let len = rest[..count]
            .iter()
            .fold(0usize, |acc, &b| (acc << 8) | usize::from(b));
        (len, &rest[count..])
    };
    if rest.len() < len {
        return None;
    }
    let (contents, rest) = rest.split_at(len);
    Some((tag, contents, rest))
}

/// The contents of a SEQUENCE that makes up all of `input`.
fn sequence(input: &[u8]) -> Option<&[u8]> {
    match element(input)? {
        (SEQUENCE, contents, _) => Some(contents),
        _ => None,
    }
}

/// The names in `certificate`'s subject-alternative-name extension; empty if it has
/// none or cannot be read.
pub(crate) fn alt_names(certificate: &[u8]) -> AltNames {
    read(certificate).unwrap_or_default()
}

fn read(certificate: &[u8]) -> Option<AltNames> {
    let mut tbs = sequence(sequence(certificate)?)?;
    // Walk TBSCertificate's fields to the `[3]` extensions.
    let mut extensions = None;
    while !tbs.is_empty() {
        let (tag, contents, rest) = element(tbs)?;
        if tag == EXTENSIONS {
            extensions = Some(sequence(contents)?);
            break;
        }
        tbs = rest;
    }
    let mut extensions = extensions?;
    while !extensions.is_empty() {
        let (tag, extension, rest) = element(extensions)?;
        extensions = rest;
        if tag != SEQUENCE {
            return None;
        }
        let (tag, oid, mut fields) = element(extension)?;
        if tag != OID || oid != SUBJECT_ALT_NAME {
            continue;
        }
        // An optional `critical` BOOLEAN, then the value as an OCTET STRING.
        loop {
            let (tag, contents, rest) = element(fields)?;
            if tag == OCTET_STRING {
                return Some(general_names(sequence(contents)?));
            }
            fields = rest;
        }
    }
    Some(AltNames::default())
}

fn general_names(mut names: &[u8]) -> AltNames {
    let mut out = AltNames::default();
    while let Some((tag, contents, rest)) = element(names) {
        names = rest;
        let text = || std::str::from_utf8(contents).ok().map(str::to_owned);
        match tag {
            DNS_NAME => out.dns.extend(text()),
            URI => out.uris.extend(text()),
            IP_ADDRESS => match contents.len() {
                4 => out.ips.push(IpAddr::from(
                    <[u8; 4]>::try_from(contents).expect("length checked"),
                )),
                16 => out.ips.push(IpAddr::from(
                    <[u8; 16]>::try_from(contents).expect("length checked"),
                )),
                _ => {}
            },
            _ => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A DER element with a short or long length.
    fn der(tag: u8, contents: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        if contents.len() < 0x80 {
            out.push(contents.len() as u8);
        } else {
            out.push(0x82);
            out.extend_from_slice(&(contents.len() as u16).to_be_bytes());
        }
        out.extend_from_slice(contents);
        out
    }

    fn certificate(extensions: &[u8]) -> Vec<u8> {
        let mut tbs = der(0xa0, &der(0x02, &[2])); // version
        tbs.extend(der(0x02, &[1])); // serial
        tbs.extend(der(SEQUENCE, &[])); // signature algorithm
        tbs.extend(der(SEQUENCE, &[])); // issuer
        tbs.extend(der(SEQUENCE, &[])); // validity
        tbs.extend(der(SEQUENCE, &[])); // subject
        tbs.extend(der(SEQUENCE, &[0; 200])); // key (long form length)
        tbs.extend(der(EXTENSIONS, &der(SEQUENCE, extensions)));
        let mut cert = der(SEQUENCE, &tbs);
        cert.extend(der(SEQUENCE, &[])); // signature algorithm
        cert.extend(der(0x03, &[0])); // signature
        der(SEQUENCE, &cert)
    }

    fn san_extension(critical: bool) -> Vec<u8> {
        let mut names = der(DNS_NAME, b"server.example");
        names.extend(der(URI, b"spiffe://example.org/client"));
        names.extend(der(IP_ADDRESS, &[127, 0, 0, 1]));
        names.extend(der(0x81, b"mail@example.org")); // rfc822Name: ignored
        let mut ext = der(OID, SUBJECT_ALT_NAME);
        if critical {
            ext.extend(der(0x01, &[0xff]));
        }
        ext.extend(der(OCTET_STRING, &der(SEQUENCE, &names)));
        der(SEQUENCE, &ext)
    }

    #[test]
    fn reads_dns_uri_and_ip_names() {
        for critical in [false, true] {
            // Another extension first (basic constraints), then the SANs.
            let mut exts = der(
                SEQUENCE,
                &[der(OID, &[0x55, 0x1d, 0x13]), der(OCTET_STRING, &[0x30, 0])].concat(),
            );
            exts.extend(san_extension(critical));
            let names = alt_names(&certificate(&exts));
            assert_eq!(names.dns, ["server.example"]);
            assert_eq!(names.uris, ["spiffe://example.org/client"]);
            assert_eq!(names.ips, [IpAddr::from([127, 0, 0, 1])]);
        }
    }

    #[test]
    fn no_extension_no_names() {
        assert_eq!(alt_names(&certificate(&[])), AltNames::default());
    }

    #[test]
    fn truncated_or_garbage_input_yields_no_names_and_no_panic() {
        let cert = certificate(&san_extension(false));
        for cut in 0..cert.len() {
            let _ = alt_names(&cert[..cut]);
        }
        for flip in 0..cert.len() {
            let mut bad = cert.clone();
            bad[flip] ^= 0xff;
            let _ = alt_names(&bad);
        }
        assert_eq!(
            alt_names(&[0x30, 0x84, 0xff, 0xff, 0xff, 0xff]),
            AltNames::default()
        );
    }
}

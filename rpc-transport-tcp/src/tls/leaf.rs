//! What makes a server's own certificate unusable, read from its DER before it is put
//! in use: out of its validity period, a CA's certificate, or one whose extended key
//! usage excludes TLS servers. rustls takes any of them; every client then refuses the
//! handshake, so a reload to one would replace working settings with failing ones.
//!
//! A reader of the few X.509 fields this needs (RFC 5280 4.1), not a parser of
//! certificates: rustls and webpki verify them; a certificate this cannot read is
//! left to them.

use std::time::{SystemTime, UNIX_EPOCH};

// One DER element at the start of the input: its tag, its value and what follows it.
use super::san::element as tlv;

/// How far in the future a certificate's start may be (a clock a little behind the
/// issuer's), in seconds.
const CLOCK_SKEW_S: i64 = 300;

/// Why the leaf certificate `der` cannot serve TLS at `now`, if it cannot.
pub(super) fn problem(der: &[u8], now: SystemTime) -> Option<String> {
    let now = match now.duration_since(UNIX_EPOCH) {
        Ok(since) => i64::try_from(since.as_secs()).unwrap_or(i64::MAX),
        Err(_) => return None,
    };
    let leaf = Leaf::read(der)?;
    if let Some(not_after) = leaf.not_after {
        if now > not_after {
            return Some(format!("it expired on {}", date(not_after)));
        }
    }
    if let Some(not_before) = leaf.not_before {
        if now + CLOCK_SKEW_S < not_before {
            return Some(format!("it is not valid before {}", moment(not_before)));
        }
    }
    if leaf.ca {
        return Some("it is a CA's certificate (basic constraints CA:TRUE), which clients refuse as a server's".into());
    }
    if leaf.eku_excludes_server {
        return Some("its extended key usage does not include TLS servers (serverAuth)".into());
    }
    None
}

/// When the leaf certificate `der` starts to be valid, if that is after `now` but
/// within the skew [`problem`] allows for (a server clock a little behind the
/// issuer's): clients whose clocks agree with the server's refuse it until then.
pub(super) fn not_yet_valid(der: &[u8], now: SystemTime) -> Option<String> {
    let now = i64::try_from(now.duration_since(UNIX_EPOCH).ok()?.as_secs()).ok()?;
    let not_before = Leaf::read(der)?.not_before?;
    (now < not_before && not_before <= now + CLOCK_SKEW_S).then(|| {
        format!(
            "it is not valid before {} ({} s from now): clients whose clocks agree with \
             this host's refuse it until then",
            moment(not_before),
            not_before - now
        )
    })
}

/// Why the certificate `der`, given as a trust anchor (a CA to trust), is not a CA's,
/// if it says it is not: its basic constraints say CA:FALSE, or its key usage leaves
/// out signing certificates. webpki takes any certificate as an anchor, so its key
/// could then sign certificates of any name or identity, and the certificate itself
/// is refused as a peer's (from a review: a client certificate given to
/// `--tls-client-ca` to "pin" it let its key mint a `spiffe://.../admin` identity). A
/// certificate without these extensions (an old X.509 v1 root) is taken.
pub(super) fn not_a_ca(der: &[u8]) -> Option<&'static str> {
    let cert = Leaf::read(der)?;
    if cert.basic_constraints && !cert.ca {
        return Some("its basic constraints say it is not a CA's (CA:FALSE)");
    }
    if cert.cert_sign == Some(false) {
        return Some("its key usage does not allow signing certificates (keyCertSign)");
    }
    None
}

/// Seconds since the Unix epoch when `der`'s validity ends, if it can be read.
pub(super) fn not_after(der: &[u8]) -> Option<i64> {
    Leaf::read(der)?.not_after
}

#[derive(Debug, Default)]
struct Leaf {
    not_before: Option<i64>,
    not_after: Option<i64>,
    ca: bool,
    /// It has the basic constraints extension (`ca` is what it says: a leaf's
    /// omits the boolean, DER's default being false).
    basic_constraints: bool,
    /// Its key usage extension, if it has one, allows signing certificates
    /// (keyCertSign).
    cert_sign: Option<bool>,
    eku_excludes_server: bool,
    /// Its basic constraints' pathLenConstraint, if it has one.
    path_len: Option<u64>,
}

/// A CA certificate's path length limit (its basic constraints' pathLenConstraint),
/// if it is a CA's and has one ([`super::anchors`] applies a trusted CA's).
pub(super) fn path_len(der: &[u8]) -> Option<u64> {
    let cert = Leaf::read(der)?;
    cert.path_len.filter(|_| cert.ca)
}

impl Leaf {
    fn read(der: &[u8]) -> Option<Leaf> {
        let (tag, certificate, _) = tlv(der)?;
        if tag != SEQUENCE {
            return None;
        }
        let (tag, tbs, _) = tlv(certificate)?;
        if tag != SEQUENCE {
            return None;
        }
        let mut rest = tbs;
        // version [0] EXPLICIT, optional
        if rest.first() == Some(&0xa0) {
            rest = tlv(rest)?.2;
        }
        let (_serial, _, after_serial) = tlv(rest)?;
        let (_algorithm, _, after_algorithm) = tlv(after_serial)?;
        let (_issuer, _, after_issuer) = tlv(after_algorithm)?;
        let (tag, validity, after_validity) = tlv(after_issuer)?;
        if tag != SEQUENCE {
            return None;
        }
        let mut leaf = Leaf::default();
        let (tag, start, after_start) = tlv(validity)?;
        leaf.not_before = time(tag, start);
        let (tag, end, _) = tlv(after_start)?;
        leaf.not_after = time(tag, end);
        let (_subject, _, after_subject) = tlv(after_validity)?;
        let (_key, _, mut rest) = tlv(after_subject)?;
        // issuerUniqueID [1], subjectUniqueID [2], extensions [3]
        while let Some((tag, value, next)) = tlv(rest) {
            rest = next;
            if tag != 0xa3 {
                continue;
            }
            let (_, mut extensions, _) = tlv(value)?;
            while let Some((_, extension, next)) = tlv(extensions) {
                extensions = next;
                leaf.extension(extension);
            }
        }
        Some(leaf)
    }

    /// Notes what the extension `body` (`extnID`, `critical`, `extnValue`) says.
    fn extension(&mut self, body: &[u8]) {
        let Some((OID, id, rest)) = tlv(body) else {
            return;
        };
        let mut rest = rest;
        if rest.first() == Some(&BOOLEAN) {
            let Some((_, _, next)) = tlv(rest) else {
                return;
            };
            rest = next;
        }
        let Some((OCTET_STRING, value, _)) = tlv(rest) else {
            return;
        };
        match id {
            BASIC_CONSTRAINTS => {
                if let Some((SEQUENCE, mut constraints, _)) = tlv(value) {
                    self.basic_constraints = true;
                    while let Some((tag, field, next)) = tlv(constraints) {
                        constraints = next;
                        match tag {
                            BOOLEAN => self.ca = field.first().is_some_and(|&b| b != 0),
                            // A small non-negative INTEGER; anything else is no limit
                            // this reader takes.
                            INTEGER if !field.is_empty() && field.len() <= 8 && field[0] < 0x80 => {
                                self.path_len =
                                    Some(field.iter().fold(0u64, |n, &b| n << 8 | u64::from(b)));
                            }
                            _ => {}
                        }
                    }
                }
            }
            KEY_USAGE => {
                // A BIT STRING: its unused-bits count, then the bits, keyCertSign
                // being bit 5 of the first byte (0x04).
                if let Some((BIT_STRING, bits, _)) = tlv(value) {
                    self.cert_sign = Some(bits.get(1).is_some_and(|&b| b & 0x04 != 0));
                }
            }
            EXTENDED_KEY_USAGE => {
                let Some((SEQUENCE, mut usages, _)) = tlv(value) else {
                    return;
                };
                let mut server = false;
                while let Some((tag, usage, next)) = tlv(usages) {
                    usages = next;
                    // serverAuth itself: webpki (rustls's clients) and OpenSSL
                    // refuse a leaf whose only usage is anyExtendedKeyUsage.
                    server |= tag == OID && usage == SERVER_AUTH;
                }
                self.eku_excludes_server = !server;
            }
            _ => {}
        }
    }
}

const BOOLEAN: u8 = 0x01;
const INTEGER: u8 = 0x02;
const BIT_STRING: u8 = 0x03;
const OCTET_STRING: u8 = 0x04;
const OID: u8 = 0x06;
const SEQUENCE: u8 = 0x30;
const UTC_TIME: u8 = 0x17;
const GENERALIZED_TIME: u8 = 0x18;
/// 2.5.29.19
const BASIC_CONSTRAINTS: &[u8] = &[0x55, 0x1d, 0x13];
/// 2.5.29.15
const KEY_USAGE: &[u8] = &[0x55, 0x1d, 0x0f];
/// 2.5.29.37
const EXTENDED_KEY_USAGE: &[u8] = &[0x55, 0x1d, 0x25];
/// 1.3.6.1.5.5.7.3.1
const SERVER_AUTH: &[u8] = &[0x2b, 0x06, 0x01, 0x05, 0x05, 0x07, 0x03, 0x01];

/// A UTCTime (`YYMMDDHHMMSSZ`, years 1950-2049) or GeneralizedTime (`YYYYMMDDHHMMSSZ`)
/// as seconds since the Unix epoch.
fn time(tag: u8, text: &[u8]) -> Option<i64> {
    let digits = |from: usize, n: usize| -> Option<i64> {
        let field = text.get(from..from + n)?;
        field.iter().try_fold(0i64, |value, &b| {
            b.is_ascii_digit().then(|| value * 10 + i64::from(b - b'0'))
        })
    };
    let (year, at) = match (tag, text.len()) {
        (UTC_TIME, 13) => {
            let yy = digits(0, 2)?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, 2)
        }
        (GENERALIZED_TIME, 15) => (digits(0, 4)?, 4),
        _ => return None,
    };
    if text.last() != Some(&b'Z') {
        return None;
    }
    let (month, day) = (digits(at, 2)?, digits(at + 2, 2)?);
    let (hour, minute, second) = (digits(at + 4, 2)?, digits(at + 6, 2)?, digits(at + 8, 2)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second)
}

/// Days from 1970-01-01 to the proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// `2026-12-07 16:51:00 UTC` for seconds since the epoch: a start a few minutes away
/// is on today's date (from a review: "not valid before 2026-12-07", on that day).
pub(super) fn moment(seconds: i64) -> String {
    let time = seconds.rem_euclid(86_400);
    format!(
        "{} {:02}:{:02}:{:02} UTC",
        date(seconds),
        time / 3600,
        time / 60 % 60,
        time % 60
    )
}

/// `2001-12-31` for seconds since the epoch.
fn date(seconds: i64) -> String {
    // Civil from days (the inverse of `days_from_civil`).
    let days = seconds.div_euclid(86_400) + 719_468;
    let era = days.div_euclid(146_097);
    let day_of_era = days - era * 146_097;
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn der(name: &str) -> Vec<u8> {
        use rustls::pki_types::{pem::PemObject, CertificateDer};
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../testdata/tls")
            .join(name);
        CertificateDer::pem_file_iter(path)
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .to_vec()
    }

    #[test]
    fn dates_convert_both_ways() {
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(date(0), "1970-01-01");
        assert_eq!(moment(86_400 + 3_723), "1970-01-02 01:02:03 UTC");
        assert_eq!(
            time(UTC_TIME, b"011231000000Z"),
            Some(days_from_civil(2001, 12, 31) * 86_400)
        );
        assert_eq!(
            date(time(GENERALIZED_TIME, b"21240229120000Z").unwrap()),
            "2124-02-29"
        );
        assert_eq!(time(UTC_TIME, b"011231000000"), None);
    }

    /// A certificate whose validity starts within the allowed clock skew is put in use
    /// with a warning saying when (from a review: taken without a word, and refused by
    /// every client for 4 minutes); further ahead it is a problem; once started, neither.
    #[test]
    fn a_certificate_valid_a_little_later_is_named() {
        let cert = der("server.pem");
        let start = Leaf::read(&cert).unwrap().not_before.unwrap();
        let at = |s: i64| UNIX_EPOCH + std::time::Duration::from_secs(s as u64);
        let soon = not_yet_valid(&cert, at(start - 100)).unwrap();
        assert!(soon.contains("(100 s from now)"), "{soon}");
        assert_eq!(problem(&cert, at(start - 100)), None);
        assert_eq!(not_yet_valid(&cert, at(start - CLOCK_SKEW_S - 1)), None);
        assert!(problem(&cert, at(start - CLOCK_SKEW_S - 1)).is_some());
        assert_eq!(not_yet_valid(&cert, at(start)), None);
    }

    /// A CA's path length limit is read; a CA without one, and a leaf, have none.
    #[test]
    fn a_cas_path_length_is_read() {
        assert_eq!(path_len(&der("pathlen-ca.pem")), Some(0));
        assert_eq!(path_len(&der("pathlen-int.pem")), None);
        assert_eq!(path_len(&der("ca.pem")), None);
        assert_eq!(path_len(&der("server.pem")), None);
    }

    /// A CA's certificate is a trust anchor; a leaf's is not (CA:FALSE), nor one whose
    /// key usage leaves out keyCertSign; garbage is left to rustls.
    #[test]
    fn leaves_are_no_trust_anchors() {
        assert_eq!(not_a_ca(&der("ca.pem")), None);
        assert_eq!(not_a_ca(&der("other-ca.pem")), None);
        for leaf in ["client.pem", "server.pem", "rogue.pem"] {
            let why = not_a_ca(&der(leaf)).unwrap();
            assert!(why.contains("CA:FALSE"), "{leaf}: {why}");
        }
        // Key usage: digitalSignature only (bit 0, 0x80) is no CA's; keyCertSign is.
        let usage = |bits: u8| {
            let mut cert = Leaf::default();
            let mut body = vec![OID, 3, 0x55, 0x1d, 0x0f, OCTET_STRING, 4, BIT_STRING, 2, 0];
            body.push(bits);
            cert.extension(&body);
            cert.cert_sign
        };
        assert_eq!(usage(0x80), Some(false));
        assert_eq!(usage(0x06), Some(true));
        assert_eq!(not_a_ca(b"\x30\x03junk"), None);
    }

    /// The test certificates: the server's is fine; the expired one, a CA's and a
    /// client-only one are not, each for its reason; garbage is left to rustls.
    #[test]
    fn unusable_server_certificates_are_named() {
        let now = SystemTime::now();
        assert_eq!(problem(&der("server.pem"), now), None);
        let expired = problem(&der("expired.pem"), now).unwrap();
        assert!(expired.contains("expired on 2001-12-31"), "{expired}");
        let ca = problem(&der("ca.pem"), now).unwrap();
        assert!(ca.contains("CA:TRUE"), "{ca}");
        let client = problem(&der("client.pem"), now).unwrap();
        assert!(client.contains("serverAuth"), "{client}");
        // Before its start (a clock far behind).
        let early = UNIX_EPOCH + std::time::Duration::from_secs(10);
        assert!(problem(&der("server.pem"), early)
            .unwrap()
            .contains("not valid before"));
        assert_eq!(problem(b"\x30\x03junk", now), None);
        // An extended key usage of anyExtendedKeyUsage alone: clients of rustls
        // (webpki) and OpenSSL refuse it for a server (from a review: it passed).
        let eku = |usage: &[u8]| {
            let mut leaf = Leaf::default();
            let mut sequence = vec![OID, usage.len() as u8];
            sequence.extend_from_slice(usage);
            let mut value = vec![SEQUENCE, sequence.len() as u8];
            value.extend(sequence);
            let mut body = vec![OID, 3, 0x55, 0x1d, 0x25, OCTET_STRING, value.len() as u8];
            body.extend(value);
            leaf.extension(&body);
            leaf.eku_excludes_server
        };
        assert!(
            eku(&[0x55, 0x1d, 0x25, 0x00]),
            "anyExtendedKeyUsage taken for serverAuth"
        );
        assert!(!eku(SERVER_AUTH));
        assert_eq!(problem(&[], now), None);
    }
}

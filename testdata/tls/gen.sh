#!/usr/bin/env bash
# Makes the test certificates in this folder (committed; run again only to change them).
# Every key is ECDSA P-256; every certificate but expired.pem is valid for 100 years.
#   ca.pem             the test CA servers and clients trust
#   other-ca.pem       a CA nobody trusts (unknown issuer, a client from another CA)
#   server.pem/.key    DNS:localhost, IP:127.0.0.1, IP:::1, signed by ca
#   server2.pem/.key   the same names, another key
#   server-other.pem/.key  the same names, signed by other-ca (certificate reload)
#   expired.pem/.key   the same names, valid only in 2001, signed by ca
#   client.pem/.key    URI:spiffe://example.org/client, DNS:client.example, signed by ca
#   rogue.pem/.key     URI:spiffe://example.org/rogue, signed by other-ca
set -euo pipefail
cd "$(dirname "$0")"
days=36500
key() { openssl ecparam -name prime256v1 -genkey -noout | openssl pkcs8 -topk8 -nocrypt -out "$1"; }
ca() {
    key "$1.key"
    openssl req -x509 -new -key "$1.key" -sha256 -days $days -subj "/CN=$2" \
        -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -out "$1.pem"
}
leaf() { # name ca subject san usage
    key "$1.key"
    openssl req -new -key "$1.key" -subj "/CN=$3" -out "$1.csr"
    printf 'subjectAltName=%s\nextendedKeyUsage=%s\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n' "$4" "$5" > "$1.ext"
    openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -sha256 \
        -days $days -extfile "$1.ext" -out "$1.pem"
    rm "$1.csr" "$1.ext"
}
ca ca "rpc test CA"
ca other-ca "untrusted test CA"
leaf server ca localhost "DNS:localhost,IP:127.0.0.1,IP:::1" serverAuth
leaf server2 ca localhost "DNS:localhost,IP:127.0.0.1,IP:::1" serverAuth
leaf server-other other-ca localhost "DNS:localhost,IP:127.0.0.1,IP:::1" serverAuth
leaf client ca client "URI:spiffe://example.org/client,DNS:client.example" clientAuth
leaf rogue other-ca rogue "URI:spiffe://example.org/rogue" clientAuth
# Expired: `openssl ca` is the one openssl 3.0 command that takes explicit dates.
key expired.key
openssl req -new -key expired.key -subj "/CN=localhost" -out expired.csr
dir=$(mktemp -d)
touch "$dir/index.txt"
cat > "$dir/ca.cnf" <<CNF
[ca]
default_ca = test
[test]
database = $dir/index.txt
new_certs_dir = $dir
serial = $dir/serial
default_md = sha256
policy = any
copy_extensions = none
x509_extensions = ext
[any]
commonName = supplied
[ext]
subjectAltName = DNS:localhost,IP:127.0.0.1,IP:::1
extendedKeyUsage = serverAuth
basicConstraints = CA:FALSE
CNF
echo 01 > "$dir/serial"
openssl ca -batch -config "$dir/ca.cnf" -cert ca.pem -keyfile ca.key -in expired.csr \
    -startdate 20010101000000Z -enddate 20011231000000Z -out expired.pem -notext 2>/dev/null
rm -rf "$dir" expired.csr ./*.srl
# A CA that allows no CA below it (pathlen:0), and one it issued anyway: webpki does
# not apply a trust anchor's own limit, the framework does (tls/anchors.rs).
#   pathlen-ca.pem        CA:TRUE, pathlen:0
#   pathlen-int.pem       CA:TRUE, signed by pathlen-ca (breaks its limit)
#   pathlen-leaf.pem/.key DNS:localhost, IP:127.0.0.1, URI:spiffe://example.org/minted,
#                         server and client, signed by pathlen-int; -chain.pem adds it
#   pathlen-direct.pem/.key  the same names, signed by pathlen-ca itself (allowed)
root() { # name subject constraints
    key "$1.key"
    openssl req -x509 -new -key "$1.key" -sha256 -days $days -subj "/CN=$2" \
        -addext "basicConstraints=critical,$3" -addext "keyUsage=critical,keyCertSign,cRLSign" \
        -out "$1.pem"
}
subca() { # name ca subject: a CA certificate issued by ca (its key thrown away after)
    key "$1.key"
    openssl req -new -key "$1.key" -subj "/CN=$3" -out "$1.csr"
    printf 'basicConstraints=critical,CA:TRUE\nkeyUsage=critical,keyCertSign,cRLSign\n' > "$1.ext"
    openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -sha256 \
        -days $days -extfile "$1.ext" -out "$1.pem"
    rm "$1.csr" "$1.ext"
}
pathlen() {
    root pathlen-ca "pathlen 0 test CA" "CA:TRUE,pathlen:0"
    subca pathlen-int pathlen-ca "pathlen intermediate"
    local names="DNS:localhost,IP:127.0.0.1,URI:spiffe://example.org/minted"
    leaf pathlen-leaf pathlen-int localhost "$names" "serverAuth,clientAuth"
    cat pathlen-leaf.pem pathlen-int.pem > pathlen-leaf-chain.pem
    leaf pathlen-direct pathlen-ca localhost "$names" "serverAuth,clientAuth"
    rm -f pathlen-int.key ./*.srl
}
# What the check must not be fooled by (it follows the path webpki verified, signatures
# and all, not names):
#   pathlen-leaf-decoy-chain.pem  pathlen-leaf, a decoy CA named as pathlen-int but
#                         signed by another key, then pathlen-int (refused as the chain
#                         without the decoy is)
#   pathlen-both.pem      pathlen-ca and pathlen-ca2, a CA of the same name, another
#                         key and no limit (a key rollover)
#   pathlen-leaf2.pem/.key (+ -chain.pem)  under an intermediate of pathlen-ca2 (taken)
pathlen_decoys() {
    root decoy-root "decoy root" "CA:TRUE"
    subca decoy decoy-root "pathlen intermediate"
    cat pathlen-leaf.pem decoy.pem pathlen-int.pem > pathlen-leaf-decoy-chain.pem
    rm decoy.key decoy.pem decoy-root.key decoy-root.pem
    root pathlen-ca2 "pathlen 0 test CA" "CA:TRUE"
    subca pathlen-int2 pathlen-ca2 "pathlen intermediate 2"
    leaf pathlen-leaf2 pathlen-int2 localhost "DNS:localhost,IP:127.0.0.1" "serverAuth,clientAuth"
    cat pathlen-leaf2.pem pathlen-int2.pem > pathlen-leaf2-chain.pem
    cat pathlen-ca.pem pathlen-ca2.pem > pathlen-both.pem
    rm -f pathlen-int2.key pathlen-int2.pem pathlen-ca2.key ./*.srl
}
pathlen
pathlen_decoys

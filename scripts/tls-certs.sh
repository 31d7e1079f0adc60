#!/usr/bin/env bash
# Certificates for a test PostgreSQL with TLS: a CA, a server certificate it
# signed for the name "localhost" only (so verify-full to 127.0.0.1 must
# fail), and an unrelated CA (verify-ca against it must fail).
#
#   scripts/tls-certs.sh DIR    writes ca.pem, server.pem, server.key, other-ca.pem
set -euo pipefail
dir=$1
mkdir -p "$dir"
cd "$dir"
# Reused while they have a week left (they are made for 30 days): a
# checkout older than that makes new ones instead of failing its TLS tests.
if [ -f server.pem ] && [ -f other-ca.pem ] && [ -f ca.pem ] && command -v openssl >/dev/null &&
    openssl x509 -checkend 604800 -noout -in server.pem >/dev/null 2>&1 &&
    openssl x509 -checkend 604800 -noout -in ca.pem >/dev/null 2>&1 &&
    openssl x509 -checkend 604800 -noout -in other-ca.pem >/dev/null 2>&1; then
    exit 0
fi
rm -f ca.pem ca.key server.pem server.key other-ca.pem other-ca.key
command -v openssl >/dev/null || {
    echo "tls-certs.sh: installing openssl (Debian package)" >&2
    sudo=""; [ "$(id -u)" -ne 0 ] && sudo="sudo"
    $sudo apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq openssl >&2
}
q() { "$@" >/dev/null 2>&1; }
q openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=phone test CA" \
    -keyout ca.key -out ca.pem \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
q openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" -keyout server.key -out server.csr
printf 'subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n' > server.ext
q openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 30 \
    -extfile server.ext -out server.pem
q openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=another CA" \
    -keyout other-ca.key -out other-ca.pem \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
rm -f server.csr server.ext ca.srl
chmod 600 server.key ca.key other-ca.key

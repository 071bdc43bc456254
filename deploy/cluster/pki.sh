#!/usr/bin/env bash
# The cluster's certificates, made with openssl once (kept in $STATE/pki): one CA for the
# cluster, one for the front proxy (API aggregation: metrics-server), the service account key.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
source "$here/versions.sh"
source "$here/common.sh"
mkdir -p "$PKI"
cd "$PKI"

ca() {  # name, CN
    [[ -f "$1.crt" ]] && return
    openssl req -x509 -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.crt" -days 3650 \
        -subj "/CN=$2" -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
}
cert() {  # name, ca, subject, usage (client|server|both), [subjectAltName]
    [[ -f "$1.crt" ]] && return
    local usage
    case "$4" in client) usage=clientAuth ;; server) usage=serverAuth ;; both) usage=serverAuth,clientAuth ;; esac
    {
        echo "basicConstraints=CA:FALSE"
        echo "keyUsage=critical,digitalSignature,keyEncipherment"
        echo "extendedKeyUsage=$usage"
        [[ -n "${5:-}" ]] && echo "subjectAltName=$5"
    } >"$1.ext"
    openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$1.csr" -subj "$3" 2>/dev/null
    openssl x509 -req -in "$1.csr" -CA "$2.crt" -CAkey "$2.key" -CAcreateserial -days 3650 \
        -extfile "$1.ext" -out "$1.crt" 2>/dev/null
    rm -f "$1.csr" "$1.ext"
}

ca ca omni-cluster-ca
ca front-proxy-ca omni-front-proxy-ca
cert apiserver ca "/CN=kube-apiserver" server \
    "IP:${NODE_IP},IP:10.96.0.1,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost"
cert apiserver-kubelet-client ca "/O=system:masters/CN=kube-apiserver-kubelet-client" client
cert admin ca "/O=system:masters/CN=omni-admin" client
cert controller-manager ca "/CN=system:kube-controller-manager" client
cert scheduler ca "/CN=system:kube-scheduler" client
cert kubelet ca "/O=system:nodes/CN=system:node:${NODE_NAME}" client
cert kubelet-serving ca "/CN=${NODE_NAME}" server "IP:${NODE_IP},DNS:${NODE_NAME}"
cert kube-proxy ca "/CN=system:kube-proxy" client
cert front-proxy-client front-proxy-ca "/CN=front-proxy-client" client
if [[ ! -f sa.key ]]; then
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
fi
chmod 600 ./*.key

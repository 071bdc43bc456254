#!/bin/sh
# `pip install` for the image builds (docker/*.Dockerfile), into the image's venv /opt/venv.
# Behind a TLS-intercepting proxy pip needs that proxy's CA: pass a bundle as the build secret
# `pip_ca` (`--secret id=pip_ca,src=/etc/ssl/certs/ca-certificates.crt`); it is mounted for the
# one RUN step and never stored in a layer. pip's cache is a build cache mount (see the RUN
# lines), so a rebuild takes torch from the cache instead of downloading it again.
set -eu
if [ -s /run/secrets/pip_ca ]; then
    export PIP_CERT=/run/secrets/pip_ca
fi
exec /opt/venv/bin/pip install --disable-pip-version-check --progress-bar off "$@"

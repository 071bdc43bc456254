#!/bin/sh
# Install a requirements file into the image's venv (/opt/venv), through a wheel house.
#
#   install-requirements.sh REQUIREMENTS_FILE     (in a RUN with the mounts below)
#
# /wheels is a build cache mount (`--mount=type=cache,id=omni-wheels,target=/wheels`): pip
# downloads into it only the files it does not hold yet, then installs from it alone. A rebuild
# after a dependency change therefore does not download torch again. (pip's own HTTP cache is
# not enough: it keeps nothing when a proxy strips the index's caching headers.)
# Behind a TLS-intercepting proxy pip needs that proxy's CA: give a bundle as the build secret
# `pip_ca` (`--secret id=pip_ca,src=/etc/ssl/certs/ca-certificates.crt`); it is mounted for the
# one RUN step and never stored in a layer.
set -eu
if [ -s /run/secrets/pip_ca ]; then
    export PIP_CERT=/run/secrets/pip_ca
fi
pip="/opt/venv/bin/pip --disable-pip-version-check --no-cache-dir"
$pip download --progress-bar off --dest /wheels --find-links /wheels -r "$1"
$pip install --no-index --find-links /wheels -r "$1"

# A Go builder base, standing in for golang:<version>-bookworm where no
# registry is reachable: the Debian base plus a Go toolchain. The context is
# a GOROOT (deploy/image/build.sh passes the local one).
ARG BASE_IMAGE=localhost/debian:bookworm-slim
FROM ${BASE_IMAGE}
# The module proxy is reached over TLS.
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY . /usr/local/go
ENV GOPATH=/go \
    GOTOOLCHAIN=local \
    PATH=/go/bin:/usr/local/go/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
WORKDIR /go

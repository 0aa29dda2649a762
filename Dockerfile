# A small image with the mado binary and what a FUSE mount needs at run time.
#   docker build -t mado .
#   docker run --rm -it --device /dev/fuse --cap-add SYS_ADMIN mado mado --help
# The build stage needs no libfuse: mado speaks the FUSE protocol itself and
# mounts through fusermount3 (package fuse3) when it is not root.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p mado \
 && install -D target/release/mado /out/mado \
 && /out/mado man --dir /out/man1 \
 && /out/mado completion bash > /out/mado.bash

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends fuse3 ca-certificates git \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /out/mado /usr/local/bin/mado
COPY --from=build /out/man1/ /usr/local/share/man/man1/
COPY --from=build /out/mado.bash /usr/share/bash-completion/completions/mado
ENTRYPOINT []
CMD ["mado", "--help"]

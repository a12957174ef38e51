# Image of the gpu-dra kubelet plugin (and every other gpu-dra subcommand): the documented
# alternative to `make image` for a machine with Docker. `make image` builds the project's
# image without Docker or a registry from image/contents.toml (Debian's python3, the same
# wheels); this file builds the same project (the same eight packages) on Docker Hub's python
# image.
#
#   docker build -t <registry>/gpu-dra-driver:0.2.0 .
#
# Two stages: the first installs the project into a virtualenv, the second copies only that
# virtualenv onto a clean slim base, so no compiler, pip cache or source tree is left behind.
# Every dependency ships wheels for linux/amd64 and linux/arm64, and the gRPC stubs (api/gen)
# are committed, so neither a compiler nor protoc is needed even in the build stage. The NVIDIA
# driver is not in the image: the plugin reads it from the host (mounted at /driver-root by the
# chart).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY api ./api
COPY cli ./cli
COPY cluster ./cluster
COPY driver ./driver
COPY drivers ./drivers
COPY kubeletplugin ./kubeletplugin
COPY sandbox ./sandbox
COPY tools ./tools
RUN python -m venv /opt/gpu-dra \
 && /opt/gpu-dra/bin/pip install . \
 && /opt/gpu-dra/bin/pip uninstall --yes pip setuptools wheel \
 && /opt/gpu-dra/bin/python -m compileall -q /opt/gpu-dra/lib

FROM ${PYTHON_IMAGE}
# The base image's own pip and setuptools are build tools too.
RUN python -m pip uninstall --yes pip setuptools wheel \
 && rm -rf /root/.cache
COPY --from=build /opt/gpu-dra /opt/gpu-dra
ENV PATH=/opt/gpu-dra/bin:$PATH \
    PYTHONUNBUFFERED=1
# Smoke check at build time: the entry point imports and its help renders.
RUN gpu-dra --help > /dev/null
ENTRYPOINT ["gpu-dra"]
CMD ["--help"]

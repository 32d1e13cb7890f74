# The dashboard with the engine, and the `malleability` command (the same as `python -m engine`).
#
#   docker build -t malleability .
#   docker compose up                      # compose.yaml: GPU, cache volume, data mount, shm
#
# GPU. torch 2.14.1's default PyPI wheel, installed here, bundles the CUDA 13.0 runtime, so the
# host needs only an NVIDIA driver >= 580 (Linux; CUDA 13.x's minimum) and a way to pass the GPU in:
#   Docker: the NVIDIA Container Toolkit (nvidia-ctk runtime configure --runtime=docker), then
#     docker run --gpus all --shm-size=2g -p 127.0.0.1:8501:8501 \
#       -v malleability-cache:/cache -v "$PWD/data:/data" malleability
#   podman: CDI (sudo nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml), then
#     podman run --device nvidia.com/gpu=all --shm-size=2g -p 127.0.0.1:8501:8501 \
#       -v malleability-cache:/cache -v "$PWD/data:/data" malleability
# (podman takes --gpus but ignores it). Without a GPU drop the flag: everything runs on the CPU.
# --shm-size: Ray (the grid's ray backend) keeps objects in /dev/shm, 64 MB by default in a
# container; below its need it warns and falls back to /tmp, which is slower.
# Check that the GPU arrived, with the device's name, memory and a kernel timing:
#   docker exec CONTAINER malleability doctor        (or: docker run --rm --gpus all malleability malleability doctor)

# ---- build: the pinned runtime requirements (no test tools) into /install and the engine as a
# package into /engine; the runtime stage lays both over its /usr/local (the build's setuptools
# stays behind), and a change to the engine alone recopies only the small /engine
FROM python:3.11-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_WARN_SCRIPT_LOCATION=1
WORKDIR /src
COPY requirements.txt ./
RUN pip install --no-cache-dir --prefix=/install -r requirements.txt
COPY pyproject.toml README.md ./
COPY engine ./engine
RUN pip install --no-cache-dir --prefix=/engine --no-deps .

# ---- runtime: Debian's Chromium and Fashion-MNIST, the installed packages, the dashboard's files
FROM python:3.11-slim-bookworm

# Fashion-MNIST ships as a Debian package; the engine picks its .gz files up. Chromium is
# what kaleido renders PNG/SVG/PDF figures in (it cannot download a browser at run time);
# it follows Debian's security updates, so its version is left to the archive.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends dataset-fashion-mnist=0.0~git20200523.55506a9-1 chromium \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin app
COPY --from=build /install /usr/local
COPY --from=build /engine /usr/local
WORKDIR /app
COPY --chown=10001:10001 app.py ./
COPY --chown=10001:10001 .streamlit ./.streamlit
COPY --chown=10001:10001 ui ./ui
COPY --chown=10001:10001 pages ./pages
COPY --chown=10001:10001 grids ./grids
# the default results every page opens on (make bundle); served only while their code fingerprint
# is this image's engine's, and only on the same data files (the Debian Fashion-MNIST here)
COPY --chown=10001:10001 bundle ./bundle

ENV ENGINE_DATA_DIR=/data \
    ENGINE_CACHE_DIR=/cache \
    ENGINE_BUNDLE_DIR=/app/bundle \
    PYTHONUNBUFFERED=1
RUN mkdir -p /data /cache && chown 10001:10001 /data /cache
VOLUME ["/data", "/cache"]

USER 10001
EXPOSE 8501
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8501/_stcore/health', timeout=4)"]
CMD ["streamlit", "run", "app.py", "--server.address=0.0.0.0", "--server.port=8501", \
     "--server.headless=true", "--browser.gatherUsageStats=false"]

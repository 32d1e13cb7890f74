# The dashboard with the engine; run with `docker run --gpus all -p 8501:8501 IMAGE`.
FROM python:3.11-slim-bookworm

# Fashion-MNIST ships as a Debian package; the engine picks its .gz files up. Chromium is
# what kaleido renders PNG/SVG/PDF figures in (it cannot download a browser at run time);
# it follows Debian's security updates, so its version is left to the archive.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends dataset-fashion-mnist=0.0~git20200523.55506a9-1 chromium \
    && rm -rf /var/lib/apt/lists/*

RUN useradd --uid 10001 --create-home --shell /usr/sbin/nologin app
WORKDIR /app

COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt

COPY --chown=10001:10001 . .

ENV ENGINE_DATA_DIR=/data \
    ENGINE_CACHE_DIR=/cache \
    PYTHONUNBUFFERED=1
RUN mkdir -p /data /cache && chown 10001:10001 /data /cache
VOLUME ["/data", "/cache"]

USER 10001
EXPOSE 8501
HEALTHCHECK --interval=30s --timeout=5s --start-period=60s \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8501/_stcore/health', timeout=4)"]
CMD ["streamlit", "run", "app.py", "--server.address=0.0.0.0", "--server.port=8501", \
     "--server.headless=true", "--browser.gatherUsageStats=false"]

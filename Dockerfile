# The RequestLifecycle worker. Build: docker build -t agent-lifecycle-worker .
# Run against a Temporal server:
#   docker run -e TEMPORAL_ADDRESS=host:7233 -e AGENT_PIPELINE=demo.pipeline:build_activities agent-lifecycle-worker
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Runtime dependencies, every optional part (all: PostgreSQL, MCP, CEL filters, OpenAI models) and the
# otel extra (OTLP exporters): no dev extra, and no server extra (the worker connects to the cluster's
# Temporal; the embedded dev server is for `worker.py --dev` on a laptop). The wheel is the framework; the
# demo pipeline the compose file runs is copied beside it and imported from the working directory.
COPY pyproject.toml README.md* ./
COPY worker.py ./
COPY workflows ./workflows
COPY activities ./activities
COPY hooks ./hooks
COPY client ./client
COPY storage ./storage
COPY agent_lifecycle ./agent_lifecycle
COPY demo ./demo
COPY benchmarks ./benchmarks
# compileall: the workflow sandbox re-imports the workflow modules for every workflow run, so they
# must not be recompiled from source each time (PYTHONDONTWRITEBYTECODE only stops writing .pyc files,
# and the non-root user could not write them here anyway).
RUN pip install ".[all,otel]" \
    && rm -rf build ./*.egg-info \
    && python -m compileall -q /app \
    && useradd --system --uid 10001 --user-group --create-home --home-dir /home/agent agent \
    && mkdir -p /var/lib/agent-state \
    && chown agent:agent /var/lib/agent-state

# Where the execution store, response cache, ledger and outbox live (mount a volume here). A named
# volume mounted at this path starts owned by the non-root user.
ENV AGENT_STATE_DIR=/var/lib/agent-state \
    TEMPORAL_ADDRESS=temporal:7233 \
    TEMPORAL_NAMESPACE=default \
    TEMPORAL_TASK_QUEUE=agent-requests
VOLUME ["/var/lib/agent-state"]

USER agent

# The worker exits non-zero with the reason when the hook pipeline is misconfigured, and stops
# cleanly on SIGTERM.
CMD ["python", "worker.py"]

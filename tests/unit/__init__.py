"""Fast tests of the pure parts of the lifecycle: no Temporal server, no network, no subprocess.

Run them alone with ``.venv/bin/python -m pytest -q tests/unit`` for feedback in seconds."""

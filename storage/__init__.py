"""Where the lifecycle keeps its own state, behind one interface per store.

Each store has an embedded SQLite implementation (the default: files under ``AGENT_STATE_DIR``, safe for
the worker processes of one machine) and a PostgreSQL one (``AGENT_DATABASE_URL``: shared by workers on
several machines), written to the same contract and tested by one suite against both:

| store | interface | SQLite | PostgreSQL |
| --- | --- | --- | --- |
| execution records | ``executions.ExecutionStore`` | ``executions.SQLiteExecutionStore`` | ``executions.PostgresExecutionStore`` |
| response cache | ``responses.ResponseCacheStore`` | ``responses.SQLiteResponseCacheStore`` | ``responses.PostgresResponseCacheStore`` |
| conversation and shared memory | ``activities.memory.MemoryStore`` (one class, as below) | a file path | a ``postgres.Database`` |
| declared hooks' state | ``hooks.declarative.HookStore`` (one class, its statements the same on both) | a file path | a ``postgres.Database`` |
| large payloads by reference | ``payloads.PayloadStore`` | ``payloads.SQLitePayloadStore`` | ``payloads.PostgresPayloadStore`` |

``sqlite`` and ``postgres`` hold how each backend is used (connections, transactions, schema migrations).
The memory store follows the declared hooks' store: one class, ``activities.memory.MemoryStore``, whose
statements run on either backend.
"""

"""The demo application: tools in namespace ``demo-tools``, a rule planner, a template synthesizer, and
the default hook pipeline (response-cache, knowledge-context, allowed-operations, secret-redaction)."""

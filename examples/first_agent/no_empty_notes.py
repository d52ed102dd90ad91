"""A declared command hook (``hooks.json``): reads the pre_tool_use event on stdin and blocks a note whose
text is only whitespace or dots (exit 2 blocks; the reason goes to stderr)."""

import json
import sys

event = json.load(sys.stdin)
text = str(event.get("tool_input", {}).get("text", ""))
if not text.strip(" .\n\t"):
    print("a note needs some text", file=sys.stderr)
    sys.exit(2)
sys.exit(0)
